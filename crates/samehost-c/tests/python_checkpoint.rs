//! A crash in the middle of a checkpoint save leaves the previous checkpoint intact
//! (issue 13): examples/python/checkpoint.py saves checkpoint 1, then starts saving
//! checkpoint 2 (the same file names) and stops at a kill point, where this test
//! SIGKILLs (a) the application or (b) the server process. Afterwards the image is
//! fsck clean (no leaked block) and a restore finds every file wholly checkpoint 1, or
//! wholly checkpoint 2 only if its manifest commit had returned.
//!
//! Needs python3 with numpy; see python_example.rs (ZCFS_REQUIRE_PYTHON).

mod common;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use zcfs_samehost::{Service, ServiceConfig};
use zcfs_types::identity::{IdentityMap, Squash};
use zcfs_volume::{MkfsOptions, Volume};

/// Data per checkpoint and its file count (small: the protocol, not the volume, is
/// under test).
const TOTAL: &str = "6M";
const FILES: &str = "30";
/// Kill points of a save of this size: 1 before the data commit, 2 after it, 3 before
/// the manifest commit, 4 after it.
const KILL_POINTS: [u32; 4] = [1, 2, 3, 4];
/// The kill points at and after which the manifest commit has returned.
const COMMITTED_FROM: u32 = 4;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python/checkpoint.py")
}

fn py(python: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(python);
    c.arg(script())
        .args(args)
        .args(["--total", TOTAL, "--files", FILES])
        .env("ZCFS_LIB", common::lib_path());
    c
}

