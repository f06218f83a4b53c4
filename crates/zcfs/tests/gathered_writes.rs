//! Gathered writes (`behind::Gather`): a mount's small buffered writes behind others of
//! their inode are answered, kept in the mount, and sent several in one send. They must
//! land exactly as written, in order; whatever must see them (a getattr, a read, an
//! overlapping write, a close) sends them first; one nothing waits for still leaves
//! within `GATHER_DELAY`. Root required (network namespaces), as in CI.

mod common;
use common::remote::*;
use std::time::{Duration, Instant};
use zcfs_backend::Backend;
use zcfs_client::{GATHER_DELAY, GATHER_WRITES, GATHER_WRITE_MAX};

/// Put `data` into the model at `off`.
fn put(model: &mut Vec<u8>, off: usize, data: &[u8]) {
    if model.len() < off + data.len() {
        model.resize(off + data.len(), 0);
    }
    model[off..off + data.len()].copy_from_slice(data);
}

/// Writes of many sizes (gathered ones, at and around `GATHER_WRITE_MAX`, and larger
/// ones sent alone) at random offsets of a 512 KiB region, most overlapping others:
/// after the close, another client reads exactly the model, and most small writes went
/// out several per send.
#[test]
fn gathered_writes_land_in_order_with_the_others() {
    let net = Net::new();
    let srv = Served::new(&net, "gather-order", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(30));
        let c = ctx();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let sizes = [
            1,
            100,
            4096,
            5000,
            GATHER_WRITE_MAX - 1,
            GATHER_WRITE_MAX,
            GATHER_WRITE_MAX + 1,
            40_000,
        ];
        let mut rng = Rng(0x5eed_1234);
        let mut model = Vec::new();
        for i in 0..600u64 {
            let n = sizes[rng.below(sizes.len() as u64) as usize];
            let off = rng.below(512 << 10) as usize;
            let data = seeded_bytes(i + 1, n);
            let mut told = 0;
            let mut answered = |n: u32| told = n;
            let n_written = fs
                .write_behind_answering(&c, f.ino, fh, off as u64, &data, &mut answered)
                .unwrap();
            assert_eq!(n_written as usize, n, "write {i}");
            assert_eq!(told as usize, n, "write {i} answered");
            put(&mut model, off, &data);
        }
        fs.flush(f.ino, fh).unwrap();
        let (gathered, sends) = fs.gathered_writes();
        assert!(gathered >= 200, "{gathered} writes gathered");
        assert!(
            sends * 2 <= gathered,
            "{sends} sends for {gathered} gathered writes"
        );
        fs.release(f.ino, fh).unwrap();

        let other = srv.client(&net, Duration::from_secs(30));
        let a = other.lookup(&c, zcfs_backend::ROOT, b"f").unwrap();
        assert_eq!(a.size, model.len() as u64);
        let ofh = other.open(&c, a.ino, libc::O_RDONLY).unwrap();
        assert!(
            read_all(&other, a.ino, ofh, 0, model.len() as u32) == model,
            "another client reads other bytes than were written"
        );
        other.release(a.ino, ofh).unwrap();
    });
}

