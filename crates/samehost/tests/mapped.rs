//! Mapped reads (`Client::read_mapped`): direct-map reads that keep their leases and ask
//! the server nothing while the file's change counter stays put. What must hold: the
//! bytes are the file's as of the read (never older than a change that returned before
//! it), whatever path the change took; the kept leases stay within their bounds and
//! make room for explicit leases; everything is given back at close and disconnect.

mod common;
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_samehost::client::Place;
use zcfs_samehost::client::{Client, Piece, MAPPED_CHUNK, MAPPED_CHUNKS_MAX, NO_NEW_SIZE};
use zcfs_samehost::server::MAX_LEASED_BLOCKS;
use zcfs_volume::{Cred, ROOT_INO};

/// The bytes of mapped-read pieces.
fn bytes_of(pieces: &[Piece<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Data(b) => out.extend_from_slice(b),
            Piece::Hole(n) => out.extend(std::iter::repeat_n(0u8, *n as usize)),
        }
    }
    out
}

fn read(c: &mut Client, h: u32, off: u64, len: u64) -> Vec<u8> {
    bytes_of(&c.read_mapped(h, off, len).unwrap())
}

/// Write `data` at `off` of `h` through the shared buffer `buf`.
fn write(c: &mut Client, h: u32, buf: u32, off: u64, data: &[u8]) {
    c.buffer_mut(buf).unwrap()[..data.len()].copy_from_slice(data);
    c.write(h, off, buf, 0, data.len() as u64).unwrap();
}

