//! What a RemoteFs knows of the server's inodes: generations, the two reference counts,
//! and the attribute, name and absent-xattr caches (kept for the attribute timeout;
//! an operation that changes an inode refreshes or drops every cached copy of it).

use super::RemoteFs;
use crate::lock;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use zcfs_backend::*;

/// What we know of an inode.
#[derive(Default)]
pub(super) struct Node {
    /// Its generation (0 = not known yet).
    pub(super) gen: u64,
    /// References handed to our caller and not yet forgotten.
    pub(super) caller_refs: u64,
    /// References the server holds for our session.
    pub(super) server_refs: u64,
    /// Of `server_refs`, those readdirplus listings received and have not passed on
    /// yet (the node lives while there are any).
    pub(super) listing: u64,
    /// Name cache keys that pointed at it (dropped with it).
    pub(super) names: Vec<(u64, Vec<u8>)>,
}

#[derive(Default)]
pub(super) struct Meta {
    pub(super) attrs: HashMap<u64, (Attr, Instant)>,
    pub(super) names: HashMap<(u64, Vec<u8>), (u64, Instant)>,
    /// Extended attributes known to be absent, by inode (`ls -l` asks for ACLs of
    /// every entry): names and when the server said so.
    pub(super) no_xattr: HashMap<u64, Vec<(Vec<u8>, Instant)>>,
    pub(super) nodes: HashMap<u64, Node>,
    /// The session epoch `server_refs` count in (the client's, set by revalidation).
    pub(super) epoch: u64,
    /// Invalidations of cached attributes so far, and the count at each inode's last
    /// one (`invalidated_all`: at the last of every inode). A reply's attributes of an
    /// inode are cached only if it was not invalidated since the request went out (as
    /// the kernel's attr_version): otherwise an older reply handled after a concurrent
    /// change would undo the change's drop (review findings rv-lf 3, rv-lf2 F1-F2).
    invalidations: u64,
    invalidated: HashMap<u64, u64>,
    invalidated_all: u64,
}

/// Most inodes whose last invalidation is remembered; past this every earlier token
/// counts as invalidated (replies then fall back to asking the server).
pub const INVALIDATED_MAX: usize = 65536;

impl Meta {
    pub(super) fn drop_caches(&mut self) {
        self.attrs.clear();
        self.names.clear();
        self.no_xattr.clear();
        self.invalidations += 1;
        self.invalidated.clear();
        self.invalidated_all = self.invalidations;
    }

    /// Drop `ino`'s cached attributes, and count it.
    pub(super) fn invalidate(&mut self, ino: u64) {
        self.attrs.remove(&ino);
        self.invalidations += 1;
        if self.invalidated.len() >= INVALIDATED_MAX {
            self.invalidated.clear();
            self.invalidated_all = self.invalidations;
        }
        self.invalidated.insert(ino, self.invalidations);
    }

    /// Where the invalidations stand (taken when a request goes out).
    pub(super) fn token(&self) -> u64 {
        self.invalidations
    }

    /// Whether `ino` was invalidated after `token` was taken.
    pub(super) fn invalidated_since(&self, ino: u64, token: u64) -> bool {
        self.invalidated_all > token || self.invalidated.get(&ino).is_some_and(|&at| at > token)
    }

