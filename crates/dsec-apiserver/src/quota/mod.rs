//! Project quotas as the apiserver enforces them: the ledger of what each
//! project holds, token buckets for rates, the watch that gives back what
//! ended sandboxes held, and the hold a Dockerfile build keeps.

mod bucket;
pub mod build;
mod create;
mod ledger;
#[cfg(test)]
mod tests;
mod watch;

pub use create::create;
pub use ledger::{Held, Ledger, QuotaExceeded, Reservation};
pub use watch::watch_nodes;
