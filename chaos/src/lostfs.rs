//! Lost unsynced writes: a FUSE pass-through filesystem that keeps written file data in memory
//! until `fsync`/`fdatasync`, and drops what was never synced on a "power loss" — the idea of
//! LazyFS, which Jepsen uses. A process killed with SIGKILL loses nothing it wrote (the kernel's
//! page cache outlives it); a machine that loses power loses what the page cache had not yet
//! flushed. A store that acknowledges before it syncs (Redis `appendfsync everysec`, SQLite
//! `synchronous=OFF`, a high-water mark written but not synced) passes every kill -9 and fails
//! here.
//!
//! [`LostFs::mount`] mounts the filesystem at a mount point over a backing directory. File data
//! written through the mount stays pending per file until that file is synced; reads see the
//! pending data (as a page cache would). Metadata — creating, renaming, removing files and
//! directories, truncation, permissions — goes to the backing directory at once and is not lost
//! (as in LazyFS). [`LostFs::power_loss`] drops every pending write; the processes using the
//! mount must be killed first, and restarted afterwards on what survived.
//!
//! The kernel is told not to cache file data (`FOPEN_DIRECT_IO`) nor attributes (TTL 0), so that
//! after a power loss nothing served from the mount comes from a cache that should have died.
//! Mounting needs `/dev/fuse` and root (it mounts directly, without `fusermount3`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::{ProcessError, io};

/// Nothing is cached by the kernel.
const TTL: Duration = Duration::ZERO;

/// What the filesystem did: what is pending now, what was synced, what power losses dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LostFsEffects {
    /// Bytes written and not yet synced (what a power loss now would drop).
    pub unsynced_bytes: u64,
    /// Bytes made durable by `fsync`/`fdatasync`.
    pub synced_bytes: u64,
    /// Power losses so far.
    pub power_losses: u64,
    /// Bytes the power losses dropped.
    pub lost_bytes: u64,
    /// Files that lost data to a power loss.
    pub files_lost_data: u64,
}

/// Writes to one file not yet synced, in order, and the file's length as they make it.
#[derive(Debug)]
struct Pending {
    writes: Vec<(u64, Vec<u8>)>,
    len: u64,
}

impl Pending {
    fn bytes(&self) -> u64 {
        self.writes.iter().map(|(_, d)| d.len() as u64).sum()
    }
}

#[derive(Debug)]
struct State {
    backing: PathBuf,
    /// Inode to path relative to the backing directory (the root is "").
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next_ino: u64,
    pending: HashMap<u64, Pending>,
    effects: LostFsEffects,
}

impl State {
    fn full(&self, ino: u64) -> Result<PathBuf, Errno> {
        self.paths
            .get(&ino)
            .map(|rel| self.backing.join(rel))
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: u64, name: &OsStr) -> Result<PathBuf, Errno> {
        self.paths
            .get(&parent)
            .map(|rel| rel.join(name))
            .ok_or(Errno::ENOENT)
    }

    fn intern(&mut self, rel: PathBuf) -> u64 {
        if let Some(ino) = self.inos.get(&rel) {
            return *ino;
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        self.paths.insert(ino, rel.clone());
        self.inos.insert(rel, ino);
        ino
    }

    fn forget_path(&mut self, rel: &Path) {
        if let Some(ino) = self.inos.remove(rel) {
            self.paths.remove(&ino);
            if let Some(p) = self.pending.remove(&ino) {
                self.effects.unsynced_bytes -= p.bytes();
            }
        }
    }

    fn attr(&self, ino: u64, meta: &fs::Metadata) -> FileAttr {
        let size = self.pending.get(&ino).map_or(meta.len(), |p| p.len);
        let time = |s: i64, ns: i64| {
            UNIX_EPOCH
                + Duration::from_secs(u64::try_from(s).unwrap_or(0))
                + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
        };
        let kind = FileType::from_std(meta.file_type()).unwrap_or(FileType::RegularFile);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: time(meta.ctime(), meta.ctime_nsec()),
            kind,
            perm: u16::try_from(meta.mode() & 0o7777).unwrap_or(0o644),
            nlink: u32::try_from(meta.nlink()).unwrap_or(1),
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: u32::try_from(meta.rdev()).unwrap_or(0),
            blksize: 4096,
            flags: 0,
        }
    }

