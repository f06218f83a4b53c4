//! The server and client over 127.0.0.1, runnable by any user: invalid requests are
//! answered (not dropped), handles belong to one client's session and outlive its
//! connections only by the grace period, generations catch reused inode numbers, a
//! stalled peer delays no one, caches follow link/unlink, references are given back.

mod common;
use common::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_backend::null::NullFs;
use zcfs_backend::{Backend, ROOT};
use zcfs_protocol::*;
use zcfs_server::ServerConfig;

const MIB: usize = 1 << 20;

fn attr_of(r: &RawReply) -> zcfs_backend::Attr {
    assert_eq!(r.status, 0);
    AttrReply::decode(&r.body).unwrap().attr
}

/// A lookup body with a name of `len` bytes (the typed API refuses to build one over
/// the limit).
fn lookup_body(len: usize) -> Vec<u8> {
    let mut b = NodeRef::ino(ROOT).encode();
    (len as u16).put(&mut b);
    b.extend(std::iter::repeat_n(b'n', len));
    b
}

#[test]
fn an_invalid_body_is_answered_and_the_same_connection_goes_on() {
    let backends: [Arc<dyn Backend>; 2] = [memory_fs(64 * MIB), Arc::new(NullFs::default())];
    for backend in backends {
        let srv = Running::start(backend, config());
        let mut raw = srv.raw(1);
        let body = lookup_body(300);
        let h = ReqHeader::new(Op::Lookup, 5, body.len() as u32, 0, Cred::default());
        assert_eq!(raw.call_raw(h, &body, &[]).status, libc::ENAMETOOLONG);
        // The same connection answers the next request.
        let root = attr_of(&raw.call(GetattrReq {
            node: NodeRef::ino(ROOT),
        }));
        assert!(root.is_dir());
        // A write whose body is invalid (offset beyond 2^63): EINVAL, its payload
        // skipped, the stream in step.
        let mut body = WriteReq {
            node: NodeRef::ino(ROOT),
            fh: 0,
            offset: 0,
            size: 4096,
            commit: false,
        }
        .encode();
        body[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let h = ReqHeader::new(Op::Write, 6, body.len() as u32, 4096, Cred::default());
        assert_eq!(raw.call_raw(h, &body, &[7u8; 4096]).status, libc::EINVAL);
        assert_eq!(raw.call(PingReq {}).status, 0);
        let r = srv.report();
        assert_eq!((r.rejected_invalid, r.rejected_malformed), (2, 0));
        assert_eq!(r.connections_active, 1, "nothing was dropped");
    }
}

#[test]
fn remote_fs_refuses_what_the_protocol_cannot_carry_without_sending() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let c = ctx();
    let long = vec![b'x'; MAX_NAME + 1];
    let (f, fh) = file(&fs, b"f");
    let sent = fs.client().bytes_sent.load(Ordering::Relaxed);
    let errno = |r: zcfs_backend::Result<()>| r.unwrap_err().errno;
    let e = libc::ENAMETOOLONG;
    assert_eq!(errno(fs.lookup(&c, ROOT, &long).map(drop)), e);
    assert_eq!(errno(fs.mkdir(&c, ROOT, &long, 0o755).map(drop)), e);
    assert_eq!(
        errno(fs.mknod(&c, ROOT, &long, libc::S_IFREG, 0).map(drop)),
        e
    );
    assert_eq!(
        errno(fs.create(&c, ROOT, &long, libc::S_IFREG, 0).map(drop)),
        e
    );
    assert_eq!(errno(fs.symlink(&c, ROOT, &long, b"t").map(drop)), e);
    assert_eq!(
        errno(
            fs.symlink(&c, ROOT, b"s", &vec![b't'; MAX_SYMLINK + 1])
                .map(drop)
        ),
        e
    );
    assert_eq!(errno(fs.unlink(&c, ROOT, &long).map(drop)), e);
    assert_eq!(errno(fs.rmdir(&c, ROOT, &long).map(drop)), e);
    assert_eq!(
        errno(fs.rename(&c, ROOT, b"f", ROOT, &long, 0).map(drop)),
        e
    );
    assert_eq!(
        errno(fs.rename(&c, ROOT, &long, ROOT, b"g", 0).map(drop)),
        e
    );
    assert_eq!(errno(fs.link(&c, f.ino, ROOT, &long).map(drop)), e);
    let xlong = vec![b'u'; MAX_XATTR_NAME + 1];
    assert_eq!(
        errno(fs.setxattr(&ctx(), f.ino, &xlong, b"v", 0)),
        libc::ERANGE
    );
    assert_eq!(
        errno(fs.getxattr(&ctx(), f.ino, &xlong).map(drop)),
        libc::ERANGE
    );
    assert_eq!(errno(fs.removexattr(&ctx(), f.ino, &xlong)), libc::ERANGE);
    assert_eq!(
        errno(fs.setxattr(&ctx(), f.ino, b"user.k", &vec![0; MAX_XATTR_VALUE + 1], 0)),
        libc::E2BIG
    );
    assert_eq!(
        fs.client().bytes_sent.load(Ordering::Relaxed),
        sent,
        "nothing was sent"
    );
    // At the bound, everything goes through.
    let name = vec![b'y'; MAX_NAME];
    fs.link(&c, f.ino, ROOT, &name).unwrap();
    assert_eq!(fs.lookup(&c, ROOT, &name).unwrap().ino, f.ino);
    fs.symlink(&c, ROOT, b"s", &vec![b't'; MAX_SYMLINK])
        .unwrap();
    fs.release(f.ino, fh).unwrap();
}

