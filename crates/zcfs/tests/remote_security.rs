//! A remote server facing hostile peers, between two network namespaces joined by a
//! veth pair (root required, as in CI): garbage, wrong and missing secrets, forged
//! proofs, unframeable and invalid requests, a byte changed on the path after the
//! handshake; and the serve defaults (a secret required off loopback, read-only).

mod common;
use common::remote::*;
use common::*;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, ROOT};
use zcfs_client::{ClientConfig, RemoteFs};

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
        use zcfs_protocol::channel::{Integrity, Mac, TAG_LEN};
        // The channel's MACs (send, receive) of an authenticated connection.
        let handshake = |s: &mut TcpStream| -> (Mac, Mac) {
            zcfs_transport::client_handshake(s, Some(SECRET), 77, Integrity::Headers)
                .unwrap()
                .channel
                .unwrap()
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
        let e = zcfs_transport::client_handshake(
            &mut s,
            Some(b"not-the-secret-at-all"),
            78,
            Integrity::Headers,
        )
        .unwrap_err();
        assert!(
            matches!(e, zcfs_transport::TransportError::AuthFailed),
            "{e}"
        );
        drop(s);
        // No secret at all.
        let mut s = raw();
        assert!(matches!(
            zcfs_transport::client_handshake(&mut s, None, 79, Integrity::Headers),
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
                    lane: zcfs_protocol::handshake::Lane::NONE,
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
            assert_eq!(
                zcfs_protocol::handshake::Verdict::decode(&v).unwrap(),
                zcfs_protocol::handshake::Verdict::refused(libc::EACCES)
            );
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
        let (mut tx, mut rx) = handshake(&mut s);
        let mut send = |h: ReqHeader, body: &[u8], data: &[u8]| {
            let hb = h.encode();
            s.write_all(&hb).unwrap();
            s.write_all(body).unwrap();
            s.write_all(&tx.begin(&hb, body).tag()).unwrap();
            s.write_all(data).unwrap();
            let mut rh = [0u8; RESP_HDR];
            s.read_exact(&mut rh).unwrap();
            let rhd = RespHeader::decode(&rh).unwrap();
            assert_eq!(rhd.id, h.id);
            let mut body = vec![0u8; rhd.body_len as usize];
            s.read_exact(&mut body).unwrap();
            let mut tag = [0u8; TAG_LEN];
            s.read_exact(&mut tag).unwrap();
            rx.begin(&rh, &body).verify(&tag).unwrap();
            let mut data = vec![0u8; rhd.data_len as usize];
            s.read_exact(&mut data).unwrap();
            rhd.status
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
            commit: false,
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
            commit: false,
        })
        .encode(1, Cred::default());
        s.write_all(&h).unwrap();
        s.write_all(&body).unwrap();
        s.write_all(&[1u8; 1000]).unwrap();
        drop(s);
        // A write to a directory with its payload: rejected, stream stays in step.
        let fs = srv.client(&net, Duration::from_secs(5));
        assert_eq!(
            fs.write(&ctx(), ROOT, 0, 0, &[0u8; 70_000])
                .unwrap_err()
                .errno,
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
    let out = net
        .srv_command(zcfs_bin())
        .arg("serve")
        .arg(&image)
        .args(["--listen", &net.addr()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--secret-file"));
    // --insecure --read-only: reads work, writes get EROFS.
    let (mut child, line) =
        spawn_serving(net.srv_command(zcfs_bin()).arg("serve").arg(&image).args([
            "--listen",
            &net.addr(),
            "--insecure",
            "--read-only",
        ]));
    assert!(line.starts_with("serving"), "server did not start: {line}");
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

/// Relay a client's connection to `to`, flipping one byte in the body of the first
/// mkdir request that passes (once over all connections, counted in `flipped`): a man in
/// the middle between two hosts. Handshake messages pass as they are.
fn tampering_relay(c: TcpStream, to: &str, flipped: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering;
    use zcfs_protocol::channel::TAG_LEN;
    use zcfs_protocol::handshake::{HELLO_LEN, PROOF_LEN};
    use zcfs_protocol::{Op, REQ_HDR};
    let Ok(s) = TcpStream::connect(to) else {
        return;
    };
    let (mut c_in, mut s_out) = (c.try_clone().unwrap(), s.try_clone().unwrap());
    let (mut s_in, mut c_out) = (s, c);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut s_in, &mut c_out);
        let _ = c_out.shutdown(std::net::Shutdown::Both);
    });
    let mut pass = |n: usize, flip: Option<usize>| -> Option<Vec<u8>> {
        let mut b = vec![0u8; n];
        c_in.read_exact(&mut b).ok()?;
        if let Some(i) = flip {
            b[i] ^= 0x01;
        }
        s_out.write_all(&b).ok()?;
        Some(b)
    };
    if pass(HELLO_LEN, None).is_none() || pass(PROOF_LEN, None).is_none() {
        return;
    }
    while let Some(h) = pass(REQ_HDR, None) {
        let body_len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
        let data_len = u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize;
        let flip =
            (h[3] == Op::Mkdir as u8 && body_len > 0 && !flipped.swap(true, Ordering::SeqCst))
                .then_some(body_len / 2);
        if pass(body_len + TAG_LEN, flip).is_none() || pass(data_len, None).is_none() {
            break;
        }
    }
    let _ = s_out.shutdown(std::net::Shutdown::Both);
}

/// A man in the middle on the path between two hosts (real server process in its own
/// namespace, the proxy and the client in the other) changes a byte of an mkdir request
/// after the handshake: the server refuses the message (`rejected_forged`), acts on
/// nothing it did not get intact, and the client's mkdir either is executed as sent
/// (resent on a new connection) or fails — never with a changed name or mode.
#[test]
fn a_byte_changed_on_the_path_between_hosts_changes_nothing() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let net = Net::new();
    let mut srv = Served::new(&net, "mitm", &[]);
    let to = net.addr();
    net.in_cli(|| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = l.local_addr().unwrap().to_string();
        let flipped = Arc::new(AtomicBool::new(false));
        let f = flipped.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let Ok(c) = c else { return };
                let (to, f) = (to.clone(), f.clone());
                std::thread::spawn(move || tampering_relay(c, &to, f));
            }
        });
        let mut cfg = ClientConfig::new(&proxy);
        cfg.secret = Some(SECRET.to_vec());
        cfg.timeout = Duration::from_secs(10);
        let fs = RemoteFs::connect(cfg).unwrap();
        let r = fs.mkdir(&ctx(), ROOT, b"victim", 0o750);
        assert!(flipped.load(Ordering::SeqCst), "the proxy changed nothing");
        // What the server holds, asked straight (not through the proxy).
        let clean = client(&net, Duration::from_secs(10));
        let mut names = Vec::new();
        clean
            .readdir(ROOT, 0, false, &mut |e| {
                names.push(String::from_utf8_lossy(&e.name).into_owned());
                true
            })
            .unwrap();
        match &r {
            Ok(a) => {
                assert_eq!(names, ["victim"], "{names:?}");
                assert_eq!(a.mode & 0o7777, 0o750);
                let b = clean.lookup(&ctx(), ROOT, b"victim").unwrap();
                assert_eq!((b.ino, b.mode & 0o7777), (a.ino, 0o750));
            }
            Err(e) => {
                assert!(names.is_empty(), "{names:?} after {e}");
            }
        }
        let v: serde_json::Value = serde_json::from_slice(&clean.server_stats().unwrap()).unwrap();
        assert!(v["rejected_forged"].as_u64().unwrap() >= 1, "{v}");
    });
    let err = srv.kill(libc::SIGTERM);
    assert!(!err.contains("panicked"), "{err}");
    srv.fsck();
}
