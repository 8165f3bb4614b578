//! The on-disk layer and image store.
//!
//! Layout under the root directory:
//! ```text
//! blobs/sha256/<hex>.erofs   layer blobs, content-addressed, read-only
//! manifests/<name>@<tag>.json  one manifest per reference ('/' in names as '+')
//! tmp/                       temp files and build roots (same filesystem, so
//!                            publishing is a rename)
//! gc.lock                    flock: writers shared, gc exclusive
//! ```
//! Every write goes to `tmp/` first and is renamed into place, so readers
//! (other threads, other processes) only ever see complete files.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustix::fs::{flock, FlockOperation};
use tempfile::NamedTempFile;

use crate::digest::{Digest, HashingWriter};
use crate::erofs::{self, ErofsError};
use crate::fsutil::{fsync_dir, is_enospc};
use crate::manifest::{LayerKind, Manifest, ManifestError};
use crate::reference::{Reference, ReferenceError};

/// Temp entries older than this are leftovers of a crashed process; `gc`
/// deletes them. A live build touches its temp files far more recently.
const STALE_TEMP_AGE: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image `{0}` not found")]
    ImageNotFound(String),
    #[error(transparent)]
    InvalidReference(#[from] ReferenceError),
    #[error("corrupt or truncated layer blob {path}: {source}")]
    CorruptBlob {
        path: PathBuf,
        #[source]
        source: ErofsError,
    },
    #[error("digest mismatch: expected {expected}, the content is {actual}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("image `{reference}` names layer {digest}, whose blob {path} is missing")]
    MissingBlob { reference: String, digest: Digest, path: PathBuf },
    #[error("layer {digest} should be {expected} bytes but its blob is {actual} bytes")]
    BlobSizeMismatch { digest: Digest, expected: u64, actual: u64 },
    #[error("manifest {path}: {source}")]
    Manifest {
        path: PathBuf,
        #[source]
        source: ManifestError,
    },
    #[error(transparent)]
    Chunk(#[from] crate::lazy::ChunkError),
    #[error("shared store {store}: {message}")]
    SharedStore { store: String, message: String },
    #[error("disk full while writing {path}")]
    DiskFull { path: PathBuf },
    #[error("{context} {path}: {source}")]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Maps an I/O error to `DiskFull` or `Io` with context.
pub(crate) fn io_err<'a>(context: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ImageError + 'a {
    move |source| {
        if is_enospc(&source) {
            ImageError::DiskFull { path: path.to_path_buf() }
        } else {
            ImageError::Io { context, path: path.to_path_buf(), source }
        }
    }
}

/// A blob now in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLayer {
    pub digest: Digest,
    pub size: u64,
    pub path: PathBuf,
}

/// One layer of a resolved image, with the absolute path of its blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLayer {
    pub digest: Digest,
    pub kind: LayerKind,
    pub size: u64,
    pub path: PathBuf,
}

/// A manifest whose blobs were all present when it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    pub reference: Reference,
    pub manifest: Manifest,
    /// Bottom first, like `manifest.layers`.
    pub layers: Vec<ResolvedLayer>,
}

/// A stored image as `list` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEntry {
    pub reference: Reference,
    pub manifest: Manifest,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    pub blobs_removed: u64,
    pub bytes_removed: u64,
}

/// Identity of a manifest file's current version. Every write is a rename
/// of a new file, so the inode changes even when two writes land within
/// one mtime tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    size: u64,
}

impl FileStamp {
    fn of(meta: &fs::Metadata) -> Self {
        FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
            size: meta.len(),
        }
    }
}

struct Cached {
    stamp: FileStamp,
    /// The blobs directory changes whenever a blob is added or removed; a
    /// changed directory re-checks that the image's blobs still exist.
    blobs_stamp: FileStamp,
    image: Arc<ResolvedImage>,
}

/// Held by writers so `gc` cannot run between committing a layer and
/// committing the manifest that names it (see [`ImageStore::write_lock`]).
#[must_use = "the lock is released when dropped"]
pub struct WriteLock {
    _file: File,
}