    /// How old the oldest copy of `ino`'s attributes, names or absent extended
    /// attributes is that is still answered from (younger than `ttl`; zero when there
    /// is none): a lookup or getattr answered now may be that old. Absent xattrs count
    /// because the kernel caches POSIX ACLs with the attributes (FUSE_POSIX_ACL): an
    /// old "no ACL" answered after a fresh getattr would live a whole timeout more.
    pub(super) fn age(&self, ino: u64, ttl: Duration) -> Duration {
        let attr = self.attrs.get(&ino).map(|(_, t)| t.elapsed());
        let absent = self
            .no_xattr
            .get(&ino)
            .into_iter()
            .flatten()
            .map(|(_, t)| t.elapsed());
        let names = self.nodes.get(&ino).into_iter().flat_map(|n| {
            n.names
                .iter()
                .filter_map(|k| self.names.get(k))
                .filter(|(i, _)| *i == ino)
                .map(|(_, t)| t.elapsed())
        });
        attr.into_iter()
            .chain(absent)
            .chain(names)
            .filter(|age| *age < ttl)
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Whether the server said `name` of `ino` is absent less than `ttl` ago.
    pub(super) fn xattr_absent(&self, ino: u64, name: &[u8], ttl: Duration) -> bool {
        self.no_xattr
            .get(&ino)
            .is_some_and(|v| v.iter().any(|(n, t)| n == name && t.elapsed() < ttl))
    }

    /// The server says `name` of `ino` is absent (now).
    pub(super) fn set_xattr_absent(&mut self, ino: u64, name: &[u8], ttl: Duration) {
        let v = self.no_xattr.entry(ino).or_default();
        // Expired entries go; the list stays as short as the names asked within a timeout.
        v.retain(|(n, t)| n != name && t.elapsed() < ttl);
        v.push((name.to_vec(), Instant::now()));
    }

    /// `name` of `ino` may exist now.
    pub(super) fn forget_xattr_absent(&mut self, ino: u64, name: &[u8]) {
        if let Some(v) = self.no_xattr.get_mut(&ino) {
            v.retain(|(n, _)| n != name);
            if v.is_empty() {
                self.no_xattr.remove(&ino);
            }
        }
    }

    /// Drop what we know of `ino` (its names and attributes too).
    /// A change of ours to `ino` was answered with its attributes after the change
    /// (`after`; None: unknown). They replace what is cached only if `ino` was not
    /// invalidated since the request went out (`token`); either way the change counts
    /// as an invalidation, so a reply to a request sent before it and handled after it
    /// (which carries what was true before) is refused in turn. This is the kernel's
    /// attr_version rule: every reply is judged by the invalidations since its request.
    pub(super) fn replace(&mut self, ino: u64, after: Option<&Attr>, token: u64, caching: bool) {
        let fresh = !self.invalidated_since(ino, token);
        self.invalidate(ino);
        if let Some(a) = after.filter(|a| a.ino == ino) {
            self.nodes.entry(ino).or_default().gen = a.generation;
            if fresh && caching {
                self.attrs.insert(ino, (a.clone(), Instant::now()));
            }
        }
    }

    pub(super) fn drop_node(&mut self, ino: u64) {
        let Some(node) = self.nodes.remove(&ino) else {
            return;
        };
        for key in node.names {
            if self.names.get(&key).is_some_and(|(i, _)| *i == ino) {
                self.names.remove(&key);
            }
        }
        self.invalidate(ino);
        self.no_xattr.remove(&ino);
    }

    /// `ino` may be unheld now: if our caller holds no reference, the server's
    /// references that no listing is passing on go back (returned: how many), and the
    /// node is dropped once no listing holds any either.
    pub(super) fn settle(&mut self, ino: u64) -> u64 {
        let Some(node) = self.nodes.get_mut(&ino) else {
            return 0;
        };
        if node.caller_refs > 0 {
            return 0;
        }
        let give = node.server_refs.saturating_sub(node.listing);
        node.server_refs -= give;
        if node.listing == 0 {
            self.drop_node(ino);
        }
        give
    }
}

impl RemoteFs {
    /// Attributes received in reply to a request sent at `token`: remember the
    /// generation, and cache them unless `a.ino` was invalidated since (the reply may be
    /// older than a change made meanwhile: see `Meta::replace`).
    pub(super) fn remember_since(&self, a: &Attr, token: u64) {
        let mut m = lock(&self.meta);
        self.remember_locked_since(&mut m, a, token);
    }

    /// `remember_since` with the lock held.
    pub(super) fn remember_locked_since(&self, m: &mut Meta, a: &Attr, token: u64) {
        if m.invalidated_since(a.ino, token) {
            m.nodes.entry(a.ino).or_default().gen = a.generation;
        } else {
            self.remember_locked(m, a);
        }
    }

    /// Remember the generation and cache `a` as it is (a caller that knows it is
    /// current: see `remember_locked_since`).
    pub(super) fn remember_locked(&self, m: &mut Meta, a: &Attr) {
        m.nodes.entry(a.ino).or_default().gen = a.generation;
        if self.caching() {
            m.attrs.insert(a.ino, (a.clone(), Instant::now()));
        }
    }

