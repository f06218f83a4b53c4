//! POSIX permission rules, as Linux applies them to a file system that checks for itself
//! (fs/namei.c `generic_permission` and `may_delete`, fs/attr.c `setattr_prepare` and
//! `setattr_copy`, `inode_init_owner` / `mode_strip_sgid`, `file_remove_privs`). Pure
//! functions of an inode's mode, owner and group and the caller's credentials; the
//! volume applies them under its lock, so the check and the change see the same inode.
//!
//! Root (uid 0) stands for a caller with the file capabilities (DAC override, FOWNER,
//! CHOWN, FSETID): it passes every check but one (executing a file no one may execute).
//! A credential marked `checked` has been vetted by a trusted party (a kernel mounted
//! with `default_permissions`): nothing is checked again.

use crate::acl::{Acl, ACCESS_XATTR, DEFAULT_XATTR};
use crate::error::{FsError, Result};
use crate::layout::{InodeRec, S_IFBLK, S_IFCHR, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, S_ISGID};
use crate::volume::Inode;
use zcfs_types::{Cred, SetAttr, SetTime};

pub const MAY_EXEC: u32 = 1;
pub const MAY_WRITE: u32 = 2;
pub const MAY_READ: u32 = 4;

pub(crate) const S_ISUID: u32 = 0o4000;
pub(crate) const S_ISVTX: u32 = 0o1000;
const S_IXGRP: u32 = 0o010;

fn denied(what: &str) -> FsError {
    FsError::AccessDenied(what.to_string())
}

fn not_permitted(what: &str) -> FsError {
    FsError::NotPermitted(what.to_string())
}

/// `generic_permission`: may `cred` access `inode` for `mask` (MAY_* bits)? The owner
/// class is decided on the mode bits; anyone else goes through the access ACL when
/// there is one and its group class (the mask) grants anything (`acl_permission_check`).
pub(crate) fn check(cred: &Cred, inode: &Inode, mask: u32) -> Result<()> {
    let rec = &inode.rec;
    if cred.checked {
        return Ok(());
    }
    if cred.is_root() {
        // DAC override, except execution of a file no one may execute.
        if mask & MAY_EXEC != 0 && !rec.is_dir() && rec.mode & 0o111 == 0 {
            return Err(denied("no execute bit is set"));
        }
        return Ok(());
    }
    if cred.uid != rec.uid && rec.mode & 0o070 != 0 {
        if let Some(bytes) = inode.xattrs.get(ACCESS_XATTR) {
            let acl = Acl::decode(bytes)
                .map_err(|e| denied(&format!("the stored access ACL is unreadable: {e}")))?;
            return if acl.permits(cred, rec.gid, mask) {
                Ok(())
            } else {
                Err(denied("the access ACL does not allow it"))
            };
        }
    }
    let class = if cred.uid == rec.uid {
        rec.mode >> 6
    } else if cred.in_group(rec.gid) {
        rec.mode >> 3
    } else {
        rec.mode
    } & 7;
    if class & mask == mask {
        Ok(())
    } else {
        Err(denied("the mode bits do not allow it"))
    }
}

/// The owner, or a caller that may act as any owner (CAP_FOWNER).
pub(crate) fn check_owner(cred: &Cred, rec: &InodeRec) -> Result<()> {
    if cred.bypasses_checks() || cred.uid == rec.uid {
        Ok(())
    } else {
        Err(not_permitted("only the owner may do that"))
    }
}

/// `may_delete` / `may_create` on a directory: write and search permission, and for a
/// removal from a sticky directory, owning the entry or the directory.
pub(crate) fn check_dir_change(
    cred: &Cred,
    dir_inode: &Inode,
    victim: Option<&InodeRec>,
) -> Result<()> {
    check(cred, dir_inode, MAY_WRITE | MAY_EXEC)?;
    let dir = &dir_inode.rec;
    if let Some(v) = victim {
        if dir.mode & S_ISVTX != 0
            && !cred.bypasses_checks()
            && cred.uid != v.uid
            && cred.uid != dir.uid
        {
            return Err(not_permitted(
                "the directory is sticky: only the owner of the entry or of the directory may remove it",
            ));
        }
    }
    Ok(())
}

