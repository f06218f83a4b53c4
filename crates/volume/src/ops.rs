//! The types of the volume's API, and the attribute operations (getattr, setattr,
//! xattrs, statfs). Namespace operations are in `names.rs`, inode references in
//! `refs.rs`. Each change is one transaction (one log entry): all or nothing.

use crate::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
use crate::commit::{Txn, ENTRY_OVERHEAD, INODE_RECORD};
use crate::dir::Dir;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::perm;
use crate::trace::Traced;
use crate::volume::{Inode, State, Volume};
use std::collections::BTreeMap;
use zcfs_types::Cred;
pub use zcfs_types::{Attr, SetAttr, SetTime, StatFs};

/// A file's capabilities (`cap_inode_setxattr`), which a write, truncate, fallocate or
/// change of owner removes, whoever makes it (`Volume::kill_capability`).
pub const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// What authorizes a setattr's size change: the caller's write permission on the file
/// (truncate(2)), or a handle the caller opened for writing (ftruncate(2)), which was
/// checked at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeRight {
    Permission,
    WritableHandle,
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
    /// Generation of the inode when the entry was read, so a caller that acts on the
    /// entry later (takes a reference, say) can tell a reused number apart.
    pub gen: u32,
    pub dtype: u8,
    /// Cookie to continue after this entry.
    pub next: u64,
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
    let blocks = i.owned_blocks();
    Attr {
        ino: r.ino,
        generation: r.gen as u64,
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
        no_xattrs: i.xattr_blocks.is_empty(),
    }
}

/// An inode's extended attributes, by name.
pub(crate) type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// Blocks an xattr set takes on PM (checked before anything changes).
pub(crate) fn xattr_blocks(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<u64> {
    Ok(encode_set(x)?.map_or(0, |e| e.blocks()))
}

/// The on-PM form of an xattr set; none for an empty set.
fn encode_set(x: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<Option<EncodedXattrs>> {
    if x.is_empty() {
        Ok(None)
    } else {
        encode_xattr_set(x).map(Some)
    }
}

/// Setting (`value`) or removing an ACL xattr of `inode`, as `set_posix_acl` and a
/// file system's `set_acl` do it: the inode's new xattr set, and its new mode when
/// the access ACL changes. An access ACL the mode bits can say entirely is not kept;
/// the mode takes the ACL's owner, group-class and other bits, and loses set-group-ID
/// when the setter is neither in the file's group nor privileged. A default ACL only
/// on a directory; one of only its header means none.
fn acl_change(
    cred: &Cred,
    inode: &Inode,
    name: &[u8],
    value: Option<&[u8]>,
) -> Result<(Xattrs, Option<u32>)> {
    let rec = &inode.rec;
    let acl = match value {
        Some(v) if v.len() > 4 => Some(Acl::decode(v)?),
        Some(v) => {
            Acl::decode_header(v)?;
            None
        }
        None => None,
    };
    let mut x = inode.xattrs.clone();
    if name == DEFAULT_XATTR {
        if !rec.is_dir() {
            return if acl.is_some() {
                Err(FsError::AccessDenied(
                    "only a directory has a default ACL".into(),
                ))
            } else {
                Ok((x, None))
            };
        }
        match acl {
            Some(a) => x.insert(name.to_vec(), a.encode()),
            None => x.remove(name),
        };
        return Ok((x, None));
    }
    let Some(a) = acl else {
        x.remove(name);
        return Ok((x, None));
    };
    let (rwx, equiv) = a.equiv_mode();
    let mut mode = (rec.mode & !0o777) | rwx;
    if !(cred.is_root() || cred.in_group(rec.gid)) {
        mode &= !S_ISGID;
    }
    if equiv {
        x.remove(name);
    } else {
        x.insert(name.to_vec(), a.encode());
    }
    Ok((x, Some(mode)))
}

fn resolve(ts: SetTime, now: Time) -> Time {
    match ts {
        SetTime::Now => now,
        SetTime::At(t) => t,
    }
}

impl State {
    /// An inode by number. A number that names no inode is stale (it was freed, or
    /// never existed): ESTALE, which tells a kernel to look the name up again.
    pub(crate) fn inode(&self, ino: u64) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(FsError::Stale)
    }
    pub(crate) fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(FsError::Stale)
    }
    pub(crate) fn dir(&self, ino: u64) -> Result<&Dir> {
        match self.dirs.get(&ino) {
            Some(d) => Ok(d),
            None if self.inodes.contains_key(&ino) => Err(FsError::NotDir),
            None => Err(FsError::Stale),
        }
    }
}

