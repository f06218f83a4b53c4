//! Review of write-behind (buffered writes on a remote mount answered once sent) and
//! of prefault: findings as tests, and guards for the properties found holding.
//! Root required (network namespaces, FUSE), as in CI.

mod common;
use common::remote::*;
use std::ffi::CString;
use std::time::Duration;
use zcfs_backend::{Backend, ROOT};

const MIB: usize = 1 << 20;

/// How many rounds a race-seeking test runs at most (each a few milliseconds): enough
/// for an unordered pair of requests on two connections to land out of order many times
/// over, bounded in count.
const ROUNDS: usize = 60;

fn fill(byte: u8, n: usize) -> Vec<u8> {
    vec![byte; n]
}

/// A write the caller waits for (O_DIRECT, O_SYNC, `-o sync_writes`, or one larger than
/// a request) after a buffered write of the same range still in flight: the later one
/// must land last, as the kernel's i_rwsem ordered them. The waited-for write went out
/// on the other connection without waiting for the buffered one, and landed first.
#[test]
fn a_waited_for_write_after_a_buffered_one_lands_last() {
    let net = Net::new();
    let srv = Served::new(&net, "wb-order", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (big, small) = (fill(b'a', MIB), fill(b'b', 4096));
        for round in 0..ROUNDS {
            let name = format!("f{round}");
            let (f, fh) = create_file(&fs, &name, libc::O_RDWR);
            assert_eq!(fs.write_behind(&c, f.ino, fh, 0, &big).unwrap(), MIB as u32);
            assert_eq!(fs.write(&c, f.ino, fh, 0, &small).unwrap(), 4096);
            fs.flush(f.ino, fh).unwrap();
            let got = read_all(&fs, f.ino, fh, 0, 4096);
            fs.release(f.ino, fh).unwrap();
            assert!(
                got == small,
                "round {round}: the buffered write landed after the later waited-for one \
                 (read {:?}...)",
                &got[..8]
            );
        }
    });
}

/// An entry looked up while a write of it is in flight (the kernel revalidating a name,
/// `ls -l`) must show the size the write made: the kernel takes a lookup's size as the
/// file's (an O_APPEND writer then writes at the stale end, over its own data), and the
/// client caches it for getattr. The client has two connections used in turn: the
/// small write goes out on the connection whose server thread is still busy with an
/// 8 MiB write of another file, the lookup (and the listing) on the other one.
#[test]
fn a_lookup_after_a_buffered_write_shows_its_size() {
    let net = Net::new();
    let srv = Served::new(&net, "wb-lookup", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (big, small) = (fill(b'a', 8 * MIB), fill(b'b', 4096));
        let (x, xfh) = create_file(&fs, "x", libc::O_RDWR);
        for round in 0..ROUNDS {
            let name = format!("f{round}");
            let (f, fh) = create_file(&fs, &name, libc::O_RDWR);
            // Connection k: the big write; k+1: statfs; k: the small write; k+1: lookup.
            assert_eq!(
                fs.write_behind(&c, x.ino, xfh, 0, &big).unwrap(),
                big.len() as u32
            );
            fs.statfs().unwrap();
            assert_eq!(fs.write_behind(&c, f.ino, fh, 0, &small).unwrap(), 4096);
            let looked = fs.lookup(&c, ROOT, name.as_bytes()).unwrap();
            let got = fs.getattr(f.ino).unwrap();
            // The same for readdirplus.
            assert_eq!(
                fs.write_behind(&c, x.ino, xfh, 0, &big).unwrap(),
                big.len() as u32
            );
            fs.statfs().unwrap();
            assert_eq!(fs.write_behind(&c, f.ino, fh, 4096, &small).unwrap(), 4096);
            let mut listed = None;
            fs.readdir(ROOT, 0, true, &mut |e| {
                if e.ino == f.ino {
                    listed = e.attr.map(|a| a.size);
                }
                true
            })
            .unwrap();
            fs.flush(f.ino, fh).unwrap();
            fs.release(f.ino, fh).unwrap();
            assert_eq!(
                (looked.size, got.size, listed),
                (4096, 4096, Some(8192)),
                "round {round}: lookup and then getattr after a write to 4 KiB, readdirplus \
                 after one to 8 KiB, all answered as written"
            );
        }
        fs.flush(x.ino, xfh).unwrap();
        fs.release(x.ino, xfh).unwrap();
    });
}

