//! examples/python/samehost.py (ctypes over libzcfs.so, numpy views over the shared
//! buffer and the direct map) run against an in-process service; its output is
//! asserted line by line.
//!
//! Needs python3 with numpy (Debian's python3-numpy, which scripts/test.sh installs).
//! Without them the test passes vacuously with a note, unless ZCFS_REQUIRE_PYTHON=1
//! (scripts/test.sh, CI), where it fails.

mod common;
use std::path::Path;
use std::process::Command;

#[test]
fn the_python_example_writes_reads_and_zero_copies_through_numpy_views() {
    let Some(py) = common::python_or_skip("python example") else {
        return;
    };
    let mut s = common::serve("pyex");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(py)
        .arg(root.join("../../examples/python/samehost.py"))
        .arg(&s.sock)
        .env("ZCFS_LIB", common::lib_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "example failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "connected trusted=1");
    assert!(
        lines[1].starts_with("buffer ") && lines[1].ends_with(" len=65536 numpy_view=1"),
        "{}",
        lines[1]
    );
    assert_eq!(lines[2], "shared wrote=10000 read=10000 match=1");
    // 1024 floats from 0 to 1: sum 512.
    assert_eq!(lines[3], "tensor float32 n=1024 sum=512.0");
    assert!(
        lines[4].starts_with("zcopy_to covered=10000 extents=")
            && lines[4].ends_with(" match=1 readonly=1"),
        "{}",
        lines[4]
    );
    assert_eq!(lines[5], "read_mapped match=1");
    // Two pages placed at 64 KiB, size 64 KiB + 8000: from 64 KiB + 4095, 3905 bytes.
    assert_eq!(lines[6], "pflush read=3905 bytes=AB");
    // After the commit the reservation has no window and hands out no page.
    assert_eq!(lines[7], "after commit window=None page_refused=1");
    assert_eq!(lines[8], "closed");
    assert_eq!(lines.len(), 9);
    // The server sees what the example wrote, through the shared buffer and in place.
    let cred = zcfs_volume::Cred::ROOT;
    let ino = s.vol.lookup(&cred, 1, b"hello-py").unwrap().ino;
    let mut b = vec![0u8; 10000];
    assert_eq!(s.vol.read(ino, 0, &mut b).unwrap(), 10000);
    assert!(b.iter().enumerate().all(|(i, &x)| x == (i * 7 + 3) as u8));
    let mut p = vec![0u8; 4096];
    assert_eq!(s.vol.read(ino, 65536 + 4096, &mut p).unwrap(), 8000 - 4096);
    assert!(p[..8000 - 4096].iter().all(|&x| x == b'B'));
    s.stop_and_check();
}