/// `may_linkat` with fs.protected_hardlinks on (Debian's default): a caller may give
/// a new name only to a file it owns, or to a regular file it may read and write that
/// is not set-user-ID or executable set-group-ID. The server enforces it itself, since
/// the kernel asks a FUSE file system without default_permissions for no permission.
pub(crate) fn check_link_source(cred: &Cred, inode: &Inode) -> Result<()> {
    let rec = &inode.rec;
    if cred.bypasses_checks() || cred.uid == rec.uid {
        return Ok(());
    }
    let privileged = rec.mode & S_ISUID != 0 || rec.mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP;
    if rec.mode & S_IFMT == S_IFREG
        && !privileged
        && check(cred, inode, MAY_READ | MAY_WRITE).is_ok()
    {
        return Ok(());
    }
    Err(not_permitted(
        "a hard link to another user's file needs read and write permission on it (protected_hardlinks)",
    ))
}

/// The access an open(2) asks for, from its flags.
pub fn open_mask(flags: i32) -> u32 {
    let acc = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => MAY_READ,
        libc::O_WRONLY => MAY_WRITE,
        _ => MAY_READ | MAY_WRITE,
    };
    if flags & libc::O_TRUNC != 0 {
        acc | MAY_WRITE
    } else {
        acc
    }
}

/// `setattr_prepare`: may `cred` make these changes? `writable_handle`: the change comes
/// through a handle opened for writing (ftruncate), which already carries the right.
pub(crate) fn check_setattr(
    cred: &Cred,
    inode: &Inode,
    set: &SetAttr,
    writable_handle: bool,
) -> Result<()> {
    let rec = &inode.rec;
    if cred.bypasses_checks() {
        return Ok(());
    }
    let owner = cred.uid == rec.uid;
    if let Some(uid) = set.uid {
        // Only a privileged caller gives a file away; the owner may "change" it to itself.
        if !(owner && uid == rec.uid) {
            return Err(not_permitted("only root may change a file's owner"));
        }
    }
    if let Some(gid) = set.gid {
        if !(owner && (gid == rec.gid || cred.in_group(gid))) {
            return Err(not_permitted(
                "the owner may change the group only to one of its own groups",
            ));
        }
    }
    if set.mode.is_some() && !owner {
        return Err(not_permitted("only the owner may change the mode"));
    }
    for t in [set.atime, set.mtime].into_iter().flatten() {
        match t {
            SetTime::At(_) if !owner => {
                return Err(not_permitted(
                    "only the owner may set times to a given value",
                ))
            }
            SetTime::Now if !owner => check(cred, inode, MAY_WRITE)?,
            _ => {}
        }
    }
    if set.size.is_some() && !writable_handle {
        check(cred, inode, MAY_WRITE)?;
    }
    Ok(())
}

/// The mode a chmod sets (`setattr_copy`): a caller that is neither in the file's group
/// nor privileged cannot set the set-group-ID bit.
pub(crate) fn chmod_mode(cred: &Cred, rec: &InodeRec, mode: u32) -> u32 {
    if cred.bypasses_checks() || cred.in_group(rec.gid) {
        mode
    } else {
        mode & !S_ISGID
    }
}

/// What a chown by `cred` does to the privilege bits of a non-directory whose group
/// is `gid` before the change (`chown_common`: ATTR_KILL_SUID whoever asks, and
/// `setattr_should_drop_sgid`: set-group-ID goes when the file is group-executable or
/// the caller is neither in the file's group nor privileged).
pub(crate) fn mode_after_chown(cred: &Cred, mode: u32, gid: u32) -> u32 {
    if mode & S_IFMT == S_IFDIR {
        return mode;
    }
    let mut m = mode & !S_ISUID;
    if m & S_ISGID != 0 && (m & S_IXGRP != 0 || !(cred.is_root() || cred.in_group(gid))) {
        m &= !S_ISGID;
    }
    m
}

