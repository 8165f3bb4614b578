//! The FUSE filesystem that serves on-demand layer blobs as plain files.
//!
//! One flat read-only directory: `<hex>.erofs` for every blob registered
//! with [`LazyLayers::add`]. The EROFS layer is then an ordinary
//! file-backed mount (no loop device) of that file; the kernel's reads of
//! it arrive here and fetch what is missing ([`LazyBlob::read_at`]). A
//! failed fetch is EIO to the reader (the sandbox sees an I/O error, the
//! node's log says which layer, chunk and store), never a hang: the store
//! requests are bounded in time.
//!
//! The FUSE server runs on a few threads of the calling process (fuser's
//! background session), mounted directly with mount(2) (root; no
//! fusermount helper). [`LazyLayers::unmount`] detaches it and ends the
//! threads; blobs still incomplete then delete their cache files.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner, MountOption, OpenFlags,
    ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request, SessionACL,
};

use super::blob::{BlobStats, LazyBlob};

/// Blob files never change while registered; the kernel may cache their
/// attributes and names for this long.
const TTL: Duration = Duration::from_secs(60);
/// FUSE request threads: a read blocked on the store holds one; the rest
/// keep serving chunks that are already local.
const THREADS: usize = 4;
/// How long `unmount` waits for the server threads to end.
const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Files {
    by_name: HashMap<String, INodeNo>,
    by_ino: HashMap<INodeNo, Arc<LazyBlob>>,
    next_ino: u64,
}

struct BlobFs {
    files: Arc<RwLock<Files>>,
    started: SystemTime,
}

impl BlobFs {
    fn blob(&self, ino: INodeNo) -> Option<Arc<LazyBlob>> {
        self.files.read().unwrap_or_else(|p| p.into_inner()).by_ino.get(&ino).cloned()
    }

