//! Who a request acts as. A request names a uid, a gid and supplementary groups; the
//! server decides what it believes:
//!
//! 1. The peer rule (`PeerRule`): on a Unix socket the kernel says which process is at
//!    the other end (SO_PEERCRED). A peer that is not root may act only as itself: a
//!    request naming another uid, or a gid that is neither the peer's gid nor one of its
//!    groups, is refused (EPERM); of the supplementary groups it names, only those the
//!    peer is in count. A root peer, and a TCP peer (authenticated by the secret, or let
//!    in by `--insecure`), may name any identity.
//! 2. The export's identity map (`IdentityMap`), as exports(5): root squash (default),
//!    squash all, or none.
//!
//! The result is the credential every permission check of the backend uses.
//!
//! (Here rather than in zcfs-server so the same-host interface, zcfs-samehost, maps
//! a Unix peer the same way without depending on the network server.)

use crate::{Cred, Error};

/// The anonymous uid and gid by default (nobody, nogroup), as exports(5).
pub const DEFAULT_ANON_ID: u32 = 65_534;

/// Whose identity the export replaces with the anonymous one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Squash {
    /// Root (uid 0) acts as the anonymous user; gid 0 (primary or supplementary) of
    /// anyone acts as the anonymous group (as Linux nfsd does).
    #[default]
    Root,
    /// Every request acts as the anonymous user and group, without groups.
    All,
    /// Identities are taken as they are named (`--no-root-squash`).
    None,
}

/// The export's identity map: squash mode and the anonymous identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdentityMap {
    pub squash: Squash,
    pub anon_uid: u32,
    pub anon_gid: u32,
}

impl Default for IdentityMap {
    fn default() -> Self {
        IdentityMap {
            squash: Squash::Root,
            anon_uid: DEFAULT_ANON_ID,
            anon_gid: DEFAULT_ANON_ID,
        }
    }
}

impl IdentityMap {
    /// The identity a request acts as under this map.
    pub fn map(&self, cred: Cred) -> Cred {
        let anon = || Cred::new(self.anon_uid, self.anon_gid, Vec::new());
        match self.squash {
            Squash::None => cred,
            Squash::All => anon(),
            // Root entirely: uid, gid and groups (a squashed root keeps no group of
            // root's).
            Squash::Root if cred.uid == 0 => anon(),
            Squash::Root => {
                let g = |gid: u32| if gid == 0 { self.anon_gid } else { gid };
                let mut groups: Vec<u32> = cred.groups.iter().map(|&x| g(x)).collect();
                groups.dedup();
                Cred::new(cred.uid, g(cred.gid), groups)
            }
        }
    }
}

/// What a connection's peer may name as its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerRule {
    /// Any identity (a TCP peer; a root process on the Unix socket).
    Any,
    /// Only itself (a process that is not root on the Unix socket).
    Only {
        uid: u32,
        gid: u32,
        /// Its supplementary groups when it connected.
        groups: Vec<u32>,
    },
}

impl PeerRule {
    /// The identity a request naming `uid`, `gid` and `groups` may act as, before the
    /// identity map.
    pub fn check(&self, uid: u32, gid: u32, groups: Vec<u32>) -> Result<Cred, Error> {
        match self {
            PeerRule::Any => Ok(Cred::new(uid, gid, groups)),
            PeerRule::Only {
                uid: puid,
                gid: pgid,
                groups: pgroups,
            } => {
                if uid != *puid {
                    return Err(Error::new(
                        libc::EPERM,
                        format!("a peer running as uid {puid} may not act as uid {uid}"),
                    ));
                }
                if gid != *pgid && !pgroups.contains(&gid) {
                    return Err(Error::new(
                        libc::EPERM,
                        format!("a peer running as uid {puid} is not in group {gid}"),
                    ));
                }
                let groups = groups
                    .into_iter()
                    .filter(|g| g == pgid || pgroups.contains(g))
                    .collect();
                Ok(Cred::new(uid, gid, groups))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred::new(uid, gid, groups.to_vec())
    }

    #[test]
    fn root_squash_maps_root_and_group_zero_to_anon() {
        let m = IdentityMap::default();
        assert_eq!(m.squash, Squash::Root);
        assert_eq!(m.map(cred(0, 0, &[0, 4, 27])), cred(65534, 65534, &[]));
        assert_eq!(m.map(cred(0, 100, &[4])), cred(65534, 65534, &[]));
        assert_eq!(
            m.map(cred(1001, 0, &[0, 5])),
            cred(1001, 65534, &[65534, 5])
        );
        assert_eq!(m.map(cred(1001, 1001, &[5, 6])), cred(1001, 1001, &[5, 6]));
        let m = IdentityMap {
            anon_uid: 7,
            anon_gid: 8,
            ..m
        };
        assert_eq!(m.map(cred(0, 0, &[1])), cred(7, 8, &[]));
    }

    #[test]
    fn squash_all_makes_everyone_anon() {
        let m = IdentityMap {
            squash: Squash::All,
            ..Default::default()
        };
        for c in [
            cred(0, 0, &[0]),
            cred(1001, 1001, &[5]),
            cred(65534, 1, &[]),
        ] {
            assert_eq!(m.map(c), cred(65534, 65534, &[]));
        }
    }

    #[test]
    fn no_root_squash_changes_nothing() {
        let m = IdentityMap {
            squash: Squash::None,
            ..Default::default()
        };
        for c in [cred(0, 0, &[0, 4]), cred(1001, 0, &[5])] {
            assert_eq!(m.map(c.clone()), c);
        }
    }

    #[test]
    fn a_peer_that_is_not_root_acts_only_as_itself() {
        let p = PeerRule::Only {
            uid: 1001,
            gid: 1001,
            groups: vec![1001, 50],
        };
        assert_eq!(
            p.check(1001, 1001, vec![50]).unwrap(),
            cred(1001, 1001, &[50])
        );
        assert_eq!(p.check(1001, 50, vec![]).unwrap(), cred(1001, 50, &[]));
        assert_eq!(p.check(0, 0, vec![]).unwrap_err().errno, libc::EPERM);
        assert_eq!(p.check(1002, 1001, vec![]).unwrap_err().errno, libc::EPERM);
        assert_eq!(p.check(1001, 0, vec![]).unwrap_err().errno, libc::EPERM);
        // Groups it is not in do not count.
        assert_eq!(
            p.check(1001, 1001, vec![0, 50, 27]).unwrap(),
            cred(1001, 1001, &[50])
        );
        assert_eq!(
            PeerRule::Any.check(0, 0, vec![4]).unwrap(),
            cred(0, 0, &[4])
        );
    }
}
