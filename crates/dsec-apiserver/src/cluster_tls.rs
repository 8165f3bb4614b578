//! How this process reaches the cluster's other processes (edges, the
//! watcher): plain HTTP, or HTTPS trusting the cluster CA alone.
//!
//! A cluster is one or the other. Given a CA (`--cluster-ca`), every peer
//! URL must be `https://` and its certificate must chain to that CA and
//! name the URL's host; without one, every peer URL is `http://` (one
//! machine, or a network the operator trusts). Mixing is refused rather
//! than silently sending a cluster secret in the clear.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;

/// The connector of every client to a peer: HTTPS when the cluster has a
/// CA, plain HTTP otherwise.
pub type PeerConnector = HttpsConnector<HttpConnector>;

#[derive(Clone, Default)]
pub struct ClusterTls(Option<Arc<dsec_tls::ClientConfig>>);

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ClusterTls(https)" } else { "ClusterTls(http)" })
    }
}

impl ClusterTls {
    /// Plain HTTP between the cluster's processes.
    pub fn plain() -> Self {
        ClusterTls(None)
    }

    /// HTTPS, peers' certificates checked against `config`'s roots.
    pub fn trusting(config: Arc<dsec_tls::ClientConfig>) -> Self {
        ClusterTls(Some(config))
    }

    pub fn is_tls(&self) -> bool {
        self.0.is_some()
    }

    pub fn scheme(&self) -> &'static str {
        if self.is_tls() {
            "https://"
        } else {
            "http://"
        }
    }

    /// Whether a peer's URL has this cluster's scheme and a host.
    pub fn check_url(&self, what: &str, url: &str) -> Result<(), String> {
        let scheme = self.scheme();
        match url.strip_prefix(scheme) {
            Some(rest) if !rest.is_empty() && !rest.starts_with('/') => Ok(()),
            _ if self.is_tls() => Err(format!("{what} URL {url:?} must be https://HOST:PORT: this cluster has a CA (--cluster-ca)")),
            _ if url.starts_with("https://") => {
                Err(format!("{what} URL {url:?} is https://: give the cluster CA (--cluster-ca) to check its certificate"))
            }
            _ => Err(format!("{what} URL {url:?} must be http://HOST:PORT")),
        }
    }

    /// An HTTP(S) connector with TCP_NODELAY and `connect_timeout`.
    pub fn connector(&self, connect_timeout: Duration) -> PeerConnector {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(connect_timeout));
        http.enforce_http(false);
        // A plain cluster's connector never makes a TLS connection
        // (check_url refuses https there), but it needs a configuration:
        // one that trusts nothing.
        static TRUSTS_NOTHING: LazyLock<Arc<dsec_tls::ClientConfig>> = LazyLock::new(dsec_tls::trusting_nothing);
        let config = self.0.as_ref().unwrap_or(&TRUSTS_NOTHING);
        HttpsConnectorBuilder::new().with_tls_config((**config).clone()).https_or_http().enable_http1().wrap_connector(http)
    }

    /// Checks that the peer at `url` presents a certificate of this
    /// cluster's CA for the URL's host: one TLS handshake, no request (an
    /// edge that is joining serves no HTTP until its join is answered,
    /// but its TLS listener already completes handshakes). Plain clusters
    /// have nothing to check.
    pub async fn verify_peer(&self, url: &str, timeout: Duration) -> Result<(), String> {
        let Some(config) = &self.0 else { return Ok(()) };
        let authority = url.strip_prefix("https://").and_then(|r| r.split('/').next()).unwrap_or_default();
        let (host, port) = split_host_port(authority).ok_or_else(|| format!("URL {url:?} has no HOST:PORT"))?;
        match tokio::time::timeout(timeout, dsec_tls::connect(config.clone(), host, port)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no TLS handshake with {authority} within {timeout:?}")),
        }
    }
}

/// `HOST:PORT` or `[V6]:PORT`; the port defaults to 443.
fn split_host_port(authority: &str) -> Option<(&str, u16)> {
    if authority.is_empty() {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && (!h.contains(':') || h.ends_with(']')) => (h, p.parse().ok()?),
        _ if authority.starts_with('[') && !authority.ends_with(']') => return None,
        _ => (authority, 443),
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_is_all_http_or_all_https() {
        let plain = ClusterTls::plain();
        assert!(plain.check_url("edge", "http://10.0.0.1:8081").is_ok());
        assert!(plain.check_url("edge", "https://10.0.0.1:8081").unwrap_err().contains("--cluster-ca"));
        assert!(plain.check_url("edge", "http://").is_err());
        assert!(plain.check_url("edge", "ftp://x").is_err());
        let dir = tempfile::tempdir().unwrap();
        let ca = dsec_tls::init_ca(dir.path(), "t").unwrap();
        let tls = ClusterTls::trusting(dsec_tls::client_config(Some(&ca.cert)).unwrap());
        assert!(tls.check_url("edge", "https://10.0.0.1:8081").is_ok());
        assert!(tls.check_url("edge", "http://10.0.0.1:8081").unwrap_err().contains("https://"));
    }

    #[test]
    fn host_and_port() {
        assert_eq!(split_host_port("10.0.0.1:8081"), Some(("10.0.0.1", 8081)));
        assert_eq!(split_host_port("[::1]:8081"), Some(("[::1]", 8081)));
        assert_eq!(split_host_port("edge.example"), Some(("edge.example", 443)));
        assert_eq!(split_host_port("a:notaport"), None);
        assert_eq!(split_host_port(""), None);
    }
}
