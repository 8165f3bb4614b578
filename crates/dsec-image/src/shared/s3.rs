//! The S3-compatible flavour of the shared store: the directory layout as
//! object keys under `s3://bucket/prefix` (path-style requests, so any
//! S3-compatible server works: AWS, MinIO, Ceph RGW, Garage...).
//!
//! ```text
//! <prefix>/blobs/sha256/<hex>.erofs    layer blobs
//! <prefix>/blobs/sha256/<hex>.chunks   their chunk tables
//! <prefix>/manifests/<name>/<tag>.json manifests (name may hold '/')
//! ```
//! Chunks are ranged GETs. Every request is signed (SigV4) and bounded in
//! time, so a lost store is an error after the timeout, never a hang.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::sigv4::{self, Credentials, UNSIGNED_PAYLOAD};
use crate::digest::Digest;
use crate::manifest::Manifest;
use crate::reference::Reference;
use crate::store::{io_err, ImageError};

/// Bounds on one request: a store that stops answering fails the read
/// (EIO in the sandbox) instead of blocking it forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the S3 server is and who we are to it.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// `http(s)://host[:port]`; default: AWS's regional endpoint.
    pub endpoint: Option<String>,
    pub region: String,
    /// None: anonymous requests (a public bucket).
    pub credentials: Option<Credentials>,
}

