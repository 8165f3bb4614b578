//! rustls configurations: a server's from its certificate and key, a
//! client's from the CA it trusts.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::TlsError;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs =
        CertificateDer::pem_file_iter(path).map_err(TlsError::pem(path))?.collect::<Result<Vec<_>, _>>().map_err(TlsError::pem(path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

/// A server presenting the certificate chain in `cert` with the key in
/// `key` (PEM both). HTTP/1.1 only, as the API serves it.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(TlsError::pem(key))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A client that trusts the certificates in `ca` (the cluster CA) and
/// nothing else; without `ca`, the public web's roots (an endpoint behind
/// a public certificate).
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for c in certificates(path)? {
                roots.add(c)?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// A client configuration with no roots: every certificate is refused
/// (for connectors that must never make a TLS connection).
pub fn trusting_nothing() -> Arc<ClientConfig> {
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls' default protocol versions")
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth();
    Arc::new(cfg)
}

/// The name a server's certificate must hold for `host` (an IP address,
/// bracketed or not, or a DNS name).
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(bare.to_string()).map_err(|_| TlsError::BadHost(host.to_string()))
}

/// A TLS connection to `host:port`, the server's certificate checked
/// against `cfg`'s roots and `host` (for clients that are not HTTP
/// clients: a WebSocket's handshake goes over it).
pub async fn connect(cfg: Arc<ClientConfig>, host: &str, port: u16) -> Result<TlsStream<TcpStream>, TlsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addr = format!("{host}:{port}");
    let name = server_name(host)?;
    let tcp = TcpStream::connect((bare, port)).await.map_err(|source| TlsError::Connect { addr: addr.clone(), source })?;
    // Interactive streams: small writes must not wait for delayed ACKs.
    let _ = tcp.set_nodelay(true);
    TlsConnector::from(cfg).connect(name, tcp).await.map_err(|source| TlsError::Connect { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn ca_and_node(dir: &Path, ca_name: &str) -> (std::path::PathBuf, crate::Issued) {
        let ca = crate::init_ca(&dir.join("ca"), ca_name).unwrap();
        let node = crate::issue(&dir.join("ca"), "node1", &["127.0.0.1".into(), "localhost".into()], 30, dir).unwrap();
        (ca.cert, node)
    }

    async fn serve_once(cfg: Arc<ServerConfig>, ip: &str) -> u16 {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Ok(mut tls) = tokio_rustls::TlsAcceptor::from(cfg).accept(tcp).await {
                let mut b = [0u8; 4];
                tls.read_exact(&mut b).await.unwrap();
                tls.write_all(&b).await.unwrap();
                tls.shutdown().await.unwrap();
            }
        });
        port
    }

    #[tokio::test]
    async fn a_node_certificate_is_trusted_by_its_cluster_ca_only() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, node) = ca_and_node(dir.path(), "cluster A");
        let server = server_config(&node.cert, &node.key).unwrap();

        let port = serve_once(server.clone(), "127.0.0.1").await;
        let mut s = connect(client_config(Some(&ca)).unwrap(), "127.0.0.1", port).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");

        // Another cluster's CA does not vouch for this node.
        let other = tempfile::tempdir().unwrap();
        let other_ca = crate::init_ca(other.path(), "cluster B").unwrap();
        let port = serve_once(server.clone(), "127.0.0.1").await;
        let e = connect(client_config(Some(&other_ca.cert)).unwrap(), "127.0.0.1", port).await.unwrap_err();
        assert!(e.to_string().contains("invalid peer certificate"), "{e}");

        // Nor do the public roots.
        let port = serve_once(server.clone(), "127.0.0.1").await;
        assert!(connect(client_config(None).unwrap(), "127.0.0.1", port).await.is_err());

        // A host the certificate does not name is refused too.
        let port = serve_once(server, "127.0.0.2").await;
        let e = connect(client_config(Some(&ca)).unwrap(), "127.0.0.2", port).await.unwrap_err();
        assert!(e.to_string().contains("not valid for"), "{e}");
    }

    #[test]
    fn files_that_are_not_pem_are_refused_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = client_config(Some(&junk)).unwrap_err();
        assert!(matches!(e, TlsError::NoCertificate(_)), "{e}");
        let e = server_config(&junk, &junk).unwrap_err();
        assert!(e.to_string().contains("junk.pem"), "{e}");
        let e = client_config(Some(&dir.path().join("missing.pem"))).unwrap_err();
        assert!(e.to_string().contains("missing.pem"), "{e}");
    }
}
