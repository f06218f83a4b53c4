//! examples/c/samehost.c, compiled with `cc` against include/zcfs.h and libzcfs.so,
//! run against an in-process service; its output is asserted line by line.

mod common;
use std::path::Path;
use std::process::Command;

fn compile(out: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = common::lib_dir();
    let st = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(out)
        .arg(root.join("../../examples/c/samehost.c"))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lzcfs")
        .status()
        .expect("cc runs");
    assert!(st.success(), "cc failed: {st}");
}

#[test]
fn the_c_example_writes_reads_and_zero_copies_through_libzcfs() {
    let mut s = common::serve("cex");
    let exe = std::env::temp_dir().join(format!("zcfs-shc-example-{}", std::process::id()));
    compile(&exe);
    // The library beside this test, whatever `cargo test` puts first on
    // LD_LIBRARY_PATH (target/<profile>, where an older `cargo build` may have left a
    // libzcfs.so of an earlier protocol: the server then refuses its Hello, EPROTO).
    let out = Command::new(&exe)
        .arg(&s.sock)
        .env("LD_LIBRARY_PATH", common::lib_dir())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&exe);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "example failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "connected trusted=1");
    assert!(lines[1].starts_with("buffer ") && lines[1].ends_with(" len=65536"));
    assert_eq!(lines[2], "shared wrote=10000 read=10000 match=1");
    // 4096 at 0, and 10000 - 8192 at 8192.
    assert_eq!(lines[3], "batch completions=2 bytes=5904");
    assert!(
        lines[4].starts_with("zcopy_to covered=10000 extents=") && lines[4].ends_with(" match=1"),
        "{}",
        lines[4]
    );
    // Two pages placed at 64 KiB, size 64 KiB + 8000: from 64 KiB + 4095, 3905 bytes.
    assert_eq!(lines[5], "pflush read=3905 bytes=AB");
    assert_eq!(lines[6], "closed");
    assert_eq!(lines.len(), 7);
    // The server sees what the example wrote.
    let cred = zcfs_volume::Cred::ROOT;
    let ino = s.vol.lookup(&cred, 1, b"hello-c").unwrap().ino;
    let mut b = vec![0u8; 10000];
    assert_eq!(s.vol.read(ino, 0, &mut b).unwrap(), 10000);
    assert!(b.iter().enumerate().all(|(i, &x)| x == (i * 7 + 3) as u8));
    s.stop();
}
