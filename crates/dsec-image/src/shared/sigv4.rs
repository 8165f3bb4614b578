//! AWS Signature Version 4 for S3 requests, header form
//! (`Authorization: AWS4-HMAC-SHA256 ...`). Hand-written over RustCrypto's
//! `hmac` and `sha2` rather than the `aws-sigv4` crate, which brings the
//! smithy runtime (about twenty crates) and a newer compiler than this
//! workspace's rust-version for what is some forty lines of hashing. It is
//! checked against AWS's published example below and, end to end, against
//! a real S3 server that verifies signatures (the e2e tests).

use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};

/// The payload hash S3 accepts when the body is not hashed up front (a
/// layer upload is streamed from disk; TLS protects it in transit).
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";

/// Access key, secret and (for temporary credentials) session token.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        write!(f, "Credentials({})", self.access_key)
    }
}

/// One request to sign: `headers` are the ones to sign (lowercase names),
/// which must include `host`, `x-amz-date` and `x-amz-content-sha256`.
pub struct Request<'a> {
    pub method: &'a str,
    /// Already URI-encoded path (see [`encode_path`]).
    pub path: &'a str,
    /// Already encoded `k=v` pairs, sorted.
    pub query: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub payload_hash: &'a str,
}

/// The `Authorization` header value for `req`, signed at `amz_date`
/// (`YYYYMMDDTHHMMSSZ`) for `region` and service `s3`.
pub fn authorization(creds: &Credentials, region: &str, amz_date: &str, req: &Request<'_>) -> String {
    let mut headers: Vec<(String, String)> = req.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_string())).collect();
    headers.sort();
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = headers.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(";");
    let canonical_request =
        format!("{}\n{}\n{}\n{}\n{}\n{}", req.method, req.path, req.query, canonical_headers, signed_headers, req.payload_hash);
    let date = &amz_date[..8];
    let scope = format!("{date}/{region}/s3/aws4_request");
    let string_to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical_request.as_bytes())));
    let mut key = hmac(format!("AWS4{}", creds.secret_key).as_bytes(), date.as_bytes());
    for part in [region, "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, string_to_sign.as_bytes()));
    format!("AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}", creds.access_key)
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// S3's URI encoding of an object path: every byte but the unreserved
/// ones (`A-Za-z0-9-._~`) and `/` as `%XX`.
pub fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time.
pub fn amz_date(unix_secs: u64) -> String {
    crate::time::rfc3339(unix_secs).replace(['-', ':'], "")
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The "GET Object" example of AWS's S3 SigV4 documentation
    /// (header-based authentication, a ranged GET).
    #[test]
    fn aws_documented_example() {
        let creds = Credentials {
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            session_token: None,
        };
        let empty = sha256_hex(b"");
        let auth = authorization(
            &creds,
            "us-east-1",
            "20130524T000000Z",
            &Request {
                method: "GET",
                path: "/test.txt",
                query: "",
                headers: &[
                    ("host", "examplebucket.s3.amazonaws.com"),
                    ("range", "bytes=0-9"),
                    ("x-amz-content-sha256", &empty),
                    ("x-amz-date", "20130524T000000Z"),
                ],
                payload_hash: &empty,
            },
        );
        assert_eq!(
            auth,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn encoding_and_dates() {
        assert_eq!(encode_path("/b/manifests/a+b@v 1.json"), "/b/manifests/a%2Bb%40v%201.json");
        assert_eq!(amz_date(1_369_353_600), "20130524T000000Z");
    }
}
