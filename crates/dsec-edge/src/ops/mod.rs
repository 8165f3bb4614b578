//! Operations a user asks of a running sandbox, beyond its lifecycle: calls
//! into its agent, its screen and input, its network, and the forwarding of
//! its audit events, connections to its ports and TCP forwards of them.

pub(crate) mod agent;
pub(crate) mod audit_forward;
pub(crate) mod network;
pub(crate) mod ports;
pub(crate) mod screen;
pub(crate) mod tcp_forward;
