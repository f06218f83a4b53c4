//! Mounting as an ordinary user, as libfuse does (lib/mount.c, `fuse_mount_fusermount`):
//! the setuid `fusermount3` opens /dev/fuse, mounts it, and passes the descriptor back
//! over a socketpair (SCM_RIGHTS; the socket's number in `_FUSE_COMMFD`). Unmounted
//! with `fusermount3 -u`.

use crate::MountOption;
use std::io::{Error, ErrorKind};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The helper, in $PATH (fusermount3 first, then the fuse 2 one).
pub fn fusermount_bin() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for bin in ["fusermount3", "fusermount"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(bin);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// An option as fusermount3 takes it with -o.
fn option_text(o: &MountOption) -> String {
    match o {
        MountOption::FSName(n) => format!("fsname={n}"),
        MountOption::Subtype(s) => format!("subtype={s}"),
        MountOption::CUSTOM(c) => c.clone(),
        MountOption::AutoUnmount => "auto_unmount".into(),
        MountOption::DefaultPermissions => "default_permissions".into(),
        MountOption::Dev => "dev".into(),
        MountOption::NoDev => "nodev".into(),
        MountOption::Suid => "suid".into(),
        MountOption::NoSuid => "nosuid".into(),
        MountOption::RO => "ro".into(),
        MountOption::RW => "rw".into(),
        MountOption::Exec => "exec".into(),
        MountOption::NoExec => "noexec".into(),
        MountOption::Atime => "atime".into(),
        MountOption::NoAtime => "noatime".into(),
        MountOption::DirSync => "dirsync".into(),
        MountOption::Sync => "sync".into(),
        MountOption::Async => "async".into(),
    }
}

/// Mount `mountpoint` through fusermount3 and return the /dev/fuse descriptor it
/// passes back. `allow_other` is added for a session open to others.
pub fn mount(
    mountpoint: &Path,
    options: &[MountOption],
    allow_other: bool,
) -> std::io::Result<OwnedFd> {
    let bin = fusermount_bin().ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            "fusermount3 is missing (needed to mount as a non-root user): apt-get install fuse3",
        )
    })?;
    let mut opts: Vec<String> = options.iter().map(option_text).collect();
    if allow_other {
        opts.push("allow_other".into());
    }
    let (ours, theirs) = UnixStream::pair()?;
    let mut cmd = Command::new(&bin);
    if !opts.is_empty() {
        cmd.arg("-o").arg(opts.join(","));
    }
    let fd = theirs.as_raw_fd();
    cmd.arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec only fcntl on a descriptor the child inherited:
    // async-signal-safe, no allocation.
    unsafe {
        cmd.pre_exec(move || {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(theirs);
    let got = receive_fd(&ours);
    drop(ours);
    let out = child.wait_with_output()?;
    match got {
        Ok(fd) if out.status.success() => Ok(fd),
        Ok(_) | Err(_) => {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            let kind = if err.contains("user_allow_other") || err.contains("ermission denied") {
                ErrorKind::PermissionDenied
            } else {
                ErrorKind::Other
            };
            Err(Error::new(
                kind,
                format!(
                    "{}: {}",
                    bin.display(),
                    if err.is_empty() {
                        got.err().map(|e| e.to_string()).unwrap_or_default()
                    } else {
                        err
                    }
                ),
            ))
        }
    }
}

/// The descriptor fusermount3 sends: one byte of data with an SCM_RIGHTS message.
fn receive_fd(s: &UnixStream) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // Room for one descriptor's control message, u64-aligned.
    let mut cbuf = [0u64; 8];
    // SAFETY: msghdr is plain data; zero is a valid value for every field.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: msg describes `byte` and `cbuf`, both alive for the call.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break n;
    };
    if n == 0 {
        return Err(Error::new(
            ErrorKind::UnexpectedEof,
            "fusermount3 exited without passing a descriptor",
        ));
    }
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within
    // msg_controllen; the data of an SCM_RIGHTS message is an int descriptor.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_level != libc::SOL_SOCKET || (*c).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(Error::new(
                ErrorKind::InvalidData,
                "fusermount3 sent no descriptor",
            ));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
        if fd < 0 {
            return Err(Error::new(
                ErrorKind::InvalidData,
                "fusermount3 sent a bad descriptor",
            ));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Unmount with `fusermount3 -u` (`-z`: lazily, detaching a busy mount).
pub fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    let bin = fusermount_bin()
        .ok_or_else(|| Error::new(ErrorKind::NotFound, "fusermount3 is missing"))?;
    let mut cmd = Command::new(&bin);
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(mountpoint)
        .stdin(Stdio::null())
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::other(format!(
            "{} -u {}: {}",
            bin.display(),
            mountpoint.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
