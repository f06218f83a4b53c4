//! Close-to-open for a mount that is one of several clients of a server: what this
//! mount last told the kernel of each inode, so that an open can tell whether the
//! kernel's copy is older than the file the open found, and invalidate it.
//!
//! The kernel does not ask for attributes on open: within the attribute timeout a
//! reader would keep the size it had (a grown file reads short) and, with the size
//! unchanged, its cached pages. The backend's open refreshes what it knows (a server's
//! open reply carries the attributes); when they differ from what the kernel was told,
//! the open handler invalidates the kernel's attributes (FUSE_NOTIFY_INVAL_INODE with
//! offset -1: attributes only) before it replies. The next read or stat then asks
//! for them, and with FUSE_AUTO_INVAL_DATA a changed mtime or size drops the cached
//! pages.
//!
//! Attributes only, never pages, from inside the open handler: the kernel opens with
//! O_TRUNC under the writeback cache holding the inode lock and FUSE_NOWRITE
//! (`fuse_open`, `fuse_set_nowrite`), and invalidating pages there
//! (`invalidate_inode_pages2_range`) would wait for the writeback of dirty pages that
//! the kernel holds back until the open is answered: a deadlock. Invalidating
//! attributes takes no lock the opener holds (`fuse_reverse_inval_inode`: the inode's
//! spinlock, briefly).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use zcfs_backend::{Attr, Time};

/// What of an inode's attributes tells a changed file: size, mtime, ctime (every
/// change of content or attributes moves ctime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    size: u64,
    mtime: Time,
    ctime: Time,
}

impl Stamp {
    fn of(a: &Attr) -> Stamp {
        Stamp {
            size: a.size,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }
}

/// The stamps of what the kernel was told, per inode it knows. An inode missing here
/// (never told, or forgotten) counts as stale: invalidating too often costs a
/// request, too seldom a stale read.
#[derive(Default)]
pub(crate) struct Shown {
    stamps: Mutex<HashMap<u64, Stamp>>,
}

impl Shown {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stamp>> {
        self.stamps.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kernel was given `a`.
    pub(crate) fn told(&self, a: &Attr) {
        self.lock().insert(a.ino, Stamp::of(a));
    }

    /// The kernel forgot `ino` (or some of its lookups: what it keeps is unknown).
    pub(crate) fn forget(&self, ino: u64) {
        self.lock().remove(&ino);
    }

    /// Whether the kernel was last told what `a` says.
    pub(crate) fn is_current(&self, a: &Attr) -> bool {
        self.lock().get(&a.ino) == Some(&Stamp::of(a))
    }
}

/// The session's notifier, set once the session exists (the file system is made
/// before it).
pub(crate) type NotifierCell = Arc<OnceLock<fuser::Notifier>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(size: u64, mtime: i64) -> Attr {
        Attr {
            ino: 7,
            size,
            mtime: Time {
                sec: mtime,
                nsec: 0,
            },
            ..Default::default()
        }
    }

    #[test]
    fn an_inode_is_current_only_while_what_was_told_still_holds() {
        let s = Shown::default();
        assert!(!s.is_current(&attr(3, 1)), "never told: stale");
        s.told(&attr(3, 1));
        assert!(s.is_current(&attr(3, 1)));
        assert!(!s.is_current(&attr(4, 1)), "size changed");
        assert!(!s.is_current(&attr(3, 2)), "mtime changed");
        let mut a = attr(3, 1);
        a.atime = Time { sec: 9, nsec: 0 };
        assert!(s.is_current(&a), "a read (atime) changes nothing cached");
        s.forget(7);
        assert!(!s.is_current(&attr(3, 1)), "forgotten: stale");
    }
}
