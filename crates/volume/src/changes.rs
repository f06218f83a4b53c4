//! Change counters other processes can read: one `u64` per slot (an inode number maps to
//! slot `ino % CHANGE_SLOTS`), raised by every transaction that rewrites the inode (its
//! data map, size, mode or times), in a memfd that same-host applications map read-only.
//! An application that leased a file's blocks and read its counter knows, from one load,
//! whether what it leased is still the file: leased blocks are never written while pinned
//! (copy-on-write, pins.rs), so an unchanged counter means the extents it holds are the
//! file's current ones. Slots are shared by inode numbers alike modulo `CHANGE_SLOTS`: a
//! change of another inode only costs the reader a fresh lease, never a stale read.
//!
//! The counters live from the first `Volume::change_counters` call (nothing is counted
//! before: no one can hold a lease validated by them then).
//!
//! Only this mapping writes them: the memfd is sealed against writes other than through
//! mappings that exist already (`F_SEAL_FUTURE_WRITE`) and against resizing, so a reader
//! that opens it again through /proc (a memfd is mode 0777) still cannot store to it or
//! shrink it under our mapping (the next raise would fault).

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots of the counter table (a power of two; 32 KiB of counters).
pub const CHANGE_SLOTS: usize = 4096;
/// Bytes of the counter table's memfd (whole pages).
pub const CHANGE_TABLE_BYTES: usize = CHANGE_SLOTS * 8;

/// The slot of an inode's counter.
pub fn change_slot(ino: u64) -> usize {
    (ino % CHANGE_SLOTS as u64) as usize
}

/// The counter table: a shared mapping of a memfd, raised only through atomics.
pub struct ChangeCounters {
    fd: OwnedFd,
    base: *const AtomicU64,
}

// SAFETY: the mapping is shared memory accessed only through `AtomicU64`; it lives as
// long as the value and is unmapped once, in `drop`.
unsafe impl Send for ChangeCounters {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for ChangeCounters {}

impl ChangeCounters {
    /// A fresh table: every counter 0.
    pub fn new() -> std::io::Result<ChangeCounters> {
        // SAFETY: a NUL-terminated name and valid flags; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"zcfs-changes".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a descriptor memfd_create just gave us, owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a valid descriptor and length; the result is checked.
        if unsafe { libc::ftruncate(raw, CHANGE_TABLE_BYTES as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: mapping a memfd of exactly CHANGE_TABLE_BYTES, shared, read-write; the
        // result is checked. The mapping is page-aligned, so every u64 is aligned.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHANGE_TABLE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let c = ChangeCounters {
            fd,
            base: p as *const AtomicU64,
        };
        // Our writable mapping stays writable; no other write, writable mapping or
        // resize is possible any more, whoever opens the memfd.
        let seals =
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: a valid descriptor and seal flags; the result is checked (on failure
        // `c` is dropped, which unmaps).
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(c)
    }

    fn slot(&self, i: usize) -> &AtomicU64 {
        assert!(i < CHANGE_SLOTS, "change slot {i} of {CHANGE_SLOTS}");
        // SAFETY: `i` is inside the mapping (checked), which is aligned for u64, lives
        // as long as `self`, and is only ever accessed atomically.
        unsafe { &*self.base.add(i) }
    }

    /// Count a change of `ino`. Called with the volume's state locked for writing, so a
    /// lease taken (under the read lock) after this sees the change, and one taken
    /// before sees the old counter.
    pub(crate) fn raise(&self, ino: u64) {
        self.slot(change_slot(ino)).fetch_add(1, Ordering::Release);
    }

    /// Raise every counter once: the volume closes. Another opening of the image has
    /// counters of its own, so a reader checking these would otherwise go on trusting
    /// extents it no longer holds (its leases ended with the volume) while the image
    /// changes under them.
    pub(crate) fn retire(&self) {
        for i in 0..CHANGE_SLOTS {
            self.slot(i).fetch_add(1, Ordering::Release);
        }
    }

    /// The counter of `ino`'s slot.
    pub fn count(&self, ino: u64) -> u64 {
        self.slot(change_slot(ino)).load(Ordering::Acquire)
    }

    /// The memfd, for an application to map read-only (`CHANGE_TABLE_BYTES`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for ChangeCounters {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no reference into it
        // outlives `self` (`slot` borrows `self`).
        unsafe { libc::munmap(self.base as *mut libc::c_void, CHANGE_TABLE_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_wrap_at_the_bound_and_count_apart() {
        let c = ChangeCounters::new().unwrap();
        assert_eq!(change_slot(CHANGE_SLOTS as u64 - 1), CHANGE_SLOTS - 1);
        assert_eq!(change_slot(CHANGE_SLOTS as u64), 0);
        c.raise(5);
        c.raise(5 + CHANGE_SLOTS as u64);
        c.raise(CHANGE_SLOTS as u64 - 1);
        assert_eq!(c.count(5), 2, "inodes alike modulo the slots share one");
        assert_eq!(c.count(6), 0);
        assert_eq!(c.count(CHANGE_SLOTS as u64 - 1), 1);
    }

    #[test]
    fn the_memfd_opened_again_cannot_write_or_resize() {
        use std::os::fd::AsRawFd;
        let c = ChangeCounters::new().unwrap();
        let path = format!("/proc/self/fd/{}", c.fd().as_raw_fd());
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        use std::os::unix::fs::FileExt;
        assert!(f.write_at(&[1], 0).is_err(), "written");
        assert!(f.set_len(0).is_err(), "shrunk");
        assert!(f.set_len(CHANGE_TABLE_BYTES as u64 * 2).is_err(), "grown");
        // SAFETY: asking for a writable shared mapping; checked, unmapped if made.
        let w = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if w != libc::MAP_FAILED {
            // SAFETY: the mapping just made.
            unsafe { libc::munmap(w, 4096) };
            panic!("mapped writable");
        }
        // Our own mapping still counts.
        c.raise(3);
        assert_eq!(c.count(3), 1);
    }

    #[test]
    fn another_mapping_of_the_fd_sees_the_counts() {
        let c = ChangeCounters::new().unwrap();
        c.raise(7);
        let fd = c.fd().try_clone_to_owned().unwrap();
        // SAFETY: mapping the memfd read-only, checked; unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHANGE_TABLE_BYTES,
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: slot 7 is inside the mapping, aligned, read atomically.
        let seen = unsafe { (*(p as *const AtomicU64).add(7)).load(Ordering::Acquire) };
        assert_eq!(seen, 1);
        c.raise(7);
        // SAFETY: as above.
        let seen = unsafe { (*(p as *const AtomicU64).add(7)).load(Ordering::Acquire) };
        assert_eq!(seen, 2);
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, CHANGE_TABLE_BYTES) };
    }
}
