//! Windows of reservations: each page of a window is the page of the image its
//! reservation names, whatever order or adjacency the pages have (windows are views
//! into the client's one writable mapping of the image).

mod common;
use common::*;
use zcfs_samehost::client::{Client, Reservation, NO_NEW_SIZE};
use zcfs_samehost::ring::Placement;

#[test]
fn a_window_writes_each_page_where_its_reservation_says() {
    let s = serve("window");
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    let f = c.open("/w", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let r = c.reserve(4).unwrap();
    // The same pages in reverse order: not one run, so no single slice, but each page
    // is still the named one.
    let reversed = Reservation {
        id: r.id,
        offsets: r.offsets.iter().rev().copied().collect(),
    };
    let mut w = c.window(&reversed).unwrap();
    assert_eq!(w.pages(), 4);
    assert!(w.as_mut_slice().is_none());
    for p in 0..4 {
        // Page p of the reversed window is page 3 - p of the reservation.
        w.page_mut(p).fill(b'a' + (3 - p) as u8);
    }
    drop(w);
    // A window of a contiguous reservation is one slice; one of a foreign offset is
    // refused.
    let mut w = c.window(&r).unwrap();
    let contiguous = r.offsets.windows(2).all(|p| p[1] == p[0] + 4096);
    assert_eq!(w.as_mut_slice().is_some(), contiguous);
    drop(w);
    let outside = Reservation {
        id: r.id,
        offsets: vec![0],
    };
    assert!(c.window(&outside).is_err());
    c.commit(&[Placement {
        handle: f.handle,
        file_offset: 0,
        reservation: r.id,
        new_size: NO_NEW_SIZE,
    }])
    .unwrap();
    let buf = c.register_buffer(4 * 4096).unwrap();
    assert_eq!(c.read(f.handle, 0, buf, 0, 4 * 4096).unwrap(), 4 * 4096);
    let b = c.buffer(buf).unwrap();
    for p in 0..4 {
        assert!(
            b[p * 4096..(p + 1) * 4096]
                .iter()
                .all(|&x| x == b'a' + p as u8),
            "page {p}"
        );
    }
}
