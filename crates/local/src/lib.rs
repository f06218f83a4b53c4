//! LocalFs: the Backend over a zcfs PM volume. Reads hand the volume's borrowed PM
//! slices to the frontend; `write_with` lets the frontend fill reserved blocks in place.

use std::sync::Arc;
use zcfs_backend::{
    Attr, Backend, CopyStats, Ctx, DirEntry, DirState, Error, LandingSpan, LandingWrite, ReadReply,
    Result, SetAttr, StatFs, WritePayload,
};
use zcfs_volume::perm::{open_mask, MAY_READ};
use zcfs_volume::{
    FallocMode, FsError, RenameFlags, Seek, SizeRight, Volume, WriteReservation, XattrMode,
};

pub struct LocalFs {
    vol: Arc<Volume>,
}

impl LocalFs {
    pub fn new(vol: Arc<Volume>) -> LocalFs {
        LocalFs { vol }
    }
    pub fn volume(&self) -> &Arc<Volume> {
        &self.vol
    }
}

fn err(e: FsError) -> Error {
    e.into()
}

/// A landing write of LocalFs: the volume's landing reservation.
struct Landing {
    r: WriteReservation<'static>,
    spans: Vec<LandingSpan>,
}

impl LandingWrite for Landing {
    fn extents(&self) -> &[LandingSpan] {
        &self.spans
    }
    fn commit(self: Box<Self>) -> Result<u32> {
        self.r.commit().map(|n| n as u32).map_err(err)
    }
}

/// A handle of LocalFs: the access its open was granted, so calls through it are not
/// checked again (the volume keeps no per-handle state; the inode reference the open
/// took is counted by the volume). Never 0, which means "no handle".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Handle(u64);

impl Handle {
    const OPEN: u64 = 1;
    const READ: u64 = 2;
    const WRITE: u64 = 4;

    fn for_flags(flags: i32) -> Handle {
        let mut h = Handle::OPEN;
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => h |= Handle::READ,
            libc::O_WRONLY => h |= Handle::WRITE,
            _ => h |= Handle::READ | Handle::WRITE,
        }
        Handle(h)
    }
    /// Whether `fh` (0: no handle) allows `bit`; a call without a handle is the
    /// frontend's own (it checked what it needed).
    fn allows(fh: u64, bit: u64) -> Result<()> {
        if fh == 0 || fh & bit != 0 {
            Ok(())
        } else {
            Err(Error::new(
                libc::EBADF,
                "the handle was not opened for that access",
            ))
        }
    }
}

/// open(2) refuses O_TMPFILE without write access (`build_open_flags`): a file nobody
/// may write and nobody can name is useless.
fn check_tmpfile_flags(flags: i32) -> Result<()> {
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY | libc::O_RDWR => Ok(()),
        _ => Err(Error::new(
            libc::EINVAL,
            "O_TMPFILE needs O_WRONLY or O_RDWR",
        )),
    }
}

/// Attempts at ".." while the directory keeps moving between parents.
const PARENT_TRIES: usize = 16;

/// Directory entries read from the volume at a time (under its lock) by `readdir`,
/// then passed on without it: a caller that takes few at a time (a remote reply holds
/// about a hundred) does not make the volume list the rest of the directory each time.
pub const READDIR_BATCH: usize = 128;

