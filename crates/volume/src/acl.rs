//! POSIX access control lists, as Linux keeps and applies them (fs/posix_acl.c): the
//! `system.posix_acl_access` / `system.posix_acl_default` xattr format, validation,
//! the access check, and how an ACL and the mode bits follow each other (chmod rewrites
//! the ACL, setting an ACL rewrites the mode, a new inode inherits its directory's
//! default ACL instead of the umask).

use crate::error::{FsError, Result};
use zcfs_types::Cred;

/// The xattr holding an inode's access ACL.
pub const ACCESS_XATTR: &[u8] = b"system.posix_acl_access";
/// The xattr holding a directory's default ACL (inherited by what is created in it).
pub const DEFAULT_XATTR: &[u8] = b"system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`: the first four bytes of the xattr value.
const XATTR_VERSION: u32 = 2;
/// Bytes of the value's header and of each entry (tag u16, perm u16, id u32).
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;
/// Most entries an ACL may have: what the kernel's FUSE client can carry in one page
/// (`fuse_set_acl` refuses a larger value with E2BIG), (4096 - 4) / 8.
pub const MAX_ENTRIES: usize = (4096 - HEADER_BYTES) / ENTRY_BYTES;

/// Entry tags, in the order a valid ACL lists them.
pub const USER_OBJ: u16 = 0x01;
pub const USER: u16 = 0x02;
pub const GROUP_OBJ: u16 = 0x04;
pub const GROUP: u16 = 0x08;
pub const MASK: u16 = 0x10;
pub const OTHER: u16 = 0x20;
/// The id field of entries that name no one.
const UNDEFINED_ID: u32 = u32::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub tag: u16,
    /// rwx bits (4, 2, 1).
    pub perm: u16,
    /// The user or group of a USER / GROUP entry.
    pub id: u32,
}

/// A valid ACL: one USER_OBJ, GROUP_OBJ and OTHER entry, a MASK whenever a named entry
/// exists, the classes in that order (`posix_acl_valid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl(Vec<Entry>);

fn invalid(why: &str) -> FsError {
    FsError::Invalid(format!("POSIX ACL: {why}"))
}

