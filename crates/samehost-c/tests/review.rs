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
