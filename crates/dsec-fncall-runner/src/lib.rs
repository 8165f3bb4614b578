//! The FnCall runner's monitor (monitor.rs) and exec zygote
//! (exec_zygote.rs), modes of the guest agent binary.

mod answer;
mod cleanup;
mod compiled_cache;
mod compiler;
mod edge_link;
mod exec_zygote;
mod ipc;
mod java_class;
mod landlock;
mod langs;
mod marshal;
mod monitor;
mod outcome;
mod report;
mod request;
mod scratch;
mod spawn;
mod sweep;
mod sys;
mod worker;
mod zygote;

pub use exec_zygote::run as run_exec_zygote;
pub use monitor::run;

pub const CALL_UID: u32 = 65534; // nobody
pub const CALL_GID: u32 = 65534; // nogroup
/// The compiler's own identity: neither root nor the call user.
pub const COMPILER_UID: u32 = 65533;
pub const COMPILER_GID: u32 = 65533;
pub const ROOT_UID: u32 = 0;
pub const BASE: &str = "/var/lib/dsec-fncall";
/// Every call's working directory (one call at a time per runner).
pub const SCRATCH: &str = "/var/lib/dsec-fncall/call";
pub const PROG_DIR: &str = "/var/lib/dsec-fncall/prog";