    fn stat(&self, ino: u64) -> Result<FileAttr, Errno> {
        let meta = fs::symlink_metadata(self.full(ino)?).map_err(Errno::from)?;
        Ok(self.attr(ino, &meta))
    }

    /// Makes `ino`'s pending data durable: writes it to the backing file. The backing directory
    /// is the simulated disk: what reached it survives every simulated power loss (the host
    /// keeps its power), so no real flush of the host's disk is asked for; one would serialise
    /// every operation of the mount behind the host's fsync latency (PostgreSQL's crash
    /// recovery syncs every file of its data directory) and prove nothing more.
    fn sync(&mut self, ino: u64) -> Result<(), Errno> {
        let Some(p) = self.pending.get(&ino) else {
            return Ok(());
        };
        let full = self.full(ino)?;
        let file = OpenOptions::new()
            .write(true)
            .open(&full)
            .map_err(Errno::from)?;
        for (offset, data) in &p.writes {
            file.write_all_at(data, *offset).map_err(Errno::from)?;
        }
        if let Some(p) = self.pending.remove(&ino) {
            let bytes = p.bytes();
            self.effects.unsynced_bytes -= bytes;
            self.effects.synced_bytes += bytes;
        }
        Ok(())
    }
}

/// The filesystem the FUSE session serves.
#[derive(Debug)]
struct Fs {
    state: Arc<Mutex<State>>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Gives a new file or directory to the user who asked for it (the daemon runs as root).
fn own(path: &Path, req: &Request) {
    let _ = nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(req.uid())),
        Some(nix::unistd::Gid::from_raw(req.gid())),
    );
}

