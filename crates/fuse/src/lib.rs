//! The FUSE frontend: a thin adapter from fuser's request callbacks to a zcfs Backend,
//! so the FUSE crate can be swapped without touching the backends.
//!
//! Copies: fuser reads each request (and write payload) into its own buffer and copies
//! read replies into a Vec before writev, so this path costs one user-space copy per
//! payload byte each way; the counters report it.

use convert::*;
use fuser::{
    FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, SplicedData, TimeOrNow, WriteFlags,
};
pub use metrics::{FuseOp, FUSE_OPS};
pub use options::{CacheMode, FuseOptions, FuseStats};
use reply::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use zcfs_backend::{Attr, Backend, Ctx, PipedData, SetAttr};

pub mod caller;
mod coherence;
mod convert;
mod direct;
pub mod fusermount;
pub mod metrics;
mod mount;
mod options;
pub mod read_gate;
mod reply;

pub use fuser::{
    splice_pipe_available, BackgroundSession, Config, MountOption, SessionACL, SharedReadGate,
    SPLICE_MAX_WRITE, SPLICE_WRITE_MIN,
};
pub use mount::{spawn, Mounted};

pub struct FuseFs {
    backend: Arc<dyn Backend>,
    opts: FuseOptions,
    ttl: Duration,
    callers: caller::Callers,
    /// The kernel sends modes unmasked (FUSE_DONT_MASK was granted): the umask goes to
    /// the backend with the caller.
    dont_mask: bool,
    pub stats: Arc<FuseStats>,
    /// What the kernel was last told of each inode (close-to-open, `coherence`).
    shown: coherence::Shown,
    notifier: coherence::NotifierCell,
    /// The kernel granted its writeback cache: it reads pages through any handle,
    /// a write-only one too (to fill a page a write covers only in part).
    writeback: bool,
}

impl FuseFs {
    pub fn new(backend: Arc<dyn Backend>, opts: FuseOptions) -> FuseFs {
        let ttl = match opts.cache {
            CacheMode::None => Duration::ZERO,
            CacheMode::Metadata | CacheMode::Auto => opts.timeout,
            CacheMode::Always => Duration::from_secs(3600),
        };
        FuseFs {
            backend,
            // Until `init` knows whether the kernel enforces ACLs, the backend checks.
            callers: caller::Callers::new(false),
            opts,
            ttl,
            dont_mask: false,
            stats: Arc::new(FuseStats::default()),
            shown: coherence::Shown::default(),
            notifier: Default::default(),
            writeback: false,
        }
    }

    /// How long the kernel may keep what the backend just said of `ino`: the timeout,
    /// less the age of the backend's own cached copy it may have come from (else a
    /// client library's cache and the kernel's would add up to twice the timeout).
    fn ttl_of(&self, ino: u64) -> Duration {
        if self.ttl.is_zero() {
            return self.ttl;
        }
        self.ttl.saturating_sub(self.backend.cache_age(ino))
    }

    /// `a` as the kernel is given it, remembered as what it was told.
    fn shown_attr(&self, a: &Attr) -> FileAttr {
        self.shown.told(a);
        self.file_attr(a)
    }

    /// Close-to-open: after an open of `ino`, when what the backend found differs from
    /// what the kernel was told, invalidate the kernel's attributes (not its pages:
    /// see `coherence`) before the open is answered.
    fn revalidate(&self, ino: u64) {
        let Some(n) = self.notifier.get() else {
            return;
        };
        let Ok(a) = self.backend.getattr(ino) else {
            return;
        };
        if self.shown.is_current(&a) {
            return;
        }
        self.shown.forget(ino);
        // ENOENT: the kernel does not have the inode cached (nothing is stale).
        if let Err(e) = n.inval_inode(INodeNo(ino), -1, 0) {
            tracing::debug!(ino, "attribute invalidation on open: {e}");
        }
    }

