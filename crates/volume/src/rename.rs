//! rename(2): moving a name within or between directories, replacing or exchanging
//! what is there, as one transaction; the loop check for directories and the
//! permission checks of `vfs_rename`.

use crate::commit::{Txn, DIRENT_RECORD, ENTRY_OVERHEAD, INODE_RECORD};
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::names::{touch_dir, Room};
use crate::ops::{RenameFlags, MAX_LINKS};
use crate::perm::{self, MAY_EXEC, MAY_WRITE};
use crate::trace::Traced;
use crate::volume::{State, Volume};
use zcfs_types::Cred;

impl Volume {
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

    pub fn rename(
        &self,
        cred: &Cred,
        p1: u64,
        n1: &[u8],
        p2: u64,
        n2: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.rename_replacing(cred, p1, n1, p2, n2, flags)
            .map(|_| ())
    }

    /// [`Volume::rename`], telling which inode lost its name `p2/n2` to the moved one
    /// (None: the name was free, or an exchange, or both names were one inode's). That
    /// inode may have no link left: a holder of references to it keeps an orphan.
    pub fn rename_replacing(
        &self,
        cred: &Cred,
        p1: u64,
        n1: &[u8],
        p2: u64,
        n2: &[u8],
        flags: RenameFlags,
    ) -> Result<Option<u64>> {
        check_name(n1)?;
        check_name(n2)?;
        let mut g = self.write_state()?;
        let st = &mut *g;
        st.dir(p1)?;
        st.dir(p2)?;
        perm::check(cred, st.inode(p1)?, MAY_EXEC)?;
        perm::check(cred, st.inode(p2)?, MAY_EXEC)?;
        let src = st.dir(p1)?.get(n1).ok_or(FsError::NotFound)?;
        let dst = st.dir(p2)?.get(n2);
        let src_dir = st.inode(src.ino)?.rec.is_dir();
        Self::check_rename_access(st, cred, (p1, src.ino), (p2, dst.map(|d| d.ino)), flags)?;
        let now = Time::now();
        let trace = || Traced::Rename {
            parent: p1,
            name: n1.to_vec(),
            new_parent: p2,
            new_name: n2.to_vec(),
            flags,
        };
        // Moving a directory to another parent moves one link count between them.
        let moves_dir = |st: &State, dir: bool, from: u64, to: u64| -> Result<()> {
            if dir && from != to {
                if st.inode(to)?.rec.nlink >= MAX_LINKS {
                    return Err(FsError::TooManyLinks);
                }
                if st.inode(from)?.rec.nlink < 3 {
                    return Err(FsError::Corrupt(format!(
                        "directory {from} has a subdirectory but a link count below 3"
                    )));
                }
            }
            Ok(())
        };
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
                return Ok(None);
            }
            if src_dir != dst_dir {
                moves_dir(st, src_dir, p1, p2)?;
                moves_dir(st, dst_dir, p2, p1)?;
            }
            let mut txn = Txn::new(OpType::Rename, src.ino);
            self.reserve_log(
                &mut txn,
                ENTRY_OVERHEAD + 2 * DIRENT_RECORD + 4 * INODE_RECORD,
            )?;
            self.rewrite_dirent(st, &mut txn, p1, n1, dst.ino, dst.dtype);
            self.rewrite_dirent(st, &mut txn, p2, n2, src.ino, src.dtype);
            if p1 != p2 {
                if src_dir {
                    st.inodes.get_mut(&src.ino).expect("checked").rec.parent = p2;
                    st.inodes.get_mut(&p1).expect("checked").rec.link_dropped();
                    st.inodes.get_mut(&p2).expect("checked").rec.link_added();
                }
                if dst_dir {
                    st.inodes.get_mut(&dst.ino).expect("checked").rec.parent = p1;
                    st.inodes.get_mut(&p2).expect("checked").rec.link_dropped();
                    st.inodes.get_mut(&p1).expect("checked").rec.link_added();
                }
            }
            for i in [src.ino, dst.ino] {
                st.inodes.get_mut(&i).expect("checked").rec.ctime = now;
                txn.dirty.insert(i);
            }
            touch_dir(st, p1, now);
            touch_dir(st, p2, now);
            self.trace(trace);
            return self.finish(st, txn).map(|()| None);
        }
        if let Some(d) = dst {
            if flags.noreplace {
                return Err(FsError::Exists);
            }
            if d.ino == src.ino {
                return Ok(None); // two links of one inode: POSIX says do nothing
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
        Self::live_dir(st, p2)?;
        moves_dir(st, src_dir, p1, p2)?;
        let (room, room_blocks, room_bytes) = match dst {
            Some(_) => (Room::At(0), 0, 0),
            None => Self::plan_room(st, p2, n2.len()),
        };
        let mut txn = Txn::new(OpType::Rename, src.ino);
        self.reserve_log(
            &mut txn,
            ENTRY_OVERHEAD + 2 * DIRENT_RECORD + 4 * INODE_RECORD + room_bytes,
        )?;
        self.reserve_blocks(st, &mut txn, room_blocks)?;
        self.remove_dirent(st, &mut txn, p1, n1);
        match dst {
            Some(d) => {
                self.rewrite_dirent(st, &mut txn, p2, n2, src.ino, src.dtype);
                let dst_dir = st.inodes[&d.ino].rec.is_dir();
                self.drop_link(st, &mut txn, d.ino, now);
                if dst_dir {
                    st.inodes.get_mut(&p2).expect("checked").rec.link_dropped();
                }
            }
            None => self.add_dirent(st, &mut txn, p2, n2, src.ino, src.dtype, room),
        }
        if src_dir && p1 != p2 {
            st.inodes.get_mut(&src.ino).expect("checked").rec.parent = p2;
            st.inodes.get_mut(&p1).expect("checked").rec.link_dropped();
            st.inodes.get_mut(&p2).expect("checked").rec.link_added();
        }
        st.inodes.get_mut(&src.ino).expect("checked").rec.ctime = now;
        txn.dirty.insert(src.ino);
        touch_dir(st, p1, now);
        touch_dir(st, p2, now);
        self.trace(trace);
        self.finish(st, txn).map(|()| dst.map(|d| d.ino))
    }

    /// `vfs_rename`'s permission checks: removing the source name from `p1`; adding
    /// or replacing the name in `p2` (for an exchange, both are removals); and moving a
    /// directory to another parent changes its "..", which needs write permission on
    /// the directory itself.
    fn check_rename_access(
        st: &State,
        cred: &Cred,
        (p1, src): (u64, u64),
        (p2, dst): (u64, Option<u64>),
        flags: RenameFlags,
    ) -> Result<()> {
        let node = |ino: u64| st.inode(ino);
        let rec = |ino: u64| st.inode(ino).map(|i| &i.rec);
        perm::check_dir_change(cred, node(p1)?, Some(rec(src)?))?;
        match dst {
            Some(d) => perm::check_dir_change(cred, node(p2)?, Some(rec(d)?))?,
            None => perm::check_dir_change(cred, node(p2)?, None)?,
        }
        if p1 != p2 {
            if rec(src)?.is_dir() {
                perm::check(cred, node(src)?, MAY_WRITE)?;
            }
            if let Some(d) = dst.filter(|_| flags.exchange) {
                if rec(d)?.is_dir() {
                    perm::check(cred, node(d)?, MAY_WRITE)?;
                }
            }
        }
        Ok(())
    }
}
