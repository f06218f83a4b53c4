//! O_TMPFILE: a regular file that no directory names, made for its creator's open file
//! and given a name later with linkat(2) (or never, and then freed on the last close).
//!
//! The new inode is an orphan from birth (link count 0, see refs.rs), held by the
//! caller's reference; a crash before it is linked leaves it for the next mount to free
//! with the other orphans. Linux lets such a file be linked (`I_LINKABLE`) unless it was
//! opened with O_EXCL, and only until its first link: an inode whose link count drops to
//! 0 otherwise (unlinked while open) takes no new names. The volume keeps that mark in
//! DRAM (`State::linkable`): after a crash the orphan is gone anyway.

use crate::commit::{Txn, ENTRY_OVERHEAD, INODE_RECORD};
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::names::{fresh_inode, inherited};
use crate::ops::{attr_of, Attr};
use crate::perm;
use crate::trace::Traced;
use crate::volume::Volume;
use zcfs_types::Cred;

impl Volume {
    /// Make a regular file in directory `parent` that no directory names (link count
    /// 0), taking one reference to it: the caller's open file. Permission, owner and
    /// group as for `create` (write and search on `parent`; the group of a set-group-ID
    /// directory); `mode`'s permission bits are masked by the caller's umask, or by the
    /// directory's default ACL, which the file inherits (as `create`). With `linkable` the
    /// file may be given its first name with `link` (Linux: O_TMPFILE without O_EXCL).
    pub fn tmpfile_held(
        &self,
        cred: &Cred,
        parent: u64,
        mode: u32,
        linkable: bool,
    ) -> Result<Attr> {
        let kind = mode & S_IFMT;
        if kind != 0 && kind != S_IFREG {
            return Err(FsError::Invalid(format!("tmpfile with mode {mode:o}")));
        }
        let mode = S_IFREG | (mode & 0o7777);
        let mut g = self.write_state()?;
        let st = &mut *g;
        // vfs_tmpfile: the parent must be a directory the caller may write and search.
        st.dir(parent)?;
        let pnode = st.inode(parent)?;
        perm::check_dir_change(cred, pnode, None)?;
        let (uid, gid, mode) = perm::new_inode_owner(cred, &pnode.rec, mode);
        let (mode, xattrs) = inherited(pnode, mode, cred.umask, false)?;
        let xattr_blocks = crate::ops::xattr_blocks(&xattrs)?;
        self.reserve_inode(st)?;
        let mut txn = Txn::new(OpType::Create, 0);
        self.reserve_log(&mut txn, ENTRY_OVERHEAD + INODE_RECORD)?;
        self.reserve_blocks(st, &mut txn, xattr_blocks)?;
        // Apply.
        let inode = fresh_inode(
            st,
            &mut txn,
            InodeRec {
                mode,
                uid,
                gid,
                nlink: 0,
                ..Default::default()
            },
        );
        let ino = inode.rec.ino;
        st.inodes.insert(ino, inode);
        if !xattrs.is_empty() {
            self.put_xattrs(st, &mut txn, ino, xattrs);
        }
        if linkable {
            st.linkable.insert(ino);
        }
        txn.dirty.insert(ino);
        let attr = attr_of(&st.inodes[&ino]);
        self.trace(|| Traced::TmpFile { ino, mode });
        self.finish(st, txn)?;
        // Still under the state lock: nothing can free the orphan before it is held. A
        // failed commit (the volume turns read-only) leaves it to the next mount's reaping.
        self.add_ref(ino);
        Ok(attr)
    }
}
