//! POSIX behaviours users rely on (issue 14), each run through a real FUSE mount of a
//! local volume and on tmpfs (/dev/shm) in the same test, and compared: the kernel's
//! own file system is the reference, not expectations written by hand.

mod common;
use common::mount::Mount;
use common::reference::{cpath, errname, errno, outcome, through_a_server, TmpfsDir};
use std::ffi::CString;
use std::path::Path;

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
            outcome(libc::rename(p("d1").as_ptr(), p("d2").as_ptr()))
        ));
        out.push(format!("old d2: {}", fstat_line(dfd)));
        let listing = std::fs::read_dir(format!("/proc/self/fd/{dfd}"))
            .map(|r| r.count().to_string())
            .unwrap_or_else(|e| e.to_string());
        out.push(format!("old d2 entries: {listing}"));
        let name = CString::new("x").unwrap();
        let r = libc::mkdirat(dfd, name.as_ptr(), 0o755);
        out.push(format!("mkdir in old d2: {}", outcome(r)));
        out.push(format!(
            "rename f1 over f2: {}",
            outcome(libc::rename(p("f1").as_ptr(), p("f2").as_ptr()))
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
            outcome(libc::rmdir(p("d3").as_ptr()))
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

/// One observation of the fallocate script: what a call returned, and the file after.
#[derive(Debug, Clone, PartialEq)]
struct Obs {
    what: String,
    /// errno or the offset lseek returned, etc.
    result: String,
    size: u64,
    /// st_blocks in 4 KiB units.
    blocks: u64,
    /// FNV-1a of the contents.
    hash: u64,
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf29ce484222325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100000001b3)
    })
}

