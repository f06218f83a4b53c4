//! Files on either side of a `cp`, `cat` or `ls`: a local path, or a file on a server
//! reached through the client library (`zcfs_client::RemoteFs`), behind one set of
//! operations (look up, list, make, open, change attributes) so the commands need not
//! care which side is which.
//!
//! On a server, every node the commands hold is a reference (`Held`), given back when
//! dropped; paths are resolved one name at a time from the root as the caller (symlinks
//! on the way followed, at most `MAX_SYMLINKS`), so the server checks every permission
//! on the way as a mount would.

use crate::pipeline::{Sink, Source};
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use zcfs_backend::{Attr, Backend, Ctx, Error, Result, SetAttr, SetTime, Time, ROOT};
use zcfs_client::{ReadTicket, RemoteFs, WriteTicket};

/// Symlinks followed while resolving one path, at most (Linux's MAXSYMLINKS).
pub const MAX_SYMLINKS: usize = 40;

/// A server and who we are to it.
pub struct Remote {
    pub fs: RemoteFs,
    /// `HOST:PORT`, for messages.
    pub addr: String,
    ctx: Ctx,
}

/// This process's identity as requests carry it: uid, gid, supplementary groups and
/// umask (a new file's mode is masked by it, as a local create's is).
pub fn own_ctx(umask: u32) -> Ctx {
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut ctx = Ctx::user(uid, gid);
    ctx.cred.groups = supplementary_groups();
    ctx.cred.groups.truncate(zcfs_protocol::MAX_GROUPS);
    ctx.cred.umask = umask;
    ctx
}

fn supplementary_groups() -> Vec<u32> {
    // SAFETY: a count of 0 asks for the number of groups and writes nothing.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut groups = vec![0 as libc::gid_t; n as usize];
    // SAFETY: the buffer holds `n` gids, as the call is told.
    let got = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    groups.truncate(got.max(0) as usize);
    groups
}

/// This process's umask (read by setting it and setting it back, before any thread
/// that creates files runs).
pub fn process_umask() -> u32 {
    // SAFETY: umask cannot fail; the old mask is put back at once.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old as u32
    }
}

impl Remote {
    pub fn connect(addr: &str, secret_file: Option<&Path>, umask: u32) -> anyhow::Result<Remote> {
        let cfg = crate::backend::client_config(addr, secret_file)?;
        Ok(Remote {
            fs: crate::backend::connect(cfg)?,
            addr: addr.to_string(),
            ctx: own_ctx(umask),
        })
    }

    fn root(&self) -> Held<'_> {
        Held {
            r: self,
            ino: ROOT,
            owned: false,
        }
    }

    fn held(&self, a: &Attr) -> Held<'_> {
        Held {
            r: self,
            ino: a.ino,
            owned: true,
        }
    }

    /// The node at absolute `path` and its attributes; a symlink at the end is
    /// followed when `follow` (or the path ends with a slash).
    pub fn resolve(&self, path: &str, follow: bool) -> Result<(Node<'_>, Attr)> {
        let slash = path.len() > 1 && path.ends_with('/');
        let mut names: std::collections::VecDeque<Vec<u8>> = components(path.as_bytes());
        let mut cur = self.root();
        let mut attr = self.fs.getattr(ROOT)?;
        let mut links = 0;
        while let Some(name) = names.pop_front() {
            if !attr.is_dir() {
                return Err(Error::errno(libc::ENOTDIR));
            }
            let a = self.fs.lookup(&self.ctx, cur.ino, &name)?;
            let child = self.held(&a);
            let last = names.is_empty();
            if a.kind() == libc::S_IFLNK && (!last || follow || slash) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(Error::new(
                        libc::ELOOP,
                        format!("more than {MAX_SYMLINKS} symlinks on the way"),
                    ));
                }
                let target = self.fs.readlink(child.ino)?;
                drop(child);
                for c in components(&target).into_iter().rev() {
                    names.push_front(c);
                }
                if target.starts_with(b"/") {
                    cur = self.root();
                    attr = self.fs.getattr(ROOT)?;
                }
                continue;
            }
            cur = child;
            attr = a;
        }
        if slash && !attr.is_dir() {
            return Err(Error::errno(libc::ENOTDIR));
        }
        Ok((Node::Remote(cur), attr))
    }
}

/// The names of a path, without empty ones and ".".
fn components(p: &[u8]) -> std::collections::VecDeque<Vec<u8>> {
    p.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

/// A reference to a node on a server, given back on drop (the root needs none).
pub struct Held<'a> {
    r: &'a Remote,
    ino: u64,
    owned: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.owned {
            self.r.fs.forget(self.ino, 1);
        }
    }
}

