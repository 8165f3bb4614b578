//! FnCall: stateless calls (snippets, online-judge submissions) served by
//! warm pools of reusable runners instead of a new sandbox per call.
//!
//! A runner is an ordinary container sandbox of the edge (same namespaces,
//! cgroup limits, no network, read-only image layers) in which the guest
//! agent runs the *monitor* (`dsec-agent fncall-monitor`, a copy of the
//! edge's agent binary; its code, zygote.py and the language table the pools
//! are made from are dsec-fncall-runner's): it prepares each call, has the *zygote*
//! (`zygote.py`, a warm Python interpreter) fork a worker that becomes the
//! call as an unprivileged user and, afterwards, kills every process of that
//! user and removes every file and IPC object it left. The edge starts the
//! monitor through the runner's agent, then talks to it directly over a Unix
//! socket in a root-only directory of the runner, reached from the host
//! beneath the runner's root; the monitor removes it once the edge has
//! connected, before any call runs, so no call can reach it.
//!
//! API boundary: [`FnCallService`] (`call`, `batch`, `status`, `shutdown`)
//! speaks the public wire types of `dsec-api` (`FnCallRequest`,
//! `FnCallResponse`): a call is plain data, so a mirror set of core types
//! would only add a conversion.
//!
//! Invariants: a runner serves one call at a time; a runner whose call did
//! not end cleanly (no answer, a protocol error, a process that would not
//! die) is retired, never reused; a call's data lives only in the monitor
//! that served it and in the call's own processes and files, which are gone
//! before the runner takes the next call.

mod cache;
mod compare;
mod config;
mod error;
mod judge;
mod pool;
mod protocol;
mod runner;
mod service;
mod sizing;

pub use config::{FnCallConfig, PoolConfig, MAX_TIME_S};
pub use error::FnCallError;
pub use service::FnCallService;

/// The tenant that owns every runner sandbox (no user token maps to it).
pub const RUNNER_TENANT: &str = "_fncall";
/// Label carrying a runner's language.
pub const RUNNER_LABEL: &str = "dsec.fncall";
