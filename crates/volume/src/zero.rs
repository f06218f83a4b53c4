//! Free blocks known to hold zeros, so that pages handed out to be filled
//! (`reserve_pages`, the same-host RESERVE) need not be zeroed on the way out.
//!
//! A reserved page must read as zero wherever its holder does not write: it may be a
//! deleted file's block. Zeroing 1 MiB at each 1 MiB reservation was a third of a
//! same-host direct write. So the allocator remembers which free blocks hold zeros
//! (`BlockAlloc::mark_clean`, DRAM only) and `reserve_pages` takes those first. Two
//! things make a block clean:
//!
//! - **a hole of the image at open** (`note_zero_blocks`): a free block inside a hole
//!   of the image file (SEEK_HOLE; on tmpfs an allocated but never written page is a
//!   hole too) reads as zero whatever happened before, crash or not. A fresh image's
//!   data area is one hole.
//! - **zeroing while free** (`clean_free_blocks`): a caller with idle time (the
//!   same-host service between requests) zeroes free blocks not known clean, under the
//!   write lock, a few at a time, keeping up to [`CLEAN_TARGET`] blocks zeroed so.
//!
//! `reserve_pages` takes the lowest clean blocks first: below the next-fit cursor every
//! block was in use once and its page is backed; above it, the holes the prefault
//! thread has backed come next. A hole whose page is not backed yet is zeroed all the
//! same, by the kernel, on first touch: holes save the volume's zeroing, not the
//! kernel's.
//!
//! Taking a block, by any path, forgets it was clean; a freed block comes back
//! unknown. Nothing here is persistent and nothing needs to be: after a crash the
//! allocator is rebuilt with every free block unknown, then holes are looked up again.
//! The zeros need no write-back either: a block handed out clean is written back whole
//! when committed (`pflush_commit` flushes every placed page), zeros included.

use crate::error::Result;
use crate::layout::BLOCK_U64;
use crate::pm::BlockNo;
use crate::volume::{State, Volume};

/// Most hole/data transitions of the image looked at when opening (one `lseek` pair
/// each): a fragmented image on a large device stops there and the rest of its free
/// blocks stay unknown (zeroed when reserved, as before).
pub const HOLE_SCAN_MAX_EXTENTS: usize = 1 << 16;
/// Clean blocks `clean_free_blocks` keeps ready at most: 16 MiB, sixteen 1 MiB
/// reservations. Zeroing more ahead would spend CPU on blocks ordinary writes (which
/// overwrite whole blocks and need no zeros) may take first.
pub const CLEAN_TARGET: u64 = 4096;

impl Volume {
    /// At open, before the volume is shared: mark clean every free block that lies
    /// whole in a hole of the image file. Returns the blocks marked. Nothing for a
    /// region that is not a shared file mapping, or a file without holes (a DAX
    /// character device reports none).
    pub(crate) fn note_zero_blocks(&self, st: &mut State) -> u64 {
        self.note_zero_blocks_upto(st, HOLE_SCAN_MAX_EXTENTS)
    }

