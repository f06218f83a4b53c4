//! POSIX behaviours users rely on (issue 14), each run through a real FUSE mount of a
//! local volume and on tmpfs (/dev/shm) in the same test, and compared: the kernel's
//! own file system is the reference, not expectations written by hand.

mod common;
use common::mount::Mount;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errname(e: i32) -> String {
    if e == 0 {
        "ok".into()
    } else {
        std::io::Error::from_raw_os_error(e).to_string()
    }
}

/// A fresh directory on tmpfs, removed when dropped.
struct TmpfsDir(PathBuf);

impl TmpfsDir {
    fn new(name: &str) -> TmpfsDir {
        let d = PathBuf::from(format!(
            "/dev/shm/zcfs-posix-ref-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir(&d).unwrap();
        TmpfsDir(d)
    }
}

impl Drop for TmpfsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a descriptor shows: fstat's errno, link count and type.
fn fstat_line(fd: i32) -> String {
    // SAFETY: fstat writes into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstat(fd, &mut st) };
    if r < 0 {
        return format!("fstat {}", errname(errno()));
    }
    format!(
        "fstat ok nlink={} type={:o}",
        st.st_nlink,
        st.st_mode & libc::S_IFMT
    )
}

/// Replace names while a descriptor is open on what they named, and record what the
/// descriptor shows after: fstat (link count 0), listing the removed directory, and
/// creating in it (ENOENT: a dead directory takes no new names).
fn replaced_while_open(base: &Path) -> Vec<String> {
    let p = |n: &str| cpath(&base.join(n));
    let mut out = Vec::new();
    std::fs::create_dir(base.join("d1")).unwrap();
    std::fs::create_dir(base.join("d2")).unwrap();
    std::fs::write(base.join("f1"), b"one").unwrap();
    std::fs::write(base.join("f2"), b"two").unwrap();
    std::fs::create_dir(base.join("d3")).unwrap();
    // SAFETY: plain system calls on paths and descriptors this function owns.
    unsafe {
        let dfd = libc::open(p("d2").as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
        assert!(dfd >= 0, "open d2: {}", errname(errno()));
        let ffd = libc::open(p("f2").as_ptr(), libc::O_RDONLY);
        assert!(ffd >= 0);
        let d3 = libc::open(p("d3").as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
        assert!(d3 >= 0);
        out.push(format!(
            "rename d1 over d2: {}",
            errname(if libc::rename(p("d1").as_ptr(), p("d2").as_ptr()) < 0 {
                errno()
            } else {
                0
            })
        ));
        out.push(format!("old d2: {}", fstat_line(dfd)));
        let listing = std::fs::read_dir(format!("/proc/self/fd/{dfd}"))
            .map(|r| r.count().to_string())
            .unwrap_or_else(|e| e.to_string());
        out.push(format!("old d2 entries: {listing}"));
        let name = CString::new("x").unwrap();
        let r = libc::mkdirat(dfd, name.as_ptr(), 0o755);
        out.push(format!(
            "mkdir in old d2: {}",
            errname(if r < 0 { errno() } else { 0 })
        ));
        out.push(format!(
            "rename f1 over f2: {}",
            errname(if libc::rename(p("f1").as_ptr(), p("f2").as_ptr()) < 0 {
                errno()
            } else {
                0
            })
        ));
        out.push(format!("old f2: {}", fstat_line(ffd)));
        let mut buf = [0u8; 8];
        let n = libc::pread(ffd, buf.as_mut_ptr().cast(), buf.len(), 0);
        out.push(format!(
            "old f2 reads {:?}",
            String::from_utf8_lossy(&buf[..n.max(0) as usize])
        ));
        out.push(format!(
            "rmdir d3: {}",
            errname(if libc::rmdir(p("d3").as_ptr()) < 0 {
                errno()
            } else {
                0
            })
        ));
        out.push(format!("old d3: {}", fstat_line(d3)));
        for fd in [dfd, ffd, d3] {
            libc::close(fd);
        }
    }
    out
}

/// The new d2 is a different directory; the descriptor on the old one still works.
#[test]
fn a_replaced_directory_lives_while_open_as_on_tmpfs() {
    let reference = TmpfsDir::new("replaced");
    let want = replaced_while_open(&reference.0);
    for args in [&["-o", "cache=none"][..], &[][..]] {
        let m = Mount::volume_with("replaced", "64M", &[], args);
        let got = replaced_while_open(&m.mp);
        assert_eq!(got, want, "zcfs ({args:?}) differs from tmpfs");
        m.fsck_after_stop();
    }
}