impl LocalFs {
    /// ".." of `dir`, with a reference to it. The number `parent_of` gives may be
    /// reused by the time it is held (the parent removed after `dir` moved out, or
    /// `dir` removed), and a hold without a generation would reach the new inode. So
    /// the parent is held first and checked after: if it is still `dir`'s parent and
    /// `dir` is still linked, the inode held is that parent (a held inode keeps its
    /// number), otherwise the reference goes back and it is tried again. A removed
    /// directory has no "..": ENOENT.
    fn lookup_parent(&self, ctx: &Ctx, dir: u64) -> Result<Attr> {
        for _ in 0..PARENT_TRIES {
            let p = self.vol.parent_of(&ctx.cred, dir).map_err(err)?;
            let held = match self.hold(p, 0) {
                Ok(a) => a,
                // Gone meanwhile: `dir` has another parent now, or was removed.
                Err(_) => continue,
            };
            let linked = self.vol.getattr(dir).map_err(err)?.nlink > 0;
            if linked && self.vol.parent_of(&ctx.cred, dir).ok() == Some(p) {
                return Ok(held);
            }
            self.forget(p, 1);
            if !linked {
                break;
            }
        }
        match self.vol.getattr(dir).map_err(err)?.nlink {
            0 => Err(Error::new(
                libc::ENOENT,
                "the directory was removed: it has no \"..\"",
            )),
            _ => Err(Error::new(
                libc::EAGAIN,
                "the directory kept moving while its parent was looked up",
            )),
        }
    }

