//! Writes `zcfs.pc` (pkg-config) next to the library: `target/<profile>/zcfs.pc`.
//! The header is committed (include/zcfs.h); tests/header.rs checks it against the
//! exported functions.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR = <target>/<profile>/build/<pkg>-<hash>/out
    let Some(libdir) = out.ancestors().nth(3) else {
        return;
    };
    let include =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("include");
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets it");
    let pc = format!(
        "libdir={}\nincludedir={}\n\nName: zcfs\nDescription: zcfs same-host interface (C ABI)\n\
         Version: {version}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lzcfs\n\
         Libs.private: -lpthread -ldl -lm\nCflags: -I${{includedir}}\n",
        libdir.display(),
        include.display()
    );
    if let Err(e) = std::fs::write(libdir.join("zcfs.pc"), pc) {
        println!("cargo:warning=zcfs.pc not written: {e}");
    }
}