/// close(2) of `fd`, its result: 0 or the errno.
fn close_fd(fd: i32) -> i32 {
    // SAFETY: closing a descriptor this test opened and owns.
    if unsafe { libc::close(fd) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

/// Close-on-exec, so children of the tests running beside this one do not keep the file
/// open. Their exec still closes it, and that close is a FLUSH of the same handle. The
/// first such close used to take the handle's write error, and the writer's own close then
/// said 0 (`enospc_is_reported_to_a_write_behind_writer`, 5 runs in 12). Now every close of
/// the handle reports it.
fn open_fd(path: &str, flags: i32) -> i32 {
    let c = CString::new(path).unwrap();
    // SAFETY: a NUL-terminated path; plain flags.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    assert!(fd >= 0, "open {path}: {}", std::io::Error::last_os_error());
    fd
}

/// Buffered writes of `n` MiB through `fd`: the first errno a write gave (0: none).
fn write_mib(fd: i32, n: usize, byte: u8) -> i32 {
    let buf = fill(byte, MIB);
    for _ in 0..n {
        // SAFETY: a buffer of MIB bytes we own.
        let r = unsafe { libc::write(fd, buf.as_ptr().cast(), MIB) };
        if r < 0 {
            return std::io::Error::last_os_error().raw_os_error().unwrap();
        }
    }
    0
}

/// A writer filling a volume must learn of ENOSPC (at a write, or when it closes the
/// file), even when another descriptor of the file (a reader: a backup, `cat`) is
/// closed first: that close took the writer's error, and the writer's close said 0.
#[test]
fn enospc_is_reported_to_the_writer_not_to_another_descriptor() {
    let net = Net::new();
    let srv = Served::sized(&net, "wb-enospc2", "64M", &[]);
    let m = RemoteMount::new(&net, &srv, "wb-enospc2", &[]);
    let p = m.path("big");
    let w = open_fd(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
    let r = open_fd(&p, libc::O_RDONLY);
    let at_write = write_mib(w, 100, b'x');
    let reader_close = close_fd(r);
    let writer_close = close_fd(w);
    assert!(
        at_write == libc::ENOSPC || writer_close == libc::ENOSPC,
        "100 MiB into a 64 MiB volume: the writer saw write {at_write}, close {writer_close} \
         (the reader's close saw {reader_close})"
    );
}

/// The same through a mount with write-behind (`-o write_behind`): a writer filling a
/// volume must learn of ENOSPC at a write or at close.
#[test]
fn enospc_is_reported_to_a_write_behind_writer() {
    let net = Net::new();
    let srv = Served::sized(&net, "wb-enospc3", "64M", &[]);
    let m = RemoteMount::new(&net, &srv, "wb-enospc3", &["-o", "write_behind"]);
    for round in 0..4 {
        let p = m.path(&format!("big{round}"));
        let w = open_fd(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
        let r = open_fd(&p, libc::O_RDONLY);
        let at_write = write_mib(w, 100, b'x');
        let reader_close = close_fd(r);
        let writer_close = close_fd(w);
        assert!(
            at_write == libc::ENOSPC || writer_close == libc::ENOSPC,
            "round {round}: the writer saw write {at_write}, close {writer_close} \
             (the reader's close saw {reader_close})"
        );
        std::fs::remove_file(&p).unwrap();
        let t = std::time::Instant::now();
        while free_bytes(&m.path("")) < 32 * MIB as u64 && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Guard: a single writer filling a volume learns of ENOSPC at a write, at fsync or at
/// close; and after the error was reported once the file system keeps working (the
/// space is given back by unlink, and a new file is written whole).
#[test]
fn enospc_surfaces_at_write_fsync_or_close() {
    let net = Net::new();
    let srv = Served::sized(&net, "wb-enospc", "64M", &[]);
    let m = RemoteMount::new(&net, &srv, "wb-enospc", &[]);
    for (i, sync) in [(0, false), (1, true)] {
        let p = m.path(&format!("big{i}"));
        let w = open_fd(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC);
        let at_write = write_mib(w, 100, b'x');
        let at_fsync = if sync {
            // SAFETY: our descriptor.
            if unsafe { libc::fsync(w) } == 0 {
                0
            } else {
                std::io::Error::last_os_error().raw_os_error().unwrap()
            }
        } else {
            0
        };
        let at_close = close_fd(w);
        assert!(
            [at_write, at_fsync, at_close].contains(&libc::ENOSPC),
            "100 MiB into a 64 MiB volume: write {at_write}, fsync {at_fsync}, close {at_close}"
        );
        std::fs::remove_file(&p).unwrap();
    }
    // The kernel sends a file's release after close returns, and an unlinked file's
    // blocks are freed at its release: wait (bounded) until the space is back.
    let t = std::time::Instant::now();
    while free_bytes(&m.path("")) < 16 * MIB as u64 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let p = m.path("after");
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i * 31 + 7) as u8).collect();
    std::fs::write(&p, &data).unwrap();
    assert!(
        std::fs::read(&p).unwrap() == data,
        "a file written after ENOSPC"
    );
}

/// Guard: several threads, each with two descriptors of one shared file, write
/// overlapping random ranges of their own part of it (and extend, and truncate their
/// own scratch file) through a remote mount; after close, what a second client reads
/// is exactly the model.
#[test]
fn overlapping_buffered_writes_through_two_descriptors_match_a_model() {
    use std::os::unix::fs::FileExt;
    const THREADS: u64 = 4;
    const PART: u64 = 2 * MIB as u64;
    const WRITES: usize = 300;
    let net = Net::new();
    let srv = Served::new(&net, "wb-model", &[]);
    let m = RemoteMount::new(&net, &srv, "wb-model", &[]);
    let shared = m.path("shared");
    std::fs::File::create(&shared).unwrap();
    let models: Vec<(Vec<u8>, Vec<u8>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (shared, own) = (shared.clone(), m.path(&format!("own{t}")));
                s.spawn(move || {
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (t + 1));
                    let open = |p: &str| {
                        std::fs::OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(false)
                            .open(p)
                            .unwrap()
                    };
                    let fds = [open(&shared), open(&shared)];
                    let mine = open(&own);
                    let mut model = vec![0u8; PART as usize];
                    let mut own_model: Vec<u8> = Vec::new();
                    for i in 0..WRITES {
                        let len = 1 + rng.below(64 << 10) as usize;
                        let off = rng.below(PART - len as u64);
                        let byte = (rng.next() as u8) | 1;
                        let buf = fill(byte, len);
                        let fd = &fds[i % 2];
                        fd.write_all_at(&buf, t * PART + off).unwrap();
                        model[off as usize..off as usize + len].copy_from_slice(&buf);
                        // The scratch file: writes, then now and then a truncation
                        // (shorter or longer) and a read-back, all of one descriptor.
                        let o = rng.below(1 << 20);
                        mine.write_all_at(&buf, o).unwrap();
                        let end = (o as usize + len).max(own_model.len());
                        own_model.resize(end, 0);
                        own_model[o as usize..o as usize + len].copy_from_slice(&buf);
                        if i % 37 == 0 {
                            let to = rng.below(1 << 20);
                            mine.set_len(to).unwrap();
                            own_model.resize(to as usize, 0);
                        }
                        if i % 53 == 0 {
                            let mut back = vec![0u8; own_model.len()];
                            mine.read_exact_at(&mut back, 0).unwrap();
                            assert!(back == own_model, "thread {t} write {i}: read-back");
                        }
                    }
                    (model, own_model)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // What another client of the server sees, after every descriptor was closed.
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let f = fs.lookup(&c, ROOT, b"shared").unwrap();
        let fh = fs.open(&c, f.ino, libc::O_RDONLY).unwrap();
        for (t, (model, own_model)) in models.iter().enumerate() {
            let mut got = Vec::new();
            let base = t as u64 * PART;
            let mut off = 0u64;
            while off < PART {
                got.extend(read_all(&fs, f.ino, fh, base + off, MIB as u32));
                off += MIB as u64;
            }
            got.resize(PART as usize, 0);
            assert!(&got == model, "thread {t}: its part of the shared file");
            let o = fs.lookup(&c, ROOT, format!("own{t}").as_bytes()).unwrap();
            assert_eq!(o.size, own_model.len() as u64, "thread {t}: scratch size");
            let ofh = fs.open(&c, o.ino, libc::O_RDONLY).unwrap();
            let mut got = Vec::new();
            while got.len() < own_model.len() {
                let n = read_all(&fs, o.ino, ofh, got.len() as u64, MIB as u32);
                assert!(!n.is_empty());
                got.extend(n);
            }
            assert!(&got == own_model, "thread {t}: its scratch file");
            fs.release(o.ino, ofh).unwrap();
        }
        fs.release(f.ino, fh).unwrap();
    });
}

/// Guard: with a server taking 4 requests in flight per connection (so write-behind
/// holds at most 2 replies), 8 threads writing 10 files each through write-behind,
/// reading back and asking attributes in between, all finish (within a bound: a
/// deadlock on in-flight slots would stop them), every file is whole, and no reply is
/// held afterwards.
#[test]
fn many_writers_with_a_small_max_inflight_finish_and_hold_nothing() {
    const THREADS: u64 = 8;
    const FILES: u64 = 10;
    const WRITES: u64 = 8;
    const CHUNK: usize = 64 << 10;
    let net = Net::new();
    let srv = Served::new(&net, "wb-inflight", &["--max-inflight", "4"]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        assert_eq!(fs.client().max_inflight(), 4);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (fs, tx) = (&fs, tx.clone());
                s.spawn(move || {
                    let c = ctx();
                    for i in 0..FILES {
                        let name = format!("t{t}f{i}");
                        let (f, fh) = create_file(fs, &name, libc::O_RDWR);
                        for w in 0..WRITES {
                            let buf = fill((t * 31 + i * 7 + w) as u8, CHUNK);
                            let off = w * CHUNK as u64;
                            assert_eq!(
                                fs.write_behind(&c, f.ino, fh, off, &buf).unwrap(),
                                CHUNK as u32
                            );
                            if w % 3 == 2 {
                                assert!(read_all(fs, f.ino, fh, off, CHUNK as u32) == buf);
                                assert_eq!(fs.getattr(f.ino).unwrap().size, off + CHUNK as u64);
                            }
                        }
                        fs.flush(f.ino, fh).unwrap();
                        for w in 0..WRITES {
                            let off = w * CHUNK as u64;
                            let want = fill((t * 31 + i * 7 + w) as u8, CHUNK);
                            assert!(
                                read_all(fs, f.ino, fh, off, CHUNK as u32) == want,
                                "{name} chunk {w}"
                            );
                        }
                        fs.release(f.ino, fh).unwrap();
                    }
                    tx.send(t).unwrap();
                });
            }
            drop(tx);
            for _ in 0..THREADS {
                rx.recv_timeout(Duration::from_secs(120))
                    .expect("writers stuck: in-flight slots never freed?");
            }
        });
        assert_eq!(
            fs.write_behind_held(),
            0,
            "replies held after every file closed"
        );
    });
}