    /// `note_zero_blocks`, looking at `max_extents` holes at most.
    fn note_zero_blocks_upto(&self, st: &mut State, max_extents: usize) -> u64 {
        let Some(fd) = self.region.shared_fd() else {
            return 0;
        };
        let start = self.geo.data_start * BLOCK_U64;
        let end = (self.geo.data_start + self.geo.data_blocks) * BLOCK_U64;
        let mut pos = start;
        let mut marked = 0;
        for _ in 0..max_extents {
            if pos >= end {
                break;
            }
            // SAFETY: lseek on our own descriptor with plain integers; it moves only
            // the descriptor's offset, which nothing else uses (the region is mapped).
            let hole = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_HOLE) };
            if hole < 0 || hole as u64 >= end {
                break;
            }
            // SAFETY: as above.
            let data = unsafe { libc::lseek(fd, hole, libc::SEEK_DATA) };
            let hole_end = if data >= 0 {
                data as u64
            } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                end // no data after the hole: it runs to the end of the file
            } else {
                break;
            };
            let first = (hole as u64).div_ceil(BLOCK_U64);
            let last = hole_end.min(end) / BLOCK_U64;
            for b in first..last {
                if st.balloc.mark_clean(b) {
                    marked += 1;
                }
            }
            pos = hole_end;
        }
        marked
    }

    /// Zero `max` free blocks not known to hold zeros and remember them clean, when at
    /// least `max` of the blocks zeroed this way are missing from [`CLEAN_TARGET`] (so
    /// a caller that takes one block at a time does not pay a step per block). Holes
    /// do not count: a hole's page may not be backed yet, and its first writer pays
    /// for that (on /dev/shm an allocation and the kernel's clearing), while a block
    /// zeroed here was in use once and is backed. Holds the write lock for those `max`
    /// blocks only. Returns the blocks zeroed (0: nothing to do).
    pub fn clean_free_blocks(&self, max: usize) -> Result<usize> {
        {
            let st = self.read_state();
            let ready = st.balloc.zeroed_count();
            if CLEAN_TARGET.saturating_sub(ready) < (max as u64).max(1)
                || st.balloc.clean_count() == st.balloc.free_count()
            {
                return Ok(0);
            }
        }
        let mut st = self.write_state()?;
        let st = &mut *st;
        let want = (CLEAN_TARGET - st.balloc.zeroed_count().min(CLEAN_TARGET)) as usize;
        let blocks = st.balloc.dirty_free(max.min(want));
        for &b in &blocks {
            self.free_zero(st, BlockNo(b));
            let marked = st.balloc.mark_zeroed(b);
            debug_assert!(marked, "block {b} was free");
        }
        crate::config::Stats::add(&self.stats.background_zeroed_blocks, blocks.len() as u64);
        Ok(blocks.len())
    }

    /// Free blocks known to hold zeros now.
    pub fn clean_blocks(&self) -> u64 {
        self.read_state().balloc.clean_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MkfsOptions, VolumeConfig};
    use std::os::unix::fs::FileExt;

    /// The hole scan looks at no more holes than it is allowed, in file order, and
    /// marks only the free blocks inside them.
    #[test]
    fn the_hole_scan_stops_at_its_bound() {
        let path = std::path::PathBuf::from(format!(
            "/dev/shm/zcfs-test-holes-{}.img",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        Volume::mkfs(&path, 16 << 20, &MkfsOptions::default()).unwrap();
        let ds = {
            let v = Volume::open(&path, VolumeConfig::synchronous()).unwrap();
            v.geo.data_start
        };
        // Two written (data) pages inside the free data area split it into three holes.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for k in [100, 200] {
            f.write_all_at(&[1], (ds + k) * BLOCK_U64).unwrap();
        }
        drop(f);
        let vol = Volume::open(&path, VolumeConfig::synchronous()).unwrap();
        let mut st = vol.state.write().unwrap();
        assert!(st.balloc.is_clean(ds + 150) && st.balloc.is_clean(ds + 250));
        assert!(!st.balloc.is_clean(ds + 100) && !st.balloc.is_clean(ds + 200));
        for (max, mid, last) in [(1, false, false), (2, true, false), (3, true, true)] {
            st.balloc.forget_clean();
            let marked = vol.note_zero_blocks_upto(&mut st, max);
            assert!(marked > 0);
            assert!(st.balloc.is_clean(ds + 99), "the first hole ({max})");
            assert_eq!(st.balloc.is_clean(ds + 150), mid, "the second hole ({max})");
            assert_eq!(st.balloc.is_clean(ds + 250), last, "the third hole ({max})");
            assert!(!st.balloc.is_clean(ds + 100) && !st.balloc.is_clean(ds + 200));
        }
        drop(st);
        drop(vol);
        let _ = std::fs::remove_file(&path);
    }
}
