//! The loader: its builder (every setting checked, then the pipeline started), its sizing
//! (what it allocates, worked out before any of it is), and its handles (the running
//! loader, one batch iterator per local rank, and that iterator as an async stream).

mod builder;
mod handles;
mod sizing;

pub use builder::LoaderBuilder;
pub use handles::{Loader, RankHandle, RankStream};
