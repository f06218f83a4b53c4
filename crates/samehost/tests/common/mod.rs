//! A same-host service on a fresh /dev/shm volume image, run in this process.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use zcfs_samehost::{Service, ServiceConfig};
use zcfs_types::identity::{IdentityMap, Squash};
use zcfs_volume::{MkfsOptions, Volume, VolumeConfig};

pub struct Served {
    pub vol: Arc<Volume>,
    pub svc: Arc<Service>,
    pub sock: PathBuf,
    pub image: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub const IMAGE_SIZE: u64 = 64 << 20;

/// A service on a new image named after the test; root acts as root.
pub fn serve(name: &str) -> Served {
    serve_with(name, |_| {})
}

pub fn serve_with(name: &str, f: impl FnOnce(&mut ServiceConfig)) -> Served {
    serve_sized(name, IMAGE_SIZE, f)
}

/// Open a volume, again while it is Busy (bounded: 5 s). Another test of this binary
/// forking a child (`spawn_child`) while mkfs held the image's flock hands the child
/// that descriptor, and so the lock, until the child's exec.
pub fn open_retrying_busy(image: &std::path::Path) -> Arc<Volume> {
    let t = std::time::Instant::now();
    loop {
        match Volume::open(image, VolumeConfig::default()) {
            Err(zcfs_volume::FsError::Busy(m))
                if t.elapsed() < std::time::Duration::from_secs(5) =>
            {
                eprintln!("busy, again: {m}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r.unwrap(),
        }
    }
}

/// The image and socket paths of a test named `name` (this process's).
fn paths(name: &str) -> (PathBuf, PathBuf) {
    let tag = format!("zcfs-sh-{}-{name}", std::process::id());
    (
        PathBuf::from(format!("/dev/shm/{tag}.img")),
        std::env::temp_dir().join(format!("{tag}.sock")),
    )
}

/// A service's configuration on `sock` in which root acts as root.
pub fn root_as_root(sock: impl AsRef<std::path::Path>) -> ServiceConfig {
    let mut cfg = ServiceConfig::new(sock.as_ref());
    cfg.identity = IdentityMap {
        squash: Squash::None,
        ..Default::default()
    };
    cfg
}

/// A new image of `IMAGE_SIZE` and a socket path named after the test, for a test
/// that opens the image itself (and again); the image is removed when this drops.
pub struct Image {
    pub image: PathBuf,
    pub sock: PathBuf,
}

impl Image {
    pub fn new(name: &str) -> Image {
        let (image, sock) = paths(name);
        let _ = std::fs::remove_file(&image);
        let _ = std::fs::remove_file(&sock);
        Volume::mkfs(&image, IMAGE_SIZE, &MkfsOptions::default()).unwrap();
        Image { image, sock }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_file(&self.sock);
    }
}

/// A service on an image of `size` bytes.
pub fn serve_sized(name: &str, size: u64, f: impl FnOnce(&mut ServiceConfig)) -> Served {
    let (image, sock) = paths(name);
    let _ = std::fs::remove_file(&image);
    Volume::mkfs(&image, size, &MkfsOptions::default()).unwrap();
    let vol = open_retrying_busy(&image);
    let mut cfg = root_as_root(&sock);
    f(&mut cfg);
    let svc = Arc::new(Service::bind(vol.clone(), cfg).unwrap());
    let run = svc.clone();
    let thread = Some(std::thread::spawn(move || run.run()));
    Served {
        vol,
        svc,
        sock,
        image,
        thread,
    }
}

impl Served {
    /// Stop the service (its connections release everything they held).
    pub fn stop(&mut self) {
        self.svc.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// Stop, then fsck the volume in memory: clean, and no block leaked.
    pub fn stop_and_check(&mut self) {
        self.stop();
        self.vol.checkpoint_now().unwrap();
        let r = zcfs_volume::fsck::check_volume(&self.vol);
        assert!(r.is_clean(), "fsck: {:?}", r.problems);
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Deterministic bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The environment variable that makes a test function act as a child process.
pub const CHILD_ENV: &str = "ZCFS_SH_CHILD";

/// Run test `name` of this test binary in a child process with `CHILD_ENV` = `arg`.
pub fn spawn_child(name: &str, arg: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, arg)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// In a child: become uid and gid 65534 with the one supplementary group 4242 (the
/// trust group the tests configure).
pub fn become_trust_group_member() {
    // SAFETY: plain system calls in a single-threaded child test process.
    unsafe {
        let g: [libc::gid_t; 1] = [4242];
        assert_eq!(libc::setgroups(1, g.as_ptr()), 0);
        assert_eq!(libc::setgid(65534), 0);
        assert_eq!(libc::setuid(65534), 0);
    }
}

/// The child's argument, when this process is a child.
pub fn child_arg() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Wait (bounded: 20 s) until `f` holds.
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("{what}: not within 20 s");
}

/// A COMMIT entry sent as is, naming reservations by id (the typed `Client::commit`
/// takes the reservations themselves): tests of the server's own checks. `buf` is a
/// registered buffer of at least 32 bytes per placement.
///
/// # Safety
/// As `Client::call_unchecked`: no window of a reservation it commits is written after.
pub unsafe fn raw_commit(
    c: &mut zcfs_samehost::client::Client,
    buf: u32,
    placements: &[zcfs_samehost::ring::Placement],
) -> zcfs_samehost::client::Result<()> {
    use zcfs_samehost::ring::{op, Sqe, PLACEMENT_SIZE};
    let b = c.buffer_mut(buf)?;
    for (i, p) in placements.iter().enumerate() {
        b[i * PLACEMENT_SIZE..(i + 1) * PLACEMENT_SIZE].copy_from_slice(&p.encode());
    }
    let e = Sqe {
        op: op::COMMIT,
        len: placements.len() as u64,
        buf,
        ..Default::default()
    };
    // SAFETY: per this function's contract.
    unsafe { c.call_unchecked(e) }.map(|_| ())
}

/// Allocate every byte of `image` (fallocate), as `zcfs mkfs` makes an image by default:
/// only then do the client and the volume fault it in ahead of use.
pub fn allocate_whole(image: &std::path::Path) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(image).unwrap();
    let len = f.metadata().unwrap().len();
    // SAFETY: fallocate on a descriptor we own, plain integers.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(rc, 0, "fallocate {}", image.display());
}

/// Become uid and gid 65534 with no supplementary groups (a child test process:
/// single-threaded, so the credentials of every thread change).
pub fn become_nobody() {
    // SAFETY: plain system calls with plain integers.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
        assert_eq!(libc::setgid(65534), 0);
        assert_eq!(libc::setuid(65534), 0);
    }
}