impl Acl {
    /// Decode and validate an xattr value (`posix_acl_from_xattr` + `posix_acl_valid`).
    pub fn decode(b: &[u8]) -> Result<Acl> {
        if b.len() < HEADER_BYTES || !(b.len() - HEADER_BYTES).is_multiple_of(ENTRY_BYTES) {
            return Err(invalid("value is not a header and whole entries"));
        }
        if u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) != XATTR_VERSION {
            return Err(invalid("unknown version"));
        }
        let n = (b.len() - HEADER_BYTES) / ENTRY_BYTES;
        if n > MAX_ENTRIES {
            return Err(FsError::Invalid(format!(
                "POSIX ACL: {n} entries, at most {MAX_ENTRIES}"
            )));
        }
        let entries = b[HEADER_BYTES..]
            .chunks_exact(ENTRY_BYTES)
            .map(|e| Entry {
                tag: u16::from_le_bytes([e[0], e[1]]),
                perm: u16::from_le_bytes([e[2], e[3]]),
                id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
            })
            .collect();
        let acl = Acl(entries);
        acl.validate()?;
        Ok(acl)
    }

    /// Check a value of only the header (an ACL with no entries: "no ACL").
    pub fn decode_header(b: &[u8]) -> Result<()> {
        if b.len() != HEADER_BYTES
            || u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) != XATTR_VERSION
        {
            return Err(invalid("value is not a header and whole entries"));
        }
        Ok(())
    }

    /// The canonical xattr value (ids of unnamed entries as the kernel writes them).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER_BYTES + self.0.len() * ENTRY_BYTES);
        b.extend_from_slice(&XATTR_VERSION.to_le_bytes());
        for e in &self.0 {
            let id = if matches!(e.tag, USER | GROUP) {
                e.id
            } else {
                UNDEFINED_ID
            };
            b.extend_from_slice(&e.tag.to_le_bytes());
            b.extend_from_slice(&e.perm.to_le_bytes());
            b.extend_from_slice(&id.to_le_bytes());
        }
        b
    }

    pub fn entries(&self) -> &[Entry] {
        &self.0
    }

    /// `posix_acl_valid`.
    fn validate(&self) -> Result<()> {
        // The state machine walks the tags in their required order.
        let mut state = USER_OBJ;
        let mut needs_mask = false;
        for e in &self.0 {
            if e.perm & !7 != 0 {
                return Err(invalid("permission bits other than rwx"));
            }
            match e.tag {
                USER_OBJ if state == USER_OBJ => state = USER,
                // Like the kernel, named entries' order and uniqueness are the
                // setter's business (setfacl sorts them); only the classes' order counts.
                USER if state == USER => needs_mask = true,
                GROUP_OBJ if state == USER => state = GROUP,
                GROUP if state == GROUP => needs_mask = true,
                MASK if state == GROUP => state = OTHER,
                OTHER if state == OTHER || (state == GROUP && !needs_mask) => state = 0,
                _ => return Err(invalid("entries missing, repeated or out of order")),
            }
        }
        if state != 0 {
            return Err(invalid("entries missing"));
        }
        Ok(())
    }

    fn find(&self, tag: u16) -> Option<usize> {
        self.0.iter().position(|e| e.tag == tag)
    }

    /// `posix_acl_permission` for a caller who does not own the file: does the ACL grant
    /// `want` (rwx bits)? `owner_gid` is the file's group (the GROUP_OBJ entry's).
    pub fn permits(&self, cred: &Cred, owner_gid: u32, want: u32) -> bool {
        let want = (want & 7) as u16;
        let mask = self.find(MASK).map(|i| self.0[i].perm).unwrap_or(7);
        let mut group_found = false;
        for e in &self.0 {
            match e.tag {
                // The owner class was decided on the mode bits before the ACL was asked.
                USER_OBJ => {}
                USER if e.id == cred.uid => return e.perm & mask & want == want,
                GROUP_OBJ | GROUP => {
                    let gid = if e.tag == GROUP_OBJ { owner_gid } else { e.id };
                    if cred.in_group(gid) {
                        group_found = true;
                        if e.perm & want == want {
                            return e.perm & mask & want == want;
                        }
                    }
                }
                OTHER => return !group_found && e.perm & want == want,
                _ => {}
            }
        }
        false
    }

    /// `posix_acl_equiv_mode`: the rwx bits of the mode this ACL implies (owner from
    /// USER_OBJ, group from MASK or else GROUP_OBJ, other from OTHER), and whether the
    /// mode alone says everything the ACL does.
    pub fn equiv_mode(&self) -> (u32, bool) {
        let mut mode = 0u32;
        let mut equiv = true;
        for e in &self.0 {
            let p = (e.perm & 7) as u32;
            match e.tag {
                USER_OBJ => mode |= p << 6,
                GROUP_OBJ => mode |= p << 3,
                OTHER => mode |= p,
                MASK => {
                    mode = (mode & !0o070) | (p << 3);
                    equiv = false;
                }
                _ => equiv = false,
            }
        }
        (mode, equiv)
    }

    /// `__posix_acl_chmod`: after a chmod, the ACL's owner, group class (the mask, or
    /// GROUP_OBJ without one) and other entries take the new mode's bits.
    pub fn chmod(&mut self, mode: u32) {
        let class = self.find(MASK).or_else(|| self.find(GROUP_OBJ));
        for (i, e) in self.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ if Some(i) == class => e.perm = ((mode >> 3) & 7) as u16,
                _ => {}
            }
        }
    }

    /// `posix_acl_create_masq`: a default ACL cloned for a new inode created with
    /// `mode`: entries lose what the mode does not grant and the mode loses what they
    /// do not grant. Returns the new rwx bits and whether the ACL says more than they
    /// do (so it must be kept as the inode's access ACL).
    pub fn create_masq(&mut self, mode: u32) -> (u32, bool) {
        let mut mode = mode & 0o777;
        let mut equiv = true;
        let class = self.find(MASK).or_else(|| self.find(GROUP_OBJ));
        for e in self.0.iter_mut() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= ((e.perm as u32) << 6) | !0o700;
                }
                OTHER => {
                    e.perm &= (mode & 7) as u16;
                    mode &= (e.perm as u32) | !0o007;
                }
                USER | GROUP | MASK => equiv = false,
                _ => {}
            }
        }
        if let Some(c) = class {
            let e = &mut self.0[c];
            e.perm &= ((mode >> 3) & 7) as u16;
            mode &= ((e.perm as u32) << 3) | !0o070;
        }
        (mode, !equiv)
    }
}

/// What a new inode takes from its directory's default ACL (`posix_acl_create`):
/// the permission bits (`mode` with the umask applied when there is no default ACL,
/// masked by the default ACL when there is), the access ACL to store (when the mode
/// cannot say it all), and the default ACL to store (a new directory inherits it).
pub struct Inherited {
    pub mode: u32,
    pub access: Option<Vec<u8>>,
    pub default: Option<Vec<u8>>,
}

