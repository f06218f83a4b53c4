//! The CLI end to end: mkfs/fsck/stat on a file in /dev/shm, and a writer killed with
//! SIGKILL whose volume must recover with every fsync'd file intact.

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn scratch(name: &str) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let p = dir.join(format!("zcfs-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn mkfs_refuses_to_overwrite_and_fsck_stat_report() {
    let img = scratch("cli");
    let out = run_ok(zcfs().args(["mkfs"]).arg(&img).args(["--size", "64M"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("persistence msync"));
    let again = zcfs()
        .args(["mkfs"])
        .arg(&img)
        .args(["--size", "64M"])
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert!(zcfs()
        .args(["mkfs", "--force"])
        .arg(&img)
        .args(["--size", "32M"])
        .status()
        .unwrap()
        .success());
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 32 << 20);
    assert_fsck_clean(&img, "");
    let stat = zcfs().arg("stat").arg(&img).arg("--json").output().unwrap();
    assert!(stat.status.success());
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert_eq!(v["size_bytes"], 32 << 20);
    assert_eq!(v["persistence"], "msync");
    // A damaged image: fsck exits non-zero and says why; no panic.
    let mut bytes = std::fs::read(&img).unwrap();
    let geo_itable = v["geometry"]["itable_start"].as_u64().unwrap() as usize;
    bytes[geo_itable * 4096 + 20] ^= 0xff; // root inode record
    std::fs::write(&img, &bytes).unwrap();
    let bad = zcfs().arg("fsck").arg(&img).output().unwrap();
    assert_ne!(bad.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&bad.stderr).contains("panicked"));
    let junk = scratch("junk");
    std::fs::write(&junk, vec![0x5a; 1 << 20]).unwrap();
    let out = zcfs().arg("stat").arg(&junk).output().unwrap();
    assert_eq!(out.status.code(), Some(8));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a zcfs volume"));
    assert_eq!(
        zcfs().arg("fsck").arg(&junk).status().unwrap().code(),
        Some(8)
    );
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&junk);
}

/// Same content rule as the writer.
fn content(i: u64) -> Vec<u8> {
    let len = (i * 7919) % 20000 + 1;
    (0..len)
        .map(|j| (i as u8).wrapping_mul(17).wrapping_add(j as u8))
        .collect()
}

#[test]
fn sigkill_of_a_writer_leaves_a_recoverable_volume_with_fsynced_data() {
    for round in 0..3u64 {
        let img = scratch(&format!("kill{round}"));
        mkfs(&img, "256M", &[]);
        let mut child = zcfs()
            .arg("selftest-writer")
            .arg(&img)
            .args(["--files", "100000", "--fsync-every", "7"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut last_synced = None;
        let start = Instant::now();
        // Kill at a different point each round.
        let kill_after = 20 + round * 37;
        while let Some(Ok(l)) = lines.next() {
            last_synced = l.strip_prefix("synced ").map(|n| n.parse::<u64>().unwrap());
            if last_synced.unwrap() >= kill_after || start.elapsed() > Duration::from_secs(20) {
                break;
            }
        }
        // SAFETY: sending a signal to the child we spawned.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        let last = last_synced.expect("writer printed no fsync");
        assert_fsck_clean(&img, &format!("round {round}: "));
        // Every file up to the last acknowledged fsync is there with its bytes.
        let vol = zcfs_volume::Volume::open(&img, zcfs_volume::VolumeConfig::default()).unwrap();
        let dir = vol
            .lookup(&zcfs_volume::Cred::ROOT, zcfs_volume::ROOT_INO, b"selftest")
            .unwrap()
            .ino;
        for i in 0..=last {
            let a = vol
                .lookup(&zcfs_volume::Cred::ROOT, dir, format!("f{i:06}").as_bytes())
                .unwrap_or_else(|e| panic!("round {round}: f{i} missing: {e}"));
            let want = content(i);
            let mut got = vec![0u8; want.len() + 10];
            let n = vol.read(a.ino, 0, &mut got).unwrap();
            assert_eq!(&got[..n], &want[..], "round {round}: f{i} content");
        }
        drop(vol);
        let _ = std::fs::remove_file(&img);
    }
}

/// mkfs allocates a file image whole (so a full /dev/shm is found at mkfs, not by SIGBUS
/// in the server): the image comes out allocated and clean; `--sparse` leaves it sparse.
#[test]
fn mkfs_allocates_an_image_and_sparse_leaves_it_sparse() {
    use std::os::unix::fs::MetadataExt;
    let size: u64 = (64 << 20) + (4 << 20);
    let img = scratch("mkfs-clear");
    run_ok(
        zcfs()
            .arg("mkfs")
            .arg(&img)
            .args(["--size", &size.to_string()]),
    );
    let md = std::fs::metadata(&img).unwrap();
    assert_eq!(md.len(), size);
    assert!(
        md.blocks() * 512 >= size,
        "allocated {} of {size}",
        md.blocks() * 512
    );
    assert_fsck_clean(&img, "");
    let sparse = scratch("mkfs-sparse");
    run_ok(
        zcfs()
            .arg("mkfs")
            .arg(&sparse)
            .args(["--size", &size.to_string(), "--sparse"]),
    );
    assert!(std::fs::metadata(&sparse).unwrap().blocks() * 512 < size / 2);
    assert_fsck_clean(&sparse, "");
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_file(&sparse);
}