/// Buffered writes in flight when the server is killed and restarted (on the same
/// volume): the writer's fsync reports an error, or every byte is there afterwards.
/// Never success with bytes missing: the client marks a handle written through since
/// its last fsync or flush, and a restart makes that handle's next fsync or flush EIO.
#[test]
fn writes_in_flight_across_a_server_restart_are_reported_or_whole() {
    restart_rounds("wb-restart", "f", false, &|fs, c, ino, fh, off, b| {
        fs.write_behind(c, ino, fh, off, b).map_err(|_| ())
    });
}

/// A write through write-behind (either API): Ok(bytes) or Err when refused at once.
type WriteFn = dyn Fn(&zcfs_client::RemoteFs, &zcfs_backend::Ctx, u64, u64, u64, &[u8]) -> Result<u32, ()>
    + Sync;

/// Three rounds of 16 MiB written with `write` in 1 MiB pieces, the server killed and
/// restarted part way: fsync reports an error, or every byte is there afterwards.
/// `must_report`: at least one round must have reported the restart.
fn restart_rounds(tag: &str, prefix: &str, must_report: bool, write: &WriteFn) {
    let net = Net::new();
    let mut srv = Served::new(&net, tag, &[]);
    let mut outcomes = Vec::new();
    for round in 0..3u8 {
        let name = format!("{prefix}{round}");
        let chunks: Vec<Vec<u8>> = (0..16u8).map(|i| fill(round * 16 + i + 1, MIB)).collect();
        let flushed = net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(3));
            let c = ctx();
            let (f, fh) = create_file(&fs, &name, libc::O_RDWR);
            fs.fsync(f.ino, fh, false).unwrap();
            for (i, b) in chunks.iter().enumerate() {
                // A write that finds the connection gone fails at once: also reported.
                if write(&fs, &c, f.ino, fh, (i * MIB) as u64, b).is_err() {
                    return Err(());
                }
                if i == 8 - round as usize * 4 {
                    srv.kill(libc::SIGKILL);
                    srv.start(&net, &[]);
                }
            }
            let r = fs.fsync(f.ino, fh, false).map_err(|_| ());
            let _ = fs.release(f.ino, fh);
            r
        });
        outcomes.push(flushed.is_ok());
        if flushed.is_ok() {
            net.in_cli(|| {
                let fs = srv.client(&net, Duration::from_secs(5));
                let a = fs.lookup(&ctx(), ROOT, name.as_bytes()).unwrap();
                assert_eq!(a.size, (16 * MIB) as u64, "round {round}: fsync said 0");
                for (i, b) in chunks.iter().enumerate() {
                    assert!(
                        &read_all(&fs, a.ino, 0, (i * MIB) as u64, MIB as u32) == b,
                        "round {round}: chunk {i} after an fsync that said 0"
                    );
                }
            });
        }
    }
    // A test where every fsync succeeds proves nothing about the reporting.
    assert!(
        !must_report || outcomes.contains(&false),
        "no round reported the restart: {outcomes:?}"
    );
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// Bytes free for an unprivileged user on the file system of `p` (statvfs).
fn free_bytes(p: &str) -> u64 {
    let c = std::ffi::CString::new(p).unwrap();
    // SAFETY: statvfs is plain integers, for which all zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a statvfs the call fills in.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bavail as u64 * st.f_frsize as u64
}

