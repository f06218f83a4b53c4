//! Live metrics (issue 11): a real `zcfs serve --metrics` and a real FUSE mount with
//! `--metrics`, scraped over TCP after known operations, and `zcfs stat` of the server
//! and of the mount point. Root and /dev/fuse required, as in CI.

mod common;

use common::mount::{unique, Mount};
use common::{mkfs, run_ok, zcfs};
use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use zcfs_backend::{Backend, Ctx};
use zcfs_client::{ClientConfig, RemoteFs};

/// `GET path` on `addr`: (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP answer");
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// The value of the sample `series` (name and labels exactly) in an exposition.
fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// Wait (at most 20 s) until `f` holds: an operation is counted right after its reply
/// was sent, so a caller may see the result a moment before the count.
fn eventually<T>(what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let t = std::time::Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if t.elapsed() > Duration::from_secs(20) => panic!("{what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// A port free now on 127.0.0.1.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Each operation's count in a stat --json report equals its histogram's total.
fn assert_histograms_add_up(report: &serde_json::Value) {
    for (op, o) in report["ops"].as_object().unwrap() {
        let total: u64 = o["histogram"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["count"].as_u64().unwrap())
            .sum();
        assert_eq!(total, o["count"].as_u64().unwrap(), "{op}: {o}");
        assert!(o["p50_us"].as_f64().unwrap() <= o["max_us"].as_f64().unwrap());
        assert!(o["p99_us"].as_f64().unwrap() <= o["max_us"].as_f64().unwrap());
    }
}

struct Served {
    child: std::process::Child,
    image: PathBuf,
    socket: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[test]
fn serve_metrics_and_stat_count_the_operations_done() {
    const N: u64 = 25;
    let image = PathBuf::from(format!("/dev/shm/{}.img", unique("metrics-serve")));
    mkfs(&image, "64M", &[]);
    let socket = std::env::temp_dir().join(format!("{}.sock", unique("metrics-serve")));
    let mut child = zcfs()
        .arg("serve")
        .arg(&image)
        .arg("--listen")
        .arg(format!("unix:{}", socket.display()))
        .arg("--no-root-squash")
        .args(["--metrics", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // One reader for both lines: they may arrive in one read.
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("serving "), "{first}");
    let second = lines.next().unwrap().unwrap();
    let srv = Served {
        child,
        image,
        socket: socket.clone(),
    };
    let addr = second
        .trim()
        .strip_prefix("metrics on http://")
        .and_then(|s| s.strip_suffix("/metrics"))
        .unwrap_or_else(|| panic!("no metrics address: {second}"))
        .to_string();

    let fs = RemoteFs::connect(ClientConfig::new(&format!("unix:{}", socket.display()))).unwrap();
    let root = Ctx::root();
    for i in 0..N {
        fs.mkdir(&root, 1, format!("d{i}").as_bytes(), 0o755)
            .unwrap();
    }
    // One more that fails: EEXIST.
    assert!(fs.mkdir(&root, 1, b"d0", 0o755).is_err());

    let (status, text) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let mkdirs = sample(&text, "zcfs_server_requests_total{op=\"mkdir\"}");
    assert_eq!(mkdirs, Some(N + 1), "{text}");
    assert_eq!(
        sample(&text, "zcfs_server_request_errors_total{op=\"mkdir\"}"),
        Some(1)
    );
    assert_eq!(
        sample(
            &text,
            "zcfs_server_request_duration_seconds_count{op=\"mkdir\"}"
        ),
        Some(N + 1)
    );
    assert_eq!(
        sample(
            &text,
            "zcfs_server_request_duration_seconds_bucket{op=\"mkdir\",le=\"+Inf\"}"
        ),
        Some(N + 1)
    );
    assert!(text.contains("# TYPE zcfs_server_request_duration_seconds histogram\n"));
    assert!(sample(&text, "zcfs_server_connections_total").unwrap() >= 1);
    let (status, _) = http_get(&addr, "/other");
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    // `zcfs stat` of the server: the same counts, with percentiles.
    let target = format!("unix:{}", socket.display());
    let out = run_ok(zcfs().args(["stat", &target, "--json"]));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["ops"]["mkdir"]["count"], N + 1);
    assert_eq!(r["ops"]["mkdir"]["errors"], 1);
    assert_histograms_add_up(&r);
    let out = run_ok(zcfs().args(["stat", &target]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("p50 us") && text.contains("p99 us"), "{text}");
    let line = text.lines().find(|l| l.starts_with("mkdir ")).unwrap();
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        fields[1..3],
        [(N + 1).to_string(), "1".to_string()],
        "{line}"
    );
    drop(fs);
    drop(srv);
}

fn file_id_of(m: &std::fs::Metadata) -> Option<(u64, i64, i64)> {
    Some((m.ino(), m.ctime(), m.ctime_nsec()))
}

fn file_id(p: &Path) -> Option<(u64, i64, i64)> {
    file_id_of(&std::fs::metadata(p).ok()?)
}

/// The stat socket of the mount at `mp`, once the mount process has made it (it does
/// right after mounting; at most 20 s).
fn stat_socket_of(mp: &Path) -> PathBuf {
    let dev = std::fs::metadata(mp).unwrap().dev();
    let socket = PathBuf::from(format!(
        "/run/zcfs/mounts/{}:{}.sock",
        libc::major(dev),
        libc::minor(dev)
    ));
    let t = std::time::Instant::now();
    while !socket.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "no stat socket {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    socket
}

#[test]
fn mount_metrics_and_stat_mountpoint_count_the_operations_done() {
    const N: u64 = 30;
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut m = Mount::volume_with("metrics", "64M", &[], &["--metrics", &addr]);
    let socket = stat_socket_of(&m.mp);
    let meta = std::fs::metadata(&socket).expect("the mount's stat socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), 0);
    for i in 0..N {
        std::fs::write(m.path(&format!("f{i}")), b"x").unwrap();
    }
    assert!(std::fs::metadata(m.path("missing")).is_err());

    let r = eventually("N creates counted", || {
        let out = run_ok(zcfs().arg("stat").arg(&m.mp).arg("--json"));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        match r["ops"]["create"]["count"].as_u64() {
            Some(c) if c >= N => Ok(r),
            _ => Err(r.to_string()),
        }
    });
    assert!(r["ops"]["lookup"]["errors"].as_u64().unwrap() >= 1, "{r}");
    assert!(r["payload_bytes_written"].as_u64().unwrap() >= N, "{r}");
    assert_histograms_add_up(&r);
    // A directory inside the mount names the same mount.
    std::fs::create_dir(m.path("sub")).unwrap();
    let out = run_ok(zcfs().arg("stat").arg(m.path("sub")));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("create ")).unwrap();
    let count: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(count >= N, "{text}");
    assert!(text.contains("p99 us"), "{text}");

    let (status, text) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let total = sample(&text, "zcfs_mount_requests_total{op=\"create\"}").unwrap();
    assert!(total >= N, "{text}");
    assert_eq!(
        sample(
            &text,
            "zcfs_mount_request_duration_seconds_count{op=\"create\"}"
        ),
        Some(total)
    );
    assert!(sample(&text, "zcfs_mount_payload_written_bytes_total").unwrap() >= N);
    let (status, _) = http_get(&addr, "/");
    assert_eq!(status, "HTTP/1.1 404 Not Found");

    m.stop();
    // Gone, or a later mount's (another test's mount may have the device number now;
    // tmpfs reuses inode numbers: the change time tells them apart).
    assert_ne!(
        file_id(&socket),
        file_id_of(&meta),
        "the stat socket outlived its mount"
    );
    assert!(
        TcpStream::connect(&addr).is_err(),
        "still scraped after unmount"
    );
}

#[test]
fn metrics_as_a_mount_option() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let m = Mount::volume_with("metrics-o", "64M", &[], &["-o", &format!("metrics={addr}")]);
    std::fs::write(m.path("f"), b"x").unwrap();
    let (status, _) = http_get(&addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    eventually("the create counted", || {
        let (_, text) = http_get(&addr, "/metrics");
        match sample(&text, "zcfs_mount_requests_total{op=\"create\"}") {
            Some(n) if n >= 1 => Ok(()),
            _ => Err(text),
        }
    });
    m.fsck_after_stop();
}

#[test]
fn stat_of_a_directory_outside_zcfs_or_of_a_dead_mount_says_why() {
    let dir = std::env::temp_dir().join(unique("metrics-plain"));
    std::fs::create_dir_all(&dir).unwrap();
    let out = zcfs().arg("stat").arg(&dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("not in a zcfs mount"), "{err}");
    std::fs::remove_dir(&dir).unwrap();

    // A killed mount process: its mount point answers ENOTCONN (cache none: nothing
    // cached), or, while the kernel still has the root's attributes (default cache),
    // its socket nobody answers. Either way stat says the process is gone.
    for (name, args) in [
        ("metrics-dead-uncached", &["--cache", "none"][..]),
        ("metrics-dead-cached", &[][..]),
    ] {
        let mut m = Mount::volume_with(name, "64M", &[], args);
        let socket = stat_socket_of(&m.mp);
        let id = file_id(&socket);
        let mut child = m.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let out = zcfs().arg("stat").arg(&m.mp).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("process is gone"), "{name}: {err}");
        if !args.is_empty() {
            assert!(err.contains("not connected"), "{name}: {err}");
        }
        run_ok(zcfs().arg("umount").arg("--lazy").arg(&m.mp));
        // The killed process left its socket, which nobody answers; the next mount
        // with this device number replaces it. Removed here, unless another test's
        // mount has replaced it already.
        if file_id(&socket) == id {
            assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());
            let _ = std::fs::remove_file(&socket);
        }
    }
}
