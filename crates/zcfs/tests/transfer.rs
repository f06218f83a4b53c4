//! `zcfs cp`, `zcfs cat` and `zcfs ls` against real `zcfs serve` processes in a network
//! namespace joined to the client's by a veth pair (root required, as in CI): files
//! and trees both ways and between servers, compared byte for byte and by kind; -p;
//! listings; and every failure reported per file with a non-zero exit status.

mod common;
use common::remote::*;
use common::{mkfs, spawn_serving, zcfs_bin};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;
use zcfs_backend::{Backend, ROOT};

/// A `zcfs serve` of a fresh volume on `port` in the server namespace; killed and its
/// image removed on drop.
struct Server {
    image: PathBuf,
    secret: PathBuf,
    port: u16,
    child: Child,
}

impl Server {
    /// `squash`: root on the client is squashed to nobody (the server's default).
    fn start(net: &Net, tag: &str, port: u16, size: &str, squash: bool) -> Server {
        let image = PathBuf::from(format!(
            "/dev/shm/zcfs-transfer-{tag}-{}.img",
            std::process::id()
        ));
        mkfs(&image, size, &["--root-owner", "1000:1000"]);
        let secret = image.with_extension("secret");
        fs::write(&secret, [SECRET, b"\n"].concat()).unwrap();
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        let addr = format!("{}:{port}", srv_ip(net));
        let mut cmd = net.srv_command(zcfs_bin());
        cmd.arg("serve")
            .arg(&image)
            .args(["--listen", &addr, "--secret-file"])
            .arg(&secret)
            .stderr(Stdio::null());
        if !squash {
            cmd.arg("--no-root-squash");
        }
        let (child, line) = spawn_serving(&mut cmd);
        assert!(line.starts_with("serving"), "server did not start: {line}");
        Server {
            image,
            secret,
            port,
            child,
        }
    }

    /// `/private`: "secret", 1000's and 0600 (a client squashed to nobody cannot read it).
    fn write_private(&self, net: &Net) {
        self.lib(net, |fs| {
            let (a, fh) = fs
                .create(
                    &ctx(),
                    ROOT,
                    b"private",
                    libc::S_IFREG | 0o600,
                    libc::O_WRONLY,
                )
                .unwrap();
            fs.write(&ctx(), a.ino, fh, 0, b"secret").unwrap();
            fs.release(a.ino, fh).unwrap();
        });
    }

    /// `HOST:PORT:path` of this server.
    fn at(&self, net: &Net, path: &str) -> String {
        format!("{}:{}:{path}", srv_ip(net), self.port)
    }