/// Save generation `gen` to the end.
fn save(python: &Path, sock: &Path, gen: u32) {
    let out = py(
        python,
        &[
            "save",
            "--sock",
            sock.to_str().unwrap(),
            "--gen",
            &gen.to_string(),
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "save {gen}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Start saving `gen`, stopped at kill point `k`: the child and whether its manifest
/// commit had returned.
// The child is returned and waited for by the caller; on a failed read the test panics
// and the child, blocked on its stdin, ends when the pipe closes.
#[allow(clippy::zombie_processes)]
fn save_paused(python: &Path, sock: &Path, gen: u32, k: u32) -> (Child, bool) {
    let mut child = py(
        python,
        &[
            "save",
            "--sock",
            sock.to_str().unwrap(),
            "--gen",
            &gen.to_string(),
            "--pause-at",
            &k.to_string(),
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut committed = false;
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            let st = child.wait().unwrap();
            panic!("save {gen} ended ({st}) before kill point {k}");
        }
        if line.starts_with("committed ") {
            committed = true;
        }
        if line.starts_with(&format!("paused step={k} ")) {
            return (child, committed);
        }
    }
}

/// Restore: the generation found (every file's CRC checked against the manifest and
/// against generation `a`'s or `b`'s data).
fn restore(python: &Path, sock: &Path, a: u32, b: u32) -> u32 {
    let out = py(
        python,
        &[
            "restore",
            "--sock",
            sock.to_str().unwrap(),
            "--expect-gens",
            &format!("{a},{b}"),
        ],
    )
    .output()
    .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "restore: {}\n{s}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gen = s
        .split_whitespace()
        .find_map(|w| w.strip_prefix("gen="))
        .unwrap_or_else(|| panic!("restore said {s}"));
    assert!(s.contains(&format!("files={FILES} ")), "{s}");
    gen.parse().unwrap()
}

fn config(sock: &Path) -> ServiceConfig {
    let mut cfg = ServiceConfig::new(sock);
    cfg.identity = IdentityMap {
        squash: Squash::None,
        ..Default::default()
    };
    cfg
}

/// Serve an existing image in this process until the returned closure stops it.
fn serve_image(image: &Path, sock: &Path) -> (Arc<Volume>, impl FnOnce()) {
    let vol = common::open_retrying_busy(image);
    let _ = std::fs::remove_file(sock);
    let svc = Arc::new(Service::bind(vol.clone(), config(sock)).unwrap());
    let run = svc.clone();
    let t = std::thread::spawn(move || run.run());
    (vol, move || {
        svc.shutdown();
        t.join().unwrap();
    })
}

/// Reopen the image (log recovery), fsck it: clean, no block leaked.
fn fsck(image: &Path) {
    let vol = common::open_retrying_busy(image);
    vol.checkpoint_now().unwrap();
    let r = zcfs_volume::fsck::check_volume(&vol);
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

/// Removes the image and the socket when the test ends, passed or not.
struct Cleanup(PathBuf, PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(&self.1);
    }
}

fn paths(tag: &str) -> (PathBuf, PathBuf) {
    let t = format!("zcfs-ckpt-{}-{tag}", std::process::id());
    (
        PathBuf::from(format!("/dev/shm/{t}.img")),
        std::env::temp_dir().join(format!("{t}.sock")),
    )
}

#[test]
fn killing_the_application_mid_save_leaves_the_previous_checkpoint() {
    if common::child_arg().is_some() {
        return;
    }
    let Some(python) = common::python_or_skip("checkpoint") else {
        return;
    };
    let (image, sock) = paths("app");
    let _cleanup = Cleanup(image.clone(), sock.clone());
    Volume::mkfs(&image, 64 << 20, &MkfsOptions::default()).unwrap();
    let (vol, stop) = serve_image(&image, &sock);
    save(&python, &sock, 1);
    let mut current = 1;
    for (i, k) in KILL_POINTS.into_iter().enumerate() {
        let next = current + 1;
        let (mut child, committed) = save_paused(&python, &sock, next, k);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert_eq!(committed, k >= COMMITTED_FROM, "kill point {k}");
        let want = if committed { next } else { current };
        assert_eq!(
            restore(&python, &sock, current, next),
            want,
            "kill point {k} ({i})"
        );
        current = want;
    }
    // After every kill, a whole save still works.
    save(&python, &sock, current + 1);
    assert_eq!(restore(&python, &sock, current, current + 1), current + 1);
    stop();
    drop(vol);
    fsck(&image);
}

/// The server of `killing_the_server_mid_save_leaves_the_previous_checkpoint`, in a
/// child process (this test binary with ZCFS_SH_CHILD = "IMAGE SOCKET").
#[test]
fn child_server() {
    let Some(arg) = common::child_arg() else {
        return;
    };
    let (image, sock) = arg.split_once(' ').unwrap();
    let (_vol, _stop) = serve_image(Path::new(image), Path::new(sock));
    // Until SIGKILLed; bounded all the same.
    std::thread::sleep(std::time::Duration::from_secs(120));
}

#[test]
fn killing_the_server_mid_save_leaves_the_previous_checkpoint() {
    if common::child_arg().is_some() {
        return;
    }
    let Some(python) = common::python_or_skip("checkpoint") else {
        return;
    };
    let (image, sock) = paths("srv");
    let _cleanup = Cleanup(image.clone(), sock.clone());
    Volume::mkfs(&image, 64 << 20, &MkfsOptions::default()).unwrap();
    let start = || {
        let arg = format!("{} {}", image.display(), sock.display());
        let _ = std::fs::remove_file(&sock);
        let mut c = common::spawn_child("child_server", &arg);
        common::eventually("the server child's socket", || sock.exists());
        assert!(c.try_wait().unwrap().is_none(), "server child ended");
        c
    };
    let mut server = start();
    save(&python, &sock, 1);
    let mut current = 1;
    for k in KILL_POINTS {
        let next = current + 1;
        let (mut app, committed) = save_paused(&python, &sock, next, k);
        server.kill().unwrap(); // SIGKILL, the application still connected
        server.wait().unwrap();
        app.kill().unwrap();
        app.wait().unwrap();
        fsck(&image);
        let want = if committed { next } else { current };
        let (vol, stop) = serve_image(&image, &sock);
        assert_eq!(
            restore(&python, &sock, current, next),
            want,
            "kill point {k}"
        );
        stop();
        drop(vol);
        current = want;
        server = start();
    }
    server.kill().unwrap();
    server.wait().unwrap();
    fsck(&image);
}

/// A COMMIT that returned is durable, not only atomic (FLAC's pflush_commit): the
/// volume batches commits, and the server used to answer before the batch reached the
/// log, so a server killed right after lost what the application was told was placed
/// (this file's crash test found it through a checkpoint's manifest).
#[test]
fn a_commit_that_returned_survives_the_server_killed_right_after() {
    use zcfs_samehost::client::{Client, Place, NO_NEW_SIZE};
    if common::child_arg().is_some() {
        return;
    }
    let (image, sock) = paths("durable");
    let _cleanup = Cleanup(image.clone(), sock.clone());
    Volume::mkfs(&image, 64 << 20, &MkfsOptions::default()).unwrap();
    let _ = std::fs::remove_file(&sock);
    let arg = format!("{} {}", image.display(), sock.display());
    let mut server = common::spawn_child("child_server", &arg);
    common::eventually("the server child's socket", || sock.exists());
    let mut c = Client::connect(&sock).unwrap();
    c.direct_map().unwrap();
    let f = c.open("/d", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let mut r = c.reserve(2).unwrap();
    {
        let mut w = r.window();
        w.page_mut(0).fill(b'Q');
        w.page_mut(1).fill(b'R');
    }
    c.commit(vec![Place {
        handle: f.handle,
        file_offset: 0,
        reservation: r,
        new_size: NO_NEW_SIZE,
    }])
    .unwrap();
    server.kill().unwrap(); // SIGKILL at once
    server.wait().unwrap();
    drop(c);
    fsck(&image);
    let vol = common::open_retrying_busy(&image);
    let a = vol
        .lookup(&zcfs_volume::Cred::ROOT, 1, b"d")
        .expect("the file exists");
    assert_eq!(a.size, 8192, "the committed pages are in the file");
    let mut buf = vec![0u8; 8192];
    assert_eq!(vol.read(a.ino, 0, &mut buf).unwrap(), 8192);
    assert!(buf[..4096].iter().all(|&b| b == b'Q'));
    assert!(buf[4096..].iter().all(|&b| b == b'R'));
}
