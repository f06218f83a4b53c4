//! Who the caller is, through the real binaries (issue 10, identity): `zcfs serve` on
//! its default listener (a Unix socket) prints the address `zcfs mount` takes; an
//! ordinary local user mounts it (through fusermount3) and acts only as itself; the
//! pjdfstest-style script on a REMOTE mount without default_permissions matches tmpfs.

mod common;
use common::mount::{unique, Mount};
use common::posix::compare_with_tmpfs;
use common::{mkfs, mounted, spawn_serving, wait_until_mounted, zcfs};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `zcfs serve` of a fresh image; stopped (SIGTERM) on drop.
struct Served {
    child: Child,
    image: PathBuf,
    /// The address it printed (`serving IMAGE on ADDRESS`).
    addr: String,
}

impl Served {
    fn start(name: &str, args: &[&str]) -> Served {
        let image = PathBuf::from(format!("/dev/shm/{}.img", unique(name)));
        mkfs(&image, "64M", &[]);
        let (child, line) = spawn_serving(
            zcfs()
                .arg("serve")
                .arg(&image)
                .args(args)
                .stderr(Stdio::null()),
        );
        let prefix = format!("serving {} on ", image.display());
        let addr = line
            .trim_end()
            .strip_prefix(&prefix)
            .unwrap_or_else(|| panic!("{line:?} does not start with {prefix:?}"))
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        Served { child, image, addr }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Run `argv` as `uid`:`gid` without supplementary groups (setpriv, util-linux).
fn as_user(uid: u32, argv: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
            "--",
        ])
        .args(argv)
        .output()
        .unwrap()
}

fn sh_as(uid: u32, script: &str) -> (bool, String) {
    let out = as_user(uid, &["sh", "-c", script]);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// fusermount3 opens /dev/fuse as the calling user: distributions make it 0666 (udev),
/// a container may not have.
fn dev_fuse_for_users() {
    let m = std::fs::metadata("/dev/fuse").expect("/dev/fuse");
    if m.mode() & 0o666 != 0o666 {
        std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).unwrap();
    }
}

/// Detaches a user's mount left behind by a failing test (its process then ends).
struct Detach(PathBuf);

