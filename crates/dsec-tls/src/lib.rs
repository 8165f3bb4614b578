//! The cluster's TLS.
//!
//! `dsec cluster init` makes a cluster CA ([`init_ca`]); `dsec cluster
//! cert` issues each edge, apiserver and watcher a certificate for the
//! addresses it is reached at ([`issue`]). Servers load theirs with
//! [`server_config`]; clients trust the cluster CA alone
//! ([`client_config`] with a CA file), or the public web's roots for an
//! endpoint behind a public certificate.
//!
//! One crypto provider (ring, which rustls already uses here for the image
//! registry client) is named explicitly, so no process-wide default has to
//! be installed and no second provider is linked.

mod ca;
mod config;
mod error;

pub use ca::{init_ca, issue, CaFiles, Issued, CA_CERT_FILE, CA_KEY_FILE};
pub use config::{client_config, connect, server_config, server_name, trusting_nothing};
pub use error::TlsError;
pub use rustls::{ClientConfig, ServerConfig};
pub use tokio_rustls::{client::TlsStream as ClientTlsStream, server::TlsStream as ServerTlsStream, TlsAcceptor};