/// Who writes to (or truncates) a file, as far as its privilege bits care
/// (`setattr_should_drop_suidgid`): a privileged caller keeps them; anyone else drops
/// set-user-ID, and set-group-ID when it is group-executable or the writer is not in
/// the file's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Writer {
    privileged: bool,
    /// The group the writer was found a member of (the file's group when checked).
    member_of: Option<u32>,
}

impl Writer {
    pub(crate) fn of(cred: &Cred, file_gid: u32) -> Writer {
        Writer {
            privileged: cred.is_root(),
            member_of: cred.in_group(file_gid).then_some(file_gid),
        }
    }

    /// The mode after this writer's write to a file with mode `mode` and group `gid`.
    pub(crate) fn mode_after_write(self, mode: u32, gid: u32) -> u32 {
        if self.privileged || mode & S_IFMT != S_IFREG {
            return mode;
        }
        let mut m = mode & !S_ISUID;
        if m & S_ISGID != 0 && (m & S_IXGRP != 0 || self.member_of != Some(gid)) {
            m &= !S_ISGID;
        }
        m
    }
}

/// What a write or truncate by `cred` does to the privilege bits of `rec`.
pub(crate) fn mode_after_write(cred: &Cred, rec: &InodeRec) -> u32 {
    Writer::of(cred, rec.gid).mode_after_write(rec.mode, rec.gid)
}

/// Owner, group and mode of a new inode in `dir` (`inode_init_owner`, then
/// `mode_strip_sgid`): the group comes from a set-group-ID directory, whose
/// subdirectories inherit the bit; a new non-directory keeps a group-executable
/// set-group-ID bit only if its creator is in that group (or privileged).
pub(crate) fn new_inode_owner(cred: &Cred, dir: &InodeRec, mut mode: u32) -> (u32, u32, u32) {
    let is_dir = mode & S_IFMT == S_IFDIR;
    let gid = if dir.mode & S_ISGID != 0 {
        if is_dir {
            mode |= S_ISGID;
        }
        dir.gid
    } else {
        cred.gid
    };
    if !is_dir
        && mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP
        && dir.mode & S_ISGID != 0
        && !cred.bypasses_checks()
        && !cred.in_group(dir.gid)
    {
        mode &= !S_ISGID;
    }
    (cred.uid, gid, mode)
}

/// May `cred` create a node of type `kind`? Device nodes need privilege (CAP_MKNOD in
/// `vfs_mknod`): a device node is a door to whatever device it names.
pub(crate) fn check_mknod(cred: &Cred, kind: u32) -> Result<()> {
    if (kind == S_IFCHR || kind == S_IFBLK) && !cred.bypasses_checks() {
        return Err(not_permitted("device nodes are root's to create"));
    }
    Ok(())
}

