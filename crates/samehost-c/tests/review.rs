//! Adversarial review (rv8) of the C ABI: mixing the asynchronous ring calls
//! (zcfs_submit / zcfs_wait) with the synchronous ones, and waits that cannot end.
//! Tests marked `#[ignore = "finding: ..."]` expose a problem (seen failing).

mod common;
use std::ffi::CString;
use std::ptr::null_mut;
use std::time::Duration;
use zcfs::*;

/// Synchronous calls (zcfs_read...) keep the completions of the application's own
/// entries that they reap meanwhile in a map keyed by `user_data`. C code often gives
/// every entry the same `user_data` (0): all but one of those completions are then
/// lost, and `zcfs_wait` for them blocks forever. (With distinct small values the
/// sync calls' own ids, from 2^63, do not collide: that part is sound.)
#[test]
fn completions_with_equal_user_data_survive_a_synchronous_call() {
    let s = common::serve("udsame");
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    // SAFETY: `h` is live; the other pointers are to locals.
    let h = unsafe { zcfs_connect(sock.as_ptr()) };
    assert!(!h.is_null());
    let mut buf = 0u32;
    let path = CString::new("/u").unwrap();
    let mut fh = 0u32;
    let flags = libc::O_RDWR | libc::O_CREAT;
    let sqes = vec![
        zcfs_sqe {
            user_data: 0,
            op: ZCFS_OP_NOP,
            ..Default::default()
        };
        8
    ];
    // SAFETY: as above.
    unsafe {
        assert_eq!(zcfs_register_buffer(h, 1 << 16, &mut buf), 0);
        assert_eq!(
            zcfs_open(h, path.as_ptr(), flags, 0o644, &mut fh, null_mut()),
            0
        );
        assert_eq!(zcfs_submit(h, sqes.as_ptr(), sqes.len()), 0);
        // A synchronous call while they are in flight.
        assert_eq!(zcfs_write(h, fh, 0, buf, 0, 4096), 4096);
    }
    let h = Ptr(h);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let h = h;
        let mut out = [zcfs_cqe::default(); 8];
        // SAFETY: as above; `out` has room for 8.
        let r = unsafe { zcfs_wait(h.0, 8, out.as_mut_ptr(), 8) };
        let _ = tx.send(r);
    });
    // Bounded: 8 NOPs complete at once; a wait still blocked after 10 s never returns.
    let r = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(r.ok(), Some(8), "the 8 completions did not all come back");
}

struct Ptr(*mut zcfs_client);
// SAFETY: the handle is used by one thread at a time (moved to the waiter).
unsafe impl Send for Ptr {}

/// (Review finding, fixed.) `zcfs_wait` for more completions than there are entries in
/// flight never returned (nothing will ever complete); it says -EINVAL at once.
#[test]
fn waiting_for_more_than_is_in_flight_returns() {
    let s = common::serve("waitmore");
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    // SAFETY: a live handle, handed to one thread.
    let h = Ptr(unsafe { zcfs_connect(sock.as_ptr()) });
    assert!(!h.0.is_null());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let h = h;
        let mut out = [zcfs_cqe::default(); 1];
        // SAFETY: as above; `out` has room for 1.
        let r = unsafe { zcfs_wait(h.0, 1, out.as_mut_ptr(), 1) };
        let _ = tx.send(r);
    });
    // Bounded: a wait that has not returned in 10 s never will (nothing is in flight).
    let r = rx.recv_timeout(Duration::from_secs(10));
    assert_eq!(
        r.expect("zcfs_wait(1) with nothing in flight still blocks after 10 s"),
        -(libc::EINVAL as i64)
    );
}

/// A connection and an open file on a fresh service (the caller disconnects).
fn connect_and_open(s: &common::Served, path: &str) -> (*mut zcfs_client, u32) {
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    let p = CString::new(path).unwrap();
    // SAFETY: NUL-terminated strings; `fh` is a local.
    unsafe {
        let h = zcfs_connect(sock.as_ptr());
        assert!(!h.is_null());
        let mut fh = 0u32;
        let flags = libc::O_RDWR | libc::O_CREAT;
        assert_eq!(
            zcfs_open(h, p.as_ptr(), flags, 0o644, &mut fh, null_mut()),
            0
        );
        (h, fh)
    }
}

/// Reserve `pages`: the reservation's id.
///
/// # Safety
/// `h` is a live handle.
unsafe fn reserve(h: *mut zcfs_client, pages: usize) -> Result<u64, i32> {
    let mut id = 0u64;
    // SAFETY: per this function's contract; `id` is a local.
    match unsafe { zcfs_zcopy_from(h, pages, &mut id, null_mut()) } {
        0 => Ok(id),
        e => Err(e),
    }
}

