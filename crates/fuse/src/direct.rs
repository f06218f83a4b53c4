//! Mounting as root: open /dev/fuse and mount(2) it ourselves, as libfuse's
//! `fuse_mount_sys` does, then serve the descriptor (`fuser::Session::from_fd`).
//!
//! Why not fuser's own mount: its session unmounts *by path* when it ends, and it
//! takes a connection that is gone (POLLERR on /dev/fuse) for a live one, so a session
//! ending after its mount was unmounted or lazily detached would unmount whatever is
//! mounted on the mount point by then. Here the caller unmounts, and only its own
//! mount.

use crate::MountOption;
use std::ffi::CString;
use std::io::{Error, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The mount(2) flags of the generic options; None: a FUSE option for the data string.
fn flag(o: &MountOption) -> Option<libc::c_ulong> {
    Some(match o {
        MountOption::RO => libc::MS_RDONLY,
        MountOption::NoSuid => libc::MS_NOSUID,
        MountOption::NoDev => libc::MS_NODEV,
        MountOption::NoExec => libc::MS_NOEXEC,
        MountOption::NoAtime => libc::MS_NOATIME,
        MountOption::Sync => libc::MS_SYNCHRONOUS,
        MountOption::DirSync => libc::MS_DIRSYNC,
        MountOption::RW
        | MountOption::Suid
        | MountOption::Dev
        | MountOption::Exec
        | MountOption::Atime
        | MountOption::Async => 0,
        _ => return None,
    })
}

fn c_string(what: &str, b: &[u8]) -> std::io::Result<CString> {
    CString::new(b).map_err(|_| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

/// Mount /dev/fuse on `mountpoint` and return the descriptor to serve. Like libfuse:
/// nosuid and nodev unless `suid`/`dev` are asked for; `allow_other` for a session
/// open to others.
pub fn mount(
    mountpoint: &Path,
    options: &[MountOption],
    allow_other: bool,
) -> std::io::Result<OwnedFd> {
    // Everything checked before /dev/fuse is opened: a refused option costs nothing.
    let rootmode = std::fs::metadata(mountpoint)?.mode();
    let mut fuse_options = String::new();
    let mut flags = 0;
    if !options.contains(&MountOption::Suid) {
        flags |= libc::MS_NOSUID;
    }
    if !options.contains(&MountOption::Dev) {
        flags |= libc::MS_NODEV;
    }
    let mut source = "zcfs".to_string();
    for o in options {
        match (o, flag(o)) {
            (MountOption::FSName(n), _) => source = n.clone(),
            (MountOption::Subtype(_) | MountOption::AutoUnmount, _) => {}
            (MountOption::DefaultPermissions, _) => fuse_options.push_str(",default_permissions"),
            (MountOption::CUSTOM(c), _) => {
                fuse_options.push(',');
                fuse_options.push_str(c);
            }
            (_, Some(f)) => flags |= f,
            (o, None) => {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("mount option {o:?} is not supported by a direct mount"),
                ))
            }
        }
    }
    if allow_other {
        fuse_options.push_str(",allow_other");
    }
    let dev: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?
        .into();
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let data = format!(
        "fd={},rootmode={rootmode:o},user_id={uid},group_id={gid}{fuse_options}",
        dev.as_raw_fd()
    );
    let (src, target, fstype, data_c) = (
        c_string("the file system name", source.as_bytes())?,
        c_string("the mount point", mountpoint.as_os_str().as_bytes())?,
        c_string("fstype", b"fuse")?,
        c_string("the mount options", data.as_bytes())?,
    );
    // SAFETY: mount(2) with valid C strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data_c.as_ptr() as *const libc::c_void,
        )
    };
    if r != 0 {
        let e = Error::last_os_error();
        return Err(Error::new(
            e.kind(),
            format!(
                "mount({source}, {}, fuse, {data}): {e}",
                mountpoint.display()
            ),
        ));
    }
    Ok(dev)
}

/// Unmount `mountpoint` (`lazy`: detach a busy mount). The caller makes sure the mount
/// there is its own.
pub fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    let target = c_string("the mount point", mountpoint.as_os_str().as_bytes())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2 with a valid C string.
    if unsafe { libc::umount2(target.as_ptr(), flags) } != 0 {
        return Err(Error::last_os_error());
    }
    Ok(())
}