/// Run the fallocate script in `base`. `zero_range` is how ZERO_RANGE is done there:
/// natively (zcfs), or as tmpfs can, PUNCH_HOLE then KEEP_SIZE preallocation then
/// growing the size (tmpfs has no ZERO_RANGE; the result must be the same file).
fn falloc_script(base: &Path, native_zero_range: bool) -> Vec<Obs> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let path = base.join("f");
    let c = cpath(&path);
    const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
    const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
    // SAFETY: plain system calls on a descriptor this function owns.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o644) };
    assert!(fd >= 0);
    let rc = |r: libc::c_int| if r < 0 { errname(errno()) } else { "ok".into() };
    let falloc = |mode: i32, off: i64, len: i64| {
        // SAFETY: fallocate on our descriptor.
        rc(unsafe { libc::fallocate(fd, mode, off, len) })
    };
    let pwrite = |off: i64, data: &[u8]| {
        // SAFETY: pwrite from a live buffer on our descriptor.
        let n = unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), off) };
        assert_eq!(n, data.len() as isize, "pwrite: {}", errname(errno()));
    };
    let seek = |off: i64, whence: i32| {
        // SAFETY: lseek on our descriptor.
        let r = unsafe { libc::lseek(fd, off, whence) };
        if r < 0 {
            errname(errno())
        } else {
            r.to_string()
        }
    };
    let mut note = |what: &str, result: String| {
        let m = std::fs::metadata(&path).unwrap();
        let data = std::fs::read(&path).unwrap();
        out.push(Obs {
            what: what.into(),
            result,
            size: m.size(),
            blocks: m.blocks() / 8,
            hash: fnv(&data),
        });
    };
    note("preallocate 64 KiB", falloc(0, 0, 64 << 10));
    pwrite(4095, b"ab");
    note(
        "2 bytes across a block boundary allocate nothing more",
        "ok".into(),
    );
    note("KEEP_SIZE past the end", falloc(KEEP, 64 << 10, 32 << 10));
    note("punch 8 KiB", falloc(PUNCH | KEEP, 16 << 10, 8 << 10));
    note("punch without KEEP_SIZE", falloc(PUNCH, 0, 4096));
    note(
        "COLLAPSE_RANGE",
        falloc(libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096),
    );
    note(
        "INSERT_RANGE",
        falloc(libc::FALLOC_FL_INSERT_RANGE, 0, 4096),
    );
    note("zero length", falloc(0, 0, 0));
    note("negative offset", falloc(0, -1, 4096));
    // Data and holes: rewrite as data at 0..8K and 40K..48K, holes elsewhere.
    // SAFETY: ftruncate on our descriptor.
    unsafe { libc::ftruncate(fd, 0) };
    pwrite(0, &[1u8; 8192]);
    pwrite(40 << 10, &[2u8; 8192]);
    unsafe { libc::ftruncate(fd, 56 << 10) };
    note("data 0..8K, 40K..48K, size 56K", "ok".into());
    for off in [
        0i64,
        5000,
        8192,
        20000,
        40 << 10,
        50 << 10,
        56 << 10,
        1 << 20,
    ] {
        note(&format!("SEEK_DATA {off}"), seek(off, libc::SEEK_DATA));
        note(&format!("SEEK_HOLE {off}"), seek(off, libc::SEEK_HOLE));
    }
    // ZERO_RANGE over part of the data, keeping the size, then growing it.
    let zero = |keep: bool, off: i64, len: i64| {
        if native_zero_range {
            let m = libc::FALLOC_FL_ZERO_RANGE | if keep { KEEP } else { 0 };
            return falloc(m, off, len);
        }
        let (bs, be) = ((off + 4095) / 4096 * 4096, (off + len) / 4096 * 4096);
        for (s, e) in [(off, bs.min(off + len)), (be.max(off), off + len)] {
            if s < e {
                // SAFETY: fstat into a zeroed stat we own.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                unsafe { libc::fstat(fd, &mut st) };
                let e2 = e.min(st.st_size);
                if s < e2 {
                    pwrite(s, &vec![0u8; (e2 - s) as usize]);
                }
            }
        }
        if bs < be {
            assert_eq!(falloc(PUNCH | KEEP, bs, be - bs), "ok");
        }
        falloc(if keep { KEEP } else { 0 }, off, len)
    };
    note("ZERO_RANGE|KEEP_SIZE 100..6100", zero(true, 100, 6000));
    note("ZERO_RANGE growing to 64K", zero(false, 44 << 10, 20 << 10));
    note("preallocate past the volume", falloc(0, 0, 1 << 30));
    unsafe { libc::close(fd) };
    out
}

fn compare_obs(want: &[Obs], got: &[Obs]) -> Vec<String> {
    assert_eq!(want.len(), got.len());
    want.iter()
        .zip(got)
        .filter(|(w, g)| {
            // Map nodes count in zcfs's st_blocks: at most one per 512 blocks, plus
            // the levels above.
            let blocks_ok = g.blocks >= w.blocks && g.blocks <= w.blocks + w.blocks / 512 + 2;
            w.what != g.what
                || w.result != g.result
                || w.size != g.size
                || w.hash != g.hash
                || !blocks_ok
        })
        .map(|(w, g)| format!("tmpfs: {w:?}\n zcfs: {g:?}"))
        .collect()
}

/// fallocate through a real mount, compared with a tmpfs of a similar size: sizes,
/// st_blocks, contents, errnos, SEEK_DATA/SEEK_HOLE answers, ENOSPC up front.
#[test]
fn fallocate_and_seek_match_tmpfs() {
    let reference = TmpfsDir::new("falloc");
    common::sh(&format!(
        "mount -t tmpfs -o size=64m zcfs-falloc-ref {}",
        reference.0.display()
    ));
    let want = falloc_script(&reference.0, false);
    // Detach lazily: a child the other test forks meanwhile inherits this test's open
    // descriptors for a moment and would make a plain umount fail with EBUSY.
    common::sh(&format!("umount -l {}", reference.0.display()));
    let m = Mount::volume_with("falloc", "64M", &[], &["-o", "cache=none"]);
    let local = falloc_script(&m.mp, true);
    m.fsck_after_stop();
    // Through a server (fallocate's modes and lseek are protocol operations).
    let remote = through_a_server("falloc", &["-o", "cache=none"], |mp| {
        falloc_script(mp, true)
    });
    for (how, got) in [("local", local), ("remote", remote)] {
        let diffs = compare_obs(&want, &got);
        assert!(
            diffs.is_empty(),
            "{how}: {} differ:\n{}",
            diffs.len(),
            diffs.join("\n")
        );
    }
}

