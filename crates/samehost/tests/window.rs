//! Windows of reservations: each page of a window is the page of the image its
//! reservation names, whatever order or adjacency the pages have (windows are views
//! into the client's one writable mapping of the image).

mod common;
use common::*;
use zcfs_samehost::client::{Client, Place, NO_NEW_SIZE};

#[test]
fn a_window_writes_each_page_where_its_reservation_says() {
    let s = serve("window");
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    let f = c.open("/w", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let mut r = c.reserve(4).unwrap();
    // The same pages in reverse order: not one run, so no single slice, but each page
    // is still the named one.
    let original = r.offsets().to_vec();
    r.reverse_pages_for_tests();
    let mut w = r.window();
    assert_eq!(w.pages(), 4);
    assert!(w.as_mut_slice().is_none());
    for p in 0..4 {
        // Page p of the reversed window is page 3 - p of the reservation.
        w.page_mut(p).fill(b'a' + (3 - p) as u8);
    }
    r.reverse_pages_for_tests();
    assert_eq!(r.offsets(), &original[..]);
    // A window of a contiguous reservation is one slice. (Offsets outside the data
    // area are refused at `reserve`: a unit test of client.rs.)
    let mut w = r.window();
    let contiguous = original.windows(2).all(|p| p[1] == p[0] + 4096);
    assert_eq!(w.as_mut_slice().is_some(), contiguous);
    c.commit(vec![Place {
        handle: f.handle,
        file_offset: 0,
        reservation: r,
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