    /// The notifier's place, filled by `mount::spawn` once the session exists.
    pub(crate) fn notifier_cell(&self) -> coherence::NotifierCell {
        self.notifier.clone()
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        let perm = (a.mode & 0o7777) & !self.opts.umask.unwrap_or(0);
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.blocks,
            atime: sys_time(a.atime),
            mtime: sys_time(a.mtime),
            ctime: sys_time(a.ctime),
            crtime: sys_time(a.ctime),
            kind: kind(a.mode),
            perm: perm as u16,
            nlink: a.nlink,
            uid: self.opts.uid.unwrap_or(a.uid),
            gid: self.opts.gid.unwrap_or(a.gid),
            rdev: a.rdev,
            blksize: match kind(a.mode) {
                FileType::RegularFile => a.blksize.max(preferred_io_size(self.opts.max_write)),
                _ => a.blksize,
            },
            flags: 0,
        }
    }

    fn open_flags(&self) -> FopenFlags {
        // Backends take concurrent writes to one file (the volume serializes only
        // the short reserve and commit steps).
        let mut f = FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        if self.opts.direct_io || matches!(self.opts.cache, CacheMode::None | CacheMode::Metadata) {
            f |= FopenFlags::FOPEN_DIRECT_IO;
        }
        if self.opts.cache == CacheMode::Always {
            f |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        f
    }

    /// The caller of `req`, with its supplementary groups.
    fn ctx(&self, req: &Request) -> Ctx {
        self.callers.ctx(req.uid(), req.gid(), req.pid())
    }

    /// The caller of a request that creates an inode with `umask`.
    fn creator(&self, req: &Request, umask: u32) -> Ctx {
        let mut c = self.ctx(req);
        if self.dont_mask {
            c.cred.umask = umask & 0o777;
        }
        c
    }

    /// Whether `name` is a security label this mount does not carry
    /// (`FuseOptions::seclabel`): not asked of the backend, not listed.
    fn hides(&self, name: &[u8]) -> bool {
        !self.opts.seclabel && is_security_label(name)
    }

    /// The refusal of an xattr request for a label the mount hides; None to go ahead.
    fn label_refused(&self, name: &[u8]) -> Option<zcfs_backend::Result<()>> {
        self.hides(name)
            .then(|| Err(zcfs_backend::Error::errno(libc::EOPNOTSUPP)))
    }

    /// Time this callback as `op` until the guard drops (after its reply).
    fn timed(&self, op: FuseOp) -> metrics::Timed<'_> {
        metrics::Timed::start(self.stats.ops.op(op as usize))
    }
}

/// Whether the kernel's permission checks can stand in for the backend's
/// (`kernel_checks`: the kernel enforces POSIX ACLs, FUSE_POSIX_ACL, which implies
/// default_permissions). Not default_permissions alone (`noacl`, or a kernel without
/// ACL support): the kernel then checks the mode bits only, whose group class is an
/// ACL's mask, and would let in users the ACL denies. Not when the mount shows
/// other owners or modes than the real ones (`uid=`, `gid=`, `umask=`): the kernel
/// would judge by what is shown, and `uid=1000` would make every file its caller's.
fn kernel_checks_suffice(opts: &FuseOptions, kernel_checks: bool) -> bool {
    kernel_checks && opts.uid.is_none() && opts.gid.is_none() && opts.umask.is_none()
}

impl FuseFs {
    /// The parent of a directory, for "..": a lookup whose reference is given back at
    /// once (the kernel counts none for "..").
    fn parent_of(&self, c: &Ctx, dir: u64) -> u64 {
        match self.backend.lookup(c, dir, b"..") {
            Ok(a) => {
                self.backend.forget(a.ino, 1);
                a.ino
            }
            Err(_) => dir,
        }
    }

    fn entry(&self, reply: ReplyEntry, r: zcfs_backend::Result<Attr>) {
        answer(reply, r, |reply, a| {
            reply.entry(
                &self.ttl_of(a.ino),
                &self.shown_attr(&a),
                Generation(a.generation),
            )
        })
    }

    /// A new inode made and opened (create, tmpfile): its entry and handle.
    fn created(&self, reply: ReplyCreate, r: zcfs_backend::Result<(Attr, u64)>) {
        answer(reply, r, |reply, (a, fh)| {
            reply.created(
                &self.ttl_of(a.ino),
                &self.shown_attr(&a),
                Generation(a.generation),
                FileHandle(fh),
                self.open_flags(),
            )
        })
    }

    fn attr(&self, reply: ReplyAttr, r: zcfs_backend::Result<Attr>) {
        answer(reply, r, |reply, a| {
            reply.attr(&self.ttl_of(a.ino), &self.shown_attr(&a))
        })
    }
}

/// A caller who asked for O_DIRECT or synchronous writes waits for each.
fn waits_for_each_write(flags: OpenFlags) -> bool {
    flags.0 & (libc::O_DIRECT | libc::O_SYNC | libc::O_DSYNC) != 0
}

