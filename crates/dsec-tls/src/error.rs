use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: {source}", path.display())]
    Pem { path: PathBuf, source: rustls_pki_types::pem::Error },
    #[error("{}: holds no certificate", .0.display())]
    NoCertificate(PathBuf),
    #[error("{} already exists: a cluster CA is made once (remove its directory to start over)", .0.display())]
    Exists(PathBuf),
    #[error("name {0:?} must be 1-63 characters of a-z, A-Z, 0-9, '-', '_', '.' (it names the certificate's files)")]
    BadName(String),
    #[error("host {0:?} is neither an IP address nor a DNS name")]
    BadHost(String),
    #[error("a certificate needs at least one host (an IP address or DNS name it is reached at)")]
    NoHost,
    #[error("making a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
}

impl TlsError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> TlsError {
        let path = path.into();
        move |source| TlsError::Io { path, source }
    }

    pub(crate) fn pem(path: impl Into<PathBuf>) -> impl FnOnce(rustls_pki_types::pem::Error) -> TlsError {
        let path = path.into();
        move |source| TlsError::Pem { path, source }
    }
}