/// Most links an inode may have (and subdirectories a directory, plus two), as ext4.
pub const MAX_LINKS: u32 = 65_000;

impl Volume {
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(attr_of(self.read_state().inode(ino)?))
    }

    /// A directory's name-set version and entry count, read together.
    pub fn dir_state(&self, ino: u64) -> Result<zcfs_types::DirState> {
        let st = self.read_state();
        let d = st.dir(ino)?;
        Ok(zcfs_types::DirState {
            version: d.version(),
            entries: d.len() as u64,
        })
    }

    /// May `cred` access `ino` for `mask` (`perm::MAY_*` bits; 0 asks only whether it
    /// exists)? access(2), and the check an open makes.
    pub fn access(&self, cred: &Cred, ino: u64, mask: u32) -> Result<()> {
        let st = self.read_state();
        perm::check(cred, st.inode(ino)?, mask)
    }

    /// Change attributes, as `cred` may (chmod and chown rules, times, truncate); a size
    /// change and the others commit as one entry. A chown drops set-user-ID and
    /// set-group-ID of a non-directory; a truncate by an unprivileged caller too.
    pub fn setattr(
        &self,
        cred: &Cred,
        ino: u64,
        set: &SetAttr,
        size_right: SizeRight,
    ) -> Result<Attr> {
        let mut g = self.write_state()?;
        let st = &mut *g;
        perm::check_setattr(
            cred,
            st.inode(ino)?,
            set,
            size_right == SizeRight::WritableHandle,
        )?;
        if set.is_empty() {
            return Ok(attr_of(st.inode(ino)?));
        }
        if let Some(size) = set.size {
            crate::data::truncate_blocks(st, ino, size)?; // before the capability goes
        }
        if set.size.is_some() || set.uid.is_some() || set.gid.is_some() {
            self.kill_capability(st, ino)?;
        }
        let inode = st.inode(ino)?;
        let rec = &inode.rec;
        let mut mode = match set.mode {
            Some(m) => (rec.mode & S_IFMT) | perm::chmod_mode(cred, rec, m & 0o7777),
            None => rec.mode,
        };
        if set.uid.is_some() || set.gid.is_some() {
            mode = perm::mode_after_chown(cred, mode, rec.gid);
        }
        if set.size.is_some() {
            let rec = InodeRec {
                mode,
                ..rec.clone()
            };
            mode = perm::mode_after_write(cred, &rec);
        }
        // A chmod rewrites the access ACL's owner, mask and other entries too
        // (`posix_acl_chmod`), in the same transaction.
        let acl_xattrs = match (set.mode, inode.xattrs.get(ACCESS_XATTR)) {
            (Some(_), Some(bytes)) => {
                let mut acl = Acl::decode(bytes)?;
                acl.chmod(mode);
                let mut x = inode.xattrs.clone();
                x.insert(ACCESS_XATTR.to_vec(), acl.encode());
                Some(x)
            }
            _ => None,
        };
        let mut txn = Txn::new(OpType::SetAttr, ino);
        self.reserve_log(
            &mut txn,
            ENTRY_OVERHEAD + INODE_RECORD + crate::data::TRUNCATE_RECORDS,
        )?;
        // Every check before the one reservation: a transaction dropped holding
        // blocks would leak them (and panics with the lock held).
        let mut blocks = 0;
        if let Some(x) = &acl_xattrs {
            blocks += xattr_blocks(x)?;
        }
        if let Some(size) = set.size {
            txn.op = OpType::Truncate;
            blocks += crate::data::truncate_blocks(st, ino, size)?;
        }
        if acl_xattrs.is_some() || set.size.is_some() {
            // The ACL rewrite gives its old blocks back: alone, it may use the
            // metadata reserve (a chmod must work on a full volume).
            let releasing = if set.size.is_none() {
                st.inode(ino)?.xattr_blocks.len() as u64
            } else {
                0
            };
            self.reserve_rewrite_blocks(st, &mut txn, blocks, releasing)?;
        }
        if let Some(size) = set.size {
            self.apply_truncate(st, &mut txn, ino, size);
        }
        if let Some(x) = acl_xattrs {
            self.put_xattrs(st, &mut txn, ino, x);
        }
        let now = Time::now();
        let i = st.inode_mut(ino).expect("checked");
        i.rec.mode = mode;
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
        txn.dirty.insert(ino);
        match set.size {
            Some(size) => self.trace(|| Traced::Truncate { ino, size }),
            None => self.trace(|| Traced::Attr { ino }),
        }
        self.finish(st, txn)?;
        Ok(attr)
    }

    pub fn statfs(&self) -> StatFs {
        let st = self.read_state();
        // Blocks promised to preallocated files count as used, as on ext4.
        // So does the metadata reserve (it is there for rewrites, not for data).
        let bfree = (st.balloc.free_count() + st.deferred_frees.len() as u64)
            .saturating_sub(st.reserved + self.metadata_reserve());
        StatFs {
            blocks: self.geo.data_blocks,
            bfree,
            bavail: bfree,
            files: self.geo.inode_count,
            ffree: st.ialloc.free_count(),
            bsize: BLOCK as u32,
            namelen: NAME_MAX as u32,
            frsize: BLOCK as u32,
        }
    }

    /// Remove `ino`'s file capability, if it has one, as a write, truncate, fallocate
    /// or change of owner of the file is made, as the kernel's `file_remove_privs` and
    /// ATTR_KILL_PRIV do for its own file systems (and as a FUSE file system that takes
    /// FUSE_HANDLE_KILLPRIV_V2 promises to): whoever makes the change, with no
    /// permission check of its own. Called under the state lock the change is made in,
    /// after its checks, so no setxattr comes between; a transaction of its own,
    /// ahead of the change's (not undone if the change then fails for want of space,
    /// as on Linux). Nothing but for a regular file that has one.
    pub(crate) fn kill_capability(&self, st: &mut State, ino: u64) -> Result<()> {
        let Ok(i) = st.inode(ino) else {
            return Ok(()); // the change itself reports a missing inode
        };
        if !i.rec.is_reg() || !i.xattrs.contains_key(CAPABILITY_XATTR) {
            return Ok(());
        }
        let mut x = i.xattrs.clone();
        x.remove(CAPABILITY_XATTR);
        self.store_xattrs(st, ino, x, None, OpType::RemoveXattr)
    }

    pub fn getxattr(&self, cred: &Cred, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let st = self.read_state();
        let i = st.inode(ino)?;
        perm::check_xattr(cred, i, name, false)?;
        i.xattrs.get(name).cloned().ok_or(FsError::NoXattr)
    }

    /// The names of `ino`'s extended attributes; trusted.* ones only for root. A list
    /// longer than `XATTR_LIST_MAX` (names and their NULs) is E2BIG, as the kernel
    /// answers it, rather than a list no caller could receive.
    pub fn listxattr(&self, cred: &Cred, ino: u64) -> Result<Vec<Vec<u8>>> {
        let names: Vec<Vec<u8>> = self
            .read_state()
            .inode(ino)?
            .xattrs
            .keys()
            .filter(|n| cred.bypasses_checks() || !n.starts_with(b"trusted."))
            .cloned()
            .collect();
        let len = names.iter().map(|n| n.len() + 1).sum::<usize>();
        if len > XATTR_LIST_MAX {
            return Err(FsError::XattrListTooBig(len));
        }
        Ok(names)
    }

    /// Set an extended attribute. Names are 1..=`XATTR_NAME_MAX` bytes without NUL
    /// (else ERANGE, as the kernel); values up to `XATTR_SIZE_MAX` (else E2BIG); the
    /// inode's whole set costs at most `XATTR_SET_MAX` (else ENOSPC, the set unchanged).
    pub fn setxattr(
        &self,
        cred: &Cred,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<()> {
        if name.is_empty() || name.len() > XATTR_NAME_MAX || name.contains(&0) {
            return Err(FsError::XattrNameRange);
        }
        if value.len() > XATTR_SIZE_MAX {
            return Err(FsError::XattrValueTooBig(value.len()));
        }
        let mut st = self.write_state()?;
        let i = st.inode(ino)?;
        perm::check_xattr(cred, i, name, true)?;
        if name == ACCESS_XATTR || name == DEFAULT_XATTR {
            let (x, mode) = acl_change(cred, i, name, Some(value))?;
            return self.store_xattrs(&mut st, ino, x, mode, OpType::SetXattr);
        }
        let exists = i.xattrs.contains_key(name);
        match mode {
            XattrMode::Create if exists => return Err(FsError::Exists),
            XattrMode::Replace if !exists => return Err(FsError::NoXattr),
            _ => {}
        }
        // A set over `XATTR_SET_MAX` is refused by its encoding, before any change.
        let mut x = i.xattrs.clone();
        x.insert(name.to_vec(), value.to_vec());
        self.store_xattrs(&mut st, ino, x, None, OpType::SetXattr)
    }

    pub fn removexattr(&self, cred: &Cred, ino: u64, name: &[u8]) -> Result<()> {
        let mut st = self.write_state()?;
        let i = st.inode(ino)?;
        let writer_drops_capability = name == CAPABILITY_XATTR
            && i.rec.is_reg()
            && perm::check(cred, i, perm::MAY_WRITE).is_ok();
        // Whoever may write a file may remove its capability: a write removes it
        // anyway, and the kernel's killpriv before a write through a FUSE mount asks as
        // the writer (`file_remove_privs`).
        if !writer_drops_capability {
            perm::check_xattr(cred, i, name, true)?;
        }
        if name == ACCESS_XATTR || name == DEFAULT_XATTR {
            if !i.xattrs.contains_key(name) {
                // As on Linux's own file systems: removing an ACL there is none of
                // succeeds (it sets "no ACL").
                return Ok(());
            }
            let (x, mode) = acl_change(cred, i, name, None)?;
            return self.store_xattrs(&mut st, ino, x, mode, OpType::RemoveXattr);
        }
        let mut x = i.xattrs.clone();
        if x.remove(name).is_none() {
            return Err(FsError::NoXattr);
        }
        self.store_xattrs(&mut st, ino, x, None, OpType::RemoveXattr)
    }

    /// Copy-on-write the xattr set: new blocks with the new set (the data blocks, then
    /// the index listing them, or one block for a small set), then one record switches
    /// the inode to them (with its new mode, when an ACL change moves it); the old
    /// blocks are released with the entry.
    fn store_xattrs(
        &self,
        st: &mut State,
        ino: u64,
        x: BTreeMap<Vec<u8>, Vec<u8>>,
        mode: Option<u32>,
        op: OpType,
    ) -> Result<()> {
        let enc = encode_set(&x)?;
        let mut txn = Txn::new(op, ino);
        self.reserve_log(&mut txn, ENTRY_OVERHEAD + INODE_RECORD)?;
        // A set that takes no more blocks than the one it replaces may use the
        // metadata reserve (removing or shrinking attributes works on a full volume).
        let releasing = st.inode(ino)?.xattr_blocks.len() as u64;
        let need = enc.as_ref().map_or(0, |e| e.blocks());
        self.reserve_rewrite_blocks(st, &mut txn, need, releasing)?;
        self.write_xattrs(st, &mut txn, ino, x, enc);
        let i = st.inode_mut(ino).expect("checked");
        if let Some(m) = mode {
            i.rec.mode = m;
        }
        i.rec.ctime = Time::now();
        self.trace(|| Traced::Attr { ino });
        self.finish(st, txn)
    }

    /// Write `x` as `ino`'s xattr set into fresh blocks (reserved in `txn`: see
    /// `xattr_blocks`) and switch the inode to them, releasing the old ones.
    pub(crate) fn put_xattrs(
        &self,
        st: &mut State,
        txn: &mut Txn,
        ino: u64,
        x: BTreeMap<Vec<u8>, Vec<u8>>,
    ) {
        let enc = encode_set(&x).expect("sized by xattr_blocks");
        self.write_xattrs(st, txn, ino, x, enc);
    }

    fn write_xattrs(
        &self,
        st: &mut State,
        txn: &mut Txn,
        ino: u64,
        x: BTreeMap<Vec<u8>, Vec<u8>>,
        enc: Option<EncodedXattrs>,
    ) {
        let blocks = match &enc {
            None => Vec::new(),
            Some(EncodedXattrs::Single(bytes)) => vec![self.fresh_block_with(txn, bytes)],
            Some(e @ EncodedXattrs::Stream { padded, .. }) => {
                let data: Vec<u64> = padded
                    .chunks(BLOCK)
                    .map(|c| self.fresh_block_with(txn, c))
                    .collect();
                let index = e.index_block(&data);
                let mut all = vec![self.fresh_block_with(txn, &index)];
                all.extend(data);
                all
            }
        };
        let i = st.inode_mut(ino).expect("checked");
        txn.releases.extend_from_slice(&i.xattr_blocks);
        i.set_xattr_blocks(blocks);
        i.xattrs = x;
        txn.dirty.insert(ino);
    }

    /// A reserved block of `txn` holding `bytes` (at most a block), written back.
    fn fresh_block_with(&self, txn: &mut Txn, bytes: &[u8]) -> u64 {
        let b = txn.take_block();
        self.fresh_write(&b, 0, bytes);
        self.fresh_flush(&b, 0, bytes.len());
        b.publish()
    }
}