impl S3Options {
    /// From the usual variables: `DSEC_S3_ENDPOINT` (or `AWS_ENDPOINT_URL`),
    /// `AWS_REGION` (or `AWS_DEFAULT_REGION`, default `us-east-1`),
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`.
    pub fn from_env() -> S3Options {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let credentials = match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key), Some(secret_key)) => Some(Credentials { access_key, secret_key, session_token: var("AWS_SESSION_TOKEN") }),
            _ => None,
        };
        S3Options {
            endpoint: var("DSEC_S3_ENDPOINT").or_else(|| var("AWS_ENDPOINT_URL")),
            region: var("AWS_REGION").or_else(|| var("AWS_DEFAULT_REGION")).unwrap_or_else(|| "us-east-1".into()),
            credentials,
        }
    }
}

pub struct S3Store {
    endpoint: String,
    /// `host[:port]` as sent in the Host header (and signed).
    host: String,
    bucket: String,
    /// Without leading or trailing '/'; may be empty.
    prefix: String,
    options: S3Options,
    agent: ureq::Agent,
}

impl S3Store {
    /// `location` is `bucket[/prefix]` (what follows `s3://`).
    pub fn new(location: &str, options: &S3Options) -> Result<S3Store, ImageError> {
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        let invalid = |message: String| ImageError::SharedStore { store: format!("s3://{location}"), message };
        if bucket.is_empty() || !bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
            return Err(invalid(format!("invalid bucket name {bucket:?}")));
        }
        let endpoint = options.endpoint.clone().unwrap_or_else(|| format!("https://s3.{}.amazonaws.com", options.region));
        let endpoint = endpoint.trim_end_matches('/').to_string();
        let host = endpoint
            .strip_prefix("http://")
            .or_else(|| endpoint.strip_prefix("https://"))
            .filter(|h| !h.is_empty() && !h.contains('/'))
            .ok_or_else(|| invalid(format!("endpoint {endpoint:?} is not http(s)://host[:port]")))?
            .to_string();
        Ok(S3Store {
            endpoint,
            host,
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            options: options.clone(),
            agent: ureq::AgentBuilder::new()
                .timeout_connect(CONNECT_TIMEOUT)
                .timeout_read(READ_TIMEOUT)
                .timeout_write(READ_TIMEOUT)
                .build(),
        })
    }

    pub fn describe(&self) -> String {
        format!("s3://{}/{} at {}", self.bucket, self.prefix, self.endpoint)
    }

    fn key(&self, rest: &str) -> String {
        if self.prefix.is_empty() {
            rest.to_string()
        } else {
            format!("{}/{rest}", self.prefix)
        }
    }

    fn blob_key(&self, digest: &Digest, ext: &str) -> String {
        self.key(&format!("blobs/sha256/{}.{ext}", digest.hex()))
    }

    fn manifest_key(&self, reference: &Reference) -> String {
        // Unambiguous: a tag never holds '/', so name and tag split at the last one.
        self.key(&format!("manifests/{}/{}.json", reference.name(), reference.tag()))
    }

    fn error(&self, message: String) -> ImageError {
        ImageError::SharedStore { store: self.describe(), message }
    }

    /// One signed request. `extra` headers are sent and signed.
    fn request(
        &self,
        method: &str,
        key: &str,
        extra: &[(&str, String)],
        body: Option<(Box<dyn Read + '_>, u64)>,
    ) -> Result<Result<ureq::Response, (u16, String)>, ImageError> {
        let path = sigv4::encode_path(&format!("/{}/{key}", self.bucket));
        let url = format!("{}{path}", self.endpoint);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let date = sigv4::amz_date(now);
        let payload = if body.is_some() { UNSIGNED_PAYLOAD.to_string() } else { sigv4::sha256_hex(b"") };
        let mut headers: Vec<(&str, String)> =
            vec![("host", self.host.clone()), ("x-amz-date", date.clone()), ("x-amz-content-sha256", payload.clone())];
        headers.extend(extra.iter().cloned());
        if let Some(token) = self.options.credentials.as_ref().and_then(|c| c.session_token.clone()) {
            headers.push(("x-amz-security-token", token));
        }
        let mut req = self.agent.request(method, &url);
        for (k, v) in &headers {
            if *k != "host" {
                req = req.set(k, v);
            }
        }
        if let Some(creds) = &self.options.credentials {
            let signed: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let auth = sigv4::authorization(
                creds,
                &self.options.region,
                &date,
                &sigv4::Request { method, path: &path, query: "", headers: &signed, payload_hash: &payload },
            );
            req = req.set("authorization", &auth);
        }
        let result = match body {
            Some((reader, len)) => req.set("content-length", &len.to_string()).send(reader),
            None => req.call(),
        };
        match result {
            Ok(resp) => Ok(Ok(resp)),
            Err(ureq::Error::Status(code, resp)) => {
                let text = resp.into_string().unwrap_or_default();
                Ok(Err((code, s3_error_code(&text))))
            }
            Err(ureq::Error::Transport(t)) => Err(self.error(format!("{method} {key}: {t}"))),
        }
    }

    fn get_bytes(&self, key: &str, extra: &[(&str, String)]) -> Result<Result<Vec<u8>, (u16, String)>, ImageError> {
        match self.request("GET", key, extra, None)? {
            Ok(resp) => {
                let mut out = Vec::new();
                resp.into_reader().read_to_end(&mut out).map_err(|e| self.error(format!("GET {key}: {e}")))?;
                Ok(Ok(out))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    fn status_error(&self, method: &str, key: &str, (code, what): (u16, String)) -> ImageError {
        // A HEAD answer has no error document to name the cause.
        let what = match (code, what.is_empty()) {
            (403, true) => "access denied (check the credentials and the bucket policy)".to_string(),
            (404, true) => "no such object".to_string(),
            _ => what,
        };
        self.error(format!("{method} {key}: HTTP {code} {what}"))
    }

    pub fn manifest(&self, reference: &Reference) -> Result<Manifest, ImageError> {
        let key = self.manifest_key(reference);
        match self.get_bytes(&key, &[])? {
            Ok(bytes) => Manifest::from_json(&bytes).map_err(|source| ImageError::Manifest { path: key.into(), source }),
            Err((404, _)) => Err(ImageError::ImageNotFound(reference.to_string())),
            Err(e) => Err(self.status_error("GET", &key, e)),
        }
    }

    pub fn has_blob(&self, digest: &Digest) -> Result<bool, ImageError> {
        let key = self.blob_key(digest, "erofs");
        match self.request("HEAD", &key, &[], None)? {
            Ok(_) => Ok(true),
            Err((404, _)) => Ok(false),
            Err(e) => Err(self.status_error("HEAD", &key, e)),
        }
    }

    pub fn blob_reader(&self, digest: &Digest) -> Result<Box<dyn Read + Send>, ImageError> {
        let key = self.blob_key(digest, "erofs");
        match self.request("GET", &key, &[], None)? {
            Ok(resp) => Ok(Box::new(resp.into_reader())),
            Err(e) => Err(self.status_error("GET", &key, e)),
        }
    }

    pub fn read_range(&self, digest: &Digest, offset: u64, len: u64) -> Result<Vec<u8>, ImageError> {
        let key = self.blob_key(digest, "erofs");
        let range = format!("bytes={offset}-{}", offset + len.max(1) - 1);
        match self.get_bytes(&key, &[("range", range)])? {
            Ok(bytes) if bytes.len() as u64 == len => Ok(bytes),
            Ok(bytes) => Err(self.error(format!("GET {key} [{offset}, +{len}): the store sent {} bytes", bytes.len()))),
            Err(e) => Err(self.status_error("GET", &key, e)),
        }
    }

    pub fn chunk_table(&self, digest: &Digest) -> Result<Vec<u8>, ImageError> {
        let key = self.blob_key(digest, "chunks");
        self.get_bytes(&key, &[])?.map_err(|e| self.status_error("GET", &key, e))
    }

    fn put(&self, key: &str, body: Box<dyn Read + '_>, len: u64) -> Result<(), ImageError> {
        match self.request("PUT", key, &[], Some((body, len)))? {
            Ok(_) => Ok(()),
            Err(e) => Err(self.status_error("PUT", key, e)),
        }
    }

    pub fn put_blob(&self, digest: &Digest, path: &Path) -> Result<u64, ImageError> {
        let file = File::open(path).map_err(io_err("opening layer", path))?;
        let len = file.metadata().map_err(io_err("reading", path))?.len();
        self.put(&self.blob_key(digest, "erofs"), Box::new(file), len)?;
        Ok(len)
    }

    pub fn put_chunk_table(&self, digest: &Digest, bytes: &[u8]) -> Result<(), ImageError> {
        self.put(&self.blob_key(digest, "chunks"), Box::new(bytes), bytes.len() as u64)
    }

    pub fn put_manifest(&self, reference: &Reference, manifest: &Manifest) -> Result<(), ImageError> {
        let key = self.manifest_key(reference);
        let json = manifest.to_json().map_err(|source| ImageError::Manifest { path: key.clone().into(), source })?;
        self.put(&key, Box::new(&json[..]), json.len() as u64)
    }
}

/// The `<Code>` of an S3 error document (e.g. `NoSuchKey`,
/// `SignatureDoesNotMatch`), or a short excerpt of whatever came back.
fn s3_error_code(body: &str) -> String {
    let between = |open: &str, close: &str| {
        let start = body.find(open)? + open.len();
        let end = body[start..].find(close)? + start;
        Some(body[start..end].to_string())
    };
    between("<Code>", "</Code>").unwrap_or_else(|| body.chars().take(120).collect())
}
