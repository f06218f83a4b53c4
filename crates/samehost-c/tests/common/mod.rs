//! A same-host service on a fresh /dev/shm volume image, run in this process: the
//! harness of crates/samehost's tests, shared rather than copied.
#![allow(unused_imports, dead_code)]

#[path = "../../../samehost/tests/common/mod.rs"]
mod samehost_common;

pub use samehost_common::*;

use std::path::PathBuf;
use std::process::Command;

/// The directory holding libzcfs.so: beside the test binary (target/<profile>/deps)
/// or one up.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for d in [deps, deps.parent().unwrap()] {
        if d.join("libzcfs.so").exists() {
            return d.to_path_buf();
        }
    }
    panic!("libzcfs.so not beside {}", exe.display());
}

/// libzcfs.so itself (the Python examples' ZCFS_LIB).
pub fn lib_path() -> PathBuf {
    lib_dir().join("libzcfs.so")
}

/// A python3 that imports numpy: $ZCFS_PYTHON, else Debian's /usr/bin/python3 (where
/// python3-numpy installs), else the first python3 on PATH. None when there is none.
fn python() -> Option<PathBuf> {
    let mut cands: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("ZCFS_PYTHON") {
        cands.push(p.into());
    }
    cands.push("/usr/bin/python3".into());
    cands.push("python3".into());
    cands.into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// The Python interpreter, or None (test passes vacuously) when it is missing and not
/// required (ZCFS_REQUIRE_PYTHON=1 makes it a failure).
pub fn python_or_skip(test: &str) -> Option<PathBuf> {
    let require = std::env::var("ZCFS_REQUIRE_PYTHON").is_ok_and(|v| v == "1");
    let p = python();
    if p.is_none() {
        assert!(
            !require,
            "ZCFS_REQUIRE_PYTHON=1 but no python3 with numpy (apt-get install python3-numpy)"
        );
        eprintln!("{test}: skipped, no python3 with numpy");
    }
    p
}
