//! What every read of a sample from storage meets, wherever it runs: the attempt's fate
//! (emulated tier, injected fault, retry, error), the dataset's directories held open, and
//! the reads a decode worker makes on its own thread. The dispatcher ([`super::io`]) and the
//! decode workers ([`super::decode`]) both use it, so it imports neither.

pub(super) mod attempt;
pub(super) mod dirs;
pub(super) mod on_worker;