    /// A library client (uid 1000 for `ctx()`), inside the client namespace.
    fn lib<T: Send>(&self, net: &Net, f: impl FnOnce(&zcfs_client::RemoteFs) -> T + Send) -> T {
        let addr = format!("{}:{}", srv_ip(net), self.port);
        net.in_cli(move || {
            let mut cfg = zcfs_client::ClientConfig::new(&addr);
            cfg.secret = Some(SECRET.to_vec());
            cfg.timeout = Duration::from_secs(10);
            f(&zcfs_client::RemoteFs::connect(cfg).unwrap())
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_file(&self.image);
        let _ = fs::remove_file(&self.secret);
    }
}

fn srv_ip(net: &Net) -> String {
    net.addr().rsplit_once(':').unwrap().0.to_string()
}

/// `zcfs SUB --secret-file S ARGS...` run in the client namespace.
fn zcfs_in(net: &Net, srv: &Server, sub: &str, args: &[&str]) -> Output {
    net.cli_command(zcfs_bin())
        .arg(sub)
        .arg("--secret-file")
        .arg(&srv.secret)
        .args(args)
        .output()
        .unwrap()
}

#[track_caller]
fn ok(o: Output) -> Output {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// Exit status 1 and `want` on stderr (never a panic).
#[track_caller]
fn fails(o: Output, code: i32, want: &[&str]) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for w in want {
        assert!(err.contains(w), "wanted {w:?} in: {err}");
    }
    err
}

/// A fresh local directory for a test, removed on drop (a failing test's too).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("zcfs-transfer-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every entry under `root` by relative path: kind and contents (a file's bytes, a
/// symlink's target, nothing for a directory).
fn tree(root: &Path) -> Vec<(String, char, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for e in fs::read_dir(root.join(&rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let t = fs::symlink_metadata(&p).unwrap().file_type();
            let name = r.to_str().unwrap().to_string();
            if t.is_symlink() {
                let target = fs::read_link(&p).unwrap();
                out.push((name, 'l', target.to_str().unwrap().as_bytes().to_vec()));
            } else if t.is_dir() {
                out.push((name, 'd', Vec::new()));
                stack.push(r);
            } else if t.is_file() {
                out.push((name, 'f', fs::read(&p).unwrap()));
            } else {
                out.push((name, '?', Vec::new()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn files_round_trip_byte_for_byte_and_cat_and_ls_show_them() {
    let net = Net::new();
    let srv = Server::start(&net, "files", 7070, "1G", false);
    let d = scratch("files");
    // Not a multiple of any chunk: the last request is short.
    let big = pattern((5 << 20) + 12345, 7);
    fs::write(d.join("big"), &big).unwrap();
    fs::write(d.join("empty"), b"").unwrap();
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("big")), s(&d.join("empty")), &srv.at(&net, "/")],
    ));
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[&srv.at(&net, "/big"), s(&d.join("big2"))],
    ));
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[&srv.at(&net, "/empty"), s(&d.join("empty2"))],
    ));
    assert!(fs::read(d.join("big2")).unwrap() == big, "bytes differ");
    assert_eq!(fs::read(d.join("empty2")).unwrap(), b"");
    // What the server holds, through the library.
    let (size, esize) = srv.lib(&net, |fs| {
        let c = ctx();
        (
            fs.lookup(&c, ROOT, b"big").unwrap().size,
            fs.lookup(&c, ROOT, b"empty").unwrap().size,
        )
    });
    assert_eq!((size, esize), (big.len() as u64, 0));
    // Over an existing file: replaced whole (the old one was longer).
    fs::write(d.join("small"), b"short").unwrap();
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("small")), &srv.at(&net, "/big")],
    ));
    let cat = ok(zcfs_in(&net, &srv, "cat", &[&srv.at(&net, "/big")]));
    assert_eq!(cat.stdout, b"short");
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("big")), &srv.at(&net, "/big")],
    ));
    let cat = ok(zcfs_in(
        &net,
        &srv,
        "cat",
        &[
            &srv.at(&net, "/big"),
            &srv.at(&net, "/empty"),
            &srv.at(&net, "/big"),
        ],
    ));
    assert!(cat.stdout == [&big[..], &big[..]].concat(), "cat differs");
    // Every file cp wrote on the server was made durable before cp said so: one fsync
    // each (the library calls above made none).
    let stat = ok(zcfs_in(
        &net,
        &srv,
        "stat",
        &["--json", &format!("{}:{}", srv_ip(&net), srv.port)],
    ));
    let stat: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert_eq!(stat["ops"]["fsync"]["count"], 4, "{}", stat["ops"]);
    let ls = ok(zcfs_in(&net, &srv, "ls", &[&srv.at(&net, "/")]));
    assert_eq!(String::from_utf8_lossy(&ls.stdout), "big\nempty\n");
    let ls = ok(zcfs_in(&net, &srv, "ls", &["-l", &srv.at(&net, "/big")]));
    let line = String::from_utf8_lossy(&ls.stdout).into_owned();
    let mode = fs::metadata(d.join("big")).unwrap().mode();
    let want_mode = if mode & 0o044 == 0o044 {
        "-rw-r--r--"
    } else {
        "-rw-"
    };
    assert!(line.starts_with(want_mode), "{line}");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (fields[1], fields[2], fields[3], fields[4]),
        ("1", "0", "0", &*big.len().to_string()),
        "{line}"
    );
    assert!(line.trim_end().ends_with(&srv.at(&net, "/big")), "{line}");
}

