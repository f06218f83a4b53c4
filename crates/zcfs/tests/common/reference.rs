//! What the tests that compare zcfs with the kernel's own file systems share: a tmpfs
//! reference directory, a remote mount to run a script on, and errno as text.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

pub fn errname(e: i32) -> String {
    if e == 0 {
        "ok".into()
    } else {
        std::io::Error::from_raw_os_error(e).to_string()
    }
}

/// What a system call that returned `r` did: "ok", or its error.
pub fn outcome(r: libc::c_int) -> String {
    errname(if r < 0 { errno() } else { 0 })
}

/// A fresh directory on tmpfs, removed when dropped.
pub struct TmpfsDir(pub PathBuf);

impl TmpfsDir {
    pub fn new(name: &str) -> TmpfsDir {
        let d = PathBuf::from(format!(
            "/dev/shm/zcfs-posix-ref-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir(&d).unwrap();
        TmpfsDir(d)
    }
}

impl Drop for TmpfsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `script` on a remote zcfs mount (server and mount in their own network
/// namespaces), then stop the server and check its volume.
pub fn through_a_server<T>(tag: &str, opts: &[&str], script: impl FnOnce(&Path) -> T) -> T {
    through_a_server_with(tag, &[], opts, script)
}

/// `through_a_server`, the server started with `serve_args` too.
pub fn through_a_server_with<T>(
    tag: &str,
    serve_args: &[&str],
    opts: &[&str],
    script: impl FnOnce(&Path) -> T,
) -> T {
    let net = super::remote::Net::new();
    let mut srv = super::remote::Served::new(&net, tag, serve_args);
    let rm = super::remote::RemoteMount::new(&net, &srv, &format!("{tag}-mp"), opts);
    let out = script(&rm.mp);
    drop(rm);
    srv.kill(libc::SIGTERM);
    srv.fsck();
    out
}
