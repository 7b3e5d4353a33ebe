//! lobster-store: where a sample's bytes come from when they are in an S3-compatible bucket.
//!
//! Ranges in, bytes out: ranged GETs with exact lengths and `If-Match`, many in flight,
//! retried (503 SlowDown, 5xx, 429, timeouts; a stalled body is resumed) up to a deadline per
//! request, with credentials from the environment or the AWS profile files. It knows nothing
//! of plans or samples.
//!
//! The engine is synchronous, so each [`Store`] runs one thread of its own with a tokio
//! runtime and the S3 client; callers talk to it over channels: [`Store::get`] and friends
//! wait for one answer, a [`StoreSession`] queues reads and collects their completions, in
//! the shape of the io_uring session. tokio never shows in this API.
//!
//! No credential is ever printed: secrets are [`Secret`]s, [`StoreConfig`]'s `Debug` is
//! hand-written, and errors name objects and byte ranges only.
//!
//! Choices worth knowing:
//! - The store retries (object_store's retry: 503 SlowDown, 5xx, 429, timeouts, and a body
//!   silent for the stall timeout is resumed from the bytes received) until the request
//!   deadline; then the request is [`StoreError::Deadline`]. So
//!   [`StoreError::is_transient`] is false for a deadline and for final answers (403, 404,
//!   412, 416, a short or grown object); it is true only for a server or connection failure
//!   that ran out of the client's retry count before the deadline.
//! - Credentials: the environment, else the profile's static keys in the AWS files. SSO,
//!   `credential_process` and assumed roles are refused by name. With no credentials at all
//!   the client tries object_store's own sources (instance metadata, container credentials).
//! - The request deadline bounds each request: a GET, a HEAD, one LIST page.
//! - A session sends its queued reads together, and reads of one object near each other
//!   share one GET ([`StoreConfig::with_coalescing`]; 256 KiB gaps, 8 MiB spans by default);
//!   each still completes on its own, with its own bytes or an error naming its own range.
//! - object_store hides the HTTP status of errors outside its named kinds, so a 416 (a range
//!   wholly past the end) and a 5xx are told apart by the `status code: NNN` its error prints.
//!
//! ```no_run
//! use std::time::Duration;
//! use lobster_store::{RangeRead, Store, StoreConfig, StoreUrl};
//!
//! let url = StoreUrl::parse("s3://my-bucket/train/shard-000000.tar")?;
//! let config = StoreConfig::from_env()?.with_request_deadline(Duration::from_secs(30));
//! let store = Store::open(&config, url.bucket())?;
//! let info = store.head(url.key())?;
//! let mut session = store.session();
//! session.queue(RangeRead::new(url.key(), 0, info.size_bytes.min(512), 7))?;
//! let mut done = Vec::new();
//! session.wait_timeout(1, Duration::from_secs(60), &mut done)?;
//! assert_eq!(done[0].tag, 7);
//! # Ok::<(), lobster_store::StoreError>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod error;
mod profile;
mod read;
mod runtime;
mod secret;
mod session;
mod store;
mod url;

pub use config::{
    StoreConfig, DEFAULT_COALESCE_GAP_BYTES, DEFAULT_COALESCE_SPAN_BYTES, DEFAULT_LIST_OBJECTS_MAX,
    DEFAULT_LIST_PAGE_KEYS, DEFAULT_REGION, DEFAULT_REQUEST_DEADLINE, DEFAULT_STALL_TIMEOUT,
};
pub use error::{Cause, StoreError};
pub use read::{ObjectInfo, RangeRead, StoreCompletion, StoreStats};
pub use secret::Secret;
pub use session::StoreSession;
pub use store::Store;
pub use url::StoreUrl;

/// Checker run by the `aws_profile` fuzz target: arbitrary bytes as an AWS config and
/// credentials file.
#[cfg(fuzzing)]
pub fn fuzz_check_aws_profile(data: &[u8]) {
    profile::check_profile_bytes(data);
}
