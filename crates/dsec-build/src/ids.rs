//! Build ids: what labels a build's sandboxes, so they can be found.

/// 12 hex characters from the clock and the process: unique enough to tell
/// concurrent builds of one node apart in labels and provenance.
pub fn build_id() -> String {
    use sha2::Digest;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let seed = format!("{now} {} {:?}", std::process::id(), std::thread::current().id());
    hex::encode(&sha2::Sha256::digest(seed.as_bytes())[..6])
}
