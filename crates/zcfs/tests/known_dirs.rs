//! Lookups answered by the client from what it knows of a directory's names (a
//! directory it made, followed through its own changes by the server's name-set
//! versions): answered without a round trip while nothing else changed the directory,
//! and never past the attribute timeout wrong about another client's change.
//! Root required (network namespaces), as in CI.

mod common;
use common::remote::*;
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};
use zcfs_client::RemoteFs;

/// The client's attribute timeout (ClientConfig's default).
const TTL: Duration = Duration::from_secs(1);
/// Slack for scheduling on a loaded machine.
const MARGIN: Duration = Duration::from_millis(500);

fn mkdir(fs: &RemoteFs, parent: u64, name: &str) -> u64 {
    fs.mkdir(&ctx(), parent, name.as_bytes(), 0o755)
        .unwrap()
        .ino
}

fn create(fs: &RemoteFs, dir: u64, name: &str) -> zcfs_backend::Result<()> {
    let (a, fh) = fs.create(
        &ctx(),
        dir,
        name.as_bytes(),
        libc::S_IFREG | 0o644,
        libc::O_WRONLY | libc::O_EXCL,
    )?;
    fs.release(a.ino, fh)?;
    fs.forget(a.ino, 1);
    Ok(())
}

fn found(fs: &RemoteFs, dir: u64, name: &str) -> bool {
    match fs.lookup(&ctx(), dir, name.as_bytes()) {
        Ok(a) => {
            fs.forget(a.ino, 1);
            true
        }
        Err(e) if e.errno == libc::ENOENT => false,
        Err(e) => panic!("lookup {name}: {e:?}"),
    }
}

/// The kernel's pattern for a new file (LOOKUP, then CREATE) in a directory made here:
/// every lookup is answered here, and names made are found.
#[test]
fn lookups_of_new_names_in_a_directory_made_here_are_answered_here() {
    let net = Net::new();
    let srv = Served::new(&net, "known-new", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(10));
        let d = mkdir(&fs, ROOT, "d");
        let sub = mkdir(&fs, d, "sub");
        for i in 0..200 {
            let n = format!("f{i}");
            assert!(!found(&fs, d, &n));
            create(&fs, d, &n).unwrap();
        }
        assert_eq!(fs.lookups_answered_here(), 200);
        // Names there are asked for, and found; removed ones are absent again.
        assert!(found(&fs, d, "f7") && found(&fs, d, "sub"));
        fs.unlink(&ctx(), d, b"f7").unwrap();
        let before = fs.lookups_answered_here();
        assert!(!found(&fs, d, "f7"));
        assert_eq!(fs.lookups_answered_here(), before + 1);
        // ".." is never taken as absent (the server answers it).
        let before = fs.lookups_answered_here();
        let _ = fs.lookup(&ctx(), sub, b"..");
        assert_eq!(fs.lookups_answered_here(), before);
    });
}

/// Another client's new name: the next change here in that directory sees the version
/// jump and forgets what it knew, so the name is found at once; without a change here
/// it is found within the attribute timeout.
#[test]
fn another_clients_name_is_found_after_our_next_change_or_within_the_timeout() {
    let net = Net::new();
    let srv = Served::new(&net, "known-other", &[]);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let b = srv.client(&net, Duration::from_secs(10));
        // Our change after theirs.
        let d = mkdir(&a, ROOT, "d1");
        create(&b, d, "theirs").unwrap();
        create(&a, d, "ours").unwrap();
        assert!(
            found(&a, d, "theirs"),
            "known names kept past another's change"
        );
        // No change of ours: seen within the timeout of the last confirmation.
        let d2 = mkdir(&a, ROOT, "d2");
        let t = Instant::now();
        create(&b, d2, "theirs").unwrap();
        while !found(&a, d2, "theirs") {
            assert!(
                t.elapsed() < TTL + MARGIN,
                "another client's name unseen after {:?}",
                t.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    });
}

/// A name taken as absent here but made by another client meanwhile: our create of it
/// fails as it exists (the server decides), and the name is found right after.
#[test]
fn an_exclusive_create_of_a_name_another_client_made_fails_and_forgets() {
    let net = Net::new();
    let srv = Served::new(&net, "known-excl", &[]);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let b = srv.client(&net, Duration::from_secs(10));
        let d = mkdir(&a, ROOT, "d");
        create(&b, d, "x").unwrap();
        let e = create(&a, d, "x").unwrap_err();
        assert_eq!(e.errno, libc::EEXIST);
        assert!(found(&a, d, "x"));
    });
}

/// Two clients make and remove names in one directory at once, each through its own
/// knowledge. Afterwards each makes one more name (its version check then sees the
/// other's changes) and must find every name the server has and none it lacks.
#[test]
fn two_clients_changing_one_directory_end_with_the_servers_names() {
    const NAMES: usize = 150;
    let net = Net::new();
    let srv = Served::new(&net, "known-race", &[]);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let b = srv.client(&net, Duration::from_secs(10));
        // `d` is known to a (it made it), `e` to b; both work in both.
        let d = mkdir(&a, ROOT, "d");
        let e = mkdir(&b, d, "e");
        let work = |fs: &RemoteFs, tag: &str| {
            for i in 0..NAMES {
                for dir in [d, e] {
                    let n = format!("{tag}{i}");
                    if !found(fs, dir, &n) {
                        create(fs, dir, &n).unwrap();
                    }
                    if i % 3 == 0 {
                        let old = format!("{tag}{}", i / 2);
                        let _ = fs.unlink(&ctx(), dir, old.as_bytes());
                    }
                }
            }
        };
        std::thread::scope(|s| {
            s.spawn(|| work(&a, "a"));
            s.spawn(|| work(&b, "b"));
        });
        let fresh = srv.client(&net, Duration::from_secs(10));
        for fs in [&a, &b] {
            for dir in [d, e] {
                create(
                    fs,
                    dir,
                    if std::ptr::eq(fs, &a) {
                        "a-last"
                    } else {
                        "b-last"
                    },
                )
                .unwrap();
            }
        }
        for dir in [d, e] {
            for tag in ["a", "b"] {
                for i in 0..NAMES {
                    let n = format!("{tag}{i}");
                    let truth = found(&fresh, dir, &n);
                    for (who, fs) in [("a", &a), ("b", &b)] {
                        assert_eq!(
                            found(fs, dir, &n),
                            truth,
                            "client {who} on {n} in dir {dir}: the server says {truth}"
                        );
                    }
                }
            }
        }
    });
}
