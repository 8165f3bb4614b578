//! Starting the guest agent in new namespaces: one clone(2) and an execve,
//! with the agent's channel on fd 3; pidfd helpers to wait for, signal and
//! re-attach to agents; and the protocol of the spawn helper that does the
//! clone on the edge's behalf (see [`protocol`]).
//!
//! Shared by the edge (which starts the helper, and falls back to cloning
//! itself) and the agent binary (whose `spawner` mode is the helper).

mod clone_exec;
mod clone_fork;
mod loopback;
mod pidfd;
pub mod protocol;

pub use clone_exec::{spawn, spawn_in, AGENT_CHANNEL_FD};
pub use clone_fork::{clone_fork, single_threaded, Forked};
pub use loopback::{loopback_flags, set_loopback_up};
pub use pidfd::{pidfd_getfd, pidfd_kill, pidfd_open, reap};