    /// Hand `batch` to `f`, with attributes (and a reference each) for `plus`: false
    /// once `f` takes no more. An entry removed since it was listed (its number
    /// possibly reused: the generation tells) is skipped.
    fn pass_on(
        &self,
        batch: Vec<zcfs_volume::DirEntry>,
        plus: bool,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> bool {
        for e in batch {
            let attr = if plus {
                // Each entry passed on with attributes holds a reference (the kernel
                // counts a lookup for it).
                match self.vol.hold(e.ino, e.gen) {
                    Ok(a) => Some(a),
                    Err(_) => continue,
                }
            } else {
                None
            };
            let de = DirEntry {
                name: e.name,
                ino: e.ino,
                kind: (e.dtype as u32) << 12,
                next: e.next,
                attr,
            };
            if !f(de) {
                return false;
            }
        }
        true
    }
}

impl Backend for LocalFs {
    fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        match name {
            b"." => {
                self.vol
                    .access(&ctx.cred, parent, zcfs_volume::perm::MAY_EXEC)
                    .map_err(err)?;
                self.hold(parent, 0)
            }
            b".." => self.lookup_parent(ctx, parent),
            _ => self.vol.lookup_held(&ctx.cred, parent, name).map_err(err),
        }
    }
    fn forget(&self, ino: u64, n: u64) {
        if let Err(e) = self.vol.forget(ino, n) {
            tracing::warn!(ino, "freeing an orphan on its last forget failed: {e}");
        }
    }
    fn hold(&self, ino: u64, generation: u64) -> Result<Attr> {
        // Generations are 32-bit on the volume; a larger one cannot match.
        let gen = u32::try_from(generation).map_err(|_| err(FsError::Stale))?;
        self.vol.hold(ino, gen).map_err(err)
    }
    fn getattr(&self, ino: u64) -> Result<Attr> {
        self.vol.getattr(ino).map_err(err)
    }
    fn dir_state(&self, ino: u64) -> Result<DirState> {
        self.vol.dir_state(ino).map_err(err)
    }
    fn setattr(&self, ctx: &Ctx, ino: u64, set: &SetAttr, fh: u64) -> Result<Attr> {
        let right = if fh != 0 && fh & Handle::WRITE != 0 {
            SizeRight::WritableHandle
        } else {
            SizeRight::Permission
        };
        self.vol.setattr(&ctx.cred, ino, set, right).map_err(err)
    }
    fn access(&self, ctx: &Ctx, ino: u64, mask: u32) -> Result<()> {
        self.vol.access(&ctx.cred, ino, mask & 7).map_err(err)
    }
    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.vol.readlink(ino).map_err(err)
    }
    fn mknod(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr> {
        self.vol
            .create_held(&ctx.cred, parent, name, mode, rdev)
            .map_err(err)
    }
    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.vol
            .mkdir_held(&ctx.cred, parent, name, mode)
            .map_err(err)
    }
    fn unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        self.vol.unlink(&ctx.cred, parent, name).map_err(err)
    }
    fn rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        self.vol.rmdir(&ctx.cred, parent, name).map_err(err)
    }
    fn symlink(&self, ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        self.vol
            .symlink_held(&ctx.cred, parent, name, target)
            .map_err(err)
    }
    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<Option<u64>> {
        let f = RenameFlags::from_bits(flags).map_err(err)?;
        self.vol
            .rename_replacing(&ctx.cred, parent, name, newparent, newname, f)
            .map_err(err)
    }
    fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.vol
            .link_held(&ctx.cred, ino, newparent, newname)
            .map_err(err)
    }
    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64> {
        let attr = self.vol.getattr(ino).map_err(err)?;
        if attr.is_dir() && flags & libc::O_ACCMODE != libc::O_RDONLY {
            return Err(Error::errno(libc::EISDIR));
        }
        self.vol
            .access(&ctx.cred, ino, open_mask(flags))
            .map_err(err)?;
        self.vol.open_handle(ino).map_err(err)?;
        Ok(Handle::for_flags(flags).0)
    }
    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, u64)> {
        // The entry holds one reference (the lookup), the handle another. The creator
        // may open what it created whatever the new mode says (as open(2) does).
        let a = self
            .vol
            .create_held(&ctx.cred, parent, name, mode, 0)
            .map_err(err)?;
        if let Err(e) = self.vol.open_handle(a.ino) {
            self.forget(a.ino, 1);
            return Err(err(e));
        }
        Ok((a, Handle::for_flags(flags).0))
    }
    fn tmpfile(&self, ctx: &Ctx, parent: u64, mode: u32, flags: i32) -> Result<(Attr, u64)> {
        check_tmpfile_flags(flags)?;
        // As `create`: the entry holds one reference, the handle another.
        let linkable = flags & libc::O_EXCL == 0;
        let a = self
            .vol
            .tmpfile_held(&ctx.cred, parent, mode, linkable)
            .map_err(err)?;
        if let Err(e) = self.vol.open_handle(a.ino) {
            self.forget(a.ino, 1);
            return Err(err(e));
        }
        Ok((a, Handle::for_flags(flags).0))
    }
    fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        reply: &mut dyn ReadReply,
    ) -> Result<()> {
        Handle::allows(fh, Handle::READ)?;
        self.vol
            .read_with(ino, offset, size as usize, |slices| reply.send(slices))
            .map_err(err)?
    }
    fn write(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        Handle::allows(fh, Handle::WRITE)?;
        self.vol
            .write(&ctx.cred, ino, offset, data)
            .map(|n| n as u32)
            .map_err(err)
    }
    fn write_with(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        payload: &mut dyn WritePayload,
    ) -> Result<u32> {
        Handle::allows(fh, Handle::WRITE)?;
        let mut r = self
            .vol
            .reserve_write(&ctx.cred, ino, offset, payload.remaining())
            .map_err(err)?;
        payload.fill(&mut r.slices_mut())?;
        r.commit().map(|n| n as u32).map_err(err)
    }
    fn image_file_id(&self) -> Option<(u64, u64)> {
        self.vol.image_file_id()
    }
    fn reserve_landing(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        len: usize,
    ) -> Result<Box<dyn LandingWrite>> {
        Handle::allows(fh, Handle::WRITE)?;
        let r = self
            .vol
            .reserve_write_landing_shared(&ctx.cred, ino, offset, len)
            .map_err(err)?;
        let spans = r
            .landing_extents()
            .iter()
            .map(|e| LandingSpan {
                offset: e.offset,
                blocks: e.blocks,
                file_offset: e.file_offset,
            })
            .collect();
        Ok(Box::new(Landing { r, spans }))
    }
    /// close(2): what was written is durable before close returns, whatever the
    /// group commit's batch (as NFS commits at close); a mount promises close-to-open.
    fn flush(&self, ino: u64, _fh: u64) -> Result<()> {
        self.vol.fsync(ino).map_err(err)
    }
    fn release(&self, ino: u64, _fh: u64) -> Result<()> {
        self.vol.release_handle(ino).map_err(err)
    }
    fn fsync(&self, ino: u64, _fh: u64, _datasync: bool) -> Result<()> {
        self.vol.fsync(ino).map_err(err)
    }
    fn opendir(&self, ctx: &Ctx, ino: u64) -> Result<u64> {
        if !self.vol.getattr(ino).map_err(err)?.is_dir() {
            return Err(Error::errno(libc::ENOTDIR));
        }
        self.vol.access(&ctx.cred, ino, MAY_READ).map_err(err)?;
        Ok(0)
    }
    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        // Collect a batch under the volume's lock, then call back without it (the
        // callback may look things up); the next batch from where that one ended, while
        // the callback takes more. It fails only before anything is passed on: a later
        // batch that cannot be read (the directory gone meanwhile) ends the listing, and
        // the caller keeps what it took (with `plus`, a reference each); going on from
        // there reports the error.
        let mut cookie = offset;
        let mut first = true;
        loop {
            let mut out = Vec::with_capacity(READDIR_BATCH);
            let r = self.vol.readdir(ino, cookie, |e| {
                out.push(e);
                out.len() < READDIR_BATCH
            });
            match r {
                Err(e) if first => return Err(err(e)),
                Err(_) => return Ok(()),
                Ok(()) => first = false,
            }
            let full = out.len() == READDIR_BATCH;
            match out.last() {
                Some(last) => cookie = last.next,
                None => return Ok(()),
            }
            if !self.pass_on(out, plus, f) || !full {
                return Ok(());
            }
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        Ok(self.vol.statfs())
    }
    fn setxattr(&self, ctx: &Ctx, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        let mode = match flags {
            0 => XattrMode::Any,
            zcfs_backend::XATTR_CREATE => XattrMode::Create,
            zcfs_backend::XATTR_REPLACE => XattrMode::Replace,
            _ => return Err(Error::errno(libc::EINVAL)),
        };
        self.vol
            .setxattr(&ctx.cred, ino, name, value, mode)
            .map_err(err)
    }
    fn getxattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.vol.getxattr(&ctx.cred, ino, name).map_err(err)
    }
    fn listxattr(&self, ctx: &Ctx, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.vol.listxattr(&ctx.cred, ino).map_err(err)
    }
    fn removexattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Result<()> {
        self.vol.removexattr(&ctx.cred, ino, name).map_err(err)
    }
    fn fallocate(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
    ) -> Result<()> {
        Handle::allows(fh, Handle::WRITE)?;
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        if mode == PUNCH | KEEP_SIZE {
            return self.vol.pfree(&ctx.cred, ino, offset, len).map_err(err);
        }
        let mode = FallocMode::from_bits(mode).map_err(err)?;
        self.vol
            .fallocate(&ctx.cred, ino, offset, len, mode)
            .map_err(err)
    }
    fn lseek(&self, ino: u64, fh: u64, offset: u64, whence: i32) -> Result<u64> {
        Handle::allows(fh, Handle::OPEN)?;
        let what = match whence {
            libc::SEEK_DATA => Seek::Data,
            libc::SEEK_HOLE => Seek::Hole,
            _ => return Err(Error::errno(libc::EINVAL)),
        };
        self.vol.seek(ino, offset, what).map_err(err)
    }
    fn copy_stats(&self) -> CopyStats {
        let s = self.vol.stats.snapshot();
        CopyStats {
            payload_bytes_read: s.data_bytes_read,
            payload_bytes_written: s.data_bytes_written,
            user_copy_bytes: s.user_copy_bytes,
        }
    }
    fn sync_all(&self) -> Result<()> {
        self.vol.sync().map_err(err)
    }
}
