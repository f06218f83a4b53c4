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
    // The mount's read-ahead window is the default 16 MiB (set through its device in
    // mountinfo, never a stat of its own mount point).
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(&m.mp).unwrap().dev();
    let knob = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    // Set right after the mount appears: looked at until it is (bounded).
    let t = std::time::Instant::now();
    let mut ra = fs::read_to_string(&knob).unwrap();
    while ra.trim() != "16384" && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        ra = fs::read_to_string(&knob).unwrap();
    }
    assert_eq!(ra.trim(), "16384", "{knob}");
    unmodified_programs(&m.mp, "tcp");
    m.stop(libc::SIGTERM);
    assert!(!mounted(&m.mp), "SIGTERM left the mount behind");
    fs::remove_dir(&m.mp).unwrap();
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// The same unmodified programs through a mount whose session rides the layer-2 lane
/// (`--l2` on both ends, issue 12); the per-path counters of the mount and of the
/// server show the small requests and reads did go over layer 2.
#[test]
fn remote_fuse_mount_over_layer_2_runs_unmodified_programs() {
    if !l2_ready() {
        return;
    }
    let net = Net::with_queues(2);
    let mut srv = Served::new(&net, "fuse-l2", &["--l2", L2_SRV_IF]);
    let mut m = RemoteMount::new(&net, &srv, "mp-l2", &["--l2", L2_CLI_IF]);
    unmodified_programs(&m.mp, "l2");
    let mount = stat_json(&net, &srv, m.mp.to_str().unwrap());
    let lane = &mount["l2"];
    assert_eq!(lane["up"], true, "the mount's lane: {lane}");
    assert_eq!(lane["bind_mode"], "copy", "veth binds in copy mode: {lane}");
    for op in ["lookup", "getattr", "read"] {
        assert!(
            lane["requests"][op]["l2"].as_u64().unwrap_or(0) > 0,
            "no {op} rode layer 2: {lane}"
        );
    }
    assert_eq!(lane["requests"]["write"]["l2"].as_u64().unwrap_or(0), 0);
    let server = stat_json(&net, &srv, &net.addr());
    let sl = &server["l2"];
    assert_eq!(sl["up"], true, "the server's lane: {sl}");
    assert!(
        sl["requests"]["read"]["l2"].as_u64().unwrap_or(0) > 0,
        "{sl}"
    );
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
