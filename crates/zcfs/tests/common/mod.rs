//! Helpers shared by the zcfs binary's integration tests.
#![allow(dead_code)]

pub mod mount;
pub mod posix;
pub mod reference;
pub mod relay;
pub mod remote;
pub mod splicing;
pub mod xattr;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The zcfs binary under test.
pub fn zcfs() -> Command {
    Command::new(zcfs_bin())
}

pub fn zcfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcfs")
}

/// Whether something is mounted at `mp` (field 5 of /proc/self/mountinfo).
/// Run `cmd` to completion; it must succeed (its stderr is the failure message).
pub fn run_ok(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        cmd,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `umount MP`, again while it is busy for up to `UMOUNT_BUSY_PATIENCE`: a child that
/// another test thread forks (to act as another user) inherits every descriptor open
/// at that moment, one on this mount too, and holds it until it exits.
pub fn umount_retrying(mp: &std::path::Path) {
    let t = std::time::Instant::now();
    loop {
        let out = Command::new("umount").arg(mp).output().unwrap();
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            err.contains("busy") && t.elapsed() < UMOUNT_BUSY_PATIENCE,
            "umount {}: {err}",
            mp.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// How long `umount_retrying` waits out a busy mount.
pub const UMOUNT_BUSY_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Spawn `cmd` (a `zcfs serve`) with its stdout piped and return it with the first line
/// it printed (`serving IMAGE on ADDRESS` once it serves).
pub fn spawn_serving(cmd: &mut Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// Wait (at most 20 s) until the volume at `image` was closed cleanly by whoever held
/// it (a daemon that saw its unmount).
pub fn wait_until_closed_cleanly(image: &Path) {
    let t = std::time::Instant::now();
    loop {
        let stat = zcfs()
            .arg("stat")
            .arg(image)
            .arg("--json")
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap_or_default();
        if v["recovery"]["was_clean"] == true {
            return;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "the volume {} was not closed",
            image.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

pub fn mounted(mp: &Path) -> bool {
    let s = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    s.lines()
        .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
}

/// Run a shell command; panic with its output if it fails; return its stdout.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("bash").arg("-c").arg(cmd).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait (at most 20 s) until `mp` is mounted by `child`; should the child exit first,
/// fail the test with its stderr (when piped).
pub fn wait_until_mounted(child: &mut Child, mp: &Path) {
    let t = Instant::now();
    while !mounted(mp) {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("the mount at {} exited ({st}): {err}", mp.display());
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "mount did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `zcfs fsck` must find the volume at `image` clean; `what` starts the failure message.
pub fn assert_fsck_clean(image: &Path, what: &str) {
    let out = zcfs().arg("fsck").arg(image).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}fsck {}: {}",
        image.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Make a fresh volume at `image` (replacing any file there); fails the test with
/// mkfs's error otherwise.
pub fn mkfs(image: &Path, size: &str, extra: &[&str]) {
    let _ = std::fs::remove_file(image);
    let out = zcfs()
        .arg("mkfs")
        .arg(image)
        .args(["--size", size])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "zcfs mkfs {}: {}",
        image.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 8, defect 6: a process opening a name in a loop while another replaces it
/// with write-temp-then-rename (the atomic-save idiom) always finds a file, whole.
/// Bounded in count and time. The reader must open the file at least `min_opens` times
/// and never miss it nor read it torn.
pub fn assert_atomic_saves(dir: &Path, rounds: usize, min_opens: usize) {
    use std::fs;
    use std::time::{Duration, Instant};
    let target = dir.join("target");
    fs::write(&target, "v0000000").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s2, t2) = (stop.clone(), target.clone());
    let reader = std::thread::spawn(move || {
        let (mut opens, mut missing, mut torn) = (0usize, 0usize, 0usize);
        let t = Instant::now();
        while !s2.load(std::sync::atomic::Ordering::Relaxed)
            && t.elapsed() < Duration::from_secs(60)
        {
            match fs::read(&t2) {
                Ok(b) => {
                    opens += 1;
                    if b.len() != 8 || b[0] != b'v' {
                        torn += 1;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing += 1,
                Err(e) => panic!("reading the target: {e}"),
            }
        }
        (opens, missing, torn)
    });
    for i in 1..=rounds {
        let tmp = dir.join(format!("tmp{i}"));
        fs::write(&tmp, format!("v{i:07}")).unwrap();
        fs::rename(&tmp, &target).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (opens, missing, torn) = reader.join().unwrap();
    assert!(opens > min_opens, "the reader hardly ran ({opens} opens)");
    assert_eq!(
        (missing, torn),
        (0, 0),
        "{missing} ENOENT and {torn} torn reads in {opens} opens"
    );
}
