//! Consistency check: every invariant of the volume, reported rather than trusted.
//!
//! Checked: both superblock copies; the log replays to its tail without a torn entry;
//! every inode record and directory entry decodes with a valid checksum; every block is
//! owned once and lies in the data area; directory entries point at live inodes of the
//! right type; link counts (files: entries naming them; directories: 2 + subdirectories);
//! every inode is reachable from the root and every directory has exactly one entry and
//! the right parent; sizes agree with mapped blocks; bytes past EOF are zero; the stored
//! block counts are right. Leaks cannot persist (the allocator is rebuilt from what the
//! inodes reach), so "leaked" is reported as blocks the allocator and the inodes
//! disagree on.

use crate::commit::{Txn, ENTRY_OVERHEAD, INODE_RECORD};
use crate::config::VolumeConfig;
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::pm::{BlockNo, PmAddr};
use crate::volume::{read_superblock, State, Volume};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use zcfs_pmem::{LockMode, OpenParams, Region};

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FsckReport {
    /// Inconsistencies: the volume is clean only when this is empty.
    pub problems: Vec<String>,
    /// Expected after a crash and fixed by the next mount (e.g. a torn superblock copy).
    pub notes: Vec<String>,
    pub repaired: Vec<String>,
    pub inodes: u64,
    pub directories: u64,
    pub files: u64,
    pub symlinks: u64,
    pub blocks_used: u64,
    pub entries_replayed: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Check the volume at `path`. Without `repair` the file is not modified (the log is
/// replayed into a private copy). A volume another process has open is not checked
/// (its image changes under the check) and never repaired: `Busy` names the holder.
pub fn fsck_path(path: &Path, repair: bool) -> Result<FsckReport> {
    let region = Region::open(
        path,
        &OpenParams {
            private: !repair,
            lock: if repair {
                LockMode::Exclusive
            } else {
                LockMode::Shared
            },
            ..Default::default()
        },
    )
    .map_err(|e| match crate::holder::busy_or(path, e) {
        FsError::Busy(m) => FsError::Busy(format!("{m} (a live volume cannot be checked)")),
        other => other,
    })?;
    fsck_region_inner(region, repair, true)
}

/// Check an opened region (consumed: fsck replays the log into it).
pub fn fsck_region(region: Region, repair: bool) -> Result<FsckReport> {
    fsck_region_inner(region, repair, false)
}

fn fsck_region_inner(mut region: Region, repair: bool, owner: bool) -> Result<FsckReport> {
    let mut report = FsckReport::default();
    let damaged = superblock_problems(region.bytes(), &mut report);
    let mut load_problems = Vec::new();
    let cfg = VolumeConfig {
        batch_ops: 1,
        ..VolumeConfig::default()
    };
    let vol = Volume::open_region_with(region, cfg, Some(&mut load_problems), owner && repair)?;
    if repair && !damaged.is_empty() {
        // Opening for writing rewrote the copy not written last, the damaged one.
        let mut after = FsckReport::default();
        if superblock_problems(&vol.superblock_copies(), &mut after).is_empty() {
            report
                .problems
                .retain(|p| !p.starts_with("superblock copy"));
            for i in damaged {
                report
                    .repaired
                    .push(format!("superblock copy {i} rewritten from the other copy"));
            }
        }
    }
    report.problems.extend(load_problems);
    if let Some(why) = &vol.recovery.stopped_early {
        report
            .problems
            .push(format!("log replay stopped before the tail: {why}"));
    }
    report.entries_replayed = vol.recovery.entries_replayed;
    let fixes = check_state(&vol, &vol.read_state(), &mut report);
    if repair && !fixes.is_empty() {
        apply_repairs(&vol, &fixes, &mut report)?;
        // Check again what the repairs left.
        let mut after = FsckReport::default();
        check_state(&vol, &vol.read_state(), &mut after);
        report
            .problems
            .retain(|p| p.starts_with("superblock copy") || p.starts_with("log replay"));
        report.problems.extend(after.problems);
    }
    if repair {
        vol.sync()?;
    } else {
        vol.abandon();
    }
    Ok(report)
}

/// Both superblock copies must be valid: one alone is a volume without its spare.
/// Returns the numbers (1, 2) of the damaged copies.
fn superblock_problems(img: &[u8], report: &mut FsckReport) -> Vec<usize> {
    let mut damaged = Vec::new();
    for (i, off) in [0usize, BLOCK].into_iter().enumerate() {
        if img.len() < off + SB_SIZE {
            continue;
        }
        if let Err(e) = Superblock::decode(&img[off..off + SB_SIZE]) {
            report.problems.push(format!(
                "superblock copy {} is unusable ({e}); the volume runs on the other copy \
                 alone (repair, or the next read-write mount, rewrites it)",
                i + 1
            ));
            damaged.push(i + 1);
        }
    }
    if read_superblock(img).is_err() {
        report.problems.push("no usable superblock".into());
    }
    damaged
}

/// What a repair may safely do.
#[derive(Debug, Clone)]
enum Fix {
    Nlink(u64, u32),
    BlocksField(u64),
    Orphan(u64),
    Reserve(u64),
    /// Drop an xattr set that could not be read, releasing the blocks it owns.
    DropXattrs(u64),
}

fn check_state(vol: &Volume, st: &State, report: &mut FsckReport) -> Vec<Fix> {
    let geo = vol.geo;
    let mut fixes = Vec::new();
    let mut refs: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut parent_of: HashMap<u64, u64> = HashMap::new();
    for (&d, dir) in &st.dirs {
        for (name, e) in dir.iter_from(0) {
            *refs.entry(e.ino).or_default() += 1;
            if st.inodes.get(&e.ino).is_some_and(|i| i.rec.is_dir()) {
                *subdirs.entry(d).or_default() += 1;
                if parent_of.insert(e.ino, d).is_some() {
                    report.problems.push(format!(
                        "directory {} has more than one entry (one is {:?} in {d})",
                        e.ino,
                        String::from_utf8_lossy(name)
                    ));
                }
            }
        }
    }
    // Reachability from the root.
    let mut reached = std::collections::HashSet::from([ROOT_INO]);
    let mut stack = vec![ROOT_INO];
    while let Some(d) = stack.pop() {
        if let Some(dir) = st.dirs.get(&d) {
            for (_, e) in dir.iter_from(0) {
                if reached.insert(e.ino) && st.dirs.contains_key(&e.ino) {
                    stack.push(e.ino);
                }
            }
        }
    }
    // The load reported why each of these sets is unreadable.
    fixes.extend(st.damaged_xattrs.iter().map(|&ino| Fix::DropXattrs(ino)));
    let mut owned = 0u64;
    for (&ino, i) in &st.inodes {
        let r = &i.rec;
        report.inodes += 1;
        let derived_blocks = i.owned_blocks();
        owned += derived_blocks;
        let home = PmAddr(geo.inode_off(ino) as u64);
        let pm = InodeRec::decode(vol.meta_read(st, home, INODE_SIZE));
        if pm.as_ref().is_ok_and(|p| p.blocks != derived_blocks) {
            report.problems.push(format!(
                "inode {ino}: block count says {} but owns {derived_blocks}",
                pm.unwrap().blocks
            ));
            fixes.push(Fix::BlocksField(ino));
        }
        // A preallocation reserve is for overwrites of the file's own blocks: never
        // more than its data blocks, and only regular files have one.
        let max_reserve = if r.is_reg() { i.map.data_blocks() } else { 0 };
        if r.cow_reserve > max_reserve {
            report.problems.push(format!(
                "inode {ino}: copy-on-write reserve {} exceeds its {max_reserve} data blocks",
                r.cow_reserve
            ));
            fixes.push(Fix::Reserve(ino));
        }
        if ino != ROOT_INO && !reached.contains(&ino) && r.nlink == 0 {
            report.notes.push(format!(
                "inode {ino} was removed while still open or referenced; the next mount frees it"
            ));
            continue;
        }
        if ino != ROOT_INO && !reached.contains(&ino) {
            report.problems.push(format!(
                "inode {ino} is not reachable from the root (orphan)"
            ));
            fixes.push(Fix::Orphan(ino));
            continue;
        }
        if r.is_dir() {
            report.directories += 1;
            let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
            if r.nlink != want {
                report.problems.push(format!(
                    "directory {ino}: link count {} should be {want}",
                    r.nlink
                ));
                fixes.push(Fix::Nlink(ino, want));
            }
            let expected_parent = if ino == ROOT_INO {
                ROOT_INO
            } else {
                parent_of.get(&ino).copied().unwrap_or(0)
            };
            if r.parent != expected_parent {
                report.problems.push(format!(
                    "directory {ino}: parent field {} should be {expected_parent}",
                    r.parent
                ));
            }
            if ino == ROOT_INO && refs.contains_key(&ROOT_INO) {
                report
                    .problems
                    .push("the root directory has an entry naming it".into());
            }
        } else {
            let want = refs.get(&ino).copied().unwrap_or(0);
            if r.nlink != want {
                report.problems.push(format!(
                    "inode {ino}: link count {} should be {want}",
                    r.nlink
                ));
                fixes.push(Fix::Nlink(ino, want));
            }
            let nblocks = r.size.div_ceil(BLOCK_U64);
            let end = i.map.mapped_end();
            if end > nblocks && !r.is_reg() {
                report.problems.push(format!(
                    "inode {ino}: blocks mapped past its size {}",
                    r.size
                ));
            } else if end > nblocks {
                // fallocate KEEP_SIZE preallocates past the end: zeroed blocks, so
                // growing the file later still shows zeros.
                let mut dirty = 0u64;
                i.map.for_range(nblocks, end - nblocks, |_, b| {
                    if let Some(b) = b {
                        if vol.live(st, BlockNo(b), 0, BLOCK).iter().any(|&x| x != 0) {
                            dirty += 1;
                        }
                    }
                });
                if dirty > 0 {
                    report.problems.push(format!(
                        "inode {ino}: {dirty} blocks past its size {} are not zero",
                        r.size
                    ));
                }
            }
            if r.is_symlink() {
                report.symlinks += 1;
                if r.size == 0
                    || r.size as usize > crate::ops::MAX_SYMLINK
                    || i.map.get(0).is_none()
                {
                    report
                        .problems
                        .push(format!("symlink {ino}: bad target (size {})", r.size));
                }
            } else {
                report.files += 1;
            }
            let tail = (r.size % BLOCK_U64) as usize;
            if tail != 0 {
                if let Some(b) = i.map.get(r.size / BLOCK_U64) {
                    let past = vol.live(st, BlockNo(b), tail, BLOCK - tail);
                    if past.iter().any(|&x| x != 0) {
                        report
                            .problems
                            .push(format!("inode {ino}: bytes past EOF are not zero"));
                    }
                }
            }
        }
    }
    // Blocks freed by committed or pending operations stay marked in the allocator
    // until the checkpoint that makes their reuse safe.
    let waiting = (st.deferred_frees.len() + st.batch.frees.len()) as u64;
    let used = geo.data_blocks - st.balloc.free_count() - waiting;
    report.blocks_used = used;
    let reserved: u64 = st.inodes.values().map(|i| i.rec.cow_reserve).sum();
    let free = geo.data_blocks - used;
    if reserved > free {
        report.problems.push(format!(
            "files reserve {reserved} blocks for preallocated overwrites but only {free} are free"
        ));
    }
    if used != owned {
        report.problems.push(format!(
            "allocator counts {used} blocks in use, inodes own {owned}"
        ));
    }
    fixes
}

fn apply_repairs(vol: &Arc<Volume>, fixes: &[Fix], report: &mut FsckReport) -> Result<()> {
    let mut st = vol.write_state()?;
    let st = &mut *st;
    for fix in fixes {
        let mut txn = Txn::new(OpType::Repair, 0);
        vol.reserve_log(&mut txn, ENTRY_OVERHEAD + 2 * INODE_RECORD)?;
        match *fix {
            Fix::Nlink(ino, n) => {
                if let Some(i) = st.inodes.get_mut(&ino) {
                    i.rec.nlink = n;
                    txn.dirty.insert(ino);
                    report
                        .repaired
                        .push(format!("inode {ino}: link count set to {n}"));
                }
            }
            Fix::BlocksField(ino) => {
                txn.dirty.insert(ino);
                report
                    .repaired
                    .push(format!("inode {ino}: block count rewritten"));
            }
            Fix::Reserve(ino) => {
                if let Some(i) = st.inodes.get_mut(&ino) {
                    let max = if i.rec.is_reg() {
                        i.map.data_blocks()
                    } else {
                        0
                    };
                    st.reserved -= i.rec.cow_reserve - max;
                    i.rec.cow_reserve = max;
                    txn.dirty.insert(ino);
                    report.repaired.push(format!(
                        "inode {ino}: copy-on-write reserve lowered to {max}"
                    ));
                }
            }
            Fix::DropXattrs(ino) => {
                if let Some(i) = st.inodes.get_mut(&ino) {
                    txn.releases.append(&mut i.xattr_blocks);
                    i.set_xattr_blocks(Vec::new());
                    i.xattrs.clear();
                    txn.dirty.insert(ino);
                    report.repaired.push(format!(
                        "inode {ino}: unreadable extended attributes dropped"
                    ));
                }
                st.damaged_xattrs.remove(&ino);
            }
            Fix::Orphan(ino) => {
                let Some(inode) = st.inodes.get(&ino) else {
                    continue;
                };
                if st.tainted.contains(&ino) {
                    report.notes.push(format!(
                        "orphan inode {ino} shares blocks with another inode: left for a human"
                    ));
                    continue;
                }
                if inode.rec.is_dir() && st.dirs.get(&ino).is_some_and(|d| !d.is_empty()) {
                    // Its children would become orphans too; leave it for a human.
                    continue;
                }
                vol.free_inode(st, &mut txn, ino);
                report.repaired.push(format!("orphan inode {ino} released"));
            }
        }
        vol.finish(st, txn)?;
    }
    Ok(())
}

/// Check an opened volume (after its recovery). The pending batch is committed first,
/// since home locations only reflect committed operations.
pub fn check_volume(vol: &Volume) -> FsckReport {
    let mut report = FsckReport::default();
    if let Err(e) = vol.sync() {
        report
            .problems
            .push(format!("commit before checking failed: {e}"));
    }
    superblock_problems(&vol.superblock_copies(), &mut report);
    if let Some(why) = &vol.recovery.stopped_early {
        report
            .problems
            .push(format!("log replay stopped before the tail: {why}"));
    }
    report.entries_replayed = vol.recovery.entries_replayed;
    check_state(vol, &vol.read_state(), &mut report);
    report
}

/// Convenience for tests and tools: check an image held in memory.
pub fn fsck_image(image: &[u8]) -> Result<FsckReport> {
    fsck_region(Region::from_image(image), false)
}
