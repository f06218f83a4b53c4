//! Adversarial review of the per-session bound on orphans held by reference alone
//! (8078ec9: `Session::orphaned`, counted after Unlink, Rmdir, Rename over, Release).

#[macro_use]
mod common;
use common::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};
use zcfs_protocol::*;
use zcfs_server::{IdentityMap, ServerConfig};

const MIB: usize = 1 << 20;

const ALICE: Cred = Cred {
    uid: 1000,
    gid: 1000,
};

fn squashing() -> ServerConfig {
    ServerConfig {
        identity: IdentityMap::default(),
        ..config()
    }
}

/// A directory everyone may write in, made by alice.
fn shared_dir(raw: &mut Raw) -> u64 {
    let made = raw.call_by(
        MkdirReq {
            umask: 0,
            parent: NodeRef::ino(ROOT),
            name: Name::new("shared").unwrap(),
            mode: 0o1777,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    MadeReply::decode(&made.body).unwrap().attr.ino
}

/// Create `name` in `dir` as alice and close it: its entry's reference stays held.
fn create_closed(raw: &mut Raw, dir: u64, name: &str) -> zcfs_backend::Attr {
    let made = raw.call_by(
        CreateReq {
            parent: NodeRef::ino(dir),
            name: Name::new(name).unwrap(),
            mode: 0o600,
            flags: libc::O_RDWR,
            umask: 0,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    let c = CreateReply::decode(&made.body).unwrap();
    let closed = raw.call_by(
        ReleaseReq {
            node: NodeRef::ino(c.attr.ino),
            fh: c.fh,
        },
        ALICE,
    );
    assert_eq!(closed.status, 0);
    c.attr
}

fn unlink(raw: &mut Raw, dir: u64, name: &str) -> i32 {
    raw.call_by(
        UnlinkReq {
            parent: NodeRef::ino(dir),
            name: Name::new(name).unwrap(),
        },
        ALICE,
    )
    .status
}

/// Finding 1: the bound counts only orphans made by the holding session's own Unlink,
/// Rmdir, Rename or Release. An inode the session holds by reference whose last name
/// another session removes is never counted, so a client with two sessions (or any
/// client whose files another client deletes) piles up unlinked inodes without bound,
/// which is what the change says it prevents ("hidden space is bounded as handles
/// are").
#[test]

fn orphans_unlinked_by_another_session_are_bounded_too() {
    const HANDLES: usize = 2;
    const FILES: usize = 3 * HANDLES;
    let fs = memory_fs(64 * MIB);
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            max_session_handles: HANDLES,
            ..squashing()
        },
    );
    let mut holder = srv.raw(0x29b1);
    let mut remover = srv.raw(0x29b2);
    let shared = shared_dir(&mut holder);
    let free0 = fs.statfs().unwrap().ffree;
    for i in 0..FILES {
        create_closed(&mut holder, shared, &format!("f{i}"));
    }
    for i in 0..FILES {
        assert_eq!(unlink(&mut remover, shared, &format!("f{i}")), 0);
    }
    let held = free0 - fs.statfs().unwrap().ffree;
    assert!(
        held as usize <= HANDLES,
        "{held} unlinked inodes held by one session with a bound of {HANDLES}"
    );
}

/// Pauses the getattr that finds `armed` with no link (Release's check, after the
/// backend released the handle) until the test lets it go.
struct PauseOrphanCheck {
    inner: Arc<dyn Backend>,
    gate: Arc<CheckGate>,
}

#[derive(Default)]
struct CheckGate {
    /// (armed inode, paused now, let go)
    m: Mutex<(Option<u64>, bool, bool)>,
    cv: Condvar,
}

impl CheckGate {
    fn wait_for(&self, what: &str, f: impl Fn(&(Option<u64>, bool, bool)) -> bool) {
        let t = Instant::now();
        let mut st = self.m.lock().unwrap();
        while !f(&st) {
            assert!(t.elapsed() < Duration::from_secs(10), "timed out: {what}");
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }
}

mod pause_impl {
    use super::PauseOrphanCheck;
    use std::time::{Duration, Instant};
    use zcfs_backend::*;
    impl Backend for PauseOrphanCheck {
        pass_on! {
            lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
            statfs() -> Result<StatFs>;
            flush(ino: u64, fh: u64) -> Result<()>;
            mkdir(ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr>;
            write(ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32>;
            setattr(ctx: &Ctx, ino: u64, set: &SetAttr, fh: u64) -> Result<Attr>;
            access(ctx: &Ctx, ino: u64, mask: u32) -> Result<()>;
            opendir(ctx: &Ctx, ino: u64) -> Result<u64>;
            readlink(ino: u64) -> Result<Vec<u8>>;
            mknod(ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr>;
            unlink(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            rmdir(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            symlink(ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr>;
            rename(ctx: &Ctx, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<()>;
            rename_replacing(ctx: &Ctx, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<Option<u64>>;
            link(ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr>;
            open(ctx: &Ctx, ino: u64, flags: i32) -> Result<u64>;
            create(ctx: &Ctx, parent: u64, name: &[u8], mode: u32, flags: i32) -> Result<(Attr, u64)>;
            tmpfile(ctx: &Ctx, parent: u64, mode: u32, flags: i32) -> Result<(Attr, u64)>;
            read(ino: u64, fh: u64, offset: u64, size: u32, reply: &mut dyn ReadReply) -> Result<()>;
            release(ino: u64, fh: u64) -> Result<()>;
            fsync(ino: u64, fh: u64, datasync: bool) -> Result<()>;
            readdir(ino: u64, offset: u64, plus: bool, f: &mut dyn FnMut(DirEntry) -> bool) -> Result<()>;
            setxattr(ctx: &Ctx, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
            getxattr(ctx: &Ctx, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
            listxattr(ctx: &Ctx, ino: u64) -> Result<Vec<Vec<u8>>>;
            removexattr(ctx: &Ctx, ino: u64, name: &[u8]) -> Result<()>;
            forget(ino: u64, n: u64) -> ();
            hold(ino: u64, generation: u64) -> Result<Attr>;
            releasedir(ino: u64, fh: u64) -> Result<()>;
            lseek(ino: u64, fh: u64, offset: u64, whence: i32) -> Result<u64>;
        }
        fn getattr(&self, ino: u64) -> Result<Attr> {
            let r = self.inner.getattr(ino);
            let g = &self.gate;
            let mut st = g.m.lock().unwrap();
            if st.0 == Some(ino) && r.as_ref().is_ok_and(|a| a.nlink == 0) {
                st.0 = None;
                st.1 = true;
                g.cv.notify_all();
                let t = Instant::now();
                while !st.2 && t.elapsed() < Duration::from_secs(10) {
                    st = g.cv.wait_timeout(st, Duration::from_millis(20)).unwrap().0;
                }
                st.1 = false;
            }
            r
        }
    }
}

/// Finding 2: Release reads the link count, then counts the inode as an orphan
/// (`getattr` .. `orphaned`). A Link of the same O_TMPFILE inode on another connection
/// of the session in between (a kernel sends RELEASE in the background: close(fd) then
/// linkat of an O_PATH descriptor) gives it a name and a reference, then the Release
/// counts it anyway: with the set at its bound, the server gives back every reference
/// the session holds to a *linked* inode, the Link's too, though the Link succeeded and
/// handed the client an entry. No serial order gives that: Link first, the inode is
/// never counted (the control test below); Release first, it is given back and the
/// Link fails (ESTALE), so the client knows. Here the client holds the inode (two
/// lookups, never forgotten) but the server does not: once its name goes, the volume
/// frees it at once and the client's next request on it gets ESTALE (with a kernel
/// client: an O_PATH fd / cwd that stops working, data it can no longer linkat back).
#[test]

fn a_link_racing_the_release_that_counts_an_orphan_keeps_its_references() {
    let gate = Arc::new(CheckGate::default());
    let fs = memory_fs(64 * MIB);
    let backend: Arc<dyn Backend> = Arc::new(PauseOrphanCheck {
        inner: fs.clone(),
        gate: gate.clone(),
    });
    let srv = Running::start(
        backend,
        ServerConfig {
            max_session_handles: 1,
            ..squashing()
        },
    );
    const SESSION: u64 = 0x29b3;
    let mut a = srv.raw(SESSION);
    let shared = shared_dir(&mut a);
    // One orphan held by reference alone: the session is at its bound.
    let o = create_closed(&mut a, shared, "o");
    assert_eq!(unlink(&mut a, shared, "o"), 0);
    // An O_TMPFILE file with some data.
    let made = a.call_by(
        TmpFileReq {
            parent: NodeRef::ino(shared),
            mode: 0o600,
            umask: 0,
            flags: libc::O_RDWR,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    let t = CreateReply::decode(&made.body).unwrap();
    let tn = NodeRef::new(t.attr.ino, t.attr.generation);
    let mut b = srv.raw(SESSION);
    // Release it in the background; its orphan check pauses.
    gate.m.lock().unwrap().0 = Some(tn.ino);
    let release: Request = ReleaseReq { node: tn, fh: t.fh }.into();
    let (h, body) = release.encode(100, ALICE);
    a.send(&h, &body, &[]);
    gate.wait_for("release's orphan check", |st| st.1);
    // Meanwhile, another connection of the session (made before: joining a session
    // takes its lock, which the paused check holds) links it (as linkat would).
    let link: Request = LinkReq {
        node: tn,
        new_parent: NodeRef::ino(shared),
        new_name: Name::new("kept").unwrap(),
    }
    .into();
    let (h, body) = link.encode(1_000_001, ALICE);
    b.send(&h, &body, &[]);
    // The fix makes the check and the decision one step under the session's lock, so
    // the Link (which needs that lock to take the node) cannot finish in between: it
    // waits for the check. Let the check go on once the Link had time to get there.
    std::thread::sleep(std::time::Duration::from_millis(200));
    {
        let mut st = gate.m.lock().unwrap();
        st.2 = true;
        gate.cv.notify_all();
    }
    assert_eq!(a.receive(100).status, 0, "release");
    let linked = b.receive(1_000_001);
    if linked.status != 0 {
        // The serial order "Release, then Link": the inode was given back at the
        // bound and the Link says so (the client knows it holds no name for it).
        assert_eq!(linked.status, libc::ESTALE, "link");
        return;
    }
    // The client forgets the first orphan (it holds one orphan at most from now on)...
    let forget = a.call_by(
        ForgetReq {
            items: List::new(vec![ForgetItem {
                ino: o.ino,
                count: 1,
            }])
            .unwrap(),
        },
        ALICE,
    );
    assert_eq!(forget.status, 0);
    // ...then "kept" is removed while the client still holds the inode (two lookups:
    // the tmpfile's entry and the link's, neither forgotten).
    assert_eq!(unlink(&mut a, shared, "kept"), 0);
    let got = a.call_by(GetattrReq { node: tn }, ALICE);
    assert_eq!(
        got.status, 0,
        "the client never forgot inode {} (one orphan, within the bound of one), yet it is gone",
        tn.ino
    );
}

/// Control for finding 2: the same steps with the Link answered before the Release
/// starts: the inode is linked at the Release, never counted, and stays held.
#[test]
fn control_a_link_before_the_release_keeps_its_references() {
    let fs = memory_fs(64 * MIB);
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            max_session_handles: 1,
            ..squashing()
        },
    );
    let mut a = srv.raw(0x29b4);
    let shared = shared_dir(&mut a);
    let o = create_closed(&mut a, shared, "o");
    assert_eq!(unlink(&mut a, shared, "o"), 0);
    let made = a.call_by(
        TmpFileReq {
            parent: NodeRef::ino(shared),
            mode: 0o600,
            umask: 0,
            flags: libc::O_RDWR,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    let t = CreateReply::decode(&made.body).unwrap();
    let tn = NodeRef::new(t.attr.ino, t.attr.generation);
    let linked = a.call_by(
        LinkReq {
            node: tn,
            new_parent: NodeRef::ino(shared),
            new_name: Name::new("kept").unwrap(),
        },
        ALICE,
    );
    assert_eq!(linked.status, 0);
    assert_eq!(
        a.call_by(ReleaseReq { node: tn, fh: t.fh }, ALICE).status,
        0
    );
    let forget = a.call_by(
        ForgetReq {
            items: List::new(vec![ForgetItem {
                ino: o.ino,
                count: 1,
            }])
            .unwrap(),
        },
        ALICE,
    );
    assert_eq!(forget.status, 0);
    assert_eq!(unlink(&mut a, shared, "kept"), 0);
    assert_eq!(a.call_by(GetattrReq { node: tn }, ALICE).status, 0);
}

/// Finding 3: Open registers its handle with the session only after the backend opened
/// it (`b.open` .. `getattr` .. `add_handle`). A Release of the inode's other handle on
/// another connection in between counts the inode as held by reference alone and, at
/// the bound, gives back the session's references, though the Open then succeeds. The
/// client (one lookup of its O_TMPFILE file, never forgotten, and the new handle) closes
/// the new handle, and the volume frees the file with its data: the client's linkat of
/// it (O_PATH fd, AT_EMPTY_PATH) fails with ESTALE. Serially: Open first, the Release
/// finds a handle and counts nothing; Release first, the Open fails and the client
/// knows. (The pause is the Open's getattr, between the two.)
#[test]

fn an_open_racing_the_release_that_counts_an_orphan_keeps_its_references() {
    let gate = Arc::new(CheckGate::default());
    let fs = memory_fs(64 * MIB);
    let backend: Arc<dyn Backend> = Arc::new(PauseOrphanCheck {
        inner: fs.clone(),
        gate: gate.clone(),
    });
    let srv = Running::start(
        backend,
        ServerConfig {
            max_session_handles: 2,
            ..squashing()
        },
    );
    const SESSION: u64 = 0x29b5;
    let mut a = srv.raw(SESSION);
    let shared = shared_dir(&mut a);
    // Two orphans held by reference alone: the session is at its bound.
    let olds: Vec<u64> = ["o1", "o2"]
        .iter()
        .map(|n| {
            let o = create_closed(&mut a, shared, n);
            assert_eq!(unlink(&mut a, shared, n), 0);
            o.ino
        })
        .collect();
    let made = a.call_by(
        TmpFileReq {
            parent: NodeRef::ino(shared),
            mode: 0o600,
            umask: 0,
            flags: libc::O_RDWR,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    let t = CreateReply::decode(&made.body).unwrap();
    let tn = NodeRef::new(t.attr.ino, t.attr.generation);
    let wrote = a.call_as(
        WriteReq {
            node: tn,
            fh: t.fh,
            offset: 0,
            size: 4,
            commit: true,
        },
        ALICE,
        &[],
        b"keep",
    );
    assert_eq!(wrote.status, 0);
    // Another connection of the session opens it again; its getattr pauses.
    gate.m.lock().unwrap().0 = Some(tn.ino);
    let mut b = srv.raw(SESSION);
    let open: Request = OpenReq {
        node: tn,
        flags: libc::O_RDWR,
    }
    .into();
    let (h, body) = open.encode(1_000_001, ALICE);
    b.send(&h, &body, &[]);
    gate.wait_for("open's getattr", |st| st.1);
    // Meanwhile the first handle is released.
    assert_eq!(
        a.call_by(ReleaseReq { node: tn, fh: t.fh }, ALICE).status,
        0
    );
    {
        let mut st = gate.m.lock().unwrap();
        st.2 = true;
        gate.cv.notify_all();
    }
    let opened = b.receive(1_000_001);
    assert_eq!(opened.status, 0, "open");
    let fh2 = OpenReply::decode(&opened.body).unwrap().fh;
    // The client forgets the two older orphans, closes its second handle, and links
    // the file it still holds (never forgotten) to keep its data.
    let forget = a.call_by(
        ForgetReq {
            items: List::new(
                olds.iter()
                    .map(|&ino| ForgetItem { ino, count: 1 })
                    .collect(),
            )
            .unwrap(),
        },
        ALICE,
    );
    assert_eq!(forget.status, 0);
    assert_eq!(a.call_by(ReleaseReq { node: tn, fh: fh2 }, ALICE).status, 0);
    let linked = a.call_by(
        LinkReq {
            node: tn,
            new_parent: NodeRef::ino(shared),
            new_name: Name::new("saved").unwrap(),
        },
        ALICE,
    );
    assert_eq!(
        linked.status, 0,
        "the client holds its tmpfile (within the bound: two orphans, then none), yet it was freed with its data"
    );
}

/// Control for finding 3: the Open answered before the Release: the file stays held and
/// its link succeeds.
#[test]
fn control_an_open_before_the_release_keeps_its_references() {
    let fs = memory_fs(64 * MIB);
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            max_session_handles: 2,
            ..squashing()
        },
    );
    let mut a = srv.raw(0x29b6);
    let shared = shared_dir(&mut a);
    let olds: Vec<u64> = ["o1", "o2"]
        .iter()
        .map(|n| {
            let o = create_closed(&mut a, shared, n);
            assert_eq!(unlink(&mut a, shared, n), 0);
            o.ino
        })
        .collect();
    let made = a.call_by(
        TmpFileReq {
            parent: NodeRef::ino(shared),
            mode: 0o600,
            umask: 0,
            flags: libc::O_RDWR,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    let t = CreateReply::decode(&made.body).unwrap();
    let tn = NodeRef::new(t.attr.ino, t.attr.generation);
    let opened = a.call_by(
        OpenReq {
            node: tn,
            flags: libc::O_RDWR,
        },
        ALICE,
    );
    assert_eq!(opened.status, 0);
    let fh2 = OpenReply::decode(&opened.body).unwrap().fh;
    assert_eq!(
        a.call_by(ReleaseReq { node: tn, fh: t.fh }, ALICE).status,
        0
    );
    let forget = a.call_by(
        ForgetReq {
            items: List::new(
                olds.iter()
                    .map(|&ino| ForgetItem { ino, count: 1 })
                    .collect(),
            )
            .unwrap(),
        },
        ALICE,
    );
    assert_eq!(forget.status, 0);
    assert_eq!(a.call_by(ReleaseReq { node: tn, fh: fh2 }, ALICE).status, 0);
    let linked = a.call_by(
        LinkReq {
            node: tn,
            new_parent: NodeRef::ino(shared),
            new_name: Name::new("saved").unwrap(),
        },
        ALICE,
    );
    assert_eq!(linked.status, 0);
}
