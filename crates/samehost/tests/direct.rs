//! Direct-map mode: extents and leases, reservations and atomic commits, their bounds,
//! trust, and what happens when the application dies holding them.

mod common;
use common::*;
use std::io::BufRead;
use zcfs_samehost::client::{Client, Place, NO_NEW_SIZE};
use zcfs_samehost::ring::Placement;
use zcfs_samehost::server::{MAX_LEASED_BLOCKS, MAX_LEASES, MAX_RESERVATIONS, MAX_RESERVED_BLOCKS};

/// Room for the block bounds (256 MiB each) and more.
const BIG_IMAGE: u64 = 320 << 20;

fn leased(c: &Client, l: &zcfs_samehost::client::LeaseView) -> Vec<u8> {
    let d = c.mapped().unwrap();
    let mut out = Vec::new();
    for e in &l.extents {
        match d.bytes(e) {
            Some(b) => out.extend_from_slice(b),
            None => out.extend(std::iter::repeat_n(0u8, e.len as usize)),
        }
    }
    out
}

#[test]
fn extents_match_the_file_and_stay_until_released_whatever_writers_do() {
    let mut s = serve("extents");
    let mut c = Client::connect(&s.sock).unwrap();
    assert!(c.trusted());
    let buf = c.register_buffer(1 << 20).unwrap();
    let f = c.open("/d", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let data = pattern(300_000, 1);
    c.buffer_mut(buf).unwrap()[..data.len()].copy_from_slice(&data);
    c.write(f.handle, 0, buf, 0, data.len() as u64).unwrap();
    c.direct_map().unwrap();
    let l = c.read_extents(f.handle, 4000, 200_000).unwrap();
    assert_eq!(l.bytes, 200_000);
    assert_eq!(leased(&c, &l), data[4000..204_000]);
    // Another writer (another connection) overwrites, then truncates the file; a
    // checkpoint runs; new writes want blocks.
    let mut w = Client::connect(&s.sock).unwrap();
    let wb = w.register_buffer(1 << 20).unwrap();
    let wf = w.open("/d", libc::O_RDWR, 0).unwrap();
    w.buffer_mut(wb).unwrap().fill(0xee);
    w.write(wf.handle, 0, wb, 0, 1 << 20).unwrap();
    let t = w.open("/d", libc::O_RDWR | libc::O_TRUNC, 0).unwrap();
    s.vol.checkpoint_now().unwrap();
    let g = w.open("/g", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    for i in 0..8 {
        w.write(g.handle, i << 20, wb, 0, 1 << 20).unwrap();
    }
    assert_eq!(leased(&c, &l), data[4000..204_000], "leased bytes changed");
    // Past the end of the (now empty) file: nothing.
    let e = c.read_extents(f.handle, 0, 4096).unwrap();
    assert_eq!((e.bytes, e.extents.len()), (0, 0));
    c.release(l.id).unwrap();
    c.release(e.id).unwrap();
    assert_eq!(c.release(l.id).unwrap_err().errno(), libc::EINVAL);
    w.close(t.handle).unwrap();
    drop((c, w));
    s.stop_and_check();
}

#[test]
fn holes_come_back_as_hole_extents() {
    let s = serve("holes");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(4096).unwrap();
    let f = c.open("/h", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    c.buffer_mut(buf).unwrap().fill(5);
    c.write(f.handle, 3 * 4096, buf, 0, 4096).unwrap();
    c.direct_map().unwrap();
    let l = c.read_extents(f.handle, 0, 4 * 4096).unwrap();
    assert_eq!(l.extents.len(), 2);
    assert!(l.extents[0].is_hole() && l.extents[0].len == 3 * 4096);
    assert!(!l.extents[1].is_hole());
    assert!(c
        .mapped()
        .unwrap()
        .bytes(&l.extents[1])
        .unwrap()
        .iter()
        .all(|&b| b == 5));
}

#[test]
fn a_commit_places_pages_of_several_files_at_once_or_none() {
    let mut s = serve("commit");
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    let files: Vec<_> = (0..3)
        .map(|i| {
            c.open(format!("/c{i}"), libc::O_RDWR | libc::O_CREAT, 0o644)
                .unwrap()
        })
        .collect();
    let mut placements = Vec::new();
    let mut reservations = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let mut r = c.reserve(i + 1).unwrap();
        let mut w = r.window();
        for p in 0..=i {
            w.page_mut(p).fill(b'a' + i as u8);
        }
        placements.push(Placement {
            handle: f.handle,
            file_offset: 0,
            reservation: r.id(),
            new_size: if i == 2 { 2 * 4096 + 10 } else { NO_NEW_SIZE },
        });
        reservations.push(r);
    }
    // The server's checks, by raw COMMIT entries naming the reservations by id: one
    // bad placement (unaligned offset) refuses the whole commit, changing nothing.
    let pbuf = c.register_buffer(4096).unwrap();
    let mut bad = placements.clone();
    bad[1].file_offset = 100;
    // SAFETY (each raw_commit): refused, so no reservation ends; the windows above are
    // not used again.
    let e = unsafe { raw_commit(&mut c, pbuf, &bad) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    // A reservation named twice, or not ours: refused too.
    let mut twice = placements.clone();
    twice[2].reservation = twice[0].reservation;
    let e = unsafe { raw_commit(&mut c, pbuf, &twice) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let mut foreign = placements.clone();
    foreign[0].reservation = 999_999;
    let e = unsafe { raw_commit(&mut c, pbuf, &foreign) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    for i in 0..3 {
        let ino = s
            .vol
            .lookup(&zcfs_volume::Cred::ROOT, 1, format!("c{i}").as_bytes())
            .unwrap();
        assert_eq!(ino.size, 0, "a refused commit changed c{i}");
    }
    assert_eq!(c.stats().unwrap().reservations_active, 3);
    // The typed commit takes the reservations themselves.
    let places = placements
        .iter()
        .zip(reservations)
        .map(|(p, r)| Place {
            handle: p.handle,
            file_offset: p.file_offset,
            reservation: r,
            new_size: p.new_size,
        })
        .collect();
    c.commit(places).unwrap();
    let buf = c.register_buffer(3 * 4096).unwrap();
    for (i, f) in files.iter().enumerate() {
        let want = if i == 2 {
            2 * 4096 + 10
        } else {
            (i + 1) * 4096
        };
        assert_eq!(c.read(f.handle, 0, buf, 0, 3 * 4096).unwrap(), want);
        assert!(c.buffer(buf).unwrap()[..want]
            .iter()
            .all(|&b| b == b'a' + i as u8));
    }
    // Placed reservations are gone.
    // SAFETY: refused (the reservations are committed); no window is left.
    let e = unsafe { raw_commit(&mut c, pbuf, &placements) }.unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL);
    let st = c.stats().unwrap();
    assert_eq!(st.direct_commit_ops, 1);
    assert_eq!(st.direct_copied_bytes, 0);
    assert_eq!(st.reservations_active, 0);
    drop(c);
    s.stop_and_check();
}

#[test]
fn leases_are_bounded_in_count_and_blocks() {
    let mut s = serve_sized("leasebound", BIG_IMAGE, |_| {});
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    let buf = c.register_buffer(1 << 20).unwrap();
    let f = c.open("/l", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    c.write(f.handle, 0, buf, 0, 1 << 20).unwrap();
    // Count: MAX_LEASES one-block leases, then ENOBUFS.
    let mut ids = Vec::new();
    for _ in 0..MAX_LEASES {
        ids.push(c.read_extents(f.handle, 0, 4096).unwrap().id);
    }
    assert_eq!(
        c.read_extents(f.handle, 0, 4096).unwrap_err().errno(),
        libc::ENOBUFS
    );
    c.release(ids.pop().unwrap()).unwrap();
    ids.push(c.read_extents(f.handle, 0, 4096).unwrap().id);
    for id in ids {
        c.release(id).unwrap();
    }
    // Blocks: a range longer than the bound is refused outright; a file of exactly
    // the bound leases whole, and then one more block is refused.
    let max = MAX_LEASED_BLOCKS * 4096;
    assert_eq!(
        c.read_extents(f.handle, 0, max + 1).unwrap_err().errno(),
        libc::ENOBUFS
    );
    let ino = s.vol.lookup(&zcfs_volume::Cred::ROOT, 1, b"l").unwrap().ino;
    let chunk = vec![3u8; 16 << 20];
    for i in 0..max / chunk.len() as u64 {
        s.vol
            .write(
                &zcfs_volume::Cred::ROOT,
                ino,
                i * chunk.len() as u64,
                &chunk,
            )
            .unwrap();
    }
    let all = c.read_extents(f.handle, 0, max).unwrap();
    assert_eq!(all.bytes, max);
    assert_eq!(
        c.read_extents(f.handle, 0, 4096).unwrap_err().errno(),
        libc::ENOBUFS
    );
    c.release(all.id).unwrap();
    let one = c.read_extents(f.handle, 0, 4096).unwrap();
    assert_eq!(one.bytes, 4096);
    assert_eq!(c.stats().unwrap().leases_active, 1);
    drop(c);
    eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    assert_eq!(s.svc.stats().leases_active, 0);
    s.stop_and_check();
}

#[test]
fn reservations_are_bounded_and_given_back_when_the_connection_ends() {
    let mut s = serve_sized("resbound", BIG_IMAGE, |_| {});
    let free0 = s.vol.statfs().bfree;
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    // Blocks: up to MAX_RESERVED_BLOCKS held at once (the image holds them).
    let per = zcfs_samehost::client::MAX_RESERVE_PER_CALL as u64;
    let mut held = 0;
    let mut held_r = Vec::new();
    while held < MAX_RESERVED_BLOCKS {
        let n = per.min(MAX_RESERVED_BLOCKS - held);
        held_r.push(c.reserve(n as usize).unwrap());
        held += n;
    }
    assert_eq!(c.reserve(1).unwrap_err().errno(), libc::ENOBUFS);
    c.release_reservation(held_r.pop().unwrap()).unwrap();
    let extra = c.reserve(1).unwrap();
    c.release_reservation(extra).unwrap();
    // Count: MAX_RESERVATIONS one-page reservations.
    for r in held_r {
        c.release_reservation(r).unwrap();
    }
    let mut held_r = Vec::new();
    for _ in 0..MAX_RESERVATIONS {
        held_r.push(c.reserve(1).unwrap());
    }
    assert_eq!(c.reserve(1).unwrap_err().errno(), libc::ENOBUFS);
    assert!(s.vol.statfs().bfree < free0);
    // The reservations hold the connection open (see the review tests); the last one
    // dropped closes it.
    drop(c);
    drop(held_r);
    eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    assert_eq!(s.svc.stats().reservations_active, 0);
    assert_eq!(
        s.vol.statfs().bfree,
        free0,
        "reserved blocks not given back"
    );
    s.stop_and_check();
}

/// Child: connect as uid/gid 65534 and try the direct map.
#[test]
fn child_untrusted() {
    let Some(sock) = child_arg() else { return };
    become_nobody();
    let mut c = Client::connect(&sock).unwrap();
    assert!(!c.trusted());
    let e = c.direct_map().err().unwrap();
    assert_eq!(e.errno(), libc::EPERM);
    // Shared mode still works for it: a world-readable file, read as itself.
    let buf = c.register_buffer(4096).unwrap();
    let f = c.open("/pub", libc::O_RDONLY, 0).unwrap();
    assert_eq!(c.read(f.handle, 0, buf, 0, 4096).unwrap(), 5);
    // Not allowed to write root's file.
    assert_eq!(
        c.open("/pub", libc::O_RDWR, 0).unwrap_err().errno(),
        libc::EACCES
    );
    // Direct ops without the map.
    assert_eq!(c.reserve(1).unwrap_err().errno(), libc::EPERM);
    println!("CHILD-OK");
}

#[test]
fn the_direct_map_is_refused_to_an_untrusted_user() {
    let s = serve("untrusted");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(4096).unwrap();
    let f = c.open("/pub", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    c.buffer_mut(buf).unwrap()[..5].copy_from_slice(b"hello");
    c.write(f.handle, 0, buf, 0, 5).unwrap();
    let child = spawn_child("child_untrusted", s.sock.to_str().unwrap());
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("CHILD-OK"),
        "child: {text}"
    );
    assert_eq!(s.svc.stats().refused_direct_map, 1);
}

/// Child: commit generation g of three files forever (bounded), printing each.
#[test]
fn child_committer() {
    let Some(sock) = child_arg() else { return };
    let mut c = Client::connect(&sock).unwrap();
    c.direct_map().unwrap();
    let files: Vec<_> = (0..3)
        .map(|i| c.open(format!("/k{i}"), libc::O_RDWR, 0).unwrap())
        .collect();
    let buf = c.register_buffer(4096).unwrap();
    // Hold a lease and a reservation the whole time, too.
    let _lease = c.read_extents(files[0].handle, 0, 8 * 4096).unwrap();
    let _spare = c.reserve(5).unwrap();
    let _ = buf;
    for g in 1..100_000u32 {
        let mut ps = Vec::new();
        for f in &files {
            let mut r = c.reserve(8).unwrap();
            let mut w = r.window();
            for p in 0..8 {
                w.page_mut(p).fill(g as u8);
                w.page_mut(p)[..4].copy_from_slice(&g.to_le_bytes());
            }
            ps.push(Place {
                handle: f.handle,
                file_offset: 0,
                reservation: r,
                new_size: NO_NEW_SIZE,
            });
        }
        c.commit(ps).unwrap();
        println!("committed {g}");
    }
}

#[test]
fn an_application_killed_mid_commit_leaves_whole_generations_and_no_leak() {
    let mut s = serve("kill");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(8 * 4096).unwrap();
    for i in 0..3 {
        let f = c
            .open(format!("/k{i}"), libc::O_RDWR | libc::O_CREAT, 0o644)
            .unwrap();
        c.write(f.handle, 0, buf, 0, 8 * 4096).unwrap();
    }
    let free0 = s.vol.statfs().bfree;
    let mut child = spawn_child("child_committer", s.sock.to_str().unwrap());
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // Let it commit a few generations, then kill it wherever it is.
    let mut seen = 0;
    while seen < 20 {
        let l = lines.next().expect("child ended early").unwrap();
        if l.starts_with("committed ") {
            seen += 1;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    eventually("the connection closes", || {
        s.svc.stats().connections_open == 1
    });
    let st = s.svc.stats();
    assert_eq!((st.leases_active, st.reservations_active), (0, 0));
    // All three files show one generation, the same.
    let mut gens = Vec::new();
    for i in 0..3 {
        let f = c.open(format!("/k{i}"), libc::O_RDONLY, 0).unwrap();
        assert_eq!(c.read(f.handle, 0, buf, 0, 8 * 4096).unwrap(), 8 * 4096);
        let b = c.buffer(buf).unwrap();
        let g = u32::from_le_bytes(b[..4].try_into().unwrap());
        for p in 0..8 {
            assert_eq!(
                b[p * 4096..p * 4096 + 4],
                g.to_le_bytes(),
                "file {i} page {p}"
            );
        }
        gens.push(g);
    }
    assert!(
        gens[0] >= 20 && gens.iter().all(|&g| g == gens[0]),
        "generations {gens:?}"
    );
    drop(c);
    eventually("the connection closes", || {
        s.svc.stats().connections_open == 0
    });
    s.vol.checkpoint_now().unwrap();
    assert_eq!(s.vol.statfs().bfree, free0, "blocks leaked");
    s.stop_and_check();
}
