//! Namespace operations: lookup, create, mkdir, symlink, link, unlink, rmdir, rename,
//! readdir, readlink. Each change is one transaction (one log entry), so multi-inode
//! operations (rename, link, unlink of the last link) are all-or-nothing, and each
//! checks everything and reserves what it needs before it changes anything.

use crate::acl;
use crate::commit::{Sink, Txn, DIRENT_RECORD, ENTRY_OVERHEAD, INODE_RECORD};
use crate::dir::{Dir, Entry};
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::FileMap;
use crate::ops::{attr_of, Attr, DirEntry, MAX_LINKS, MAX_SYMLINK};
use crate::perm::{self, MAY_EXEC};
use crate::pm::BlockNo;
use crate::trace::Traced;
use crate::volume::{Inode, State, Volume};
use std::collections::BTreeMap;
use zcfs_types::Cred;

/// Where a new directory entry goes: a free place in an existing block, or a new block
/// (whose map change was planned and whose blocks are reserved).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Room {
    At(u32),
    NewBlock,
}

/// What a new node is, and who makes it.
struct NewNode<'a> {
    op: OpType,
    mode: u32,
    cred: &'a Cred,
    rdev: u32,
    symlink: Option<&'a [u8]>,
}

impl Volume {
    /// Look `name` up in `parent`: the caller needs search permission on `parent`.
    pub fn lookup(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<Attr> {
        self.lookup_inner(cred, parent, name, false)
    }

    /// `lookup`, taking one reference to the inode found (see `hold`).
    pub fn lookup_held(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<Attr> {
        self.lookup_inner(cred, parent, name, true)
    }

    fn lookup_inner(&self, cred: &Cred, parent: u64, name: &[u8], hold: bool) -> Result<Attr> {
        check_name(name)?;
        let st = self.read_state();
        let d = st.dir(parent)?;
        perm::check(cred, st.inode(parent)?, MAY_EXEC)?;
        let e = d.get(name).ok_or(FsError::NotFound)?;
        let a = attr_of(st.inode(e.ino)?);
        if hold {
            self.add_ref(e.ino);
        }
        Ok(a)
    }

    /// Parent of a directory (for ".."), for a caller with search permission on it.
    pub fn parent_of(&self, cred: &Cred, dir: u64) -> Result<u64> {
        let st = self.read_state();
        st.dir(dir)?;
        let inode = st.inode(dir)?;
        perm::check(cred, inode, MAY_EXEC)?;
        Ok(inode.rec.parent)
    }

    /// Create a non-directory node (regular file, fifo, socket, device), owned by the
    /// caller (group: see `perm::new_inode_owner`).
    pub fn create(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        self.create_inner(cred, parent, name, mode, rdev, false)
    }

    /// `create`, taking one reference to the new inode.
    pub fn create_held(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        self.create_inner(cred, parent, name, mode, rdev, true)
    }

    fn create_inner(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u32,
        hold: bool,
    ) -> Result<Attr> {
        let kind = mode & S_IFMT;
        let mode = if kind == 0 { mode | S_IFREG } else { mode };
        if !valid_file_type(mode) || mode & S_IFMT == S_IFDIR || mode & S_IFMT == S_IFLNK {
            return Err(FsError::Invalid(format!("create with mode {mode:o}")));
        }
        perm::check_mknod(cred, mode & S_IFMT)?;
        let node = NewNode {
            op: OpType::Create,
            mode,
            cred,
            rdev,
            symlink: None,
        };
        self.make_node(parent, name, node, hold)
    }

    pub fn mkdir(&self, cred: &Cred, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.mkdir_inner(cred, parent, name, mode, false)
    }

    /// `mkdir`, taking one reference to the new directory.
    pub fn mkdir_held(&self, cred: &Cred, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.mkdir_inner(cred, parent, name, mode, true)
    }

    fn mkdir_inner(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        mode: u32,
        hold: bool,
    ) -> Result<Attr> {
        let node = NewNode {
            op: OpType::Mkdir,
            mode: S_IFDIR | (mode & 0o7777),
            cred,
            rdev: 0,
            symlink: None,
        };
        self.make_node(parent, name, node, hold)
    }

    pub fn symlink(&self, cred: &Cred, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        self.symlink_inner(cred, parent, name, target, false)
    }

    /// `symlink`, taking one reference to the new inode.
    pub fn symlink_held(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr> {
        self.symlink_inner(cred, parent, name, target, true)
    }

    fn symlink_inner(
        &self,
        cred: &Cred,
        parent: u64,
        name: &[u8],
        target: &[u8],
        hold: bool,
    ) -> Result<Attr> {
        if target.is_empty() || target.len() > MAX_SYMLINK || target.contains(&0) {
            return Err(FsError::Invalid(
                "symlink target must be 1..4095 bytes without NUL".into(),
            ));
        }
        let node = NewNode {
            op: OpType::Symlink,
            mode: S_IFLNK | 0o777,
            cred,
            rdev: 0,
            symlink: Some(target),
        };
        self.make_node(parent, name, node, hold)
    }

    /// Where a name of `len` bytes goes in `dir`, and what that costs: blocks to
    /// reserve and redo bytes.
    pub(crate) fn plan_room(st: &mut State, dir: u64, len: usize) -> (Room, u64, u64) {
        let d = st.dirs.get_mut(&dir).expect("checked to be a directory");
        match d.find_room(len) {
            Some(pos) => (Room::At(pos), 0, 0),
            None => {
                let plan = st.inodes[&dir].map.plan_set(d.blocks() as u64, 1);
                (Room::NewBlock, 1 + plan.new_nodes, plan.record_bytes(1))
            }
        }
    }

    /// Check that `dir` is a live directory (not removed while still referenced).
    pub(crate) fn live_dir(st: &State, dir: u64) -> Result<()> {
        st.dir(dir)?;
        if st.inode(dir)?.rec.nlink == 0 {
            return Err(FsError::NotFound);
        }
        Ok(())
    }

    fn make_node(&self, parent: u64, name: &[u8], n: NewNode<'_>, hold: bool) -> Result<Attr> {
        check_name(name)?;
        let mut g = self.write_state()?;
        let st = &mut *g;
        // Check, in Linux's order: search the parent, the name must be new, then
        // write permission on the parent.
        Self::live_dir(st, parent)?;
        let pnode = st.inode(parent)?;
        let prec = &pnode.rec;
        perm::check(n.cred, pnode, MAY_EXEC)?;
        if st.dir(parent)?.get(name).is_some() {
            return Err(FsError::Exists);
        }
        perm::check_dir_change(n.cred, pnode, None)?;
        let (uid, gid, mode) = perm::new_inode_owner(n.cred, prec, n.mode);
        let is_dir = n.mode & S_IFMT == S_IFDIR;
        // The directory's default ACL, or else the caller's umask, shapes the mode
        // (`posix_acl_create`); a symbolic link takes neither.
        let (mode, xattrs) = if n.symlink.is_some() {
            (mode, BTreeMap::new())
        } else {
            inherited(pnode, mode, n.cred.umask, is_dir)?
        };
        let xattr_blocks = crate::ops::xattr_blocks(&xattrs)?;
        if is_dir && st.inode(parent)?.rec.nlink >= MAX_LINKS {
            return Err(FsError::TooManyLinks);
        }
        self.reserve_inode(st)?;
        let (room, room_blocks, room_bytes) = Self::plan_room(st, parent, name.len());
        let mut txn = Txn::new(n.op, 0);
        self.reserve_log(
            &mut txn,
            ENTRY_OVERHEAD + 2 * INODE_RECORD + DIRENT_RECORD + room_bytes,
        )?;
        self.reserve_blocks(
            st,
            &mut txn,
            room_blocks + n.symlink.is_some() as u64 + xattr_blocks,
        )?;
        // Apply.
        let mut inode = fresh_inode(
            st,
            &mut txn,
            InodeRec {
                mode,
                uid,
                gid,
                nlink: if is_dir { 2 } else { 1 },
                rdev: n.rdev,
                parent: if is_dir { parent } else { 0 },
                ..Default::default()
            },
        );
        let (ino, now) = (inode.rec.ino, inode.rec.ctime);
        if let Some(target) = n.symlink {
            let b = txn.take_block();
            self.fresh_write(&b, 0, target);
            self.fresh_zero(&b, target.len(), BLOCK - target.len());
            self.fresh_flush(&b, 0, BLOCK);
            txn.data_addr = b.no().at(0).0;
            txn.data_size = target.len() as u64;
            let mut sink = Sink {
                vol: self,
                txn: &mut txn,
            };
            inode.map.set(0, b.publish(), &mut sink);
            inode.rec.size = target.len() as u64;
        }
        st.inodes.insert(ino, inode);
        if !xattrs.is_empty() {
            self.put_xattrs(st, &mut txn, ino, xattrs);
        }
        if is_dir {
            st.dirs.insert(ino, Dir::default());
        }
        txn.dirty.insert(ino);
        self.add_dirent(st, &mut txn, parent, name, ino, dtype_of(mode), room);
        let p = st.inodes.get_mut(&parent).expect("checked");
        if is_dir {
            p.rec.link_added();
        }
        p.rec.mtime = now;
        p.rec.ctime = now;
        let attr = attr_of(&st.inodes[&ino]);
        self.trace(|| Traced::Create {
            parent,
            name: name.to_vec(),
            ino,
            mode,
        });
        self.finish(st, txn)?;
        if hold {
            self.add_ref(ino);
        }
        Ok(attr)
    }

    /// Insert a directory entry at its planned place (a new block comes from the
    /// reserved blocks).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_dirent(
        &self,
        st: &mut State,
        txn: &mut Txn,
        parent: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
        room: Room,
    ) {
        let dir = st.dirs.get_mut(&parent).expect("checked");
        // A removal in the same transaction may have made room since the plan.
        let pos = match (room, dir.find_room(name.len())) {
            (Room::At(p), _) | (Room::NewBlock, Some(p)) => p,
            (Room::NewBlock, None) => {
                let bi = dir.blocks() as u64;
                let b = txn.take_block();
                self.fresh_zero(&b, 0, BLOCK);
                self.fresh_flush(&b, 0, BLOCK);
                let pi = st.inodes.get_mut(&parent).expect("checked");
                let mut sink = Sink { vol: self, txn };
                let replaced = pi.map.set(bi, b.publish(), &mut sink);
                assert!(
                    replaced.is_none(),
                    "a new directory block over a mapped one"
                );
                pi.rec.size = (bi + 1) * BLOCK_U64;
                txn.dirty.insert(parent);
                (bi as usize * UNITS_PER_BLOCK) as u32
            }
        };
        let dir = st.dirs.get_mut(&parent).expect("checked");
        assert!(
            dir.insert(name, Entry { ino, dtype, pos }),
            "directory entry placed over another"
        );
        let addr = self.dirent_addr(st, parent, pos);
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
    }

    /// PM address of the entry at `pos` of a directory. Every position the index holds
    /// lies in a mapped block (the index is built from the blocks).
    fn dirent_addr(&self, st: &State, dir: u64, pos: u32) -> u64 {
        let bi = pos as u64 / UNITS_PER_BLOCK as u64;
        let unit = pos as u64 % UNITS_PER_BLOCK as u64;
        let b = st.inodes[&dir]
            .map
            .get(bi)
            .expect("directory index points into a mapped block");
        b * BLOCK_U64 + unit * DIRENT_UNIT as u64
    }

    pub(crate) fn remove_dirent(
        &self,
        st: &mut State,
        txn: &mut Txn,
        parent: u64,
        name: &[u8],
    ) -> Entry {
        let e = st
            .dirs
            .get_mut(&parent)
            .and_then(|d| d.remove(name))
            .expect("checked to exist");
        let addr = self.dirent_addr(st, parent, e.pos);
        txn.push_zero(addr, dirent_units(name.len()) * DIRENT_UNIT);
        txn.dirty.insert(parent);
        e
    }

    pub(crate) fn rewrite_dirent(
        &self,
        st: &mut State,
        txn: &mut Txn,
        parent: u64,
        name: &[u8],
        ino: u64,
        dtype: u8,
    ) {
        let e = st
            .dirs
            .get_mut(&parent)
            .and_then(|d| d.retarget(name, ino, dtype))
            .expect("checked to exist");
        let addr = self.dirent_addr(st, parent, e.pos);
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
    }

    /// Drop one link of `ino`. On the last link the inode is freed with its blocks —
    /// unless something still references it (an open file, a kernel's lookup): then
    /// it lives on as an orphan (link count 0) until the last reference goes, and a
    /// crash before that leaves it for the next mount to reclaim.
    pub(crate) fn drop_link(&self, st: &mut State, txn: &mut Txn, ino: u64, now: Time) {
        let held = self.is_referenced(ino);
        let inode = st.inodes.get_mut(&ino).expect("checked");
        let last = inode.rec.is_dir() || inode.rec.nlink <= 1;
        txn.dirty.insert(ino);
        inode.rec.ctime = now;
        if !last {
            inode.rec.link_dropped();
        } else if held {
            inode.rec.nlink = 0;
        } else {
            self.free_inode(st, txn, ino);
        }
    }

    /// Free an inode and every block it owns, in `txn`. The map is released without
    /// redo records: once the inode's slot is free nothing points at its blocks.
    pub(crate) fn free_inode(&self, st: &mut State, txn: &mut Txn, ino: u64) {
        txn.dirty.insert(ino);
        st.drop_reserve(ino);
        st.linkable.remove(&ino);
        let Some(mut inode) = st.inodes.remove(&ino) else {
            return;
        };
        st.dirs.remove(&ino);
        let mut sink = Sink { vol: self, txn };
        inode.map.clear(&mut sink);
        txn.releases.extend_from_slice(&inode.xattr_blocks);
        st.ialloc.insert(ino);
    }

    /// Remove a name of a non-directory; returns the inode's attributes afterwards.
    pub fn unlink(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<Attr> {
        self.remove_name(cred, parent, name, false)
    }

    /// Remove an empty directory; returns its attributes afterwards (link count 0).
    pub fn rmdir(&self, cred: &Cred, parent: u64, name: &[u8]) -> Result<Attr> {
        self.remove_name(cred, parent, name, true)
    }

    /// unlink (`dir` false) or rmdir (`dir` true): check, then remove the entry and drop
    /// the link in one transaction. Returns the inode's attributes afterwards.
    fn remove_name(&self, cred: &Cred, parent: u64, name: &[u8], dir: bool) -> Result<Attr> {
        check_name(name)?;
        let mut g = self.write_state()?;
        let st = &mut *g;
        let d = st.dir(parent)?;
        let pnode = st.inode(parent)?;
        perm::check(cred, pnode, MAY_EXEC)?;
        let e = d.get(name).ok_or(FsError::NotFound)?;
        perm::check_dir_change(cred, pnode, Some(&st.inode(e.ino)?.rec))?;
        if dir {
            if !st.dir(e.ino)?.is_empty() {
                return Err(FsError::NotEmpty);
            }
            if st.inode(parent)?.rec.nlink < 3 {
                return Err(FsError::Corrupt(format!(
                    "directory {parent} has a subdirectory but a link count below 3"
                )));
            }
        } else if st.inode(e.ino)?.rec.is_dir() {
            return Err(FsError::IsDir);
        }
        let op = if dir { OpType::Rmdir } else { OpType::Unlink };
        let mut txn = Txn::new(op, e.ino);
        self.reserve_log(&mut txn, ENTRY_OVERHEAD + DIRENT_RECORD + 2 * INODE_RECORD)?;
        let now = Time::now();
        self.remove_dirent(st, &mut txn, parent, name);
        let mut after = attr_of(&st.inodes[&e.ino]);
        self.drop_link(st, &mut txn, e.ino, now);
        if dir {
            st.inodes
                .get_mut(&parent)
                .expect("checked")
                .rec
                .link_dropped();
        }
        touch_dir(st, parent, now);
        match st.inodes.get(&e.ino) {
            Some(i) => after = attr_of(i),
            None => {
                after.nlink = 0;
                after.ctime = now;
            }
        }
        let (parent, name) = (parent, name.to_vec());
        self.trace(|| match dir {
            true => Traced::Rmdir { parent, name },
            false => Traced::Unlink { parent, name },
        });
        self.finish(st, txn)?;
        Ok(after)
    }

    pub fn link(&self, cred: &Cred, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.link_inner(cred, ino, newparent, newname, false)
    }

    /// `link`, taking one reference to the inode.
    pub fn link_held(&self, cred: &Cred, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.link_inner(cred, ino, newparent, newname, true)
    }

    fn link_inner(
        &self,
        cred: &Cred,
        ino: u64,
        newparent: u64,
        newname: &[u8],
        hold: bool,
    ) -> Result<Attr> {
        check_name(newname)?;
        let mut g = self.write_state()?;
        let st = &mut *g;
        let i = st.inode(ino)?;
        let (is_dir, nlink, dtype) = (i.rec.is_dir(), i.rec.nlink, dtype_of(i.rec.mode));
        let d = st.dir(newparent)?;
        let pnode = st.inode(newparent)?;
        perm::check(cred, pnode, MAY_EXEC)?;
        // Linux order (do_linkat): the new name's existence, the source (protected
        // hardlinks), then permission on the directory and the source's type.
        if d.get(newname).is_some() {
            return Err(FsError::Exists);
        }
        perm::check_link_source(cred, st.inode(ino)?)?;
        perm::check_dir_change(cred, pnode, None)?;
        if is_dir {
            return Err(FsError::NotPermitted("hard link to a directory".into()));
        }
        // Unlinked while open: no new names; an O_TMPFILE file gets its first one.
        if nlink == 0 && !st.linkable.contains(&ino) {
            return Err(FsError::NotFound);
        }
        Self::live_dir(st, newparent)?;
        if nlink >= MAX_LINKS {
            return Err(FsError::TooManyLinks);
        }
        let (room, room_blocks, room_bytes) = Self::plan_room(st, newparent, newname.len());
        let mut txn = Txn::new(OpType::Link, ino);
        self.reserve_log(
            &mut txn,
            ENTRY_OVERHEAD + DIRENT_RECORD + 2 * INODE_RECORD + room_bytes,
        )?;
        self.reserve_blocks(st, &mut txn, room_blocks)?;
        let now = Time::now();
        self.add_dirent(st, &mut txn, newparent, newname, ino, dtype, room);
        st.linkable.remove(&ino);
        let i = st.inodes.get_mut(&ino).expect("checked");
        i.rec.link_added();
        i.rec.ctime = now;
        txn.dirty.insert(ino);
        touch_dir(st, newparent, now);
        let attr = attr_of(&st.inodes[&ino]);
        self.trace(|| Traced::Link {
            ino,
            parent: newparent,
            name: newname.to_vec(),
        });
        self.finish(st, txn)?;
        if hold {
            self.add_ref(ino);
        }
        Ok(attr)
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
        Ok(self.live(&*st, BlockNo(b), 0, len).to_vec())
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
                gen: st.inodes.get(&e.ino).map_or(0, |i| i.rec.gen),
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
}

pub(crate) fn touch_dir(st: &mut State, dir: u64, now: Time) {
    if let Some(d) = st.inodes.get_mut(&dir) {
        d.rec.mtime = now;
        d.rec.ctime = now;
    }
}

/// The mode and ACL xattrs of a new inode in directory `dir` (`posix_acl_create`): the
/// directory's default ACL, or else `umask`, shapes `mode`.
pub(crate) fn inherited(
    dir: &Inode,
    mode: u32,
    umask: u32,
    is_dir: bool,
) -> Result<(u32, crate::ops::Xattrs)> {
    let dir_default = dir.xattrs.get(acl::DEFAULT_XATTR).map(|v| &v[..]);
    let inh = acl::inherit(dir_default, mode, umask, is_dir)?;
    let mut x = BTreeMap::new();
    if let Some(a) = inh.access {
        x.insert(acl::ACCESS_XATTR.to_vec(), a);
    }
    if let Some(d) = inh.default {
        x.insert(acl::DEFAULT_XATTR.to_vec(), d);
    }
    Ok((inh.mode, x))
}

/// A new inode in a slot checked to be free (`reserve_inode`): `fields` with its
/// number, the slot's next generation and the times set to now; `txn` is its entry.
pub(crate) fn fresh_inode(st: &mut State, txn: &mut Txn, fields: InodeRec) -> Inode {
    let ino = st
        .ialloc
        .alloc()
        .expect("an inode slot was checked to be free");
    txn.ino = ino;
    let now = Time::now();
    let gen = st.gens[(ino - 1) as usize].wrapping_add(1).max(1);
    st.gens[(ino - 1) as usize] = gen;
    Inode {
        rec: InodeRec {
            ino,
            gen,
            atime: now,
            mtime: now,
            ctime: now,
            ..fields
        },
        map: FileMap::default(),
        xattrs: BTreeMap::new(),
        xattr_blocks: Vec::new(),
    }
}