#[test]
fn a_client_cannot_release_or_use_another_clients_handle() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let a = srv.client();
    let (f, fh) = file(&a, b"f");
    let data: Vec<u8> = (0..MIB as u32).map(|i| (i * 13) as u8).collect();
    a.write(&ctx(), f.ino, fh, 0, &data).unwrap();
    a.unlink(&ctx(), ROOT, b"f").unwrap();
    let bfree_open = a.statfs().unwrap().bfree;
    // B names A's handles (a session numbers its handles from 1) and no handle.
    let mut b = srv.raw(0xb);
    let node = NodeRef::ino(f.ino);
    for fh in 0..4 {
        assert_eq!(
            b.call(ReleaseReq { node, fh }).status,
            libc::EBADF,
            "fh {fh}"
        );
    }
    for fh in 1..4 {
        let read = ReadReq {
            node,
            fh,
            offset: 0,
            size: 10,
        };
        assert_eq!(b.call(read).status, libc::EBADF);
        let write = WriteReq {
            node,
            fh,
            offset: 0,
            size: 3,
            commit: false,
        };
        assert_eq!(b.call_with(write, b"abc").status, libc::EBADF);
        assert_eq!(
            b.call(FsyncReq {
                node,
                fh,
                datasync: false
            })
            .status,
            libc::EBADF
        );
    }
    // A's unlinked file is intact and still holds its blocks.
    assert_eq!(read_all(&a, f.ino, fh, 0, MIB as u32).unwrap(), data);
    assert_eq!(a.statfs().unwrap().bfree, bfree_open);
    // A handle of A's own, named with another inode, is refused too.
    let (g, gh) = file(&a, b"g");
    let mut a_raw = srv.raw(a.client().session());
    assert_eq!(
        a_raw
            .call(ReleaseReq {
                node: NodeRef::ino(g.ino),
                fh: 1
            })
            .status,
        libc::EBADF
    );
    a.release(g.ino, gh).unwrap();
    // A's own release (and its reference given back) frees the file.
    a.release(f.ino, fh).unwrap();
    a.forget(f.ino, 1);
    eventually(Duration::from_secs(5), "f freed", || {
        a.statfs().unwrap().bfree >= bfree_open + (MIB / 4096) as u64
    });
}

/// A file of `fs`'s, written, unlinked and left open: it holds 1 MiB until released.
fn orphan(fs: &dyn Backend, name: &[u8]) -> (u64, u64) {
    let (f, fh) = file(fs, name);
    fs.write(&ctx(), f.ino, fh, 0, &vec![0x77; MIB]).unwrap();
    fs.unlink(&ctx(), ROOT, name).unwrap();
    (f.ino, fh)
}

