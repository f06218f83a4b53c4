//! Directories whose every name this client knows, so that a lookup of any other name
//! is answered "no such name" here, without a round trip: the kernel looks up every new
//! name before it creates it (`tar x`, `git clone`, a program saving many files).
//!
//! A directory becomes known when this client made it (mkdir) and the reply says it
//! held no names at version `v` (`DirState`: the server counts every change of a
//! directory's name set). Each change this client makes in it (create, mknod, mkdir,
//! symlink, link, unlink, rmdir) is answered with the version read after the change:
//! exactly one more than known means that change was the only one since, so the names
//! are the known ones plus or minus that name. Anything else (another client's change,
//! two of ours at once, an error, no version) forgets the directory, as do a rename in
//! it, a change of its mode or extended attributes, and a new session.
//!
//! What is known is trusted for the attribute timeout after its last confirmation, as
//! the kernel trusts a cached negative entry: another client's new name is seen at most
//! that late, and the kernel may keep the answer only for what is left of it
//! (`negative_ttl`). Only for directories anyone may search (x for owner, group and
//! others, no ACL): the server judges the owner by the owner bits alone and a group
//! member by the group bits (as Linux does), so o+x alone would let the client answer
//! "no such name" where the server refuses the lookup (EACCES). A directory is known by
//! inode number and generation: a number freed and reused is another directory.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use zcfs_backend::{Attr, DirState};

/// Most directories known at once; past it, no new one is taken on.
pub const KNOWN_DIRS_MAX: usize = 1024;
/// Most names known of one directory; a directory that grows past it is forgotten.
pub const KNOWN_NAMES_MAX: usize = 65_536;

struct Known {
    /// The session the versions were read in.
    epoch: u64,
    /// The directory's generation (its inode number may be reused by another).
    gen: u64,
    version: u64,
    names: HashSet<Box<[u8]>>,
    confirmed: Instant,
}

