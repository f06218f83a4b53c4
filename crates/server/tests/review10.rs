//! Adversarial review of the security and wire code (issue 10). Every test here
//! FAILS on the code as reviewed: each shows one hole (see the comment above it).
//! Needs root (the Unix-socket tests become other users).

mod common;
use common::*;
use std::time::Duration;
use zcfs_backend::{Backend, Ctx, ROOT};
use zcfs_protocol::*;
use zcfs_server::{IdentityMap, ServerConfig};
use zcfs_transport::Address;

const MIB: usize = 1 << 20;
const SECRET: &[u8] = b"the owner's secret, mode 0600";

fn cred(uid: u32, gid: u32) -> Cred {
    Cred { uid, gid }
}

/// A volume with a file "secret" owned by 1000:1000, mode 0600, holding `SECRET`.
/// Returns the volume and the file's inode.
fn volume_with_secret() -> (std::sync::Arc<zcfs_local::LocalFs>, u64) {
    let fs = memory_fs(64 * MIB);
    let owner = Ctx::user(1000, 1000);
    let (a, fh) = fs
        .create(&owner, ROOT, b"secret", libc::S_IFREG | 0o600, libc::O_RDWR)
        .unwrap();
    assert_eq!(
        fs.write(&owner, a.ino, fh, 0, SECRET).unwrap() as usize,
        SECRET.len()
    );
    fs.release(a.ino, fh).unwrap();
    fs.forget(a.ino, 1);
    (fs, a.ino)
}

/// A TCP server with the default identity map (root squash), as `zcfs serve` runs.
fn squashing_server(fs: std::sync::Arc<zcfs_local::LocalFs>) -> Running {
    Running::start(
        fs,
        ServerConfig {
            identity: IdentityMap::default(),
            ..config()
        },
    )
}

/// FINDING 1 (critical): read with fh 0 ("no handle") is never authorized. The server
/// passes fh 0 to the backend (conn.rs `resolve`: `if fh == 0 { return Ok((0, ..)) }`),
/// and the backend's read takes no credential at all (a call through fh 0 is "the
/// frontend's own": crates/local/src/lib.rs `Handle::allows`). So any peer, as any
/// uid (here 1001, and a squashed root), reads a 0600 file it may not open.
#[test]
fn read_without_a_handle_is_authorized_like_open() {
    let (fs, ino) = volume_with_secret();
    let srv = squashing_server(fs);
    let mut raw = srv.raw(0x1001);
    for who in [cred(1001, 1001), cred(0, 0)] {
        // open(2) is refused: the control.
        let open = raw.call_by(
            OpenReq {
                node: NodeRef::ino(ino),
                flags: libc::O_RDONLY,
            },
            who,
        );
        assert_eq!(open.status, libc::EACCES, "open as {who:?}");
        let r = raw.call_by(
            ReadReq {
                node: NodeRef::ino(ino),
                fh: 0,
                offset: 0,
                size: 4096,
            },
            who,
        );
        assert!(
            r.status != 0 && r.data.is_empty(),
            "uid {} read a 0600 file of uid 1000 without a handle: status {}, data {:?}",
            who.uid,
            r.status,
            String::from_utf8_lossy(&r.data)
        );
    }
}

/// FINDING 1b (critical): write with fh 0 is never authorized either: uid 1001
/// overwrites uid 1000's 0600 file (volume `write`/`reserve_write` assume the
/// permission was checked at open).
#[test]
fn write_without_a_handle_is_authorized_like_open() {
    let (fs, ino) = volume_with_secret();
    let srv = squashing_server(fs.clone());
    let mut raw = srv.raw(0x1002);
    let evil = b"owned";
    let r = raw.call_as(
        WriteReq {
            node: NodeRef::ino(ino),
            fh: 0,
            offset: 0,
            size: evil.len() as u32,
            commit: false,
        },
        cred(1001, 1001),
        &[],
        evil,
    );
    let now = read_all(&*fs, ino, 0, 0, 4096).unwrap();
    assert!(
        r.status != 0 && now == SECRET,
        "uid 1001 wrote into a 0600 file of uid 1000: status {}, file now {:?}",
        r.status,
        String::from_utf8_lossy(&now)
    );
}