    /// Directory `dir` was changed by an operation of ours whose reply says what it is
    /// now (None: unknown, so it is forgotten and asked for when needed). `token`: the
    /// invalidations when the request went out (`inval_token`). See `Meta::replace`.
    pub(super) fn dir_changed(&self, dir: u64, after: Option<Attr>, token: u64) {
        lock(&self.meta).replace(dir, after.as_ref(), token, self.caching());
    }

    /// `ino` changed by a request of ours sent at `token`, answered with `a`.
    pub(super) fn changed_to(&self, a: &Attr, token: u64) {
        lock(&self.meta).replace(a.ino, Some(a), token, self.caching());
    }

    /// Where invalidations stand, to take just before sending a request whose reply
    /// brings attributes (after the request's own invalidations).
    pub(super) fn inval_token(&self) -> u64 {
        lock(&self.meta).token()
    }

    /// A change of `ino` that brings no attributes back (setxattr, removexattr) is
    /// done: its attributes are dropped, and counted, once more. A request sent before
    /// it may be answered after it with what was true before the change (its
    /// reply is older than ours though handled later); invalidating before sending
    /// alone would not stop that reply from being cached, since it went out after
    /// that invalidation (the kernel's FUSE client likewise bumps attr_version after
    /// such a change).
    pub(super) fn after_change(&self, ino: u64) {
        lock(&self.meta).invalidate(ino);
    }

    pub(super) fn forget_attr(&self, ino: u64) {
        lock(&self.meta).invalidate(ino);
    }

    /// A name in `parent` changed: drop it and the parent's attributes.
    pub(super) fn forget_name(&self, parent: u64, name: &[u8]) {
        let mut m = lock(&self.meta);
        m.names.remove(&(parent, name.to_vec()));
        m.invalidate(parent);
    }

    /// An entry the server sent in session `epoch` (it holds a reference for us there),
    /// handed to our caller (one reference for it). `name`: where it was found, to
    /// cache; `token`: the invalidations when the request went out (`inval_token`).
    pub(super) fn entry(
        &self,
        a: Attr,
        epoch: u64,
        name: Option<(u64, &[u8])>,
        token: u64,
    ) -> Attr {
        let mut m = lock(&self.meta);
        self.remember_locked_since(&mut m, &a, token);
        let current = m.epoch == epoch;
        let node = m.nodes.entry(a.ino).or_default();
        if current {
            node.server_refs += 1;
        }
        node.caller_refs += 1;
        if let Some((parent, n)) = name {
            let key = (parent, n.to_vec());
            if self.caching() {
                if !node.names.contains(&key) {
                    node.names.push(key.clone());
                }
                m.names.insert(key, (a.ino, Instant::now()));
            }
        }
        a
    }

