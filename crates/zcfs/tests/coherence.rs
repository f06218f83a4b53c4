//! Coherence between two clients of one server (issue 11): one `zcfs serve` in the
//! server namespace and two `zcfs mount`s of it (A and B) in the client namespace, each
//! its own FUSE connection and its own client library with its own caches.
//!
//! - close-to-open: what A wrote and closed, B reads whole when it opens the file
//!   afterwards, however much of the old file it had cached just before;
//! - invalidation: B sees every change A makes to what B has cached (attributes,
//!   names, pages of a file it keeps open) no later than the attribute timeout plus a
//!   margin;
//! - durability: once close or fsync returned on A, the data is on the server, even
//!   if A's mount process is killed at once.
//!
//! Each runs with the default mount options and with `-o writeback` (the kernel's
//! writeback cache; see README "Caching and coherence" for what it may not promise).
//! `cache=always` is exempt: it keeps the page cache across opens on purpose.
//! Root required, as in CI.

mod common;
use common::remote::*;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::time::{Duration, Instant, SystemTime};

/// The mount's attribute and entry timeout by default (`attr_timeout=`).
const ATTR_TIMEOUT: Duration = Duration::from_secs(1);
/// How much later than the timeout a change may show (scheduling, one round trip).
const MARGIN: Duration = Duration::from_millis(500);
/// How often B looks while it waits for a change.
const POLL: Duration = Duration::from_millis(10);
/// Rounds of each close-to-open sequence.
const ROUNDS: usize = 4;

/// One server and two mounts of it.
struct Two {
    _net: Net,
    _srv: Served,
    a: RemoteMount,
    b: RemoteMount,
}

fn two(tag: &str, opts: &[&str]) -> Two {
    let net = Net::new();
    let srv = Served::new(&net, tag, &[]);
    let a = RemoteMount::new(&net, &srv, &format!("{tag}-a"), opts);
    let b = RemoteMount::new(&net, &srv, &format!("{tag}-b"), opts);
    Two {
        _net: net,
        _srv: srv,
        a,
        b,
    }
}

/// `len` bytes that differ from round to round and step to step.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    seeded_bytes(seed, len)
}

/// What A does to the file in one close-to-open step.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// open(O_TRUNC), write this many bytes, close.
    Rewrite(usize),
    /// Write this many bytes at the end without O_APPEND (the file grows).
    Grow(usize),
    /// ftruncate to this size and overwrite the first bytes (the file shrinks).
    Shrink(usize),
    /// O_APPEND write of this many bytes.
    Append(usize),
    /// Overwrite in place, same size (only the content and mtime change).
    Overwrite,
}

const MIB: usize = 1 << 20;

const STEPS: &[Step] = &[
    Step::Rewrite(0),
    Step::Rewrite(3),
    Step::Rewrite(MIB + 7),
    Step::Overwrite,
    Step::Grow(3 * 4096 + 5),
    Step::Shrink(5000),
    Step::Rewrite(5000),
    Step::Append(MIB + 7),
    Step::Shrink(3),
    Step::Grow(MIB),
    Step::Rewrite(0),
];

/// Apply `step` to `path` through A (closing it before returning); `model` follows.
fn apply(path: &str, step: Step, seed: u64, model: &mut Vec<u8>) {
    match step {
        Step::Rewrite(n) => {
            let data = pattern(n, seed);
            fs::write(path, &data).unwrap();
            *model = data;
        }
        Step::Grow(n) => {
            let data = pattern(n, seed);
            let f = OpenOptions::new().write(true).open(path).unwrap();
            f.write_all_at(&data, model.len() as u64).unwrap();
            model.extend_from_slice(&data);
        }
        Step::Shrink(n) => {
            let f = OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(n as u64).unwrap();
            model.truncate(n);
            let head = pattern(n.min(100), seed);
            f.write_all_at(&head, 0).unwrap();
            model[..head.len()].copy_from_slice(&head);
        }
        Step::Append(n) => {
            let data = pattern(n, seed);
            let mut f = OpenOptions::new().append(true).open(path).unwrap();
            f.write_all(&data).unwrap();
            model.extend_from_slice(&data);
        }
        Step::Overwrite => {
            let data = pattern(model.len(), seed);
            let f = OpenOptions::new().write(true).open(path).unwrap();
            f.write_all_at(&data, 0).unwrap();
            *model = data;
        }
    }
}

/// Read a whole file by opening it; also its size as fstat of the open file says.
fn open_and_read(path: &str) -> (Vec<u8>, u64) {
    let f = File::open(path).unwrap();
    let size = f.metadata().unwrap().len();
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut &f, &mut out).unwrap();
    (out, size)
}

