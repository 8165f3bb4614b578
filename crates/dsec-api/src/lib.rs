//! Public HTTP/JSON API types of dsec: request and response bodies of the
//! apiserver, and the error-code table shared with the Python SDK.
//!
//! These are wire types only. The edge and the apiserver convert them into
//! their own core types at the HTTP boundary; nothing below this crate needs
//! serde names to stay stable except the wire itself.

mod audit;
mod cluster;
mod errors;
mod exec;
mod files;
mod fncall;
mod images;
mod pack;
mod ports;
mod projects;
mod sandboxes;
mod screen;
mod tenants;
mod trajectory;
mod usage;
mod volumes;

pub use audit::*;
pub use cluster::*;
pub use errors::*;
pub use exec::*;
pub use files::*;
pub use fncall::*;
pub use images::*;
pub use pack::*;
pub use ports::*;
pub use projects::*;
pub use sandboxes::*;
pub use screen::*;
pub use tenants::*;
pub use trajectory::*;
pub use usage::*;
pub use volumes::*;

/// The API version prefix of every route.
pub const API_PREFIX: &str = "/v1";

/// The header that carries the caller's token (`Authorization: Bearer T`).
pub const AUTH_HEADER: &str = "authorization";
