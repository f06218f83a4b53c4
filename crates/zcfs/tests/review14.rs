//! review14: the mount process's exit path (issue 14). Real FUSE mounts: root and
//! /dev/fuse required, as for fuse.rs.

mod common;
use common::mount::unique;
use common::*;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the mount on top at `mp` is a tmpfs (mountinfo: field 5 the mount point,
/// the file system type after " - ").
fn tmpfs_on(mp: &Path) -> bool {
    let s = fs::read_to_string("/proc/self/mountinfo").unwrap();
    s.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
        .and_then(|l| l.split(" - ").nth(1))
        .is_some_and(|t| t.starts_with("tmpfs "))
}

/// FINDING (medium): a mount process that is signalled after its mount was detached
/// lazily (`umount -l` while a file is open: the FUSE connection lives on) unmounts
/// whatever is mounted on its old mount point by then. The signal path calls
/// `session.umount_and_join()`, which unmounts by path (fuser: the device still
/// looks mounted, so umount2(mountpoint)); only the exit path after it compares mount
/// ids. Here the next mount is a tmpfs someone mounted there meanwhile; SIGTERM (a
/// service stop, shutdown) to the old zcfs process takes it away.
/// Fails: the tmpfs is gone after the SIGTERM.
#[test]
fn sigterm_after_a_lazy_detach_leaves_the_next_mount_alone() {
    assert!(Path::new("/dev/fuse").exists(), "needs /dev/fuse");
    let image = std::path::PathBuf::from(format!("/dev/shm/{}.img", unique("r14-lazy")));
    mkfs(&image, "64M", &[]);
    let mp = std::env::temp_dir().join(unique("r14-lazy-mp"));
    fs::create_dir_all(&mp).unwrap();
    let mut old = zcfs()
        .arg("mount")
        .arg(&image)
        .arg(&mp)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_mounted(&mut old, &mp);
    let open = fs::File::create(mp.join("f")).unwrap();
    run_ok(Command::new("umount").arg("-l").arg(&mp));
    assert!(!mounted(&mp), "the lazy unmount detached the mount");
    run_ok(
        Command::new("mount")
            .args(["-t", "tmpfs", "review14"])
            .arg(&mp),
    );
    assert!(tmpfs_on(&mp));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(old.id() as i32, libc::SIGTERM) };
    // With the defect the tmpfs goes within the mount process's 200 ms signal poll;
    // without it, it stays: the bound only delays a passing run.
    let t = Instant::now();
    while tmpfs_on(&mp) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let kept = tmpfs_on(&mp);
    drop(open); // the old connection ends; the old process exits
    let t = Instant::now();
    while old.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(20) {
            let _ = old.kill();
            let _ = old.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    while tmpfs_on(&mp) {
        let _ = Command::new("umount").arg(&mp).status();
    }
    let _ = fs::remove_dir(&mp);
    let _ = fs::remove_file(&image);
    assert!(
        kept,
        "the old zcfs mount process unmounted the tmpfs mounted on its old mount point"
    );
}