/// A change of ours in a known directory.
pub(super) enum Change<'a> {
    Added(&'a [u8]),
    Removed(&'a [u8]),
}

#[derive(Default)]
pub(super) struct KnownDirs {
    dirs: HashMap<u64, Known>,
}

/// Whether every caller may look names up in a directory with these attributes, as far
/// as the mode says (no ACL to say otherwise): each class (owner, group, others) is
/// judged by its own bits, so all three need x.
fn searchable_by_all(a: &Attr) -> bool {
    a.is_dir() && a.mode & 0o111 == 0o111 && a.no_xattrs
}

impl KnownDirs {
    /// Directory `made` was made by us (mkdir in session `epoch`); `state` was read
    /// after: known if it still held no names. At the bound, what expired (confirmed
    /// `ttl` or longer ago: no lookup is answered from it any more) makes room first.
    pub fn made(
        &mut self,
        made: &Attr,
        epoch: u64,
        state: Option<DirState>,
        ttl: Duration,
        now: Instant,
    ) {
        let Some(state) = state else { return };
        if state.entries != 0 || !searchable_by_all(made) {
            return;
        }
        if self.dirs.len() >= KNOWN_DIRS_MAX && !self.dirs.contains_key(&made.ino) {
            self.dirs
                .retain(|_, k| now.saturating_duration_since(k.confirmed) < ttl);
            if self.dirs.len() >= KNOWN_DIRS_MAX {
                return;
            }
        }
        self.dirs.insert(
            made.ino,
            Known {
                epoch,
                gen: made.generation,
                version: state.version,
                names: HashSet::new(),
                confirmed: now,
            },
        );
    }

    /// A change of ours in `dir` was answered in session `epoch`, with the directory's
    /// attributes and state read after it.
    pub fn changed(
        &mut self,
        dir: u64,
        epoch: u64,
        after: Option<&Attr>,
        state: Option<DirState>,
        change: Change<'_>,
        now: Instant,
    ) {
        let Some(k) = self.dirs.get_mut(&dir) else {
            return;
        };
        let ours_alone = k.epoch == epoch
            && state.is_some_and(|s| Some(s.version) == k.version.checked_add(1))
            && after.is_some_and(|a| searchable_by_all(a) && a.generation == k.gen);
        if !ours_alone {
            self.dirs.remove(&dir);
            return;
        }
        let consistent = match change {
            Change::Added(n) => k.names.insert(n.into()),
            Change::Removed(n) => k.names.remove(n),
        };
        let state = state.expect("checked above");
        if !consistent || k.names.len() > KNOWN_NAMES_MAX || state.entries != k.names.len() as u64 {
            // The server's count disagrees with ours: what we know is wrong.
            self.dirs.remove(&dir);
            return;
        }
        k.version = state.version;
        k.confirmed = now;
    }

    /// Forget `dir` (a change not counted above, or one that failed).
    pub fn forget(&mut self, dir: u64) {
        self.dirs.remove(&dir);
    }

    /// How much longer `name` may be taken as absent from `dir` of generation `gen`
    /// (None: not known to be): the directory is known in session `epoch`, confirmed
    /// less than `ttl` ago, and does not hold the name.
    pub fn absent_for(
        &self,
        dir: u64,
        gen: u64,
        name: &[u8],
        epoch: u64,
        ttl: Duration,
        now: Instant,
    ) -> Option<Duration> {
        if name == b"." || name == b".." {
            return None;
        }
        let k = self.dirs.get(&dir)?;
        let left = ttl.checked_sub(now.saturating_duration_since(k.confirmed))?;
        (k.epoch == epoch && k.gen == gen && !left.is_zero() && !k.names.contains(name))
            .then_some(left)
    }

    /// How long a "no such name" in `dir` may be kept by the kernel: what is left of
    /// the directory's confirmation (None: not known, as long as any entry).
    pub fn negative_ttl(&self, dir: u64, ttl: Duration, now: Instant) -> Option<Duration> {
        let k = self.dirs.get(&dir)?;
        Some(ttl.saturating_sub(now.saturating_duration_since(k.confirmed)))
    }

    /// Directories known now (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.dirs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(1);

    fn dir(ino: u64, mode: u32) -> Attr {
        Attr {
            ino,
            generation: 1,
            mode: libc::S_IFDIR | mode,
            nlink: 2,
            no_xattrs: true,
            ..Attr::default()
        }
    }

    fn st(version: u64, entries: u64) -> Option<DirState> {
        Some(DirState { version, entries })
    }

    #[test]
    fn a_directory_made_empty_is_known_and_follows_our_changes() {
        let (mut k, t) = (KnownDirs::default(), Instant::now());
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        assert_eq!(k.absent_for(5, 1, b"a", 1, TTL, t), Some(TTL));
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(101, 1),
            Change::Added(b"a"),
            t,
        );
        assert_eq!(k.absent_for(5, 1, b"a", 1, TTL, t), None, "a is there now");
        assert!(k.absent_for(5, 1, b"b", 1, TTL, t).is_some());
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(102, 0),
            Change::Removed(b"a"),
            t,
        );
        assert!(k.absent_for(5, 1, b"a", 1, TTL, t).is_some());
        // "." and ".." are always there.
        assert_eq!(k.absent_for(5, 1, b".", 1, TTL, t), None);
        assert_eq!(k.absent_for(5, 1, b"..", 1, TTL, t), None);
    }

    #[test]
    fn a_change_by_anyone_else_forgets_the_directory() {
        let (mut k, t) = (KnownDirs::default(), Instant::now());
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        // Someone else's create came first: two versions on.
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(102, 2),
            Change::Added(b"a"),
            t,
        );
        assert_eq!(k.absent_for(5, 1, b"zzz", 1, TTL, t), None);
        assert_eq!(k.len(), 0);
    }

    #[test]
    fn a_count_that_disagrees_or_no_state_or_another_session_forgets_it() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(101, 2),
            Change::Added(b"a"),
            t,
        );
        assert_eq!(k.len(), 0, "one name of ours but two on the server");
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        k.changed(5, 1, Some(&dir(5, 0o755)), None, Change::Added(b"a"), t);
        assert_eq!(k.len(), 0, "no state");
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        k.changed(
            5,
            2,
            Some(&dir(5, 0o755)),
            st(101, 1),
            Change::Added(b"a"),
            t,
        );
        assert_eq!(k.len(), 0, "another session");
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        assert_eq!(
            k.absent_for(5, 1, b"a", 2, TTL, t),
            None,
            "asked in another session"
        );
        // Removing a name we never knew there: wrong.
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(101, 0),
            Change::Removed(b"x"),
            t,
        );
        assert_eq!(k.len(), 0);
    }

    #[test]
    fn only_directories_everyone_may_search_and_only_made_empty() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        k.made(&dir(5, 0o750), 1, st(100, 0), TTL, t);
        k.made(
            &Attr {
                no_xattrs: false,
                ..dir(6, 0o755)
            },
            1,
            st(100, 0),
            TTL,
            t,
        );
        k.made(&dir(7, 0o755), 1, st(101, 1), TTL, t);
        k.made(&dir(8, 0o755), 1, None, TTL, t);
        assert_eq!(k.len(), 0);
        // A chmod seen in a change's reply forgets it.
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        k.changed(
            5,
            1,
            Some(&dir(5, 0o700)),
            st(101, 1),
            Change::Added(b"a"),
            t,
        );
        assert_eq!(k.len(), 0);
    }

    #[test]
    fn every_class_must_may_search_and_the_generation_must_match() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        // The owner (0o601) or a group member (0o761) may not search: the server
        // answers them EACCES, so nothing may be answered here.
        k.made(&dir(5, 0o601), 1, st(100, 0), TTL, t);
        k.made(&dir(6, 0o761), 1, st(100, 0), TTL, t);
        k.made(&dir(7, 0o716), 1, st(100, 0), TTL, t);
        assert_eq!(k.len(), 0);
        k.made(&dir(5, 0o711), 1, st(100, 0), TTL, t);
        assert!(k.absent_for(5, 1, b"a", 1, TTL, t).is_some());
        // Another directory on the same inode number (a later generation).
        assert_eq!(k.absent_for(5, 2, b"a", 1, TTL, t), None);
        let other = Attr {
            generation: 2,
            ..dir(5, 0o755)
        };
        k.changed(5, 1, Some(&other), st(101, 1), Change::Added(b"a"), t);
        assert_eq!(k.len(), 0, "a change's reply for another generation");
    }

    #[test]
    fn what_is_known_lasts_the_attribute_timeout_after_its_last_confirmation() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        let later = t + Duration::from_millis(600);
        assert_eq!(
            k.absent_for(5, 1, b"a", 1, TTL, later),
            Some(Duration::from_millis(400))
        );
        assert_eq!(
            k.negative_ttl(5, TTL, later),
            Some(Duration::from_millis(400))
        );
        assert_eq!(k.absent_for(5, 1, b"a", 1, TTL, t + TTL), None);
        // A change of ours confirms it again.
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(101, 1),
            Change::Added(b"b"),
            later,
        );
        assert!(k.absent_for(5, 1, b"a", 1, TTL, t + TTL).is_some());
    }

    #[test]
    fn the_bounds_hold() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        for ino in 0..KNOWN_DIRS_MAX as u64 + 5 {
            k.made(&dir(ino, 0o755), 1, st(0, 0), TTL, t);
        }
        assert_eq!(k.len(), KNOWN_DIRS_MAX);
        let mut k = KnownDirs::default();
        k.made(&dir(5, 0o755), 1, st(0, 0), TTL, t);
        for i in 0..KNOWN_NAMES_MAX as u64 {
            let n = i.to_string();
            k.changed(
                5,
                1,
                Some(&dir(5, 0o755)),
                st(i + 1, i + 1),
                Change::Added(n.as_bytes()),
                t,
            );
        }
        assert_eq!(k.len(), 1, "at the bound: still known");
        let n = KNOWN_NAMES_MAX as u64;
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(n + 1, n + 1),
            Change::Added(b"one-more"),
            t,
        );
        assert_eq!(k.len(), 0, "past the bound: forgotten");
    }
}