/// `write_behind_answering` (the mount's buffered writes): the writer is answered once
/// per write, with the whole length, before the bytes leave; or, with no answer, gets
/// the outcome. Either way exactly once.
fn write_answered(
    fs: &zcfs_client::RemoteFs,
    c: &zcfs_backend::Ctx,
    ino: u64,
    fh: u64,
    off: u64,
    data: &[u8],
) -> Result<u32, ()> {
    let mut calls = Vec::new();
    let r = fs.write_behind_answering(c, ino, fh, off, data, &mut |n| calls.push(n));
    match (calls.as_slice(), r) {
        ([n], Ok(m)) => {
            assert_eq!((*n, m), (data.len() as u32, data.len() as u32));
            Ok(*n)
        }
        ([], r) => r.map_err(|_| ()),
        (calls, r) => panic!("answered {calls:?} and returned {r:?}"),
    }
}

/// Writes answered before they are sent, across a server restart: fsync reports an
/// error, or every byte is there afterwards (an early answer must never turn a failed
/// send into a silent loss).
#[test]
fn writes_answered_before_sending_across_a_server_restart_are_reported_or_whole() {
    restart_rounds("wb-early", "e", true, &write_answered);
}

/// With the server up, an answered write is there after fsync, and a read of its range
/// issued right after the answer sees it (the range waits for the write).
#[test]
fn a_read_right_after_an_early_answer_sees_the_write() {
    let net = Net::new();
    let srv = Served::new(&net, "wb-early-read", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (f, fh) = create_file(&fs, "r", libc::O_RDWR);
        for round in 0..ROUNDS as u8 {
            let b = fill(round.wrapping_add(1), 64 * 1024);
            assert_eq!(write_answered(&fs, &c, f.ino, fh, 0, &b), Ok(64 * 1024));
            assert!(
                read_all(&fs, f.ino, fh, 0, 64 * 1024) == b,
                "round {round}: a read after the answer missed the write"
            );
        }
        fs.fsync(f.ino, fh, false).unwrap();
        fs.release(f.ino, fh).unwrap();
    });
}