/// A file handle: name_to_handle_at's bytes for `path` (a buffer big enough for any
/// file system's), or its errno.
fn handle_of(path: &Path) -> Result<Vec<u8>, String> {
    const MAX_HANDLE: usize = 128;
    // file_handle: handle_bytes u32, handle_type i32, then the bytes (u64-aligned).
    let mut buf = vec![0u64; (8 + MAX_HANDLE) / 8];
    let c = cpath(path);
    let mut mount_id = 0;
    // SAFETY: the buffer is a file_handle header followed by MAX_HANDLE bytes, as
    // handle_bytes says; name_to_handle_at writes within it.
    unsafe {
        let h = buf.as_mut_ptr() as *mut libc::file_handle;
        (*h).handle_bytes = MAX_HANDLE as u32;
        if libc::name_to_handle_at(libc::AT_FDCWD, c.as_ptr(), h, &mut mount_id, 0) < 0 {
            return Err(errname(errno()));
        }
        let n = 8 + (*h).handle_bytes as usize;
        Ok(std::slice::from_raw_parts(buf.as_ptr() as *const u8, n).to_vec())
    }
}

/// Open a handle from `handle_of` on the file system of `mount` and say what it finds:
/// its type, link count and first bytes, or the errno; and how many descriptors it
/// opened (and closed again) on that file system: the mount's root, and what the
/// handle names if it opened.
fn open_handle(mount: &Path, handle: &[u8]) -> (String, u64) {
    let mut buf = vec![0u64; handle.len().div_ceil(8)];
    // SAFETY: copying the handle's bytes into an aligned buffer of at least their size.
    unsafe {
        std::ptr::copy_nonoverlapping(handle.as_ptr(), buf.as_mut_ptr() as *mut u8, handle.len())
    };
    let m = cpath(mount);
    // SAFETY: plain system calls on descriptors this function owns; the handle buffer
    // holds a whole file_handle as name_to_handle_at wrote it.
    unsafe {
        let mfd = libc::open(m.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
        assert!(mfd >= 0);
        let fd = libc::open_by_handle_at(
            mfd,
            buf.as_mut_ptr() as *mut libc::file_handle,
            libc::O_RDONLY,
        );
        let e = errno();
        libc::close(mfd);
        if fd < 0 {
            return (format!("open_by_handle_at {}", errname(e)), 1);
        }
        let line = fstat_line(fd);
        let mut data = [0u8; 8];
        let n = libc::pread(fd, data.as_mut_ptr().cast(), data.len(), 0);
        libc::close(fd);
        let line = format!(
            "{line} reads {:?}",
            String::from_utf8_lossy(&data[..n.max(0) as usize])
        );
        (line, 2)
    }
}

/// Forget what the kernel caches of names and inodes, so a handle has to be looked up
/// in the file system itself (FUSE: a LOOKUP of "." in the node id).
fn drop_kernel_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
}