#[test]
fn handles_outlive_lost_connections_by_the_grace_period_only() {
    let grace = Duration::from_millis(800);
    let srv = Running::start(memory_fs(64 * MIB), ServerConfig { grace, ..config() });
    let observer = srv.client();
    let bfree = || observer.statfs().unwrap().bfree;
    // The root directory's first block, allocated once for its first entry.
    let (w, wh) = file(&observer, b"warm-up");
    observer.release(w.ino, wh).unwrap();
    observer.unlink(&ctx(), ROOT, b"warm-up").unwrap();
    let free0 = bfree();

    // A's connections die: after the grace period its open file is released.
    let a = srv.client();
    orphan(&a, b"a");
    let held = bfree();
    assert!(held <= free0 - (MIB / 4096) as u64);
    drop(a);
    eventually(Duration::from_secs(5), "A's session in grace", || {
        srv.report().sessions_in_grace == 1
    });
    std::thread::sleep(grace / 3);
    assert_eq!(bfree(), held, "still held within the grace period");
    eventually(grace * 10, "A's file released after grace", || {
        bfree() == free0
    });
    let r = srv.report();
    assert_eq!(
        (r.sessions_expired, r.expired_handles, r.sessions_in_grace),
        (1, 1, 0)
    );

    // B comes back within the grace period: its session is resumed, its handle works.
    let b = srv.client();
    let (ino, fh) = orphan(&b, b"b");
    let held = bfree();
    b.client().disconnect();
    std::thread::sleep(grace / 4);
    assert_eq!(read_all(&b, ino, fh, 0, 10).unwrap(), vec![0x77; 10]);
    assert!(b.client().resumed.load(Ordering::Relaxed) >= 1);
    assert_eq!(b.client().revalidations.load(Ordering::Relaxed), 0);
    std::thread::sleep(grace * 2);
    assert_eq!(bfree(), held, "a resumed session keeps its handles");
    assert_eq!(read_all(&b, ino, fh, 0, 10).unwrap(), vec![0x77; 10]);
    b.release(ino, fh).unwrap();
    b.forget(ino, 1);
    eventually(Duration::from_secs(5), "b freed", || bfree() == free0);
    assert_eq!(srv.report().sessions_expired, 1);
}