/// What a close said is durable must be, when the server is killed (SIGKILL) right
/// after it returns, before its group commit's delay would have committed anything
/// left: every byte is there after it starts again. Two ways a close gets there:
/// - small writes (up to `COMMIT_WRITE_MAX`) are committed before their replies, so
///   the close collects the replies and sends no FLUSH at all;
/// - after larger ones, the FLUSH goes behind them on the connection of the newest (the
///   server runs one connection's requests in order), before their replies are in.
///
/// Rounds write 1 to 4 pieces, so the writes of one file go out on both connections.
fn close_makes_durable_rounds(tag: &str, piece_len: usize, by_commits: bool) {
    let pieces = |round: usize| 1 + round % 4;
    let piece = |round: usize, i: usize| fill((round * 4 + i) as u8 + 1, piece_len);
    let act = |fs: &zcfs_client::RemoteFs, round: usize| {
        let c = ctx();
        let (f, fh) = create_file(fs, &format!("f{round}"), libc::O_WRONLY);
        // Made durable first: only the writes below are at stake.
        fs.fsync(f.ino, fh, false).unwrap();
        for i in 0..pieces(round) {
            let off = (i * piece_len) as u64;
            let n = fs.write_behind(&c, f.ino, fh, off, &piece(round, i));
            assert_eq!(n.unwrap(), piece_len as u32);
        }
        let (behind, committed) = (fs.flushes_sent_behind(), fs.durable_without_round_trip());
        fs.flush(f.ino, fh).unwrap();
        let got = (
            fs.flushes_sent_behind() - behind,
            fs.durable_without_round_trip() - committed,
        );
        let want = if by_commits { (0, 1) } else { (1, 0) };
        assert_eq!(
            got, want,
            "round {round}: (flushes sent behind, closes without one)"
        );
    };
    let check = |fs: &zcfs_client::RemoteFs, round: usize| {
        let a = fs
            .lookup(&ctx(), ROOT, format!("f{round}").as_bytes())
            .unwrap();
        assert_eq!(a.size, (pieces(round) * piece_len) as u64, "round {round}");
        for i in 0..pieces(round) {
            let off = (i * piece_len) as u64;
            assert!(
                read_all(fs, a.ino, 0, off, piece_len as u32) == piece(round, i),
                "round {round}: piece {i} lost after a close that said 0"
            );
        }
    };
    killed_after_each(tag, 24, act, check);
}