#[test]
fn trees_copy_recursively_both_ways_and_between_servers() {
    let net = Net::new();
    let one = Server::start(&net, "tree1", 7070, "1G", false);
    let two = Server::start(&net, "tree2", 7071, "1G", false);
    let d = scratch("tree");
    let src = d.join("src");
    fs::create_dir_all(src.join("sub/deeper")).unwrap();
    fs::create_dir_all(src.join("empty_dir")).unwrap();
    fs::write(src.join("a"), pattern((1 << 20) + 3, 1)).unwrap();
    fs::write(src.join("sub/deeper/b"), pattern(4097, 2)).unwrap();
    fs::write(src.join("sub/zero"), b"").unwrap();
    std::os::unix::fs::symlink("sub/deeper/b", src.join("link")).unwrap();
    std::os::unix::fs::symlink("/nowhere/at/all", src.join("dangling")).unwrap();
    let fifo = std::ffi::CString::new(s(&src.join("fifo"))).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let want: Vec<_> = tree(&src).into_iter().filter(|e| e.0 != "fifo").collect();
    assert_eq!(want.len(), 8);

    // Local to server: the fifo is skipped with a warning, the rest copied.
    let o = zcfs_in(&net, &one, "cp", &["-r", s(&src), &one.at(&net, "/")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("skipping") && err.contains("fifo"), "{err}");
    // Server to server: the same server, then another.
    ok(zcfs_in(
        &net,
        &one,
        "cp",
        &["-r", &one.at(&net, "/src"), &one.at(&net, "/copy")],
    ));
    let o = net
        .cli_command(zcfs_bin())
        .args(["cp", "-r", "--secret-file"])
        .arg(&one.secret)
        .args([&one.at(&net, "/copy"), &two.at(&net, "/other")])
        .output()
        .unwrap();
    ok(o);
    // And back: each copy equals the source by kind and bytes.
    for (srv, path, to) in [
        (&one, "/src", "back1"),
        (&one, "/copy", "back2"),
        (&two, "/other", "back3"),
    ] {
        ok(zcfs_in(
            &net,
            srv,
            "cp",
            &["-r", &srv.at(&net, path), s(&d.join(to))],
        ));
        assert!(tree(&d.join(to)) == want, "{to} differs from the source");
    }
    // Into an existing directory: under its own name; merged when copied again.
    fs::create_dir(d.join("into")).unwrap();
    ok(zcfs_in(
        &net,
        &two,
        "cp",
        &["-r", &two.at(&net, "/other"), s(&d.join("into"))],
    ));
    ok(zcfs_in(
        &net,
        &two,
        "cp",
        &["-r", &two.at(&net, "/other"), s(&d.join("into"))],
    ));
    assert!(tree(&d.join("into/other")) == want);
    // Without -r a symlink operand is followed: its target's bytes.
    ok(zcfs_in(
        &net,
        &one,
        "cp",
        &[&one.at(&net, "/src/link"), s(&d.join("followed"))],
    ));
    assert_eq!(fs::read(d.join("followed")).unwrap(), pattern(4097, 2));
    // ls shows kinds and targets.
    let ls = ok(zcfs_in(&net, &one, "ls", &["-l", &one.at(&net, "/src")]));
    let ls = String::from_utf8_lossy(&ls.stdout);
    assert!(ls.starts_with("total "), "{ls}");
    assert!(ls.contains("link -> sub/deeper/b"), "{ls}");
    assert!(
        ls.lines()
            .any(|l| l.starts_with('d') && l.ends_with(" sub")),
        "{ls}"
    );
}

/// A copy onto an existing device or fifo writes into it, as cp does (`zcfs cp SRV:/f
/// /dev/null` to time a read): it does not unlink the node and put a regular file in
/// its place, nor change its mode or times, even with -p. (Found when a benchmark's
/// `zcfs cp ... /dev/null` as root replaced the machine's /dev/null.)
#[test]
fn a_copy_onto_a_device_or_fifo_writes_into_it_and_leaves_the_node() {
    use std::os::unix::fs::FileTypeExt;
    let net = Net::new();
    let srv = Server::start(&net, "devnull", 7076, "1G", false);
    let d = scratch("devnull");
    let data = pattern((5 << 20) / 2 + 77, 9); // several chunks, so order matters
    fs::write(d.join("f"), &data).unwrap();
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("f")), &srv.at(&net, "/f")],
    ));
    // A null device of our own (c 1 3), mode 0666.
    let null = d.join("null");
    let c = std::ffi::CString::new(s(&null)).unwrap();
    // SAFETY: a NUL-terminated path; makes a device node, nothing else.
    assert_eq!(
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) },
        0
    );
    fs::set_permissions(&null, fs::Permissions::from_mode(0o666)).unwrap();
    let from = srv.at(&net, "/f");
    for extra in [&[][..], &["-p"][..]] {
        let mut args = extra.to_vec();
        args.extend([from.as_str(), s(&null)]);
        ok(zcfs_in(&net, &srv, "cp", &args));
        let m = fs::symlink_metadata(&null).unwrap();
        assert!(
            m.file_type().is_char_device(),
            "{extra:?}: the device was replaced"
        );
        assert_eq!(m.mode() & 0o7777, 0o666, "{extra:?}: its mode changed");
    }
    // A fifo: the bytes come out of it, in order.
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a NUL-terminated path; makes a fifo.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || fs::read(&fifo).unwrap())
    };
    ok(zcfs_in(&net, &srv, "cp", &[&from, s(&fifo)]));
    assert!(reader.join().unwrap() == data, "the fifo's bytes differ");
    assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
}

