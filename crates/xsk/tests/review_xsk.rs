//! Adversarial review of zcfs-xsk (review rv4), unprivileged: tests marked
//! `#[ignore = "finding: ..."]` fail on the code as reviewed.

use std::io::Write;

use zcfs_xsk::{Region, RegionError};

fn shm_file(label: &str, len: usize) -> std::fs::File {
    let path = format!("/dev/shm/zcfs-rv4-{}-{label}", std::process::id());
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.write_all(&vec![0x5A; len]).unwrap();
    f
}

/// Run `f` in a forked child (it must not allocate: the parent is multi-threaded) and
/// return the signal that ended it, if any.
fn in_child(f: impl FnOnce() -> bool) -> Option<i32> {
    // SAFETY: the child only runs `f` (raw copies into a stack buffer) and _exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let ok = f();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid);
    libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status))
}

/// `Region::map_file` is a safe function and `Region::read`/`write`/`crc32c` are safe
/// methods. A UMEM file that shrinks after mapping (another process with write access to
/// the volume file truncates it, or the operator does) must not make a bounds-checked
/// safe access kill the server with SIGBUS; the region must keep the file from shrinking
/// (e.g. F_SEAL_SHRINK on a memfd, a lease) or bound accesses by the file's length.
#[test]
#[ignore = "finding: a Region over a /dev/shm file that is truncated after mapping kills the process with SIGBUS on a checked read"]
fn a_file_region_survives_the_file_shrinking_under_it() {
    let f = shm_file("shrink", 4 * 4096);
    let r = Region::map_file(&f, 4096).unwrap();
    assert_eq!(r.file_len(), 4 * 4096);
    f.set_len(0).unwrap();
    let sig = in_child(|| {
        let mut b = [0u8; 16];
        let ok = r.read(4096, &mut b).is_ok();
        // Keep the copy from being optimised away.
        std::hint::black_box(&b);
        ok
    });
    assert_eq!(
        sig, None,
        "a bounds-checked Region::read of a shrunk file ended the process with signal {sig:?}"
    );
}

/// What holds: offsets and lengths that overflow u64 are refused, not wrapped.
#[test]
fn region_bounds_refuse_overflowing_offsets() {
    let r = Region::anonymous(8192).unwrap();
    let mut b = [0u8; 2];
    for off in [u64::MAX, u64::MAX - 1, 8191, 8192, 1 << 63] {
        assert!(matches!(
            r.read(off, &mut b),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(r.write(off, &b).is_err());
        assert!(r.crc32c(off, 2).is_err());
        assert!(r.copy_within(0, off, 2).is_err());
        assert!(r.copy_within(off, 0, 2).is_err());
    }
    assert!(r.crc32c(0, usize::MAX).is_err());
    assert!(r.read(8190, &mut b).is_ok());
    assert!(Region::anonymous(0).is_err());
    // A file region whose staging length overflows the UMEM limit is refused, typed.
    let f = shm_file("huge", 4096);
    assert!(matches!(
        Region::map_file(&f, usize::MAX),
        Err(RegionError::TooLarge { .. })
    ));
}