/// FINDING 1c (critical): fallocate with fh 0 punches holes in (or extends) a file the
/// caller may not write: the data of uid 1000's 0600 file is zeroed by uid 1001.
#[test]
fn fallocate_without_a_handle_is_authorized_like_open() {
    let (fs, ino) = volume_with_secret();
    let srv = squashing_server(fs.clone());
    let mut raw = srv.raw(0x1003);
    let r = raw.call_by(
        FallocateReq {
            node: NodeRef::ino(ino),
            fh: 0,
            offset: 0,
            len: SECRET.len() as u64,
            mode: libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        },
        cred(1001, 1001),
    );
    let now = read_all(&*fs, ino, 0, 0, 4096).unwrap();
    assert!(
        r.status != 0 && now == SECRET,
        "uid 1001 punched a hole in a 0600 file of uid 1000: status {}, file now {:?}",
        r.status,
        now
    );
}

/// FINDING 1d (critical, local privilege escalation on the server host): the same
/// hole through the Unix socket, where SO_PEERCRED makes a non-root peer "act only as
/// itself": as itself, uid 1001 still reads uid 1000's 0600 file (no secret is needed
/// on the Unix socket).
#[test]
fn a_unix_peer_that_is_not_root_cannot_read_others_files_without_a_handle() {
    assert!(is_root(), "the identity tests run as root");
    let (fs, ino) = volume_with_secret();
    let path = socket_path("r10-read");
    let _srv = Running::start(
        fs,
        ServerConfig {
            listen: Address::Unix(path.clone()),
            identity: IdentityMap::default(),
            ..config()
        },
    );
    let (status, data) = as_user(1001, 1001, &[], move || {
        let mut raw = Raw::connect_unix(&path, 0x1004);
        let r = raw.call_by(
            ReadReq {
                node: NodeRef::ino(ino),
                fh: 0,
                offset: 0,
                size: 4096,
            },
            cred(1001, 1001),
        );
        (r.status, r.data)
    });
    assert!(
        status != 0 && data.is_empty(),
        "a local uid 1001 read uid 1000's 0600 file over the Unix socket: {:?}",
        String::from_utf8_lossy(&data)
    );
}

