//! Review 26: regular files on the mount show st_blksize = 1 MiB (4c978f8). On kernels
//! before "fuse: keep inode->i_blkbits constant" the kernel also took it as the inode's
//! block size (i_blkbits = 20), which the iomap-based buffered write path of FUSE's
//! writeback cache relies on. Guards: partial-page writes and mmap stores into pages
//! not cached land where they were written and nothing else changes.

mod common;
use common::mount::*;
use std::fs;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 4096) as u8).wrapping_mul(37) ^ (i as u8))
        .collect()
}

/// Drop the file's cached pages (after writing back what is dirty).
fn evict(f: &fs::File) {
    f.sync_all().unwrap();
    // SAFETY: fadvise on a descriptor we own, plain integers.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

fn partial_writes_land_where_written(name: &str, args: &[&str]) {
    let mut m = Mount::volume_with(name, "256M", &[], args);
    let p = m.path("f");
    let mut want = pattern(3 << 20);
    fs::write(&p, &want).unwrap();
    {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        evict(&f);
    }
    // Small writes into uncached pages, inside a page, across a page boundary, across
    // a 1 MiB boundary, and at the end of the file.
    let writes: &[(usize, usize)] = &[
        (3 * 4096 + 10, 100),
        (5 * 4096 - 7, 20),
        ((1 << 20) - 3, 9),
        ((2 << 20) + 4096 * 9 + 4000, 200),
        ((3 << 20) - 50, 50),
    ];
    for (i, &(off, len)) in writes.iter().enumerate() {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        let data = vec![0xA0 + i as u8; len];
        f.write_all_at(&data, off as u64).unwrap();
        want[off..off + len].copy_from_slice(&data);
        drop(f);
    }
    // And an mmap store into an uncached page.
    {
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&p)
            .unwrap();
        evict(&f);
        let len = 3 << 20;
        // SAFETY: a fresh shared mapping of the whole file, unmapped below.
        unsafe {
            let a = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(a, libc::MAP_FAILED);
            *(a as *mut u8).add(7 * 4096 + 123) = 0xEE;
            libc::msync(a, len, libc::MS_SYNC);
            libc::munmap(a, len);
        }
        want[7 * 4096 + 123] = 0xEE;
        evict(&f);
    }
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), want.len());
    let bad: Vec<usize> = (0..got.len() / 4096)
        .filter(|&pg| got[pg * 4096..(pg + 1) * 4096] != want[pg * 4096..(pg + 1) * 4096])
        .collect();
    assert!(bad.is_empty(), "pages that differ: {bad:?}");
    m.stop();
}

#[test]
fn partial_writes_into_uncached_pages_land_where_written() {
    partial_writes_land_where_written("r26-pw", &[]);
}

#[test]
fn partial_writes_into_uncached_pages_land_where_written_under_the_writeback_cache() {
    partial_writes_land_where_written("r26-pw-wb", &["-o", "writeback"]);
}
