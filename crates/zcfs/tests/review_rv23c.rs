//! Review rv23c of two changes: known directories answered per caller (07c56f2,
//! `known_dirs::may_search`) and setattr committed before its reply for a file open at
//! the client (8774853, the `Changing` guard). Findings as tests, and guards for
//! properties found holding. Root required (network namespaces), as in CI.

mod common;
use common::remote::*;
use std::time::Duration;
use zcfs_backend::{Backend, Cred, Ctx, ROOT};
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

fn caller(uid: u32, gid: u32, groups: Vec<u32>, checked: bool) -> Ctx {
    Ctx {
        cred: Cred {
            checked,
            ..Cred::new(uid, gid, groups)
        },
        pid: 0,
    }
}

/// Root squash (the server's default) maps gid 0, primary or supplementary, of any
/// caller to the anonymous group (as Linux nfsd): a caller in group 0 is judged by the
/// server in another class than the client's `may_search` puts it in. A directory made
/// by a member of group 0 gets the anonymous group (65534); another member of group 0
/// is then in the directory's group at the server (0 -> 65534), whose bits have no x,
/// while the client takes it for "others" (x) and answers "no such name".
#[test]
fn root_squash_gid_zero_callers_are_judged_in_the_servers_class() {
    let cases = [
        // Primary group 0.
        (
            "gid0-primary",
            0o701,
            caller(1000, 0, vec![], false),
            caller(2000, 0, vec![], false),
        ),
        // Supplementary group 0.
        (
            "gid0-supplementary",
            0o701,
            caller(1000, 0, vec![], false),
            caller(2000, 2000, vec![0], false),
        ),
    ];
    same_answer_as_the_server("rv23c-gid0", &["--root-squash"], &cases);
}

/// For each case: a directory made through client `a` by `maker` with `mode` (in the
/// volume's root, opened to everyone before the server is restarted with `extra`),
/// then a lookup of a name not there by `who`: the server's answer (through another
/// client, which knows nothing of the directory) is EACCES, and `a` must not answer
/// ENOENT from what it knows.
fn same_answer_as_the_server(tag: &str, extra: &[&str], cases: &[(&str, u32, Ctx, Ctx)]) {
    let net = Net::new();
    let mut srv = Served::new(&net, tag, &[]);
    open_root(&net, &srv);
    srv.kill(libc::SIGTERM);
    srv.start(&net, extra);
    net.in_cli(|| {
        let a = srv.client(&net, Duration::from_secs(10));
        let truth = srv.client(&net, Duration::from_secs(10));
        let mut wrong = Vec::new();
        for (name, mode, maker, who) in cases {
            let d = a.mkdir(maker, ROOT, name.as_bytes(), *mode).unwrap();
            assert_eq!(d.mode & 0o7777, *mode, "{name}: made with the mode asked");
            let server_says = lookup_errno(&truth, who, d.ino, "absent");
            assert_eq!(server_says, libc::EACCES, "{name}: the server's answer");
            let before = a.lookups_answered_here();
            let client_says = lookup_errno(&a, who, d.ino, "absent");
            if client_says != server_says {
                wrong.push(format!(
                    "{name} (dir {}:{} {:o}, caller {:?}): client {} ({} answered here), \
                     server {}",
                    d.uid,
                    d.gid,
                    d.mode & 0o7777,
                    who.cred,
                    zcfs_backend::errno_name(client_says),
                    a.lookups_answered_here() - before,
                    zcfs_backend::errno_name(server_says),
                ));
            }
        }
        assert!(wrong.is_empty(), "answered unlike the server: {wrong:#?}");
    });
}

/// `Cred::checked` (a mount whose kernel checks, with POSIX ACLs) is not sent to the
/// server: the server judges every lookup itself, after its identity map. The kernel
/// lets root search any directory (CAP_DAC_OVERRIDE) and judges a user by the owner
/// and group it is shown, so a checked caller is no sign the server lets it search:
/// root squashed to nobody, or (squash all) a user judged as the directory's owner.
#[test]
fn a_kernel_checked_caller_is_judged_by_the_server_all_the_same() {
    let cases = [(
        "root-checked",
        0o700,
        caller(1000, 1000, vec![], false),
        caller(0, 0, vec![], true),
    )];
    same_answer_as_the_server("rv23c-chk-root", &["--root-squash"], &cases);
    // Squash all: the directory is nobody's, and every caller acts as nobody, its
    // owner, whose bits have no x; the kernel let 2000 in as "others" (x).
    let cases = [(
        "checked-squash-all",
        0o601,
        caller(1000, 1000, vec![], false),
        caller(2000, 2000, vec![], true),
    )];
    same_answer_as_the_server("rv23c-chk-all", &["--squash-all"], &cases);
}

