//! Who a request acts as (needs root: the tests become other users). On the Unix
//! socket a peer that is not root acts only as itself (SO_PEERCRED, its groups as the
//! kernel knows them); root squash, squash-all and no-root-squash as exports(5); the
//! supplementary groups a request carries, up to `MAX_GROUPS`; a lost Unix peer's
//! handles released after the grace period as a TCP peer's are.

mod common;
use common::*;
use std::time::Duration;
use zcfs_backend::{Backend, Ctx, ROOT};
use zcfs_client::ClientConfig;
use zcfs_protocol::*;
use zcfs_server::{IdentityMap, ServerConfig, Squash};
use zcfs_transport::Address;

const MIB: usize = 1 << 20;

fn unix_config(tag: &str) -> (ServerConfig, std::path::PathBuf) {
    let path = socket_path(tag);
    (
        ServerConfig {
            listen: Address::Unix(path.clone()),
            identity: IdentityMap::default(),
            ..config()
        },
        path,
    )
}

fn cred(uid: u32, gid: u32) -> Cred {
    Cred { uid, gid }
}

fn lookup(name: &str) -> LookupReq {
    LookupReq {
        parent: NodeRef::ino(ROOT),
        name: LookupName::new(name).unwrap(),
    }
}

fn getattr_root() -> GetattrReq {
    GetattrReq {
        node: NodeRef::ino(ROOT),
    }
}

