//! O_TMPFILE (issue 14): an unnamed file, given a name with linkat(2) or freed on its
//! last close. The script runs on tmpfs (the kernel's own rules), a local mount and a
//! remote mount in the same test, and the outcomes are compared line by line; then the
//! reclaiming of unlinked tmpfiles on close and after a crash.

mod common;
use common::mount::Mount;
use common::reference::{cpath, errname, errno, outcome, through_a_server, TmpfsDir};
use common::{run_ok, zcfs};
use std::ffi::CString;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// What a descriptor shows.
fn fstat_line(fd: i32) -> String {
    // SAFETY: fstat writes into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return format!("fstat {}", errname(errno()));
    }
    stat_text(&st)
}

/// What a path shows.
fn stat_line(p: &Path) -> String {
    // SAFETY: stat writes into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(cpath(p).as_ptr(), &mut st) } < 0 {
        return format!("stat {}", errname(errno()));
    }
    stat_text(&st)
}

fn stat_text(st: &libc::stat) -> String {
    format!(
        "nlink={} size={} mode={:o} uid={} gid={}",
        st.st_nlink, st.st_size, st.st_mode, st.st_uid, st.st_gid
    )
}

fn contents(p: &Path) -> String {
    match std::fs::read(p) {
        Ok(b) => format!("{:?}", String::from_utf8_lossy(&b)),
        Err(e) => e.to_string(),
    }
}

fn entries(p: &Path) -> String {
    let mut n: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    format!("entries {n:?}")
}

fn tmpfile(dir: &Path, flags: i32, mode: u32) -> i32 {
    // SAFETY: open of a path we own the string of.
    unsafe { libc::open(cpath(dir).as_ptr(), libc::O_TMPFILE | flags, mode) }
}

fn fd_outcome(fd: i32) -> String {
    if fd < 0 {
        errname(errno())
    } else {
        "ok".into()
    }
}