fn describe(got: &[u8], want: &[u8]) -> String {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    format!(
        "{} bytes, {} wanted, first difference at {:?}",
        got.len(),
        want.len(),
        first
    )
}

fn close_to_open(tag: &str, opts: &[&str]) {
    let t = two(tag, opts);
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("f{round}");
        let (pa, pb) = (t.a.path(&name), t.b.path(&name));
        let mut model = Vec::new();
        fs::write(&pa, b"").unwrap();
        for (i, step) in STEPS.iter().enumerate() {
            // B has the file, its attributes and pages cached just before A changes it.
            open_and_read(&pb);
            apply(&pa, *step, (round * 100 + i) as u64 + 1, &mut model);
            // A closed it: B opens it at once, well within the attribute timeout.
            let (got, size) = open_and_read(&pb);
            if got != model || size != model.len() as u64 {
                failures.push(format!(
                    "round {round} step {i} {step:?}: B read {}; fstat size {size}",
                    describe(&got, &model)
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "close-to-open broken ({} of {} opens):\n{}",
        failures.len(),
        ROUNDS * STEPS.len(),
        failures.join("\n")
    );
}

#[test]
fn close_to_open_with_default_options() {
    close_to_open("c2o", &[]);
}

/// Exempt (README "Caching and coherence"): under its writeback cache the kernel keeps
/// its own size, mtime and ctime of a regular file and never takes the server's
/// (`fuse_get_cache_mask`), so B keeps reading the old length, and the pages the mtime
/// would have dropped. Kept to show it: `cargo test -- --ignored`.
#[test]
#[ignore = "the kernel's writeback cache trusts its own size and mtime: exempt"]
fn close_to_open_with_writeback_cache() {
    close_to_open("c2o-wb", &["-o", "writeback"]);
}

/// Poll `seen` every POLL until it holds; how long that took, or an error naming
/// `what` if it did not within the attribute timeout and the margin.
fn within(what: &str, mut seen: impl FnMut() -> bool) -> Result<Duration, String> {
    let t = Instant::now();
    loop {
        if seen() {
            return Ok(t.elapsed());
        }
        if t.elapsed() > ATTR_TIMEOUT + MARGIN {
            return Err(format!(
                "{what}: not seen after {:?}",
                ATTR_TIMEOUT + MARGIN
            ));
        }
        std::thread::sleep(POLL);
    }
}

fn exists(p: &str) -> bool {
    match fs::symlink_metadata(p) {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::NotFound => false,
        Err(e) => panic!("stat {p}: {e}"),
    }
}

fn listed(dir: &str, name: &str) -> bool {
    fs::read_dir(dir)
        .unwrap()
        .any(|e| e.unwrap().file_name() == name)
}

/// fstatx with AT_STATX_FORCE_SYNC (`stat --cached=never`): the kernel asks the mount
/// even when its own copy is still valid. Mode bits.
fn forced_mode(f: &File) -> u32 {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero statx is a valid value to be overwritten.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor, an empty NUL-terminated path (AT_EMPTY_PATH: the
    // descriptor itself) and a statx buffer that outlive the call.
    let r = unsafe {
        libc::statx(
            f.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_BASIC_STATS,
            &mut st,
        )
    };
    assert_eq!(r, 0, "statx: {}", std::io::Error::last_os_error());
    st.stx_mode as u32 & 0o7777
}

/// `own_size`: the kernel keeps its own size and mtime of regular files (writeback
/// cache), so only what it still takes from the server is checked: mode, names.
fn changes_are_seen(tag: &str, opts: &[&str], own_size: bool) {
    let t = two(tag, opts);
    let (a, b) = (&t.a, &t.b);
    let mut errors = Vec::new();
    let mut worst = Duration::ZERO;
    let mut check = |r: Result<Duration, String>| match r {
        Ok(d) => worst = worst.max(d),
        Err(e) => errors.push(e),
    };

    // Size, mode, mtime: B has stat'ed the file.
    let data = pattern(10_000, 1);
    fs::write(a.path("attrs"), &data).unwrap();
    let pb = b.path("attrs");
    assert_eq!(fs::metadata(&pb).unwrap().len(), 10_000);
    OpenOptions::new()
        .write(true)
        .open(a.path("attrs"))
        .unwrap()
        .set_len(4321)
        .unwrap();
    if !own_size {
        check(within("size after truncate", || {
            fs::metadata(&pb).unwrap().len() == 4321
        }));
    }
    fs::set_permissions(a.path("attrs"), fs::Permissions::from_mode(0o640)).unwrap();
    check(within("mode after chmod", || {
        fs::metadata(&pb).unwrap().mode() & 0o7777 == 0o640
    }));
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    if own_size {
        // What follows is exempt under the writeback cache.
        return names_are_seen(a, b, errors, worst, tag);
    }
    File::options()
        .write(true)
        .open(a.path("attrs"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    check(within("mtime after utimes", || {
        fs::metadata(&pb).unwrap().mtime() == 1_000_000_000
    }));

    // Content and size of a file B keeps open and has read.
    let old = pattern(3 * 4096, 2);
    fs::write(a.path("open"), &old).unwrap();
    let fb = File::open(b.path("open")).unwrap();
    let mut buf = vec![0; old.len()];
    fb.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, old);
    let new = pattern(old.len(), 3);
    OpenOptions::new()
        .write(true)
        .open(a.path("open"))
        .unwrap()
        .write_all_at(&new, 0)
        .unwrap();
    check(within("content of a file kept open", || {
        fb.read_exact_at(&mut buf, 0).unwrap();
        buf == new
    }));
    let more = pattern(5000, 4);
    OpenOptions::new()
        .append(true)
        .open(a.path("open"))
        .unwrap()
        .write_all(&more)
        .unwrap();
    let grown = [new.clone(), more].concat();
    check(within("growth of a file kept open", || {
        let mut all = vec![0; grown.len() + 10];
        let n = fb.read_at(&mut all, 0).unwrap();
        let mut got = all[..n].to_vec();
        // A read at the old end may stop there: read on.
        while n > 0 && got.len() < grown.len() {
            let m = fb.read_at(&mut all, got.len() as u64).unwrap();
            if m == 0 {
                break;
            }
            got.extend_from_slice(&all[..m]);
        }
        fb.metadata().unwrap().len() == grown.len() as u64 && got == grown
    }));
    drop(fb);
    names_are_seen(a, b, errors, worst, tag)
}

/// Names: B has looked them up (positive and negative entries) and listed the dir;
/// A creates, unlinks and renames.
fn names_are_seen(
    a: &RemoteMount,
    b: &RemoteMount,
    mut errors: Vec<String>,
    mut worst: Duration,
    tag: &str,
) {
    let dir_b = b.mp.to_str().unwrap().to_owned();
    let mut check = |r: Result<Duration, String>| match r {
        Ok(d) => worst = worst.max(d),
        Err(e) => errors.push(e),
    };
    fs::write(a.path("gone"), b"x").unwrap();
    fs::write(a.path("old"), b"y").unwrap();
    assert!(exists(&b.path("gone")) && exists(&b.path("old")));
    assert!(!exists(&b.path("new")) && !exists(&b.path("moved")));
    assert!(listed(&dir_b, "gone") && !listed(&dir_b, "new"));
    fs::write(a.path("new"), b"z").unwrap();
    fs::remove_file(a.path("gone")).unwrap();
    fs::rename(a.path("old"), a.path("moved")).unwrap();
    check(within("a created name", || exists(&b.path("new"))));
    check(within("a created name in a listing", || {
        listed(&dir_b, "new")
    }));
    check(within("an unlinked name", || !exists(&b.path("gone"))));
    check(within("an unlinked name in a listing", || {
        !listed(&dir_b, "gone")
    }));
    check(within("a renamed name (old)", || !exists(&b.path("old"))));
    check(within("a renamed name (new)", || {
        fs::read(b.path("moved")).is_ok_and(|d| d == b"y")
    }));

    assert!(errors.is_empty(), "{}", errors.join("\n"));
    eprintln!("{tag}: the slowest change showed after {worst:?}");
}

#[test]
fn changes_are_seen_within_the_attribute_timeout() {
    changes_are_seen("inval", &[], false);
}

#[test]
fn changes_are_seen_within_the_attribute_timeout_with_writeback_cache() {
    changes_are_seen("inval-wb", &["-o", "writeback"], true);
}

/// The client library's cache must not add its age to the kernel's: an attribute the
/// library fetched before A's change and handed to B's kernel later (here on a forced
/// fstatx, `stat --cached=never`) must not keep showing for a whole timeout after that.
/// B looks through an open file, so no expiring name entry refreshes the attributes.
#[test]
fn the_two_caches_of_a_mount_do_not_add_up() {
    let t = two("twice", &[]);
    let (a, b) = (&t.a, &t.b);
    fs::write(a.path("f"), b"data").unwrap();
    fs::set_permissions(a.path("f"), fs::Permissions::from_mode(0o644)).unwrap();
    // B's kernel and B's library both learn the attributes now.
    let fb = File::open(b.path("f")).unwrap();
    assert_eq!(fb.metadata().unwrap().mode() & 0o7777, 0o644);
    let learned = Instant::now();
    fs::set_permissions(a.path("f"), fs::Permissions::from_mode(0o600)).unwrap();
    let changed = Instant::now();
    // Most of a timeout later B's kernel asks its mount again.
    std::thread::sleep(ATTR_TIMEOUT.mul_f32(0.8).saturating_sub(learned.elapsed()));
    let forced = forced_mode(&fb);
    // Whatever that said, B sees the change within the timeout of the change (plus the
    // margin), not within the timeout of the kernel's asking.
    let r = within("mode after chmod", || {
        fb.metadata().unwrap().mode() & 0o7777 == 0o600
    });
    let since_change = changed.elapsed();
    eprintln!("forced fstatx saw {forced:o}; the change showed {since_change:?} after it");
    assert!(
        r.is_ok() && since_change <= ATTR_TIMEOUT + MARGIN,
        "B's forced fstatx saw mode {forced:o}; the change showed {since_change:?} after \
         it ({r:?})"
    );
}

/// After close (or fsync) returned on A, A's mount process is killed (-9): the server
/// has the data, as B and a fresh library client read it.
fn durable(tag: &str, opts: &[&str]) {
    let net = Net::new();
    let srv = Served::new(&net, tag, &[]);
    let b = RemoteMount::new(&net, &srv, &format!("{tag}-b"), opts);
    for (round, via_fsync) in [false, true, false, true].into_iter().enumerate() {
        let mut a = RemoteMount::new(&net, &srv, &format!("{tag}-a{round}"), opts);
        let name = format!("d{round}");
        let data = pattern(MIB + 7 + round * 4096, round as u64 + 10);
        let mut f = File::create(a.path(&name)).unwrap();
        f.write_all(&data).unwrap();
        // The file is kept open past the kill when fsync is what promises.
        let kept = if via_fsync {
            f.sync_all().unwrap();
            Some(f)
        } else {
            drop(f);
            None
        };
        a.stop(libc::SIGKILL);
        let got = fs::read(b.path(&name)).unwrap();
        assert!(
            got == data,
            "round {round} (after {}): B read {}",
            if via_fsync { "fsync" } else { "close" },
            describe(&got, &data)
        );
        let lib = net.in_cli(|| {
            use zcfs_backend::Backend;
            let fs = client(&net, Duration::from_secs(10));
            let e = fs.lookup(&ctx(), 1, name.as_bytes()).unwrap();
            let fh = fs.open(&ctx(), e.ino, libc::O_RDONLY).unwrap();
            let mut out = Vec::new();
            while out.len() < data.len() {
                let chunk = read_all(&fs, e.ino, fh, out.len() as u64, 1 << 20);
                if chunk.is_empty() {
                    break;
                }
                out.extend_from_slice(&chunk);
            }
            fs.release(e.ino, fh).unwrap();
            out
        });
        assert!(
            lib == data,
            "round {round}: the library read {}",
            describe(&lib, &data)
        );
        drop(kept);
        a.kill(libc::SIGKILL);
    }
}

#[test]
fn close_and_fsync_are_durable_when_the_mount_dies() {
    durable("durable", &[]);
}

#[test]
fn close_and_fsync_are_durable_when_the_mount_dies_with_writeback_cache() {
    durable("durable-wb", &["-o", "writeback"]);
}

/// Under the writeback cache the kernel fills a page a write covers only in part by
/// reading it, through whatever handle writes, a write-only one too: the mount opens
/// those for reading as well. Before, such a write failed with EBADF (the server's
/// handle was write-only).
#[test]
fn a_write_only_open_serves_the_writeback_caches_reads() {
    let net = Net::new();
    let srv = Served::new(&net, "wronly-wb", &[]);
    let a = RemoteMount::new(&net, &srv, "wronly-wb-a", &["-o", "writeback"]);
    let mut model = pattern(3 * 4096 + 5, 20);
    fs::write(a.path("f"), &model).unwrap();
    // A fresh mount: nothing of the file is in its page cache.
    let b = RemoteMount::new(&net, &srv, "wronly-wb-b", &["-o", "writeback"]);
    let f = OpenOptions::new().write(true).open(b.path("f")).unwrap();
    f.write_all_at(b"abc", 4096 + 100).unwrap();
    drop(f);
    model[4096 + 100..4096 + 103].copy_from_slice(b"abc");
    let got = fs::read(a.path("f")).unwrap();
    assert!(got == model, "A read {}", describe(&got, &model));
    drop(b);
    drop(a);
}