#[test]
fn a_close_after_small_writes_needs_no_flush_and_they_are_durable() {
    close_makes_durable_rounds("wb-commit", 4096, true);
}

#[test]
fn a_flush_sent_behind_larger_writes_makes_them_durable() {
    let len = zcfs_client::COMMIT_WRITE_MAX + 4096;
    close_makes_durable_rounds("wb-flush-behind", len, false);
}

/// A write refused by the server (the volume full) while the close's FLUSH went out
/// behind it: the close reports the write's error, not the flush's success.
#[test]
fn a_flush_sent_behind_a_refused_write_reports_its_error() {
    let net = Net::new();
    let srv = Served::sized(&net, "wb-flush-enospc", "64M", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let (f, fh) = create_file(&fs, "big", libc::O_WRONLY);
        let piece = fill(7, 1 << 20);
        // 128 MiB into a 64 MiB volume: a write fails, but is answered as written.
        let mut refused_at_once = false;
        for i in 0..128u64 {
            if fs.write_behind(&c, f.ino, fh, i << 20, &piece).is_err() {
                refused_at_once = true;
                break;
            }
        }
        let r = fs.flush(f.ino, fh);
        assert!(
            refused_at_once || r.is_err(),
            "a close after writes the volume had no room for said 0"
        );
        let _ = fs.release(f.ino, fh);
    });
}

