//! The boundary's checks, called from Rust: NULL pointers are -EINVAL (or NULL with
//! errno EINVAL), never a crash; a bad buffer or file is an errno; the transaction's
//! bound.

mod common;
use std::ffi::CString;
use std::ptr::{null, null_mut};
use zcfs::*;

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

#[test]
fn null_pointers_are_einval() {
    let ei = -libc::EINVAL;
    // SAFETY: every call below is passed NULL where the check under test must catch it,
    // and otherwise valid arguments.
    unsafe {
        assert!(zcfs_connect(null()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        zcfs_disconnect(null_mut());
        assert_eq!(zcfs_trusted(null_mut()), ei);
        assert_eq!(zcfs_prefault(null_mut()), ei);
        let mut id = 0u32;
        assert_eq!(zcfs_register_buffer(null_mut(), 4096, &mut id), ei);
        assert!(zcfs_buffer_ptr(null_mut(), 0, null_mut()).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let p = CString::new("/x").unwrap();
        let mut fh = 0u32;
        assert_eq!(
            zcfs_open(null_mut(), p.as_ptr(), 0, 0, &mut fh, null_mut()),
            ei
        );
        assert_eq!(zcfs_close(null_mut(), 0), ei);
        assert_eq!(zcfs_read(null_mut(), 0, 0, 0, 0, 1), ei as i64);
        assert_eq!(zcfs_write(null_mut(), 0, 0, 0, 0, 1), ei as i64);
        assert_eq!(zcfs_fsync(null_mut(), 0), ei);
        assert_eq!(zcfs_pfree(null_mut(), 0, 0, 4096), ei);
        assert_eq!(zcfs_submit(null_mut(), null(), 1), ei);
        assert_eq!(zcfs_wait(null_mut(), 1, null_mut(), 1), ei as i64);
        let (mut n, mut lease) = (0usize, 0u64);
        assert_eq!(
            zcfs_zcopy_to(null_mut(), 0, 0, 1, null_mut(), 0, &mut n, &mut lease),
            ei as i64
        );
        assert_eq!(zcfs_zcopy_release(null_mut(), 0), ei);
        let mut rid = 0u64;
        assert_eq!(zcfs_zcopy_from(null_mut(), 1, &mut rid, null_mut()), ei);
        assert!(zcfs_zcopy_page(null_mut(), 0, 0).is_null());
        assert_eq!(zcfs_zcopy_abort(null_mut(), 0), ei);
        assert_eq!(zcfs_pflush_add(null_mut(), 0, 0, 0, ZCFS_NO_NEW_SIZE), ei);
        assert_eq!(zcfs_pflush_commit(null_mut(), null_mut()), ei);
        zcfs_pflush_free(null_mut());
    }
}

#[test]
fn null_out_pointers_on_a_live_connection_are_einval_and_errors_are_errnos() {
    let s = common::serve("nulls");
    let ei = -libc::EINVAL;
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    // SAFETY: `h` is a live connection until zcfs_disconnect; the NULLs are the checks
    // under test; other pointers are to locals.
    unsafe {
        let h = zcfs_connect(sock.as_ptr());
        assert!(!h.is_null());
        assert_eq!(zcfs_register_buffer(h, 4096, null_mut()), ei);
        let mut buf = 0u32;
        assert_eq!(zcfs_register_buffer(h, 4096, &mut buf), 0);
        let mut len = 0usize;
        assert!(!zcfs_buffer_ptr(h, buf, &mut len).is_null());
        assert_eq!(len, 4096);
        assert!(zcfs_buffer_ptr(h, buf + 100, &mut len).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let mut fh = 0u32;
        assert_eq!(zcfs_open(h, null(), 0, 0, &mut fh, null_mut()), ei);
        let p = CString::new("/f").unwrap();
        assert_eq!(zcfs_open(h, p.as_ptr(), 0, 0, null_mut(), null_mut()), ei);
        // A file that is not there, then one created.
        assert_eq!(
            zcfs_open(h, p.as_ptr(), libc::O_RDWR, 0, &mut fh, null_mut()),
            -libc::ENOENT
        );
        let flags = libc::O_RDWR | libc::O_CREAT;
        assert_eq!(
            zcfs_open(h, p.as_ptr(), flags, 0o600, &mut fh, null_mut()),
            0
        );
        // A read into a buffer that does not exist, and past the buffer's end.
        assert!(zcfs_read(h, fh, 0, buf + 100, 0, 1) < 0);
        assert!(zcfs_write(h, fh, 0, buf, 4000, 200) < 0);
        assert_eq!(zcfs_submit(h, null(), 1), ei);
        assert_eq!(zcfs_submit(h, null(), 0), 0);
        assert_eq!(zcfs_wait(h, 1, null_mut(), 1), ei as i64);
        let mut cq = [zcfs_cqe::default(); 1];
        assert_eq!(zcfs_wait(h, 2, cq.as_mut_ptr(), 1), ei as i64, "min > cap");
        let (mut n, mut lease) = (0usize, 0u64);
        assert_eq!(
            zcfs_zcopy_to(h, fh, 0, 1, null_mut(), 0, &mut n, &mut lease),
            ei as i64
        );
        let mut rid = 0u64;
        assert_eq!(zcfs_zcopy_from(h, 0, &mut rid, null_mut()), ei);
        assert_eq!(
            zcfs_zcopy_from(h, ZCFS_RESERVE_MAX + 1, &mut rid, null_mut()),
            ei
        );
        assert_eq!(zcfs_zcopy_from(h, 1, null_mut(), null_mut()), ei);
        assert_eq!(zcfs_pflush_commit(h, null_mut()), ei);
        assert!(zcfs_zcopy_page(h, 12345, 0).is_null());
        assert_eq!(zcfs_close(h, fh), 0);
        zcfs_disconnect(h);
    }
}

#[test]
fn zcopy_to_with_too_little_room_is_enobufs_and_leases_nothing() {
    let s = common::serve("enobufs");
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    // SAFETY: as above; the extent array has room for `cap` = 0 entries (a dangling
    // non-NULL pointer is never written when cap is 0 and more are needed).
    unsafe {
        let h = zcfs_connect(sock.as_ptr());
        assert!(!h.is_null());
        let mut buf = 0u32;
        assert_eq!(zcfs_register_buffer(h, 8192, &mut buf), 0);
        let p = CString::new("/e").unwrap();
        let mut fh = 0u32;
        let flags = libc::O_RDWR | libc::O_CREAT;
        assert_eq!(
            zcfs_open(h, p.as_ptr(), flags, 0o600, &mut fh, null_mut()),
            0
        );
        assert_eq!(zcfs_write(h, fh, 0, buf, 0, 8192), 8192);
        let mut ext: [zcfs_extent; 0] = [];
        let (mut n, mut lease) = (0usize, 0u64);
        let r = zcfs_zcopy_to(h, fh, 0, 8192, ext.as_mut_ptr(), 0, &mut n, &mut lease);
        assert_eq!(r, -(libc::ENOBUFS as i64));
        assert!(n >= 1);
        assert_eq!(
            s.svc.stats().leases_active,
            0,
            "the refused lease was released"
        );
        // With room, the same call leases until released.
        let mut ext = [zcfs_extent {
            file_offset: 0,
            len: 0,
            data: null(),
        }; 8];
        let r = zcfs_zcopy_to(h, fh, 0, 8192, ext.as_mut_ptr(), 8, &mut n, &mut lease);
        assert_eq!(r, 8192);
        assert_eq!(s.svc.stats().leases_active, 1);
        assert_eq!(zcfs_zcopy_release(h, lease), 0);
        assert_eq!(s.svc.stats().leases_active, 0);
        zcfs_disconnect(h);
    }
}

#[test]
fn a_transaction_holds_at_most_zcfs_pflush_max_placements() {
    // SAFETY: `t` is live until zcfs_pflush_free.
    unsafe {
        let t = zcfs_pflush_new();
        for i in 0..ZCFS_PFLUSH_MAX as u64 {
            assert_eq!(zcfs_pflush_add(t, 1, i * 4096, i, ZCFS_NO_NEW_SIZE), 0);
        }
        assert_eq!(zcfs_pflush_add(t, 1, 0, 0, ZCFS_NO_NEW_SIZE), -libc::E2BIG);
        zcfs_pflush_free(t);
    }
}

#[test]
fn mapped_reads_describe_the_bytes_in_place_and_keep_their_leases_until_forgotten() {
    let s = common::serve("mapped");
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    // SAFETY: `h` is live until zcfs_disconnect; the piece array has room for `cap`
    // entries; the pieces' pointers are read before the next call on `h`.
    unsafe {
        let h = zcfs_connect(sock.as_ptr());
        assert!(!h.is_null());
        let mut buf = 0u32;
        assert_eq!(zcfs_register_buffer(h, 12288, &mut buf), 0);
        let data = zcfs_buffer_ptr(h, buf, null_mut());
        for i in 0..12288usize {
            data.add(i).write((i % 251) as u8);
        }
        let p = CString::new("/m").unwrap();
        let mut fh = 0u32;
        let flags = libc::O_RDWR | libc::O_CREAT;
        assert_eq!(
            zcfs_open(h, p.as_ptr(), flags, 0o600, &mut fh, null_mut()),
            0
        );
        assert_eq!(zcfs_write(h, fh, 0, buf, 0, 12288), 12288);
        assert_eq!(zcfs_pfree(h, fh, 4096, 4096), 0);
        let mut out = [zcfs_extent {
            file_offset: 0,
            len: 0,
            data: null(),
        }; 8];
        let mut n = 0usize;
        assert_eq!(
            zcfs_read_mapped(h, fh, 100, 20_000, null_mut(), 8, &mut n),
            -(libc::EINVAL as i64)
        );
        // Too little room: -ENOBUFS, and how many are needed.
        let r = zcfs_read_mapped(h, fh, 100, 20_000, out.as_mut_ptr(), 1, &mut n);
        assert_eq!((r, n), (-(libc::ENOBUFS as i64), 3));
        let r = zcfs_read_mapped(h, fh, 100, 20_000, out.as_mut_ptr(), 8, &mut n);
        assert_eq!((r, n), (12288 - 100, 3), "to the end of the file");
        let mut got = Vec::new();
        for e in &out[..n] {
            assert_eq!(e.file_offset, 100 + got.len() as u64);
            if e.data.is_null() {
                got.extend(std::iter::repeat_n(0u8, e.len as usize));
            } else {
                got.extend_from_slice(std::slice::from_raw_parts(e.data, e.len as usize));
            }
        }
        let want: Vec<u8> = (100..12288usize)
            .map(|i| {
                if (4096..8192).contains(&i) {
                    0
                } else {
                    (i % 251) as u8
                }
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(s.svc.stats().leases_active, 1, "the chunk's lease is kept");
        assert_eq!(zcfs_forget_mapped(h, ZCFS_ALL_FILES), 0);
        assert_eq!(s.svc.stats().leases_active, 0);
        assert_eq!(zcfs_close(h, fh), 0);
        assert_eq!(
            zcfs_read_mapped(h, fh, 0, 1, out.as_mut_ptr(), 8, &mut n),
            -(libc::EBADF as i64)
        );
        zcfs_disconnect(h);
    }
}

/// `zcfs_zcopy_fill` copies into a reservation's pages from any byte of it on, across
/// page boundaries, and what it wrote is what the file holds once placed; a copy past
/// the last page, from NULL, or into a reservation not held is -EINVAL and writes
/// nothing.
#[test]
fn zcopy_fill_writes_across_pages_and_refuses_what_does_not_fit() {
    let s = common::serve("zfill");
    let sock = CString::new(s.sock.to_str().unwrap()).unwrap();
    let ei = -libc::EINVAL;
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 253) as u8).collect();
    // SAFETY: `h` is live until zcfs_disconnect, `t` until zcfs_pflush_free; `data` and
    // the read buffer outlive the calls that use them.
    unsafe {
        let h = zcfs_connect(sock.as_ptr());
        assert!(!h.is_null());
        let p = CString::new("/zf").unwrap();
        let mut fh = 0u32;
        let flags = libc::O_RDWR | libc::O_CREAT;
        assert_eq!(
            zcfs_open(h, p.as_ptr(), flags, 0o600, &mut fh, null_mut()),
            0
        );
        let mut id = 0u64;
        assert_eq!(zcfs_zcopy_from(h, 3, &mut id, null_mut()), 0);
        // Past the end (by one byte), NULL with a length, an id not held: nothing.
        assert_eq!(zcfs_zcopy_fill(h, id, 1, data.as_ptr(), data.len()), ei);
        assert_eq!(zcfs_zcopy_fill(h, id, 3 * 4096, data.as_ptr(), 1), ei);
        assert_eq!(zcfs_zcopy_fill(h, id, usize::MAX, data.as_ptr(), 2), ei);
        assert_eq!(
            zcfs_zcopy_fill(h, id, 0, data.as_ptr(), usize::MAX),
            ei,
            "a length no buffer has"
        );
        assert_eq!(zcfs_zcopy_fill(h, id, 0, null(), 1), ei);
        assert_eq!(zcfs_zcopy_fill(h, id + 1000, 0, data.as_ptr(), 1), ei);
        assert_eq!(zcfs_zcopy_fill(null_mut(), id, 0, data.as_ptr(), 1), ei);
        assert_eq!(*zcfs_zcopy_page(h, id, 0), 0, "a refused fill wrote");
        // Nothing, then the whole window up to its last byte in two pieces that meet
        // inside page 1.
        assert_eq!(zcfs_zcopy_fill(h, id, 5, null(), 0), 0);
        assert_eq!(zcfs_zcopy_fill(h, id, 0, data.as_ptr(), 6000), 0);
        assert_eq!(
            zcfs_zcopy_fill(h, id, 6000, data[6000..].as_ptr(), data.len() - 6000),
            0
        );
        let t = zcfs_pflush_new();
        assert_eq!(zcfs_pflush_add(t, fh, 0, id, ZCFS_NO_NEW_SIZE), 0);
        assert_eq!(zcfs_pflush_commit(h, t), 0);
        zcfs_pflush_free(t);
        // Committed: the reservation is gone, and so is filling it.
        assert_eq!(zcfs_zcopy_fill(h, id, 0, data.as_ptr(), 1), ei);
        let mut buf = 0u32;
        assert_eq!(zcfs_register_buffer(h, data.len(), &mut buf), 0);
        assert_eq!(
            zcfs_read(h, fh, 0, buf, 0, data.len() as u64),
            data.len() as i64
        );
        let got = std::slice::from_raw_parts(zcfs_buffer_ptr(h, buf, null_mut()), data.len());
        assert!(got == &data[..], "the file holds what was filled");
        assert_eq!(zcfs_close(h, fh), 0);
        zcfs_disconnect(h);
    }
}