#[test]
fn a_mapped_read_asks_once_then_serves_in_place_until_the_file_changes() {
    let mut s = serve("mapped-basic");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(4 << 20).unwrap();
    let f = c.open("/m", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let data = pattern(3 * MAPPED_CHUNK as usize - 1000, 3);
    write(&mut c, f.handle, buf, 0, &data);
    // Not before the direct map.
    assert_eq!(
        c.read_mapped(f.handle, 0, 10).unwrap_err().errno(),
        libc::EPERM
    );
    c.direct_map().unwrap();
    assert_eq!(read(&mut c, f.handle, 100, 5000), data[100..5100]);
    let asked = c.stats().unwrap().direct_read_ops;
    // Across a chunk boundary, to the end of the file and past it (short).
    let at = MAPPED_CHUNK - 77;
    assert_eq!(
        read(&mut c, f.handle, at, 300),
        data[at as usize..at as usize + 300]
    );
    let tail = data.len() as u64 - 50;
    assert_eq!(read(&mut c, f.handle, tail, 4096), data[tail as usize..]);
    assert_eq!(read(&mut c, f.handle, data.len() as u64 + 10, 10), b"");
    let asked2 = c.stats().unwrap().direct_read_ops;
    assert_eq!(
        asked2 - asked,
        2,
        "chunks 1 and 2 leased once each (none past the end of the file)"
    );
    for i in 0..100u64 {
        let off = i * 30_000;
        assert_eq!(
            read(&mut c, f.handle, off, 4096),
            data[off as usize..off as usize + 4096]
        );
    }
    assert_eq!(
        c.stats().unwrap().direct_read_ops,
        asked2,
        "no call while unchanged"
    );
    assert_eq!(c.mapped_chunks(), 3);

    // A change through another connection: seen by the next read.
    let mut w = Client::connect(&s.sock).unwrap();
    let wb = w.register_buffer(1 << 20).unwrap();
    let wf = w.open("/m", libc::O_RDWR, 0).unwrap();
    write(&mut w, wf.handle, wb, 4096, &[0xab; 4096]);
    assert_eq!(read(&mut c, f.handle, 4096, 4096), vec![0xab; 4096]);
    // In the volume's own process (what FUSE and remote clients go through).
    s.vol
        .write(
            &Cred::ROOT,
            s.vol.lookup(&Cred::ROOT, ROOT_INO, b"m").unwrap().ino,
            8192,
            &[0xcd; 10],
        )
        .unwrap();
    assert_eq!(
        read(&mut c, f.handle, 8190, 14),
        [&[0xab; 2][..], &[0xcd; 10][..], &data[8202..8204]].concat()
    );
    // A truncate, then a hole punched and a direct commit.
    w.open("/m", libc::O_RDWR | libc::O_TRUNC, 0).unwrap();
    assert_eq!(read(&mut c, f.handle, 0, 100), b"");
    write(&mut w, wf.handle, wb, 0, &[7; 12288]);
    w.pfree(wf.handle, 4096, 4096).unwrap();
    assert_eq!(
        read(&mut c, f.handle, 0, 12288),
        [vec![7; 4096], vec![0; 4096], vec![7; 4096]].concat()
    );
    w.direct_map().unwrap();
    let mut r = w.reserve(1).unwrap();
    r.window().fill(&[9; 4096]);
    w.commit(vec![Place {
        handle: wf.handle,
        file_offset: 4096,
        reservation: r,
        new_size: NO_NEW_SIZE,
    }])
    .unwrap();
    assert_eq!(read(&mut c, f.handle, 4096, 4096), vec![9; 4096]);

    // Close gives the kept leases back; so does a disconnect.
    let before = c.stats().unwrap().leases_active;
    assert!(before >= 1);
    c.close(f.handle).unwrap();
    assert_eq!(c.mapped_chunks(), 0);
    assert_eq!(c.stats().unwrap().leases_active, 0);
    assert_eq!(
        c.read_mapped(f.handle, 0, 1).unwrap_err().errno(),
        libc::EBADF
    );
    let g = c.open("/m", libc::O_RDONLY, 0).unwrap();
    read(&mut c, g.handle, 0, 4096);
    assert_eq!(c.stats().unwrap().leases_active, 1);
    drop(c);
    eventually("the disconnected reader's leases given back", || {
        let mut x = Client::connect(&s.sock).unwrap();
        x.stats().unwrap().leases_active == 0
    });
    drop(w);
    s.stop_and_check();
}

/// A writer changes a file block by block, each write stamping its block with a rising
/// generation; a reader in another process... here another connection and thread, reads
/// blocks through kept leases. A read must never show a generation older than what the
/// writer had finished before the read began, and a block is never torn.
#[test]
fn mapped_reads_never_see_a_change_older_than_one_that_returned() {
    let mut s = serve("mapped-race");
    const BLOCKS: u64 = 64;
    let mut w = Client::connect(&s.sock).unwrap();
    let wb = w.register_buffer(4096).unwrap();
    let wf = w.open("/r", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    for b in 0..BLOCKS {
        write(&mut w, wf.handle, wb, b * 4096, &[0; 4096]);
    }
    // done[b]: the last generation written to block b whose write returned.
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sock = s.sock.clone();
    let reader = {
        let (done, stop) = (done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut c = Client::connect(&sock).unwrap();
            let f = c.open("/r", libc::O_RDONLY, 0).unwrap();
            c.direct_map().unwrap();
            let mut reads = 0u64;
            let mut x = 0x9e37_79b9u64;
            while !stop.load(Ordering::Acquire) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let b = (x >> 33) % BLOCKS;
                let floor = done[b as usize].load(Ordering::Acquire);
                let got = read(&mut c, f.handle, b * 4096, 4096);
                assert_eq!(got.len(), 4096);
                let stamp = u64::from_le_bytes(got[..8].try_into().unwrap());
                assert!(
                    got[8..].iter().all(|&v| v == (stamp as u8)),
                    "block {b} torn (stamp {stamp})"
                );
                assert!(
                    stamp >= floor,
                    "block {b}: read generation {stamp}, {floor} had returned"
                );
                reads += 1;
            }
            reads
        })
    };
    let t = Instant::now();
    let mut gen = 0u64;
    while t.elapsed() < Duration::from_secs(2) && gen < 200_000 {
        gen += 1;
        let b = gen % BLOCKS;
        let mut block = vec![gen as u8; 4096];
        block[..8].copy_from_slice(&gen.to_le_bytes());
        write(&mut w, wf.handle, wb, b * 4096, &block);
        done[b as usize].store(gen, Ordering::Release);
    }
    stop.store(true, Ordering::Release);
    let reads = reader.join().unwrap();
    assert!(
        reads > 100 && gen > 100,
        "both ran ({reads} reads, {gen} writes)"
    );
    drop(w);
    s.stop_and_check();
}