impl Drop for Detach {
    fn drop(&mut self) {
        if mounted(&self.0) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(&self.0)
                .status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The uid ordinary users are tested as: nobody, because fusermount3 wants the caller
/// in the user database.
const USER: u32 = 65_534;

#[test]
fn an_ordinary_user_mounts_the_default_socket_and_acts_only_as_itself() {
    dev_fuse_for_users();
    // Root on the socket acts as root (it sets the scene); the user acts as itself.
    let srv = Served::start("ident-user", &["--no-root-squash"]);
    assert!(
        srv.addr.starts_with("unix:/run/zcfs/") && srv.addr.ends_with(".sock"),
        "default listener: {}",
        srv.addr
    );
    let sock = srv.addr.strip_prefix("unix:").unwrap();
    assert_eq!(std::fs::metadata(sock).unwrap().mode() & 0o777, 0o666);
    // Root mounts the printed address and leaves a private file and a public dir.
    let mut root = Mount {
        image: None,
        mp: PathBuf::new(),
        child: None,
    };
    root.start(&srv.addr, &["-o", "allow_other,cache=none"]);
    std::fs::write(root.path("secret"), b"root only").unwrap();
    std::fs::set_permissions(root.path("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(root.path("pub")).unwrap();
    std::fs::set_permissions(root.path("pub"), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert_eq!(std::fs::metadata(root.path("secret")).unwrap().uid(), 0);

    // The user mounts the same address on its own directory: through fusermount3.
    let mp = std::env::temp_dir().join(unique("user-mp"));
    std::fs::create_dir_all(&mp).unwrap();
    std::os::unix::fs::chown(&mp, Some(USER), Some(USER)).unwrap();
    let mut mount = Command::new("setpriv")
        .args([
            &format!("--reuid={USER}"),
            &format!("--regid={USER}"),
            "--clear-groups",
            "--",
            common::zcfs_bin(),
            "mount",
            &srv.addr,
        ])
        .arg(&mp)
        .args(["-o", "cache=none"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _detach = Detach(mp.clone());
    wait_until_mounted(&mut mount, &mp);
    let p = |n: &str| mp.join(n).to_str().unwrap().to_string();
    // Its own files are its own.
    let (ok, err) = sh_as(USER, &format!("echo mine > {}", p("pub/mine")));
    assert!(ok, "{err}");
    let m = std::fs::metadata(root.path("pub/mine")).unwrap();
    assert_eq!((m.uid(), m.gid()), (USER, USER));
    // Root's private file: no reading, no chmod, no chown, no taking it over.
    let (ok, err) = sh_as(USER, &format!("cat {}", p("secret")));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let (ok, err) = sh_as(USER, &format!("chmod 0666 {}", p("secret")));
    assert!(!ok && err.contains("not permitted"), "{err}");
    let (ok, err) = sh_as(USER, &format!("chown {USER} {}", p("secret")));
    assert!(!ok && err.contains("not permitted"), "{err}");
    let (ok, err) = sh_as(USER, &format!("echo x > {}", p("root-dir-file")));
    assert!(!ok && err.contains("Permission denied"), "{err}");
    let m = std::fs::metadata(root.path("secret")).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600));
    assert_eq!(std::fs::read(root.path("secret")).unwrap(), b"root only");

    // A client of its own that names root (or another user) is refused: EPERM.
    let sock = PathBuf::from(sock);
    let statuses = std::thread::spawn(move || {
        // SAFETY: the raw system calls change this thread's credentials only.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<u32>()),
                0
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, USER, USER, USER), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, USER, USER, USER), 0);
        }
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        zcfs_transport::client_handshake(&mut s, None, 5, Default::default()).unwrap();
        let mut status = |id: u64, uid: u32, gid: u32| {
            use std::io::{Read, Write};
            let (h, body) = zcfs_protocol::Request::from(zcfs_protocol::GetattrReq {
                node: zcfs_protocol::NodeRef::ino(1),
            })
            .encode(id, zcfs_protocol::Cred { uid, gid });
            s.write_all(&h).unwrap();
            s.write_all(&body).unwrap();
            let mut rh = [0u8; zcfs_protocol::RESP_HDR];
            s.read_exact(&mut rh).unwrap();
            let rh = zcfs_protocol::RespHeader::decode(&rh).unwrap();
            let mut rest = vec![0u8; rh.body_len as usize];
            s.read_exact(&mut rest).unwrap();
            rh.status
        };
        [
            status(1, 0, 0),
            status(2, 1001, 1001),
            status(3, USER, USER),
        ]
    })
    .join()
    .unwrap();
    assert_eq!(statuses, [libc::EPERM, libc::EPERM, 0]);

    // The user unmounts: the mount goes, its process ends cleanly.
    let out = as_user(USER, &[common::zcfs_bin(), "umount", mp.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = Instant::now();
    let st = loop {
        if let Some(st) = mount.try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "mount process did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "{st}");
    assert!(!mounted(&mp));
    root.stop();
}

/// TCP without a secret, loopback included, needs --insecure; with it, the printed
/// `tcp:` address mounts.
#[test]
fn tcp_needs_a_secret_or_insecure_and_its_printed_address_mounts() {
    let image = PathBuf::from(format!("/dev/shm/{}.img", unique("ident-tcp0")));
    mkfs(&image, "64M", &[]);
    let out = zcfs()
        .arg("serve")
        .arg(&image)
        .args(["--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--secret-file") && err.contains("--insecure"),
        "{err}"
    );
    let _ = std::fs::remove_file(&image);
    let srv = Served::start("ident-tcp", &["--listen", "127.0.0.1:0", "--insecure"]);
    assert!(srv.addr.starts_with("tcp:127.0.0.1:"), "{}", srv.addr);
    let mut m = Mount {
        image: None,
        mp: PathBuf::new(),
        child: None,
    };
    m.start(&srv.addr, &[]);
    // Root squash: root acts as nobody, who may not write in the root-owned 0755 root.
    assert!(m.path(".").is_dir());
    let e = std::fs::create_dir(m.path("d")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    m.stop();
}

/// The pjdfstest-style script on a REMOTE mount (root on the Unix socket, no root
/// squash) without default_permissions: every rule is the server's, and it matches
/// tmpfs step for step.
#[test]
fn remote_mount_without_default_permissions_matches_tmpfs() {
    let srv = Served::start("ident-posix", &["--no-root-squash"]);
    let mut m = Mount {
        image: None,
        mp: PathBuf::new(),
        child: None,
    };
    m.start(&srv.addr, &["-o", "allow_other,cache=none"]);
    let base = m.path("base");
    std::fs::create_dir(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o777)).unwrap();
    let diffs = compare_with_tmpfs(Path::new(&base));
    assert!(
        diffs.is_empty(),
        "{} steps differ from tmpfs:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
    m.stop();
}
