//! The Backend trait: the FUSE request set (as DPFS decouples the file system API from
//! its backends), served by every frontend (FUSE mount, network server, library) and
//! implemented by every backend (the local PM volume, a remote peer, the null backend).
//!
//! Inode numbers are u64 (the root is 1) and may carry a node id in their top bits
//! later; errors are errno values, with a message when there is more to say. The
//! contract of every method is on [`Backend`].

pub mod null;

use std::fmt;

pub use zcfs_types::{
    errno_name, Attr, Cred, DirState, Error, Result, SetAttr, SetTime, StatFs, Time, ROOT,
};

/// Who is asking (the caller of the system call behind the request): the identity the
/// backend checks permissions against, and its process (0 when unknown).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ctx {
    pub cred: Cred,
    pub pid: u32,
}

impl Ctx {
    /// A caller without supplementary groups.
    pub fn user(uid: u32, gid: u32) -> Ctx {
        Ctx {
            cred: Cred::new(uid, gid, Vec::new()),
            pid: 0,
        }
    }
    /// Root (passes every permission check).
    pub fn root() -> Ctx {
        Ctx::default()
    }
}

/// access(2) mask bits, as the kernel sends them.
pub const R_OK: u32 = 4;
pub const W_OK: u32 = 2;
pub const X_OK: u32 = 1;

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
/// Most bytes a listxattr answers (names, each with its NUL): Linux XATTR_LIST_MAX. A
/// backend answers a longer list with E2BIG.
pub const XATTR_LIST_MAX: usize = 64 << 10;

/// Where a read's data goes: the frontend's reply (a FUSE reply, a socket).
///
/// A backend calls [`ReadReply::send`] exactly once for a successful read, with the data
/// as borrowed slices (they may be the backend's own memory, such as PM blocks, and are
/// valid only during the call); an error of `send` is returned by the read. A read that
/// fails before it has data does not call it. Closures `FnMut(&[&[u8]]) -> Result<()>`
/// are replies.
pub trait ReadReply {
    fn send(&mut self, data: &[&[u8]]) -> Result<()>;
}

impl<F: FnMut(&[&[u8]]) -> Result<()>> ReadReply for F {
    fn send(&mut self, data: &[&[u8]]) -> Result<()> {
        self(data)
    }
}

/// Where the outcome of [`Backend::read_then`] goes: the bytes read (fewer at end of
/// file, none past it) or why not.
pub type ReadDone = Box<dyn FnOnce(Result<Vec<u8>>) + Send>;

/// A write's payload, still at its source (a socket, a buffer): a backend moves it
/// straight into the memory that will hold it (the zero-copy write path).
///
/// The payload is `remaining()` bytes long when the write begins. A backend takes all
/// of it with [`WritePayload::fill`] (in one or several calls, each with destination
/// slices totalling at most what remains) or none of it when it refuses the write. What
/// a backend leaves is the payload's owner's to deal with: sources that must stay in
/// step (a socket) discard it when the payload is dropped.
pub trait WritePayload {
    /// Bytes not taken yet.
    fn remaining(&self) -> usize;
    /// Move the next bytes of the payload into `dst`, filling every slice.
    fn fill(&mut self, dst: &mut [&mut [u8]]) -> Result<()>;
}

/// One extent of a [`LandingWrite`]: `blocks` blocks of 4 KiB at byte `offset` of the
/// store's image, for file bytes from `file_offset` on. The 4 KiB in front of `offset`
/// are the reservation's too (the frames clobber the last bytes there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LandingSpan {
    pub offset: u64,
    pub blocks: u32,
    pub file_offset: u64,
}

/// A write whose bytes are put in place by the receiver ([`Backend::reserve_landing`]).
/// The caller must not commit or drop it while anything may still write into its
/// extents: after that the blocks are a file's or free.
pub trait LandingWrite: Send {
    /// Where the bytes go, in file order: the first block's bytes before the write's
    /// offset, and the last block's after its end, are taken from the file at commit.
    fn extents(&self) -> &[LandingSpan];
    /// Put the bytes into the file (all or nothing, as `write`); the bytes written.
    fn commit(self: Box<Self>) -> Result<u32>;
}