/// Run a write-behind call that may answer the writer early (through the callback it
/// is given); if it did not, answer with its outcome.
fn answer_write_early(
    reply: ReplyWrite,
    write: impl FnOnce(&mut dyn FnMut(u32)) -> zcfs_backend::Result<u32>,
) {
    let mut reply = Some(reply);
    let r = write(&mut |n| {
        if let Some(reply) = reply.take() {
            reply.written(n)
        }
    });
    if let Some(reply) = reply {
        answer(reply, r, |reply, n| reply.written(n))
    }
}

/// fuser's spliced write data as the backend's [`PipedData`], counting the bytes the
/// backend took as it took them: spliced on, or copied into memory (a backend's
/// fallback, e.g. data tags).
struct Piped<'a, 'p> {
    data: &'a SplicedData<'p>,
    stats: &'a FuseStats,
}

impl PipedData for Piped<'_, '_> {
    fn remaining(&self) -> usize {
        self.data.remaining()
    }
    fn read_into(&mut self, dst: &mut [u8]) -> std::io::Result<()> {
        let r = self.data.read_into(dst);
        if r.is_ok() {
            self.stats
                .user_copy_bytes
                .fetch_add(dst.len() as u64, Ordering::Relaxed);
        }
        r
    }
    fn splice_into(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
        let before = self.data.remaining();
        let r = self.data.splice_into(fd);
        self.stats
            .spliced_write_bytes
            .fetch_add((before - self.data.remaining()) as u64, Ordering::Relaxed);
        r
    }
}

/// The xattrs in which an LSM keeps a file's security label: SELinux's, and Smack's
/// six (`security/smack/smack.h`).
pub const SECURITY_LABELS: &[&[u8]] = &[
    b"security.selinux",
    b"security.SMACK64",
    b"security.SMACK64IPIN",
    b"security.SMACK64IPOUT",
    b"security.SMACK64EXEC",
    b"security.SMACK64MMAP",
    b"security.SMACK64TRANSMUTE",
];

/// Whether `name` is one of [`SECURITY_LABELS`]. Not `security.capability` (the file's
/// capabilities, which the volume removes on a write, truncate or chown) nor the
/// integrity ones (`security.ima`, `security.evm`): those belong to the file wherever
/// it is mounted.
pub fn is_security_label(name: &[u8]) -> bool {
    SECURITY_LABELS.contains(&name)
}