#[test]
fn a_stale_generation_gets_estale() {
    let grace = Duration::from_millis(300);
    let srv = Running::start(memory_fs(64 * MIB), ServerConfig { grace, ..config() });
    let fs = srv.client();
    let root = fs.getattr(ROOT).unwrap();
    let mut raw = srv.raw(9);
    let getattr = |raw: &mut Raw, ino, gen| {
        raw.call(GetattrReq {
            node: NodeRef::new(ino, gen),
        })
        .status
    };
    assert_eq!(getattr(&mut raw, ROOT, root.generation), 0);
    assert_eq!(getattr(&mut raw, ROOT, 0), 0, "0 is not checked");
    assert_eq!(getattr(&mut raw, ROOT, root.generation + 1), libc::ESTALE);
    assert_eq!(getattr(&mut raw, 200, 7), libc::ESTALE, "no such inode");
    // Without a generation, what a free number gives is the backend's answer.
    assert!([libc::ENOENT, libc::ESTALE].contains(&getattr(&mut raw, 200, 0)));

    // A number reused by a new file: every request naming the old generation is stale.
    let (a, ah) = file(&fs, b"a");
    fs.release(a.ino, ah).unwrap();
    fs.unlink(&ctx(), ROOT, b"a").unwrap();
    fs.forget(a.ino, 1);
    eventually(Duration::from_secs(5), "a forgotten", || {
        srv.report().references_held == 0
    });
    let (b, bh) = file(&fs, b"b");
    fs.write(&ctx(), b.ino, bh, 0, b"new file").unwrap();
    assert_eq!(
        b.ino, a.ino,
        "the volume reuses the lowest free inode number"
    );
    assert_ne!(b.generation, a.generation);
    let old = NodeRef::new(a.ino, a.generation);
    let stale = [
        raw.call(GetattrReq { node: old }),
        raw.call(SetattrReq {
            node: old,
            set: zcfs_backend::SetAttr {
                size: Some(0),
                ..Default::default()
            },
            fh: 0,
            commit: false,
        }),
        raw.call(OpenReq {
            node: old,
            flags: libc::O_RDWR,
        }),
        raw.call(ReadReq {
            node: old,
            fh: 0,
            offset: 0,
            size: 8,
        }),
        raw.call_with(
            WriteReq {
                node: old,
                fh: 0,
                offset: 0,
                size: 3,
                commit: false,
            },
            b"old",
        ),
        raw.call(LinkReq {
            node: old,
            new_parent: NodeRef::ino(ROOT),
            new_name: Name::new("c").unwrap(),
        }),
        raw.call(SetxattrReq {
            node: old,
            name: XattrName::new("user.k").unwrap(),
            value: XattrValue::new("v").unwrap(),
            flags: 0,
        }),
        raw.call(LookupReq {
            parent: NodeRef::new(ROOT, root.generation + 1),
            name: LookupName::new("b").unwrap(),
        }),
    ];
    for (i, r) in stale.iter().enumerate() {
        assert_eq!(r.status, libc::ESTALE, "request {i}");
    }
    assert_eq!(read_all(&fs, b.ino, bh, 0, 100).unwrap(), b"new file");
    assert_eq!(fs.getattr(b.ino).unwrap().size, 8);

    // A client whose session expired while the number was reused: its next request
    // with the old generation is stale, and its re-opened handle too.
    // (Without an attribute cache: a cached answer would not reach the server.)
    let c = srv.client_with(|c| c.attr_ttl = Duration::ZERO);
    let (x, xh) = file(&c, b"x");
    c.client().disconnect();
    eventually(grace * 20, "C's session released", || {
        srv.report().sessions_expired == 1
    });
    fs.unlink(&ctx(), ROOT, b"x").unwrap();
    let (y, yh) = file(&fs, b"y");
    assert_eq!(y.ino, x.ino);
    assert_eq!(c.getattr(x.ino).unwrap_err().errno, libc::ESTALE);
    assert_eq!(c.client().revalidations.load(Ordering::Relaxed), 1);
    assert_eq!(
        read_all(&c, x.ino, xh, 0, 10).unwrap_err().errno,
        libc::ESTALE
    );
    // Learning the new file's generation makes the number usable again.
    assert_eq!(
        c.lookup(&ctx(), ROOT, b"y").unwrap().generation,
        y.generation
    );
    assert_eq!(c.getattr(x.ino).unwrap().generation, y.generation);
    fs.release(y.ino, yh).unwrap();
    fs.release(b.ino, bh).unwrap();
}

/// One peer asks for 16 MiB twice and never reads; another keeps working meanwhile, and
/// the stalled one is dropped after the peer timeout.
fn stalled_reader_delays_no_one(backend: Arc<dyn Backend>, big: u64, other: u64) {
    let peer_timeout = Duration::from_secs(2);
    let srv = Running::start(
        backend,
        ServerConfig {
            peer_timeout,
            ..config()
        },
    );
    // A small receive window, so the server's send blocks soon.
    let mut stalled = Raw::connect_small_window(srv.addr(), 0x5, 16 << 10);
    for id in [100, 101] {
        let (h, body) = Request::from(ReadReq {
            node: NodeRef::ino(big),
            fh: 0,
            offset: 0,
            size: MAX_DATA as u32,
        })
        .encode(id, Cred::default());
        stalled.send(&h, &body, &[]);
    }
    let fs = srv.client();
    // Let the server fill the socket buffers and block in its send.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 0..20u64 {
        let t = Instant::now();
        fs.getattr(other).unwrap();
        assert_eq!(
            fs.write(&ctx(), other, 0, i * 4096, &[i as u8; 4096])
                .unwrap(),
            4096
        );
        assert_eq!(fs.statfs().unwrap().bsize, 4096);
        worst = worst.max(t.elapsed());
    }
    assert!(
        started.elapsed() < peer_timeout,
        "the work overlapped the stall"
    );
    assert_eq!(srv.report().dropped_stalled, 0, "still stalled meanwhile");
    assert!(
        worst < Duration::from_secs(1),
        "an operation took {worst:?}"
    );
    // The drop is counted before the connection gives its slot back (the caller
    // does): wait for both rather than read one right after the other.
    let connections = fs.client().config().connections;
    eventually(peer_timeout * 5, "the stalled peer dropped", || {
        let r = srv.report();
        r.dropped_stalled == 1 && r.connections_active == connections
    });
    fs.getattr(other).unwrap();
    drop(stalled);
}

