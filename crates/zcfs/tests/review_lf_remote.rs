//! Review of protocol 10 (directory attributes in replies) and the leader/follower
//! reply reading, against a real server across a veth pair.

mod common;
use common::remote::*;
use std::sync::Barrier;
use std::time::Duration;
use zcfs_backend::{Backend, ROOT};
use zcfs_client::{ClientConfig, RemoteFs};

/// A client that caches nothing: what the server holds now.
fn uncached(net: &Net) -> RemoteFs {
    let mut cfg = ClientConfig::new(&net.addr());
    cfg.secret = Some(SECRET.to_vec());
    cfg.timeout = Duration::from_secs(5);
    cfg.attr_ttl = Duration::ZERO;
    RemoteFs::connect(cfg).unwrap()
}

const ACL: &[u8] = b"system.posix_acl_access";

/// An access ACL: owner rwx, user 1002 nothing, group r-x, mask r-x, other r-x.
fn acl() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 0, 1002),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 5, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Thread A makes entries in directory D while thread B changes D with an operation
/// that only drops D's cached attributes before its request (setxattr, rename). When
/// A's request runs on the server first but its reply is handled after B dropped the
/// cache, the old post-operation attributes A's reply carries are cached as current
/// (nothing newer is cached to compare ctimes with): the client then answers stale
/// attributes of D for the whole attribute timeout, including `no_xattrs` (so the
/// client says D has no ACL after one was set).
fn race(b_op: &str) -> Vec<String> {
    let net = Net::new();
    let _srv = Served::new(&net, &format!("dirrace-{b_op}"), &[]);
    net.in_cli(|| {
        let mut cfg = ClientConfig::new(&net.addr());
        cfg.secret = Some(SECRET.to_vec());
        cfg.timeout = Duration::from_secs(5);
        // Long enough to compare after each round.
        cfg.attr_ttl = Duration::from_secs(30);
        let fs = RemoteFs::connect(cfg).unwrap();
        let truth = uncached(&net);
        let c = ctx();
        let mut stale = Vec::new();
        for round in 0..300u32 {
            let d = fs
                .mkdir(&c, ROOT, format!("d{round}").as_bytes(), 0o777)
                .unwrap();
            let (f, fh) = fs
                .create(&c, d.ino, b"x", libc::S_IFREG | 0o644, libc::O_RDWR)
                .unwrap();
            fs.release(f.ino, fh).unwrap();
            let bar = Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    bar.wait();
                    drop(fs.mkdir(&ctx(), d.ino, b"a", 0o755));
                });
                bar.wait();
                // Vary the interleaving: B starts up to a round trip later.
                let t0 = std::time::Instant::now();
                let lag = Duration::from_micros(u64::from(round % 10) * 30);
                while t0.elapsed() < lag {
                    std::hint::spin_loop();
                }
                match b_op {
                    "setxattr" => fs.setxattr(&ctx(), d.ino, ACL, &acl(), 0).unwrap(),
                    _ => drop(fs.rename(&ctx(), d.ino, b"x", d.ino, b"y", 0).unwrap()),
                }
            });
            let known = fs.getattr(d.ino).unwrap();
            let now = truth.getattr(d.ino).unwrap();
            if b_op == "setxattr" {
                if let Err(e) = fs.getxattr(&ctx(), d.ino, ACL) {
                    stale.push(format!("round {round}: the ACL just set is answered {e:?}"));
                }
            }
            if known != now {
                stale.push(format!(
                    "round {round}: cached ctime {:?} no_xattrs {} vs server ctime {:?} no_xattrs {}",
                    known.ctime, known.no_xattrs, now.ctime, now.no_xattrs
                ));
            }
        }
        stale
    })
}

#[test]
fn a_directorys_attributes_from_a_reply_do_not_outlive_a_concurrent_setxattr() {
    let stale = race("setxattr");
    assert!(
        stale.is_empty(),
        "{} stale rounds:\n{}",
        stale.len(),
        stale.join("\n")
    );
}

#[test]
fn a_directorys_attributes_from_a_reply_do_not_outlive_a_concurrent_rename() {
    let stale = race("rename");
    assert!(
        stale.is_empty(),
        "{} stale rounds:\n{}",
        stale.len(),
        stale.join("\n")
    );
}

/// Pipelined writes (submitted, waited a little later, as `zcfs cp` and write-behind
/// do) from two threads on one connection of a real server: none may wait for its
/// timeout. A caller that finds its channel empty and then takes the reader may lead
/// for a reply that was handed to its channel in between: it times out with the reply
/// in its channel (the write was done), and the connection breaks for everyone.
#[test]
fn pipelined_writes_waited_later_never_time_out() {
    let net = Net::new();
    let srv = Served::new(&net, "lf-pipe", &[]);
    let slow = std::sync::Mutex::new(Vec::new());
    net.in_cli(|| {
        let mut cfg = ClientConfig::new(&net.addr());
        cfg.secret = Some(SECRET.to_vec());
        cfg.timeout = Duration::from_secs(2);
        cfg.connections = 1;
        let fs = RemoteFs::connect(cfg).unwrap();
        let (f, fh) = fs
            .create(&ctx(), ROOT, b"p", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        let buf = vec![7u8; 4096];
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let (fs, buf, slow) = (&fs, &buf, &slow);
                s.spawn(move || {
                    let end = std::time::Instant::now() + Duration::from_secs(15);
                    let mut i = 0u64;
                    while std::time::Instant::now() < end && slow.lock().unwrap().is_empty() {
                        let t0 = std::time::Instant::now();
                        let w = fs.submit_write(&ctx(), f.ino, fh, (t * 64 + i % 64) * 4096, buf);
                        let w = match w {
                            Ok(w) => w,
                            Err(e) => {
                                slow.lock().unwrap().push(format!("submit {e:?}"));
                                break;
                            }
                        };
                        let lag = Duration::from_nanos(rand::random::<u64>() % 150_000);
                        while t0.elapsed() < lag {
                            std::hint::spin_loop();
                        }
                        let r = w.wait();
                        if r.is_err() || t0.elapsed() > Duration::from_secs(1) {
                            slow.lock().unwrap().push(format!(
                                "write {i} of thread {t}: {:?} after {:?}",
                                r,
                                t0.elapsed()
                            ));
                        }
                        i += 1;
                    }
                });
            }
        });
    });
    drop(srv);
    let slow = slow.into_inner().unwrap();
    assert!(slow.is_empty(), "{slow:?}");
}