/// A write's bytes held in a pipe, not in memory (the FUSE mount splices large writes
/// from /dev/fuse, where they are references to the writer's page-cache pages). A
/// backend that sends them on moves them with splice(2) instead of copying them.
/// Whatever is not taken when the backend returns is thrown away by the owner.
pub trait PipedData {
    /// Bytes not taken yet.
    fn remaining(&self) -> usize;
    /// Copy the next `dst.len()` bytes (at most `remaining()`) into `dst`.
    fn read_into(&mut self, dst: &mut [u8]) -> std::io::Result<()>;
    /// Move every remaining byte into `fd` (a socket) without copying them; blocks while
    /// `fd` is full. An error leaves the rest untaken.
    fn splice_into(&mut self, fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()>;
}

/// Read the rest of piped data into memory.
pub fn piped_to_vec(p: &mut dyn PipedData) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; p.remaining()];
    p.read_into(&mut buf)?;
    Ok(buf)
}

/// A payload already in memory.
#[derive(Debug)]
pub struct BufPayload<'a>(pub &'a [u8]);

impl WritePayload for BufPayload<'_> {
    fn remaining(&self) -> usize {
        self.0.len()
    }
    fn fill(&mut self, dst: &mut [&mut [u8]]) -> Result<()> {
        let want: usize = dst.iter().map(|d| d.len()).sum();
        if want > self.0.len() {
            return Err(Error::new(
                libc::EIO,
                format!("a fill of {want} bytes from a payload of {}", self.0.len()),
            ));
        }
        for d in dst.iter_mut() {
            let (head, rest) = self.0.split_at(d.len());
            d.copy_from_slice(head);
            self.0 = rest;
        }
        Ok(())
    }
}

/// Take a whole payload into memory (one copy).
pub fn payload_to_vec(p: &mut dyn WritePayload) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; p.remaining()];
    p.fill(&mut [&mut buf[..]])?;
    Ok(buf)
}

