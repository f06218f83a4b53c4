//! Shared-buffer mode: reads and writes through a registered buffer against a model,
//! handles, buffers and bounds.

mod common;
use common::*;
use rand::{Rng, SeedableRng};
use zcfs_samehost::client::{Client, Error};
use zcfs_samehost::ring::{op, Sqe};

#[test]
fn shared_reads_and_writes_match_a_model() {
    let mut s = serve("model");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(1 << 20).unwrap();
    let f = c.open("/m", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(f.size, 0);
    let mut model: Vec<u8> = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    for step in 0..300u64 {
        let off = rng.gen_range(0..600_000u64);
        let len = rng.gen_range(0..70_000usize);
        if rng.gen_bool(0.5) {
            let data = pattern(len, step);
            let boff = rng.gen_range(0..(1 << 20) - len) as u64;
            c.buffer_mut(buf).unwrap()[boff as usize..boff as usize + len].copy_from_slice(&data);
            assert_eq!(c.write(f.handle, off, buf, boff, len as u64).unwrap(), len);
            let end = off as usize + len;
            if model.len() < end && len > 0 {
                model.resize(end, 0);
            }
            model[off as usize..off as usize + len].copy_from_slice(&data);
        } else {
            let n = c.read(f.handle, off, buf, 0, len as u64).unwrap();
            let want = model
                .get(off as usize..)
                .map_or(&[][..], |m| &m[..len.min(m.len())]);
            assert_eq!(n, want.len(), "step {step}: read length at {off}+{len}");
            assert!(
                c.buffer(buf).unwrap()[..n] == *want,
                "step {step}: bytes at {off}"
            );
        }
    }
    c.fsync(f.handle).unwrap();
    let st = c.stats().unwrap();
    assert!(st.shared_read_ops > 0 && st.shared_write_ops > 0);
    assert_eq!(st.shared_copies_per_byte, 1.0);
    assert_eq!(st.direct_copies_per_byte, 0.0);
    // The volume agrees (the file as the server sees it).
    let ino = s.vol.lookup(&zcfs_volume::Cred::ROOT, 1, b"m").unwrap().ino;
    let mut all = vec![0; model.len()];
    assert_eq!(s.vol.read(ino, 0, &mut all).unwrap(), model.len());
    assert!(all == model);
    c.close(f.handle).unwrap();
    drop(c);
    s.stop_and_check();
}

#[test]
fn a_batch_of_entries_completes_in_any_order_with_its_user_data() {
    let s = serve("batch");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(64 << 10).unwrap();
    let f = c.open("/b", libc::O_RDWR | libc::O_CREAT, 0o600).unwrap();
    c.buffer_mut(buf).unwrap().fill(7);
    let sqes: Vec<Sqe> = (0..16u64)
        .map(|i| Sqe {
            user_data: i,
            op: op::WRITE,
            handle: f.handle,
            offset: i * 4096,
            len: 4096,
            buf,
            buf_off: 0,
            ..Default::default()
        })
        .collect();
    c.submit(&sqes).unwrap();
    let mut got = c.wait(16).unwrap();
    got.sort_by_key(|c| c.user_data);
    assert_eq!(got.len(), 16);
    for (i, cqe) in got.iter().enumerate() {
        assert_eq!((cqe.user_data, cqe.result), (i as u64, 4096));
    }
}

#[test]
fn bad_buffers_handles_and_ops_get_an_errno_and_the_server_lives_on() {
    let s = serve("bad");
    let mut c = Client::connect(&s.sock).unwrap();
    const LEN: u64 = 8192;
    let buf = c.register_buffer(LEN as usize).unwrap();
    let f = c.open("/x", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let ro = c.open("/x", libc::O_RDONLY, 0).unwrap();
    let errno = |r: Result<usize, Error>| r.unwrap_err().errno();
    // Buffer ranges: at the bound fine, one past refused, wrapping refused.
    assert_eq!(c.write(f.handle, 0, buf, 0, LEN).unwrap(), LEN as usize);
    assert_eq!(
        c.read(f.handle, 0, buf, 1, LEN - 1).unwrap(),
        (LEN - 1) as usize
    );
    assert_eq!(errno(c.read(f.handle, 0, buf, 1, LEN)), libc::EFAULT);
    assert_eq!(errno(c.write(f.handle, 0, buf, LEN, 1)), libc::EFAULT);
    assert_eq!(errno(c.write(f.handle, 0, buf, u64::MAX, 2)), libc::EFAULT);
    assert_eq!(errno(c.read(f.handle, 0, buf + 100, 0, 1)), libc::EFAULT);
    // Handles: unknown, closed, the wrong direction.
    assert_eq!(errno(c.read(9999, 0, buf, 0, 1)), libc::EBADF);
    assert_eq!(errno(c.write(ro.handle, 0, buf, 0, 1)), libc::EBADF);
    c.close(ro.handle).unwrap();
    assert_eq!(errno(c.read(ro.handle, 0, buf, 0, 1)), libc::EBADF);
    assert_eq!(c.close(ro.handle).unwrap_err().errno(), libc::EBADF);
    // Another connection's handle is not ours.
    let mut other = Client::connect(&s.sock).unwrap();
    let obuf = other.register_buffer(4096).unwrap();
    assert_eq!(
        other.read(f.handle, 0, obuf, 0, 1).unwrap_err().errno(),
        libc::EBADF
    );
    // Unknown op; direct-map ops without the direct map.
    let e = c
        .call(Sqe {
            op: 200,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let e = c
        .call(Sqe {
            op: op::RESERVE,
            len: 1,
            buf,
            ..Default::default()
        })
        .unwrap_err();
    assert_eq!(e.errno(), libc::EPERM);
    // The file is intact and the connection still works.
    assert_eq!(c.read(f.handle, 0, buf, 0, LEN).unwrap(), LEN as usize);
}

#[test]
fn buffers_must_be_sealed_memfds_and_registrations_are_bounded() {
    use rustix::fs::{MemfdFlags, SealFlags};
    let s = serve("bufs");
    let mut c = Client::connect(&s.sock).unwrap();
    // Not sealed against shrinking.
    let fd =
        rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, 4096).unwrap();
    let e = c
        .register_fd(rustix::fd::AsFd::as_fd(&fd), 4096)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // Sealed against shrinking: accepted.
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK).unwrap();
    assert!(c.register_fd(rustix::fd::AsFd::as_fd(&fd), 4096).is_ok());
    // A regular file is not a memfd.
    let path = std::env::temp_dir().join(format!("zcfs-sh-{}-plain", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(4096).unwrap();
    let _ = std::fs::remove_file(&path);
    let e = c
        .register_fd(rustix::fd::AsFd::as_fd(&file), 4096)
        .unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // The bound on buffers per connection.
    for _ in 1..zcfs_samehost::server::MAX_BUFFERS {
        c.register_buffer(4096).unwrap();
    }
    assert_eq!(c.register_buffer(4096).unwrap_err().errno(), libc::ENOBUFS);
}

/// A control message (open, close...) sent while the connection's thread spins on the
/// ring after ring work is answered at once, not after the spin: the spin looks at the
/// control socket too. With a 5 s spin, an `open` right after a ring read took the whole
/// spin before; a bound of half of it leaves room for any scheduling delay.
#[test]
fn a_control_message_does_not_wait_out_the_rings_spin() {
    const SPIN: std::time::Duration = std::time::Duration::from_secs(5);
    let s = serve_with("ctlspin", |cfg| cfg.spin = SPIN);
    let mut c = Client::connect(&s.sock).unwrap();
    let f = c.open("/s", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let buf = c.register_buffer(4096).unwrap();
    for i in 0..3 {
        // Ring work, then at once a control message.
        assert_eq!(c.read(f.handle, 0, buf, 0, 4096).unwrap(), 0);
        let t = std::time::Instant::now();
        let g = c
            .open(format!("/t{i}"), libc::O_RDWR | libc::O_CREAT, 0o644)
            .unwrap();
        c.close(g.handle).unwrap();
        assert!(
            t.elapsed() < SPIN / 2,
            "open + close after ring work took {:?} (the spin is {SPIN:?})",
            t.elapsed()
        );
    }
    // The ring still works after control messages cut its spin short.
    assert_eq!(c.read(f.handle, 0, buf, 0, 4096).unwrap(), 0);
}