/// A close after small writes needs no FLUSH only if nothing else changed the file
/// since without being committed: a truncate through an open file is committed before
/// its reply (`SetattrReq::commit`); a chmod, xattr or fallocate is not, and then the
/// close sends one. Either way the server is killed right after the close, and the
/// file must have the size the truncate gave it (and the xattr set).
#[test]
fn a_truncate_after_small_writes_is_durable_at_close() {
    let size = |round: usize| 4096 + round as u64;
    let act = |fs: &zcfs_client::RemoteFs, round: usize| {
        let c = ctx();
        let (f, fh) = create_file(fs, &format!("t{round}"), libc::O_WRONLY);
        fs.fsync(f.ino, fh, false).unwrap();
        for i in 0..3u64 {
            let n = fs.write_behind(&c, f.ino, fh, i * 4096, &fill(9, 4096));
            assert_eq!(n.unwrap(), 4096);
        }
        let shrink = zcfs_backend::SetAttr {
            size: Some(size(round)),
            ..Default::default()
        };
        fs.setattr(&c, f.ino, &shrink, fh).unwrap();
        if round % 2 == 1 {
            // Not committed by its reply: the close must send its FLUSH.
            fs.setxattr(&c, f.ino, b"user.k", b"v", 0).unwrap();
            let committed = fs.durable_without_round_trip();
            fs.flush(f.ino, fh).unwrap();
            assert_eq!(
                fs.durable_without_round_trip(),
                committed,
                "round {round}: a close after a setxattr skipped its FLUSH"
            );
        } else {
            fs.flush(f.ino, fh).unwrap();
        }
    };
    let check = |fs: &zcfs_client::RemoteFs, round: usize| {
        let a = fs
            .lookup(&ctx(), ROOT, format!("t{round}").as_bytes())
            .unwrap();
        assert_eq!(a.size, size(round), "round {round}: the truncate was lost");
        if round % 2 == 1 {
            let v = fs.getxattr(&ctx(), a.ino, b"user.k").unwrap();
            assert_eq!(v, b"v", "round {round}: the xattr was lost");
        }
    };
    killed_after_each("wb-trunc", 12, act, check);
}

/// A truncate by path of a file open nowhere here is committed before its reply too
/// (every setattr asks): a handle opened while it is in flight is not charged with it,
/// and its close or fsync must not be able to skip a round trip the truncate needed
/// (review rv23c). The server is killed right after the truncate returns: the file has
/// the size it gave.
#[test]
fn a_truncate_by_path_is_committed_before_its_reply() {
    let size = |round: usize| 100 + round as u64;
    let act = |fs: &zcfs_client::RemoteFs, round: usize| {
        let c = ctx();
        let (f, fh) = create_file(fs, &format!("p{round}"), libc::O_WRONLY);
        assert_eq!(fs.write(&c, f.ino, fh, 0, &fill(3, 16384)).unwrap(), 16384);
        fs.fsync(f.ino, fh, false).unwrap();
        fs.release(f.ino, fh).unwrap();
        let shrink = zcfs_backend::SetAttr {
            size: Some(size(round)),
            ..Default::default()
        };
        fs.setattr(&c, f.ino, &shrink, 0).unwrap();
    };
    let check = |fs: &zcfs_client::RemoteFs, round: usize| {
        let a = fs
            .lookup(&ctx(), ROOT, format!("p{round}").as_bytes())
            .unwrap();
        assert_eq!(a.size, size(round), "round {round}: the truncate was lost");
    };
    killed_after_each("wb-path-trunc", 8, act, check);
}