/// `dir_default`: the directory's stored default ACL, if any. `mode` carries the file
/// type; symbolic links take no ACL and ignore the umask, as on Linux.
pub fn inherit(
    dir_default: Option<&[u8]>,
    mode: u32,
    umask: u32,
    is_dir: bool,
) -> Result<Inherited> {
    let kind = mode & !0o7777;
    let special = mode & 0o7000;
    let Some(bytes) = dir_default else {
        return Ok(Inherited {
            mode: mode & !(umask & 0o777),
            access: None,
            default: None,
        });
    };
    let default = Acl::decode(bytes)?;
    let mut access = default.clone();
    let (rwx, keep) = access.create_masq(mode);
    Ok(Inherited {
        mode: kind | special | rwx,
        access: keep.then(|| access.encode()),
        default: is_dir.then(|| default.encode()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred::new(uid, gid, groups.to_vec())
    }

    #[test]
    fn round_trip_and_validation() {
        let a = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 4, 65534),
            (GROUP_OBJ, 4, 0),
            (MASK, 4, 0),
            (OTHER, 0, 0),
        ]);
        assert!(a.validate().is_ok());
        assert_eq!(Acl::decode(&a.encode()).unwrap().encode(), a.encode());
        let bad = [
            acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0)]),
            acl(&[
                (USER_OBJ, 6, 0),
                (USER, 4, 5),
                (GROUP_OBJ, 4, 0),
                (OTHER, 0, 0),
            ]),
            acl(&[(GROUP_OBJ, 4, 0), (USER_OBJ, 6, 0), (OTHER, 0, 0)]),
            acl(&[
                (USER_OBJ, 6, 0),
                (GROUP_OBJ, 4, 0),
                (OTHER, 0, 0),
                (OTHER, 0, 0),
            ]),
            acl(&[(USER_OBJ, 8, 0), (GROUP_OBJ, 4, 0), (OTHER, 0, 0)]),
        ];
        for b in bad {
            assert!(Acl::decode(&b.encode()).is_err(), "{b:?}");
        }
        assert!(Acl::decode(&[2, 0, 0, 0, 1]).is_err());
        assert!(Acl::decode(&[1, 0, 0, 0]).is_err(), "version");
    }

    #[test]
    fn at_most_max_entries() {
        let named = |n: usize| {
            let mut e = vec![(USER_OBJ, 6, 0)];
            e.extend((0..n as u32).map(|i| (USER, 4, 1000 + i)));
            e.extend([(GROUP_OBJ, 4, 0), (MASK, 4, 0), (OTHER, 0, 0)]);
            acl(&e)
        };
        let fits = named(MAX_ENTRIES - 4);
        assert!(Acl::decode(&fits.encode()).is_ok());
        assert!(Acl::decode(&named(MAX_ENTRIES - 3).encode()).is_err());
    }

    #[test]
    fn named_entries_are_limited_by_the_mask() {
        let a = acl(&[
            (USER_OBJ, 6, 0),
            (USER, 6, 7),
            (GROUP_OBJ, 0, 0),
            (GROUP, 4, 30),
            (MASK, 4, 0),
            (OTHER, 0, 0),
        ]);
        assert!(a.permits(&user(7, 7, &[]), 20, 4));
        assert!(!a.permits(&user(7, 7, &[]), 20, 2), "mask has no w");
        assert!(a.permits(&user(8, 8, &[30]), 20, 4));
        assert!(
            !a.permits(&user(8, 20, &[]), 20, 4),
            "group_obj grants nothing"
        );
        // A matching group entry that does not grant denies; other is not consulted.
        let b = acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 0, 0), (OTHER, 4, 0)]);
        assert!(!b.permits(&user(8, 20, &[]), 20, 4));
        assert!(b.permits(&user(8, 21, &[]), 20, 4));
    }

    #[test]
    fn mode_and_acl_follow_each_other() {
        let mut a = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 6, 7),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 1, 0),
        ]);
        assert_eq!(a.equiv_mode(), (0o771, false));
        a.chmod(0o640);
        assert_eq!(
            a.entries().iter().map(|e| e.perm).collect::<Vec<_>>(),
            [6, 6, 5, 4, 0]
        );
        let plain = acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
        assert_eq!(plain.equiv_mode(), (0o644, true));
    }

    #[test]
    fn new_inodes_inherit_the_default_acl_not_the_umask() {
        let d = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 7),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 5, 0),
        ])
        .encode();
        let f = inherit(Some(&d), 0o100666, 0o077, false).unwrap();
        assert_eq!(f.mode, 0o100664, "umask ignored, mask from mode");
        let a = Acl::decode(f.access.as_ref().unwrap()).unwrap();
        assert_eq!(
            a.entries().iter().map(|e| e.perm).collect::<Vec<_>>(),
            [6, 7, 5, 6, 4]
        );
        assert!(f.default.is_none());
        let dir = inherit(Some(&d), 0o40777, 0o077, true).unwrap();
        assert_eq!(dir.mode, 0o40775);
        assert_eq!(dir.default.as_deref(), Some(&d[..]));
        let none = inherit(None, 0o100666, 0o022, false).unwrap();
        assert_eq!((none.mode, none.access.is_none()), (0o100644, true));
        // A default ACL of only the base entries leaves no access ACL behind.
        let base = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 7, 0), (OTHER, 0, 0)]).encode();
        let g = inherit(Some(&base), 0o100666, 0o022, false).unwrap();
        assert_eq!((g.mode, g.access.is_none()), (0o100660, true));
    }
}