/// The I/O size a regular file shows as `st_blksize`: the largest power of two that one
/// FUSE write may carry (1 MiB by default), as NFS shows its wsize. Tools size their
/// buffers by it: `cp` wrote 128 KiB per call with the volume's 4 KiB block size, and
/// each write through the mount is a round trip's worth of overhead.
pub fn preferred_io_size(max_write: u32) -> u32 {
    match max_write {
        0 => 0,
        n => 1 << (31 - n.leading_zeros()),
    }
}

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(self.opts.max_write);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        // ASYNC_DIO: without it the kernel serializes O_DIRECT I/O of one file, so
        // queue depth buys nothing (libfuse asks for it by default too).
        // Not FUSE_ATOMIC_O_TRUNC: with it the kernel marks the size of every file
        // opened with O_TRUNC stale, a newly created one too, and fetches it again at
        // the first write (a GETATTR round trip per `open(O_CREAT|O_TRUNC)` + write).
        // Without it, a new file costs LOOKUP and CREATE only, and an existing one OPEN
        // and the kernel's SETATTR of size 0 (as NFSv3 truncates on open).
        let mut want = InitFlags::FUSE_PARALLEL_DIROPS
            // The backend drops set-id bits on write, truncate and chown itself, as the
            // caller's identity says (the kernel would otherwise send a chmod as the
            // writer, which a backend checking permissions refuses).
            | InitFlags::FUSE_HANDLE_KILLPRIV
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_ASYNC_DIO
            // File handles (name_to_handle_at, NFS re-export) of inodes the kernel no
            // longer caches: it looks their node id up with "." (see `lookup`).
            | InitFlags::FUSE_EXPORT_SUPPORT
            // When a refreshed mtime or size differs, the kernel drops the file's
            // cached pages (another client wrote it): with `revalidate` on open, this
            // makes close-to-open hold for the page cache too.
            | InitFlags::FUSE_AUTO_INVAL_DATA;
        if self.opts.readdirplus {
            want |= InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO;
        }
        if self.opts.writeback {
            self.writeback = config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .is_ok();
        }
        for f in want.iter() {
            if config.add_capabilities(f).is_err() {
                tracing::info!(?f, "kernel lacks FUSE capability");
            }
        }
        // The backend applies the umask itself, because a directory's default ACL
        // replaces it (`posix_acl_create`): that needs the mode before the umask.
        self.dont_mask = config.add_capabilities(InitFlags::FUSE_DONT_MASK).is_ok();
        // POSIX ACLs: the kernel enforces and caches them (and so turns
        // default_permissions on); the backend keeps them, inherits default ACLs and
        // keeps mode and ACL in step, and checks them itself where it checks at all.
        if self.opts.acl {
            match config.add_capabilities(InitFlags::FUSE_POSIX_ACL) {
                Ok(()) => {
                    self.callers = caller::Callers::new(kernel_checks_suffice(&self.opts, true))
                }
                Err(_) => tracing::warn!(
                    "kernel lacks FUSE POSIX ACL support: only the backend enforces ACLs"
                ),
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.backend.sync_all() {
            tracing::error!("final sync failed: {e}");
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _t = self.timed(FuseOp::Lookup);
        // The kernel looks "." up in any node (a file too) to open a file handle of
        // an inode it no longer caches (export support): that node, referenced.
        let found = if name.as_bytes() == b"." {
            self.backend.hold(parent.0, 0)
        } else {
            self.backend
                .lookup(&self.ctx(req), parent.0, name.as_bytes())
        };
        match found {
            Ok(a) => reply.entry(
                &self.ttl_of(a.ino),
                &self.shown_attr(&a),
                Generation(a.generation),
            ),
            // A negative entry is cached as long as a positive one, or as long as the
            // backend's knowledge that the name is absent lasts.
            Err(e) if e.errno == libc::ENOENT && !self.ttl.is_zero() => {
                metrics::note_error();
                let ttl = self
                    .backend
                    .negative_ttl(parent.0)
                    .map_or(self.ttl, |t| t.min(self.ttl));
                if ttl.is_zero() {
                    reply.fail(errno(&e))
                } else {
                    reply.entry(&ttl, &negative_attr(), Generation(0))
                }
            }
            Err(e) => reply.fail(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _t = self.timed(FuseOp::Forget);
        self.shown.forget(ino.0);
        self.backend.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _t = self.timed(FuseOp::Getattr);
        self.attr(reply, self.backend.getattr(ino.0))
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _t = self.timed(FuseOp::Setattr);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        let fh = fh.map_or(0, |f| f.0);
        self.attr(reply, self.backend.setattr(&self.ctx(req), ino.0, &set, fh))
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let _t = self.timed(FuseOp::Readlink);
        answer(reply, self.backend.readlink(ino.0), |reply, t| {
            reply.data(&t)
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _t = self.timed(FuseOp::Mknod);
        let c = self.creator(req, umask);
        self.entry(
            reply,
            self.backend
                .mknod(&c, parent.0, name.as_bytes(), mode, rdev),
        )
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
        let _t = self.timed(FuseOp::Mkdir);
        let c = self.creator(req, umask);
        self.entry(
            reply,
            self.backend.mkdir(&c, parent.0, name.as_bytes(), mode),
        )
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.timed(FuseOp::Unlink);
        let r = self
            .backend
            .unlink(&self.ctx(req), parent.0, name.as_bytes());
        ok_or_error(reply, r)
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.timed(FuseOp::Rmdir);
        let r = self
            .backend
            .rmdir(&self.ctx(req), parent.0, name.as_bytes());
        ok_or_error(reply, r)
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _t = self.timed(FuseOp::Symlink);
        self.entry(
            reply,
            self.backend.symlink(
                &self.ctx(req),
                parent.0,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
            ),
        )
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Rename);
        ok_or_error(
            reply,
            self.backend
                .rename(
                    &self.ctx(req),
                    parent.0,
                    name.as_bytes(),
                    newparent.0,
                    newname.as_bytes(),
                    flags.bits(),
                )
                .map(|_| ()),
        )
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _t = self.timed(FuseOp::Link);
        self.entry(
            reply,
            self.backend
                .link(&self.ctx(req), ino.0, newparent.0, newname.as_bytes()),
        )
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.timed(FuseOp::Open);
        let c = self.ctx(req);
        // Under the writeback cache the kernel reads through write-only handles too:
        // open for reading and writing where the caller may read (as libfuse's
        // passthrough does), write-only where it may not.
        let opened = if self.writeback && flags.0 & libc::O_ACCMODE == libc::O_WRONLY {
            let rw = (flags.0 & !libc::O_ACCMODE) | libc::O_RDWR;
            match self.backend.open(&c, ino.0, rw) {
                Err(e) if e.errno == libc::EACCES || e.errno == libc::EPERM => {
                    self.backend.open(&c, ino.0, flags.0)
                }
                r => r,
            }
        } else {
            self.backend.open(&c, ino.0, flags.0)
        };
        match opened {
            Ok(fh) => {
                // O_TRUNC never comes here (no FUSE_ATOMIC_O_TRUNC, see `init`): the
                // kernel truncates with a SETATTR after the open.
                self.revalidate(ino.0);
                reply.opened(FileHandle(fh), self.open_flags())
            }
            Err(e) => reply.fail(errno(&e)),
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
        let _t = self.timed(FuseOp::Create);
        let c = self.creator(req, umask);
        // The creator may read what it creates: see `open` for the writeback cache.
        let flags = if self.writeback && flags & libc::O_ACCMODE == libc::O_WRONLY {
            (flags & !libc::O_ACCMODE) | libc::O_RDWR
        } else {
            flags
        };
        let r = self
            .backend
            .create(&c, parent.0, name.as_bytes(), mode, flags);
        self.created(reply, r)
    }

    /// open(2) with O_TMPFILE (FUSE_TMPFILE; fuser is patched for it, see
    /// vendor/fuser/PATCHES.md). Answered as a create: an entry (a reference) and a handle.
    /// ENOSYS would turn O_TMPFILE off for the mount's life, so a backend's ENOSYS is
    /// passed on as EOPNOTSUPP.
    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _t = self.timed(FuseOp::Tmpfile);
        let c = self.creator(req, umask);
        let r = self
            .backend
            .tmpfile(&c, parent.0, mode, flags)
            .map_err(|e| match e.errno {
                libc::ENOSYS => zcfs_backend::Error::errno(libc::EOPNOTSUPP),
                _ => e,
            });
        self.created(reply, r)
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if self.backend.reads_then() {
            // Answered when the backend's reply comes, on its thread: this one goes
            // back for the next request meanwhile.
            let (stats, start) = (self.stats.clone(), std::time::Instant::now());
            let done = move |r: zcfs_backend::Result<Vec<u8>>| {
                let ok = r.is_ok();
                match r {
                    Ok(data) => {
                        let n = data.len() as u64;
                        stats.read_bytes.fetch_add(n, Ordering::Relaxed);
                        stats.user_copy_bytes.fetch_add(n, Ordering::Relaxed);
                        reply.data(&data);
                    }
                    Err(e) => reply.error(errno(&e)),
                }
                metrics::record_since(stats.ops.op(FuseOp::Read as usize), start, ok);
            };
            return self
                .backend
                .read_then(ino.0, fh.0, offset, size, Box::new(done));
        }
        let _t = self.timed(FuseOp::Read);
        let mut reply = Some(reply);
        let stats = &self.stats;
        let r = self
            .backend
            .read(ino.0, fh.0, offset, size, &mut |slices: &[&[u8]]| {
                let n: usize = slices.iter().map(|s| s.len()).sum();
                stats.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
                // fuser copies the reply into its own buffer once; pieces are joined first.
                stats.user_copy_bytes.fetch_add(
                    n as u64 * if slices.len() > 1 { 2 } else { 1 },
                    Ordering::Relaxed,
                );
                let Some(r) = reply.take() else {
                    return Err(zcfs_backend::Error::new(
                        libc::EIO,
                        "the backend sent a read reply twice",
                    ));
                };
                match slices {
                    [] => r.data(&[]),
                    [one] => r.data(one),
                    many => r.data(&many.concat()),
                }
                Ok(())
            });
        if let Err(e) = r {
            if let Some(reply) = reply.take() {
                reply.fail(errno(&e));
            }
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.timed(FuseOp::Write);
        self.stats
            .write_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        self.stats
            .user_copy_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let waits = waits_for_each_write(flags);
        let ctx = self.ctx(req);
        if self.opts.write_behind && !waits {
            // Answered as soon as the write is sure to be sent: the writer's next write
            // overlaps with this one's trip to the server.
            answer_write_early(reply, |early| {
                self.backend
                    .write_behind_answering(&ctx, ino.0, fh.0, offset, data, early)
            })
        } else {
            let r = self.backend.write(&ctx, ino.0, fh.0, offset, data);
            answer(reply, r, |reply, n| reply.written(n))
        }
    }

    /// A buffered write through write-behind, with a backend that moves piped data
    /// without reading it (`Backend::moves_piped_writes`): the rest read it into memory.
    fn takes_spliced_write(
        &self,
        _ino: INodeNo,
        _fh: FileHandle,
        flags: OpenFlags,
        _size: usize,
    ) -> bool {
        self.opts.write_behind && !waits_for_each_write(flags) && self.backend.moves_piped_writes()
    }

    fn write_spliced(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &SplicedData<'_>,
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _t = self.timed(FuseOp::Write);
        self.stats
            .write_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        let ctx = self.ctx(req);
        let mut piped = Piped {
            data,
            stats: &self.stats,
        };
        answer_write_early(reply, |early| {
            self.backend
                .write_behind_piped(&ctx, ino.0, fh.0, offset, &mut piped, early)
        })
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Flush);
        ok_or_error(reply, self.backend.flush(ino.0, fh.0))
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Release);
        ok_or_error(reply, self.backend.release(ino.0, fh.0))
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Fsync);
        ok_or_error(reply, self.backend.fsync(ino.0, fh.0, datasync))
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _t = self.timed(FuseOp::Opendir);
        answer(
            reply,
            self.backend.opendir(&self.ctx(req), ino.0),
            |reply, fh| reply.opened(FileHandle(fh), FopenFlags::empty()),
        )
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Releasedir);
        ok_or_error(reply, self.backend.releasedir(ino.0, fh.0))
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Fsyncdir);
        ok_or_error(reply, self.backend.fsync(ino.0, fh.0, datasync))
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _t = self.timed(FuseOp::Readdir);
        // Offsets: 1 after ".", 2 after "..", backend cookie + 2 after an entry.
        if offset == 0 && reply.add(ino, 1, FileType::Directory, ".") {
            return reply.ok();
        }
        if offset <= 1 {
            let parent = self.parent_of(&self.ctx(req), ino.0);
            if reply.add(INodeNo(parent), 2, FileType::Directory, "..") {
                return reply.ok();
            }
        }
        let r = self
            .backend
            .readdir(ino.0, offset.saturating_sub(2), false, &mut |e| {
                !reply.add(
                    INodeNo(e.ino),
                    e.next + 2,
                    kind(e.kind),
                    OsStr::from_bytes(&e.name),
                )
            });
        answer(reply, r, |reply, ()| reply.ok())
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _t = self.timed(FuseOp::Readdirplus);
        let c = self.ctx(req);
        if offset == 0 {
            if let Ok(a) = self.backend.getattr(ino.0) {
                if reply.add(
                    ino,
                    1,
                    ".",
                    &self.ttl_of(a.ino),
                    &self.file_attr(&a),
                    Generation(a.generation),
                ) {
                    return reply.ok();
                }
                self.shown.told(&a);
            }
        }
        if offset <= 1 {
            // The kernel counts no lookup for "." and "..": give the reference back.
            if let Ok(a) = self.backend.lookup(&c, ino.0, b"..") {
                self.backend.forget(a.ino, 1);
                if reply.add(
                    INodeNo(a.ino),
                    2,
                    "..",
                    &self.ttl_of(a.ino),
                    &self.file_attr(&a),
                    Generation(a.generation),
                ) {
                    return reply.ok();
                }
                self.shown.told(&a);
            }
        }
        // Each entry added counts as a lookup in the kernel; the backend took one
        // reference per entry it passed, and one not added is given back.
        let r = self
            .backend
            .readdir(ino.0, offset.saturating_sub(2), true, &mut |e| {
                let a = match e.attr {
                    Some(a) => a,
                    // The entry holds its reference either way (the contract); without
                    // attributes, fetch them, and give the reference back if it is gone.
                    None => match self.backend.getattr(e.ino) {
                        Ok(a) => a,
                        Err(_) => {
                            self.backend.forget(e.ino, 1);
                            return true;
                        }
                    },
                };
                let full = reply.add(
                    INodeNo(e.ino),
                    e.next + 2,
                    OsStr::from_bytes(&e.name),
                    &self.ttl_of(a.ino),
                    &self.file_attr(&a),
                    Generation(a.generation),
                );
                if full {
                    self.backend.forget(e.ino, 1);
                } else {
                    self.shown.told(&a);
                }
                !full
            });
        answer(reply, r, |reply, ()| reply.ok())
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _t = self.timed(FuseOp::Statfs);
        answer(reply, self.backend.statfs(), |reply, s| {
            reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            )
        })
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Setxattr);
        if let Some(refused) = self.label_refused(name.as_bytes()) {
            return ok_or_error(reply, refused);
        }
        ok_or_error(
            reply,
            self.backend
                .setxattr(&self.ctx(req), ino.0, name.as_bytes(), value, flags),
        )
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _t = self.timed(FuseOp::Getxattr);
        let r = match self.label_refused(name.as_bytes()) {
            Some(refused) => refused.map(|()| Vec::new()),
            None => self
                .backend
                .getxattr(&self.ctx(req), ino.0, name.as_bytes()),
        };
        answer(reply, r, |reply, v| xattr_reply(reply, size, &v))
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _t = self.timed(FuseOp::Listxattr);
        let list = self
            .backend
            .listxattr(&self.ctx(req), ino.0)
            .map(|names| {
                let mut buf = Vec::new();
                for n in names {
                    if self.hides(&n) {
                        continue;
                    }
                    buf.extend_from_slice(&n);
                    buf.push(0);
                }
                buf
            })
            .map_err(|e| e.errno);
        listxattr_reply(reply, size, list)
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _t = self.timed(FuseOp::Removexattr);
        let r = match self.label_refused(name.as_bytes()) {
            Some(refused) => refused,
            None => self
                .backend
                .removexattr(&self.ctx(req), ino.0, name.as_bytes()),
        };
        ok_or_error(reply, r)
    }

    /// access(2) and chdir: without default_permissions the kernel asks us.
    fn access(&self, req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let _t = self.timed(FuseOp::Access);
        let r = self
            .backend
            .access(&self.ctx(req), ino.0, mask.bits() as u32 & 7);
        ok_or_error(reply, r)
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _t = self.timed(FuseOp::Fallocate);
        ok_or_error(
            reply,
            self.backend
                .fallocate(&self.ctx(req), ino.0, fh.0, offset, length, mode),
        )
    }

    /// SEEK_DATA / SEEK_HOLE (the kernel answers SEEK_SET/CUR/END itself).
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _t = self.timed(FuseOp::Lseek);
        let Ok(off) = u64::try_from(offset) else {
            return reply.fail(errno(&zcfs_backend::Error::errno(libc::ENXIO)));
        };
        answer(
            reply,
            self.backend.lseek(ino.0, fh.0, off, whence),
            |reply, o| reply.offset(o as i64),
        )
    }
}