/// A file or directory on either side.
pub enum Node<'a> {
    Local(PathBuf),
    Remote(Held<'a>),
}

/// A local file's attributes in the library's terms.
pub fn local_attr(m: &std::fs::Metadata) -> Attr {
    let t = |sec: i64, nsec: i64| Time {
        sec,
        nsec: nsec as u32,
    };
    Attr {
        ino: m.ino(),
        generation: 1,
        size: m.size(),
        blocks: m.blocks(),
        atime: t(m.atime(), m.atime_nsec()),
        mtime: t(m.mtime(), m.mtime_nsec()),
        ctime: t(m.ctime(), m.ctime_nsec()),
        mode: m.mode(),
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        // Not looked at: a local file's xattrs are not copied.
        no_xattrs: false,
    }
}

/// A local path's attributes, the symlink's own or (`follow`) its target's.
pub fn local_stat(p: &Path, follow: bool) -> Result<Attr> {
    let m = if follow {
        std::fs::metadata(p)
    } else {
        std::fs::symlink_metadata(p)
    };
    Ok(local_attr(&m?))
}

/// What to set on a file or directory once its contents are in.
#[derive(Debug, Clone, Default)]
pub struct Finish {
    /// Permission bits (with set-id and sticky bits).
    pub mode: Option<u32>,
    /// Access and modification times.
    pub times: Option<(Time, Time)>,
}

impl Finish {
    fn set_attr(&self) -> SetAttr {
        SetAttr {
            mode: self.mode,
            atime: self.times.map(|t| SetTime::At(t.0)),
            mtime: self.times.map(|t| SetTime::At(t.1)),
            ..Default::default()
        }
    }
}

fn system_time(t: Time) -> std::time::SystemTime {
    let d = std::time::Duration::new(t.sec.unsigned_abs(), t.nsec);
    if t.sec >= 0 {
        std::time::UNIX_EPOCH + d
    } else {
        std::time::UNIX_EPOCH - d
    }
}

fn set_local(f: &File, p: &Path, finish: &Finish) -> Result<()> {
    if let Some(m) = finish.mode {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))?;
    }
    if let Some((a, m)) = finish.times {
        f.set_times(
            std::fs::FileTimes::new()
                .set_accessed(system_time(a))
                .set_modified(system_time(m)),
        )?;
    }
    Ok(())
}

impl<'a> Node<'a> {
    /// `name` in this directory, not following a symlink there.
    pub fn child(&self, name: &OsStr) -> Result<(Node<'a>, Attr)> {
        match self {
            Node::Local(p) => {
                let p = p.join(name);
                let a = local_stat(&p, false)?;
                Ok((Node::Local(p), a))
            }
            Node::Remote(h) => {
                let a = h.r.fs.lookup(&h.r.ctx, h.ino, name.as_bytes())?;
                Ok((Node::Remote(h.r.held(&a)), a))
            }
        }
    }

    /// The names in this directory (without "." and ".."), sorted.
    pub fn list(&self) -> Result<Vec<OsString>> {
        let mut names = match self {
            Node::Local(p) => std::fs::read_dir(p)?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<std::io::Result<Vec<_>>>()?,
            Node::Remote(h) => {
                h.r.fs.opendir(&h.r.ctx, h.ino)?;
                let mut names = Vec::new();
                h.r.fs.readdir(h.ino, 0, false, &mut |e| {
                    names.push(OsString::from_vec(e.name));
                    true
                })?;
                names
            }
        };
        names.sort();
        Ok(names)
    }

    pub fn readlink(&self) -> Result<Vec<u8>> {
        match self {
            Node::Local(p) => Ok(std::fs::read_link(p)?.into_os_string().into_vec()),
            Node::Remote(h) => h.r.fs.readlink(h.ino),
        }
    }

    /// Make directory `name` here.
    pub fn mkdir(&self, name: &OsStr, mode: u32) -> Result<(Node<'a>, Attr)> {
        match self {
            Node::Local(p) => {
                let p = p.join(name);
                std::fs::DirBuilder::new().mode(mode).create(&p)?;
                let a = local_stat(&p, false)?;
                Ok((Node::Local(p), a))
            }
            Node::Remote(h) => {
                let mut ctx = h.r.ctx.clone();
                // The mode asked for is the mode wanted (the caller masks it).
                ctx.cred.umask = 0;
                let a = h.r.fs.mkdir(&ctx, h.ino, name.as_bytes(), mode)?;
                Ok((Node::Remote(h.r.held(&a)), a))
            }
        }
    }

