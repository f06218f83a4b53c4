//! Review rv23 of two changes: a close's FLUSH (and fsync) sent behind the file's writes
//! in flight (7d4712e), and directories whose every name the client knows (protocol 11,
//! 53f5355). Findings as tests, and guards for properties found holding.
//! Root required (network namespaces), as in CI.

mod common;
use common::remote::*;
use std::time::Duration;
use zcfs_backend::{Backend, Ctx, ROOT};
use zcfs_client::RemoteFs;

fn lookup_errno(fs: &RemoteFs, ctx: &Ctx, dir: u64, name: &str) -> i32 {
    match fs.lookup(ctx, dir, name.as_bytes()) {
        Ok(a) => {
            fs.forget(a.ino, 1);
            0
        }
        Err(e) => e.errno,
    }
}

/// A caller the server refuses a lookup in a directory (it lacks search permission:
/// the owner or group class of the mode has no x, though "others" has) must get
/// EACCES, not a "no such name" answered by the client from what it knows of the
/// directory. The client took any directory with o+x as searchable by everyone; Linux
/// (and the server, perm.rs) judge the owner by the owner bits alone, and a group
/// member by the group bits. A mount without default_permissions (the default) hands
/// the caller the client's answer.
#[test]
fn a_caller_without_search_permission_gets_eacces_not_a_known_absence() {
    let net = Net::new();
    let srv = Served::new(&net, "rv23-perm", &[]);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let truth = srv.client(&net, Duration::from_secs(10));
        let owner = ctx();
        // A member of the directory's group (1000), not its owner.
        let member = Ctx::user(2000, 1000);
        for (name, mode, who, whom) in [
            ("owner-no-x", 0o601, &owner, "the owner"),
            ("group-no-x", 0o761, &member, "a group member"),
        ] {
            let d = a.mkdir(&owner, ROOT, name.as_bytes(), mode).unwrap();
            assert_eq!(d.mode & 0o7777, mode, "{name}: made with the mode asked");
            let server_says = lookup_errno(&truth, who, d.ino, "absent");
            assert_eq!(server_says, libc::EACCES, "{name}: the server's answer");
            let before = a.lookups_answered_here();
            let client_says = lookup_errno(&a, who, d.ino, "absent");
            assert_eq!(
                client_says,
                server_says,
                "{name}: {whom}'s lookup in a directory it may not search was answered \
                 {} by the client ({} answered here)",
                zcfs_backend::errno_name(client_says),
                a.lookups_answered_here() - before
            );
        }
    });
}

/// What a client knows of a directory's names is keyed by inode number: once the
/// directory is gone (another client removed it, our kernel forgot it) the number is
/// reused by the next inode made, and a new directory there (another generation)
/// was taken as the known one: a name in it reported absent to a client that never
/// saw anything of that directory.
#[test]
fn a_new_directory_on_a_reused_inode_number_is_not_taken_as_known() {
    let net = Net::new();
    let srv = Served::new(&net, "rv23-reuse", &[]);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let b = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let d = a.mkdir(&c, ROOT, b"d", 0o755).unwrap();
        // Our kernel forgets it (its dentry evicted): the server may free the number.
        a.forget(d.ino, 1);
        let t = std::time::Instant::now();
        while a.client().posted_unanswered() > 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "forget never answered"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Another client removes it and makes a directory with a file in it.
        b.rmdir(&c, ROOT, b"d").unwrap();
        let x = b.mkdir(&c, ROOT, b"x", 0o755).unwrap();
        let (f, fh) = b
            .create(&c, x.ino, b"f", libc::S_IFREG | 0o644, libc::O_WRONLY)
            .unwrap();
        b.release(f.ino, fh).unwrap();
        assert_eq!(
            x.ino, d.ino,
            "the inode number was not reused: nothing to show"
        );
        assert_ne!(x.generation, d.generation);
        // Our kernel finds x and looks up f in it.
        let xa = a.lookup(&c, ROOT, b"x").unwrap();
        assert_eq!((xa.ino, xa.generation), (x.ino, x.generation));
        assert_eq!(
            lookup_errno(&a, &c, xa.ino, "f"),
            0,
            "a name in a directory this client never knew reported absent (taken for \
             the removed directory whose inode number it reuses)"
        );
    });
}