    fn attr(&self, ino: INodeNo, size: u64, kind: FileType) -> FileAttr {
        let dir = kind == FileType::Directory;
        FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
            crtime: self.started,
            kind,
            perm: if dir { 0o555 } else { 0o444 },
            nlink: if dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

impl Filesystem for BlobFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = (parent == INodeNo::ROOT)
            .then(|| {
                let files = self.files.read().unwrap_or_else(|p| p.into_inner());
                let ino = *files.by_name.get(name.to_str()?)?;
                Some((ino, files.by_ino.get(&ino)?.size()))
            })
            .flatten();
        match found {
            Some((ino, size)) => reply.entry(&TTL, &self.attr(ino, size, FileType::RegularFile), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.attr(ino, 0, FileType::Directory));
        }
        match self.blob(ino) {
            Some(b) => reply.attr(&TTL, &self.attr(ino, b.size(), FileType::RegularFile)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::EROFS); // writes never go to the store
        }
        match self.blob(ino) {
            // The content never changes: keep the page cache across opens.
            Some(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(blob) = self.blob(ino) else {
            return reply.error(Errno::ENOENT);
        };
        match blob.read_at(offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => {
                tracing::error!(error = %e, "on-demand layer read failed; the reader gets EIO");
                reply.error(Errno::EIO)
            }
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        let mut entries: Vec<(INodeNo, FileType, &str)> =
            vec![(INodeNo::ROOT, FileType::Directory, "."), (INodeNo::ROOT, FileType::Directory, "..")];
        let mut names: Vec<_> = files.by_name.iter().collect();
        names.sort();
        entries.extend(names.into_iter().map(|(n, ino)| (*ino, FileType::RegularFile, n.as_str())));
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(ino, (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

/// The node's on-demand layers: a FUSE mount serving one file per blob.
pub struct LazyLayers {
    mountpoint: PathBuf,
    files: Arc<RwLock<Files>>,
    session: Mutex<Option<fuser::BackgroundSession>>,
}

impl LazyLayers {
    /// Mounts the (empty) blob filesystem at `mountpoint` (created).
    pub fn mount(mountpoint: &Path) -> io::Result<LazyLayers> {
        // A crashed edge's mount is a dead connection (ENOTCONN on every
        // access): detach it before anything looks at the path.
        let _ = rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH);
        std::fs::create_dir_all(mountpoint)?;
        let files = Arc::new(RwLock::new(Files { next_ino: 2, ..Files::default() }));
        let fs = BlobFs { files: Arc::clone(&files), started: SystemTime::now() };
        let mut config = Config::default();
        config.mount_options = vec![
            MountOption::RO,
            MountOption::NoDev,
            MountOption::NoSuid,
            MountOption::NoExec,
            MountOption::FSName("dsec-layers".into()),
            MountOption::Subtype("dsec-layers".into()),
        ];
        // The kernel opens the blob as the mounter (root) at EROFS mount
        // time; nobody else needs to reach this directory.
        config.acl = SessionACL::Owner;
        config.n_threads = Some(THREADS);
        let session = fuser::spawn_mount(fs, mountpoint, &config)?;
        Ok(LazyLayers { mountpoint: mountpoint.to_path_buf(), files, session: Mutex::new(Some(session)) })
    }

    /// Detaches an on-demand filesystem an earlier process left mounted at
    /// `mountpoint` (its server died with that process, so every access
    /// fails) and says whether there was one. `mount` does this too; call
    /// this first to learn that an earlier process's files are gone.
    pub fn detach_left_over(mountpoint: &Path) -> io::Result<bool> {
        let left = crate::mountinfo::read()?.iter().any(|m| m.mount_point == mountpoint && m.fs_type.starts_with("fuse"));
        if left {
            rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH)?;
        }
        Ok(left)
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    fn name_of(digest: &crate::Digest) -> String {
        format!("{}.erofs", digest.hex())
    }

    /// Serves `blob` (once per digest: a second add returns the first's
    /// file) and returns the path of its file.
    pub fn add(&self, blob: LazyBlob) -> PathBuf {
        let name = Self::name_of(blob.digest());
        let mut files = self.files.write().unwrap_or_else(|p| p.into_inner());
        if !files.by_name.contains_key(&name) {
            let ino = INodeNo(files.next_ino);
            files.next_ino += 1;
            files.by_name.insert(name.clone(), ino);
            files.by_ino.insert(ino, Arc::new(blob));
        }
        self.mountpoint.join(name)
    }

    /// The blob of `digest`, if it is served here.
    pub fn get(&self, digest: &crate::Digest) -> Option<Arc<LazyBlob>> {
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        let ino = files.by_name.get(&Self::name_of(digest))?;
        files.by_ino.get(ino).cloned()
    }

    /// Stats of every blob served, by digest.
    pub fn stats(&self) -> Vec<(crate::Digest, BlobStats)> {
        let files = self.files.read().unwrap_or_else(|p| p.into_inner());
        files.by_ino.values().map(|b| (*b.digest(), b.stats())).collect()
    }

    /// Stops serving `digest` (its EROFS mount must be gone: a mount still
    /// holding the file would get ENOENT-free EIO). Its cache file goes
    /// with it unless complete.
    pub fn remove(&self, digest: &crate::Digest) -> bool {
        let mut files = self.files.write().unwrap_or_else(|p| p.into_inner());
        match files.by_name.remove(&Self::name_of(digest)) {
            Some(ino) => files.by_ino.remove(&ino).is_some(),
            None => false,
        }
    }

    /// Unmounts the filesystem and ends its threads; every blob is dropped
    /// (incomplete cache files deleted). Idempotent.
    pub fn unmount(&self) -> io::Result<()> {
        let session = self.session.lock().unwrap_or_else(|p| p.into_inner()).take();
        let result = match session {
            Some(s) => Self::umount_and_join(s),
            None => Ok(()),
        };
        let mut files = self.files.write().unwrap_or_else(|p| p.into_inner());
        files.by_name.clear();
        files.by_ino.clear();
        let _ = std::fs::remove_dir(&self.mountpoint);
        result
    }
}

impl LazyLayers {
    /// Detaches the mount and waits for the server threads to end. They end
    /// when the kernel drops the connection, i.e. once no EROFS mount holds
    /// a blob file any more (unmount the layers first). If one still does
    /// (a sandbox outliving its edge), give up waiting after a while rather
    /// than hang the shutdown: the threads end with the process.
    fn umount_and_join(session: fuser::BackgroundSession) -> io::Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("dsec-layers-umount".into()).spawn(move || {
            let _ = tx.send(session.umount_and_join());
        })?;
        match rx.recv_timeout(UNMOUNT_WAIT) {
            Ok(result) => result,
            Err(_) => Err(io::Error::other("the on-demand layer filesystem is detached but still in use by a layer mount")),
        }
    }
}

impl Drop for LazyLayers {
    fn drop(&mut self) {
        if let Err(e) = self.unmount() {
            tracing::warn!(error = %e, mountpoint = %self.mountpoint.display(), "unmounting the on-demand layer filesystem");
        }
    }
}
