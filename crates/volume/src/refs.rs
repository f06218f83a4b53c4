//! References to inodes: open handles and the lookups a frontend's kernel holds (the
//! FUSE lookup count). An inode whose last name goes away while referenced becomes an
//! orphan (link count 0, reachable from no directory): it keeps its data, its number
//! and its generation until the last reference goes, so a process that opened or looked
//! it up just before a rename replaced it still gets it. A crash while orphans exist
//! leaves them for the next mount to free.

use crate::commit::{Txn, ENTRY_OVERHEAD, INODE_RECORD};
use crate::error::{FsError, Result};
use crate::layout::OpType;
use crate::ops::{attr_of, Attr};
use crate::trace::Traced;
use crate::volume::Volume;

impl Volume {
    /// Take one reference to `ino` if it exists with generation `gen` (0 = any);
    /// `Stale` otherwise. Returns its attributes.
    pub fn hold(&self, ino: u64, gen: u32) -> Result<Attr> {
        let st = self.read_state();
        let i = st.inode(ino)?;
        if gen != 0 && i.rec.gen != gen {
            return Err(FsError::Stale);
        }
        let a = attr_of(i);
        self.add_ref(ino);
        Ok(a)
    }

    /// Take a reference (the caller holds the state lock, so the inode exists).
    pub(crate) fn add_ref(&self, ino: u64) {
        *self.refs.lock().unwrap().entry(ino).or_insert(0) += 1;
    }

    pub(crate) fn is_referenced(&self, ino: u64) -> bool {
        self.refs.lock().unwrap().contains_key(&ino)
    }

    /// References held to `ino`.
    pub fn references(&self, ino: u64) -> u64 {
        self.refs.lock().unwrap().get(&ino).copied().unwrap_or(0)
    }

    /// Give back `n` references to `ino`; the last one frees an orphan. Giving back
    /// more than are held is not an error (a frontend may forget an inode it saw before
    /// a restart): the count stops at zero.
    pub fn forget(&self, ino: u64, n: u64) -> Result<()> {
        {
            let mut refs = self.refs.lock().unwrap();
            let Some(c) = refs.get_mut(&ino) else {
                return Ok(());
            };
            *c = c.saturating_sub(n);
            if *c > 0 {
                return Ok(());
            }
            refs.remove(&ino);
        }
        self.free_if_orphan(ino)
    }

    /// Free `ino` if it is an orphan nobody references (re-checked under the lock: it
    /// may have been taken again meanwhile).
    fn free_if_orphan(&self, ino: u64) -> Result<()> {
        if self.cfg.read_only || self.has_failed() {
            return Ok(());
        }
        let orphan = |v: &Volume| {
            v.read_state()
                .inodes
                .get(&ino)
                .is_some_and(|i| i.rec.nlink == 0)
        };
        if !orphan(self) {
            return Ok(());
        }
        let mut g = self.write_state()?;
        let st = &mut *g;
        if self.is_referenced(ino) || st.inodes.get(&ino).is_none_or(|i| i.rec.nlink != 0) {
            return Ok(());
        }
        let mut txn = Txn::new(OpType::Unlink, ino);
        self.reserve_log(&mut txn, ENTRY_OVERHEAD + INODE_RECORD)?;
        self.free_inode(st, &mut txn, ino);
        self.trace(|| Traced::Freed { ino });
        self.finish(st, txn)
    }

    /// A frontend opened `ino`: an unlink of its last name keeps it until
    /// `release_handle`.
    pub fn open_handle(&self, ino: u64) -> Result<()> {
        self.hold(ino, 0).map(|_| ())
    }

    /// A handle of `ino` was closed; the last reference to an unlinked file frees it.
    pub fn release_handle(&self, ino: u64) -> Result<()> {
        self.forget(ino, 1)
    }

    /// Free the orphans (unlinked while referenced) a crash left behind; run at mount.
    pub(crate) fn reap_orphans(&self) -> Result<usize> {
        let mut g = self.write_state()?;
        let st = &mut *g;
        // Only what no directory names: a named inode with link count 0 (or the root)
        // is damage for fsck to report, and freeing it would leave dangling entries.
        let named: std::collections::HashSet<u64> = st
            .dirs
            .values()
            .flat_map(|d| d.iter_from(0).map(|(_, e)| e.ino))
            .collect();
        let orphans: Vec<u64> = st
            .inodes
            .iter()
            .filter(|(&n, i)| {
                i.rec.nlink == 0
                    && n != crate::layout::ROOT_INO
                    && !named.contains(&n)
                    && !st.tainted.contains(&n)
            })
            .map(|(&n, _)| n)
            .collect();
        for &ino in &orphans {
            let mut txn = Txn::new(OpType::Unlink, ino);
            self.reserve_log(&mut txn, ENTRY_OVERHEAD + INODE_RECORD)?;
            self.free_inode(st, &mut txn, ino);
            self.finish(st, txn)?;
        }
        self.commit_batch(st)?;
        Ok(orphans.len())
    }
}