/// What is known of a directory stops counting the attribute timeout after its last
/// confirmation, but stays held: once KNOWN_DIRS_MAX (1024) directories were made here
/// (one `tar x` or `git clone` of a larger tree), no directory made afterwards was ever
/// known again for the life of the mount, and the memory of the expired ones (up to
/// KNOWN_NAMES_MAX names each) was never given back. Expired knowledge must make room.
#[test]
fn expired_knowledge_makes_room_for_directories_made_later() {
    const KNOWN_DIRS_MAX: usize = 1024;
    let net = Net::new();
    let srv = Served::new(&net, "rv23-bound", &[]);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let c = ctx();
        let top = a.mkdir(&c, ROOT, b"top", 0o755).unwrap();
        for i in 0..KNOWN_DIRS_MAX {
            let d = a
                .mkdir(&c, top.ino, format!("d{i}").as_bytes(), 0o755)
                .unwrap();
            a.forget(d.ino, 1);
        }
        // Everything known so far is past the attribute timeout (1 s).
        std::thread::sleep(Duration::from_millis(1500));
        let late = a.mkdir(&c, ROOT, b"late", 0o755).unwrap();
        let before = a.lookups_answered_here();
        assert_eq!(lookup_errno(&a, &c, late.ino, "new"), libc::ENOENT);
        assert_eq!(
            a.lookups_answered_here(),
            before + 1,
            "a directory made after {KNOWN_DIRS_MAX} others (all expired) is not known"
        );
    });
}

/// Guard (7d4712e): a close's FLUSH and an fsync go out behind the file's writes while
/// the inode's queue is locked, on the newest write's connection, so they need a slot
/// of that connection while other writers hold slots with their writes in flight. With
/// the fewest slots a server may give (2 and 3: write-behind then holds at most one
/// reply), 12 threads writing and closing (and fsyncing) files at once all finish
/// within a bound, every file is whole, and no reply is held afterwards.
#[test]
fn flushes_behind_writes_with_the_fewest_slots_finish() {
    const THREADS: u64 = 12;
    const FILES: u64 = 12;
    // Above the bound of writes committed before their replies: their closes and
    // fsyncs send a FLUSH or FSYNC behind them.
    const CHUNK: usize = zcfs_client::COMMIT_WRITE_MAX + (16 << 10);
    for slots in ["2", "3"] {
        let net = Net::new();
        let srv = Served::new(
            &net,
            &format!("rv23-slots{slots}"),
            &["--max-inflight", slots],
        );
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::scope(|s| {
                for t in 0..THREADS {
                    let (fs, tx) = (&fs, tx.clone());
                    s.spawn(move || {
                        let c = ctx();
                        for i in 0..FILES {
                            let name = format!("t{t}f{i}");
                            let (f, fh) = create_file(fs, &name, libc::O_RDWR);
                            for w in 0..3u64 {
                                let buf = vec![(t * 13 + i * 3 + w) as u8; CHUNK];
                                let n = fs.write_behind(&c, f.ino, fh, w * CHUNK as u64, &buf);
                                assert_eq!(n.unwrap(), CHUNK as u32);
                                if w == 1 {
                                    fs.fsync(f.ino, fh, i % 2 == 0).unwrap();
                                }
                            }
                            fs.flush(f.ino, fh).unwrap();
                            for w in 0..3u64 {
                                let want = vec![(t * 13 + i * 3 + w) as u8; CHUNK];
                                let got = read_all(fs, f.ino, fh, w * CHUNK as u64, CHUNK as u32);
                                assert!(got == want, "{name} piece {w}");
                            }
                            fs.release(f.ino, fh).unwrap();
                            fs.forget(f.ino, 1);
                        }
                        tx.send(t).unwrap();
                    });
                }
                drop(tx);
                for _ in 0..THREADS {
                    rx.recv_timeout(Duration::from_secs(120))
                        .expect("writers stuck: a flush behind the writes never got a slot?");
                }
            });
            assert_eq!(fs.write_behind_held(), 0, "{slots} slots: replies held");
            assert!(
                fs.flushes_sent_behind() > 0,
                "{slots} slots: no flush went behind"
            );
        });
    }
}

/// Guard (7d4712e): writes in flight and the close's FLUSH sent behind them on a
/// connection whose link is cut (the requests sit in the socket's queue): the close
/// reports an error (the writes' replies never came), never 0.
#[test]
fn a_flush_behind_writes_on_a_cut_link_is_not_durable() {
    let net = Net::new();
    let srv = Served::new(&net, "rv23-cut", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(2));
        let c = ctx();
        let (f, fh) = create_file(&fs, "f", libc::O_RDWR);
        fs.fsync(f.ino, fh, false).unwrap();
        net.link(false);
        let piece = vec![9u8; 4096];
        for i in 0..3u64 {
            assert_eq!(
                fs.write_behind(&c, f.ino, fh, i * 4096, &piece).unwrap(),
                4096
            );
        }
        let r = fs.flush(f.ino, fh);
        net.link(true);
        assert!(
            r.is_err(),
            "a close said 0 while its writes were stuck on a cut link"
        );
        let _ = fs.release(f.ino, fh);
    });
}