/// linkat(2) of descriptor `fd` to `to`: through /proc/self/fd with AT_SYMLINK_FOLLOW
/// (anyone) or with AT_EMPTY_PATH (needs CAP_DAC_READ_SEARCH).
fn link_fd(fd: i32, to: &Path, empty_path: bool) -> String {
    let to = cpath(to);
    // SAFETY: linkat with strings we own.
    let r = unsafe {
        if empty_path {
            libc::linkat(
                fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        } else {
            let proc = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
            libc::linkat(
                libc::AT_FDCWD,
                proc.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        }
    };
    outcome(r)
}

/// A user of the script: uid, gid, supplementary groups.
type Who = (u32, u32, &'static [u32]);
const ALICE: Who = (1001, 1001, &[]);
/// Bob, in the setgid directory's group 1234.
const BOB_IN_1234: Who = (1002, 1002, &[1234]);

/// As `who` with `umask`, in a forked child: open(`dir`, O_TMPFILE|O_RDWR, `mode`),
/// then link it to `to` (through /proc/self/fd, or AT_EMPTY_PATH). "open: E" or
/// "link: E".
fn tmpfile_as(who: Who, umask: u32, dir: &Path, mode: u32, to: &Path, empty_path: bool) -> String {
    // Everything the child needs, allocated before the fork (it runs system calls only).
    const FD: i32 = 200;
    let dir = cpath(dir);
    let to = cpath(to);
    let proc = CString::new(format!("/proc/self/fd/{FD}")).unwrap();
    let groups: Vec<libc::gid_t> = who.2.to_vec();
    // SAFETY: the child makes only system calls on memory prepared above and leaves with
    // _exit, so it never touches a lock another thread of the test held.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: in the child: system calls only (see above).
        unsafe {
            let errno = || *libc::__errno_location();
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setresgid(who.1, who.1, who.1) != 0
                || libc::setresuid(who.0, who.0, who.0) != 0
            {
                libc::_exit(250);
            }
            libc::umask(umask);
            let fd = libc::open(dir.as_ptr(), libc::O_TMPFILE | libc::O_RDWR, mode);
            if fd < 0 {
                libc::_exit(errno());
            }
            if libc::dup2(fd, FD) < 0 {
                libc::_exit(251);
            }
            let r = if empty_path {
                libc::linkat(
                    FD,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_EMPTY_PATH,
                )
            } else {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            libc::_exit(if r < 0 { 128 + errno() } else { 0 });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: {status}");
    match libc::WEXITSTATUS(status) {
        0 => "ok".into(),
        c @ 250..=251 => panic!("child could not set up ({c})"),
        c if c >= 128 => format!("link: {}", errname(c - 128)),
        c => format!("open: {}", errname(c)),
    }
}

/// The O_TMPFILE script: one line per observation.
fn script(base: &Path) -> Vec<String> {
    let t = base.join("t");
    std::fs::create_dir(&t).unwrap();
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut out = Vec::new();
    let mut say = |s: String| out.push(s);
    // SAFETY (every unsafe block below): plain system calls on descriptors and strings
    // this function owns.
    // An unnamed file: link count 0, in no listing; data through its descriptor.
    let fd = tmpfile(&t, libc::O_RDWR, 0o600);
    say(format!("open O_TMPFILE|O_RDWR 0600: {}", fd_outcome(fd)));
    let n = unsafe { libc::write(fd, b"hello, tmpfile".as_ptr().cast(), 14) };
    say(format!("write: {n}"));
    say(format!("fstat: {}", fstat_line(fd)));
    say(entries(&t));
    // A name through /proc/self/fd (what glibc's and systemd's users do).
    say(format!(
        "linkat /proc/self/fd a: {}",
        link_fd(fd, &t.join("a"), false)
    ));
    say(format!("fstat: {}", fstat_line(fd)));
    say(format!(
        "a: {} {}",
        stat_line(&t.join("a")),
        contents(&t.join("a"))
    ));
    say(format!("linkat a2: {}", link_fd(fd, &t.join("a2"), false)));
    say(format!("fstat: {}", fstat_line(fd)));
    say(entries(&t));
    // Unlinked again, it takes no new name (its first link cleared I_LINKABLE).
    std::fs::remove_file(t.join("a")).unwrap();
    std::fs::remove_file(t.join("a2")).unwrap();
    say(format!("fstat after unlinks: {}", fstat_line(fd)));
    say(format!(
        "linkat again: {}",
        link_fd(fd, &t.join("again"), false)
    ));
    unsafe { libc::close(fd) };
    // AT_EMPTY_PATH (root), a write-only descriptor, ftruncate through it after.
    let fd = tmpfile(&t, libc::O_WRONLY, 0o640);
    say(format!("open O_TMPFILE|O_WRONLY 0640: {}", fd_outcome(fd)));
    unsafe { libc::write(fd, b"empty path".as_ptr().cast(), 10) };
    say(format!(
        "linkat AT_EMPTY_PATH b: {}",
        link_fd(fd, &t.join("b"), true)
    ));
    say(format!(
        "b: {} {}",
        stat_line(&t.join("b")),
        contents(&t.join("b"))
    ));
    say(format!(
        "ftruncate 5: {}",
        outcome(unsafe { libc::ftruncate(fd, 5) })
    ));
    say(format!(
        "b: {} {}",
        stat_line(&t.join("b")),
        contents(&t.join("b"))
    ));
    unsafe { libc::close(fd) };
    // O_EXCL: never linkable.
    let fd = tmpfile(&t, libc::O_RDWR | libc::O_EXCL, 0o600);
    say(format!("open O_TMPFILE|O_EXCL: {}", fd_outcome(fd)));
    say(format!("fstat: {}", fstat_line(fd)));
    say(format!(
        "linkat /proc/self/fd: {}",
        link_fd(fd, &t.join("x"), false)
    ));
    say(format!(
        "linkat AT_EMPTY_PATH: {}",
        link_fd(fd, &t.join("x"), true)
    ));
    unsafe { libc::close(fd) };
    // What open refuses.
    let fd = tmpfile(&t.join("b"), libc::O_RDWR, 0o600);
    say(format!("O_TMPFILE on a file: {}", fd_outcome(fd)));
    let fd = tmpfile(&t, libc::O_RDONLY, 0o600);
    say(format!("O_TMPFILE|O_RDONLY: {}", fd_outcome(fd)));
    let fd = tmpfile(&t.join("missing"), libc::O_RDWR, 0o600);
    say(format!(
        "O_TMPFILE in a missing directory: {}",
        fd_outcome(fd)
    ));
    // A removed directory still makes unnamed files, but takes no names.
    std::fs::create_dir(t.join("dead")).unwrap();
    let dfd = unsafe {
        libc::open(
            cpath(&t.join("dead")).as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        )
    };
    assert!(dfd >= 0);
    std::fs::remove_dir(t.join("dead")).unwrap();
    let fd = unsafe { libc::openat(dfd, c".".as_ptr(), libc::O_TMPFILE | libc::O_RDWR, 0o600) };
    say(format!(
        "O_TMPFILE in a removed directory: {}",
        fd_outcome(fd)
    ));
    if fd >= 0 {
        say(format!("fstat: {}", fstat_line(fd)));
        let r = unsafe { libc::linkat(fd, c"".as_ptr(), dfd, c"x".as_ptr(), libc::AT_EMPTY_PATH) };
        say(format!("linkat into it: {}", outcome(r)));
        unsafe { libc::close(fd) };
    }
    unsafe { libc::close(dfd) };
    // Other users: write permission on the directory, umask, owner and group.
    let ro = t.join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    say(format!(
        "alice in a 0755 root directory: {}",
        tmpfile_as(ALICE, 0o022, &ro, 0o600, &ro.join("f"), false)
    ));
    say(format!(
        "alice, umask 077, 0666: {} {}",
        tmpfile_as(ALICE, 0o077, &t, 0o666, &t.join("alice"), false),
        stat_line(&t.join("alice"))
    ));
    say(format!(
        "alice AT_EMPTY_PATH: {}",
        tmpfile_as(ALICE, 0o022, &t, 0o600, &t.join("alice2"), true)
    ));
    let sg = t.join("sg");
    std::fs::create_dir(&sg).unwrap();
    std::os::unix::fs::chown(&sg, Some(0), Some(1234)).unwrap();
    std::fs::set_permissions(&sg, std::fs::Permissions::from_mode(0o2777)).unwrap();
    say(format!(
        "alice in a setgid directory, 02775: {} {}",
        tmpfile_as(ALICE, 0o022, &sg, 0o2775, &sg.join("alice"), false),
        stat_line(&sg.join("alice"))
    ));
    say(format!(
        "bob (in its group) in a setgid directory, 02775: {} {}",
        tmpfile_as(BOB_IN_1234, 0o022, &sg, 0o2775, &sg.join("bob"), false),
        stat_line(&sg.join("bob"))
    ));
    say(entries(&t));
    out
}

/// The script on tmpfs, a local mount and a remote mount: the same lines.
#[test]
fn o_tmpfile_behaves_as_on_tmpfs_on_local_and_remote_mounts() {
    let reference = TmpfsDir::new("tmpfile");
    let want = script(&reference.0);
    let m = Mount::volume_with("tmpfile", "64M", &[], &["-o", "allow_other"]);
    let local = script(&m.mp);
    m.fsck_after_stop();
    let remote = through_a_server("tmpfile", &["-o", "allow_other"], script);
    for (how, got) in [("local", local), ("remote", remote)] {
        let diffs: Vec<String> = want
            .iter()
            .zip(&got)
            .filter(|(w, g)| w != g)
            .map(|(w, g)| format!("  tmpfs: {w}\n  zcfs:  {g}"))
            .collect();
        assert!(
            diffs.is_empty() && want.len() == got.len(),
            "{how}: {} lines differ:\n{}",
            diffs.len(),
            diffs.join("\n")
        );
    }
}

/// Free inodes and blocks of the file system holding `p`.
fn free(p: &Path) -> (u64, u64) {
    // SAFETY: statvfs writes into a zeroed struct we own.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cpath(p).as_ptr(), &mut s) }, 0);
    (s.f_ffree, s.f_bfree)
}

/// Wait (bounded) until the free counts of `p` are `want`: the release and forget of a
/// closed file reach the file system after close(2) returns.
fn until_free_is(p: &Path, want: (u64, u64)) -> (u64, u64) {
    let t = Instant::now();
    loop {
        let now = free(p);
        if now == want || t.elapsed() > Duration::from_secs(10) {
            return now;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An unlinked tmpfile holds its inode and blocks until its last close, then gives
/// them back.
fn reclaimed_on_close(mp: &Path) {
    let before = free(mp);
    let fd = tmpfile(mp, libc::O_RDWR, 0o600);
    assert!(fd >= 0, "O_TMPFILE: {}", errname(errno()));
    let data = vec![7u8; 1 << 20];
    // SAFETY: a write from and fsync of what we own.
    unsafe {
        assert_eq!(
            libc::write(fd, data.as_ptr().cast(), data.len()),
            data.len() as isize
        );
        assert_eq!(libc::fsync(fd), 0);
    }
    let held = free(mp);
    assert_eq!(held.0, before.0 - 1, "the tmpfile holds an inode");
    assert!(
        held.1 + 256 <= before.1,
        "the tmpfile holds its 1 MiB: {before:?} -> {held:?}"
    );
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
    assert_eq!(
        until_free_is(mp, before),
        before,
        "closed, the tmpfile is freed"
    );
}

#[test]
fn an_unlinked_tmpfile_is_freed_on_close_local_and_remote() {
    let m = Mount::volume("tmpfile-close", "64M", &[]);
    reclaimed_on_close(&m.mp);
    m.fsck_after_stop();
    through_a_server("tmpfile-close", &[], reclaimed_on_close);
}

/// kill -9 of the mount process with an unlinked tmpfile open and a linked one: the
/// next open of the volume frees the first, the second keeps its name and data, and
/// fsck finds the volume clean.
#[test]
fn after_a_crash_an_unlinked_tmpfile_is_reclaimed_and_a_linked_one_survives() {
    let mut m = Mount::volume("tmpfile-crash", "64M", &[]);
    let before = free(&m.mp);
    let kept = tmpfile(&m.mp, libc::O_RDWR, 0o644);
    let orphan = tmpfile(&m.mp, libc::O_RDWR, 0o600);
    assert!(kept >= 0 && orphan >= 0, "O_TMPFILE: {}", errname(errno()));
    let data = vec![9u8; 1 << 20];
    // SAFETY: writes from and fsyncs of what we own.
    unsafe {
        assert_eq!(libc::write(kept, b"kept".as_ptr().cast(), 4), 4);
        assert_eq!(link_fd(kept, &m.path("kept"), false), "ok");
        assert_eq!(libc::fsync(kept), 0);
        assert_eq!(
            libc::write(orphan, data.as_ptr().cast(), data.len()),
            data.len() as isize
        );
        assert_eq!(libc::fsync(orphan), 0);
    }
    let held = free(&m.mp);
    assert_eq!(held.0, before.0 - 2);
    let child = m.child.take().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let mut child = child;
    child.wait().unwrap();
    // SAFETY: closing our descriptors (on a dead mount).
    unsafe {
        libc::close(kept);
        libc::close(orphan);
    }
    run_ok(zcfs().arg("umount").arg("--lazy").arg(&m.mp));
    let image = m.image.clone().unwrap();
    m.start(image.to_str().unwrap(), &[]);
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"kept");
    assert_eq!(
        stat_line(&m.path("kept")).split(' ').next(),
        Some("nlink=1")
    );
    let after = free(&m.mp);
    assert_eq!(after.0, before.0 - 1, "only the linked tmpfile is left");
    assert!(
        after.1 >= held.1 + 256,
        "the orphan's 1 MiB came back: {held:?} -> {after:?}"
    );
    m.fsck_after_stop();
}