/// A socket where the copy goes is not unlinked and replaced by a regular file (a
/// daemon's /dev/log or /run/...sock as root); as cp, the copy fails (ENXIO) and the
/// socket stays, also inside a directory a tree is copied into.
#[test]
fn a_copy_onto_a_socket_fails_and_leaves_it() {
    use std::os::unix::fs::FileTypeExt;
    let net = Net::new();
    let srv = Server::start(&net, "sock", 7080, "1G", false);
    let d = scratch("sock");
    fs::write(d.join("f"), b"data").unwrap();
    fs::create_dir(d.join("t")).unwrap();
    fs::write(d.join("t/sock"), b"data").unwrap();
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("f")), &srv.at(&net, "/f")],
    ));
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &["-r", s(&d.join("t")), &srv.at(&net, "/t")],
    ));
    fs::create_dir(d.join("into")).unwrap();
    fs::create_dir(d.join("into/t")).unwrap();
    let _a = std::os::unix::net::UnixListener::bind(d.join("sock")).unwrap();
    let _b = std::os::unix::net::UnixListener::bind(d.join("into/t/sock")).unwrap();
    let o = zcfs_in(&net, &srv, "cp", &[&srv.at(&net, "/f"), s(&d.join("sock"))]);
    fails(o, 1, &["sock", "socket", "ENXIO"]);
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &["-r", &srv.at(&net, "/t"), s(&d.join("into"))],
    );
    fails(o, 1, &["sock", "socket", "ENXIO"]);
    for p in ["sock", "into/t/sock"] {
        let m = fs::symlink_metadata(d.join(p)).unwrap();
        assert!(m.file_type().is_socket(), "{p}: the socket was replaced");
    }
}