    pub fn symlink(&self, name: &OsStr, target: &[u8]) -> Result<()> {
        match self {
            Node::Local(p) => Ok(std::os::unix::fs::symlink(
                OsStr::from_bytes(target),
                p.join(name),
            )?),
            Node::Remote(h) => {
                let a = h.r.fs.symlink(&h.r.ctx, h.ino, name.as_bytes(), target)?;
                drop(h.r.held(&a));
                Ok(())
            }
        }
    }

    pub fn unlink(&self, name: &OsStr) -> Result<()> {
        match self {
            Node::Local(p) => Ok(std::fs::remove_file(p.join(name))?),
            Node::Remote(h) => h.r.fs.unlink(&h.r.ctx, h.ino, name.as_bytes()).map(|_| ()),
        }
    }

    /// Set mode and times (a directory's, once its entries are in).
    pub fn finish(&self, finish: &Finish) -> Result<()> {
        if finish.mode.is_none() && finish.times.is_none() {
            return Ok(());
        }
        match self {
            Node::Local(p) => {
                let f = File::open(p)?;
                set_local(&f, p, finish)
            }
            Node::Remote(h) => {
                h.r.fs
                    .setattr(&h.r.ctx, h.ino, &finish.set_attr(), 0)
                    .map(|_| ())
            }
        }
    }

    /// Open this file for reading.
    pub fn open_read(&self) -> Result<Reader<'a>> {
        match self {
            Node::Local(p) => Ok(Reader::Local(File::open(p)?, Vec::new())),
            Node::Remote(h) => {
                let fh = h.r.fs.open(&h.r.ctx, h.ino, libc::O_RDONLY)?;
                Ok(Reader::Remote(RemoteFile {
                    r: h.r,
                    ino: h.ino,
                    fh,
                    held: None,
                }))
            }
        }
    }

    /// Open this (existing, regular) file for writing, emptied.
    pub fn open_write(&self) -> Result<Writer<'a>> {
        match self {
            Node::Local(p) => {
                let f = OpenOptions::new().write(true).truncate(true).open(p)?;
                Ok(Writer::Local(f, p.clone()))
            }
            Node::Remote(h) => {
                let fh =
                    h.r.fs
                        .open(&h.r.ctx, h.ino, libc::O_WRONLY | libc::O_TRUNC)?;
                let f = RemoteFile {
                    r: h.r,
                    ino: h.ino,
                    fh,
                    held: None,
                };
                let empty = SetAttr {
                    size: Some(0),
                    ..Default::default()
                };
                h.r.fs.setattr(&h.r.ctx, h.ino, &empty, fh)?;
                Ok(Writer::Remote(f))
            }
        }
    }

    /// Whether this is a local path (not a file on a server).
    pub fn is_local(&self) -> bool {
        matches!(self, Node::Local(_))
    }

    /// Open this existing local device or fifo to write into it, in order, as cp does
    /// (`/dev/null`, a pipe): neither replaced nor emptied, and its mode and times are
    /// left as they are ([`Writer::finish`]). A file on a server: EINVAL.
    pub fn open_write_through(&self) -> Result<Writer<'a>> {
        match self {
            Node::Local(p) => Ok(Writer::Stream(OpenOptions::new().write(true).open(p)?)),
            Node::Remote(_) => Err(Error::new(
                libc::EINVAL,
                "a file on a server is not written through",
            )),
        }
    }

    /// Create regular file `name` here with permission bits `mode` (masked by the
    /// umask, as a local create is).
    pub fn create(&self, name: &OsStr, mode: u32) -> Result<Writer<'a>> {
        match self {
            Node::Local(p) => {
                let p = p.join(name);
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(mode)
                    .open(&p)?;
                Ok(Writer::Local(f, p))
            }
            Node::Remote(h) => {
                let (a, fh) = h.r.fs.create(
                    &h.r.ctx,
                    h.ino,
                    name.as_bytes(),
                    libc::S_IFREG | (mode & 0o7777),
                    libc::O_WRONLY,
                )?;
                Ok(Writer::Remote(RemoteFile {
                    r: h.r,
                    ino: a.ino,
                    fh,
                    held: Some(h.r.held(&a)),
                }))
            }
        }
    }

    /// Whether this node is on server `r`.
    pub fn is_on(&self, r: &Remote) -> bool {
        matches!(self, Node::Remote(h) if std::ptr::eq(h.r, r))
    }

    /// Whether both nodes are on one server (the same connection).
    pub fn same_server(&self, other: &Node<'_>) -> bool {
        match (self, other) {
            (Node::Remote(a), Node::Remote(b)) => std::ptr::eq(a.r, b.r),
            _ => false,
        }
    }

    /// The most bytes one request to this node's side should move.
    pub fn max_io(&self) -> Result<usize> {
        match self {
            Node::Local(_) => Ok(usize::MAX),
            Node::Remote(h) => h.r.fs.max_io(),
        }
    }
}