/// (Review note, fixed.) After a COMMIT the volume refused (here: no free block for
/// the file's new map nodes), the server had given the reservation's blocks back to
/// the allocator, but the library kept its window: `zcfs_zcopy_page` still handed out
/// a writable pointer to a free block (the old code kept windows on every failure).
#[test]
fn no_page_of_a_reservation_is_handed_out_after_a_commit_the_volume_refused() {
    let mut s = common::serve("refusedc");
    let (h, fh) = connect_and_open(&s, "/full");
    // SAFETY: `h` is live until zcfs_disconnect; `t` until zcfs_pflush_free.
    unsafe {
        let id = reserve(h, 1).unwrap();
        assert!(!zcfs_zcopy_page(h, id, 0).is_null());
        // Hold every other free block in reservations.
        let mut n = zcfs::ZCFS_RESERVE_MAX;
        let mut fillers = 0;
        while n > 0 {
            match reserve(h, n) {
                Ok(_) => fillers += 1,
                Err(e) if e == -libc::ENOSPC => n /= 2,
                Err(e) => panic!("reserve {n}: {e}"),
            }
        }
        // Far into the file: the map needs new nodes, and there is no block for them.
        let t = zcfs_pflush_new();
        assert_eq!(zcfs_pflush_add(t, fh, 1 << 30, id, ZCFS_NO_NEW_SIZE), 0);
        assert_eq!(zcfs_pflush_commit(h, t), -libc::ENOSPC);
        assert!(
            zcfs_zcopy_page(h, id, 0).is_null(),
            "a writable page of a reservation the refused commit gave back"
        );
        assert_eq!(s.svc.stats().reservations_active, fillers);
        assert_eq!(zcfs_zcopy_abort(h, id), -libc::EINVAL);
        zcfs_pflush_free(t);
        zcfs_disconnect(h);
    }
    common::eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    s.stop_and_check();
}

/// Whatever `zcfs_pflush_commit` returns, its reservations are consumed: refused by the
/// server's checks (an unaligned offset) or naming one this connection does not hold,
/// none stays held or keeps a page (the server kept those it refused at its checks
/// and the library kept their windows, while it dropped those the volume refused: the
/// caller could not tell which).
#[test]
fn a_failed_pflush_commit_consumes_its_reservations() {
    let mut s = common::serve("failedpf");
    let (h, fh) = connect_and_open(&s, "/f");
    // SAFETY: as above.
    unsafe {
        let a = reserve(h, 1).unwrap();
        let b = reserve(h, 2).unwrap();
        let t = zcfs_pflush_new();
        assert_eq!(zcfs_pflush_add(t, fh, 0, a, ZCFS_NO_NEW_SIZE), 0);
        assert_eq!(zcfs_pflush_add(t, fh, 100, b, ZCFS_NO_NEW_SIZE), 0);
        assert_eq!(zcfs_pflush_commit(h, t), -libc::EINVAL);
        assert!(zcfs_zcopy_page(h, a, 0).is_null() && zcfs_zcopy_page(h, b, 0).is_null());
        assert_eq!(s.svc.stats().reservations_active, 0);
        // The transaction is empty now: committing it again is -EINVAL, changing
        // nothing.
        assert_eq!(zcfs_pflush_commit(h, t), -libc::EINVAL);
        // One held and one unknown (the committed `a`): the held one is given back.
        let c = reserve(h, 1).unwrap();
        assert_eq!(zcfs_pflush_add(t, fh, 0, c, ZCFS_NO_NEW_SIZE), 0);
        assert_eq!(zcfs_pflush_add(t, fh, 4096, a, ZCFS_NO_NEW_SIZE), 0);
        assert_eq!(zcfs_pflush_commit(h, t), -libc::EINVAL);
        assert!(zcfs_zcopy_page(h, c, 0).is_null());
        assert_eq!(s.svc.stats().reservations_active, 0);
        assert_eq!(zcfs_zcopy_abort(h, c), -libc::EINVAL);
        zcfs_pflush_free(t);
        zcfs_disconnect(h);
    }
    let ino = s.vol.lookup(&zcfs_volume::Cred::ROOT, 1, b"f").unwrap();
    assert_eq!(ino.size, 0);
    common::eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    s.stop_and_check();
}

/// (Review note, fixed.) The header's ZCFS_PFLUSH_MAX (8192) was above what the server
/// takes: 4096 placements per COMMIT, each naming its own reservation, of which a
/// connection holds at most 1024. A full transaction of ZCFS_PFLUSH_MAX placements
/// must commit (the old bound failed at the 1025th reservation, ENOBUFS).
#[test]
fn a_transaction_of_zcfs_pflush_max_placements_commits() {
    let mut s = common::serve("pfmax");
    let (h, fh) = connect_and_open(&s, "/max");
    // SAFETY: as above.
    unsafe {
        let t = zcfs_pflush_new();
        for i in 0..ZCFS_PFLUSH_MAX as u64 {
            let id = reserve(h, 1).unwrap_or_else(|e| panic!("reservation {i}: {e}"));
            *zcfs_zcopy_page(h, id, 0) = i as u8;
            assert_eq!(zcfs_pflush_add(t, fh, i * 4096, id, ZCFS_NO_NEW_SIZE), 0);
        }
        assert_eq!(zcfs_pflush_commit(h, t), 0);
        zcfs_pflush_free(t);
        zcfs_disconnect(h);
    }
    let ino = s.vol.lookup(&zcfs_volume::Cred::ROOT, 1, b"max").unwrap();
    assert_eq!(ino.size, ZCFS_PFLUSH_MAX as u64 * 4096);
    common::eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    s.stop_and_check();
}
