//! Adversarial review of the "." lookup (a hold over the protocol, FUSE export
//! support) and lseek (op 31): bad input is an error, references balance, lseek
//! without a handle is authorized as a read.

mod common;
use common::*;
use std::sync::Arc;
use std::time::Duration;
use zcfs_backend::{Backend, Ctx, ROOT};
use zcfs_protocol::*;
use zcfs_server::{IdentityMap, ServerConfig};

const MIB: usize = 1 << 20;

fn dot(ino: u64, gen: u64) -> LookupReq {
    LookupReq {
        parent: NodeRef::new(ino, gen),
        name: LookupName::new(".").unwrap(),
    }
}

fn lseek(ino: u64, fh: u64, offset: u64, whence: i32) -> LseekReq {
    LseekReq {
        node: NodeRef::ino(ino),
        fh,
        offset,
        whence,
    }
}

/// A "." lookup of a number that names no inode (never used, 0, the largest, freed and
/// reused with the old generation) is ESTALE, as docs/protocol.md says, and leaves no
/// reference behind.
#[test]
fn dot_lookup_of_a_missing_or_reused_inode_is_estale_and_holds_nothing() {
    let srv = Running::start(memory_fs(64 * MIB), config());
    let fs = srv.client();
    let root = fs.getattr(ROOT).unwrap();
    let (a, ah) = file(&fs, b"a");
    fs.release(a.ino, ah).unwrap();
    fs.unlink(&ctx(), ROOT, b"a").unwrap();
    fs.forget(a.ino, 1);
    eventually(Duration::from_secs(5), "a forgotten", || {
        srv.report().references_held == 0
    });
    let (b, bh) = file(&fs, b"b");
    fs.release(b.ino, bh).unwrap();
    assert_eq!(b.ino, a.ino, "the number is reused");
    let held = srv.report().references_held;
    let mut raw = srv.raw(0x17b1);
    for (what, req) in [
        ("never used", dot(200, 0)),
        ("never used, a generation", dot(200, 7)),
        ("ino 0", dot(0, 0)),
        ("ino u64::MAX", dot(u64::MAX, 0)),
        ("gen over 32 bits", dot(ROOT, u64::MAX)),
        ("root, wrong gen", dot(ROOT, root.generation + 1)),
        ("reused, old gen", dot(a.ino, a.generation)),
    ] {
        assert_eq!(raw.call(req).status, libc::ESTALE, "{what}");
    }
    assert_eq!(srv.report().references_held, held, "no reference taken");
    assert_eq!(raw.call(PingReq {}).status, 0, "the server still answers");
}

/// The reference a "." lookup gives is the session's: a client that holds an inode this
/// way and goes away does not keep the unlinked inode past its session.
#[test]
fn dot_lookup_reference_of_an_unlinked_inode_ends_with_the_session() {
    let grace = Duration::from_millis(300);
    let local = memory_fs(64 * MIB);
    let srv = Running::start(local.clone(), ServerConfig { grace, ..config() });
    let (f, fh) = file(&*local, b"f");
    local.write(&ctx(), f.ino, fh, 0, &[7u8; 8192]).unwrap();
    local.release(f.ino, fh).unwrap();
    local.forget(f.ino, 1);
    {
        let mut raw = srv.raw(0x17b2);
        for _ in 0..3 {
            assert_eq!(raw.call(dot(f.ino, f.generation)).status, 0);
        }
        assert_eq!(srv.report().references_held, 3);
        assert_eq!(local.volume().references(f.ino), 3);
        local.unlink(&ctx(), ROOT, b"f").unwrap();
        assert!(local.getattr(f.ino).is_ok(), "held: an orphan, alive");
    }
    eventually(grace * 20, "the session released", || {
        srv.report().sessions_expired == 1
    });
    assert_eq!(local.volume().references(f.ino), 0);
    assert!(local.getattr(f.ino).is_err(), "the orphan is freed");
}

/// A RemoteFs hold counts one reference for its caller and one the server holds; the
/// caller's forget gives the server's back (no leak, no early free).
#[test]
fn remote_hold_and_forget_balance() {
    let local = memory_fs(64 * MIB);
    let srv = Running::start(local.clone(), config());
    let fs = srv.client();
    let (f, fh) = file(&fs, b"f");
    fs.release(f.ino, fh).unwrap();
    assert_eq!(fs.references(f.ino), (1, 1));
    let h = fs.hold(f.ino, 0).unwrap();
    assert_eq!((h.ino, h.generation), (f.ino, f.generation));
    assert_eq!(fs.references(f.ino), (2, 2));
    assert_eq!(
        fs.hold(f.ino, f.generation + 1).unwrap_err().errno,
        libc::ESTALE
    );
    assert_eq!(
        fs.references(f.ino),
        (2, 2),
        "a refused hold counts nothing"
    );
    fs.unlink(&ctx(), ROOT, b"f").unwrap();
    fs.forget(f.ino, 1);
    assert!(local.getattr(f.ino).is_ok(), "still held once");
    fs.forget(f.ino, 1);
    eventually(Duration::from_secs(5), "references given back", || {
        srv.report().references_held == 0
    });
    assert_eq!(fs.references(f.ino), (0, 0));
    assert!(local.getattr(f.ino).is_err(), "freed at the last forget");
    // Forgetting more than held: nothing underflows, nothing else is freed.
    fs.forget(f.ino, 5);
    assert_eq!(srv.report().references_held, 0);
}

