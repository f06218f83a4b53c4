//! Adversarial review of O_TMPFILE over the wire (issue 14): clients that speak the
//! protocol directly, as ordinary users.

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
const MALLORY: Cred = Cred {
    uid: 1001,
    gid: 1001,
};

/// Root squashed, as a real export: the raw clients below act as ordinary users.
fn squashing() -> ServerConfig {
    ServerConfig {
        identity: IdentityMap::default(),
        ..config()
    }
}

fn tmpfile_req(parent: u64, mode: u32, flags: i32) -> TmpFileReq {
    TmpFileReq {
        parent: NodeRef::ino(parent),
        mode,
        umask: 0,
        flags,
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

/// A server whose sessions may hold at most `handles` handles (and so as many orphans),
/// squashing root as the tests' callers expect.
fn bounded(backend: Arc<dyn Backend>, handles: usize) -> Running {
    Running::start(
        backend,
        ServerConfig {
            max_session_handles: handles,
            ..squashing()
        },
    )
}

/// Alice's O_TMPFILE file (mode 0666, linkable) is reachable only through her open
/// file: on Linux no other process can name it (no directory does, and her
/// /proc/PID/fd is closed to other users). Another client of the server, as another
/// user, names it by its inode number -- with no generation or with the one it guesses
/// (the server hands them out in order) -- and must not link it into a directory, take
/// a reference that keeps it alive after alice closed it, open it, or read and write
/// it without a handle. Alice herself still links it.
#[test]
fn another_client_cannot_reach_a_tmpfile_it_does_not_hold() {
    let srv = Running::start(memory_fs(64 * MIB), squashing());
    let mut alice = srv.raw(0x7301);
    let shared = shared_dir(&mut alice);
    let made = alice.call_by(tmpfile_req(shared, 0o666, libc::O_RDWR), ALICE);
    assert_eq!(made.status, 0);
    let t = CreateReply::decode(&made.body).unwrap();
    let (x, gen) = (t.attr.ino, t.attr.generation);
    let wrote = alice.call_as(
        WriteReq {
            node: NodeRef::new(x, gen),
            fh: t.fh,
            offset: 0,
            size: 6,
            commit: false,
        },
        ALICE,
        &[],
        b"secret",
    );
    assert_eq!(wrote.status, 0);

    let mut mallory = srv.raw(0x7302);
    let mut outcomes = Vec::new();
    let nodes = [NodeRef::ino(x), NodeRef::new(x, gen)];
    let tag = |what: &str, node: NodeRef| format!("{what} gen {}", node.gen);
    for node in nodes {
        let r = mallory.call_by(
            LookupReq {
                parent: node,
                name: LookupName::new(".").unwrap(),
            },
            MALLORY,
        );
        outcomes.push((tag("lookup .", node), r.status));
        let r = mallory.call_by(
            OpenReq {
                node,
                flags: libc::O_RDONLY,
            },
            MALLORY,
        );
        outcomes.push((tag("open", node), r.status));
        let r = mallory.call_by(
            ReadReq {
                node,
                fh: 0,
                offset: 0,
                size: 6,
            },
            MALLORY,
        );
        outcomes.push((tag("read without a handle", node), r.status));
        let r = mallory.call_as(
            WriteReq {
                node,
                fh: 0,
                offset: 0,
                size: 6,
                commit: false,
            },
            MALLORY,
            &[],
            b"mallor",
        );
        outcomes.push((tag("write without a handle", node), r.status));
    }
    // Last: a link that succeeds names the file, and everything above would follow.
    for node in nodes {
        let r = mallory.call_by(
            LinkReq {
                node,
                new_parent: NodeRef::ino(shared),
                new_name: Name::new(format!("stolen{}", node.gen)).unwrap(),
            },
            MALLORY,
        );
        outcomes.push((tag("link", node), r.status));
    }
    let want: Vec<(String, i32)> = outcomes
        .iter()
        .map(|(w, _)| (w.clone(), libc::ESTALE))
        .collect();
    assert_eq!(outcomes, want, "mallory reaches alice's tmpfile");

    // Alice, who holds it, gives it its name.
    let linked = alice.call_by(
        LinkReq {
            node: NodeRef::new(x, gen),
            new_parent: NodeRef::ino(shared),
            new_name: Name::new("mine").unwrap(),
        },
        ALICE,
    );
    assert_eq!(linked.status, 0, "alice links her tmpfile");
}

/// A file unlinked while alice has it open is as unreachable to mallory as a tmpfile:
/// he must not give it a name again (Linux: ENOENT even for its opener), nor take a
/// reference that keeps its blocks after alice closes it.
#[test]
fn another_client_cannot_keep_an_unlinked_open_file_alive() {
    let fs = memory_fs(64 * MIB);
    let srv = Running::start(fs.clone(), squashing());
    let mut alice = srv.raw(0x7311);
    let shared = shared_dir(&mut alice);
    let free0 = fs.statfs().unwrap().ffree;
    let made = alice.call_by(
        CreateReq {
            umask: 0,
            parent: NodeRef::ino(shared),
            name: Name::new("f").unwrap(),
            mode: 0o666,
            flags: libc::O_RDWR,
        },
        ALICE,
    );
    assert_eq!(made.status, 0);
    let t = CreateReply::decode(&made.body).unwrap();
    let x = t.attr.ino;
    let gone = alice.call_by(
        UnlinkReq {
            parent: NodeRef::ino(shared),
            name: Name::new("f").unwrap(),
        },
        ALICE,
    );
    assert_eq!(gone.status, 0);
    let mut mallory = srv.raw(0x7312);
    let r = mallory.call_by(
        LookupReq {
            parent: NodeRef::ino(x),
            name: LookupName::new(".").unwrap(),
        },
        MALLORY,
    );
    let refused = r.status;
    // Alice closes and forgets it: the inode is free again, whatever mallory did.
    let closed = alice.call_by(
        ReleaseReq {
            node: NodeRef::ino(x),
            fh: t.fh,
        },
        ALICE,
    );
    assert_eq!(closed.status, 0);
    let forgot = alice.call_by(
        ForgetReq {
            items: List::new(vec![ForgetItem { ino: x, count: 1 }]).unwrap(),
        },
        ALICE,
    );
    assert_eq!(forgot.status, 0);
    assert_eq!(
        (refused, fs.statfs().unwrap().ffree),
        (libc::ESTALE, free0),
        "mallory's lookup of \".\" is refused, and the orphan is freed when alice is done"
    );
}

/// Send `req` as `cred` with request id `id` on `raw` and wait for its reply.
fn call_id(raw: &mut Raw, id: u64, req: impl Into<Request>, cred: Cred) -> RawReply {
    let (h, body) = req.into().encode(id, cred);
    raw.send(&h, &body, &[]);
    raw.receive(id)
}

/// A TmpFile whose reply was lost is sent again with its id on a new connection of the
/// session: it is answered from the reply cache, so there is one orphan, not a second
/// one nobody knows of; when the session ends (the server stops) the orphan is freed.
#[test]
fn a_resent_tmpfile_makes_one_orphan_and_the_session_frees_it() {
    let fs = memory_fs(64 * MIB);
    let srv = Running::start(fs.clone(), squashing());
    let mut a = srv.raw(0x7321);
    let shared = shared_dir(&mut a);
    let free0 = fs.statfs().unwrap().ffree;
    let first = call_id(&mut a, 77, tmpfile_req(shared, 0o600, libc::O_RDWR), ALICE);
    assert_eq!(first.status, 0);
    drop(a);
    let mut b = srv.raw(0x7321);
    let again = call_id(&mut b, 77, tmpfile_req(shared, 0o600, libc::O_RDWR), ALICE);
    assert_eq!(
        (again.status, &again.body),
        (0, &first.body),
        "the same reply"
    );
    assert_eq!(fs.statfs().unwrap().ffree, free0 - 1, "one orphan");
    let r = srv.report();
    assert_eq!(r.ops["tmpfile"].count, 1, "executed once");
    drop(b);
    srv.stop();
    assert_eq!(
        fs.statfs().unwrap().ffree,
        free0,
        "the session's orphan is freed"
    );
}

/// Orphans a peer can make: TmpFile needs a free handle slot, but a Release gives the
/// slot back while the entry's reference keeps the orphan, so a peer that never sends
/// Forget piles up orphans nobody can see or remove (df counts them, no listing shows
/// them) until its session ends -- bounded by the volume's free inodes and blocks, not
/// by the session's handle limit. (Create + Unlink + Release without Forget does the
/// same with a named file; a FUSE client's kernel forgets an unlinked inode at once.)
#[test]
fn a_session_cannot_hold_more_tmpfile_orphans_than_its_handle_limit() {
    const HANDLES: usize = 2;
    const TRIES: usize = 3 * HANDLES;
    let fs = memory_fs(64 * MIB);
    let srv = bounded(fs.clone(), HANDLES);
    let mut a = srv.raw(0x7331);
    let shared = shared_dir(&mut a);
    let free0 = fs.statfs().unwrap().ffree;
    for _ in 0..TRIES {
        let made = a.call_by(tmpfile_req(shared, 0o600, libc::O_RDWR), ALICE);
        if made.status != 0 {
            break;
        }
        let t = CreateReply::decode(&made.body).unwrap();
        let closed = a.call_by(
            ReleaseReq {
                node: NodeRef::ino(t.attr.ino),
                fh: t.fh,
            },
            ALICE,
        );
        assert_eq!(closed.status, 0);
    }
    let orphans = free0 - fs.statfs().unwrap().ffree;
    assert!(
        orphans <= HANDLES as u64,
        "{orphans} orphans held by one session with {HANDLES} handles"
    );
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

/// The other ways to make an orphan held by reference alone count against the same
/// bound: unlinking a file the session looked up and never forgot, and renaming another
/// file over it. At the bound (`HANDLES` of them) they stay, and stay usable by number
/// (a getattr of each answers, nlink 0); one more and its references are given back,
/// so its inode comes back to the volume, and its number answers no more. The
/// client's later FORGET of every one of them takes what is left and frees them all.
#[test]
fn orphans_made_by_unlink_and_rename_over_are_bounded_by_the_handle_limit() {
    const HANDLES: usize = 2;
    let fs = memory_fs(64 * MIB);
    let srv = bounded(fs.clone(), HANDLES);
    let mut a = srv.raw(0x7341);
    let shared = shared_dir(&mut a);
    let free0 = fs.statfs().unwrap().ffree;
    let mut orphans = Vec::new();
    // One by unlink, one by rename over: the bound.
    let u = create_closed(&mut a, shared, "u").ino;
    let gone = a.call_by(
        UnlinkReq {
            parent: NodeRef::ino(shared),
            name: Name::new("u").unwrap(),
        },
        ALICE,
    );
    assert_eq!(gone.status, 0);
    orphans.push(u);
    let over = create_closed(&mut a, shared, "over").ino;
    let r = create_closed(&mut a, shared, "r").ino;
    let renamed = a.call_by(
        RenameReq {
            parent: NodeRef::ino(shared),
            name: Name::new("over").unwrap(),
            new_parent: NodeRef::ino(shared),
            new_name: Name::new("r").unwrap(),
            flags: RenameFlags::new(0).unwrap(),
        },
        ALICE,
    );
    assert_eq!(renamed.status, 0);
    orphans.push(r);
    // "over" now has the name "r" (one live file besides the two orphans).
    assert_eq!(
        free0 - fs.statfs().unwrap().ffree,
        3,
        "two orphans and one file"
    );
    for &ino in &orphans {
        let got = a.call_by(
            GetattrReq {
                node: NodeRef::ino(ino),
            },
            ALICE,
        );
        assert_eq!(got.status, 0, "orphan {ino} within the bound answers");
        assert_eq!(AttrReply::decode(&got.body).unwrap().attr.nlink, 0);
    }
    // One past the bound: freed at once.
    let third = create_closed(&mut a, shared, "t").ino;
    let gone = a.call_by(
        UnlinkReq {
            parent: NodeRef::ino(shared),
            name: Name::new("t").unwrap(),
        },
        ALICE,
    );
    assert_eq!(gone.status, 0);
    assert_eq!(
        free0 - fs.statfs().unwrap().ffree,
        3,
        "the third orphan's inode came back"
    );
    let got = a.call_by(
        GetattrReq {
            node: NodeRef::ino(third),
        },
        ALICE,
    );
    assert_ne!(got.status, 0, "a given-up orphan answers no more");
    assert_eq!(srv.report().orphans_given_back, 1, "counted in the stats");
    // The client's FORGETs (the kernel's, of everything it looked up).
    let forget = a.call_by(
        ForgetReq {
            items: List::new(
                orphans
                    .iter()
                    .chain([&third, &over])
                    .map(|&ino| ForgetItem { ino, count: 1 })
                    .collect(),
            )
            .unwrap(),
        },
        ALICE,
    );
    assert_eq!(forget.status, 0);
    assert_eq!(
        free0 - fs.statfs().unwrap().ffree,
        1,
        "only the live file is left"
    );
}

// Review 29b of the orphan bound (8078ec9): one finding per test, then the serial
// orders the racing ones are checked against.

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
    let srv = bounded(fs.clone(), HANDLES);
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
            rename(ctx: &Ctx, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<Option<u64>>;
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
    let srv = bounded(backend, 1);
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
    let srv = bounded(fs.clone(), 1);
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
    let srv = bounded(backend, 2);
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
    let srv = bounded(fs.clone(), 2);
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

// Review 29c of the fixed per-session orphan bound (ab1e4f1): one finding per test.

/// Pauses, after the inner backend answered, the first `lookup` of the armed name or
/// the first `hold` of the armed inode, until the test lets it go.
struct PauseAfter {
    inner: Arc<dyn Backend>,
    gate: Arc<AfterGate>,
}

/// (armed lookup name, armed hold inode, paused now, let go)
type AfterState = (Option<Vec<u8>>, Option<u64>, bool, bool);

#[derive(Default)]
struct AfterGate {
    m: Mutex<AfterState>,
    cv: Condvar,
}

impl AfterGate {
    fn arm(&self, name: Option<&str>, ino: Option<u64>) {
        let mut st = self.m.lock().unwrap();
        *st = (name.map(|n| n.as_bytes().to_vec()), ino, false, false);
    }
    fn wait_paused(&self) {
        let t = Instant::now();
        let mut st = self.m.lock().unwrap();
        while !st.2 {
            assert!(t.elapsed() < Duration::from_secs(10), "timed out: pause");
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }
    fn go(&self) {
        let mut st = self.m.lock().unwrap();
        st.3 = true;
        self.cv.notify_all();
    }
    fn pause(&self, hit: impl Fn(&AfterState) -> bool) {
        let mut st = self.m.lock().unwrap();
        if !hit(&st) {
            return;
        }
        st.0 = None;
        st.1 = None;
        st.2 = true;
        self.cv.notify_all();
        let t = Instant::now();
        while !st.3 && t.elapsed() < Duration::from_secs(10) {
            st = self
                .cv
                .wait_timeout(st, Duration::from_millis(20))
                .unwrap()
                .0;
        }
    }
}

mod pause_after_impl {
    use super::PauseAfter;
    use zcfs_backend::*;
    impl Backend for PauseAfter {
        pass_on! {
            getattr(ino: u64) -> Result<Attr>;
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
            rename(ctx: &Ctx, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<Option<u64>>;
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
            releasedir(ino: u64, fh: u64) -> Result<()>;
            lseek(ino: u64, fh: u64, offset: u64, whence: i32) -> Result<u64>;
            dir_state(ino: u64) -> Result<DirState>;
        }
        fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
            let r = self.inner.lookup(ctx, parent, name);
            self.gate.pause(|st| st.0.as_deref() == Some(name));
            r
        }
        fn hold(&self, ino: u64, generation: u64) -> Result<Attr> {
            let r = self.inner.hold(ino, generation);
            self.gate.pause(|st| st.1 == Some(ino));
            r
        }
    }
}

fn forget_all(raw: &mut Raw, inos: &[u64]) {
    let forget = raw.call_by(
        ForgetReq {
            items: List::new(
                inos.iter()
                    .map(|&ino| ForgetItem { ino, count: 1 })
                    .collect(),
            )
            .unwrap(),
        },
        ALICE,
    );
    assert_eq!(forget.status, 0);
}

/// Finding 29c-1: a session's reference is recorded (`entry` -> `add_ref`) only after
/// the backend's lookup returned. An Unlink of that name by anyone in between asks
/// every session holding the inode; this one holds nothing yet, so it is never asked,
/// and then takes a reference to an inode with no link that no bound counts. A peer
/// that races lookups against unlinks (two sessions, or two connections of one) piles
/// up hidden inodes without bound. The same window is in every reply that adds a
/// reference after the backend call: Link/Mknod/Mkdir/Symlink (`made`), readdirplus
/// (references added after the whole listing).
#[test]
fn a_lookup_racing_the_unlink_of_its_name_is_bounded_too() {
    const HANDLES: usize = 1;
    const FILES: usize = 3;
    let gate = Arc::new(AfterGate::default());
    let fs = memory_fs(64 * MIB);
    let backend: Arc<dyn Backend> = Arc::new(PauseAfter {
        inner: fs.clone(),
        gate: gate.clone(),
    });
    let srv = bounded(backend, HANDLES);
    let mut holder = srv.raw(0x29c1);
    let mut remover = srv.raw(0x29c2);
    let shared = shared_dir(&mut holder);
    let free0 = fs.statfs().unwrap().ffree;
    let mut made = Vec::new();
    for i in 0..FILES {
        let name = format!("f{i}");
        let a = create_closed(&mut remover, shared, &name);
        // The remover keeps no reference of its own.
        forget_all(&mut remover, &[a.ino]);
        made.push(a.ino);
        gate.arm(Some(&name), None);
        let req: Request = LookupReq {
            parent: NodeRef::ino(shared),
            name: LookupName::new(name.as_str()).unwrap(),
        }
        .into();
        let id = 500 + i as u64;
        let (h, body) = req.encode(id, ALICE);
        holder.send(&h, &body, &[]);
        gate.wait_paused();
        assert_eq!(unlink(&mut remover, shared, &name), 0);
        gate.go();
        assert_eq!(holder.receive(id).status, 0, "lookup of {name}");
    }
    let held = free0 - fs.statfs().unwrap().ffree;
    assert!(
        held as usize <= HANDLES,
        "{held} unlinked inodes held by reference alone by one session with a bound of {HANDLES}"
    );
}

/// Finding 29c-2: an Open takes the `opening` guard before the backend holds the node;
/// while it is up, `orphaned` skips the session. If the Open then fails (here EMFILE:
/// the session is at its handle limit; equally a permission or backend error) the
/// guard drops and nothing asks again: the inode whose last name was removed meanwhile
/// stays held by reference alone, uncounted. Repeated, the bound does not hold.
#[test]
fn an_orphan_made_during_a_failing_open_is_bounded_too() {
    const HANDLES: usize = 1;
    const FILES: usize = 3;
    let gate = Arc::new(AfterGate::default());
    let fs = memory_fs(64 * MIB);
    let backend: Arc<dyn Backend> = Arc::new(PauseAfter {
        inner: fs.clone(),
        gate: gate.clone(),
    });
    let srv = bounded(backend, HANDLES);
    const SESSION: u64 = 0x29c3;
    let mut a = srv.raw(SESSION);
    let mut b = srv.raw(SESSION);
    let shared = shared_dir(&mut a);
    // The session's one handle is taken: every Open below fails with EMFILE.
    let keep = a.call_by(
        CreateReq {
            parent: NodeRef::ino(shared),
            name: Name::new("keep").unwrap(),
            mode: 0o600,
            flags: libc::O_RDWR,
            umask: 0,
        },
        ALICE,
    );
    assert_eq!(keep.status, 0);
    let free0 = fs.statfs().unwrap().ffree;
    for i in 0..FILES {
        let name = format!("f{i}");
        // A file the session holds by reference alone (Mknod: no handle).
        let made = a.call_by(
            MknodReq {
                parent: NodeRef::ino(shared),
                name: Name::new(name.as_str()).unwrap(),
                mode: libc::S_IFREG | 0o600,
                rdev: 0,
                umask: 0,
            },
            ALICE,
        );
        assert_eq!(made.status, 0, "mknod {name}");
        let attr = MadeReply::decode(&made.body).unwrap().attr;
        gate.arm(None, Some(attr.ino));
        let req: Request = OpenReq {
            node: NodeRef::new(attr.ino, attr.generation),
            flags: libc::O_RDONLY,
        }
        .into();
        let id = 700 + i as u64;
        let (h, body) = req.encode(id, ALICE);
        b.send(&h, &body, &[]);
        gate.wait_paused();
        assert_eq!(unlink(&mut a, shared, &name), 0);
        gate.go();
        assert_eq!(b.receive(id).status, libc::EMFILE, "open of {name}");
    }
    let held = free0 - fs.statfs().unwrap().ffree;
    assert!(
        held as usize <= HANDLES,
        "{held} unlinked inodes held by reference alone by one session with a bound of {HANDLES}"
    );
}
