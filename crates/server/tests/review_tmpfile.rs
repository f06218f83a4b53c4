//! Adversarial review of O_TMPFILE over the wire (issue 14): clients that speak the
//! protocol directly, as ordinary users.

mod common;
use common::*;
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
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            max_session_handles: HANDLES,
            ..squashing()
        },
    );
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
fn create_closed(raw: &mut Raw, dir: u64, name: &str) -> u64 {
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
    c.attr.ino
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
    let srv = Running::start(
        fs.clone(),
        ServerConfig {
            max_session_handles: HANDLES,
            ..squashing()
        },
    );
    let mut a = srv.raw(0x7341);
    let shared = shared_dir(&mut a);
    let free0 = fs.statfs().unwrap().ffree;
    let mut orphans = Vec::new();
    // One by unlink, one by rename over: the bound.
    let u = create_closed(&mut a, shared, "u");
    let gone = a.call_by(
        UnlinkReq {
            parent: NodeRef::ino(shared),
            name: Name::new("u").unwrap(),
        },
        ALICE,
    );
    assert_eq!(gone.status, 0);
    orphans.push(u);
    let over = create_closed(&mut a, shared, "over");
    let r = create_closed(&mut a, shared, "r");
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
    let third = create_closed(&mut a, shared, "t");
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
