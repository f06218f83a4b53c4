//! A FUSE mount of a remote volume, the server and the mount in two network namespaces
//! joined by a veth pair (root required, as in CI): unmodified programs (cp, tar, rsync,
//! git, sqlite3) and the atomic-save idiom.

mod common;
use common::remote::*;
use common::*;
use std::fs;

#[test]
fn remote_fuse_mount_runs_unmodified_programs() {
    let net = Net::new();
    let mut srv = Served::new(&net, "fuse", &[]);
    // It enters only the network namespace, so the mount is visible here.
    let mut m = RemoteMount::new(&net, &srv, "mp", &[]);
    let d = m.mp.to_str().unwrap().to_owned();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol");
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
    m.stop(libc::SIGTERM);
    assert!(!mounted(&m.mp), "SIGTERM left the mount behind");
    fs::remove_dir(&m.mp).unwrap();
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
    assert_atomic_saves(&m.mp, 1000, 50);
    drop(m);
    srv.kill(libc::SIGTERM);
    srv.fsck();
}
