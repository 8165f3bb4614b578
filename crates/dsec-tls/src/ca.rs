//! The cluster CA and the certificates it issues, as PEM files.
//!
//! The CA's key never leaves the directory `dsec cluster init` made (mode
//! 0600); a node's certificate and key are written where the operator asks
//! and copied to that node. Keys are ECDSA P-256, which every TLS stack
//! speaks and which costs a handshake least CPU of the common choices.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use time::{Duration, OffsetDateTime};

use crate::TlsError;

pub const CA_CERT_FILE: &str = "ca.pem";
pub const CA_KEY_FILE: &str = "ca-key.pem";

/// How long the CA is valid: long, since replacing it means reissuing
/// every node's certificate.
const CA_DAYS: i64 = 3650;
/// Certificates start an hour in the past, so a node whose clock runs a
/// little behind the one that issued them still accepts them.
const BACKDATE: Duration = Duration::hours(1);

/// Where a cluster CA's certificate and key are.
#[derive(Debug, Clone)]
pub struct CaFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CaFiles {
    pub fn in_dir(dir: &Path) -> Self {
        CaFiles { cert: dir.join(CA_CERT_FILE), key: dir.join(CA_KEY_FILE) }
    }
}

/// A certificate and its key, as written.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn common_name(name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn
}

/// `name` becomes part of file names: keep it to one plain component.
fn check_name(name: &str) -> Result<(), TlsError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(TlsError::BadName(name.to_string()))
    }
}

/// Makes a cluster CA in `dir` (created if missing). Refuses to replace
/// one that is there: every certificate it issued would stop working.
pub fn init_ca(dir: &Path, name: &str) -> Result<CaFiles, TlsError> {
    let files = CaFiles::in_dir(dir);
    for p in [&files.cert, &files.key] {
        if p.exists() {
            return Err(TlsError::Exists(p.clone()));
        }
    }
    fs::create_dir_all(dir).map_err(TlsError::io(dir))?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(name);
    // Path length 0: the CA signs node certificates, never another CA.
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(CA_DAYS);
    let cert = params.self_signed(&key)?;
    write_file(&files.key, key.serialize_pem().as_bytes(), 0o600, true)?;
    write_file(&files.cert, cert.pem().as_bytes(), 0o644, true)?;
    Ok(files)
}

fn subject_alt_name(host: &str) -> Result<SanType, TlsError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    let dns_ok = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    if !dns_ok {
        return Err(TlsError::BadHost(host.to_string()));
    }
    Ok(SanType::DnsName(host.to_string().try_into().map_err(|_| TlsError::BadHost(host.to_string()))?))
}

/// Issues `name` a certificate for `hosts` (IP addresses or DNS names it
/// is reached at), valid for `days`, signed by the CA in `ca_dir`; writes
/// `NAME.pem` and `NAME-key.pem` (0600) into `out_dir`, replacing an
/// earlier pair (a reissue).
pub fn issue(ca_dir: &Path, name: &str, hosts: &[String], days: u32, out_dir: &Path) -> Result<Issued, TlsError> {
    check_name(name)?;
    if hosts.is_empty() {
        return Err(TlsError::NoHost);
    }
    let sans = hosts.iter().map(|h| subject_alt_name(h)).collect::<Result<Vec<_>, _>>()?;
    let ca = CaFiles::in_dir(ca_dir);
    let ca_pem = fs::read_to_string(&ca.cert).map_err(TlsError::io(&ca.cert))?;
    let ca_key = KeyPair::from_pem(&fs::read_to_string(&ca.key).map_err(TlsError::io(&ca.key))?)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(name);
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    // A node is a server to some peers and a client of others.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + Duration::days(i64::from(days.max(1)));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    fs::create_dir_all(out_dir).map_err(TlsError::io(out_dir))?;
    let issued = Issued { cert: out_dir.join(format!("{name}.pem")), key: out_dir.join(format!("{name}-key.pem")) };
    write_file(&issued.key, key.serialize_pem().as_bytes(), 0o600, false)?;
    write_file(&issued.cert, cert.pem().as_bytes(), 0o644, false)?;
    Ok(issued)
}

/// Writes `bytes` to `path` with `mode` from the first byte on (a key is
/// never readable by others, not even for a moment). `new`: refuse to
/// replace a file; otherwise replace it by rename, so a reader sees the
/// old file or the new one.
fn write_file(path: &Path, bytes: &[u8], mode: u32, new: bool) -> Result<(), TlsError> {
    let target = if new { path.to_path_buf() } else { path.with_extension("tmp") };
    let mut opts = fs::OpenOptions::new();
    opts.write(true).mode(mode);
    if new {
        opts.create_new(true);
    } else {
        opts.create(true).truncate(true);
    }
    let mut f = opts.open(&target).map_err(TlsError::io(&target))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(TlsError::io(&target))?;
    if !new {
        fs::rename(&target, path).map_err(TlsError::io(path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_ca_is_made_once_and_its_key_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let files = init_ca(dir.path(), "test CA").unwrap();
        assert_eq!(fs::metadata(&files.key).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(fs::read_to_string(&files.cert).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(matches!(init_ca(dir.path(), "test CA"), Err(TlsError::Exists(_))));
    }

    #[test]
    fn bad_names_and_hosts_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "test CA").unwrap();
        let out = dir.path().join("out");
        assert!(matches!(issue(dir.path(), "../x", &["10.0.0.1".into()], 30, &out), Err(TlsError::BadName(_))));
        assert!(matches!(issue(dir.path(), "node1", &[], 30, &out), Err(TlsError::NoHost)));
        assert!(matches!(issue(dir.path(), "node1", &["a b".into()], 30, &out), Err(TlsError::BadHost(_))));
    }

    #[test]
    fn issuing_without_a_ca_says_which_file_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let e = issue(dir.path(), "node1", &["10.0.0.1".into()], 30, dir.path()).unwrap_err();
        assert!(e.to_string().contains(CA_CERT_FILE), "{e}");
    }
}