/// The request set. Methods take `&self`: backends are shared by many worker threads,
/// and every method may be called concurrently with every other.
///
/// **Inodes** are named by number (`ino`, `parent`; the root is [`ROOT`]). A number the
/// backend no longer knows gets ESTALE (the kernel then looks the name up again).
///
/// **Inode references** (the FUSE lookup count): every successful `lookup`, `mknod`,
/// `mkdir`, `symlink`, `link`, `create` and `tmpfile`, every entry that `readdir` with `plus`
/// passes to its callback, and every successful `hold` gives the caller one reference
/// to the inode it names. The caller owns it and gives it back with `forget`. While a
/// reference is held the inode is not freed and its number not reused, even when its
/// last name is removed (as the kernel expects of a FUSE file system, and as an open
/// file descriptor keeps an unlinked file on a local file system). A frontend that
/// makes such a call for its own purposes (e.g. looking up ".." to list a directory)
/// forgets the reference at once. Stateless backends may ignore references.
///
/// **Handles** (`fh`): `open`, `create` and `tmpfile` return one; it stays valid until the matching
/// `release`, which each handle gets exactly once. An open handle also keeps its inode
/// (an unlinked file stays readable until its last handle is released). Data calls
/// (`read`, `write`, `flush`, `fsync`, `fallocate`) pass the handle they act through;
/// a backend may ignore it (the local volume keeps no per-handle state) or use it (the
/// remote client maps it to the server's handle). `fh` 0 means "no handle".
///
/// **Permissions**: the backend decides, from `ctx.cred`, as a POSIX file system does
/// (mode bits with the supplementary groups, sticky directories, who may chown and
/// chmod, set-id bits dropped on write, chown and truncate). Calls through a handle
/// (`read`, `write`, a `setattr` with a handle) were authorized when the handle was
/// opened. A credential marked `checked` was checked by a party the backend trusts
/// (a kernel mounted with default_permissions); a network server never passes one on.
///
/// **Errors** are an errno ([`Error`]) with a message only when there is more to say;
/// a failed call changes nothing the caller can observe.
pub trait Backend: Send + Sync {
    /// Find `name` in directory `parent` ("." and ".." included). Gives a reference.
    fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
    /// How long a "no such name" answer of `lookup` in `parent` may be kept (None: as
    /// long as an entry). A backend that answers from what it knows of a directory's
    /// names gives what is left of that knowledge's time.
    fn negative_ttl(&self, _parent: u64) -> Option<std::time::Duration> {
        None
    }
    /// Give back `n` references to `ino` (see the trait's notes on references). More
    /// than are held is not an error: the count stops at zero.
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
    /// Attributes of `ino`.
    fn getattr(&self, ino: u64) -> Result<Attr>;
    /// Directory `ino`'s name-set version and entry count, read together (see
    /// `DirState`). ENOSYS from a backend that counts no versions.
    fn dir_state(&self, _ino: u64) -> Result<DirState> {
        Err(Error::errno(libc::ENOSYS))
    }
    /// Change attributes (chmod, chown, truncate, utimes) as one step; returns the new
    /// attributes. `fh` is the handle the change comes through (ftruncate, futimens),
    /// 0 for none: a size change through a handle opened for writing needs no write
    /// permission on the file.
    fn setattr(&self, ctx: &Ctx, ino: u64, set: &SetAttr, fh: u64) -> Result<Attr>;
    /// access(2): may `ctx` access `ino` for `mask` ([`R_OK`] | [`W_OK`] | [`X_OK`]; 0
    /// asks whether it exists)? EACCES if not.
    fn access(&self, ctx: &Ctx, ino: u64, mask: u32) -> Result<()>;
    /// Target of a symlink (EINVAL for anything else).
    fn readlink(&self, ino: u64) -> Result<Vec<u8>>;
    /// Create a regular file, fifo, socket or device node (`mode` carries the type;
    /// `rdev` the device). New nodes belong to `ctx`'s uid/gid (or the directory's group
    /// when it is setgid). Gives a reference.
    fn mknod(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr>;
    /// Create a directory. Gives a reference.
    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr>;
    /// Remove a name. Returns the attributes of the inode it named, after the removal
    /// (its link count is the new one: 0 when this was its last name), so caches of
    /// that inode can be brought up to date.
    fn unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
    /// Remove an empty directory; returns its attributes after the removal.
    fn rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
    /// Create a symlink to `target` (1..=4095 bytes, no NUL). Gives a reference.
    fn symlink(&self, ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr>;
    /// Move `parent/name` to `newparent/newname`, atomically replacing what is there.
    /// `flags`: Linux RENAME_NOREPLACE (1) / RENAME_EXCHANGE (2). Returns the inode
    /// that lost the name `newparent/newname` to the moved one, when the backend knows
    /// (it may have no link left: a server bounds the orphans a client holds by
    /// reference); None: none did (a free name, an exchange), or not known.
    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<Option<u64>>;
    /// A new name for `ino` (not a directory). Gives a reference.
    fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr>;
    /// Open `ino` with open(2) `flags`, if `ctx` may access it that way (O_TRUNC asks
    /// for write); returns a handle (see the trait's notes). With O_TRUNC the frontend
    /// truncates through `setattr` with the handle (FUSE_ATOMIC_O_TRUNC).
    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64>;
    /// Create and open a regular file in one step: a reference and a handle.
    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, u64)>;
    /// open(2) with O_TMPFILE: create and open a regular file in directory `parent` that
    /// no directory names (link count 0): a reference and a handle, as `create`.
    /// Permission (write and search on `parent`), owner and group as for `create`;
    /// `mode`'s permission bits are masked by the caller's umask (or the directory's
    /// default ACL). `flags` must ask for write access
    /// (EINVAL otherwise). Unless `flags` has O_EXCL, `link` may give the file its first
    /// name (Linux's I_LINKABLE); unlinked, it goes with its last reference, and a crash
    /// before then leaves it for the backend to reclaim. The default, for backends that
    /// cannot, is EOPNOTSUPP (never ENOSYS, which a kernel takes as "never again").
    fn tmpfile(&self, _ctx: &Ctx, _parent: u64, _mode: u32, _flags: i32) -> Result<(Attr, u64)> {
        Err(Error::new(
            libc::EOPNOTSUPP,
            "this backend cannot make unnamed files (O_TMPFILE)",
        ))
    }
    /// Read up to `size` bytes at `offset` into `reply` (see [`ReadReply`]: fewer bytes
    /// at end of file, none past it).
    fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        reply: &mut dyn ReadReply,
    ) -> Result<()>;
    /// Whether [`Backend::read_then`] answers without holding the calling thread for
    /// the read (a network backend). A frontend then calls it instead of `read`.
    fn reads_then(&self) -> bool {
        false
    }
    /// `read`, its outcome handed to `done` (exactly once, on any thread; it must not
    /// block). A backend that [`reads_then`](Backend::reads_then) returns before the
    /// data is in. The default reads here and calls `done` before it returns.
    fn read_then(&self, ino: u64, fh: u64, offset: u64, size: u32, done: ReadDone) {
        let mut data = None;
        let r = self.read(ino, fh, offset, size, &mut |slices: &[&[u8]]| {
            data = Some(slices.concat());
            Ok(())
        });
        done(r.map(|()| data.unwrap_or_default()))
    }
    /// Write `data` at `offset`; returns the bytes written (fewer only when the
    /// volume runs out of room part way, as POSIX allows). A write by an unprivileged
    /// `ctx` drops the file's set-user-ID bit (and set-group-ID, as Linux does).
    fn write(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32>;
    /// A write the caller does not wait for: answered as written once sent; its
    /// outcome is waited for by whatever must see it (an overlapping read or write,
    /// getattr, setattr, fallocate, lseek, flush, fsync, release, sync_all), and an
    /// error is reported by the inode's next flush or fsync. For buffered writes
    /// (never O_DIRECT, O_SYNC or O_DSYNC ones). The default writes and waits.
    fn write_behind(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write(ctx, ino, fh, offset, data)
    }
    /// [`Backend::write_behind`], answering the caller through `answer` as soon as the
    /// write is committed to being sent (before it is): the caller goes on while the
    /// bytes leave, which stay borrowed until this returns. An error after the answer
    /// is kept for the inode's next flush or fsync; the `Result` is the answer when
    /// `answer` was not called. The default answers with the outcome of `write_behind`.
    fn write_behind_answering(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        answer: &mut dyn FnMut(u32),
    ) -> Result<u32> {
        let _ = answer;
        self.write_behind(ctx, ino, fh, offset, data)
    }
    /// Whether [`Backend::write_behind_piped`] moves piped data on without copying it
    /// into memory (a frontend then hands large buffered writes over in their pipe).
    /// The default, false: it reads them into memory.
    fn moves_piped_writes(&self) -> bool {
        false
    }
    /// [`Backend::write_behind_answering`] with the bytes in a pipe. The default reads
    /// them into memory first.
    fn write_behind_piped(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &mut dyn PipedData,
        answer: &mut dyn FnMut(u32),
    ) -> Result<u32> {
        let buf = piped_to_vec(data)?;
        self.write_behind_answering(ctx, ino, fh, offset, &buf, answer)
    }
    /// Write the whole `payload` at `offset`, moving it straight to where it will be kept
    /// (e.g. from a socket into the PM blocks that will hold it); see [`WritePayload`]
    /// for what happens to a payload the backend refuses. The default goes through a
    /// buffer.
    fn write_with(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        payload: &mut dyn WritePayload,
    ) -> Result<u32> {
        let buf = payload_to_vec(payload)?;
        self.write(ctx, ino, fh, offset, &buf)
    }
    /// The (device, inode) of the image file [`Backend::reserve_landing`]'s offsets are
    /// of, mapped shared by the store (None: it lands nothing). A receiver lands bytes
    /// only through a shared mapping of that same file.
    fn image_file_id(&self) -> Option<(u64, u64)> {
        None
    }
    /// Reserve the blocks a write of `len` bytes at `offset` will be kept in, for a
    /// receiver that lands the bytes there itself (the server's layer-2 lane: AF_XDP
    /// frames written by the kernel into the store's image, whose mapping is the
    /// receiver's memory). The bytes count once [`LandingWrite::commit`] is called;
    /// dropping the reservation writes nothing. `ENOTSUP`: the store cannot do it;
    /// `ENOSPC`: no room for it laid out so (an ordinary write may still fit).
    fn reserve_landing(
        &self,
        _ctx: &Ctx,
        _ino: u64,
        _fh: u64,
        _offset: u64,
        _len: usize,
    ) -> Result<Box<dyn LandingWrite>> {
        Err(Error::new(
            libc::ENOTSUP,
            "this store cannot land writes in place",
        ))
    }
    /// close(2) of a file descriptor on the handle (may come several times per handle).
    fn flush(&self, _ino: u64, _fh: u64) -> Result<()> {
        Ok(())
    }
    /// The last close of a handle: the handle is invalid afterwards.
    fn release(&self, ino: u64, fh: u64) -> Result<()>;
    /// Make the inode's data (and, unless `datasync`, its metadata) durable.
    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()>;
    /// Open a directory for listing (read permission); returns a handle (0 by default).
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
    /// to stop. With `plus`, entries carry attributes and each one passed to `f` holds a
    /// reference, which the caller owns (and forgets if it does not pass it on).
    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()>;
    fn statfs(&self) -> Result<StatFs>;
    /// `flags`: 0, [`XATTR_CREATE`] or [`XATTR_REPLACE`]. user.* attributes need write
    /// permission, trusted.* ones root.
    fn setxattr(&self, ctx: &Ctx, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
    /// ENODATA when absent.
    fn getxattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
    /// The names (trusted.* ones only for root).
    fn listxattr(&self, ctx: &Ctx, ino: u64) -> Result<Vec<Vec<u8>>>;
    fn removexattr(&self, ctx: &Ctx, ino: u64, name: &[u8]) -> Result<()>;
    /// fallocate(2): preallocate (mode 0, KEEP_SIZE), punch a hole (PUNCH_HOLE |
    /// KEEP_SIZE), zero a range (ZERO_RANGE, with or without KEEP_SIZE); EOPNOTSUPP for
    /// a mode the backend does not offer. Preallocation promises that writes into the
    /// range do not fail for space, or fails with ENOSPC up front.
    fn fallocate(
        &self,
        _ctx: &Ctx,
        _ino: u64,
        _fh: u64,
        _offset: u64,
        _len: u64,
        _mode: i32,
    ) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP))
    }
    /// lseek(2) with SEEK_DATA (`whence` 3) or SEEK_HOLE (4) from `offset`: the offset
    /// found, ENXIO at or past the end of the file. ENOSYS (the default) lets the
    /// kernel answer as if the whole file were data.
    fn lseek(&self, _ino: u64, _fh: u64, _offset: u64, _whence: i32) -> Result<u64> {
        Err(Error::errno(libc::ENOSYS))
    }
    /// Copy accounting since start.
    fn copy_stats(&self) -> CopyStats {
        CopyStats::default()
    }
    /// Make everything durable (syncfs).
    fn sync_all(&self) -> Result<()> {
        Ok(())
    }
    /// How old the oldest cached copy is that an answer about `ino` (its attributes,
    /// a name of it) may have come from. A frontend that caches the answer again
    /// shortens its own timeout by that much, so the two caches do not add up. Zero
    /// for a backend that answers from the source (the default).
    fn cache_age(&self, _ino: u64) -> std::time::Duration {
        std::time::Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffered_payload_fills_in_order_and_never_past_its_end() {
        let data: Vec<u8> = (0..10u8).collect();
        let mut p = BufPayload(&data);
        let (mut a, mut b) = ([0u8; 3], [0u8; 4]);
        p.fill(&mut [&mut a[..], &mut b[..]]).unwrap();
        assert_eq!((a, b, p.remaining()), ([0, 1, 2], [3, 4, 5, 6], 3));
        let mut c = [0u8; 4];
        assert_eq!(p.fill(&mut [&mut c[..]]).unwrap_err().errno, libc::EIO);
        assert_eq!(p.remaining(), 3, "a refused fill takes nothing");
        assert_eq!(payload_to_vec(&mut p).unwrap(), vec![7, 8, 9]);
        assert_eq!(p.remaining(), 0);
    }
}
