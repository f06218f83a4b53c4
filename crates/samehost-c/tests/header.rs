//! include/zcfs.h is committed (no cbindgen, hence no network, needed to build). This
//! checks it: every exported function of src/lib.rs is declared in it, and, when
//! `cbindgen` is on PATH (`cargo install cbindgen`), regenerating it gives the same
//! bytes.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_header_declares_every_exported_function() {
    let src = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let h = std::fs::read_to_string(root().join("include/zcfs.h")).unwrap();
    let mut names = Vec::new();
    let mut lines = src.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "#[no_mangle]" {
            let def = lines.next().unwrap();
            let name = def.split("fn ").nth(1).unwrap().split('(').next().unwrap();
            names.push(name.to_string());
        }
    }
    assert!(names.len() >= 20, "found only {names:?}");
    for n in &names {
        assert!(
            h.contains(&format!(" {n}(")) || h.contains(&format!("*{n}(")),
            "{n} not in zcfs.h"
        );
    }
    // And nothing the header declares is gone from the library.
    for l in h
        .lines()
        .filter(|l| !l.starts_with(' ') && l.contains("zcfs_") && l.contains('('))
    {
        let n = l
            .split('(')
            .next()
            .unwrap()
            .rsplit([' ', '*'])
            .next()
            .unwrap();
        assert!(
            names.iter().any(|x| x == n),
            "zcfs.h declares {n}, the library does not export it"
        );
    }
}

#[test]
fn the_committed_header_is_what_cbindgen_makes() {
    if Command::new("cbindgen").arg("--version").output().is_err() {
        eprintln!("cbindgen not installed: regeneration not checked");
        return;
    }
    let out = std::env::temp_dir().join(format!("zcfs-h-{}.h", std::process::id()));
    let st = Command::new("cbindgen")
        .current_dir(root())
        .args([
            "--config",
            "cbindgen.toml",
            "--crate",
            "zcfs-samehost-c",
            "--quiet",
            "--output",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    let want = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    let have = std::fs::read_to_string(root().join("include/zcfs.h")).unwrap();
    assert!(
        have == want,
        "include/zcfs.h is stale: in crates/samehost-c run \
         cbindgen --config cbindgen.toml --crate zcfs-samehost-c --output include/zcfs.h"
    );
}
