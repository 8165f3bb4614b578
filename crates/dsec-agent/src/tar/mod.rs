//! Streaming tar, both ways, without buffering an archive.
//!
//! Written here rather than with the `tar` crate because both directions
//! must be driven by the edge's flow control from one thread: creation is a
//! walker that yields one entry at a time, and extraction is a push parser
//! fed whatever bytes the last Data frame carried.
//!
//! Format: POSIX ustar headers, with a PAX extended header ('x') for
//! anything that does not fit (long names and link targets, sizes of 8 GiB
//! and more, large ids). The reader also understands GNU long names ('L',
//! 'K') and base-256 numbers, which is what GNU tar writes.

mod create;
mod extract;
mod format;
mod staging;

pub use create::create;
pub use extract::extract;
