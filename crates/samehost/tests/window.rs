//! Windows of reservations: each page of a window is the page of the image its
//! reservation names, whatever order or adjacency the pages have (windows are views
//! into the client's one writable mapping of the image).

mod common;
use common::*;
use zcfs_samehost::client::{Client, Place, Reservation, NO_NEW_SIZE};

/// Place reservation `r` at offset 0 of `handle`, then read back what the file holds there.
fn place_at_0_and_read(c: &mut Client, handle: u32, r: Reservation) -> Vec<u8> {
    let len = r.pages() * 4096;
    c.commit(vec![Place {
        handle,
        file_offset: 0,
        reservation: r,
        new_size: NO_NEW_SIZE,
    }])
    .unwrap();
    let buf = c.register_buffer(len).unwrap();
    assert_eq!(c.read(handle, 0, buf, 0, len as u64).unwrap(), len);
    c.buffer(buf).unwrap()[..len].to_vec()
}

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
    let b = place_at_0_and_read(&mut c, f.handle, r);
    for p in 0..4 {
        assert!(
            b[p * 4096..(p + 1) * 4096]
                .iter()
                .all(|&x| x == b'a' + p as u8),
            "page {p}"
        );
    }
}

/// `Window::write_at` copies across page boundaries into the pages the reservation
/// names, in the reservation's order, and refuses (writing nothing) what would pass the
/// last page.
#[test]
fn write_at_fills_scattered_pages_in_the_reservations_order() {
    let s = serve("writeat");
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    let f = c.open("/wa", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let mut r = c.reserve(3).unwrap();
    r.reverse_pages_for_tests();
    let data = pattern(3 * 4096, 9);
    let mut w = r.window();
    assert!(!w.write_at(1, &data), "one byte past the last page");
    assert!(!w.write_at(usize::MAX, &data[..2]));
    assert!(
        w.page_mut(0).iter().all(|&b| b == 0),
        "a refused write wrote"
    );
    assert!(w.write_at(0, &data[..5000]));
    assert!(w.write_at(5000, &data[5000..]));
    r.reverse_pages_for_tests();
    // Page i of the reversed order is page 2 - i of the reservation's own: placing the
    // reservation puts data page i at file page 2 - i.
    let b = place_at_0_and_read(&mut c, f.handle, r);
    for i in 0..3 {
        assert!(
            b[(2 - i) * 4096..(3 - i) * 4096] == data[i * 4096..(i + 1) * 4096],
            "data page {i}"
        );
    }
}

/// Resident bytes of this process's mapping that starts at `addr` (/proc/self/smaps).
fn rss_of_mapping_at(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for l in smaps.lines() {
        if let Some((range, _)) = l.split_once(' ') {
            if let Some((lo, _)) = range.split_once('-') {
                if let Ok(lo) = usize::from_str_radix(lo, 16) {
                    inside = lo == addr;
                    continue;
                }
            }
        }
        if inside {
            if let Some(kb) = l.strip_prefix("Rss:") {
                return kb
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap()
                    * 1024;
            }
        }
    }
    panic!("no mapping at {addr:#x}");
}

/// On a fully allocated tmpfs image the client populates its writable mapping of the
/// data area in the background (fills then store into mapped pages); on an image with
/// holes it does not, so no hole gets memory from it. (Disk file systems: the unit test
/// of `zcfs_pmem::populating_is_free`.)
#[test]
fn the_writable_mapping_is_populated_only_on_a_fully_allocated_image() {
    use std::os::unix::fs::MetadataExt;
    let s = serve("prefaulted");
    allocate_whole(&s.image);
    let mut c = Client::connect(&s.sock).unwrap();
    let (addr, data_bytes) = {
        let d = c.direct_map().unwrap();
        (
            d.writable_base() as usize,
            d.geometry.data_end - d.geometry.data_start,
        )
    };
    eventually("the data area populated", || {
        rss_of_mapping_at(addr) >= data_bytes
    });
    drop(c);

    let s = serve("holes");
    let before = std::fs::metadata(&s.image).unwrap().blocks();
    let mut c = Client::connect(&s.sock).unwrap();
    let addr = c.direct_map().unwrap().writable_base() as usize;
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(
        rss_of_mapping_at(addr),
        0,
        "a sparse image's mapping populated"
    );
    assert_eq!(std::fs::metadata(&s.image).unwrap().blocks(), before);
}

/// `Client::prefault_window` faults the whole data area in before it returns on a fully
/// allocated tmpfs image, and does nothing (false) on an image with holes.
#[test]
fn prefault_window_maps_the_data_area_now_or_says_it_did_nothing() {
    use std::os::unix::fs::MetadataExt;
    let s = serve("prefaultnow");
    allocate_whole(&s.image);
    let mut c = Client::connect(&s.sock).unwrap();
    assert!(c.prefault_window().unwrap());
    let d = c.mapped().unwrap();
    let data_bytes = d.geometry.data_end - d.geometry.data_start;
    assert!(rss_of_mapping_at(d.writable_base() as usize) >= data_bytes);
    drop(c);

    let s = serve("prefaultholes");
    let before = std::fs::metadata(&s.image).unwrap().blocks();
    let mut c = Client::connect(&s.sock).unwrap();
    assert!(!c.prefault_window().unwrap(), "an image with holes");
    assert_eq!(std::fs::metadata(&s.image).unwrap().blocks(), before);
}
