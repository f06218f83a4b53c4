//! The FUSE threads of a remote mount that wait for requests with `-o readers=N`
//! (`zcfs_fuse::read_gate`): at most N wait in read(2) of /dev/fuse at once, the rest wait to be let
//! in, and requests that hold their threads (a stalled server's round trips, reads that
//! must wait for writes in flight) never keep another request from being read. Root
//! required (network namespaces, mounts), as in CI.
mod common;
use common::remote::*;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};
use zcfs_fuse::read_gate::QD_READERS;

const TIMEOUT: Duration = Duration::from_secs(3);

/// At rest, and after a burst of reads, `-o readers=4`: four of the sixteen threads
/// wait on the device; by default all of them, as without a gate.
#[test]
fn only_a_few_fuse_threads_wait_for_requests() {
    let net = Net::new();
    let srv = Served::new(&net, "gate-count", &[]);
    let readers = format!("readers={QD_READERS}");
    let m = RemoteMount::new(&net, &srv, "gate-count", &["-o", &readers]);
    let p = m.path("f");
    std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
    let pid = m.pid().unwrap();
    let settled = |want: (usize, usize)| {
        let t = Instant::now();
        loop {
            let got = fuse_threads(pid);
            if got == want || t.elapsed() > Duration::from_secs(5) {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert_eq!(settled((16, QD_READERS)), (16, QD_READERS));
    // Sixteen readers at once, O_DIRECT (every read reaches the mount).
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let p = &p;
            s.spawn(move || {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(p)
                    .unwrap();
                let mut buf = AlignedPage::new();
                for k in 0..200u64 {
                    let off = ((i * 200 + k) * 4096) % (1 << 20);
                    let n = std::os::unix::fs::FileExt::read_at(&f, buf.bytes(), off).unwrap();
                    assert_eq!(n, 4096);
                    assert!(buf.bytes().iter().all(|&b| b == 7));
                }
            });
        }
    });
    assert_eq!(
        settled((16, QD_READERS)),
        (16, QD_READERS),
        "after the burst"
    );
    drop(m);
    let m = RemoteMount::new(&net, &srv, "gate-all", &[]);
    assert_eq!(fuse_threads(m.pid().unwrap()).0, 16);
    let t = Instant::now();
    while fuse_threads(m.pid().unwrap()).1 < 16 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{:?}",
            fuse_threads(m.pid().unwrap())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// With the server stopped, requests that wait for it hold every thread that took
/// one: yet a request the mount answers itself (the security label it does not carry)
/// is read and answered at once. The threads at the device let others in when they
/// wait.
#[test]
fn requests_that_wait_do_not_keep_others_from_being_read() {
    let net = Net::new();
    let srv = Served::new(&net, "gate-wait", &[]);
    let timeout = format!("timeout={},readers={QD_READERS}", TIMEOUT.as_secs());
    let m = RemoteMount::new(&net, &srv, "gate-wait", &["-o", &timeout]);
    let (f, g) = (m.path("f"), m.path("g"));
    std::fs::write(&f, b"answered here").unwrap();
    std::fs::write(&g, vec![1u8; 8192]).unwrap();
    let local_answer = || {
        let t = Instant::now();
        let r = xattr_of(&f, "security.selinux");
        (r, t.elapsed())
    };
    let (r, _) = local_answer();
    assert_eq!(
        r,
        Err(libc::EOPNOTSUPP),
        "labels are not carried by default"
    );
    // Opened while the server runs: a writer, and two O_DIRECT readers.
    let mut w = std::fs::OpenOptions::new().write(true).open(&g).unwrap();
    let readers: Vec<std::fs::File> = (0..2)
        .map(|_| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&g)
                .unwrap()
        })
        .collect();
    srv.signal(libc::SIGSTOP);
    // A buffered write of g in flight (answered early; its reply never comes), then
    // two O_DIRECT reads of g and four lookups of names the kernel has not seen: each
    // waits for the server (the reads as the kernel asks for g's size first, the write
    // having made it stale).
    std::io::Write::write_all(&mut w, &[2u8; 4096]).unwrap();
    let mut waiting: Vec<_> = readers
        .into_iter()
        .map(|f| {
            std::thread::spawn(move || {
                let mut buf = AlignedPage::new();
                let _ = std::os::unix::fs::FileExt::read_at(&f, buf.bytes(), 0);
            })
        })
        .collect();
    // The reads first: each holds the thread that took it.
    std::thread::sleep(Duration::from_millis(100));
    waiting.extend((0..4).map(|i| {
        let dir = m.path("");
        std::thread::spawn(move || {
            let _ = std::fs::metadata(format!("{dir}/absent-{i}"));
        })
    }));
    std::thread::sleep(Duration::from_millis(200));
    let (r, took) = local_answer();
    srv.signal(libc::SIGCONT);
    assert_eq!(r, Err(libc::EOPNOTSUPP));
    assert!(
        took < Duration::from_millis(500),
        "a request the mount answers itself waited {took:?} behind requests that wait for the server"
    );
    drop(w);
    for t in waiting {
        t.join().unwrap();
    }
}

/// getxattr(2) of `name` on `path`: its size, or the errno.
fn xattr_of(path: &str, name: &str) -> Result<usize, i32> {
    let p = std::ffi::CString::new(path).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: two NUL-terminated strings that live across the call, and no buffer
    // (size 0 asks for the value's size only).
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r as usize)
    }
}