pub struct ImageStore {
    root: PathBuf,
    blobs: PathBuf,
    manifests: PathBuf,
    tmp: PathBuf,
    /// Resolved images keyed by reference, revalidated with two stats per
    /// resolve (the manifest and the blobs directory) instead of a read,
    /// a parse and a stat per layer.
    cache: RwLock<HashMap<Reference, Cached>>,
}

impl ImageStore {
    /// Opens (creating if needed) the store rooted at `root`.
    pub fn open(root: impl AsRef<Path>) -> Result<ImageStore, ImageError> {
        let root = root.as_ref();
        fs::create_dir_all(root).map_err(io_err("creating store directory", root))?;
        let root = root.canonicalize().map_err(io_err("resolving store directory", root))?;
        let store = ImageStore {
            blobs: root.join("blobs").join("sha256"),
            manifests: root.join("manifests"),
            tmp: root.join("tmp"),
            root,
            cache: RwLock::new(HashMap::new()),
        };
        for dir in [&store.blobs, &store.manifests, &store.tmp] {
            fs::create_dir_all(dir).map_err(io_err("creating store directory", dir))?;
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the blob of `digest` lives (whether or not it is present).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(format!("{}.erofs", digest.hex()))
    }

    /// Where the chunk table of `digest` lives in a shared store (written
    /// by a push, read by nodes loading the layer on demand).
    pub fn chunk_table_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(format!("{}.chunks", digest.hex()))
    }

