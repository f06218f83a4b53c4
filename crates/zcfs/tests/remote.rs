//! Remote access between two real network namespaces joined by a veth pair (root
//! required, as in CI): the full operation set, concurrent clients, a server killed and
//! restarted mid-workload, a cut link, hostile peers, and a FUSE mount of a remote
//! volume running unmodified programs.

mod common;
use common::*;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, Ctx, SetAttr, ROOT};
use zcfs_client::{ClientConfig, RemoteFs};

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

static NEXT: AtomicU32 = AtomicU32::new(1);

/// Two namespaces, `srv` (198.18.N.1) and `cli` (198.18.N.2), joined by a veth pair.
struct Net {
    srv: String,
    cli: String,
    cli_if: String,
    srv_ip: String,
}

impl Net {
    fn new() -> Net {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let tag = format!("{}{n}", std::process::id() % 10000);
        let (srv, cli) = (format!("zsrv{tag}"), format!("zcli{tag}"));
        let (sif, cif) = (format!("zs{tag}"), format!("zc{tag}"));
        let subnet = 100 + (std::process::id() % 50) * 3 + n;
        run(&["ip", "netns", "add", &srv]);
        run(&["ip", "netns", "add", &cli]);
        run(&[
            "ip", "link", "add", &sif, "type", "veth", "peer", "name", &cif,
        ]);
        run(&["ip", "link", "set", &sif, "netns", &srv]);
        run(&["ip", "link", "set", &cif, "netns", &cli]);
        let srv_ip = format!("198.18.{subnet}.1");
        run(&[
            "ip",
            "-n",
            &srv,
            "addr",
            "add",
            &format!("{srv_ip}/24"),
            "dev",
            &sif,
        ]);
        run(&[
            "ip",
            "-n",
            &cli,
            "addr",
            "add",
            &format!("198.18.{subnet}.2/24"),
            "dev",
            &cif,
        ]);
        for (ns, i) in [(&srv, &sif), (&cli, &cif)] {
            run(&["ip", "-n", ns, "link", "set", i, "up"]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        Net {
            srv,
            cli,
            cli_if: cif,
            srv_ip,
        }
    }

    fn addr(&self) -> String {
        format!("{}:7070", self.srv_ip)
    }

    fn link(&self, up: bool) {
        run(&[
            "ip",
            "-n",
            &self.cli,
            "link",
            "set",
            &self.cli_if,
            if up { "up" } else { "down" },
        ]);
    }

    /// Run `f` on a thread inside the client namespace (sockets it opens live there).
    fn in_cli<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.cli);
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = File::open(&path).unwrap();
                // SAFETY: setns on this thread only, with a valid namespace fd.
                assert_eq!(
                    unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) },
                    0
                );
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.srv])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.cli])
            .status();
    }
}

/// A volume image and a `zcfs serve` of it in the server namespace.
struct Served {
    image: PathBuf,
    child: Option<Child>,
    secret: PathBuf,
}

impl Served {
    fn new(net: &Net, name: &str, extra: &[&str]) -> Served {
        let image = PathBuf::from(format!(
            "/dev/shm/zcfs-remote-{name}-{}.img",
            std::process::id()
        ));
        mkfs(&image, "1G", &[]);
        let secret = image.with_extension("secret");
        fs::write(&secret, "a-test-secret-of-enough-length\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        let mut s = Served {
            image,
            child: None,
            secret,
        };
        s.start(net, extra);
        s
    }

    fn start(&mut self, net: &Net, extra: &[&str]) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &net.srv, zcfs_bin(), "serve"])
            .arg(&self.image)
            .args(["--listen", &net.addr(), "--secret-file"])
            .arg(&self.secret)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("serving"), "server did not start: {line}");
        self.child = Some(child);
    }

    fn kill(&mut self, sig: i32) -> String {
        let mut c = self.child.take().unwrap();
        // SAFETY: signalling our own child (`ip netns exec` execs zcfs in place).
        unsafe { libc::kill(c.id() as i32, sig) };
        c.wait().unwrap();
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        err
    }

    fn client(&self, net: &Net, timeout: Duration) -> RemoteFs {
        client(net, timeout)
    }

    fn fsck(&self) {
        let out = Command::new(zcfs_bin())
            .arg("fsck")
            .arg(&self.image)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_file(&self.image);
        let _ = fs::remove_file(&self.secret);
    }
}

/// A client with the test secret (call from inside the client namespace).
fn client(net: &Net, timeout: Duration) -> RemoteFs {
    let mut cfg = ClientConfig::new(&net.addr());
    cfg.secret = Some(b"a-test-secret-of-enough-length".to_vec());
    cfg.timeout = timeout;
    RemoteFs::connect(cfg).unwrap()
}

