//! Namespace and attribute operations. Each is one transaction (one log entry), so
//! multi-inode operations (rename, link, unlink of the last link) are all-or-nothing.

use crate::dir::{Dir, Entry};
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::FileMap;
use crate::volume::{Inode, Sink, State, Txn, Volume};
use std::collections::BTreeMap;

/// Attributes as a frontend reports them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Attr {
    pub ino: u64,
    pub gen: u32,
    pub size: u64,
    /// 512-byte units, as st_blocks.
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timespec),
}

#[derive(Debug, Clone, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
}

/// Who creates a node: owner and group of the new inode.
#[derive(Debug, Clone, Copy, Default)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

impl RenameFlags {
    /// From Linux RENAME_NOREPLACE (1) / RENAME_EXCHANGE (2); other bits are invalid.
    pub fn from_bits(bits: u32) -> Result<RenameFlags> {
        if bits & !3 != 0 || bits == 3 {
            return Err(FsError::Invalid(format!("rename flags {bits:#x}")));
        }
        Ok(RenameFlags {
            noreplace: bits & 1 != 0,
            exchange: bits & 2 != 0,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub dtype: u8,
    /// Cookie to continue after this entry.
    pub next: u64,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrMode {
    Any,
    Create,
    Replace,
}

pub const MAX_SYMLINK: usize = BLOCK - 1;

pub(crate) fn attr_of(i: &Inode) -> Attr {
    let r = &i.rec;
    let blocks = i.map.owned_blocks() + (r.xattr_block != 0) as u64;
    Attr {
        ino: r.ino,
        gen: r.gen,
        size: r.size,
        blocks: blocks * (BLOCK_U64 / 512),
        atime: r.atime,
        mtime: r.mtime,
        ctime: r.ctime,
        mode: r.mode,
        nlink: r.nlink,
        uid: r.uid,
        gid: r.gid,
        rdev: r.rdev,
        blksize: BLOCK as u32,
    }
}

fn resolve(ts: TimeSet, now: Timespec) -> Timespec {
    match ts {
        TimeSet::Now => now,
        TimeSet::At(t) => t,
    }
}

impl State {
    pub(crate) fn inode(&self, ino: u64) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(FsError::NotFound)
    }
    pub(crate) fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(FsError::NotFound)
    }
    pub(crate) fn dir(&self, ino: u64) -> Result<&Dir> {
        match self.dirs.get(&ino) {
            Some(d) => Ok(d),
            None if self.inodes.contains_key(&ino) => Err(FsError::NotDir),
            None => Err(FsError::NotFound),
        }
    }
}

impl Volume {
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(attr_of(self.read_state().inode(ino)?))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let st = self.read_state();
        let e = st.dir(parent)?.get(name).ok_or(FsError::NotFound)?;
        Ok(attr_of(st.inode(e.ino)?))
    }

    /// Parent of a directory (for "..").
    pub fn parent_of(&self, dir: u64) -> Result<u64> {
        let st = self.read_state();
        st.dir(dir)?;
        Ok(st.inode(dir)?.rec.parent)
    }

    /// Create a non-directory node (regular file, fifo, socket, device).
    pub fn create(
        &self,
        parent: u64,
        name: &[u8],
        mode: u32,
        owner: Owner,
        rdev: u32,
    ) -> Result<Attr> {
        let kind = mode & S_IFMT;
        let mode = if kind == 0 { mode | S_IFREG } else { mode };
        if !valid_file_type(mode) || mode & S_IFMT == S_IFDIR || mode & S_IFMT == S_IFLNK {
            return Err(FsError::Invalid(format!("create with mode {mode:o}")));
        }
        self.make_node(OpType::Create, parent, name, mode, owner, rdev, None)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u32, owner: Owner) -> Result<Attr> {
        self.make_node(
            OpType::Mkdir,
            parent,
            name,
            S_IFDIR | (mode & 0o7777),
            owner,
            0,
            None,
        )
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], owner: Owner) -> Result<Attr> {
        if target.is_empty() || target.len() > MAX_SYMLINK || target.contains(&0) {
            return Err(FsError::Invalid(
                "symlink target must be 1..4095 bytes without NUL".into(),
            ));
        }
        self.make_node(
            OpType::Symlink,
            parent,
            name,
            S_IFLNK | 0o777,
            owner,
            0,
            Some(target),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        op: OpType,
        parent: u64,
        name: &[u8],
        mut mode: u32,
        owner: Owner,
        rdev: u32,
        symlink: Option<&[u8]>,
    ) -> Result<Attr> {
        check_name(name)?;
        let mut st = self.write_state()?;
        let st = &mut *st;
        if st.dir(parent)?.get(name).is_some() {
            return Err(FsError::Exists);
        }
        self.ensure_blocks(st, 8)?;
        let pinode = &st.inodes[&parent];
        if pinode.rec.nlink == 0 {
            return Err(FsError::NotFound);
        }
        let is_dir = mode & S_IFMT == S_IFDIR;
        // setgid directories: new nodes take the directory's group; subdirectories
        // inherit the bit.
        let gid = if pinode.rec.mode & S_ISGID != 0 {
            if is_dir {
                mode |= S_ISGID;
            }
            pinode.rec.gid
        } else {
            owner.gid
        };
        if is_dir && pinode.rec.nlink >= u32::MAX - 1 {
            return Err(FsError::TooManyLinks);
        }
        let ino = st.ialloc.alloc()?;
        let now = Timespec::now();
        let gen = st.gens[(ino - 1) as usize].wrapping_add(1);
        st.gens[(ino - 1) as usize] = gen;
        let mut txn = Txn::new(op, ino);
        let mut inode = Inode {
            rec: InodeRec {
                ino,
                gen,
                mode,
                uid: owner.uid,
                gid,
                nlink: if is_dir { 2 } else { 1 },
                atime: now,
                mtime: now,
                ctime: now,
                rdev,
                parent: if is_dir { parent } else { 0 },
                ..Default::default()
            },
            map: FileMap::default(),
            xattrs: BTreeMap::new(),
        };
        if let Some(target) = symlink {
            let b = st.balloc.alloc_one()?;
            let off = (b * BLOCK_U64) as usize;
            self.region.write(off, target);
            self.region.zero(off + target.len(), BLOCK - target.len());
            self.region.flush(off, BLOCK);
            let mut sink = Sink {
                region: &self.region,
                balloc: &mut st.balloc,
                txn: &mut txn,
            };
            inode.map.set(0, b, &mut sink)?;
            inode.rec.size = target.len() as u64;
            txn.data_addr = off as u64;
            txn.data_size = target.len() as u64;
        }
        st.inodes.insert(ino, inode);
        if is_dir {
            st.dirs.insert(ino, Dir::default());
        }
        txn.dirty.insert(ino);
        self.add_dirent(st, &mut txn, parent, name, ino, dtype_of(mode))?;
        let p = st.inode_mut(parent)?;
        if is_dir {
            inc(&mut p.rec.nlink);
        }
        p.rec.mtime = now;
        p.rec.ctime = now;
        let attr = attr_of(&st.inodes[&ino]);
        self.finish(st, txn)?;
        Ok(attr)
    }

    /// Insert a directory entry (growing the directory by a block when full).
    fn add_dirent(
        &self,
        st: &mut State,
        txn: &mut Txn,
        parent: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
    ) -> Result<()> {
        let dir = st.dirs.get_mut(&parent).ok_or(FsError::NotDir)?;
        let pos = match dir.find_room(name.len()) {
            Some(p) => p,
            None => {
                let bi = dir.blocks() as u64;
                let b = st.balloc.alloc_one()?;
                let off = (b * BLOCK_U64) as usize;
                self.region.zero(off, BLOCK);
                self.region.flush(off, BLOCK);
                let pi = st.inodes.get_mut(&parent).ok_or(FsError::NotFound)?;
                let mut sink = Sink {
                    region: &self.region,
                    balloc: &mut st.balloc,
                    txn,
                };
                pi.map.set(bi, b, &mut sink)?;
                pi.rec.size = (bi + 1) * BLOCK_U64;
                txn.dirty.insert(parent);
                (bi as usize * UNITS_PER_BLOCK) as u32
            }
        };
        let dir = st.dirs.get_mut(&parent).unwrap();
        dir.insert(name, Entry { ino, dtype, pos });
        let addr = self.dirent_addr(st, parent, pos)?;
        txn.push_bytes(
            addr,
            &Dirent {
                ino,
                dtype,
                name: name.to_vec(),
            }
            .encode(),
        );
        txn.dirty.insert(parent);
        Ok(())
    }

    fn dirent_addr(&self, st: &State, dir: u64, pos: u32) -> Result<u64> {
        let bi = pos as u64 / UNITS_PER_BLOCK as u64;
        let unit = pos as u64 % UNITS_PER_BLOCK as u64;
        let b = st
            .inode(dir)?
            .map
            .get(bi)
            .ok_or_else(|| FsError::Corrupt(format!("directory {dir} block {bi} unmapped")))?;
        Ok(b * BLOCK_U64 + unit * DIRENT_UNIT as u64)
    }

    fn remove_dirent(
        &self,
        st: &mut State,
        txn: &mut Txn,
        parent: u64,
        name: &[u8],
    ) -> Result<Entry> {
        let e = st
            .dirs
            .get_mut(&parent)
            .ok_or(FsError::NotDir)?
            .remove(name)
            .ok_or(FsError::NotFound)?;
        let addr = self.dirent_addr(st, parent, e.pos)?;
        txn.push_zero(addr, dirent_units(name.len()) * DIRENT_UNIT);
        txn.dirty.insert(parent);
        Ok(e)
    }

    fn rewrite_dirent(
        &self,
        st: &mut State,
        txn: &mut Txn,
        parent: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
    ) -> Result<()> {
        let e = st
            .dirs
            .get_mut(&parent)
            .ok_or(FsError::NotDir)?
            .retarget(name, ino, dtype)
            .ok_or(FsError::NotFound)?;
        let addr = self.dirent_addr(st, parent, e.pos)?;
        txn.push_bytes(
            addr,
            &Dirent {
                ino,
                dtype,
                name: name.to_vec(),
            }
            .encode(),
        );
        txn.dirty.insert(parent);
        Ok(())
    }

    /// Drop one link of `ino`; on the last link free the inode and all its blocks.
    fn drop_link(&self, st: &mut State, txn: &mut Txn, ino: u64, now: Timespec) -> Result<()> {
        let is_open = st.open.get(&ino).is_some_and(|&n| n > 0);
        let inode = st.inode_mut(ino)?;
        let is_dir = inode.rec.is_dir();
        let last = if is_dir { true } else { inode.rec.nlink <= 1 };
        txn.dirty.insert(ino);
        if !last {
            dec(&mut inode.rec.nlink);
            inode.rec.ctime = now;
            return Ok(());
        }
        if !is_dir && is_open {
            // Still open: keep it as an orphan (link count 0) until the last release;
            // a crash before that leaves it for the next mount to reclaim.
            inode.rec.nlink = 0;
            inode.rec.ctime = now;
            return Ok(());
        }
        self.free_inode(st, txn, ino);
        Ok(())
    }

    /// Free an inode and every block it owns, in `txn`.
    pub(crate) fn free_inode(&self, st: &mut State, txn: &mut Txn, ino: u64) {
        txn.dirty.insert(ino);
        let Some(mut inode) = st.inodes.remove(&ino) else {
            return;
        };
        st.dirs.remove(&ino);
        let mut sink = Sink {
            region: &self.region,
            balloc: &mut st.balloc,
            txn,
        };
        inode.map.truncate_blocks(0, &mut sink);
        if inode.rec.xattr_block != 0 {
            txn.releases.push(inode.rec.xattr_block);
        }
        st.ialloc.insert(ino);
        st.open.remove(&ino);
    }

    /// A frontend opened `ino`: an unlink of its last name keeps it until `release`.
    pub fn open_handle(&self, ino: u64) -> Result<()> {
        let mut st = self.state.write().unwrap();
        st.inode(ino)?;
        *st.open.entry(ino).or_insert(0) += 1;
        Ok(())
    }

    /// A handle of `ino` was closed; the last close of an unlinked file frees it.
    pub fn release_handle(&self, ino: u64) -> Result<()> {
        let mut st = self.state.write().unwrap();
        let st = &mut *st;
        let Some(n) = st.open.get_mut(&ino) else {
            return Ok(());
        };
        *n -= 1;
        if *n > 0 {
            return Ok(());
        }
        st.open.remove(&ino);
        if self.cfg.read_only || st.inodes.get(&ino).is_none_or(|i| i.rec.nlink != 0) {
            return Ok(());
        }
        let mut txn = Txn::new(OpType::Unlink, ino);
        self.free_inode(st, &mut txn, ino);
        self.finish(st, txn)
    }

    /// Free the orphans (unlinked while open) a crash left behind; run at mount.
    pub(crate) fn reap_orphans(&self) -> Result<usize> {
        let mut st = self.write_state()?;
        let st = &mut *st;
        let orphans: Vec<u64> = st
            .inodes
            .iter()
            .filter(|(_, i)| i.rec.nlink == 0 && !i.rec.is_dir())
            .map(|(&n, _)| n)
            .collect();
        for &ino in &orphans {
            let mut txn = Txn::new(OpType::Unlink, ino);
            self.free_inode(st, &mut txn, ino);
            self.finish(st, txn)?;
        }
        self.commit_batch(st);
        Ok(orphans.len())
    }

    /// Remove a name of a non-directory; returns the inode's attributes afterwards.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let mut st = self.write_state()?;
        let st = &mut *st;
        let e = st.dir(parent)?.get(name).ok_or(FsError::NotFound)?;
        if st.inode(e.ino)?.rec.is_dir() {
            return Err(FsError::IsDir);
        }
        let now = Timespec::now();
        let mut txn = Txn::new(OpType::Unlink, e.ino);
        self.remove_dirent(st, &mut txn, parent, name)?;
        let mut gone = attr_of(st.inode(e.ino)?);
        self.drop_link(st, &mut txn, e.ino, now)?;
        touch_dir(st, parent, now);
        let after = match st.inodes.get(&e.ino) {
            Some(i) => attr_of(i),
            None => {
                gone.nlink = 0;
                gone.ctime = now;
                gone
            }
        };
        self.finish(st, txn)?;
        Ok(after)
    }