#[test]
fn a_stalled_reader_delays_no_one_and_is_dropped() {
    let null = NullFs::default();
    let big = null.lookup(&ctx(), ROOT, b"big").unwrap().ino;
    let other = null.lookup(&ctx(), ROOT, b"other").unwrap().ino;
    stalled_reader_delays_no_one(Arc::new(null), big, other);
}

#[test]
fn a_stalled_reader_of_a_volume_delays_no_one_and_is_dropped() {
    let vol = memory_fs(64 * MIB);
    let (big, bh) = file(&*vol, b"big");
    vol.write(&ctx(), big.ino, bh, 0, &vec![1u8; MAX_DATA])
        .unwrap();
    let (other, oh) = file(&*vol, b"other");
    stalled_reader_delays_no_one(vol.clone(), big.ino, other.ino);
    vol.release(big.ino, bh).unwrap();
    vol.release(other.ino, oh).unwrap();
}

#[test]
fn link_and_unlink_change_the_cached_attributes_at_once() {
    let fs = memory_fs(64 * MIB);
    let srv = Running::start(fs.clone(), config());
    let a = srv.client();
    let b = srv.client();
    let uncached = srv.client_with(|c| c.attr_ttl = Duration::ZERO);
    let c = ctx();
    let (f, fh) = file(&a, b"f");
    a.release(f.ino, fh).unwrap();
    // B caches the inode, then links and unlinks another name of it.
    assert_eq!(b.lookup(&c, ROOT, b"f").unwrap().nlink, 1);
    assert_eq!(b.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(b.link(&c, f.ino, ROOT, b"g").unwrap().nlink, 2);
    assert_eq!(b.getattr(f.ino).unwrap().nlink, 2);
    assert_eq!(b.lookup(&c, ROOT, b"g").unwrap().ino, f.ino);
    assert_eq!(b.unlink(&c, ROOT, b"g").unwrap().nlink, 1);
    assert_eq!(b.getattr(f.ino).unwrap().nlink, 1);
    assert_eq!(
        b.lookup(&c, ROOT, b"g").unwrap_err().errno,
        libc::ENOENT,
        "the removed name is not answered from the cache"
    );
    // An open file loses its last name: nlink 0, here and at the server.
    let fh = b.open(&c, f.ino, libc::O_RDWR).unwrap();
    b.write(&ctx(), f.ino, fh, 0, b"still here").unwrap();
    let gone = b.unlink(&c, ROOT, b"f").unwrap();
    assert_eq!((gone.ino, gone.nlink), (f.ino, 0));
    assert_eq!(b.getattr(f.ino).unwrap().nlink, 0);
    // At the server (a client that holds no reference to it cannot reach it any more).
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 0);
    assert_eq!(uncached.getattr(f.ino).unwrap_err().errno, libc::ESTALE);
    assert_eq!(read_all(&b, f.ino, fh, 0, 100).unwrap(), b"still here");
    b.release(f.ino, fh).unwrap();
    // Every reference given back: the inode is freed.
    b.forget(f.ino, b.references(f.ino).0);
    a.forget(f.ino, a.references(f.ino).0);
    // (Asked of the backend: a client holding nothing gets ESTALE already.)
    eventually(Duration::from_secs(5), "freed at the last close", || {
        fs.getattr(f.ino).is_err()
    });
    assert!(b.getattr(f.ino).is_err(), "not kept in the cache either");
    assert!(a.getattr(f.ino).is_err());
    // rmdir reports the directory it removed.
    let d = b.mkdir(&c, ROOT, b"d", 0o755).unwrap();
    assert_eq!(b.rmdir(&c, ROOT, b"d").unwrap().ino, d.ino);
}

