//! One layer blob loaded on demand: a sparse local cache file the size of
//! the blob, a bitmap of the chunks it holds, and the store the missing
//! ones come from.
//!
//! A read fetches the chunks it covers that are not local yet (each once,
//! however many readers want it at the same time), checks each against the
//! chunk table, writes it into the cache file, and then serves the bytes
//! from there. When the last chunk arrives, the whole blob is checked
//! against its digest and the cache file becomes an ordinary blob of the
//! node's store (a rename: nothing is copied), where the store's LRU rules
//! apply. A cache file that never completes is deleted with the blob (it
//! is a temp file of the store), so nothing half-fetched outlives it.

// `LazyError` names the blob and the cause of every failure; it is returned
// once per read that fails, so its size costs nothing worth a box.
#![allow(clippy::result_large_err)]

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use tempfile::NamedTempFile;

use super::chunks::ChunkTable;
use crate::digest::Digest;
use crate::shared::SharedStore;
use crate::store::{ImageError, ImageStore};

#[derive(Debug, thiserror::Error)]
pub enum LazyError {
    #[error("read past the end of layer {digest} ({size} bytes)")]
    OutOfRange { digest: Digest, size: u64 },
    #[error("fetching chunk {index} of layer {digest}: {source}")]
    Fetch {
        digest: Digest,
        index: u64,
        #[source]
        source: ImageError,
    },
    #[error("layer cache file of {digest}: {source}")]
    Cache {
        digest: Digest,
        #[source]
        source: io::Error,
    },
}

/// What one blob has cost so far (for logs, tests and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobStats {
    pub size: u64,
    pub chunks_total: u64,
    pub chunks_present: u64,
    /// Bytes fetched from the shared store (each chunk at most once).
    pub fetched_bytes: u64,
    /// Whether the blob is complete and now a blob of the node's store.
    pub promoted: bool,
}

/// Cache files are `tmp/lazy-<digest prefix>-<random>.partial`.
const PARTIAL_PREFIX: &str = "lazy-";
const PARTIAL_SUFFIX: &str = ".partial";