fn ctx() -> Ctx {
    Ctx {
        uid: 1000,
        gid: 1000,
        pid: 1,
    }
}

fn read_all(fs: &dyn Backend, ino: u64, fh: u64, off: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    fs.read(ino, fh, off, len, &mut |s| {
        for x in s {
            out.extend_from_slice(x);
        }
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn full_operation_set_across_veth() {
    let net = Net::new();
    let mut srv = Served::new(&net, "ops", &[]);
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(5));
        let c = ctx();
        let d = fs.mkdir(&c, ROOT, b"dir", 0o750).unwrap();
        assert_eq!((d.uid, d.gid, d.mode & 0o777), (1000, 1000, 0o750));
        let (f, fh) = fs
            .create(&c, d.ino, b"file", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        assert_eq!(
            fs.write(f.ino, fh, 12345, &data).unwrap() as usize,
            data.len()
        );
        assert_eq!(read_all(&fs, f.ino, fh, 12345, 3_000_000), data);
        assert_eq!(
            read_all(&fs, f.ino, fh, 0, 10),
            vec![0u8; 10],
            "hole reads as zeros"
        );
        fs.fsync(f.ino, fh, false).unwrap();
        let a = fs
            .setattr(
                &c,
                f.ino,
                &SetAttr {
                    size: Some(100),
                    mode: Some(0o600),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!((a.size, a.mode & 0o777), (100, 0o600));
        let s = fs.symlink(&c, ROOT, b"sym", b"dir/file").unwrap();
        assert_eq!(fs.readlink(s.ino).unwrap(), b"dir/file");
        assert_eq!(fs.link(&c, f.ino, ROOT, b"hard").unwrap().nlink, 2);
        fs.rename(&c, ROOT, b"hard", d.ino, b"hard2", 0).unwrap();
        assert_eq!(
            fs.rename(&c, ROOT, b"sym", d.ino, b"hard2", 1)
                .unwrap_err()
                .errno,
            libc::EEXIST
        );
        fs.rename(&c, ROOT, b"sym", d.ino, b"hard2", 2).unwrap();
        assert_eq!(
            fs.lookup(&c, ROOT, b"sym").unwrap().ino,
            f.ino,
            "exchange swapped the names"
        );
        let mut names = Vec::new();
        fs.readdir(d.ino, 0, true, &mut |e| {
            assert!(e.attr.is_some());
            names.push(String::from_utf8(e.name).unwrap());
            true
        })
        .unwrap();
        names.sort();
        assert_eq!(names, ["file", "hard2"]);
        // An absent xattr, asked twice (the second answer may come from the client's
        // cache), then set: the cache must not hide the new value.
        assert_eq!(
            fs.getxattr(f.ino, b"user.k").unwrap_err().errno,
            libc::ENODATA
        );
        assert_eq!(
            fs.getxattr(f.ino, b"user.k").unwrap_err().errno,
            libc::ENODATA
        );
        fs.setxattr(f.ino, b"user.k", b"v", 0).unwrap();
        assert_eq!(fs.getxattr(f.ino, b"user.k").unwrap(), b"v");
        assert_eq!(fs.listxattr(f.ino).unwrap(), vec![b"user.k".to_vec()]);
        fs.removexattr(f.ino, b"user.k").unwrap();
        assert_eq!(
            fs.getxattr(f.ino, b"user.k").unwrap_err().errno,
            libc::ENODATA
        );
        assert!(fs.statfs().unwrap().bfree > 0);
        assert_eq!(
            fs.rmdir(&c, ROOT, b"dir").unwrap_err().errno,
            libc::ENOTEMPTY
        );
        assert_eq!(
            fs.lookup(&c, ROOT, b"nope").unwrap_err().errno,
            libc::ENOENT
        );
        assert_eq!(
            fs.mkdir(&c, ROOT, b"dir", 0o755).unwrap_err().errno,
            libc::EEXIST
        );
        fs.release(f.ino, fh).unwrap();
        fs.unlink(&c, d.ino, b"file").unwrap();
        fs.unlink(&c, d.ino, b"hard2").unwrap();
        fs.unlink(&c, ROOT, b"sym").unwrap();
        fs.rmdir(&c, ROOT, b"dir").unwrap();
        fs.sync_all().unwrap();
    });
    let err = srv.kill(libc::SIGTERM);
    assert!(err.contains("shut down"), "{err}");
    srv.fsck();
}

#[test]
fn concurrent_clients_on_one_file_and_many_files() {
    let net = Net::new();
    let srv = Served::new(&net, "conc", &[]);
    net.in_cli(|| {
        let setup = srv.client(&net, Duration::from_secs(10));
        let (shared, _) = setup
            .create(&ctx(), ROOT, b"shared", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let (srv, net) = (&srv, &net);
                s.spawn(move || {
                    let fs = srv.client(net, Duration::from_secs(10));
                    for i in 0..50u32 {
                        let name = format!("t{t}-f{i}");
                        let (f, fh) = fs
                            .create(
                                &ctx(),
                                ROOT,
                                name.as_bytes(),
                                libc::S_IFREG | 0o644,
                                libc::O_RDWR,
                            )
                            .unwrap();
                        fs.write(f.ino, fh, 0, &vec![t ^ i as u8; 1000 + i as usize])
                            .unwrap();
                        fs.release(f.ino, fh).unwrap();
                        // Each thread owns every 4th 4 KiB block of the shared file.
                        let blk = (i * 4 + t as u32) as u64;
                        fs.write(shared.ino, 0, blk * 4096 + 100, &[t + 1; 3000])
                            .unwrap();
                    }
                });
            }
        });
        let fs = srv.client(&net, Duration::from_secs(10));
        for t in 0..4u8 {
            for i in 0..50u32 {
                let a = fs
                    .lookup(&ctx(), ROOT, format!("t{t}-f{i}").as_bytes())
                    .unwrap();
                assert_eq!(
                    read_all(&fs, a.ino, 0, 0, 100_000),
                    vec![t ^ i as u8; 1000 + i as usize]
                );
                let blk = (i * 4 + t as u32) as u64;
                let got = read_all(&fs, shared.ino, 0, blk * 4096, 4096);
                assert_eq!(&got[100..3100], &[t + 1; 3000][..], "block {blk}");
                assert!(got[..100].iter().all(|&b| b == 0) && got[3100..].iter().all(|&b| b == 0));
            }
        }
    });
}

#[test]
fn server_sigkill_mid_workload_then_restart() {
    let net = Net::new();
    let mut srv = Served::new(&net, "kill", &[]);
    let acked = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let writer_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        let (net_r, acked_w, done_w) = (&net, acked.clone(), writer_done.clone());
        let writer = s.spawn(move || {
            net_r.in_cli(|| {
                let fs = client(net_r, Duration::from_secs(3));
                let mut errors = 0;
                for i in 0..4000u32 {
                    if done_w.load(Ordering::SeqCst) {
                        break;
                    }
                    let r = (|| {
                        let name = format!("f{i}");
                        let (f, fh) = fs.create(
                            &ctx(),
                            ROOT,
                            name.as_bytes(),
                            libc::S_IFREG | 0o644,
                            libc::O_RDWR,
                        )?;
                        fs.write(f.ino, fh, 0, &vec![(i % 251) as u8; 4096 + i as usize])?;
                        fs.fsync(f.ino, fh, false)?;
                        fs.release(f.ino, fh)
                    })();
                    match r {
                        Ok(()) => acked_w.lock().unwrap().push(i),
                        Err(e) => {
                            // The kill: a clear error, not a hang.
                            assert!(
                                [
                                    libc::ENOTCONN,
                                    libc::ETIMEDOUT,
                                    libc::ECONNREFUSED,
                                    libc::ECONNRESET,
                                    libc::EEXIST,
                                    libc::ENOENT,
                                    libc::ESTALE
                                ]
                                .contains(&e.errno),
                                "unexpected error {e}"
                            );
                            errors += 1;
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
                errors
            })
        });
        // Let it run, kill the server hard, restart it on the same volume.
        while acked.lock().unwrap().len() < 100 {
            std::thread::sleep(Duration::from_millis(10));
        }
        srv.kill(libc::SIGKILL);
        std::thread::sleep(Duration::from_millis(300));
        srv.start(&net, &[]);
        let t = Instant::now();
        let before = acked.lock().unwrap().len();
        while acked.lock().unwrap().len() < before + 100 {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "client did not carry on after the restart"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        writer_done.store(true, Ordering::SeqCst);
        let errors = writer.join().unwrap();
        assert!(errors >= 1, "the kill should have been noticed");
    });
    // Every acknowledged (fsync'd) file is there with its bytes.
    net.in_cli(|| {
        let fs = srv.client(&net, Duration::from_secs(5));
        for &i in acked.lock().unwrap().iter() {
            let a = fs
                .lookup(&ctx(), ROOT, format!("f{i}").as_bytes())
                .unwrap_or_else(|e| panic!("f{i} lost: {e}"));
            assert_eq!(
                read_all(&fs, a.ino, 0, 0, 1 << 20),
                vec![(i % 251) as u8; 4096 + i as usize],
                "f{i}"
            );
        }
    });
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

#[test]
fn cut_link_gives_a_bounded_error_then_recovers() {
    let net = Net::new();
    let srv = Served::new(&net, "cut", &[]);
    net.in_cli(|| {
        let timeout = Duration::from_secs(2);
        let fs = srv.client(&net, timeout);
        let (f, fh) = fs
            .create(&ctx(), ROOT, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
            .unwrap();
        fs.write(f.ino, fh, 0, b"before").unwrap();
        net.link(false);
        let t = Instant::now();
        let e = fs.write(f.ino, fh, 0, b"during").unwrap_err();
        let waited = t.elapsed();
        assert!(waited < timeout * 3, "error took {waited:?}");
        assert!(
            [
                libc::ETIMEDOUT,
                libc::ENOTCONN,
                libc::EHOSTUNREACH,
                libc::ENETUNREACH
            ]
            .contains(&e.errno),
            "{e}"
        );
        net.link(true);
        // Reconnects by itself; the handle still works.
        let t = Instant::now();
        loop {
            match fs.write(f.ino, fh, 0, b"after!") {
                Ok(_) => break,
                Err(e) => {
                    assert!(t.elapsed() < Duration::from_secs(20), "no recovery: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        assert_eq!(read_all(&fs, f.ino, fh, 0, 6), b"after!");
        assert!(fs.client().reconnects.load(Ordering::Relaxed) >= 1);
    });
}

#[test]
fn hostile_peers_and_wrong_secrets_are_dropped() {
    let net = Net::new();
    let mut srv = Served::new(&net, "hostile", &[]);
    let addr = net.addr();
    net.in_cli(|| {
        use zcfs_protocol::{
            Cred, GetattrReq, NodeRef, Op, ReqHeader, Request, RespHeader, Wire, WriteReq, REQ_HDR,
            RESP_HDR,
        };
        let raw = || TcpStream::connect(&addr).unwrap();
        let handshake = |s: &mut TcpStream| {
            zcfs_transport::client_handshake(s, Some(b"a-test-secret-of-enough-length"), 77)
                .unwrap();
        };
        let dropped = |mut s: TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("connection not dropped: {other:?}"),
            }
        };
        // Garbage instead of a hello.
        let mut s = raw();
        s.write_all(&[0xab; 64]).unwrap();
        dropped(s);
        // Our client with a wrong secret refuses the server (its proof does not verify).
        let mut s = raw();
        let e = zcfs_transport::client_handshake(&mut s, Some(b"not-the-secret-at-all"), 78)
            .unwrap_err();
        assert!(
            matches!(e, zcfs_transport::TransportError::AuthFailed),
            "{e}"
        );
        drop(s);
        // No secret at all.
        let mut s = raw();
        assert!(matches!(
            zcfs_transport::client_handshake(&mut s, None, 79),
            Err(zcfs_transport::TransportError::SecretRequired)
        ));
        drop(s);
        // A peer that answers with a forged proof: the server refuses it.
        {
            use zcfs_protocol::handshake::*;
            let mut s = raw();
            s.write_all(
                &Hello {
                    version: zcfs_protocol::VERSION as u16,
                    features: 0,
                    nonce: [7; 32],
                    session: 80,
                }
                .encode(),
            )
            .unwrap();
            let mut w = [0u8; WELCOME_LEN];
            s.read_exact(&mut w).unwrap();
            assert!(Welcome::decode(&w).unwrap().auth);
            s.write_all(&[0x42; PROOF_LEN]).unwrap();
            let mut v = [0u8; VERDICT_LEN];
            s.read_exact(&mut v).unwrap();
            assert_eq!(u64::from_le_bytes(v), libc::EACCES as u64);
            dropped(s);
        }
        // Bad magic after a good handshake.
        let mut s = raw();
        handshake(&mut s);
        s.write_all(&[0u8; REQ_HDR]).unwrap();
        dropped(s);
        // Headers that cannot frame a message: an oversized body, oversized data, data
        // on a request other than write.
        for (op, body_len, data_len) in [
            (Op::Statfs, 1u32 << 30, 0u32),
            (Op::Write, 0, u32::MAX),
            (Op::Read, 0, 1),
        ] {
            let mut s = raw();
            handshake(&mut s);
            let h = ReqHeader::new(op, 1, body_len, data_len, Cred::default());
            s.write_all(&h.encode()).unwrap();
            dropped(s);
        }
        // Well-framed requests with invalid bodies are answered with an errno, and the
        // same connection goes on: a name with '/', a name of 300 bytes, a write whose
        // body disagrees with its header (its payload is skipped).
        let mut s = raw();
        handshake(&mut s);
        let mut send = |h: ReqHeader, body: &[u8], data: &[u8]| {
            s.write_all(&h.encode()).unwrap();
            s.write_all(body).unwrap();
            s.write_all(data).unwrap();
            let mut rh = [0u8; RESP_HDR];
            s.read_exact(&mut rh).unwrap();
            let rh = RespHeader::decode(&rh).unwrap();
            assert_eq!(rh.id, h.id);
            let mut body = vec![0u8; (rh.body_len + rh.data_len) as usize];
            s.read_exact(&mut body).unwrap();
            rh.status
        };
        let lookup = |name: &[u8]| {
            let mut b = NodeRef::ino(1).encode();
            (name.len() as u16).put(&mut b);
            b.extend_from_slice(name);
            b
        };
        let body = lookup(b"a/b");
        let h = ReqHeader::new(Op::Lookup, 10, body.len() as u32, 0, Cred::default());
        assert_eq!(send(h, &body, &[]), libc::EINVAL);
        let body = lookup(&[b'n'; 300]);
        let h = ReqHeader::new(Op::Lookup, 11, body.len() as u32, 0, Cred::default());
        assert_eq!(send(h, &body, &[]), libc::ENAMETOOLONG);
        let body = WriteReq {
            node: NodeRef::ino(1),
            fh: 0,
            offset: 0,
            size: 5,
        }
        .encode();
        let h = ReqHeader::new(Op::Write, 12, body.len() as u32, 7000, Cred::default());
        assert_eq!(send(h, &body, &[9u8; 7000]), libc::EINVAL);
        let (h, body) = Request::from(GetattrReq {
            node: NodeRef::ino(1),
        })
        .encode(13, Cred::default());
        assert_eq!(send(ReqHeader::decode(&h).unwrap(), &body, &[]), 0);
        drop(s);
        // A truncated message, then close.
        let mut s = raw();
        handshake(&mut s);
        let (h, body) = Request::from(WriteReq {
            node: NodeRef::ino(1),
            fh: 0,
            offset: 0,
            size: 1 << 20,
        })
        .encode(1, Cred::default());
        s.write_all(&h).unwrap();
        s.write_all(&body).unwrap();
        s.write_all(&[1u8; 1000]).unwrap();
        drop(s);
        // A write to a directory with its payload: rejected, stream stays in step.
        let fs = srv.client(&net, Duration::from_secs(5));
        assert_eq!(
            fs.write(ROOT, 0, 0, &[0u8; 70_000]).unwrap_err().errno,
            libc::EISDIR
        );
        fs.mkdir(&ctx(), ROOT, b"still-works", 0o755).unwrap();
        // Garbage hello, bad magic, three unframeable headers: 5 drops counted as
        // malformed; three invalid bodies answered; the forged proof as an
        // authentication failure.
        let t = Instant::now();
        loop {
            let v: serde_json::Value = serde_json::from_slice(&fs.server_stats().unwrap()).unwrap();
            if v["rejected_malformed"].as_u64().unwrap() >= 5
                && v["rejected_auth"].as_u64().unwrap() >= 1
            {
                assert_eq!(v["rejected_invalid"].as_u64().unwrap(), 3, "{v}");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "counters: {v}");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let err = srv.kill(libc::SIGTERM);
    assert!(!err.contains("panicked"), "{err}");
    srv.fsck();
}

#[test]
fn secrets_loopback_default_and_read_only() {
    let net = Net::new();
    let image = PathBuf::from(format!(
        "/dev/shm/zcfs-remote-ro-{}.img",
        std::process::id()
    ));
    mkfs(&image, "64M", &[]);
    // Not loopback, no secret: refused with the fix in the message.
    let out = Command::new("ip")
        .args(["netns", "exec", &net.srv, zcfs_bin(), "serve"])
        .arg(&image)
        .args(["--listen", &net.addr()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--secret-file"));
    // --insecure --read-only: reads work, writes get EROFS.
    let mut child = Command::new("ip")
        .args(["netns", "exec", &net.srv, zcfs_bin(), "serve"])
        .arg(&image)
        .args(["--listen", &net.addr(), "--insecure", "--read-only"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    net.in_cli(|| {
        let fs = RemoteFs::connect(ClientConfig::new(&net.addr())).unwrap();
        assert!(fs.getattr(ROOT).unwrap().is_dir());
        assert_eq!(
            fs.mkdir(&ctx(), ROOT, b"x", 0o755).unwrap_err().errno,
            libc::EROFS
        );
    });
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    let _ = fs::remove_file(&image);
}

#[test]
fn remote_fuse_mount_runs_unmodified_programs() {
    let net = Net::new();
    let mut srv = Served::new(&net, "fuse", &[]);
    let mp = std::env::temp_dir().join(format!("zcfs-remote-mp-{}", std::process::id()));
    fs::create_dir_all(&mp).unwrap();
    // nsenter enters only the network namespace, so the mount is visible here.
    let mut m = Command::new("nsenter")
        .arg(format!("--net=/var/run/netns/{}", net.cli))
        .arg(zcfs_bin())
        .arg("mount")
        .arg(net.addr())
        .arg(&mp)
        .arg("--secret-file")
        .arg(&srv.secret)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while !mounted(&mp) {
        assert!(m.try_wait().unwrap().is_none(), "remote mount exited");
        assert!(t.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(20));
    }
    let d = mp.to_str().unwrap();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol");
    let sh = |c: &str| {
        let o = Command::new("bash").arg("-c").arg(c).output().unwrap();
        assert!(
            o.status.success(),
            "{c}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    sh(&format!("cp -a {src} {d}/copy && diff -r {src} {d}/copy"));
    sh(&format!("tar -C {d} -cf {d}/t.tar copy && mkdir {d}/x && tar -C {d}/x -xf {d}/t.tar && diff -r {src} {d}/x/copy"));
    sh(&format!("rsync -a {src}/ {d}/r/ && diff -r {src} {d}/r"));
    assert!(
        sh(&format!("grep -rl 'pub enum Op' {d}/copy | wc -l"))
            .trim()
            .parse::<u32>()
            .unwrap()
            >= 1
    );
    let repo = std::env::temp_dir().join(format!("zcfs-remote-repo-{}", std::process::id()));
    let _ = fs::remove_dir_all(&repo);
    sh(&format!("git init -q {r} && cd {r} && echo a > a && git add a && git -c user.name=t -c user.email=t@e commit -qm a", r = repo.display()));
    sh(&format!(
        "git clone -q {} {d}/clone && git -C {d}/clone fsck --full",
        repo.display()
    ));
    fs::remove_dir_all(&repo).unwrap();
    let out = sh(&format!("sqlite3 {d}/db 'create table t(x); insert into t values(1),(2),(3); select sum(x) from t; pragma integrity_check;'"));
    assert_eq!(out.trim(), "6\nok");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(m.id() as i32, libc::SIGTERM) };
    m.wait().unwrap();
    assert!(!mounted(&mp));
    fs::remove_dir(&mp).unwrap();
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// `zcfs mount` of the server, run inside the client namespace (nsenter enters only the
/// network namespace, so the mount is visible here). Killed and detached on drop.
struct RemoteMount {
    mp: PathBuf,
    child: Option<Child>,
}

impl RemoteMount {
    fn new(net: &Net, srv: &Served, tag: &str, opts: &[&str]) -> RemoteMount {
        let mp = std::env::temp_dir().join(format!("zcfs-remote-{tag}-{}", std::process::id()));
        fs::create_dir_all(&mp).unwrap();
        let mut child = Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", net.cli))
            .arg(zcfs_bin())
            .arg("mount")
            .arg(net.addr())
            .arg(&mp)
            .arg("--secret-file")
            .arg(&srv.secret)
            .args(opts)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !mounted(&mp) {
            assert!(child.try_wait().unwrap().is_none(), "remote mount exited");
            assert!(t.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(20));
        }
        RemoteMount {
            mp,
            child: Some(child),
        }
    }

    fn path(&self, p: &str) -> String {
        format!("{}/{p}", self.mp.display())
    }

    /// Kill the mount process with `sig` and detach the mount.
    fn kill(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, sig) };
            c.wait().unwrap();
        }
        if mounted(&self.mp) {
            let _ = zcfs().arg("umount").arg("--lazy").arg(&self.mp).output();
        }
    }
}

impl Drop for RemoteMount {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
        let _ = fs::remove_dir(&self.mp);
    }
}

/// `stat` through a mount: link count, size, mtime seconds.
fn stat_via(path: &str) -> (u32, u64, i64) {
    let out = sh(&format!("stat -c '%h %s %Y' {path}"));
    let v: Vec<&str> = out.split_whitespace().collect();
    (
        v[0].parse().unwrap(),
        v[1].parse().unwrap(),
        v[2].parse().unwrap(),
    )
}

#[test]
fn clients_racing_on_one_file_and_one_directory_agree_afterwards() {
    let net = Net::new();
    let mut srv = Served::new(&net, "race", &[]);
    let (d, f) = net.in_cli(|| {
        let setup = client(&net, Duration::from_secs(10));
        let d = setup.mkdir(&ctx(), ROOT, b"d", 0o777).unwrap();
        let (f, fh) = setup
            .create(&ctx(), d.ino, b"f", libc::S_IFREG | 0o666, libc::O_RDWR)
            .unwrap();
        setup.release(f.ino, fh).unwrap();
        (d, f)
    });
    let rounds = 120;
    // A FUSE mount races too: hard links renamed and removed, subdirectories made and
    // removed, appends to a log of its own (appends through a kernel that caches the
    // size may land before other clients' writes: O_APPEND is per client, as on NFS).
    let m = RemoteMount::new(&net, &srv, "race-mp", &[]);
    let dm = m.path("d");
    let mut shell = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -e; for i in $(seq 1 {rounds}); do \
               ln {dm}/f {dm}/m$i; mv {dm}/m$i {dm}/n$i; rm {dm}/n$i; \
               mkdir {dm}/s$i; rmdir {dm}/s$i; echo $i >> {dm}/log; \
             done"
        ))
        .spawn()
        .unwrap();
    net.in_cli(|| {
        let clients: Vec<RemoteFs> = (0..3)
            .map(|_| client(&net, Duration::from_secs(10)))
            .collect();
        std::thread::scope(|s| {
            for (t, fs) in clients.iter().enumerate() {
                s.spawn(move || {
                    let c = ctx();
                    for i in 0..rounds {
                        let (l, r) = (format!("l{t}-{i}"), format!("r{t}-{i}"));
                        let a = fs.link(&c, f.ino, d.ino, l.as_bytes()).unwrap();
                        assert!(a.nlink >= 2);
                        // A client's own change shows in its cache at once.
                        assert_eq!(fs.getattr(f.ino).unwrap().nlink, a.nlink);
                        fs.rename(&c, d.ino, l.as_bytes(), d.ino, r.as_bytes(), 0)
                            .unwrap();
                        let u = fs.unlink(&c, d.ino, r.as_bytes()).unwrap();
                        assert_eq!(u.ino, f.ino);
                        assert_eq!(fs.getattr(f.ino).unwrap().nlink, u.nlink);
                        let sub = format!("s{t}-{i}");
                        let sd = fs.mkdir(&c, d.ino, sub.as_bytes(), 0o755).unwrap();
                        assert_eq!(fs.rmdir(&c, d.ino, sub.as_bytes()).unwrap().ino, sd.ino);
                        let at = 1_000_000 + (t * rounds + i) as u64 * 8;
                        fs.write(f.ino, 0, at, &[t as u8 + 1; 8]).unwrap();
                    }
                });
            }
        });
        let status = shell.wait().unwrap();
        assert!(status.success(), "the shell's races failed");
        // Let every cache expire (the client's attribute timeout and the kernel's are
        // 1 s), then every client must agree with the server.
        std::thread::sleep(Duration::from_millis(2500));
        let truth = RemoteFs::connect({
            let mut cfg = ClientConfig::new(&net.addr());
            cfg.secret = Some(b"a-test-secret-of-enough-length".to_vec());
            cfg.attr_ttl = Duration::ZERO;
            cfg
        })
        .unwrap();
        let (tf, td) = (truth.getattr(f.ino).unwrap(), truth.getattr(d.ino).unwrap());
        assert_eq!(
            (tf.nlink, td.nlink),
            (1, 2),
            "every extra name and subdir gone"
        );
        let log = truth.lookup(&ctx(), d.ino, b"log").unwrap();
        let names = |fs: &RemoteFs| {
            let mut n = Vec::new();
            fs.readdir(d.ino, 0, false, &mut |e| {
                n.push(e.name);
                true
            })
            .unwrap();
            n
        };
        let mut all = names(&truth);
        all.sort();
        assert_eq!(all, vec![b"f".to_vec(), b"log".to_vec()]);
        for fs in &clients {
            assert_eq!(fs.getattr(f.ino).unwrap(), tf);
            assert_eq!(fs.getattr(d.ino).unwrap(), td);
            let mut n = names(fs);
            n.sort();
            assert_eq!(n, all);
        }
        assert_eq!(stat_via(&m.path("d/f")), (tf.nlink, tf.size, tf.mtime.sec));
        assert_eq!(stat_via(&m.path("d")), (td.nlink, td.size, td.mtime.sec));
        // The appends and every client's writes are all there.
        let appended: String = (1..=rounds).map(|i| format!("{i}\n")).collect();
        assert_eq!(
            read_all(&truth, log.ino, 0, 0, 1 << 20),
            appended.as_bytes()
        );
        let data = read_all(&truth, f.ino, 0, 0, tf.size as u32);
        for t in 0..3 {
            for i in 0..rounds {
                let at = 1_000_000 + (t * rounds + i) * 8;
                assert_eq!(&data[at..at + 8], &[t as u8 + 1; 8]);
            }
        }
    });
    drop(m);
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

#[test]
fn a_killed_clients_handles_are_released_after_grace() {
    let net = Net::new();
    let mut srv = Served::new(&net, "killed", &["--grace", "2"]);
    let observer = net.in_cli(|| client(&net, Duration::from_secs(10)));
    // The root directory's first block, allocated for its first entry, stays.
    let (w, wh) = observer
        .create(
            &ctx(),
            ROOT,
            b"warm-up",
            libc::S_IFREG | 0o644,
            libc::O_RDWR,
        )
        .unwrap();
    observer.release(w.ino, wh).unwrap();
    observer.unlink(&ctx(), ROOT, b"warm-up").unwrap();
    let before = observer.statfs().unwrap();
    // A client process (a FUSE mount) with a file open for writing and one for
    // reading, both unlinked, kept busy: it is killed in the middle of both.
    let mut m = RemoteMount::new(&net, &srv, "killed-mp", &[]);
    let (wpath, rpath) = (m.path("w"), m.path("r"));
    sh(&format!("head -c 8M /dev/urandom > {rpath}"));
    let busy = |script: String| {
        Command::new("bash")
            .arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Each keeps its file open on one descriptor and goes through it again and again
    // (a new handle each time, the same 4 or 8 MiB).
    let mut writer = busy(format!(
        "exec 3>{wpath}; rm {wpath}; while true; do \
         dd if=/dev/zero of=/dev/fd/3 bs=1M count=4 conv=notrunc || exit; done"
    ));
    let mut reader = busy(format!(
        "exec 4<{rpath}; rm {rpath}; while true; do \
         dd if=/dev/fd/4 of=/dev/null bs=1M || exit; done"
    ));
    let t = Instant::now();
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(&observer.server_stats().unwrap()).unwrap();
        if v["handles_open"].as_u64().unwrap() >= 2 && t.elapsed() > Duration::from_secs(1) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(observer.statfs().unwrap().bfree < before.bfree);
    m.kill(libc::SIGKILL);
    let _ = writer.kill();
    let _ = reader.kill();
    writer.wait().unwrap();
    reader.wait().unwrap();
    // Within the grace period the session keeps them; after it, all is given back.
    let killed = Instant::now();
    let t = Instant::now();
    loop {
        let v: serde_json::Value =
            serde_json::from_slice(&observer.server_stats().unwrap()).unwrap();
        let s = observer.statfs().unwrap();
        if v["sessions_expired"].as_u64().unwrap() >= 1
            && v["handles_open"].as_u64().unwrap() == 0
            && (s.bfree, s.ffree) == (before.bfree, before.ffree)
        {
            assert!(
                killed.elapsed() >= Duration::from_millis(1500),
                "released before the grace period ran out: {:?}",
                killed.elapsed()
            );
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{v} {s:?} {before:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(observer);
    let err = srv.kill(libc::SIGTERM);
    assert!(!err.contains("panicked"), "{err}");
    srv.fsck();
}

/// Issue 8, defect 6 on a remote mount: a reader opening a name while another process
/// replaces it with write-temp-then-rename always finds a whole file (the server holds
/// the mount's kernel references, so the replaced inode lives until it is forgotten).
#[test]
fn rename_over_a_target_is_atomic_to_a_reader_on_a_remote_mount() {
    let net = Net::new();
    let mut srv = Served::new(&net, "atomic", &[]);
    let m = RemoteMount::new(&net, &srv, "atomic-mp", &[]);
    let (opens, missing, torn) = atomic_save_loop(&m.mp, 1000);
    assert!(opens > 50, "the reader hardly ran ({opens} opens)");
    assert_eq!(
        (missing, torn),
        (0, 0),
        "{missing} ENOENT and {torn} torn reads in {opens} opens"
    );
    drop(m);
    srv.kill(libc::SIGTERM);
    srv.fsck();
}