#[test]
fn references_are_counted_given_back_and_released_with_the_session() {
    let acc = Accounting::new(memory_fs(64 * MIB));
    let srv = Running::start(acc.clone(), config());
    let fs = srv.client();
    let c = ctx();
    let (f, fh) = file(&fs, b"f");
    fs.release(f.ino, fh).unwrap();
    assert_eq!(fs.references(f.ino), (1, 1));
    // Lookups answered from the name cache while the server holds a reference.
    let lookups = acc.ledger().lookups;
    for _ in 0..3 {
        assert_eq!(fs.lookup(&c, ROOT, b"f").unwrap().ino, f.ino);
    }
    assert_eq!(acc.ledger().lookups, lookups);
    assert_eq!(fs.references(f.ino), (4, 1));
    assert_eq!(srv.report().references_held, 1);
    // The caller gives its references back; the last one gives the server's back.
    fs.forget(f.ino, 3);
    assert_eq!(fs.references(f.ino), (1, 1));
    assert_eq!(acc.ledger().refs[&f.ino], 1);
    fs.forget(f.ino, 1);
    assert_eq!(fs.references(f.ino), (0, 0));
    eventually(Duration::from_secs(5), "the server forgot f", || {
        acc.ledger().refs[&f.ino] == 0
    });
    assert_eq!(srv.report().references_held, 0);
    // Without a server reference the name is asked for again.
    fs.lookup(&c, ROOT, b"f").unwrap();
    assert_eq!(acc.ledger().lookups, lookups + 1);
    assert_eq!(fs.references(f.ino), (1, 1));

    // readdirplus: the caller takes three entries, the server's other references go
    // back at once.
    let d = fs.mkdir(&c, ROOT, b"d", 0o755).unwrap();
    let inos = empty_files(&fs, d.ino, "e", 10);
    eventually(Duration::from_secs(5), "the entries forgotten", || {
        inos.iter().all(|i| acc.ledger().refs[i] == 0)
    });
    let mut taken = Vec::new();
    fs.readdir(d.ino, 0, true, &mut |e| {
        taken.push(e.ino);
        taken.len() < 3
    })
    .unwrap();
    assert_eq!(taken.len(), 3);
    eventually(Duration::from_secs(5), "untaken entries given back", || {
        let l = acc.ledger();
        inos.iter()
            .all(|i| l.refs[i] == if taken.contains(i) { 1 } else { 0 })
    });
    for i in &taken {
        assert_eq!(fs.references(*i), (1, 1));
    }

    // A forget for more than the session holds, or for what it never held, gives back
    // only what it holds.
    let mut raw = srv.raw(fs.client().session());
    let items = [(f.ino, 100), (d.ino + 1000, 5)].map(|(ino, count)| ForgetItem { ino, count });
    let forget = ForgetReq {
        items: List::new(items.to_vec()).unwrap(),
    };
    let before = acc.ledger().forgotten.clone();
    assert_eq!(raw.call(forget).status, 0);
    let after = acc.ledger().forgotten;
    assert_eq!(
        after.get(&f.ino),
        Some(&(before.get(&f.ino).unwrap_or(&0) + 1))
    );
    assert_eq!(after.get(&(d.ino + 1000)), None);
    assert_eq!(
        fs.references(f.ino),
        (1, 1),
        "the client's own count is not told"
    );

    // Generation checks hold and give back around each operation.
    let holds = acc.ledger().holds;
    fs.getattr(ROOT).unwrap();
    for _ in 0..5 {
        fs.setattr(
            &c,
            d.ino,
            &zcfs_backend::SetAttr {
                mode: Some(0o700),
                ..Default::default()
            },
            0,
        )
        .unwrap();
    }
    assert!(acc.ledger().holds >= holds + 5);

    // Whatever the session still holds goes back when the server stops: nothing
    // taken from the backend is left outstanding.
    let (g, gh) = file(&fs, b"g");
    assert_eq!(acc.ledger().opens[&g.ino], 1);
    drop(raw);
    drop(fs);
    srv.stop();
    let l = acc.ledger();
    assert!(l.outstanding().is_empty(), "{:?}", l.outstanding());
    assert!(l.releases >= 1 && gh != 0);
}