/// May `cred` read or change extended attribute `name` of `rec` (`xattr_permission`)?
pub(crate) fn check_xattr(cred: &Cred, inode: &Inode, name: &[u8], write: bool) -> Result<()> {
    let rec = &inode.rec;
    if name.starts_with(b"system.") && name != ACCESS_XATTR && name != DEFAULT_XATTR {
        // The system namespace holds only the ACLs (as on ext4 and tmpfs).
        return Err(FsError::Unsupported(format!(
            "attribute {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    if write && rec.mode & S_IFMT == S_IFLNK && (name == ACCESS_XATTR || name == DEFAULT_XATTR) {
        // A symbolic link has no ACL (Linux's link inodes have no set_acl).
        return Err(FsError::Unsupported("POSIX ACL on a symbolic link".into()));
    }
    if cred.checked {
        return Ok(());
    }
    if name.starts_with(b"trusted.") {
        return if cred.is_root() {
            Ok(())
        } else {
            Err(not_permitted("trusted.* attributes are root's"))
        };
    }
    if name.starts_with(b"security.") {
        // File capabilities and LSM labels: changing them is privileged
        // (`cap_inode_setxattr`: CAP_SETFCAP / CAP_SYS_ADMIN), or any owner could give
        // their program capabilities.
        return if !write || cred.is_root() {
            Ok(())
        } else {
            Err(not_permitted("security.* attributes are root's to change"))
        };
    }
    if name.starts_with(b"system.") {
        // ACLs: their owner (or root) changes them.
        return if write {
            check_owner(cred, rec)
        } else {
            Ok(())
        };
    }
    if name.starts_with(b"user.") {
        // Only regular files and directories carry user attributes.
        let kind = rec.mode & S_IFMT;
        if kind != S_IFREG && kind != S_IFDIR {
            return Err(if write {
                not_permitted("user.* attributes only on files and directories")
            } else {
                FsError::NoXattr
            });
        }
        // A sticky directory's user attributes are its owner's to change.
        if write && kind == S_IFDIR && rec.mode & S_ISVTX != 0 {
            check_owner(cred, rec)?;
        }
        return check(cred, inode, if write { MAY_WRITE } else { MAY_READ });
    }
    Err(FsError::Unsupported(format!(
        "attribute namespace of {:?}",
        String::from_utf8_lossy(name)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Time, S_IFIFO};

    fn rec(mode: u32, uid: u32, gid: u32) -> InodeRec {
        InodeRec {
            ino: 2,
            mode,
            uid,
            gid,
            ..Default::default()
        }
    }

    /// An inode of record `r`, without xattrs.
    fn n(r: &InodeRec) -> Inode {
        Inode {
            rec: r.clone(),
            map: Default::default(),
            xattrs: Default::default(),
            xattr_blocks: Default::default(),
        }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Cred {
        Cred::new(uid, gid, groups.to_vec())
    }

    #[test]
    fn mode_classes_owner_group_other_and_root() {
        let f = rec(S_IFREG | 0o640, 10, 20);
        assert!(check(&user(10, 99, &[]), &n(&f), MAY_READ | MAY_WRITE).is_ok());
        assert!(check(&user(11, 20, &[]), &n(&f), MAY_READ).is_ok());
        assert!(check(&user(11, 20, &[]), &n(&f), MAY_WRITE).is_err());
        assert!(
            check(&user(11, 5, &[20]), &n(&f), MAY_READ).is_ok(),
            "supplementary"
        );
        assert!(check(&user(11, 5, &[]), &n(&f), MAY_READ).is_err());
        // The owner class wins even when it grants less than the group's.
        let g = rec(S_IFREG | 0o070, 10, 20);
        assert!(check(&user(10, 20, &[]), &n(&g), MAY_READ).is_err());
        // Root: everything but executing a file with no execute bit.
        assert!(check(&Cred::root(), &n(&f), MAY_READ | MAY_WRITE).is_ok());
        assert!(check(&Cred::root(), &n(&f), MAY_EXEC).is_err());
        assert!(check(&Cred::root(), &n(&rec(S_IFREG | 0o001, 1, 1)), MAY_EXEC).is_ok());
        assert!(check(&Cred::root(), &n(&rec(S_IFDIR, 1, 1)), MAY_EXEC).is_ok());
        assert!(check(&Cred::checked(5, 5), &n(&rec(S_IFREG, 1, 1)), MAY_WRITE).is_ok());
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let tmp = rec(S_IFDIR | 0o1777, 0, 0);
        let theirs = rec(S_IFREG | 0o644, 20, 20);
        let mine = rec(S_IFREG | 0o644, 10, 10);
        let me = user(10, 10, &[]);
        assert!(check_dir_change(&me, &n(&tmp), Some(&mine)).is_ok());
        assert!(matches!(
            check_dir_change(&me, &n(&tmp), Some(&theirs)),
            Err(FsError::NotPermitted(_))
        ));
        assert!(check_dir_change(&Cred::root(), &n(&tmp), Some(&theirs)).is_ok());
        let my_tmp = rec(S_IFDIR | 0o1777, 10, 10);
        assert!(
            check_dir_change(&me, &n(&my_tmp), Some(&theirs)).is_ok(),
            "dir owner"
        );
        let closed = rec(S_IFDIR | 0o755, 0, 0);
        assert!(matches!(
            check_dir_change(&me, &n(&closed), None),
            Err(FsError::AccessDenied(_))
        ));
    }

    #[test]
    fn chown_chgrp_chmod_and_times_follow_the_owner_rules() {
        let f = rec(S_IFREG | 0o644, 10, 10);
        let me = user(10, 10, &[30]);
        let other = user(11, 10, &[]);
        let set = |f: fn(&mut SetAttr)| {
            let mut s = SetAttr::default();
            f(&mut s);
            s
        };
        assert!(check_setattr(&me, &n(&f), &set(|s| s.uid = Some(11)), false).is_err());
        assert!(check_setattr(&me, &n(&f), &set(|s| s.uid = Some(10)), false).is_ok());
        assert!(check_setattr(&me, &n(&f), &set(|s| s.gid = Some(30)), false).is_ok());
        assert!(check_setattr(&me, &n(&f), &set(|s| s.gid = Some(31)), false).is_err());
        assert!(check_setattr(&other, &n(&f), &set(|s| s.mode = Some(0o777)), false).is_err());
        assert!(check_setattr(&Cred::root(), &n(&f), &set(|s| s.uid = Some(0)), false).is_ok());
        let at = set(|s| s.mtime = Some(SetTime::At(Time { sec: 1, nsec: 0 })));
        assert!(check_setattr(&other, &n(&f), &at, false).is_err());
        let now = set(|s| s.mtime = Some(SetTime::Now));
        assert!(
            check_setattr(&other, &n(&f), &now, false).is_err(),
            "no write bit"
        );
        let shared = rec(S_IFREG | 0o666, 10, 10);
        assert!(check_setattr(&other, &n(&shared), &now, false).is_ok());
        let trunc = set(|s| s.size = Some(0));
        assert!(check_setattr(&other, &n(&f), &trunc, false).is_err());
        assert!(
            check_setattr(&other, &n(&f), &trunc, true).is_ok(),
            "through a handle"
        );
        // chmod by someone not in the file's group loses the setgid bit.
        let g = rec(S_IFREG | 0o644, 10, 50);
        assert_eq!(chmod_mode(&me, &g, 0o2755), 0o755);
        assert_eq!(chmod_mode(&user(10, 50, &[]), &g, 0o2755), 0o2755);
    }

    #[test]
    fn privilege_bits_go_on_chown_and_write() {
        let (root, u) = (Cred::ROOT, user(7, 5, &[]));
        assert_eq!(
            mode_after_chown(&root, S_IFREG | 0o6755, 5),
            S_IFREG | 0o755
        );
        assert_eq!(
            mode_after_chown(&root, S_IFREG | 0o6745, 5),
            S_IFREG | 0o2745
        );
        assert_eq!(mode_after_chown(&u, S_IFREG | 0o6745, 5), S_IFREG | 0o2745);
        assert_eq!(mode_after_chown(&u, S_IFREG | 0o6745, 6), S_IFREG | 0o745);
        assert_eq!(mode_after_chown(&u, S_IFDIR | 0o2755, 6), S_IFDIR | 0o2755);
        let w = |mode, gid| rec(S_IFREG | mode, 10, gid);
        let member = user(1, 5, &[]);
        assert_eq!(mode_after_write(&member, &w(0o4755, 5)), S_IFREG | 0o755);
        assert_eq!(
            mode_after_write(&member, &w(0o2755, 5)),
            S_IFREG | 0o755,
            "group-x"
        );
        assert_eq!(
            mode_after_write(&member, &w(0o2745, 5)),
            S_IFREG | 0o2745,
            "member"
        );
        assert_eq!(
            mode_after_write(&member, &w(0o2745, 6)),
            S_IFREG | 0o745,
            "non-member"
        );
        assert_eq!(
            mode_after_write(&Cred::root(), &w(0o6755, 6)),
            S_IFREG | 0o6755
        );
        // A group change between the check and the write counts as not a member.
        let moved = Writer::of(&member, 5).mode_after_write(S_IFREG | 0o2745, 6);
        assert_eq!(moved, S_IFREG | 0o745);
    }

    #[test]
    fn new_inodes_take_the_setgid_directorys_group() {
        let sgid_dir = rec(S_IFDIR | 0o2775, 0, 50);
        let me = user(10, 10, &[]);
        assert_eq!(
            new_inode_owner(&me, &sgid_dir, S_IFREG | 0o644),
            (10, 50, S_IFREG | 0o644)
        );
        assert_eq!(
            new_inode_owner(&me, &sgid_dir, S_IFDIR | 0o755),
            (10, 50, S_IFDIR | 0o2755)
        );
        // Not in the group: a group-executable setgid file loses the bit.
        assert_eq!(
            new_inode_owner(&me, &sgid_dir, S_IFREG | 0o2755).2,
            S_IFREG | 0o755
        );
        assert_eq!(
            new_inode_owner(&user(10, 10, &[50]), &sgid_dir, S_IFREG | 0o2755).2,
            S_IFREG | 0o2755
        );
        let plain = rec(S_IFDIR | 0o755, 0, 0);
        assert_eq!(
            new_inode_owner(&me, &plain, S_IFREG | 0o644),
            (10, 10, S_IFREG | 0o644)
        );
    }

    #[test]
    fn hard_links_to_others_files_need_read_and_write() {
        let me = user(10, 10, &[]);
        assert!(
            check_link_source(&me, &n(&rec(S_IFREG | 0o600, 10, 10))).is_ok(),
            "mine"
        );
        assert!(check_link_source(&me, &n(&rec(S_IFREG | 0o644, 20, 20))).is_err());
        assert!(check_link_source(&me, &n(&rec(S_IFREG | 0o666, 20, 20))).is_ok());
        assert!(
            check_link_source(&me, &n(&rec(S_IFREG | 0o4666, 20, 20))).is_err(),
            "setuid"
        );
        assert!(
            check_link_source(&me, &n(&rec(S_IFREG | 0o2676, 20, 20))).is_err(),
            "setgid x"
        );
        assert!(
            check_link_source(&me, &n(&rec(S_IFIFO | 0o666, 20, 20))).is_err(),
            "not regular"
        );
        assert!(check_link_source(&Cred::root(), &n(&rec(S_IFREG | 0o4600, 20, 20))).is_ok());
    }

    #[test]
    fn xattr_namespaces() {
        let f = rec(S_IFREG | 0o644, 10, 10);
        let other = user(11, 11, &[]);
        assert!(check_xattr(&other, &n(&f), b"user.a", false).is_ok());
        assert!(check_xattr(&other, &n(&f), b"user.a", true).is_err());
        assert!(check_xattr(&other, &n(&f), b"trusted.a", false).is_err());
        assert!(check_xattr(&Cred::root(), &n(&f), b"trusted.a", true).is_ok());
        assert!(check_xattr(&other, &n(&f), b"bogus.a", false).is_err());
        let owner = user(10, 10, &[]);
        assert!(check_xattr(&owner, &n(&f), b"security.capability", false).is_ok());
        assert!(check_xattr(&owner, &n(&f), b"security.capability", true).is_err());
        assert!(check_xattr(&Cred::root(), &n(&f), b"security.capability", true).is_ok());
        assert!(check_xattr(&owner, &n(&f), b"system.posix_acl_access", true).is_ok());
        assert!(check_xattr(&other, &n(&f), b"system.posix_acl_access", true).is_err());
    }
}