/// A source that cannot be read is found out before the destination is touched, as
/// cp does: an existing file is not emptied, a symlink there not removed, and a fifo
/// with no reader is not opened (the copy would wait for a reader before failing).
#[test]
fn an_unreadable_source_leaves_the_destination_untouched() {
    let net = Net::new();
    // Root is squashed to nobody: 1000's 0600 file cannot be read.
    let srv = Server::start(&net, "unreadable", 7081, "1G", true);
    srv.write_private(&net);
    let private = srv.at(&net, "/private");
    let d = scratch("unreadable");
    fs::write(d.join("keep"), b"kept").unwrap();
    std::os::unix::fs::symlink("keep", d.join("link")).unwrap();
    for to in ["keep", "link", "new"] {
        let o = zcfs_in(&net, &srv, "cp", &[&private, s(&d.join(to))]);
        fails(o, 1, &["Permission denied"]);
    }
    assert_eq!(fs::read(d.join("keep")).unwrap(), b"kept", "emptied");
    assert!(fs::symlink_metadata(d.join("link")).unwrap().is_symlink());
    assert!(!d.join("new").exists(), "an empty file was made");
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a NUL-terminated path; makes a fifo.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let mut child = net
        .cli_command(zcfs_bin())
        .arg("cp")
        .arg("--secret-file")
        .arg(&srv.secret)
        .args([&private, s(&fifo)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cp of an unreadable file onto a fifo with no reader hung");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    fails(child.wait_with_output().unwrap(), 1, &["Permission denied"]);
}

/// A file and a symlink to it on another file system are the same file: a copy of one
/// onto the other is refused, not emptied (the device compared is the followed one
/// when the symlink was followed).
#[test]
fn a_copy_onto_itself_through_a_symlink_across_file_systems_is_refused() {
    let d = scratch("selflink");
    // /dev/shm is a tmpfs, the scratch directory another file system.
    let shm_dir = Scratch(PathBuf::from(format!(
        "/dev/shm/zcfs-transfer-selflink-{}",
        std::process::id()
    )));
    fs::create_dir_all(&*shm_dir).unwrap();
    let shm = shm_dir.join("f");
    fs::write(&shm, b"precious").unwrap();
    if fs::metadata(&*shm_dir).unwrap().dev() == fs::metadata(&*d).unwrap().dev() {
        eprintln!("skipped: {} and /dev/shm are one file system", d.display());
        return;
    }
    std::os::unix::fs::symlink(&shm, d.join("link")).unwrap();
    for (from, to) in [(shm.clone(), d.join("link")), (d.join("link"), shm.clone())] {
        let o = std::process::Command::new(zcfs_bin())
            .args(["cp", s(&from), s(&to)])
            .output()
            .unwrap();
        fails(o, 1, &["the same file"]);
        assert_eq!(fs::read(&shm).unwrap(), b"precious", "{from:?} onto {to:?}");
    }
}

#[test]
fn preserve_keeps_mode_and_times_and_without_it_the_umask_applies() {
    let net = Net::new();
    let srv = Server::start(&net, "preserve", 7070, "1G", false);
    let d = scratch("preserve");
    let f = d.join("f");
    fs::write(&f, b"keep my times").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o4751)).unwrap();
    let t = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    fs::set_permissions(d.join("dir"), fs::Permissions::from_mode(0o750)).unwrap();
    fs::File::open(d.join("dir"))
        .unwrap()
        .set_times(fs::FileTimes::new().set_accessed(t).set_modified(t))
        .unwrap();
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &["-p", s(&f), &srv.at(&net, "/kept")],
    ));
    // Without -p, under umask 027: the source's 0751 less 027.
    let mut plain = net.cli_command("sh");
    plain
        .args([
            "-c",
            "umask 027 && exec \"$@\"",
            "sh",
            zcfs_bin(),
            "cp",
            "--secret-file",
        ])
        .arg(&srv.secret)
        .args([s(&f), &srv.at(&net, "/plain")]);
    ok(plain.output().unwrap());
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &["-rp", s(&d.join("dir")), &srv.at(&net, "/dirkept")],
    ));
    let (kept, plain, dir) = srv.lib(&net, |fs| {
        let c = ctx();
        (
            fs.lookup(&c, ROOT, b"kept").unwrap(),
            fs.lookup(&c, ROOT, b"plain").unwrap(),
            fs.lookup(&c, ROOT, b"dirkept").unwrap(),
        )
    });
    assert_eq!(kept.mode & 0o7777, 0o4751);
    assert_eq!(
        (kept.mtime.sec, kept.mtime.nsec),
        (1_000_000_000, 123_456_789)
    );
    assert_eq!(kept.atime.sec, 1_000_000_000);
    assert_eq!(dir.mode & 0o7777, 0o750);
    assert_eq!(dir.mtime.sec, 1_000_000_000);
    assert_eq!(plain.mode & 0o7777, 0o750, "source mode less the umask");
    assert!(plain.mtime.sec > 1_000_000_000, "a new file's own time");
    // And back, kept again.
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &["-p", &srv.at(&net, "/kept"), s(&d.join("back"))],
    ));
    let m = fs::metadata(d.join("back")).unwrap();
    assert_eq!(
        (m.mode() & 0o7777, m.mtime(), m.mtime_nsec()),
        (0o4751, 1_000_000_000, 123_456_789)
    );
    let ls = ok(zcfs_in(&net, &srv, "ls", &["-l", &srv.at(&net, "/kept")]));
    let ls = String::from_utf8_lossy(&ls.stdout);
    assert!(
        ls.starts_with("-rwsr-x--x ") && ls.contains(" 2001 "),
        "{ls}"
    );
}