/// lseek with any whence but SEEK_DATA/SEEK_HOLE, any offset, on anything, is an error
/// (never a panic): the server answers on.
#[test]
fn lseek_bad_whence_offsets_and_nodes_are_errors() {
    let local = memory_fs(64 * MIB);
    let srv = Running::start(local.clone(), config());
    let (f, fh) = file(&*local, b"f");
    local.write(&ctx(), f.ino, fh, 0, &[1u8; 4096]).unwrap();
    let d = local.mkdir(&ctx(), ROOT, b"d", 0o755).unwrap();
    let mut raw = srv.raw(0x17b3);
    let open = raw.call(OpenReq {
        node: NodeRef::ino(f.ino),
        flags: libc::O_RDONLY,
    });
    assert_eq!(open.status, 0);
    let sfh = u64::from_le_bytes(open.body[..8].try_into().unwrap());
    for fh in [0, sfh] {
        for whence in [0, 1, 2, 5, -1, i32::MIN, i32::MAX] {
            assert_eq!(
                raw.call(lseek(f.ino, fh, 0, whence)).status,
                libc::EINVAL,
                "whence {whence}, fh {fh}"
            );
        }
        for off in [4096, 1 << 63, u64::MAX - 1, u64::MAX] {
            for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
                assert_eq!(
                    raw.call(lseek(f.ino, fh, off, whence)).status,
                    libc::ENXIO,
                    "offset {off}, whence {whence}, fh {fh}"
                );
            }
        }
        assert_eq!(raw.call(lseek(f.ino, fh, 0, libc::SEEK_DATA)).status, 0);
    }
    for (what, ino, fh) in [
        ("a directory", d.ino, 0),
        ("ino 0", 0, 0),
        ("ino u64::MAX", u64::MAX, 0),
        ("never used", 200, 0),
        ("another inode's handle", d.ino, sfh),
        ("no such handle", f.ino, 12345),
    ] {
        let s = raw.call(lseek(ino, fh, 0, libc::SEEK_DATA)).status;
        assert!(s != 0, "{what}: status {s}");
    }
    assert_eq!(raw.call(PingReq {}).status, 0);
}

/// lseek without a handle shows a file's layout only to who may read it (root squashed
/// too); a handle of another file does not open it either.
#[test]
fn lseek_without_a_handle_needs_read_permission() {
    let fs = memory_fs(64 * MIB);
    let owner = Ctx::user(1000, 1000);
    let (s, sfh) = fs
        .create(&owner, ROOT, b"secret", libc::S_IFREG | 0o600, libc::O_RDWR)
        .unwrap();
    fs.write(&owner, s.ino, sfh, 1 << 20, b"x").unwrap();
    fs.release(s.ino, sfh).unwrap();
    let (p, pfh) = fs
        .create(&owner, ROOT, b"public", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    fs.release(p.ino, pfh).unwrap();
    let srv = Running::start(
        Arc::clone(&fs) as Arc<dyn Backend>,
        ServerConfig {
            identity: IdentityMap::default(),
            ..config()
        },
    );
    let mut raw = srv.raw(0x17b4);
    for who in [
        Cred {
            uid: 1001,
            gid: 1001,
        },
        Cred { uid: 0, gid: 0 },
    ] {
        let r = raw.call_by(lseek(s.ino, 0, 0, libc::SEEK_DATA), who);
        assert_eq!(r.status, libc::EACCES, "{who:?} learned the layout");
        let open = raw.call_by(
            OpenReq {
                node: NodeRef::ino(p.ino),
                flags: libc::O_RDONLY,
            },
            who,
        );
        assert_eq!(open.status, 0);
        let pfh = u64::from_le_bytes(open.body[..8].try_into().unwrap());
        let r = raw.call_by(lseek(s.ino, pfh, 0, libc::SEEK_DATA), who);
        assert_eq!(r.status, libc::EBADF, "{who:?}: another file's handle");
    }
    let r = raw.call_by(
        lseek(s.ino, 0, 0, libc::SEEK_DATA),
        Cred {
            uid: 1000,
            gid: 1000,
        },
    );
    assert_eq!(r.status, 0, "the owner may");
}

/// The test wrappers pass every Backend call on: lseek through `Accounting` (which the
/// reference-counting tests put under a server) reaches the volume, not the trait's
/// ENOSYS default, and the "." hold is in its ledger.
#[test]
fn the_accounting_wrapper_passes_lseek_and_holds_on() {
    let local = memory_fs(64 * MIB);
    let (f, fh) = file(&*local, b"f");
    local.write(&ctx(), f.ino, fh, 8192, b"tail").unwrap();
    local.release(f.ino, fh).unwrap();
    local.forget(f.ino, 1);
    let acc = Accounting::new(local);
    let srv = Running::start(acc.clone(), config());
    let fs = srv.client();
    let g = fs.lookup(&ctx(), ROOT, b"f").unwrap();
    let h = fs.open(&ctx(), g.ino, libc::O_RDONLY).unwrap();
    assert_eq!(fs.lseek(g.ino, h, 0, libc::SEEK_HOLE).unwrap(), 0);
    assert_eq!(fs.lseek(g.ino, h, 0, libc::SEEK_DATA).unwrap(), 8192);
    fs.release(g.ino, h).unwrap();
    let holds = acc.ledger().holds;
    fs.hold(g.ino, g.generation).unwrap();
    assert_eq!(
        acc.ledger().holds,
        holds + 1,
        "the \".\" lookup is one hold"
    );
    fs.forget(g.ino, 2);
    eventually(Duration::from_secs(5), "references given back", || {
        srv.report().references_held == 0
    });
    assert_eq!(acc.ledger().outstanding(), vec![]);
}