impl Filesystem for Fs {
    /// Shared writable mmap of a file opened for direct I/O, where the kernel allows it (Linux
    /// 6.6 and later): SQLite's WAL index (`-shm`) needs it. The mapped pages are written back
    /// through `write` like any other data (kept until synced); SQLite's first connection after
    /// a restart truncates the index and rebuilds it from the WAL, so no stale page is trusted.
    fn init(&mut self, _req: &Request, config: &mut fuser::KernelConfig) -> std::io::Result<()> {
        // An older kernel: mmap stays refused (ENODEV), as before.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut s = lock(&self.state);
        let result = s.child(parent.0, name).and_then(|rel| {
            let meta = fs::symlink_metadata(s.backing.join(&rel)).map_err(Errno::from)?;
            let ino = s.intern(rel);
            Ok(s.attr(ino, &meta))
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match lock(&self.state).stat(ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut s = lock(&self.state);
        let result = (|| {
            let full = s.full(ino.0)?;
            if let Some(mode) = mode {
                fs::set_permissions(&full, fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(Errno::from)?;
            }
            if uid.is_some() || gid.is_some() {
                nix::unistd::chown(
                    &full,
                    uid.map(nix::unistd::Uid::from_raw),
                    gid.map(nix::unistd::Gid::from_raw),
                )
                .map_err(|e| Errno::from_i32(e as i32))?;
            }
            if let Some(size) = size {
                // Truncation is metadata: it reaches the backing file at once. Pending writes
                // past the new end are cut.
                let file = OpenOptions::new()
                    .write(true)
                    .open(&full)
                    .map_err(Errno::from)?;
                file.set_len(size).map_err(Errno::from)?;
                if let Some(p) = s.pending.get_mut(&ino.0) {
                    let before = p.bytes();
                    p.writes.retain_mut(|(offset, data)| {
                        if *offset >= size {
                            return false;
                        }
                        let keep = usize::try_from(size - *offset).unwrap_or(usize::MAX);
                        data.truncate(keep);
                        true
                    });
                    p.len = size;
                    let cut = before - p.bytes();
                    s.effects.unsynced_bytes -= cut;
                }
            }
            s.stat(ino.0)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut s = lock(&self.state);
        let result = s.child(parent.0, name).and_then(|rel| {
            let full = s.backing.join(&rel);
            fs::create_dir(&full).map_err(Errno::from)?;
            let _ = fs::set_permissions(&full, fs::Permissions::from_mode(mode & !umask & 0o7777));
            own(&full, req);
            let ino = s.intern(rel);
            s.stat(ino)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = lock(&self.state);
        let result = s.child(parent.0, name).and_then(|rel| {
            fs::remove_file(s.backing.join(&rel)).map_err(Errno::from)?;
            s.forget_path(&rel);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut s = lock(&self.state);
        let result = s.child(parent.0, name).and_then(|rel| {
            fs::remove_dir(s.backing.join(&rel)).map_err(Errno::from)?;
            s.forget_path(&rel);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = lock(&self.state);
        let result = (|| {
            let from = s.child(parent.0, name)?;
            let to = s.child(newparent.0, newname)?;
            fs::rename(s.backing.join(&from), s.backing.join(&to)).map_err(Errno::from)?;
            // The entry replaced is gone; the one moved (and all below it) has a new path.
            s.forget_path(&to);
            let moved: Vec<(u64, PathBuf)> = s
                .paths
                .iter()
                .filter_map(|(ino, rel)| {
                    let rest = rel.strip_prefix(&from).ok()?;
                    // `join("")` would add a trailing slash, which a file's path must not have.
                    let moved = if rest.as_os_str().is_empty() {
                        to.clone()
                    } else {
                        to.join(rest)
                    };
                    Some((*ino, moved))
                })
                .collect();
            for (ino, new_rel) in moved {
                if let Some(old) = s.paths.insert(ino, new_rel.clone()) {
                    s.inos.remove(&old);
                }
                s.inos.insert(new_rel, ino);
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match lock(&self.state).full(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut s = lock(&self.state);
        let result = s.child(parent.0, name).and_then(|rel| {
            let full = s.backing.join(&rel);
            let mut options = OpenOptions::new();
            options.write(true).mode(mode & !umask & 0o7777);
            if flags & libc_o_excl() != 0 {
                options.create_new(true);
            } else {
                options.create(true);
            }
            let file = options.open(&full).map_err(Errno::from)?;
            // Creating a file is metadata; an O_TRUNC of an existing one is a truncation.
            if flags & libc_o_trunc() != 0 {
                file.set_len(0).map_err(Errno::from)?;
            }
            own(&full, req);
            let ino = s.intern(rel);
            if flags & libc_o_trunc() != 0
                && let Some(p) = s.pending.remove(&ino)
            {
                s.effects.unsynced_bytes -= p.bytes();
            }
            s.stat(ino)
        });
        match result {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(e),
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
        let s = lock(&self.state);
        let result = (|| {
            let full = s.full(ino.0)?;
            let file = File::open(&full).map_err(Errno::from)?;
            let backing_len = file.metadata().map_err(Errno::from)?.len();
            let len = s.pending.get(&ino.0).map_or(backing_len, |p| p.len);
            let end = len.min(offset.saturating_add(u64::from(size)));
            if end <= offset {
                return Ok(Vec::new());
            }
            let mut buf = vec![0_u8; usize::try_from(end - offset).unwrap_or(0)];
            // What the backing file has (zeros past its end), then the pending writes on top.
            let mut filled = 0;
            while filled < buf.len() {
                let n = file
                    .read_at(&mut buf[filled..], offset + filled as u64)
                    .map_err(Errno::from)?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if let Some(p) = s.pending.get(&ino.0) {
                for (w_off, data) in &p.writes {
                    let w_end = w_off + data.len() as u64;
                    let (from, to) = ((*w_off).max(offset), w_end.min(end));
                    if from < to {
                        let src = usize::try_from(from - w_off).unwrap_or(0);
                        let dst = usize::try_from(from - offset).unwrap_or(0);
                        let n = usize::try_from(to - from).unwrap_or(0);
                        buf[dst..dst + n].copy_from_slice(&data[src..src + n]);
                    }
                }
            }
            Ok(buf)
        })();
        match result {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = lock(&self.state);
        let result = (|| {
            if !s.pending.contains_key(&ino.0) {
                let len = fs::metadata(s.full(ino.0)?).map_err(Errno::from)?.len();
                s.pending.insert(
                    ino.0,
                    Pending {
                        writes: Vec::new(),
                        len,
                    },
                );
            }
            let p = s.pending.get_mut(&ino.0).expect("inserted above");
            p.writes.push((offset, data.to_vec()));
            p.len = p.len.max(offset + data.len() as u64);
            s.effects.unsynced_bytes += data.len() as u64;
            Ok::<_, Errno>(())
        })();
        match result {
            Ok(()) => reply.written(u32::try_from(data.len()).unwrap_or(u32::MAX)),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Closing a file syncs nothing.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match lock(&self.state).sync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Metadata goes to the backing directory at once (see the module documentation): a
        // directory has nothing pending to make durable.
        match lock(&self.state).full(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut s = lock(&self.state);
        let listed = (|| {
            let full = s.full(ino.0)?;
            let rel = s.paths[&ino.0].clone();
            let mut entries: Vec<(String, FileType)> = fs::read_dir(&full)
                .map_err(Errno::from)?
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let kind = FileType::from_std(e.file_type().ok()?)?;
                    Some((e.file_name().to_string_lossy().into_owned(), kind))
                })
                .collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            let mut out = vec![
                (ino.0, FileType::Directory, ".".to_owned()),
                (ino.0, FileType::Directory, "..".to_owned()),
            ];
            for (name, kind) in entries {
                let child = s.intern(rel.join(&name));
                out.push((child, kind, name));
            }
            Ok::<_, Errno>(out)
        })();
        match listed {
            Ok(all) => {
                for (i, (child, kind, name)) in all
                    .into_iter()
                    .enumerate()
                    .skip(usize::try_from(offset).unwrap_or(usize::MAX))
                {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }
}

const fn libc_o_excl() -> i32 {
    0o200
}

const fn libc_o_trunc() -> i32 {
    0o1000
}

/// A mounted lost-unsynced-writes filesystem (see the module documentation). Dropping it
/// unmounts it.
#[derive(Debug)]
pub struct LostFs {
    mountpoint: PathBuf,
    state: Arc<Mutex<State>>,
    session: Option<BackgroundSession>,
}

impl LostFs {
    /// Mounts the filesystem at `mountpoint` (an empty directory) over `backing`.
    ///
    /// # Errors
    /// The mount failed (no `/dev/fuse`, not root, a bad mount point).
    pub fn mount(backing: &Path, mountpoint: &Path) -> Result<Self, ProcessError> {
        let mut paths = HashMap::new();
        let mut inos = HashMap::new();
        paths.insert(INodeNo::ROOT.0, PathBuf::new());
        inos.insert(PathBuf::new(), INodeNo::ROOT.0);
        let state = Arc::new(Mutex::new(State {
            backing: backing.to_owned(),
            paths,
            inos,
            next_ino: INodeNo::ROOT.0 + 1,
            pending: HashMap::new(),
            effects: LostFsEffects::default(),
        }));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("bench-lostfs".into()),
            MountOption::DefaultPermissions,
        ];
        // Processes of other users (PostgreSQL runs as `postgres`) use the mount too.
        config.acl = fuser::SessionACL::All;
        let fs = Fs {
            state: Arc::clone(&state),
        };
        let session = fuser::spawn_mount(fs, mountpoint, &config).map_err(io(format!(
            "mount the lost-writes filesystem at {}",
            mountpoint.display()
        )))?;
        Ok(Self {
            mountpoint: mountpoint.to_owned(),
            state,
            session: Some(session),
        })
    }

    /// The mount point.
    #[must_use]
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Drops every write not yet synced, as a power loss would; what was dropped. Kill the
    /// processes using the mount first.
    pub fn power_loss(&self) -> LostFsEffects {
        let mut s = lock(&self.state);
        let lost: u64 = s.pending.values().map(Pending::bytes).sum();
        let files = s.pending.values().filter(|p| p.bytes() > 0).count() as u64;
        s.pending.clear();
        s.effects.unsynced_bytes = 0;
        s.effects.power_losses += 1;
        s.effects.lost_bytes += lost;
        s.effects.files_lost_data += files;
        s.effects
    }

    /// What the filesystem did so far.
    #[must_use]
    pub fn effects(&self) -> LostFsEffects {
        lock(&self.state).effects
    }
}

impl Drop for LostFs {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = session.umount_and_join();
        }
    }
}

#[cfg(test)]
mod tests;