#[test]
fn a_session_opens_at_most_max_session_handles() {
    let null = NullFs::default();
    let ino = null.lookup(&ctx(), ROOT, b"f").unwrap().ino;
    let srv = Running::start(
        Arc::new(null),
        ServerConfig {
            max_session_handles: 4,
            ..config()
        },
    );
    let node = NodeRef::ino(ino);
    let open = |raw: &mut Raw| {
        let r = raw.call(OpenReq {
            node,
            flags: libc::O_RDONLY,
        });
        (r.status == 0).then(|| OpenReply::decode(&r.body).unwrap().fh)
    };
    let mut raw = srv.raw(1);
    let fhs: Vec<u64> = (0..4).map(|_| open(&mut raw).unwrap()).collect();
    let r = raw.call(OpenReq {
        node,
        flags: libc::O_RDONLY,
    });
    assert_eq!(r.status, libc::EMFILE);
    let mut other = srv.raw(2);
    assert!(open(&mut other).is_some(), "the limit is per session");
    assert_eq!(raw.call(ReleaseReq { node, fh: fhs[0] }).status, 0);
    assert!(open(&mut raw).is_some());
    assert_eq!(srv.report().handles_open, 5);
}

#[test]
fn the_server_stops_cleanly_with_sessions_in_every_state() {
    let acc = Accounting::new(memory_fs(64 * MIB));
    let srv = Running::start(acc.clone(), config());
    let live = srv.client();
    let (f, _fh) = file(&live, b"live");
    live.lookup(&ctx(), ROOT, b"live").unwrap();
    let gone = srv.client();
    orphan(&gone, b"gone");
    drop(gone);
    eventually(Duration::from_secs(5), "in grace", || {
        srv.report().sessions_in_grace == 1
    });
    srv.stop();
    let l = acc.ledger();
    assert!(l.outstanding().is_empty(), "{:?}", l.outstanding());
    assert!(l.opens[&f.ino] == 0 && l.releases == 2);
}

/// An overwrite through the server larger than the free space: copy-on-write has no room
/// for the whole payload at once, so the server takes it into memory and the volume
/// writes it in pieces (issue 8: a write the volume has room for succeeds).
#[test]
fn an_overwrite_larger_than_the_free_space_succeeds_through_the_server() {
    let fs = memory_fs(24 * MIB);
    let srv = Running::start(fs.clone(), config());
    let c = srv.client();
    let (a, fh) = c
        .create(&ctx(), ROOT, b"big", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    let len = (c.statfs().unwrap().bfree * 4096 * 2 / 3) as usize;
    assert_eq!(
        c.write(&ctx(), a.ino, fh, 0, &vec![1u8; len]).unwrap() as usize,
        len
    );
    c.fsync(a.ino, fh, false).unwrap();
    assert!((c.statfs().unwrap().bfree * 4096) < len as u64);
    assert_eq!(
        c.write(&ctx(), a.ino, fh, 0, &vec![2u8; len]).unwrap() as usize,
        len
    );
    let mut got = Vec::new();
    c.read(a.ino, fh, 0, len as u32, &mut |s: &[&[u8]]| {
        got = s.concat();
        Ok(())
    })
    .unwrap();
    assert!(got.len() == len && got.iter().all(|&b| b == 2));
    assert!(
        srv.report().server_user_copy_bytes >= len as u64,
        "the overwrite did not take the in-memory path"
    );
    c.release(a.ino, fh).unwrap();
    srv.stop();
    let report = zcfs_volume::fsck::check_volume(fs.volume());
    assert!(report.is_clean(), "{:?}", report.problems);
}