/// A gathered write that nothing waits for (no close, no fsync, no read) still leaves
/// the mount: another client reads it well within a second (`GATHER_DELAY` is 500 µs).
#[test]
fn a_gathered_write_nothing_waits_for_leaves_by_itself() {
    let net = Net::new();
    let srv = Served::new(&net, "gather-delay", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(30));
        let other = srv.client(&net, Duration::from_secs(30));
        let c = ctx();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        fs.write(&c, f.ino, fh, 0, &vec![0u8; 64 << 10]).unwrap();
        fs.fsync(f.ino, fh, false).unwrap();
        let ofh = other.open(&c, f.ino, libc::O_RDONLY).unwrap();
        for round in 0..5u64 {
            let first = seeded_bytes(100 + round, 4096);
            let second = seeded_bytes(200 + round, 4096);
            let before = fs.gathered_writes().0;
            // The first goes out alone (its inode had no write in flight); the
            // second is behind it, so it is gathered.
            let mut ignore = |_: u32| {};
            fs.write_behind_answering(&c, f.ino, fh, 8192, &first, &mut ignore)
                .unwrap();
            fs.write_behind_answering(&c, f.ino, fh, 32768, &second, &mut ignore)
                .unwrap();
            let t = Instant::now();
            while read_all(&other, f.ino, ofh, 32768, 4096) != second {
                assert!(
                    t.elapsed() < Duration::from_secs(2),
                    "round {round}: a gathered write never left the mount"
                );
                std::thread::sleep(Duration::from_micros(200));
            }
            assert!(
                fs.gathered_writes().0 > before,
                "round {round}: the second write was not gathered (the test lost its point)"
            );
            assert!(read_all(&other, f.ino, ofh, 8192, 4096) == first);
            // Settled before the next round: its first write goes out alone again.
            fs.fsync(f.ino, fh, false).unwrap();
        }
        assert!(GATHER_DELAY < Duration::from_millis(100));
        other.release(f.ino, ofh).unwrap();
        fs.release(f.ino, fh).unwrap();
    });
}

/// What must see gathered writes sends them first: a getattr right after them has the
/// size they made, a read of their range their bytes, and a write over them lands on
/// top; fewer writes than fill a gather, so only these send them.
#[test]
fn what_must_see_gathered_writes_sends_them_first() {
    let net = Net::new();
    let srv = Served::new(&net, "gather-see", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(30));
        let c = ctx();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        let mut model = Vec::new();
        let mut ignore = |_: u32| {};
        for round in 0..40u64 {
            let base = (round * 20_000) as usize;
            let n = (GATHER_WRITES / 2) as u64;
            for i in 0..n {
                let d = seeded_bytes(round * 100 + i, 3000);
                let off = base + i as usize * 2000;
                fs.write_behind_answering(&c, f.ino, fh, off as u64, &d, &mut ignore)
                    .unwrap();
                put(&mut model, off, &d);
            }
            match round % 3 {
                0 => assert_eq!(
                    fs.getattr(f.ino).unwrap().size,
                    model.len() as u64,
                    "round {round}: getattr after gathered writes"
                ),
                1 => {
                    let span = (n as usize - 1) * 2000 + 3000;
                    assert!(
                        read_all(&fs, f.ino, fh, base as u64, span as u32)
                            == model[base..base + span],
                        "round {round}: a read of gathered writes"
                    )
                }
                _ => {
                    let d = seeded_bytes(round * 100 + 99, 5000);
                    let off = base + 1000;
                    fs.write(&c, f.ino, fh, off as u64, &d).unwrap();
                    put(&mut model, off, &d);
                }
            }
        }
        fs.flush(f.ino, fh).unwrap();
        assert!(read_all(&fs, f.ino, fh, 0, model.len() as u32) == model);
        fs.release(f.ino, fh).unwrap();
        let other = srv.client(&net, Duration::from_secs(30));
        let ofh = other.open(&c, f.ino, libc::O_RDONLY).unwrap();
        assert!(read_all(&other, f.ino, ofh, 0, model.len() as u32) == model);
        other.release(f.ino, ofh).unwrap();
    });
}