/// FINDING 2 (medium): the Verdict is not authenticated. Its `resumed` byte comes after
/// both proofs and before any message key is used (transport `client_handshake` takes
/// `w.resumed = v.resumed` from 8 unMACed bytes), so a peer on the path can flip it:
/// 0 -> 1 makes a client whose session is gone believe it was resumed (it skips
/// revalidation, keeps dead handles and counts, and resends requests that are not
/// idempotent into a new session: executed twice); 1 -> 0 makes it revalidate and
/// forget its count of references the server still holds for it (they stay held for
/// the session's life: unlinked files are not freed). The proofs cover Hello and
/// Welcome only.
#[test]
fn a_flipped_verdict_resumed_flag_is_detected() {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use zcfs_protocol::channel::Integrity;
    use zcfs_protocol::handshake::{HELLO_LEN, PROOF_LEN, VERDICT_LEN, WELCOME_LEN};
    let secret: &'static [u8] = b"a-review10-secret";
    let srv_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let prx_l = TcpListener::bind("127.0.0.1:0").unwrap();
    let srv_addr = srv_l.local_addr().unwrap();
    let prx_addr = prx_l.local_addr().unwrap();
    // The server: a new session (attach says "not resumed").
    let server = std::thread::spawn(move || {
        let (mut s, _) = srv_l.accept().unwrap();
        let r = zcfs_transport::server_handshake(
            &mut s,
            Some(secret),
            Integrity::Headers,
            64,
            7,
            Duration::from_secs(5),
            &mut |_| {
                Ok(zcfs_transport::Joined {
                    resumed: false,
                    serial: 1,
                })
            },
        );
        let mut b = [0u8; 1];
        let _ = s.read(&mut b);
        r.is_ok()
    });
    // The path: passes everything, sets the Verdict's resumed byte.
    let proxy = std::thread::spawn(move || {
        let (mut c, _) = prx_l.accept().unwrap();
        let mut s = TcpStream::connect(srv_addr).unwrap();
        let fwd = |from: &mut TcpStream, to: &mut TcpStream, n: usize, flip: Option<usize>| {
            let mut b = vec![0u8; n];
            from.read_exact(&mut b).unwrap();
            if let Some(i) = flip {
                b[i] = 1;
            }
            to.write_all(&b).unwrap();
        };
        fwd(&mut c, &mut s, HELLO_LEN, None);
        fwd(&mut s, &mut c, WELCOME_LEN, None);
        fwd(&mut c, &mut s, PROOF_LEN, None);
        fwd(
            &mut s,
            &mut c,
            VERDICT_LEN + zcfs_protocol::channel::TAG_LEN,
            Some(4),
        );
        (c, s)
    });
    let mut c = TcpStream::connect(prx_addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = zcfs_transport::client_handshake(&mut c, Some(secret), 42, Integrity::Headers);
    let streams = proxy.join().unwrap();
    drop(streams);
    drop(c);
    assert!(server.join().unwrap(), "the server accepted the client");
    assert!(
        r.is_err(),
        "the client took a Verdict changed on the path ({:?})",
        r.map(|e| e.welcome.resumed)
    );
    if let Ok(e) = r {
        assert!(
            !e.welcome.resumed,
            "the server started a new session, but a byte flipped on the path made the \
             authenticated client believe its session was resumed"
        );
    }
}

/// A directory "private" owned by 1000:1000, mode 0700, holding "inner-name" (0644,
/// readable by anyone who can reach it). Returns (volume, dir ino, file ino).
fn volume_with_private_dir() -> (std::sync::Arc<zcfs_local::LocalFs>, u64, u64) {
    let fs = memory_fs(64 * MIB);
    let owner = Ctx::user(1000, 1000);
    let d = fs.mkdir(&owner, ROOT, b"private", 0o700).unwrap();
    let (f, fh) = fs
        .create(
            &owner,
            d.ino,
            b"inner-name",
            libc::S_IFREG | 0o644,
            libc::O_RDWR,
        )
        .unwrap();
    fs.write(&owner, f.ino, fh, 0, SECRET).unwrap();
    fs.release(f.ino, fh).unwrap();
    fs.forget(f.ino, 1);
    fs.forget(d.ino, 1);
    (fs, d.ino, f.ino)
}

/// FINDING 3 (high): readdir checks no permission at all: the server calls
/// `backend.readdir(dir, ..)` (dispatch.rs, `Request::Readdir`) without the caller's
/// credential and without `opendir`; the backend's readdir takes none. uid 1001 lists
/// uid 1000's 0700 directory (names, and with `plus` every attribute, plus a reference
/// each), though its lookup in that directory is EACCES.
#[test]
fn readdir_of_a_directory_the_caller_may_not_read_is_refused() {
    let (fs, dir, _) = volume_with_private_dir();
    let srv = squashing_server(fs);
    let mut raw = srv.raw(0x3001);
    let look = raw.call_by(
        LookupReq {
            parent: NodeRef::ino(dir),
            name: LookupName::new("inner-name").unwrap(),
        },
        cred(1001, 1001),
    );
    assert_eq!(
        look.status,
        libc::EACCES,
        "the control: no search permission"
    );
    for plus in [false, true] {
        let r = raw.call_by(
            ReaddirReq {
                dir: NodeRef::ino(dir),
                cookie: 0,
                plus,
                max_entries: 16,
            },
            cred(1001, 1001),
        );
        let leaked = r.body.windows(10).any(|w| w == b"inner-name");
        assert!(
            r.status == libc::EACCES && !leaked,
            "uid 1001 listed uid 1000's 0700 directory (plus {plus}): status {}, name leaked {leaked}",
            r.status
        );
    }
}

/// FINDING 4 (medium-high): a NodeRef with generation 0 is "not checked" and inode
/// numbers are small and dense, so any caller reaches any inode without search
/// permission on a path to it: uid 1001 opens and reads a 0644 file inside uid 1000's
/// 0700 directory by its number alone (on Linux, open(2) through the path is EACCES;
/// NFS makes file handles hard to forge, here the generation check is optional).
#[test]
#[ignore = "known limitation: inode numbers are file handles, as NFS's with no_subtree_check (docs/security.md)"]
fn an_inode_behind_a_directory_without_search_permission_is_not_reachable_by_number() {
    let (fs, _dir, file) = volume_with_private_dir();
    let srv = squashing_server(fs);
    let mut raw = srv.raw(0x3002);
    let open = raw.call_by(
        OpenReq {
            node: NodeRef::ino(file),
            flags: libc::O_RDONLY,
        },
        cred(1001, 1001),
    );
    let mut data = Vec::new();
    if open.status == 0 {
        let fh = OpenReply::decode(&open.body).unwrap().fh;
        data = raw
            .call_by(
                ReadReq {
                    node: NodeRef::ino(file),
                    fh,
                    offset: 0,
                    size: 4096,
                },
                cred(1001, 1001),
            )
            .data;
    }
    assert!(
        open.status != 0,
        "uid 1001 opened (and read {:?}) a file behind uid 1000's 0700 directory by its \
         inode number {file}, generation 0",
        String::from_utf8_lossy(&data)
    );
}

/// FINDING 5 (medium, resource exhaustion): nothing bounds how many sessions the
/// server keeps, nor the memory of the sessions of peers that are gone. Each session
/// keeps up to `REPLY_CACHE_BYTES` (4 MiB) of replies and up to 2^20 handles for the
/// grace period (60 s) after its last connection; a peer (any local user on the Unix
/// socket, which needs no secret) that reconnects with a fresh session id each time
/// leaves 4 MiB behind per connection: unbounded memory, though it never holds more
/// than one of the `max_connections` slots. Here 8 connections, one after the other,
/// each with its own session id, leave 8 sessions and ~8 x 4 MiB of cached replies
/// (1024 getxattr replies of ~4 KiB each),
/// with `max_connections` 2.
#[test]
fn sessions_of_peers_that_are_gone_hold_bounded_memory() {
    let fs = memory_fs(64 * MIB);
    // The volume keeps at most one 4 KiB block of xattrs per inode.
    let value = vec![b'x'; 4000];
    fs.setxattr(&Ctx::root(), ROOT, b"user.big", &value, 0)
        .unwrap();
    let max_connections = 2;
    let srv = Running::start(
        fs,
        ServerConfig {
            max_connections,
            // Long enough that no session expires while the test runs (the default,
            // 60 s, is as good for the attack: it only sets the rate needed).
            grace: Duration::from_secs(600),
            ..config()
        },
    );
    const SESSIONS: u64 = 8;
    for s in 0..SESSIONS {
        let mut raw = srv.raw(0x5000 + s);
        // Pipelined in batches (one write each), so the test does not wait on Nagle.
        let mut id = 1u64;
        for _ in 0..zcfs_server::REPLY_CACHE_ENTRIES / 32 {
            let mut batch = Vec::new();
            let first = id;
            for _ in 0..32 {
                let (h, body) = Request::from(GetxattrReq {
                    node: NodeRef::ino(ROOT),
                    name: XattrName::new("user.big").unwrap(),
                })
                .encode_with_groups(id, Cred::default(), &[])
                .unwrap();
                batch.extend_from_slice(&h);
                batch.extend_from_slice(&body);
                id += 1;
            }
            raw.send(&batch, &[], &[]);
            for i in first..id {
                assert_eq!(raw.receive(i).status, 0);
            }
        }
        drop(raw);
        // One connection per source at a time here (the per-source bound is kept
        // below max_connections = 2): the next peer comes once this one is gone.
        eventually(Duration::from_secs(10), "the connection ended", || {
            srv.report().connections_active == 0
        });
    }
    eventually(Duration::from_secs(10), "every connection ended", || {
        srv.report().connections_active == 0
    });
    let r = srv.report();
    let bound = max_connections * zcfs_server::REPLY_CACHE_BYTES;
    assert!(
        (r.reply_cache_bytes as usize) <= bound,
        "{} sessions of peers that are gone hold {} MiB of cached replies (in grace: {}), \
         more than max_connections x REPLY_CACHE_BYTES = {} MiB; nothing bounds it",
        SESSIONS,
        r.reply_cache_bytes >> 20,
        r.sessions_in_grace,
        bound >> 20
    );
}

/// FINDING 6 (medium, local denial of service): on the Unix socket (no secret needed)
/// one unprivileged user can hold every connection slot: the per-source bound
/// (`max_handshakes_per_addr`, per uid on a Unix socket) only counts connections in
/// the handshake, and an established idle connection is kept for the idle timeout
/// (300 s) — after which the user simply reconnects. Here uid 1001 opens
/// `max_connections` connections and sits on them; root (a mount of another user, or
/// its reconnection) is then refused.
#[test]
fn one_unprivileged_unix_user_cannot_take_every_connection_slot() {
    assert!(is_root(), "the identity tests run as root");
    let path = socket_path("r10-slots");
    let max_connections = 4;
    let srv = Running::start(
        memory_fs(64 * MIB),
        ServerConfig {
            listen: Address::Unix(path.clone()),
            identity: IdentityMap::default(),
            max_connections,
            ..config()
        },
    );
    let p = path.clone();
    // uid 1001 opens connections until the server refuses one: it gets fewer than all.
    let hogs: Vec<Raw> = as_user(1001, 1001, &[], move || {
        let mut held = Vec::new();
        for i in 0..max_connections {
            let Some(mut r) = Raw::try_connect_unix(&p, 0x6000 + i as u64) else {
                break;
            };
            assert_eq!(r.call_by(PingReq {}, cred(1001, 1001)).status, 0);
            held.push(r);
        }
        held
    });
    assert!(
        hogs.len() < max_connections,
        "uid 1001 holds all {max_connections} connection slots"
    );
    let mut s: zcfs_transport::Stream = std::os::unix::net::UnixStream::connect(&path)
        .unwrap()
        .into();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let r = zcfs_transport::client_handshake(&mut s, None, 0x6100, Default::default());
    let refused = srv.report().rejected_limit;
    drop(hogs);
    assert!(
        r.is_ok(),
        "root was refused ({:?}; rejected_limit {refused}) because uid 1001 holds all \
         {max_connections} connection slots",
        r.err()
    );
}

/// FINDING 7 (medium; high on a client mounted with `-o dev`/`-o suid`): operations
/// Linux reserves to capabilities are open to any owner over the wire. A non-root
/// caller creates a character device (here 1:1, /dev/mem: Linux needs CAP_MKNOD,
/// nfsd refuses it the same way) and sets `security.capability` on its own file
/// (Linux needs CAP_SETFCAP; perm.rs `check_xattr` lets the owner write any
/// security.* name). Through a FUSE mount the client's kernel refuses both, but any
/// peer that speaks the protocol (a holder of the secret, any local user on the
/// server's Unix socket) does not go through that kernel; every client that mounts
/// with `dev` or `suid` then gives the device or the capabilities to whoever opens or
/// runs the file.
#[test]
fn device_nodes_and_file_capabilities_need_privilege() {
    let srv = squashing_server(memory_fs(64 * MIB));
    let mut raw = srv.raw(0x7001);
    let owner = cred(1000, 1000);
    let dev = raw.call_by(
        MknodReq {
            umask: 0,
            parent: NodeRef::ino(ROOT),
            name: Name::new("mem").unwrap(),
            mode: libc::S_IFCHR | 0o666,
            rdev: ((1 << 8) | 1) as u32,
        },
        owner,
    );
    let file = raw.call_by(
        MknodReq {
            umask: 0,
            parent: NodeRef::ino(ROOT),
            name: Name::new("tool").unwrap(),
            mode: libc::S_IFREG | 0o755,
            rdev: 0,
        },
        owner,
    );
    assert_eq!(file.status, 0);
    let tool = MadeReply::decode(&file.body).unwrap().attr.ino;
    // VFS_CAP_REVISION_2 with CAP_SETUID (7) permitted and effective.
    let mut cap = vec![0u8; 20];
    cap[..4].copy_from_slice(&(0x0200_0001u32).to_le_bytes());
    cap[4..8].copy_from_slice(&(1u32 << 7).to_le_bytes());
    let fcap = raw.call_by(
        SetxattrReq {
            node: NodeRef::ino(tool),
            name: XattrName::new("security.capability").unwrap(),
            value: XattrValue::new(cap).unwrap(),
            flags: 0,
        },
        owner,
    );
    assert!(
        dev.status == libc::EPERM && fcap.status == libc::EPERM,
        "uid 1000 made a char device 1:1 (status {}) and gave its file CAP_SETUID \
         (status {})",
        dev.status,
        fcap.status
    );
}
