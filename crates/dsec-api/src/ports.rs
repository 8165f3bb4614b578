//! A sandbox's TCP ports reached from outside through the API
//! (`/v1/sandboxes/{id}/ports/{port}/...`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/expose`: a URL for one port of the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExposeRequest {
    /// The TCP port a server in the sandbox listens on (its loopback or
    /// any address).
    pub port: u16,
    /// How long the signed URL stays valid, in seconds (default 3600, at
    /// most a week).
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

/// Where the port is reached.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ExposedPort {
    pub port: u16,
    /// The proxy's path on this API (`/v1/sandboxes/{id}/ports/{port}`):
    /// with the caller's bearer token, requests under it go to the port.
    pub path: String,
    /// The same path on the address the request came to, with a signed
    /// query that authorizes it without a token until `expires_at`.
    pub url: String,
    /// The same grant as a path (`/v1/port-urls/{token}`), for clients that
    /// take a base URL and append their own paths: `{base_url}/x?y` goes to
    /// `/x?y` on the port, until `expires_at`.
    pub base_url: String,
    /// Unix seconds at which `url` stops working.
    pub expires_at: u64,
    /// `PORT-ID.DOMAIN`, when the API serves sandboxes by host name
    /// (`--sandbox-domain`): requests to that host go to the port.
    pub host: Option<String>,
}

/// `POST /v1/sandboxes/{id}/forwards`: a port of the sandbox published as
/// a plain TCP port of its node, for clients that can name neither a path
/// nor a header.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateForwardRequest {
    /// The TCP port a server in the sandbox listens on (or will: each
    /// connection is made when a client comes).
    pub port: u16,
    /// How long the forward stays open, in seconds (default 3600, at most
    /// a week); it closes earlier when the sandbox stops.
    #[serde(default)]
    pub ttl_s: Option<u64>,
    /// Source addresses or prefixes allowed to connect (`10.0.0.0/8`,
    /// `192.0.2.7`, IPv6 too); empty: any source that reaches the node's
    /// forward address.
    #[serde(default)]
    pub allow_from: Vec<String>,
}

/// Where the forward listens.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TcpForward {
    /// The sandbox's port.
    pub port: u16,
    /// `HOST:PORT` to connect to.
    pub address: String,
    pub host: String,
    /// The node's port the forward listens on.
    pub node_port: u16,
    /// Unix seconds at which the forward closes.
    pub expires_at: u64,
    pub allow_from: Vec<String>,
}
