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