/// Deletes the cache files of incomplete blobs an earlier process left in
/// `store` (killed before it could drop them): no blob of this process
/// holds them, and a partial file is never promoted by anyone else.
/// Call before this process serves any blob from `store`. Returns how
/// many were removed.
pub fn remove_leftover_partials(store: &ImageStore) -> io::Result<usize> {
    let mut removed = 0;
    let dir = match std::fs::read_dir(store.temp_dir()) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in dir {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(PARTIAL_PREFIX) && name.ends_with(PARTIAL_SUFFIX) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

struct State {
    present: Vec<bool>,
    missing: u64,
    in_flight: HashSet<u64>,
    /// The cache file while incomplete; taken when it is promoted.
    temp: Option<NamedTempFile>,
}

pub struct LazyBlob {
    digest: Digest,
    table: ChunkTable,
    source: Arc<SharedStore>,
    store: Arc<ImageStore>,
    /// The cache file, open for reading and writing: stays valid across
    /// the promotion rename.
    file: File,
    state: Mutex<State>,
    arrived: Condvar,
    fetched: AtomicU64,
}

impl LazyBlob {
    /// A blob none of whose chunks is local yet: a sparse cache file in
    /// the node store's temp directory (same filesystem: promotion is a
    /// rename).
    pub fn new(digest: Digest, table: ChunkTable, source: Arc<SharedStore>, store: Arc<ImageStore>) -> Result<LazyBlob, LazyError> {
        let cache_err = |source| LazyError::Cache { digest, source };
        let temp = tempfile::Builder::new()
            .prefix(&format!("{PARTIAL_PREFIX}{}-", &digest.hex()[..16]))
            .suffix(PARTIAL_SUFFIX)
            .tempfile_in(store.temp_dir())
            .map_err(cache_err)?;
        temp.as_file().set_len(table.blob_size).map_err(cache_err)?;
        let file = temp.as_file().try_clone().map_err(cache_err)?;
        let count = table.count();
        Ok(LazyBlob {
            digest,
            state: Mutex::new(State { present: vec![false; count as usize], missing: count, in_flight: HashSet::new(), temp: Some(temp) }),
            table,
            source,
            store,
            file,
            arrived: Condvar::new(),
            fetched: AtomicU64::new(0),
        })
    }

    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    pub fn size(&self) -> u64 {
        self.table.blob_size
    }

    /// Where the incomplete cache file is (None once promoted).
    pub fn cache_path(&self) -> Option<PathBuf> {
        self.lock().temp.as_ref().map(|t| t.path().to_path_buf())
    }

    pub fn stats(&self) -> BlobStats {
        let state = self.lock();
        BlobStats {
            size: self.table.blob_size,
            chunks_total: self.table.count(),
            chunks_present: self.table.count() - state.missing,
            fetched_bytes: self.fetched.load(Ordering::Relaxed),
            promoted: state.temp.is_none() && state.missing == 0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Up to `len` bytes from `offset` (fewer only at the end of the blob).
    pub fn read_at(&self, offset: u64, len: u32) -> Result<Vec<u8>, LazyError> {
        let size = self.table.blob_size;
        if offset > size {
            return Err(LazyError::OutOfRange { digest: self.digest, size });
        }
        let end = (offset + u64::from(len)).min(size);
        if end == offset {
            return Ok(Vec::new());
        }
        let chunk = u64::from(self.table.chunk_size);
        for index in offset / chunk..=(end - 1) / chunk {
            self.ensure(index)?;
        }
        let mut buf = vec![0u8; (end - offset) as usize];
        self.file.read_exact_at(&mut buf, offset).map_err(|source| LazyError::Cache { digest: self.digest, source })?;
        Ok(buf)
    }

    /// Makes chunk `index` local: fetched by this thread, or waited for if
    /// another one is fetching it.
    fn ensure(&self, index: u64) -> Result<(), LazyError> {
        {
            let mut state = self.lock();
            loop {
                if state.present[index as usize] {
                    return Ok(());
                }
                if !state.in_flight.contains(&index) {
                    state.in_flight.insert(index);
                    break;
                }
                state = self.arrived.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        }
        let result = self.fetch(index);
        let complete = {
            let mut state = self.lock();
            state.in_flight.remove(&index);
            if result.is_ok() {
                state.present[index as usize] = true;
                state.missing -= 1;
            }
            self.arrived.notify_all();
            state.missing == 0 && result.is_ok()
        };
        if complete {
            self.promote();
        }
        result
    }

    fn fetch(&self, index: u64) -> Result<(), LazyError> {
        let (offset, len) = self.table.range(index);
        let fetch_err = |source| LazyError::Fetch { digest: self.digest, index, source };
        let data = self.source.read_range(&self.digest, offset, len).map_err(fetch_err)?;
        self.fetched.fetch_add(len, Ordering::Relaxed);
        // Checked before a single byte of it can be served.
        self.table.verify(index, &data).map_err(|e| fetch_err(e.into()))?;
        self.file.write_all_at(&data, offset).map_err(|source| LazyError::Cache { digest: self.digest, source })
    }

    /// The last chunk arrived: the whole blob is checked against its digest
    /// and renamed into the node's store. A failure (which would mean the
    /// table lied, or the disk) leaves the cache file a temp file, deleted
    /// with the blob; reads keep being served from it, chunk-verified.
    fn promote(&self) {
        let Some(temp) = self.lock().temp.take() else { return };
        match self.store.put_layer_from_temp(temp, Some(&self.digest)) {
            Ok(stored) => tracing::info!(layer = %self.digest, bytes = stored.size, "on-demand layer complete; now in the node's store"),
            Err(e) => tracing::warn!(layer = %self.digest, error = %e, "completed on-demand layer failed its whole-blob check"),
        }
    }
}

impl Drop for LazyBlob {
    fn drop(&mut self) {
        let s = self.stats();
        tracing::debug!(
            layer = %self.digest,
            fetched = s.fetched_bytes,
            size = s.size,
            "on-demand layer released"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_partial_cache_files_are_left_overs() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let tmp = store.temp_dir();
        for name in ["lazy-0123456789abcdef-x1.partial", "lazy-fedcba9876543210-x2.partial", "build.tmp", "lazy-notes.txt"] {
            std::fs::write(tmp.join(name), b"x").unwrap();
        }
        assert_eq!(remove_leftover_partials(&store).unwrap(), 2);
        let mut left: Vec<_> = std::fs::read_dir(tmp).unwrap().map(|e| e.unwrap().file_name()).collect();
        left.sort();
        assert_eq!(left, ["build.tmp", "lazy-notes.txt"]);
        assert_eq!(remove_leftover_partials(&store).unwrap(), 0);
    }
}