#[test]
fn failures_are_reported_per_file_with_a_non_zero_status() {
    let net = Net::new();
    let srv = Server::start(&net, "errors", 7070, "1G", false);
    let d = scratch("errors");
    fs::write(d.join("good"), b"good").unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("good")), &srv.at(&net, "/file")],
    ));
    // A missing source among good ones: the others are copied.
    let missing = srv.at(&net, "/nope");
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[&missing, s(&d.join("good")), &srv.at(&net, "/")],
    );
    fails(
        o,
        1,
        &[&format!("zcfs cp: {missing}: No such file or directory")],
    );
    ok(zcfs_in(&net, &srv, "cat", &[&srv.at(&net, "/good")]));
    let o = zcfs_in(&net, &srv, "cp", &[s(&d.join("nope")), &srv.at(&net, "/x")]);
    fails(o, 1, &["nope", "No such file"]);
    // A directory without -r.
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("dir")), &srv.at(&net, "/dir")],
    );
    fails(o, 1, &["dir", "without -r"]);
    // A path under a file on the server, as destination and as source.
    let under = srv.at(&net, "/file/sub");
    let o = zcfs_in(&net, &srv, "cp", &[s(&d.join("good")), &under]);
    fails(o, 1, &[&under, "Not a directory"]);
    let o = zcfs_in(&net, &srv, "cp", &[&under, s(&d.join("x"))]);
    fails(o, 1, &[&under, "Not a directory"]);
    // A directory over a file and a file over a directory.
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &["-r", s(&d.join("dir")), &srv.at(&net, "/file")],
    );
    fails(o, 1, &["non-directory"]);
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &["-r", s(&d.join("dir")), &srv.at(&net, "/rdir")],
    ));
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("good")), &srv.at(&net, "/rdir/")],
    );
    ok(o);
    ok(zcfs_in(
        &net,
        &srv,
        "cp",
        &["-r", s(&d.join("dir")), &srv.at(&net, "/rdir")],
    ));
    fs::create_dir(d.join("x")).unwrap();
    fs::write(d.join("x/dir"), b"a file").unwrap();
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("x/dir")), &srv.at(&net, "/rdir")],
    );
    fails(o, 1, &["cannot overwrite a directory with a file"]);
    // A file onto itself is refused, not emptied.
    let good = srv.at(&net, "/rdir/good");
    for to in [srv.at(&net, "/rdir"), good.clone()] {
        let o = zcfs_in(&net, &srv, "cp", &[&good, &to]);
        fails(o, 1, &["the same file"]);
    }
    let o = zcfs_in(&net, &srv, "cp", &[s(&d.join("good")), s(&d)]);
    fails(o, 1, &["the same file"]);
    assert_eq!(ok(zcfs_in(&net, &srv, "cat", &[&good])).stdout, b"good");
    assert_eq!(fs::read(d.join("good")).unwrap(), b"good");
    // Several sources need a directory. Operands that are neither local nor a server
    // path, a server that wants a secret: cp does not start.
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[
            s(&d.join("good")),
            s(&d.join("good")),
            &srv.at(&net, "/file"),
        ],
    );
    fails(o, 1, &["not a directory"]);
    let o = zcfs_in(&net, &srv, "cp", &["host:port:/x", s(&d.join("y"))]);
    fails(o, 8, &["not a port", "./host:port:/x"]);
    let o = net
        .cli_command(zcfs_bin())
        .args(["cp", s(&d.join("good")), &srv.at(&net, "/s")])
        .output()
        .unwrap();
    fails(o, 8, &["--secret-file"]);
    // cat and ls.
    let o = zcfs_in(
        &net,
        &srv,
        "cat",
        &[&srv.at(&net, "/rdir"), &srv.at(&net, "/file")],
    );
    let err = fails(o, 1, &["Is a directory"]);
    assert!(!err.contains("/file"), "{err}");
    let o = zcfs_in(&net, &srv, "ls", &[&missing]);
    fails(o, 1, &[&missing, "No such file"]);
}

#[test]
fn permission_denied_and_root_squash_are_reported() {
    let net = Net::new();
    // Root on the client is squashed to nobody; the root directory is 1000's, 0755.
    let srv = Server::start(&net, "squash", 7070, "1G", true);
    srv.write_private(&net);
    let d = scratch("squash");
    fs::write(d.join("f"), b"data").unwrap();
    let o = zcfs_in(&net, &srv, "cp", &[s(&d.join("f")), &srv.at(&net, "/f")]);
    fails(o, 1, &["Permission denied"]);
    let o = zcfs_in(&net, &srv, "cat", &[&srv.at(&net, "/private")]);
    fails(o, 1, &["/private", "Permission denied"]);
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[&srv.at(&net, "/private"), s(&d.join("p"))],
    );
    fails(o, 1, &["Permission denied"]);
    assert!(!d.join("p").exists() || fs::read(d.join("p")).unwrap().is_empty());
}

#[test]
fn a_full_server_is_enospc_not_a_panic() {
    let net = Net::new();
    let srv = Server::start(&net, "full", 7070, "64M", false);
    let d = scratch("full");
    fs::write(d.join("huge"), pattern(96 << 20, 3)).unwrap();
    let o = zcfs_in(
        &net,
        &srv,
        "cp",
        &[s(&d.join("huge")), &srv.at(&net, "/huge")],
    );
    fails(o, 1, &["huge", "No space left"]);
}