/// The volume's root (1000:1000 0755) opened to everyone, as an export's top directory
/// shared by users is.
fn open_root(net: &Net, srv: &Served) {
    net.in_cli(|| {
        let fs = srv.client(net, Duration::from_secs(10));
        let set = zcfs_backend::SetAttr {
            mode: Some(0o1777),
            ..Default::default()
        };
        fs.setattr(&Ctx::user(1000, 1000), ROOT, &set, 0).unwrap();
    });
}

/// A truncate of a file open here is committed before its reply (8774853), and the
/// close after it then sends no FLUSH: also when the truncate goes by path (fh 0, as
/// truncate(2) of an open file), and when another handle of the file, open through it,
/// is closed last (each handle counted the change, and each took the count back). The
/// server is killed right after the last close; the size must be the truncate's.
#[test]
fn a_truncate_by_path_or_through_another_handle_is_durable_at_close() {
    const ROUNDS: usize = 8;
    let net = Net::new();
    let mut srv = Served::new(&net, "rv23c-trunc", &[]);
    for round in 0..ROUNDS {
        let name = format!("t{round}");
        let size = 4096 + round as u64;
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let c = ctx();
            let (f, h1) = create_file(&fs, &name, libc::O_RDWR);
            fs.fsync(f.ino, h1, false).unwrap();
            let h2 = fs.open(&c, f.ino, libc::O_WRONLY).unwrap();
            for (i, h) in [h1, h2, h1].into_iter().enumerate() {
                let n = fs.write_behind(&c, f.ino, h, i as u64 * 4096, &vec![7u8; 4096]);
                assert_eq!(n.unwrap(), 4096);
            }
            let shrink = zcfs_backend::SetAttr {
                size: Some(size),
                ..Default::default()
            };
            let through = if round % 2 == 0 { 0 } else { h1 };
            fs.setattr(&c, f.ino, &shrink, through).unwrap();
            let before = fs.durable_without_round_trip();
            fs.flush(f.ino, h1).unwrap();
            fs.release(f.ino, h1).unwrap();
            fs.flush(f.ino, h2).unwrap();
            assert_eq!(
                fs.durable_without_round_trip(),
                before + 2,
                "round {round}: both closes without a FLUSH (the path under test)"
            );
            srv.kill(libc::SIGKILL);
        });
        srv.start(&net, &[]);
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let a = fs.lookup(&ctx(), ROOT, name.as_bytes()).unwrap();
            assert_eq!(a.size, size, "round {round}: the truncate was lost");
        });
    }
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// Committed setattrs (times, mode) through one handle racing writes too large to be
/// committed by their replies through another, on another thread: each setattr takes
/// back only its own count, so the closes after them still make the writes durable.
/// The server is killed right after the last close; every write must be there.
#[test]
fn committed_setattrs_racing_uncommitted_writes_leave_the_writes_counted() {
    const ROUNDS: usize = 6;
    const CHUNK: usize = 256 * 1024;
    const CHUNKS: u64 = 6;
    let net = Net::new();
    let mut srv = Served::new(&net, "rv23c-race", &[]);
    for round in 0..ROUNDS {
        let name = format!("r{round}");
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let c = ctx();
            let (f, h1) = create_file(&fs, &name, libc::O_RDWR);
            let h2 = fs.open(&c, f.ino, libc::O_WRONLY).unwrap();
            std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..CHUNKS {
                        let data = vec![(i + 1) as u8; CHUNK];
                        let n = fs.write_behind(&c, f.ino, h2, i * CHUNK as u64, &data);
                        assert_eq!(n.unwrap() as usize, CHUNK);
                    }
                });
                s.spawn(|| {
                    for i in 0..CHUNKS * 4 {
                        let set = zcfs_backend::SetAttr {
                            mode: Some(0o600 | (i as u32 & 0o44)),
                            mtime: Some(zcfs_backend::SetTime::Now),
                            ..Default::default()
                        };
                        let through = if i % 2 == 0 { 0 } else { h1 };
                        fs.setattr(&c, f.ino, &set, through).unwrap();
                    }
                });
            });
            fs.flush(f.ino, h1).unwrap();
            fs.release(f.ino, h1).unwrap();
            fs.flush(f.ino, h2).unwrap();
            srv.kill(libc::SIGKILL);
        });
        srv.start(&net, &[]);
        net.in_cli(|| {
            let fs = srv.client(&net, Duration::from_secs(10));
            let a = fs.lookup(&ctx(), ROOT, name.as_bytes()).unwrap();
            assert_eq!(
                a.size,
                CHUNKS * CHUNK as u64,
                "round {round}: writes were lost"
            );
            let fh = fs.open(&ctx(), a.ino, libc::O_RDONLY).unwrap();
            for i in 0..CHUNKS {
                let got = read_all(&fs, a.ino, fh, i * CHUNK as u64, CHUNK as u32);
                assert!(
                    got.iter().all(|&b| b == (i + 1) as u8),
                    "round {round}: chunk {i} lost"
                );
            }
            fs.release(a.ino, fh).unwrap();
        });
    }
    srv.kill(libc::SIGTERM);
    srv.fsck();
}