/// Through a real mount: 4 KiB and smaller pwrites at random offsets (the buffered path
/// the gather is for), then close; another client reads exactly what was written, and
/// the mount's own `-o nogather` writes the same bytes.
#[test]
fn small_pwrites_through_a_mount_read_back_exactly() {
    use std::os::unix::fs::FileExt;
    let net = Net::new();
    let srv = Served::new(&net, "gather-mount", &[]);
    for (tag, opts) in [("g", &[][..]), ("ng", &["-o", "nogather"][..])] {
        let m = RemoteMount::new(&net, &srv, &format!("gather-{tag}"), opts);
        let path = m.path(&format!("f-{tag}"));
        let mut model = Vec::new();
        net.in_cli(|| {
            let f = std::fs::File::create(&path).unwrap();
            let mut rng = Rng(0xfeed + tag.len() as u64);
            for i in 0..2000u64 {
                let n = [512usize, 4096, 4096, 100][rng.below(4) as usize];
                let off = (rng.below(256) * 4096 + rng.below(8) * 512) as usize;
                let d = seeded_bytes(i + 7, n);
                f.write_all_at(&d, off as u64).unwrap();
                put(&mut model, off, &d);
            }
            f.sync_all().unwrap();
            drop(f);
            let other = srv.client(&net, Duration::from_secs(30));
            let c = ctx();
            let a = other
                .lookup(&c, zcfs_backend::ROOT, format!("f-{tag}").as_bytes())
                .unwrap();
            assert_eq!(a.size, model.len() as u64, "{tag}");
            let ofh = other.open(&c, a.ino, libc::O_RDONLY).unwrap();
            assert!(
                read_all(&other, a.ino, ofh, 0, model.len() as u32) == model,
                "{tag}: another client reads other bytes"
            );
            other.release(a.ino, ofh).unwrap();
        });
        // `zcfs stat MOUNT` shows the gather at work (and none with -o nogather).
        let st = stat_json(&net, &srv, &m.mp.display().to_string());
        let (gathered, sends) = (
            st["gathered_writes"].as_u64().unwrap(),
            st["gather_sends"].as_u64().unwrap(),
        );
        if tag == "g" {
            assert!(gathered >= 500, "{gathered} writes gathered");
            assert!(sends * 2 <= gathered, "{sends} sends for {gathered} writes");
        } else {
            assert_eq!((gathered, sends), (0, 0));
        }
        drop(m);
    }
}

/// Gathered writes do not ask to be committed one by one: a close after them sends one
/// FLUSH behind them, and what it said is durable is, when the server is killed
/// (SIGKILL) right after it returns: every byte is there after a restart. Rounds write
/// 1 to 6 pieces (the first goes out alone, committed; the rest are gathered).
#[test]
fn a_close_after_gathered_writes_makes_them_durable() {
    let pieces = |round: usize| 1 + round % 6;
    let piece = |round: usize, i: usize| seeded_bytes((round * 8 + i) as u64 + 1, 4096);
    let act = |fs: &zcfs_client::RemoteFs, round: usize| {
        let c = ctx();
        let (f, fh) = create_file(fs, &format!("f{round}"), libc::O_WRONLY);
        fs.fsync(f.ino, fh, false).unwrap();
        let before = (fs.gathered_writes().0, fs.flushes_sent_behind());
        let mut ignore = |_: u32| {};
        for i in 0..pieces(round) {
            let off = (i * 4096) as u64;
            fs.write_behind_answering(&c, f.ino, fh, off, &piece(round, i), &mut ignore)
                .unwrap();
        }
        fs.flush(f.ino, fh).unwrap();
        let gathered = fs.gathered_writes().0 - before.0;
        let behind = fs.flushes_sent_behind() - before.1;
        assert_eq!(
            gathered,
            pieces(round) as u64 - 1,
            "round {round}: gathered"
        );
        assert_eq!(
            behind,
            u64::from(pieces(round) > 1),
            "round {round}: a FLUSH behind the gathered writes"
        );
    };
    let check = |fs: &zcfs_client::RemoteFs, round: usize| {
        let a = fs
            .lookup(&ctx(), zcfs_backend::ROOT, format!("f{round}").as_bytes())
            .unwrap();
        assert_eq!(a.size, (pieces(round) * 4096) as u64, "round {round}");
        let fh = fs.open(&ctx(), a.ino, libc::O_RDONLY).unwrap();
        for i in 0..pieces(round) {
            assert!(
                read_all(fs, a.ino, fh, (i * 4096) as u64, 4096) == piece(round, i),
                "round {round}: piece {i} lost after a close that said 0"
            );
        }
        fs.release(a.ino, fh).unwrap();
    };
    killed_after_each("gather-durable", 12, act, check);
}