/// An open file on a server: released on drop.
pub struct RemoteFile<'a> {
    r: &'a Remote,
    ino: u64,
    fh: u64,
    /// The reference a create gave.
    held: Option<Held<'a>>,
}

impl Drop for RemoteFile<'_> {
    fn drop(&mut self) {
        if self.fh != 0 {
            if let Err(e) = self.r.fs.release(self.ino, self.fh) {
                tracing::warn!("{}: releasing inode {}: {e}", self.r.addr, self.ino);
            }
        }
        drop(self.held.take());
    }
}

pub enum Reader<'a> {
    /// A local file, and buffers to read into again (at most a window's worth).
    Local(File, Vec<Vec<u8>>),
    Remote(RemoteFile<'a>),
}

pub enum Pending<'a> {
    Read(Vec<u8>),
    Ticket(ReadTicket<'a>),
}

impl<'a> Source for Reader<'a> {
    type Pending = Pending<'a>;
    fn submit(&mut self, offset: u64, len: usize) -> Result<Pending<'a>> {
        match self {
            Reader::Local(f, spare) => {
                let mut buf = spare.pop().unwrap_or_default();
                buf.resize(len, 0);
                let mut n = 0;
                while n < len {
                    match f.read_at(&mut buf[n..], offset + n as u64) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                buf.truncate(n);
                Ok(Pending::Read(buf))
            }
            Reader::Remote(f) => {
                let len = u32::try_from(len).unwrap_or(u32::MAX);
                Ok(Pending::Ticket(
                    f.r.fs.submit_read(f.ino, f.fh, offset, len)?,
                ))
            }
        }
    }
    fn wait(&mut self, p: Pending<'a>) -> Result<Vec<u8>> {
        match p {
            Pending::Read(b) => Ok(b),
            Pending::Ticket(t) => t.wait(),
        }
    }
    fn recycle(&mut self, buf: Vec<u8>) {
        if let Reader::Local(_, spare) = self {
            if spare.len() < crate::pipeline::WINDOW {
                spare.push(buf);
            }
        }
    }
}

pub enum Writer<'a> {
    Local(File, PathBuf),
    Remote(RemoteFile<'a>),
    /// A local device or fifo, written in order (no offsets: a pipe has none).
    Stream(File),
}

pub enum Written<'a> {
    Done(usize),
    Ticket(WriteTicket<'a>),
}

impl<'a> Sink for Writer<'a> {
    type Pending = Written<'a>;
    fn submit(&mut self, offset: u64, data: &[u8]) -> Result<Written<'a>> {
        match self {
            Writer::Local(f, _) => {
                f.write_all_at(data, offset)?;
                Ok(Written::Done(data.len()))
            }
            Writer::Remote(f) => Ok(Written::Ticket(
                f.r.fs.submit_write(&f.r.ctx, f.ino, f.fh, offset, data)?,
            )),
            Writer::Stream(f) => {
                std::io::Write::write_all(f, data)?;
                Ok(Written::Done(data.len()))
            }
        }
    }
    fn wait(&mut self, p: Written<'a>) -> Result<usize> {
        match p {
            Written::Done(n) => Ok(n),
            Written::Ticket(t) => Ok(t.wait()? as usize),
        }
    }
}

impl Writer<'_> {
    /// Set what `finish` says, then, on a server, make the file durable (data and
    /// metadata: what a close on a mount makes durable) and close it.
    pub fn finish(self, finish: &Finish) -> Result<()> {
        match self {
            Writer::Local(f, p) => set_local(&f, &p, finish),
            // A device's or fifo's own mode and times are not the copy's.
            Writer::Stream(_) => Ok(()),
            Writer::Remote(f) => {
                let set = finish.set_attr();
                if !set.is_empty() {
                    f.r.fs.setattr(&f.r.ctx, f.ino, &set, f.fh)?;
                }
                f.r.fs.fsync(f.ino, f.fh, false)?;
                // Released on drop.
                Ok(())
            }
        }
    }
}

/// A sink that appends to a stream in order (`cat`'s standard output).
pub struct StreamSink<W: std::io::Write>(pub W);

impl<W: std::io::Write> Sink for StreamSink<W> {
    type Pending = usize;
    fn submit(&mut self, _offset: u64, data: &[u8]) -> Result<usize> {
        self.0.write_all(data)?;
        Ok(data.len())
    }
    fn wait(&mut self, n: usize) -> Result<usize> {
        Ok(n)
    }
}
