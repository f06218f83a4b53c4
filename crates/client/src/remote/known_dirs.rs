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
//! (`negative_ttl`). A lookup is answered here only where the server would let the
//! caller search the directory (`may_search`), so the answer is the server's: the
//! caller's class by the mode bits as the server judges it (the owner by the owner bits
//! alone, a group member by the group bits), no ACL, and for root only a directory every
//! class may search (root may act as root or as the anonymous user, which the client
//! cannot know). A directory is known by inode number and generation: a number freed
//! and reused is another directory.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use zcfs_backend::{Attr, Cred, DirState};

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
    /// Who may search it: mode, owner and group as last seen (a known directory has
    /// no ACL).
    mode: u32,
    uid: u32,
    gid: u32,
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

/// A directory whose names may be known: the mode bits alone say who may search it
/// (an ACL would have its say too).
fn knowable(a: &Attr) -> bool {
    a.is_dir() && a.no_xattrs
}

/// Whether the server lets `cred` search the known directory `k`, whatever its squash
/// policy (root squashed or not, every user squashed or not):
/// - every class has x: whoever the server takes the caller for;
/// - root otherwise never: it acts as root (allowed) or as the anonymous user (judged
///   by the bits), which the client cannot tell apart;
/// - anyone else by the bits of their class (owner, else group, else others), as the
///   server judges it when it keeps their identity; when it squashes every user to the
///   anonymous one, directories this client made belong to that user, whose owner bits
///   then decide, so those must allow search too. Root squash also maps group 0
///   (primary or supplementary) to the anonymous group, which may be the directory's:
///   a caller in group 0 that is not the owner may be judged as group or as others,
///   so both must allow it.
///
/// Not whether the kernel checked (`Cred::checked`): that flag is not sent, and the
/// server checks every lookup after its identity map, where the kernel let root in
/// (CAP_DAC_OVERRIDE) and judged the others by the owner and group it was shown.
fn may_search(k: &Known, cred: &Cred) -> bool {
    if k.mode & 0o111 == 0o111 {
        return true;
    }
    if cred.uid == 0 {
        return false;
    }
    let class = if cred.uid == k.uid {
        k.mode >> 6
    } else if cred.gid == 0 || cred.groups.contains(&0) {
        (k.mode >> 3) & k.mode
    } else if cred.gid == k.gid || cred.groups.contains(&k.gid) {
        k.mode >> 3
    } else {
        k.mode
    };
    class & 1 != 0 && k.mode & 0o100 != 0
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
        if state.entries != 0 || !knowable(made) {
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
                mode: made.mode,
                uid: made.uid,
                gid: made.gid,
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
            && after.is_some_and(|a| knowable(a) && a.generation == k.gen);
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
        if let Some(a) = after {
            (k.mode, k.uid, k.gid) = (a.mode, a.uid, a.gid);
        }
    }

    /// Forget `dir` (a change not counted above, or one that failed).
    pub fn forget(&mut self, dir: u64) {
        self.dirs.remove(&dir);
    }

    /// How much longer `name` may be taken as absent from `dir` of generation `gen`
    /// (None: not known to be): the directory is known in session `epoch`, confirmed
    /// less than `ttl` ago, and does not hold the name.
    #[allow(clippy::too_many_arguments)]
    pub fn absent_for(
        &self,
        dir: u64,
        gen: u64,
        name: &[u8],
        cred: &Cred,
        epoch: u64,
        ttl: Duration,
        now: Instant,
    ) -> Option<Duration> {
        if name == b"." || name == b".." {
            return None;
        }
        let k = self.dirs.get(&dir)?;
        if !may_search(k, cred) {
            return None;
        }
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
            uid: 1000,
            gid: 1000,
            no_xattrs: true,
            ..Attr::default()
        }
    }

    /// The test's caller: the owner of `dir`'s directories.
    fn me() -> Cred {
        Cred::new(1000, 1000, Vec::new())
    }

    fn someone(uid: u32, gid: u32, groups: Vec<u32>) -> Cred {
        Cred::new(uid, gid, groups)
    }

    fn st(version: u64, entries: u64) -> Option<DirState> {
        Some(DirState { version, entries })
    }

    #[test]
    fn a_directory_made_empty_is_known_and_follows_our_changes() {
        let (mut k, t) = (KnownDirs::default(), Instant::now());
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        assert_eq!(k.absent_for(5, 1, b"a", &me(), 1, TTL, t), Some(TTL));
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(101, 1),
            Change::Added(b"a"),
            t,
        );
        assert_eq!(
            k.absent_for(5, 1, b"a", &me(), 1, TTL, t),
            None,
            "a is there now"
        );
        assert!(k.absent_for(5, 1, b"b", &me(), 1, TTL, t).is_some());
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(102, 0),
            Change::Removed(b"a"),
            t,
        );
        assert!(k.absent_for(5, 1, b"a", &me(), 1, TTL, t).is_some());
        // "." and ".." are always there.
        assert_eq!(k.absent_for(5, 1, b".", &me(), 1, TTL, t), None);
        assert_eq!(k.absent_for(5, 1, b"..", &me(), 1, TTL, t), None);
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
        assert_eq!(k.absent_for(5, 1, b"zzz", &me(), 1, TTL, t), None);
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
            k.absent_for(5, 1, b"a", &me(), 2, TTL, t),
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
    fn only_directories_without_an_acl_and_only_made_empty() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
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
        // A reply showing an ACL forgets it.
        k.made(&dir(5, 0o755), 1, st(100, 0), TTL, t);
        let acl = Attr {
            no_xattrs: false,
            ..dir(5, 0o755)
        };
        k.changed(5, 1, Some(&acl), st(101, 1), Change::Added(b"a"), t);
        assert_eq!(k.len(), 0);
    }

    /// Answered only to whom the server would answer "no such name" too, whatever its
    /// squash policy.
    #[test]
    fn answered_only_to_callers_the_server_lets_search() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        let absent = |k: &KnownDirs, ino, who: &Cred| k.absent_for(ino, 1, b"a", who, 1, TTL, t);
        let (owner, member) = (me(), someone(2000, 3000, vec![1000]));
        let (other, root) = (someone(2000, 2000, vec![]), someone(0, 0, vec![]));
        for (ino, mode) in [(5, 0o700), (6, 0o710), (7, 0o711), (8, 0o601), (9, 0o755)] {
            k.made(&dir(ino, mode), 1, st(100, 0), TTL, t);
        }
        // 0o700: the owner only; root never (it may be squashed).
        assert!(absent(&k, 5, &owner).is_some());
        assert!(absent(&k, 5, &member).is_none() && absent(&k, 5, &other).is_none());
        assert!(absent(&k, 5, &root).is_none());
        // 0o710: owner and group (a supplementary group counts).
        assert!(absent(&k, 6, &owner).is_some() && absent(&k, 6, &member).is_some());
        assert!(absent(&k, 6, &other).is_none());
        // 0o711 and 0o755: everyone, root too.
        for ino in [7, 9] {
            for who in [&owner, &member, &other, &root] {
                assert!(absent(&k, ino, who).is_some(), "{ino} {}", who.uid);
            }
        }
        // 0o601: the owner may not search (its own bits decide); others may, but
        // only if the owner may too (every user squashed to the owner's identity).
        for who in [&owner, &member, &other, &root] {
            assert!(absent(&k, 8, who).is_none(), "{}", who.uid);
        }
        // A caller the kernel checked: judged all the same (the server does not know,
        // and checks after its identity map: root squashed, say).
        for who in [&other, &root] {
            let checked = Cred {
                checked: true,
                ..who.clone()
            };
            assert!(absent(&k, 5, &checked).is_none(), "{}", who.uid);
        }
        // A member of group 0 (primary or supplementary) may be in the anonymous group
        // at the server (root squash), the directory's or not: group and others must
        // both allow it.
        for g0 in [someone(2000, 0, vec![]), someone(2000, 2000, vec![0])] {
            k.made(&dir(10, 0o701), 1, st(100, 0), TTL, t);
            k.made(&dir(11, 0o710), 1, st(100, 0), TTL, t);
            k.made(&dir(12, 0o711), 1, st(100, 0), TTL, t);
            assert!(absent(&k, 10, &g0).is_none() && absent(&k, 11, &g0).is_none());
            assert!(absent(&k, 12, &g0).is_some());
        }
        // A chmod seen in a change's reply applies from then on.
        k.changed(
            9,
            1,
            Some(&dir(9, 0o700)),
            st(101, 1),
            Change::Added(b"b"),
            t,
        );
        assert!(absent(&k, 9, &owner).is_some() && absent(&k, 9, &other).is_none());
    }

    #[test]
    fn the_generation_must_match() {
        let t = Instant::now();
        let mut k = KnownDirs::default();
        k.made(&dir(5, 0o711), 1, st(100, 0), TTL, t);
        assert!(k.absent_for(5, 1, b"a", &me(), 1, TTL, t).is_some());
        // Another directory on the same inode number (a later generation).
        assert_eq!(k.absent_for(5, 2, b"a", &me(), 1, TTL, t), None);
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
            k.absent_for(5, 1, b"a", &me(), 1, TTL, later),
            Some(Duration::from_millis(400))
        );
        assert_eq!(
            k.negative_ttl(5, TTL, later),
            Some(Duration::from_millis(400))
        );
        assert_eq!(k.absent_for(5, 1, b"a", &me(), 1, TTL, t + TTL), None);
        // A change of ours confirms it again.
        k.changed(
            5,
            1,
            Some(&dir(5, 0o755)),
            st(101, 1),
            Change::Added(b"b"),
            later,
        );
        assert!(k.absent_for(5, 1, b"a", &me(), 1, TTL, t + TTL).is_some());
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
