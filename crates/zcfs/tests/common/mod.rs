//! Helpers shared by the zcfs binary's integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

/// The zcfs binary under test.
pub fn zcfs() -> Command {
    Command::new(zcfs_bin())
}

pub fn zcfs_bin() -> &'static str {
    env!("CARGO_BIN_EXE_zcfs")
}

/// Whether something is mounted at `mp` (field 5 of /proc/self/mountinfo).
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