/// A directory `name` in the root owned by 1000:`gid`, mode 0770, holding a file "f".
fn group_dir(fs: &dyn Backend, name: &[u8], gid: u32) {
    let c = Ctx::user(1000, gid);
    let d = fs.mkdir(&c, ROOT, name, 0o770).unwrap();
    assert_eq!(d.gid, gid);
    let (f, fh) = fs
        .create(&c, d.ino, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    fs.release(f.ino, fh).unwrap();
}

#[test]
fn a_unix_peer_that_is_not_root_acts_only_as_itself() {
    assert!(is_root(), "the identity tests run as root");
    let fs = memory_fs(64 * MIB);
    group_dir(&*fs, b"g50", 50);
    group_dir(&*fs, b"g60", 60);
    let (cfg, path) = unix_config("peer");
    let srv = Running::start(fs, cfg);
    let p = path.clone();
    let statuses = as_user(1001, 1001, &[50], move || {
        let mut raw = Raw::connect_unix(&p, 11);
        let mut st =
            |req: Request, c: Cred, groups: &[u32]| raw.call_as(req, c, groups, &[]).status;
        vec![
            // Itself: served.
            st(getattr_root().into(), cred(1001, 1001), &[]),
            // Anyone else: EPERM, and the connection goes on.
            st(getattr_root().into(), cred(0, 0), &[]),
            st(getattr_root().into(), cred(1002, 1002), &[]),
            st(getattr_root().into(), cred(1001, 0), &[]),
            // Its own group 50 as primary group: served.
            st(getattr_root().into(), cred(1001, 50), &[]),
            st(lookup("g50").into(), cred(1001, 1001), &[50]),
            st(PingReq {}.into(), cred(1001, 1001), &[]),
        ]
    });
    assert_eq!(
        statuses,
        [0, libc::EPERM, libc::EPERM, libc::EPERM, 0, 0, 0]
    );
    assert_eq!(srv.report().rejected_identity, 3);
    // Inside the directories: g50's file can be looked up with group 50; g60's not,
    // though the request names group 60.
    let fs = srv.server.backend().clone();
    let g50 = fs.lookup(&Ctx::root(), ROOT, b"g50").unwrap().ino;
    let g60 = fs.lookup(&Ctx::root(), ROOT, b"g60").unwrap().ino;
    let p = path.clone();
    let inside = as_user(1001, 1001, &[50], move || {
        let mut raw = Raw::connect_unix(&p, 12);
        let mut look = |dir: u64, groups: &[u32]| {
            raw.call_as(
                LookupReq {
                    parent: NodeRef::ino(dir),
                    name: LookupName::new("f").unwrap(),
                },
                cred(1001, 1001),
                groups,
                &[],
            )
            .status
        };
        [
            look(g50, &[50]),
            look(g50, &[]),
            look(g60, &[60]),
            look(g60, &[50, 60]),
        ]
    });
    assert_eq!(inside, [0, libc::EACCES, libc::EACCES, libc::EACCES]);
    // A root peer on the socket may name anyone (and root is squashed).
    let mut raw = Raw::connect_unix(&path, 13);
    assert_eq!(raw.call_by(getattr_root(), cred(1002, 1002)).status, 0);
    assert_eq!(
        raw.call_by(
            LookupReq {
                parent: NodeRef::ino(g50),
                name: LookupName::new("f").unwrap(),
            },
            cred(0, 0)
        )
        .status,
        libc::EACCES,
        "root squashed to nobody"
    );
}

/// The owner of a directory made by a request naming `c`, on a server with `map`.
fn owner_of_mkdir(map: IdentityMap, c: Cred, groups: &[u32]) -> (u32, u32) {
    let fs = memory_fs(64 * MIB);
    fs.setattr(
        &Ctx::root(),
        ROOT,
        &zcfs_backend::SetAttr {
            mode: Some(0o777),
            ..Default::default()
        },
        0,
    )
    .unwrap();
    let srv = Running::start(
        fs,
        ServerConfig {
            identity: map,
            ..config()
        },
    );
    let mut raw = srv.raw(21);
    let r = raw.call_as(
        MkdirReq {
            umask: 0,
            parent: NodeRef::ino(ROOT),
            name: Name::new("d").unwrap(),
            mode: 0o755,
        },
        c,
        groups,
        &[],
    );
    assert_eq!(r.status, 0);
    let a = MadeReply::decode(&r.body).unwrap().attr;
    (a.uid, a.gid)
}

#[test]
fn root_is_squashed_by_default_all_with_squash_all_none_without() {
    let root = IdentityMap::default();
    let none = IdentityMap {
        squash: Squash::None,
        ..root
    };
    let all = IdentityMap {
        squash: Squash::All,
        ..root
    };
    assert_eq!(owner_of_mkdir(root, cred(0, 0), &[0]), (65534, 65534));
    assert_eq!(owner_of_mkdir(root, cred(1001, 1001), &[]), (1001, 1001));
    assert_eq!(owner_of_mkdir(none, cred(0, 0), &[]), (0, 0));
    assert_eq!(owner_of_mkdir(all, cred(1001, 1001), &[]), (65534, 65534));
    assert_eq!(owner_of_mkdir(all, cred(0, 0), &[]), (65534, 65534));
    let anon = IdentityMap {
        anon_uid: 4000,
        anon_gid: 4001,
        ..root
    };
    assert_eq!(owner_of_mkdir(anon, cred(0, 0), &[]), (4000, 4001));
}

/// Up to `MAX_GROUPS` supplementary groups go with each request (the last of them
/// counts); one more is refused by the client without sending, and by the server as
/// an invalid request (EINVAL; the connection goes on).
#[test]
fn a_request_carries_up_to_max_groups() {
    let fs = memory_fs(64 * MIB);
    let last = 10_000 + MAX_GROUPS as u32 - 1;
    group_dir(&*fs, b"last", last);
    let srv = Running::start(fs, config());
    let groups: Vec<u32> = (10_000..10_000 + MAX_GROUPS as u32).collect();
    let over: Vec<u32> = (10_000..10_001 + MAX_GROUPS as u32).collect();
    // No cache: every lookup asks the server.
    let client = srv.client_with(|c| c.attr_ttl = Duration::ZERO);
    let dir = |groups: &[u32]| {
        let c = Ctx {
            cred: zcfs_backend::Cred::new(1001, 1001, groups.to_vec()),
            pid: 0,
        };
        client
            .lookup(&c, ROOT, b"last")
            .and_then(|d| client.lookup(&c, d.ino, b"f"))
    };
    assert!(dir(&groups).is_ok(), "the 256th group counts");
    assert_eq!(
        dir(&groups[..MAX_GROUPS - 1]).unwrap_err().errno,
        libc::EACCES
    );
    let sent = client
        .client()
        .bytes_sent
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(dir(&over).unwrap_err().errno, libc::EINVAL);
    assert_eq!(
        client
            .client()
            .bytes_sent
            .load(std::sync::atomic::Ordering::Relaxed),
        sent,
        "nothing was sent"
    );
    // By hand: one group more than the bound.
    let mut raw = srv.raw(31);
    let (h, mut body) = Request::from(getattr_root())
        .encode_with_groups(1, cred(1001, 1001), &groups)
        .unwrap();
    let mut h = ReqHeader::decode(&h).unwrap();
    body.splice(0..0, 77u32.to_le_bytes());
    h.ngroups += 1;
    h.body_len += 4;
    assert_eq!(raw.call_raw(h, &body, &[]).status, libc::EINVAL);
    assert_eq!(raw.call(PingReq {}).status, 0);
    let r = srv.report();
    assert_eq!((r.rejected_invalid, r.rejected_malformed), (1, 0));
}

/// A Unix peer that goes away leaves its session in grace, and its open file is given
/// back after the grace period, as for a TCP peer.
#[test]
fn a_lost_unix_peer_s_handles_are_released_after_the_grace_period() {
    let grace = Duration::from_millis(300);
    let (cfg, path) = unix_config("grace");
    let srv = Running::start(memory_fs(64 * MIB), ServerConfig { grace, ..cfg });
    let mut ccfg = ClientConfig::new(&format!("unix:{}", path.display()));
    ccfg.timeout = Duration::from_secs(10);
    let a = zcfs_client::RemoteFs::connect(ccfg).unwrap();
    let (f, _fh) = file(&a, b"a");
    assert!(f.ino > ROOT);
    assert_eq!(srv.report().handles_open, 1);
    drop(a);
    eventually(Duration::from_secs(10), "the session expired", || {
        let r = srv.report();
        r.sessions_expired == 1 && r.handles_open == 0
    });
    assert_eq!(srv.report().expired_handles, 1);
}