#[cfg(test)]
mod io_size_tests {
    use super::preferred_io_size;

    #[test]
    fn the_preferred_io_size_is_the_largest_power_of_two_a_write_carries() {
        assert_eq!(preferred_io_size(1 << 20), 1 << 20);
        assert_eq!(preferred_io_size((1 << 20) - 1), 1 << 19);
        assert_eq!(preferred_io_size(200_000), 131_072);
        assert_eq!(preferred_io_size(4096), 4096);
        assert_eq!(preferred_io_size(1), 1);
        assert_eq!(preferred_io_size(0), 0);
        assert_eq!(preferred_io_size(u32::MAX), 1 << 31);
    }
}

#[cfg(test)]
mod security_label_tests {
    use super::is_security_label;

    #[test]
    fn labels_are_the_lsm_ones_and_not_capabilities_or_integrity() {
        for label in [
            &b"security.selinux"[..],
            b"security.SMACK64",
            b"security.SMACK64EXEC",
            b"security.SMACK64TRANSMUTE",
            b"security.SMACK64IPOUT",
        ] {
            assert!(is_security_label(label), "{label:?}");
        }
        for other in [
            &b"security.capability"[..],
            b"security.ima",
            b"security.evm",
            b"security.selinux2",
            b"user.selinux",
            b"system.posix_acl_access",
            b"trusted.selinux",
            b"security.SMACK64_not_a_label",
            b"security.SMACK64EXECUTE",
            b"security.SELINUX",
        ] {
            assert!(!is_security_label(other), "{other:?}");
        }
    }
}