/// Several chunks read while the file changes under them: one state of the file
/// (a write covering both chunks is seen whole or not at all).
#[test]
fn a_read_over_several_chunks_is_one_state_of_the_file() {
    let mut s = serve("mapped-span");
    let mut w = Client::connect(&s.sock).unwrap();
    let span = 8192u64;
    let at = MAPPED_CHUNK - 4096; // the last block of chunk 0 and the first of chunk 1
    let wb = w.register_buffer(2 * MAPPED_CHUNK as usize).unwrap();
    let wf = w.open("/s", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    write(
        &mut w,
        wf.handle,
        wb,
        0,
        &vec![0; 2 * MAPPED_CHUNK as usize],
    );
    let sock = s.sock.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Client::connect(&sock).unwrap();
            let f = c.open("/s", libc::O_RDONLY, 0).unwrap();
            c.direct_map().unwrap();
            let mut n = 0;
            while !stop.load(Ordering::Acquire) {
                let got = read(&mut c, f.handle, at, span);
                assert!(got.iter().all(|&v| v == got[0]), "a read mixed two writes");
                n += 1;
            }
            n
        })
    };
    let t = Instant::now();
    let mut i = 0u8;
    while t.elapsed() < Duration::from_millis(1500) {
        i = i.wrapping_add(1);
        // One write of both blocks is one transaction.
        write(&mut w, wf.handle, wb, at, &vec![i; span as usize]);
    }
    stop.store(true, Ordering::Release);
    assert!(reader.join().unwrap() > 10);
    drop(w);
    s.stop_and_check();
}

