//! pjdfstest-style permission checks (issue 10). pjdfstest itself is not packaged for
//! Debian nor on crates.io, so this runs its kind of checks — each system call as a
//! given user, its errno, then the attributes it left — on the file system under test
//! and on tmpfs (the kernel's own POSIX rules) in the same test, and compares.
//!
//! Each step runs in a forked child that takes the user's groups, gid and uid, makes
//! one system call and exits with its errno. The child only makes system calls (all
//! arguments are prepared before the fork), so forking a threaded test is safe.

use std::ffi::CString;
use std::path::Path;

/// Who makes a call.
#[derive(Debug, Clone, Copy)]
pub struct Who {
    pub uid: u32,
    pub gid: u32,
    pub groups: &'static [u32],
}

pub const ROOT: Who = Who {
    uid: 0,
    gid: 0,
    groups: &[],
};
pub const ALICE: Who = Who {
    uid: 1001,
    gid: 1001,
    groups: &[],
};
pub const BOB: Who = Who {
    uid: 1002,
    gid: 1002,
    groups: &[],
};
/// Bob, with Alice's group as a supplementary group.
pub const BOB_IN_1001: Who = Who {
    uid: 1002,
    gid: 1002,
    groups: &[1001],
};
pub const NOBODY: Who = Who {
    uid: 65534,
    gid: 65534,
    groups: &[],
};