    /// Writes the chunk table of a blob (atomically, like everything else).
    pub fn put_chunk_table(&self, digest: &Digest, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.chunk_table_path(digest);
        let mut temp = self.temp_file()?;
        temp.write_all(bytes).map_err(io_err("writing chunk table", temp.path()))?;
        fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o444)).map_err(io_err("setting permissions of", temp.path()))?;
        temp.persist(&path).map_err(|e| io_err("publishing chunk table", &path)(e.error))?;
        Ok(())
    }

    /// Where the record of a blob's last OCI export lives (`oci::push`).
    pub(crate) fn export_record_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(format!("{}.oci.json", digest.hex()))
    }

    /// Writes the record of a blob's OCI export (atomically).
    pub(crate) fn put_export_record(&self, digest: &Digest, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.export_record_path(digest);
        let mut temp = self.temp_file()?;
        temp.write_all(bytes).map_err(io_err("writing export record", temp.path()))?;
        temp.persist(&path).map_err(|e| io_err("publishing export record", &path)(e.error))?;
        Ok(())
    }

    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    pub fn contains(&self, reference: &Reference) -> bool {
        self.manifest_path(reference).is_file()
    }

    fn manifest_path(&self, reference: &Reference) -> PathBuf {
        // '+' and '@' are valid in neither names nor tags: the encoding is
        // reversible and flat (no directory per name component to clean up).
        let file = format!("{}@{}.json", reference.name().replace('/', "+"), reference.tag());
        self.manifests.join(file)
    }

    fn reference_of_file(file_name: &str) -> Option<Reference> {
        let stem = file_name.strip_suffix(".json")?;
        let (name, tag) = stem.rsplit_once('@')?;
        Reference::new(&name.replace('+', "/"), tag).ok()
    }

    /// A shared lock that makes `gc` wait. Hold it across committing layers
    /// and the manifest naming them when a gc may run concurrently (the
    /// builders in this crate do); without it a gc in between would delete
    /// the fresh blobs and `put_image` would then fail with `MissingBlob`.
    pub fn write_lock(&self) -> Result<WriteLock, ImageError> {
        self.lock(FlockOperation::LockShared)
    }

    fn lock(&self, op: FlockOperation) -> Result<WriteLock, ImageError> {
        let path = self.root.join("gc.lock");
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io_err("opening lock file", &path))?;
        flock(&file, op).map_err(|e| io_err("locking", &path)(e.into()))?;
        Ok(WriteLock { _file: file })
    }

    // ---- reading -------------------------------------------------------

    /// Resolves `name` or `name:tag` to its manifest and blob paths.
    pub fn resolve(&self, reference: &str) -> Result<Arc<ResolvedImage>, ImageError> {
        self.resolve_ref(&reference.parse()?)
    }

    pub fn resolve_ref(&self, reference: &Reference) -> Result<Arc<ResolvedImage>, ImageError> {
        let path = self.manifest_path(reference);
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.forget(reference);
                return Err(ImageError::ImageNotFound(reference.to_string()));
            }
            Err(e) => return Err(io_err("reading manifest", &path)(e)),
        };
        let stamp = FileStamp::of(&meta);
        let blobs_stamp = FileStamp::of(&fs::metadata(&self.blobs).map_err(io_err("reading", &self.blobs))?);
        if let Some(hit) = self.cache.read().unwrap_or_else(|p| p.into_inner()).get(reference) {
            if hit.stamp == stamp && hit.blobs_stamp == blobs_stamp {
                return Ok(Arc::clone(&hit.image));
            }
        }

        // Read through the open file and stamp *that* file, so a rename
        // racing with us cannot pair an old stamp with new content.
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ImageError::ImageNotFound(reference.to_string())),
            Err(e) => return Err(io_err("reading manifest", &path)(e)),
        };
        let stamp = FileStamp::of(&file.metadata().map_err(io_err("reading manifest", &path))?);
        let mut bytes = Vec::with_capacity(stamp.size as usize);
        file.read_to_end(&mut bytes).map_err(io_err("reading manifest", &path))?;
        let manifest = Manifest::from_json(&bytes).map_err(|source| ImageError::Manifest { path: path.clone(), source })?;
        let layers = self.check_layers(reference, &manifest)?;
        let image = Arc::new(ResolvedImage { reference: reference.clone(), manifest, layers });
        self.cache
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(reference.clone(), Cached { stamp, blobs_stamp, image: Arc::clone(&image) });
        Ok(image)
    }

    /// Every blob a manifest names must be present with the recorded size.
    /// (Content was verified against the digest when the blob was imported;
    /// re-hashing 100+ MB per resolve is not affordable.)
    fn check_layers(&self, reference: &Reference, manifest: &Manifest) -> Result<Vec<ResolvedLayer>, ImageError> {
        manifest
            .layers
            .iter()
            .map(|layer| {
                let path = self.blob_path(&layer.digest);
                let meta = fs::metadata(&path).map_err(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        ImageError::MissingBlob { reference: reference.to_string(), digest: layer.digest, path: path.clone() }
                    } else {
                        io_err("reading layer blob", &path)(e)
                    }
                })?;
                if meta.len() != layer.size {
                    return Err(ImageError::BlobSizeMismatch { digest: layer.digest, expected: layer.size, actual: meta.len() });
                }
                Ok(ResolvedLayer { digest: layer.digest, kind: layer.kind, size: layer.size, path })
            })
            .collect()
    }

    fn forget(&self, reference: &Reference) {
        self.cache.write().unwrap_or_else(|p| p.into_inner()).remove(reference);
    }

    /// All stored images, sorted by reference. A manifest that cannot be
    /// read is an error rather than silently skipped.
    pub fn list(&self) -> Result<Vec<ImageEntry>, ImageError> {
        let mut out = Vec::new();
        for (reference, path) in self.manifest_files()? {
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                // Removed since we listed the directory.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err("reading manifest", &path)(e)),
            };
            let manifest = Manifest::from_json(&bytes).map_err(|source| ImageError::Manifest { path: path.clone(), source })?;
            out.push(ImageEntry { reference, manifest });
        }
        out.sort_by(|a, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    fn manifest_files(&self) -> Result<Vec<(Reference, PathBuf)>, ImageError> {
        let dir = fs::read_dir(&self.manifests).map_err(io_err("listing", &self.manifests))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(io_err("listing", &self.manifests))?;
            if let Some(reference) = entry.file_name().to_str().and_then(Self::reference_of_file) {
                out.push((reference, entry.path()));
            }
        }
        Ok(out)
    }

    // ---- writing -------------------------------------------------------

    /// Copies an EROFS image into the store. Verifies the superblock and,
    /// when `expected` is given, the digest; the blob becomes visible only
    /// once complete and verified.
    pub fn put_layer_from_file(&self, src: &Path, expected: Option<&Digest>) -> Result<StoredLayer, ImageError> {
        let file = File::open(src).map_err(io_err("opening layer file", src))?;
        self.put_layer_from_reader(file, expected)
    }

    /// Like [`put_layer_from_file`](Self::put_layer_from_file) for any byte stream.
    pub fn put_layer_from_reader(&self, mut reader: impl Read, expected: Option<&Digest>) -> Result<StoredLayer, ImageError> {
        let _lock = self.write_lock()?;
        let temp = self.temp_file()?;
        let mut writer = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, temp.as_file()));
        io::copy(&mut reader, &mut writer).map_err(io_err("writing layer", temp.path()))?;
        writer.flush().map_err(io_err("writing layer", temp.path()))?;
        let (digest, len) = writer.finish();
        self.commit_temp_layer(temp, digest, len, expected)
    }

    /// Publishes a layer written by a builder straight into a temp file of
    /// this store (no copy): hashes it, checks it, renames it into place.
    pub(crate) fn put_layer_from_temp(&self, temp: NamedTempFile, expected: Option<&Digest>) -> Result<StoredLayer, ImageError> {
        let _lock = self.write_lock()?;
        let (digest, len) =
            Digest::of_reader(io::BufReader::with_capacity(1 << 20, temp.as_file())).map_err(io_err("reading layer", temp.path()))?;
        self.commit_temp_layer(temp, digest, len, expected)
    }

    /// `temp` is deleted by its drop on every early return.
    fn commit_temp_layer(
        &self,
        temp: NamedTempFile,
        actual: Digest,
        len: u64,
        expected: Option<&Digest>,
    ) -> Result<StoredLayer, ImageError> {
        if let Some(expected) = expected {
            if *expected != actual {
                return Err(ImageError::DigestMismatch { expected: *expected, actual });
            }
        }
        erofs::check_image(temp.as_file(), len).map_err(|source| ImageError::CorruptBlob { path: temp.path().to_path_buf(), source })?;
        let path = self.blob_path(&actual);
        if path.is_file() {
            // Content-addressed: an existing blob with this name is this blob.
            return Ok(StoredLayer { digest: actual, size: len, path });
        }
        temp.as_file().sync_all().map_err(io_err("syncing layer", temp.path()))?;
        // Read-only: a blob is immutable once published.
        fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o444)).map_err(io_err("setting permissions of", temp.path()))?;
        temp.persist(&path).map_err(|e| io_err("publishing layer", &path)(e.error))?;
        fsync_dir(&self.blobs).map_err(io_err("syncing", &self.blobs))?;
        Ok(StoredLayer { digest: actual, size: len, path })
    }

    /// Stores `manifest` under `reference`, replacing any previous one.
    /// Every layer blob must already be in the store with the recorded size.
    pub fn put_image(&self, reference: &Reference, manifest: &Manifest) -> Result<(), ImageError> {
        let _lock = self.write_lock()?;
        self.check_layers(reference, manifest)?;
        self.write_manifest(reference, manifest)
    }

    /// Stores the manifest of an image whose layers arrive later, on
    /// demand: resolving it reports `MissingBlob` until they are all local,
    /// but the node knows the image (its layers, config and chunk tables)
    /// without asking the store it came from.
    pub fn put_on_demand_image(&self, reference: &Reference, manifest: &Manifest) -> Result<(), ImageError> {
        let _lock = self.write_lock()?;
        self.write_manifest(reference, manifest)
    }

    /// The manifest stored under `reference`, whether or not its layers
    /// are local.
    pub fn stored_manifest(&self, reference: &Reference) -> Result<Manifest, ImageError> {
        let path = self.manifest_path(reference);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(ImageError::ImageNotFound(reference.to_string())),
            Err(e) => return Err(io_err("reading manifest", &path)(e)),
        };
        Manifest::from_json(&bytes).map_err(|source| ImageError::Manifest { path, source })
    }

    /// Writes a manifest atomically and durably (the caller holds the
    /// write lock).
    fn write_manifest(&self, reference: &Reference, manifest: &Manifest) -> Result<(), ImageError> {
        let path = self.manifest_path(reference);
        let json = manifest.to_json().map_err(|source| ImageError::Manifest { path: path.clone(), source })?;
        let mut temp = self.temp_file()?;
        temp.write_all(&json).map_err(io_err("writing manifest", temp.path()))?;
        // Temp files are created 0600; manifests are not secret.
        fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o644)).map_err(io_err("setting permissions of", temp.path()))?;
        temp.as_file().sync_all().map_err(io_err("syncing manifest", temp.path()))?;
        temp.persist(&path).map_err(|e| io_err("publishing manifest", &path)(e.error))?;
        fsync_dir(&self.manifests).map_err(io_err("syncing", &self.manifests))?;
        self.forget(reference);
        Ok(())
    }

    /// Removes the manifest of `reference` (blobs stay until `gc`).
    pub fn remove(&self, reference: &str) -> Result<(), ImageError> {
        let reference: Reference = reference.parse()?;
        let path = self.manifest_path(&reference);
        let result = fs::remove_file(&path);
        self.forget(&reference);
        match result {
            Ok(()) => fsync_dir(&self.manifests).map_err(io_err("syncing", &self.manifests)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ImageError::ImageNotFound(reference.to_string())),
            Err(e) => Err(io_err("removing manifest", &path)(e)),
        }
    }

    /// Every layer blob with its size.
    pub fn blobs(&self) -> Result<Vec<(Digest, u64)>, ImageError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.blobs).map_err(io_err("listing", &self.blobs))? {
            let entry = entry.map_err(io_err("listing", &self.blobs))?;
            let Some(digest) = entry.file_name().to_str().and_then(|n| n.strip_suffix(".erofs")).and_then(|hex| Digest::from_hex(hex).ok())
            else {
                continue;
            };
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((digest, size));
        }
        Ok(out)
    }

    /// Deletes one layer blob (cache eviction: manifests naming it stay,
    /// and resolving them reports the blob missing until it is put back).
    /// Returns whether it was there.
    pub fn remove_blob(&self, digest: &Digest) -> Result<bool, ImageError> {
        let _lock = self.lock(FlockOperation::LockExclusive)?;
        let path = self.blob_path(digest);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err("removing blob", &path)(e)),
        }
    }

    /// Deletes blobs that no manifest names and that are not in `keep`
    /// (e.g. layers still mounted for running sandboxes), and temp files
    /// left by crashed processes. Waits for in-flight writers first.
    pub fn gc(&self, keep: &HashSet<Digest>) -> Result<GcStats, ImageError> {
        let _lock = self.lock(FlockOperation::LockExclusive)?;
        let mut referenced: HashSet<Digest> = keep.clone();
        for entry in self.list()? {
            referenced.extend(entry.manifest.layers.iter().map(|l| l.digest));
        }

        let mut stats = GcStats::default();
        let dir = fs::read_dir(&self.blobs).map_err(io_err("listing", &self.blobs))?;
        for entry in dir {
            let entry = entry.map_err(io_err("listing", &self.blobs))?;
            let name = entry.file_name();
            let name = name.to_str().unwrap_or_default();
            // A chunk table and an export record go with their blob.
            let (hex, is_blob) = if let Some(hex) = name.strip_suffix(".erofs") {
                (hex, true)
            } else if let Some(hex) = name.strip_suffix(".chunks").or_else(|| name.strip_suffix(".oci.json")) {
                (hex, false)
            } else {
                continue; // not ours: leave it alone
            };
            let Ok(digest) = Digest::from_hex(hex) else {
                continue;
            };
            if referenced.contains(&digest) {
                continue;
            }
            let path = entry.path();
            let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
            match fs::remove_file(&path) {
                Ok(()) if !is_blob => {}
                Ok(()) => {
                    stats.blobs_removed += 1;
                    stats.bytes_removed += size;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("removing blob", &path)(e)),
            }
        }
        fsync_dir(&self.blobs).map_err(io_err("syncing", &self.blobs))?;
        self.remove_stale_temps()?;
        Ok(stats)
    }

    fn remove_stale_temps(&self) -> Result<(), ImageError> {
        let now = SystemTime::now();
        let dir = fs::read_dir(&self.tmp).map_err(io_err("listing", &self.tmp))?;
        for entry in dir {
            let entry = entry.map_err(io_err("listing", &self.tmp))?;
            let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else {
                continue;
            };
            if now.duration_since(modified).unwrap_or_default() > STALE_TEMP_AGE {
                let path = entry.path();
                crate::fsutil::remove_tree(&path).map_err(io_err("removing stale temp", &path))?;
            }
        }
        Ok(())
    }

    // ---- temp space for builders --------------------------------------

    pub(crate) fn temp_file(&self) -> Result<NamedTempFile, ImageError> {
        tempfile::Builder::new().prefix("layer-").suffix(".tmp").tempfile_in(&self.tmp).map_err(io_err("creating temp file in", &self.tmp))
    }

    /// The directory builders put their scratch root filesystems in: inside
    /// the store so the result is on the same filesystem and gc can find
    /// leftovers.
    pub(crate) fn temp_dir(&self) -> &Path {
        &self.tmp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob's side files (chunk table, OCI export record) go with it.
    #[test]
    fn gc_removes_side_files_of_unreferenced_blobs() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::open(tmp.path()).unwrap();
        let d = Digest::of_bytes(b"gone");
        store.put_chunk_table(&d, b"table").unwrap();
        store.put_export_record(&d, b"{}").unwrap();
        assert!(store.export_record_path(&d).is_file());
        store.gc(&HashSet::new()).unwrap();
        assert!(!store.export_record_path(&d).exists());
        assert!(!store.chunk_table_path(&d).exists());
    }

    #[test]
    fn manifest_file_names_round_trip() {
        for r in ["busybox", "team/a.b/c_d:v1.2-x", "x:_t"] {
            let r: Reference = r.parse().unwrap();
            let tmp = tempfile::tempdir().unwrap();
            let store = ImageStore::open(tmp.path()).unwrap();
            let path = store.manifest_path(&r);
            assert_eq!(path.parent().unwrap(), store.manifests);
            let name = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(ImageStore::reference_of_file(name), Some(r));
        }
        assert_eq!(ImageStore::reference_of_file("garbage.json"), None);
        assert_eq!(ImageStore::reference_of_file("a@b.tmp"), None);
    }

    #[test]
    fn rejected_layers_leave_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::open(tmp.path()).unwrap();
        // Not an EROFS image.
        let err = store.put_layer_from_reader(&[7u8; 4096][..], None).unwrap_err();
        assert!(matches!(err, ImageError::CorruptBlob { .. }), "{err}");
        // Wrong expected digest is refused before the content is even looked at.
        let wrong = Digest::of_bytes(b"other");
        let err = store.put_layer_from_reader(&[7u8; 4096][..], Some(&wrong)).unwrap_err();
        assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err}");
        assert_eq!(fs::read_dir(&store.tmp).unwrap().count(), 0);
        assert_eq!(fs::read_dir(&store.blobs).unwrap().count(), 0);
    }

    #[test]
    fn unknown_and_invalid_references() {
        let tmp = tempfile::tempdir().unwrap();
        let store = ImageStore::open(tmp.path()).unwrap();
        assert!(matches!(store.resolve("nope"), Err(ImageError::ImageNotFound(r)) if r == "nope:latest"));
        assert!(matches!(store.resolve("Bad Name"), Err(ImageError::InvalidReference(_))));
        assert!(matches!(store.remove("nope:1"), Err(ImageError::ImageNotFound(_))));
        assert!(store.list().unwrap().is_empty());
    }

    #[test]
    fn disk_full_is_typed() {
        let path = Path::new("/x");
        let e = io_err("writing", path)(io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error()));
        assert!(matches!(e, ImageError::DiskFull { .. }));
        assert_eq!(e.to_string(), "disk full while writing /x");
    }
}