    /// A lookup answered from the name cache, if the server still holds a reference
    /// to the inode cached under that name (so its number was not reused).
    pub(super) fn cached_lookup(&self, parent: u64, name: &[u8]) -> Option<Attr> {
        if !self.caching() {
            return None;
        }
        let (ino, attr) = {
            let mut m = lock(&self.meta);
            let (ino, t) = *m.names.get(&(parent, name.to_vec()))?;
            if !self.ttl_ok(&t) {
                return None;
            }
            let attr = m
                .attrs
                .get(&ino)
                .filter(|(_, t)| self.ttl_ok(t))
                .map(|(a, _)| a.clone());
            let node = m.nodes.get_mut(&ino)?;
            if node.server_refs == 0 {
                return None;
            }
            // The caller's reference, taken under the lock: a concurrent forget cannot
            // give the server's back between the check and here.
            node.caller_refs += 1;
            (ino, attr)
        };
        match attr {
            Some(a) => Some(a),
            None => match self.getattr(ino) {
                Ok(a) => Some(a),
                Err(_) => {
                    self.forget(ino, 1);
                    None
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ACL: &[u8] = b"system.posix_acl_access";

    fn dir(ctime: i64, size: u64) -> Attr {
        Attr {
            ino: 9,
            size,
            ctime: zcfs_backend::Time {
                sec: ctime,
                nsec: 0,
            },
            ..Default::default()
        }
    }

    /// Replies of two changes of one directory, sent one after the other and handled
    /// in either order: the one handled second is refused (it may be the older), and
    /// nothing older than a change already handled is ever cached; a reply after an
    /// invalidation, an unknown or wrong directory, or no caching leave nothing.
    #[test]
    fn a_directorys_attributes_from_replies_are_judged_by_the_invalidations_since() {
        let cached = |m: &Meta| m.attrs.get(&9).map(|(a, _)| a.size);
        let mut m = Meta::default();
        let t = m.token();
        m.replace(9, Some(&dir(10, 1)), t, true);
        assert_eq!(cached(&m), Some(1));
        // Two in flight: the newer's reply handled first, then the older's.
        let (older, newer) = (m.token(), m.token());
        m.replace(9, Some(&dir(12, 3)), newer, true);
        assert_eq!(cached(&m), Some(3));
        m.replace(9, Some(&dir(11, 2)), older, true);
        assert_eq!(cached(&m), None, "an older reply handled after a newer one");
        // A reply to a request sent before a concurrent invalidation (a setxattr, a
        // rename) is not cached, however new its ctime.
        let sent = m.token();
        m.invalidate(9);
        m.replace(9, Some(&dir(18, 10)), sent, true);
        assert_eq!(cached(&m), None, "attributes from before an invalidation");
        let t = m.token();
        m.drop_caches();
        m.replace(9, Some(&dir(19, 11)), t, true);
        assert_eq!(
            cached(&m),
            None,
            "attributes from before dropping every cache"
        );
        let t = m.token();
        m.replace(9, None, t, true);
        assert_eq!(cached(&m), None, "unknown after the change");
        let t = m.token();
        let other = Attr {
            ino: 8,
            ..dir(20, 12)
        };
        m.replace(9, Some(&other), t, true);
        assert_eq!(cached(&m), None, "another inode's attributes");
        let t = m.token();
        m.replace(9, Some(&dir(21, 13)), t, false);
        assert_eq!(cached(&m), None, "cached without caching");
        let t = m.token();
        m.replace(9, Some(&dir(22, 14)), t, true);
        assert_eq!(cached(&m), Some(14));
    }

    /// Past `INVALIDATED_MAX` remembered inodes every earlier token counts as
    /// invalidated (never as fresh).
    #[test]
    fn past_the_bound_every_earlier_token_is_invalidated() {
        let mut m = Meta::default();
        let t = m.token();
        for ino in 100..=100 + INVALIDATED_MAX as u64 {
            m.invalidate(ino);
        }
        assert!(m.invalidated.len() <= INVALIDATED_MAX);
        assert!(
            m.invalidated_since(7, t),
            "an inode never invalidated, after the bound"
        );
        let t = m.token();
        assert!(!m.invalidated_since(7, t));
    }

    #[test]
    fn an_absent_xattr_counts_in_the_age_of_its_inode_until_forgotten() {
        let ttl = Duration::from_secs(60);
        let mut m = Meta::default();
        m.set_xattr_absent(5, ACL, ttl);
        std::thread::sleep(Duration::from_millis(20));
        assert!(m.xattr_absent(5, ACL, ttl));
        assert!(!m.xattr_absent(5, b"user.x", ttl));
        assert!(!m.xattr_absent(6, ACL, ttl));
        assert!(
            m.age(5, ttl) >= Duration::from_millis(20),
            "absent xattr not counted"
        );
        assert_eq!(m.age(6, ttl), Duration::ZERO);
        m.forget_xattr_absent(5, ACL);
        assert!(!m.xattr_absent(5, ACL, ttl));
        assert_eq!(m.age(5, ttl), Duration::ZERO);
        assert!(
            m.no_xattr.is_empty(),
            "an inode with no names left stays listed"
        );
    }

    #[test]
    fn an_expired_absent_xattr_is_not_answered_and_goes_when_the_inode_is_asked_again() {
        let ttl = Duration::from_millis(10);
        let mut m = Meta::default();
        m.set_xattr_absent(5, ACL, ttl);
        m.set_xattr_absent(5, b"user.a", ttl);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!m.xattr_absent(5, ACL, ttl));
        assert_eq!(
            m.age(5, ttl),
            Duration::ZERO,
            "an expired entry still ages the inode"
        );
        m.set_xattr_absent(5, b"user.b", ttl);
        assert_eq!(m.no_xattr[&5].len(), 1, "expired names were kept");
        m.no_xattr.remove(&5);
        m.nodes.insert(7, Node::default());
        m.set_xattr_absent(7, ACL, ttl);
        m.drop_node(7);
        assert!(m.no_xattr.is_empty());
    }
}