/// One system call (paths relative to the directory under test).
#[derive(Debug, Clone)]
pub enum Call {
    Open(&'static str, i32, u32),
    /// open with the given umask (path, flags, mode, umask).
    OpenUmask(&'static str, i32, u32, u32),
    /// mkdir with the given umask.
    MkdirUmask(&'static str, u32, u32),
    /// open(O_WRONLY), write 3 bytes at 0, close.
    Write(&'static str),
    Mkdir(&'static str, u32),
    Rmdir(&'static str),
    Unlink(&'static str),
    Rename(&'static str, &'static str),
    Exchange(&'static str, &'static str),
    Link(&'static str, &'static str),
    Symlink(&'static str, &'static str),
    Mkfifo(&'static str, u32),
    Chmod(&'static str, u32),
    /// chown; u32::MAX leaves that id alone (-1).
    Chown(&'static str, u32, u32),
    Truncate(&'static str, i64),
    /// utimensat with both times now (NULL).
    TouchNow(&'static str),
    /// utimensat with explicit times.
    TouchAt(&'static str, i64),
    Stat(&'static str),
    Access(&'static str, i32),
    SetXattr(&'static str, &'static str),
    GetXattr(&'static str, &'static str),
    RemoveXattr(&'static str, &'static str),
    /// Set an ACL xattr (`system.posix_acl_access` or `_default`): (tag, perm, id)
    /// entries, encoded as setfacl does.
    SetAcl(&'static str, &'static str, &'static [(u16, u16, u32)]),
}

/// ACL entry tags (acl/libacl.h).
pub const UO: u16 = 0x01;
pub const U: u16 = 0x02;
pub const GO: u16 = 0x04;
pub const G: u16 = 0x08;
pub const M: u16 = 0x10;
pub const O: u16 = 0x20;
pub const ACCESS: &str = "system.posix_acl_access";
pub const DEFAULT: &str = "system.posix_acl_default";

/// The xattr value of an ACL (version 2, then tag/perm/id per entry).
fn acl_value(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        let id = if tag == U || tag == G { id } else { u32::MAX };
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

impl Call {
    /// The path whose attributes are recorded after the call.
    fn subject(&self) -> &'static str {
        use Call::*;
        match self {
            Open(p, ..)
            | OpenUmask(p, ..)
            | MkdirUmask(p, ..)
            | Write(p)
            | Mkdir(p, _)
            | Rmdir(p)
            | Unlink(p)
            | Mkfifo(p, _)
            | Chmod(p, _)
            | Chown(p, ..)
            | Truncate(p, _)
            | TouchNow(p)
            | TouchAt(p, _)
            | Stat(p)
            | Access(p, _)
            | SetXattr(p, _)
            | GetXattr(p, _)
            | RemoveXattr(p, _)
            | SetAcl(p, ..) => p,
            Rename(_, p) | Exchange(_, p) | Link(_, p) | Symlink(_, p) => p,
        }
    }
}

fn c(base: &Path, p: &str) -> CString {
    CString::new(base.join(p).into_os_string().into_encoded_bytes()).unwrap()
}

/// Run `call` as `who` under `base`; its errno (0 on success).
pub fn run_as(base: &Path, who: Who, call: &Call) -> i32 {
    use Call::*;
    // Everything the child needs, allocated before the fork.
    let (a, b) = match call {
        Rename(x, y) | Exchange(x, y) | Link(x, y) => (c(base, x), c(base, y)),
        Symlink(target, p) => (CString::new(*target).unwrap(), c(base, p)),
        other => (c(base, other.subject()), CString::default()),
    };
    let names: Vec<CString> = match call {
        SetXattr(_, n) | GetXattr(_, n) | RemoveXattr(_, n) | SetAcl(_, n, _) => {
            vec![CString::new(*n).unwrap()]
        }
        _ => vec![],
    };
    let acl = match call {
        SetAcl(_, _, e) => acl_value(e),
        _ => vec![],
    };
    let groups: Vec<libc::gid_t> = who.groups.to_vec();
    // SAFETY: the child makes only system calls on memory prepared above and leaves
    // with _exit, so it never touches a lock another thread of the test held.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: in the child: system calls only (see above).
        unsafe {
            let errno = || *libc::__errno_location();
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(who.gid, who.gid, who.gid) != 0
                || libc::setresuid(who.uid, who.uid, who.uid) != 0
            {
                libc::_exit(250);
            }
            let ok = |r: libc::c_int| if r < 0 { errno() } else { 0 };
            let r = match call {
                Open(_, flags, mode) => {
                    let fd = libc::open(a.as_ptr(), *flags | libc::O_CLOEXEC, *mode);
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    ok(fd)
                }
                Write(_) => {
                    let fd = libc::open(a.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        errno()
                    } else {
                        let n = libc::pwrite(fd, b"abc".as_ptr().cast(), 3, 0);
                        let e = if n < 0 { errno() } else { 0 };
                        libc::close(fd);
                        e
                    }
                }
                Mkdir(_, m) => ok(libc::mkdir(a.as_ptr(), *m)),
                OpenUmask(_, flags, mode, mask) => {
                    libc::umask(*mask);
                    let fd = libc::open(a.as_ptr(), *flags | libc::O_CLOEXEC, *mode);
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    ok(fd)
                }
                MkdirUmask(_, m, mask) => {
                    libc::umask(*mask);
                    ok(libc::mkdir(a.as_ptr(), *m))
                }
                Rmdir(_) => ok(libc::rmdir(a.as_ptr())),
                Unlink(_) => ok(libc::unlink(a.as_ptr())),
                Rename(..) => ok(libc::rename(a.as_ptr(), b.as_ptr())),
                Exchange(..) => ok(libc::renameat2(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )),
                Link(..) => ok(libc::link(a.as_ptr(), b.as_ptr())),
                Symlink(..) => ok(libc::symlink(a.as_ptr(), b.as_ptr())),
                Mkfifo(_, m) => ok(libc::mkfifo(a.as_ptr(), *m)),
                Chmod(_, m) => ok(libc::chmod(a.as_ptr(), *m)),
                Chown(_, u, g) => ok(libc::lchown(a.as_ptr(), *u, *g)),
                Truncate(_, n) => ok(libc::truncate(a.as_ptr(), *n)),
                TouchNow(_) => ok(libc::utimensat(
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    std::ptr::null(),
                    0,
                )),
                TouchAt(_, t) => {
                    let ts = [libc::timespec {
                        tv_sec: *t,
                        tv_nsec: 0,
                    }; 2];
                    ok(libc::utimensat(libc::AT_FDCWD, a.as_ptr(), ts.as_ptr(), 0))
                }
                Stat(_) => {
                    let mut st: libc::stat = std::mem::zeroed();
                    ok(libc::lstat(a.as_ptr(), &mut st))
                }
                Access(_, m) => ok(libc::access(a.as_ptr(), *m)),
                SetXattr(..) => ok(libc::lsetxattr(
                    a.as_ptr(),
                    names[0].as_ptr(),
                    b"v".as_ptr().cast(),
                    1,
                    0,
                )),
                RemoveXattr(..) => ok(libc::lremovexattr(a.as_ptr(), names[0].as_ptr())),
                SetAcl(..) => ok(libc::lsetxattr(
                    a.as_ptr(),
                    names[0].as_ptr(),
                    acl.as_ptr().cast(),
                    acl.len(),
                    0,
                )),
                GetXattr(..) => {
                    let mut buf = [0u8; 16];
                    let n = libc::lgetxattr(
                        a.as_ptr(),
                        names[0].as_ptr(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                    );
                    if n < 0 {
                        errno()
                    } else {
                        0
                    }
                }
            };
            libc::_exit(r);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    let w = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(w, pid);
    assert!(libc::WIFEXITED(status), "step child died: {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 250, "could not take the identity {who:?}");
    code
}

/// The attributes a step left on `p`, as root sees them: mode, owner, size, links and
/// the ACLs (hex of their xattr values) when there are any.
fn attrs(base: &Path, p: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(base.join(p)) {
        Ok(m) => {
            let mut s = format!(
                "mode={:o} uid={} gid={} size={} nlink={}",
                m.mode(),
                m.uid(),
                m.gid(),
                if m.is_dir() { 0 } else { m.size() },
                m.nlink()
            );
            if !m.file_type().is_symlink() {
                for (tag, name) in [("acl", ACCESS), ("default_acl", DEFAULT)] {
                    if let Some(v) = lgetxattr(&base.join(p), name) {
                        s += &format!(" {tag}={v}");
                    }
                }
            }
            s
        }
        Err(e) => format!("{:?}", e.kind()),
    }
}

/// An xattr's value as hex, or its errno unless it is just absent.
fn lgetxattr(path: &Path, name: &str) -> Option<String> {
    let p = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer is ours and its length is passed.
    let r = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return (e.raw_os_error() != Some(libc::ENODATA)).then(|| format!("{e}"));
    }
    Some(
        buf[..r as usize]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    )
}

/// A step: who, what, and (for the report) why.
pub struct Step {
    pub who: Who,
    pub call: Call,
    pub why: &'static str,
}

fn step(who: Who, call: Call, why: &'static str) -> Step {
    Step { who, call, why }
}

/// The script, in pjdfstest's spirit: each permission rule checked from both sides.
pub fn script() -> Vec<Step> {
    use Call::*;
    const RO: i32 = libc::O_RDONLY;
    const WO: i32 = libc::O_WRONLY;
    const CR: i32 = libc::O_CREAT | libc::O_WRONLY;
    let (r, a, b, bg, n) = (ROOT, ALICE, BOB, BOB_IN_1001, NOBODY);
    vec![
        // Setup: alice's directory d, with a file in it.
        step(r, Mkdir("d", 0o755), "setup"),
        step(r, Chown("d", 1001, 1001), "setup"),
        step(a, Open("d/f", CR, 0o644), "owner creates in own directory"),
        // open(2) and the mode bits (open/06.t).
        step(b, Open("d/f", RO, 0), "other may read 0644"),
        step(b, Open("d/f", WO, 0), "other may not write 0644"),
        step(
            b,
            Open("d/f", libc::O_RDWR, 0),
            "other may not read-write 0644",
        ),
        step(b, Open("d/f", RO | libc::O_TRUNC, 0), "O_TRUNC needs write"),
        step(
            b,
            Open("d/f", CR, 0o644),
            "O_CREAT of an existing file needs no dir write",
        ),
        step(a, Chmod("d/f", 0o640), "owner chmod"),
        step(b, Open("d/f", RO, 0), "other may not read 0640"),
        step(bg, Open("d/f", RO, 0), "supplementary group may read 0640"),
        step(bg, Open("d/f", WO, 0), "group may not write 0640"),
        step(a, Chmod("d/f", 0o040), "owner class wins"),
        step(a, Open("d/f", RO, 0), "owner may not read 0040"),
        step(
            r,
            Open("d/f", libc::O_RDWR, 0),
            "root reads and writes anything",
        ),
        step(a, Chmod("d/f", 0o644), "restore"),
        // Creating and removing names: write and search on the directory (*/05,06.t).
        step(
            b,
            Open("d/g", CR, 0o644),
            "create needs write on the directory",
        ),
        step(b, Mkdir("d/h", 0o755), "mkdir needs write on the directory"),
        step(
            b,
            Mkfifo("d/p", 0o644),
            "mkfifo needs write on the directory",
        ),
        step(
            b,
            Symlink("x", "d/s"),
            "symlink needs write on the directory",
        ),
        step(b, Link("d/f", "d/l"), "link needs write on the directory"),
        step(b, Unlink("d/f"), "unlink needs write on the directory"),
        step(
            b,
            Rename("d/f", "d/f2"),
            "rename needs write on the directory",
        ),
        step(b, Mkdir("d", 0o755), "EEXIST before EACCES"),
        step(a, Mkdir("d/sub", 0o700), "owner mkdir"),
        step(b, Rmdir("d/sub"), "rmdir needs write on the parent"),
        step(a, Chmod("d", 0o700), "owner closes the directory"),
        step(b, Stat("d/f"), "search permission on the path prefix"),
        step(
            b,
            Open("d/f", RO, 0),
            "open through an unsearchable directory",
        ),
        step(b, Stat("d/nonexistent"), "EACCES before ENOENT"),
        step(a, Chmod("d", 0o711), "search only"),
        step(b, Stat("d/f"), "search without read"),
        step(
            b,
            Open("d", RO | libc::O_DIRECTORY, 0),
            "listing needs read",
        ),
        step(a, Chmod("d", 0o755), "restore"),
        // chmod/chown (chmod/07.t, chown/07.t, chown/00.t).
        step(b, Chmod("d/f", 0o777), "only the owner chmods"),
        step(b, Chown("d/f", 1002, u32::MAX), "no chown to oneself"),
        step(
            a,
            Chown("d/f", 1002, u32::MAX),
            "owner may not give a file away",
        ),
        step(a, Chown("d/f", 1001, u32::MAX), "owner may chown to itself"),
        step(
            a,
            Chown("d/f", u32::MAX, 1002),
            "owner chgrp to a group it is not in",
        ),
        step(r, Chown("d/f", 1002, 1002), "root gives the file to bob"),
        step(
            bg,
            Chown("d/f", u32::MAX, 1001),
            "owner chgrp to a supplementary group",
        ),
        step(r, Chown("d/f", 1001, 1001), "back to alice"),
        step(r, Chmod("d/f", 0o6755), "root sets both set-id bits"),
        step(r, Chown("d/f", 1001, 1001), "chown drops both set-id bits"),
        step(r, Chmod("d/f", 0o2755), "setgid"),
        step(a, Chmod("d/f", 0o2755), "owner in the group keeps setgid"),
        step(r, Chown("d/f", u32::MAX, 1002), "file in bob's group"),
        step(r, Chmod("d/f", 0o644), "clear"),
        step(
            a,
            Chmod("d/f", 0o2755),
            "chmod by a non-member drops setgid",
        ),
        step(r, Chown("d/f", u32::MAX, 1001), "back to alice's group"),
        // Writes and truncates drop set-id bits (write/*, truncate/*).
        step(r, Chmod("d/f", 0o4777), "setuid, writable by all"),
        step(b, Write("d/f"), "a user's write drops setuid"),
        step(r, Chmod("d/f", 0o2777), "group-executable setgid"),
        step(
            b,
            Write("d/f"),
            "a user's write drops group-executable setgid",
        ),
        step(r, Chmod("d/f", 0o6777), "both"),
        step(r, Write("d/f"), "root's write keeps them"),
        step(r, Chmod("d/f", 0o4666), "setuid, writable by all"),
        step(b, Truncate("d/f", 1), "a user's truncate drops setuid"),
        step(r, Chmod("d/f", 0o644), "restore"),
        step(b, Truncate("d/f", 0), "truncate needs write"),
        // utimensat (utimensat/06.t and 07.t).
        step(b, TouchAt("d/f", 5), "only the owner sets explicit times"),
        step(b, TouchNow("d/f"), "touch needs write permission"),
        step(a, Chmod("d/f", 0o666), "writable by all"),
        step(b, TouchNow("d/f"), "a writer may touch"),
        step(
            b,
            TouchAt("d/f", 5),
            "a writer still may not set explicit times",
        ),
        step(a, TouchAt("d/f", 5), "the owner may"),
        step(a, Chmod("d/f", 0o644), "restore"),
        // access(2).
        step(b, Access("d/f", libc::R_OK), "access R_OK"),
        step(b, Access("d/f", libc::W_OK), "access W_OK denied"),
        step(b, Access("d/f", libc::X_OK), "access X_OK denied"),
        step(r, Access("d/f", libc::X_OK), "root X_OK without any x bit"),
        step(a, Chmod("d/f", 0o744), "owner x"),
        step(r, Access("d/f", libc::X_OK), "root X_OK with an x bit"),
        step(a, Chmod("d/f", 0o644), "restore"),
        // Sticky directories (unlink/11.t, rename/21.t, rmdir/11.t).
        step(r, Mkdir("t", 0o1777), "sticky"),
        step(a, Open("t/a", CR, 0o666), "alice's file in /tmp"),
        step(b, Open("t/b", CR, 0o666), "bob's file in /tmp"),
        step(b, Unlink("t/a"), "sticky: not bob's to remove"),
        step(b, Rename("t/a", "t/c"), "sticky: not bob's to rename"),
        step(b, Rename("t/b", "t/a"), "sticky: not bob's to replace"),
        step(b, Exchange("t/b", "t/a"), "sticky: not bob's to exchange"),
        step(a, Mkdir("t/ad", 0o777), "alice's directory in /tmp"),
        step(b, Rmdir("t/ad"), "sticky: not bob's to rmdir"),
        step(b, Rename("t/b", "t/b2"), "bob may rename his own"),
        step(a, Unlink("t/a"), "alice removes hers"),
        step(r, Unlink("t/b2"), "root removes anything"),
        // Moving a directory to another parent needs write on it (rename/12.t-ish).
        step(r, Mkdir("p1", 0o777), "setup"),
        step(r, Mkdir("p2", 0o777), "setup"),
        step(r, Mkdir("p1/rd", 0o755), "root's directory"),
        step(
            b,
            Rename("p1/rd", "p1/rd2"),
            "within one parent: no write on it needed",
        ),
        step(
            b,
            Rename("p1/rd2", "p2/rd"),
            "to another parent: its .. changes",
        ),
        step(a, Mkdir("p1/ad", 0o755), "alice's directory"),
        step(a, Rename("p1/ad", "p2/ad"), "alice moves her own"),
        // setgid directories (mkdir/00.t, open/00.t).
        step(r, Mkdir("g", 0o2777), "setgid directory"),
        step(r, Chown("g", 0, 1001), "in alice's group"),
        // mkdir(2) takes neither the set-group-ID bit nor what the umask removes from
        // its mode (without this step g was a plain 0755 directory and the setgid
        // steps below compared two EACCES).
        step(r, Chmod("g", 0o2777), "setgid, writable by all"),
        step(
            b,
            Open("g/x", CR, 0o644),
            "new file takes the directory's group",
        ),
        step(
            b,
            Mkdir("g/y", 0o755),
            "new directory takes group and setgid",
        ),
        step(
            b,
            Open("g/z", CR, 0o2755),
            "non-member's new file loses setgid",
        ),
        step(a, Open("g/w", CR, 0o2755), "member's new file keeps setgid"),
        // Extended attributes.
        step(a, Chmod("d/f", 0o600), "private"),
        step(a, SetXattr("d/f", "user.k"), "owner sets user.*"),
        step(b, GetXattr("d/f", "user.k"), "reading user.* needs read"),
        step(b, SetXattr("d/f", "user.k"), "writing user.* needs write"),
        step(a, SetXattr("d/f", "trusted.k"), "trusted.* is root's"),
        step(r, Symlink("f", "d/sl"), "a symlink"),
        step(r, SetXattr("d/sl", "user.k"), "no user.* on symlinks"),
        // The kernel's set-group-ID rules in full (inode_init_owner, mode_strip_umask
        // then mode_strip_sgid, setattr_should_drop_sgid, chown_common), issue 14.
        // g is root's 2777 directory in alice's group (1001); bob is not in it.
        step(
            b,
            OpenUmask("g/u1", CR, 0o2775, 0o002),
            "non-member, group-executable: setgid stripped",
        ),
        step(
            b,
            OpenUmask("g/u2", CR, 0o2775, 0o010),
            "umask takes group-exec away first: setgid kept",
        ),
        step(
            b,
            OpenUmask("g/u3", CR, 0o2755, 0o077),
            "umask 077: no group-exec, setgid kept",
        ),
        step(
            a,
            OpenUmask("g/u4", CR, 0o2777, 0o022),
            "member keeps setgid under umask 022",
        ),
        step(
            bg,
            OpenUmask("g/u5", CR, 0o2775, 0o002),
            "member by supplementary group keeps setgid",
        ),
        step(
            b,
            MkdirUmask("g/ud", 0o755, 0o077),
            "subdirectory inherits setgid whatever the umask",
        ),
        step(b, MkdirUmask("g/ud/n", 0o700, 0o022), "and passes it on"),
        step(
            r,
            OpenUmask("g/u6", CR, 0o2775, 0o002),
            "root creates with setgid",
        ),
        // Writes (bob owns g/x, group 1001).
        step(r, Chmod("g/x", 0o2666), "setgid, not group-executable"),
        step(a, Write("g/x"), "a member's write keeps non-exec setgid"),
        step(
            b,
            Write("g/x"),
            "a non-member's write drops even non-exec setgid",
        ),
        step(r, Chmod("g/x", 0o2676), "setgid, group-executable"),
        step(a, Write("g/x"), "a member's write drops group-exec setgid"),
        step(r, Chmod("g/x", 0o2666), "again"),
        step(a, Truncate("g/x", 1), "a member's truncate keeps it"),
        step(b, Truncate("g/x", 0), "a non-member's truncate drops it"),
        step(r, Chmod("g/x", 0o6666), "both bits, no exec"),
        step(a, Write("g/x"), "a member's write drops setuid only"),
        // chmod by the owner, in or out of the file's group.
        step(b, Chmod("g/x", 0o2755), "owner outside the group: dropped"),
        step(
            bg,
            Chmod("g/x", 0o2755),
            "owner in the group by a supplementary group: kept",
        ),
        step(b, Chmod("g/x", 0o2644), "owner outside again, non-exec"),
        // chown, by the owner and by root.
        step(r, Chmod("g/x", 0o2644), "setgid, not group-executable"),
        step(
            bg,
            Chown("g/x", u32::MAX, 1001),
            "owner chgrp to the same group",
        ),
        // Not compared: chown(-1, -1) by a non-member drops a non-executable setgid
        // bit on tmpfs, but through FUSE (HANDLE_KILLPRIV) the file system receives a
        // setattr with only ctime and cannot tell it from nothing.
        step(r, Chmod("g/x", 0o2644), "again"),
        step(
            r,
            Chown("g/x", 1002, u32::MAX),
            "root chown, non-exec setgid",
        ),
        step(r, Chmod("g/ud", 0o2755), "a setgid directory"),
        step(
            r,
            Chown("g/ud", 1001, 1002),
            "chown keeps a directory's setgid",
        ),
        step(r, Mkdir("g/ud2", 0o3777), "setgid and sticky asked by root"),
        step(
            b,
            Mkdir("g/ud3", 0o2777),
            "non-member asks for setgid on a directory",
        ),
        // Nobody (65534), the squashed identity: only what others may do.
        step(n, Open("d/f", RO, 0), "nobody may not read 0600"),
        step(n, Chmod("d/f", 0o4755), "nobody may not plant setuid"),
        step(n, Open("p1/n", CR, 0o644), "nobody may create in 0777"),
        // O_RDONLY|O_TRUNC truncates for a writer (Linux; POSIX leaves it open), and
        // chown(-1, -1) changes nothing, whoever asks.
        step(r, Mkdir("q", 0o755), "setup"),
        step(r, Chown("q", 1001, 1001), "setup"),
        step(a, Open("q/t", CR, 0o644), "setup"),
        step(a, Write("q/t"), "setup: 3 bytes"),
        step(
            a,
            Open("q/t", RO | libc::O_TRUNC, 0),
            "the owner's O_RDONLY|O_TRUNC truncates",
        ),
        step(a, Write("q/t"), "setup: 3 bytes again"),
        step(
            b,
            Chown("q/t", u32::MAX, u32::MAX),
            "chown(-1, -1) by another user",
        ),
        step(
            n,
            Chown("q/t", u32::MAX, u32::MAX),
            "chown(-1, -1) by nobody",
        ),
    ]
}

/// Run the script under `base` (an empty directory owned by root, mode 0777) and
/// return one line per step: errno, then the attributes of its subject.
pub fn run_script(base: &Path, steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| {
            let e = run_as(base, s.who, &s.call);
            format!(
                "uid {} {:?} -> {} [{}]",
                s.who.uid,
                s.call,
                zcfs_backend_errno(e),
                attrs(base, s.call.subject())
            )
        })
        .collect()
}

fn zcfs_backend_errno(e: i32) -> String {
    if e == 0 {
        "ok".into()
    } else {
        std::io::Error::from_raw_os_error(e).to_string()
    }
}

/// Run the script on tmpfs and under `base`; every mismatch, with the step's reason.
pub fn compare_with_tmpfs(base: &Path) -> Vec<String> {
    compare_steps_with_tmpfs(base, &script())
}

/// Run `steps` on tmpfs and under `base`; every mismatch, with the step's reason.
pub fn compare_steps_with_tmpfs(base: &Path, steps: &[Step]) -> Vec<String> {
    let reference = tmpfs_dir();
    let want = run_script(&reference, steps);
    let _ = std::fs::remove_dir_all(&reference);
    let got = run_script(base, steps);
    want.iter()
        .zip(&got)
        .zip(steps)
        .filter(|((w, g), _)| w != g)
        .map(|((w, g), s)| format!("{}:\n  tmpfs: {w}\n  zcfs:  {g}", s.why))
        .collect()
}

/// A fresh root-owned 0777 directory on tmpfs (/dev/shm is tmpfs).
fn tmpfs_dir() -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = Path::new("/dev/shm").join(format!(
        "zcfs-perm-ref-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}
