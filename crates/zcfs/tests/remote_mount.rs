//! A FUSE mount of a remote volume, the server and the mount in two network namespaces
//! joined by a veth pair (root required, as in CI): unmodified programs (cp, tar, rsync,
//! git, sqlite3) and the atomic-save idiom.

mod common;
use common::remote::*;
use common::*;
use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn remote_fuse_mount_runs_unmodified_programs() {
    let net = Net::new();
    let mut srv = Served::new(&net, "fuse", &[]);
    let mp = std::env::temp_dir().join(format!("zcfs-remote-mp-{}", std::process::id()));
    fs::create_dir_all(&mp).unwrap();
    // It enters only the network namespace, so the mount is visible here.
    let mut m = net
        .cli_command(zcfs_bin())
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