/// The kept leases stay within the server's bound, and an explicit lease that needs
/// their room gets it.
#[test]
fn kept_chunks_stay_bounded_and_give_way_to_explicit_leases() {
    let mut s = serve_sized("mapped-bound", 320 << 20, |_| {});
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(MAPPED_CHUNK as usize).unwrap();
    let f = c.open("/b", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let chunks = MAPPED_CHUNKS_MAX as u64 + 8;
    c.buffer_mut(buf).unwrap().fill(1);
    for i in 0..chunks {
        c.write(f.handle, i * MAPPED_CHUNK, buf, 0, MAPPED_CHUNK)
            .unwrap();
    }
    c.direct_map().unwrap();
    for i in 0..chunks {
        assert_eq!(read(&mut c, f.handle, i * MAPPED_CHUNK, 1), [1]);
        assert!(c.mapped_chunks() <= MAPPED_CHUNKS_MAX);
    }
    assert_eq!(c.mapped_chunks(), MAPPED_CHUNKS_MAX, "at the bound");
    assert_eq!(
        c.stats().unwrap().leases_active,
        MAPPED_CHUNKS_MAX as u64,
        "{} blocks: the server's bound ({MAX_LEASED_BLOCKS})",
        MAPPED_CHUNKS_MAX as u64 * MAPPED_CHUNK / 4096
    );
    // The server's bound is reached: an explicit lease gets room from the kept ones.
    let l = c.read_extents(f.handle, 0, 64 * 4096).unwrap();
    assert_eq!(l.bytes, 64 * 4096);
    assert!(c.mapped_chunks() < MAPPED_CHUNKS_MAX);
    c.release(l.id).unwrap();
    c.forget_mapped(None).unwrap();
    assert_eq!(c.stats().unwrap().leases_active, 0);
    drop(c);
    s.stop_and_check();
}

/// (Review finding.) A read whose length reaches far past the end of the file is short
/// at the end, as any read: it does not lease (empty) chunks past the end one by one
/// until the bound is hit and fail with ENOBUFS, giving back every other kept chunk on
/// the way. Huge offsets read nothing.
#[test]
fn a_long_read_past_the_end_is_short_and_keeps_no_chunks_past_it() {
    let mut s = serve("mapped-eof");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(MAPPED_CHUNK as usize + 100).unwrap();
    let f = c.open("/e", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let g = c.open("/o", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let data = pattern(MAPPED_CHUNK as usize + 100, 5);
    write(&mut c, f.handle, buf, 0, &data);
    write(&mut c, g.handle, buf, 0, &data[..4096]);
    c.direct_map().unwrap();
    // Another file's kept chunk: nothing here needs its room.
    assert_eq!(read(&mut c, g.handle, 0, 4096), data[..4096]);
    let long = (MAPPED_CHUNKS_MAX as u64 + 44) * MAPPED_CHUNK;
    let got = c
        .read_mapped(f.handle, 0, long)
        .map(|p| bytes_of(&p))
        .map_err(|e| e.errno());
    match got {
        Ok(b) => assert!(
            b == data,
            "a read past the end: {} bytes, not the file",
            b.len()
        ),
        Err(e) => panic!("a read past the end failed with errno {e}"),
    }
    assert!(
        c.mapped_chunks() <= 3,
        "{} chunks kept for a file of two",
        c.mapped_chunks()
    );
    assert_eq!(read(&mut c, g.handle, 0, 4096), data[..4096]);
    // Offsets at the end of the range: nothing to read, no failure.
    assert_eq!(read(&mut c, f.handle, u64::MAX - 5, 5), b"");
    assert_eq!(
        read(
            &mut c,
            f.handle,
            u64::MAX - MAPPED_CHUNK * 3,
            MAPPED_CHUNK * 2
        ),
        b""
    );
    assert!(c.mapped_chunks() <= 5, "one empty chunk each");
    c.forget_mapped(None).unwrap();
    assert_eq!(c.stats().unwrap().leases_active, 0);
    drop(c);
    s.stop_and_check();
}

/// (Review finding.) An explicit lease the server refuses whatever room it has (longer
/// than its bound) gives back no kept chunk.
#[test]
fn a_lease_too_long_for_any_room_evicts_nothing() {
    let mut s = serve("mapped-toolong");
    let mut c = Client::connect(&s.sock).unwrap();
    let buf = c.register_buffer(4 * MAPPED_CHUNK as usize).unwrap();
    let f = c.open("/t", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    write(
        &mut c,
        f.handle,
        buf,
        0,
        &pattern(4 * MAPPED_CHUNK as usize, 6),
    );
    c.direct_map().unwrap();
    read(&mut c, f.handle, 0, 4 * MAPPED_CHUNK);
    assert_eq!(c.mapped_chunks(), 4);
    let asked = c.stats().unwrap().direct_read_ops;
    let too_long = MAX_LEASED_BLOCKS * 4096 + 4096;
    assert_eq!(
        c.read_extents(f.handle, 0, too_long).unwrap_err().errno(),
        libc::ENOBUFS
    );
    assert_eq!(c.mapped_chunks(), 4, "kept chunks given back for nothing");
    read(&mut c, f.handle, 0, 4 * MAPPED_CHUNK);
    assert_eq!(c.stats().unwrap().direct_read_ops, asked);
    drop(c);
    s.stop_and_check();
}

/// (Review finding.) Kept chunks are checked against the counters of the volume that
/// served them. Once that volume is closed, another opening of the image (another
/// server, after a restart) changes the file without raising them: a mapped read must
/// then fail (its server is gone), not serve the file's old blocks as its bytes.
#[test]
fn kept_chunks_do_not_outlive_their_volume() {
    let img = Image::new("mapped-reopen");
    let vol = open_retrying_busy(&img.image);
    let svc = Arc::new(zcfs_samehost::Service::bind(vol.clone(), root_as_root(&img.sock)).unwrap());
    let run = svc.clone();
    let thread = std::thread::spawn(move || run.run());
    let (mut c, f) = a_file_read_through_kept_chunks(&img.sock);
    // The server stops and its volume closes; the application stays.
    svc.shutdown();
    thread.join().unwrap();
    drop((svc, vol));
    let v2 = rewritten_in_another_opening(&img.image);
    let got = c
        .read_mapped(f.handle, 0, 8192)
        .map(|p| bytes_of(&p).first().copied())
        .map_err(|e| e.errno());
    assert!(
        got != Ok(Some(b'a')),
        "a mapped read served the file's old blocks"
    );
    drop((c, v2));
}

/// Connect to `sock` (waiting for the server, bounded), write 8 KiB of 'a' to /f, make
/// it durable and read it through kept chunks.
fn a_file_read_through_kept_chunks(
    sock: &std::path::Path,
) -> (Client, zcfs_samehost::client::File) {
    let mut c = None;
    eventually("the server serving", || {
        c = Client::connect(sock).ok();
        c.is_some()
    });
    let mut c = c.unwrap();
    let buf = c.register_buffer(8192).unwrap();
    let f = c.open("/f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    write(&mut c, f.handle, buf, 0, &[b'a'; 8192]);
    c.fsync(f.handle).unwrap();
    c.direct_map().unwrap();
    assert_eq!(read(&mut c, f.handle, 0, 8192), vec![b'a'; 8192]);
    (c, f)
}

/// Open `image` again (its first server gone) and rewrite /f with 'b': a change the
/// first server's counters never see.
fn rewritten_in_another_opening(image: &std::path::Path) -> Arc<zcfs_volume::Volume> {
    let v = open_retrying_busy(image);
    let ino = v.lookup(&Cred::ROOT, ROOT_INO, b"f").unwrap().ino;
    v.write(&Cred::ROOT, ino, 0, &[b'b'; 8192]).unwrap();
    v.checkpoint_now().unwrap();
    v
}

/// Child: serve the image and socket named in the argument ("IMAGE SOCK") until killed.
#[test]
fn child_serving() {
    let Some(arg) = child_arg() else { return };
    let (image, sock) = arg.split_once(' ').unwrap();
    let vol = open_retrying_busy(std::path::Path::new(image));
    zcfs_samehost::Service::bind(vol, root_as_root(sock))
        .unwrap()
        .run();
}

/// A server killed outright cannot raise the counters; another opening of the image
/// then changes files unseen by them. A mapped read after that fails (its server is
/// gone) rather than serve the old blocks: kept chunks are trusted only while the
/// control socket is open, looked at every `MAPPED_ALIVE_CHECK`.
#[test]
fn kept_chunks_do_not_outlive_a_killed_server() {
    let img = Image::new("mapped-killed");
    let mut child = spawn_child(
        "child_serving",
        &format!("{} {}", img.image.display(), img.sock.display()),
    );
    let (mut c, f) = a_file_read_through_kept_chunks(&img.sock);
    // SAFETY: signalling the child started above.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let v2 = rewritten_in_another_opening(&img.image);
    // (The first byte only: 'a' is the old block, served unseen.)
    let got = c
        .read_mapped(f.handle, 0, 8192)
        .map(|p| bytes_of(&p).first().copied())
        .map_err(|e| e.errno());
    assert_eq!(
        got,
        Err(libc::ECONNRESET),
        "a mapped read after its server died"
    );
    assert_eq!(c.mapped_chunks(), 0, "the dead server's chunks forgotten");
    drop((c, v2));
}
