//! Builds the XDP program (bpf/zcfs_xdp.c) with clang into OUT_DIR. Without clang the build
//! still succeeds: an empty object is embedded and `XdpProgram::attach` says zcfs was built
//! without clang (set ZCFS_REQUIRE_L2=1 to make the tests fail rather than skip then).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/zcfs_xdp.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    println!("cargo:rustc-check-cfg=cfg(zcfs_xdp_missing)");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("zcfs_xdp.o");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let built = Command::new(&clang)
        .args([
            "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", "-c", src, "-o",
        ])
        .arg(&out)
        .status();
    match built {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed to compile {src} ({s})"),
        Err(e) => {
            println!(
                "cargo:warning=zcfs-xsk: {clang} not found ({e}): building without the XDP program; the layer-2 transport is unavailable (apt-get install clang llvm)"
            );
            std::fs::write(&out, b"").expect("writing the empty XDP object");
            println!("cargo:rustc-cfg=zcfs_xdp_missing");
        }
    }
}