    /// Remove an empty directory; returns its attributes afterwards (link count 0).
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        check_name(name)?;
        let mut st = self.write_state()?;
        let st = &mut *st;
        let e = st.dir(parent)?.get(name).ok_or(FsError::NotFound)?;
        if !st.dir(e.ino)?.is_empty() {
            return Err(FsError::NotEmpty);
        }
        let now = Timespec::now();
        let mut txn = Txn::new(OpType::Rmdir, e.ino);
        self.remove_dirent(st, &mut txn, parent, name)?;
        let mut gone = attr_of(st.inode(e.ino)?);
        self.drop_link(st, &mut txn, e.ino, now)?;
        dec(&mut st.inode_mut(parent)?.rec.nlink);
        touch_dir(st, parent, now);
        let after = match st.inodes.get(&e.ino) {
            Some(i) => attr_of(i),
            None => {
                gone.nlink = 0;
                gone.ctime = now;
                gone
            }
        };
        self.finish(st, txn)?;
        Ok(after)
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        check_name(newname)?;
        let mut st = self.write_state()?;
        let st = &mut *st;
        let i = st.inode(ino)?;
        let (is_dir, nlink, dtype) = (i.rec.is_dir(), i.rec.nlink, dtype_of(i.rec.mode));
        // Linux order: the new name's existence is checked before the source's type.
        if st.dir(newparent)?.get(newname).is_some() {
            return Err(FsError::Exists);
        }
        if is_dir {
            return Err(FsError::NotPermitted("hard link to a directory".into()));
        }
        if nlink >= u32::MAX - 1 {
            return Err(FsError::TooManyLinks);
        }
        self.ensure_blocks(st, 4)?;
        let now = Timespec::now();
        let mut txn = Txn::new(OpType::Link, ino);
        self.add_dirent(st, &mut txn, newparent, newname, ino, dtype)?;
        let i = st.inode_mut(ino)?;
        inc(&mut i.rec.nlink);
        i.rec.ctime = now;
        txn.dirty.insert(ino);
        touch_dir(st, newparent, now);
        let attr = attr_of(&st.inodes[&ino]);
        self.finish(st, txn)?;
        Ok(attr)
    }

    /// Whether `dir` is `anc` or lies below it.
    fn is_within(st: &State, mut dir: u64, anc: u64) -> bool {
        for _ in 0..=st.inodes.len() {
            if dir == anc {
                return true;
            }
            if dir == ROOT_INO {
                return false;
            }
            match st.inodes.get(&dir) {
                Some(i) => dir = i.rec.parent,
                None => return false,
            }
        }
        false
    }

    pub fn rename(&self, p1: u64, n1: &[u8], p2: u64, n2: &[u8], flags: RenameFlags) -> Result<()> {
        check_name(n1)?;
        check_name(n2)?;
        let mut st = self.write_state()?;
        let st = &mut *st;
        let src = st.dir(p1)?.get(n1).ok_or(FsError::NotFound)?;
        let dst = st.dir(p2)?.get(n2);
        let src_dir = st.inode(src.ino)?.rec.is_dir();
        let now = Timespec::now();
        if flags.exchange {
            let dst = dst.ok_or(FsError::NotFound)?;
            let dst_dir = st.inode(dst.ino)?.rec.is_dir();
            if (src_dir && Self::is_within(st, p2, src.ino))
                || (dst_dir && Self::is_within(st, p1, dst.ino))
            {
                return Err(FsError::Invalid(
                    "rename would move a directory below itself".into(),
                ));
            }
            if p1 == p2 && n1 == n2 {
                return Ok(());
            }
            let mut txn = Txn::new(OpType::Rename, src.ino);
            self.rewrite_dirent(st, &mut txn, p1, n1, dst.ino, dst.dtype)?;
            self.rewrite_dirent(st, &mut txn, p2, n2, src.ino, src.dtype)?;
            if p1 != p2 {
                if src_dir {
                    st.inode_mut(src.ino)?.rec.parent = p2;
                    dec(&mut st.inode_mut(p1)?.rec.nlink);
                    inc(&mut st.inode_mut(p2)?.rec.nlink);
                }
                if dst_dir {
                    st.inode_mut(dst.ino)?.rec.parent = p1;
                    dec(&mut st.inode_mut(p2)?.rec.nlink);
                    inc(&mut st.inode_mut(p1)?.rec.nlink);
                }
            }
            for i in [src.ino, dst.ino] {
                st.inode_mut(i)?.rec.ctime = now;
                txn.dirty.insert(i);
            }
            touch_dir(st, p1, now);
            touch_dir(st, p2, now);
            return self.finish(st, txn);
        }
        if let Some(d) = dst {
            if flags.noreplace {
                return Err(FsError::Exists);
            }
            if d.ino == src.ino {
                return Ok(()); // two links of one inode: POSIX says do nothing
            }
            let dst_dir = st.inode(d.ino)?.rec.is_dir();
            match (src_dir, dst_dir) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) if !st.dir(d.ino)?.is_empty() => return Err(FsError::NotEmpty),
                _ => {}
            }
        }
        if src_dir && Self::is_within(st, p2, src.ino) {
            return Err(FsError::Invalid(
                "rename would move a directory below itself".into(),
            ));
        }
        self.ensure_blocks(st, 4)?;
        let mut txn = Txn::new(OpType::Rename, src.ino);
        self.remove_dirent(st, &mut txn, p1, n1)?;
        match dst {
            Some(d) => {
                self.rewrite_dirent(st, &mut txn, p2, n2, src.ino, src.dtype)?;
                let dst_dir = st.inode(d.ino)?.rec.is_dir();
                self.drop_link(st, &mut txn, d.ino, now)?;
                if dst_dir {
                    dec(&mut st.inode_mut(p2)?.rec.nlink);
                }
            }
            None => self.add_dirent(st, &mut txn, p2, n2, src.ino, src.dtype)?,
        }
        if src_dir && p1 != p2 {
            st.inode_mut(src.ino)?.rec.parent = p2;
            dec(&mut st.inode_mut(p1)?.rec.nlink);
            inc(&mut st.inode_mut(p2)?.rec.nlink);
        }
        st.inode_mut(src.ino)?.rec.ctime = now;
        txn.dirty.insert(src.ino);
        touch_dir(st, p1, now);
        touch_dir(st, p2, now);
        self.finish(st, txn)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let st = self.read_state();
        let i = st.inode(ino)?;
        if !i.rec.is_symlink() {
            return Err(FsError::Invalid("not a symlink".into()));
        }
        let b = i
            .map
            .get(0)
            .ok_or_else(|| FsError::Corrupt(format!("symlink {ino} has no block")))?;
        let len = (i.rec.size as usize).min(MAX_SYMLINK);
        // SAFETY: mapped data blocks are never written in place (copy-on-write), and the
        // read lock keeps the block from being freed.
        Ok(unsafe { self.region.slice((b * BLOCK_U64) as usize, len) }.to_vec())
    }

    /// Directory entries from `cookie` on (0 = start); `f` returns false to stop.
    pub fn readdir(
        &self,
        ino: u64,
        cookie: u64,
        mut f: impl FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let st = self.read_state();
        let dir = st.dir(ino)?;
        let from = u32::try_from(cookie).unwrap_or(u32::MAX);
        for (name, e) in dir.iter_from(from) {
            let de = DirEntry {
                name: name.to_vec(),
                ino: e.ino,
                dtype: e.dtype,
                next: e.pos as u64 + 1,
            };
            if !f(de) {
                break;
            }
        }
        Ok(())
    }

    /// Number of entries in a directory (without "." and "..").
    pub fn dir_len(&self, ino: u64) -> Result<usize> {
        Ok(self.read_state().dir(ino)?.len())
    }

    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        if let Some(size) = set.size {
            self.truncate(ino, size)?;
        }
        if set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.atime.is_none()
            && set.mtime.is_none()
        {
            return self.getattr(ino);
        }
        let mut st = self.write_state()?;
        let st = &mut *st;
        let now = Timespec::now();
        let i = st.inode_mut(ino)?;
        if let Some(m) = set.mode {
            i.rec.mode = (i.rec.mode & S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = set.uid {
            i.rec.uid = u;
        }
        if let Some(g) = set.gid {
            i.rec.gid = g;
        }
        if let Some(t) = set.atime {
            i.rec.atime = resolve(t, now);
        }
        if let Some(t) = set.mtime {
            i.rec.mtime = resolve(t, now);
        }
        i.rec.ctime = now;
        let attr = attr_of(i);
        let mut txn = Txn::new(OpType::SetAttr, ino);
        txn.dirty.insert(ino);
        self.finish(st, txn)?;
        Ok(attr)
    }

    pub fn statfs(&self) -> StatFs {
        let st = self.read_state();
        StatFs {
            blocks: self.geo.data_blocks,
            bfree: st.balloc.free_count() + st.deferred_frees.len() as u64,
            files: self.geo.inode_count,
            ffree: st.ialloc.free_count(),
            bsize: BLOCK as u32,
            namelen: NAME_MAX as u32,
        }
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.read_state();
        st.inode(ino)?
            .xattrs
            .get(name)
            .cloned()
            .ok_or(FsError::NoXattr)
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .read_state()
            .inode(ino)?
            .xattrs
            .keys()
            .cloned()
            .collect())
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], mode: XattrMode) -> Result<()> {
        if name.is_empty() || name.len() > 255 || name.contains(&0) {
            return Err(FsError::Invalid(
                "xattr name must be 1..255 bytes without NUL".into(),
            ));
        }
        if value.len() > BLOCK {
            return Err(FsError::NoSpaceXattr);
        }
        let mut st = self.write_state()?;
        let i = st.inode(ino)?;
        let exists = i.xattrs.contains_key(name);
        match mode {
            XattrMode::Create if exists => return Err(FsError::Exists),
            XattrMode::Replace if !exists => return Err(FsError::NoXattr),
            _ => {}
        }
        let mut x = i.xattrs.clone();
        x.insert(name.to_vec(), value.to_vec());
        if xattrs_size(&x) > BLOCK {
            return Err(FsError::NoSpaceXattr);
        }
        self.store_xattrs(&mut st, ino, x, OpType::SetXattr)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        let mut st = self.write_state()?;
        let mut x = st.inode(ino)?.xattrs.clone();
        if x.remove(name).is_none() {
            return Err(FsError::NoXattr);
        }
        self.store_xattrs(&mut st, ino, x, OpType::RemoveXattr)
    }

    /// Copy-on-write the xattr block: a new block with the new set, then one record
    /// switches the inode to it.
    fn store_xattrs(
        &self,
        st: &mut State,
        ino: u64,
        x: BTreeMap<Vec<u8>, Vec<u8>>,
        op: OpType,
    ) -> Result<()> {
        self.ensure_blocks(st, 1)?;
        let mut txn = Txn::new(op, ino);
        let new_block = if x.is_empty() {
            0
        } else {
            let bytes = encode_xattrs(&x)?;
            let b = st.balloc.alloc_one()?;
            let off = (b * BLOCK_U64) as usize;
            self.region.write(off, &bytes);
            self.region.flush(off, bytes.len());
            b
        };
        let i = st.inode_mut(ino)?;
        if i.rec.xattr_block != 0 {
            txn.releases.push(i.rec.xattr_block);
        }
        i.rec.xattr_block = new_block;
        i.xattrs = x;
        i.rec.ctime = Timespec::now();
        txn.dirty.insert(ino);
        self.finish(st, txn)
    }
}

fn touch_dir(st: &mut State, dir: u64, now: Timespec) {
    if let Some(d) = st.inodes.get_mut(&dir) {
        d.rec.mtime = now;
        d.rec.ctime = now;
    }
}

/// Link counts from an image that fsck has not vetted must not wrap.
fn dec(n: &mut u32) {
    *n = n.saturating_sub(1);
}

fn inc(n: &mut u32) {
    *n = n.saturating_add(1);
}
