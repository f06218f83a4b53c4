//! The Backend trait: the FUSE request set (as DPFS decouples the file system API from
//! its backends), served by every frontend (FUSE mount, network server, library) and
//! implemented by every backend (the local PM volume, a remote peer, the null backend).
//!
//! Inode numbers are u64 (the root is 1) and may carry a node id in their top bits
//! later; errors are errno values with a message.

pub mod null;

use std::fmt;

pub use zcfs_types::{errno_name, Attr, Error, Result, SetAttr, SetTime, StatFs, Time, ROOT};

/// Who is asking (the caller of the system call behind the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ctx {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    /// File type bits (S_IFMT) of the entry.
    pub kind: u32,
    /// Cookie to continue after this entry (never 0).
    pub next: u64,
    /// Attributes, for readdirplus.
    pub attr: Option<Attr>,
}

/// Copy accounting: bytes moved on the data paths, and how many were copied in user
/// space on the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct CopyStats {
    pub payload_bytes_read: u64,
    pub payload_bytes_written: u64,
    pub user_copy_bytes: u64,
}

impl fmt::Display for CopyStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let payload = self.payload_bytes_read + self.payload_bytes_written;
        write!(
            f,
            "{} bytes read, {} written, {:.3} user-space copies per payload byte",
            self.payload_bytes_read,
            self.payload_bytes_written,
            if payload == 0 {
                0.0
            } else {
                self.user_copy_bytes as f64 / payload as f64
            }
        )
    }
}

pub const XATTR_CREATE: i32 = 1;
pub const XATTR_REPLACE: i32 = 2;

/// Receives read data as borrowed slices (the zero-copy read path).
pub type ReadSink<'a> = dyn FnMut(&[&[u8]]) -> Result<()> + 'a;
/// Fills destination slices of a write (the zero-copy write path: e.g. from a socket).
pub type WriteFill<'a> = dyn FnMut(&mut [&mut [u8]]) -> Result<()> + 'a;

/// The request set. Methods take `&self`: backends are shared by many worker threads.
///
/// **Inode references** (the FUSE lookup count): every successful `lookup`, `mknod`,
/// `mkdir`, `symlink`, `link` and `create`, every entry that `readdir` with `plus`
/// passes to its callback, and every successful `hold` gives the caller one reference
/// to the inode it names. The caller owns it and gives it back with `forget`. While a
/// reference is held the inode is not freed and its number not reused, even when its
/// last name is removed (as the kernel expects of a FUSE file system, and as an open
/// file descriptor keeps an unlinked file on a local file system). A frontend that
/// makes such a call for its own purposes (e.g. looking up ".." to list a directory)
/// forgets the reference at once. Stateless backends may ignore references.
pub trait Backend: Send + Sync {
    fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
    /// Give back `n` references to `ino` (see the trait's notes on references).
    fn forget(&self, _ino: u64, _n: u64) {}
    /// Take one reference to `ino` if it exists and its generation is `generation`
    /// (0 = any); ESTALE otherwise. Returns its attributes.
    fn hold(&self, ino: u64, generation: u64) -> Result<Attr> {
        let a = self.getattr(ino)?;
        if generation != 0 && a.generation != generation {
            return Err(Error::new(
                libc::ESTALE,
                format!(
                    "inode {ino} is generation {}, not {generation}",
                    a.generation
                ),
            ));
        }
        Ok(a)
    }
    fn getattr(&self, ino: u64) -> Result<Attr>;
    fn setattr(&self, ctx: &Ctx, ino: u64, set: &SetAttr) -> Result<Attr>;
    fn readlink(&self, ino: u64) -> Result<Vec<u8>>;
    fn mknod(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr>;
    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr>;
    /// Remove a name. Returns the attributes of the inode it named, after the removal
    /// (its link count is the new one: 0 when this was its last name), so caches of
    /// that inode can be brought up to date.
    fn unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
    /// Remove an empty directory; returns its attributes after the removal.
    fn rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
    fn symlink(&self, ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr>;
    /// `flags`: Linux RENAME_NOREPLACE (1) / RENAME_EXCHANGE (2).
    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()>;
    fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr>;
    /// Returns a handle.
    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64>;
    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, u64)>;
    /// Read up to `size` bytes at `offset`; `sink` gets the data as slices (short at EOF).
    fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        sink: &mut ReadSink<'_>,
    ) -> Result<()>;
    fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32>;
    /// Write `len` bytes at `offset`, letting `fill` place them straight into the
    /// destination. The default goes through a buffer.
    fn write_with(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        len: u32,
        fill: &mut WriteFill<'_>,
    ) -> Result<u32> {
        let mut buf = vec![0u8; len as usize];
        fill(&mut [&mut buf[..]])?;
        self.write(ino, fh, offset, &buf)
    }
    fn flush(&self, _ino: u64, _fh: u64) -> Result<()> {
        Ok(())
    }
    fn release(&self, ino: u64, fh: u64) -> Result<()>;
    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()>;
    fn opendir(&self, _ctx: &Ctx, ino: u64) -> Result<u64> {
        if self.getattr(ino)?.is_dir() {
            Ok(0)
        } else {
            Err(Error::errno(libc::ENOTDIR))
        }
    }
    fn releasedir(&self, _ino: u64, _fh: u64) -> Result<()> {
        Ok(())
    }
    /// Entries after cookie `offset` (0 = start), without "." and ".."; `f` returns false
    /// to stop. With `plus`, entries carry attributes.
    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()>;
    fn statfs(&self) -> Result<StatFs>;
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
    fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>>;
    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()>;
    /// Punch a hole (FALLOC_FL_PUNCH_HOLE | KEEP_SIZE) or preallocate (mode 0).
    fn fallocate(&self, _ino: u64, _fh: u64, _offset: u64, _len: u64, _mode: i32) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP))
    }
    /// Copy accounting since start.
    fn copy_stats(&self) -> CopyStats {
        CopyStats::default()
    }
    /// Make everything durable (syncfs).
    fn sync_all(&self) -> Result<()> {
        Ok(())
    }
}
