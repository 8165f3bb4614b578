//! The TLS options the servers share (`--tls-cert`, `--tls-key`), the
//! cluster CA clients trust (`--cluster-ca`), and the listener either
//! serves on.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use dsec_apiserver::cluster_tls::ClusterTls;
use dsec_apiserver::lingering::LingeringListener;
use dsec_apiserver::tls_listener::TlsListener;

#[derive(Args, Debug, Clone, Default)]
pub struct ServeTlsArgs {
    /// Serve HTTPS with this certificate chain (PEM; `dsec cluster cert`
    /// issues one for a node).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl ServeTlsArgs {
    pub fn server_config(&self) -> anyhow::Result<Option<Arc<dsec_tls::ServerConfig>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(dsec_tls::server_config(cert, key).context("loading --tls-cert and --tls-key")?)),
            _ => Ok(None),
        }
    }
}

#[derive(Args, Debug, Clone, Default)]
pub struct ClusterCaArgs {
    /// The cluster CA (PEM, `dsec cluster init`): peers are reached over
    /// HTTPS and must present a certificate it issued; without it, plain
    /// HTTP.
    #[arg(long, env = "DSEC_CLUSTER_CA")]
    pub cluster_ca: Option<PathBuf>,
}

impl ClusterCaArgs {
    /// How this process reaches its peers: HTTPS trusting the CA alone, or
    /// plain HTTP without one.
    pub fn peers(&self) -> anyhow::Result<ClusterTls> {
        match &self.cluster_ca {
            Some(ca) => Ok(ClusterTls::trusting(dsec_tls::client_config(Some(ca)).context("loading --cluster-ca")?)),
            None => Ok(ClusterTls::plain()),
        }
    }
}

/// A bound socket, served as plain HTTP or as HTTPS.
pub enum Bound {
    Plain(tokio::net::TcpListener),
    Tls(TlsListener),
}

impl Bound {
    /// Binds `listen`; with `tls`, TLS handshakes are answered from now on.
    pub async fn bind(listen: SocketAddr, tls: Option<Arc<dsec_tls::ServerConfig>>) -> anyhow::Result<Bound> {
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
        Ok(match tls {
            Some(config) => Bound::Tls(TlsListener::new(listener, config)?),
            None => Bound::Plain(listener),
        })
    }

    /// `http://ADDR` or `https://ADDR`.
    pub fn url(&self) -> anyhow::Result<String> {
        Ok(match self {
            Bound::Plain(l) => format!("http://{}", l.local_addr()?),
            Bound::Tls(l) => format!("https://{}", axum::serve::Listener::local_addr(l)?),
        })
    }

    /// Serves `router` until `shutdown` completes, then answers the
    /// requests in flight.
    pub async fn serve(
        self,
        router: axum::Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        match self {
            Bound::Plain(l) => axum::serve(LingeringListener::new(l), router).with_graceful_shutdown(shutdown).await,
            Bound::Tls(l) => axum::serve(l, router).with_graceful_shutdown(shutdown).await,
        }
    }
}