/// Handles of a hard-linked file (both names), a directory, and what they open after
/// the kernel forgot the inodes, after one name went, while the file has no name but is
/// still open, and after the file is gone.
///
/// `released(n)` returns once the file system has been told of the close of the first
/// `n` descriptors the script opened on it. On tmpfs close(2) is done when it returns;
/// through FUSE the kernel sends RELEASE after close(2) returned and keeps the inode
/// until it is answered: meanwhile the file is still open as far as the file system
/// knows, and a handle of it opens, as on tmpfs while a descriptor is open.
fn handles_script(base: &Path, mount: &Path, released: &dyn Fn(u64)) -> Vec<String> {
    let mut out = Vec::new();
    // Descriptors opened (and closed) on the file system so far.
    let opened = std::cell::Cell::new(0);
    let open = |h: &[u8]| {
        let (line, n) = open_handle(mount, h);
        opened.set(opened.get() + n);
        line
    };
    std::fs::write(base.join("f"), b"content").unwrap();
    opened.set(opened.get() + 1);
    std::fs::hard_link(base.join("f"), base.join("g")).unwrap();
    std::fs::create_dir(base.join("d")).unwrap();
    let hf = handle_of(&base.join("f")).unwrap();
    let hg = handle_of(&base.join("g")).unwrap();
    let hd = handle_of(&base.join("d")).unwrap();
    out.push(format!("f and g share a handle: {}", hf == hg));
    for (name, h) in [("f", &hf), ("d", &hd)] {
        out.push(format!("{name} cached: {}", open(h)));
    }
    drop_kernel_caches();
    for (name, h) in [("f", &hf), ("g", &hg), ("d", &hd)] {
        out.push(format!("{name} uncached: {}", open(h)));
    }
    std::fs::remove_file(base.join("f")).unwrap();
    drop_kernel_caches();
    out.push(format!("after unlink f: {}", open(&hg)));
    // The last name goes while a descriptor holds the file open.
    let holder = std::fs::File::open(base.join("g")).unwrap();
    opened.set(opened.get() + 1);
    std::fs::remove_file(base.join("g")).unwrap();
    std::fs::remove_dir(base.join("d")).unwrap();
    drop_kernel_caches();
    out.push(format!("after unlink g, open: {}", open(&hf)));
    drop(holder);
    // Every descriptor is closed now: once the file system knows, the file is gone.
    released(opened.get());
    drop_kernel_caches();
    out.push(format!("after unlink g: {}", open(&hf)));
    out.push(format!("after rmdir d: {}", open(&hd)));
    out
}

/// `handles_script`'s `released` for a zcfs mount at `mp`: wait (at most 20 s) until,
/// by `zcfs stat`'s counts, the mount answered at least `n` RELEASEs and RELEASEDIRs,
/// and one for every handle it opened (an operation is counted once its answer is with
/// the kernel, which lets the inode go then).
fn released_on(mp: &Path) -> impl Fn(u64) + '_ {
    move |n| {
        let t = std::time::Instant::now();
        loop {
            let out = common::run_ok(common::zcfs().arg("stat").arg(mp).arg("--json"));
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let count = |op: &str, what: &str| r["ops"][op][what].as_u64().unwrap_or(0);
            let done = |op: &str| count(op, "count");
            let opened = |op: &str| done(op) - count(op, "errors");
            let files = (opened("open") + opened("create"), done("release"));
            let dirs = (opened("opendir"), done("releasedir"));
            if files.1 + dirs.1 >= n && files.1 >= files.0 && dirs.1 >= dirs.0 {
                return;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(20),
                "the mount released {} of {} files and {} of {} directories opened \
                 ({n} closed by the test)",
                files.1,
                files.0,
                dirs.1,
                dirs.0
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// File handles keep working for every name of an inode, as on tmpfs, on local and
/// remote mounts.
#[test]
fn file_handles_of_hard_links_open_as_on_tmpfs() {
    let reference = TmpfsDir::new("handles");
    let want = handles_script(&reference.0, Path::new("/dev/shm"), &|_| {});
    let m = Mount::volume_with("handles", "64M", &[], &[]);
    let got = handles_script(&m.mp, &m.mp, &released_on(&m.mp));
    assert_eq!(got, want, "zcfs differs from tmpfs");
    m.fsck_after_stop();
    // Through a server: the mount's lookup of "." is a hold on the server.
    let got = through_a_server("handles", &[], |mp| {
        handles_script(mp, mp, &released_on(mp))
    });
    assert_eq!(got, want, "a remote zcfs mount differs from tmpfs");
}
