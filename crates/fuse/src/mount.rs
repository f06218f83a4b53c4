//! Mounting a `FuseFs`: directly as root (`direct`), through fusermount3 otherwise.

use crate::{direct, fusermount, FuseFs};
use fuser::{BackgroundSession, Config, SessionACL};
use std::path::Path;

/// A mounted file system served by background threads. Nothing here unmounts by itself
/// (fuser's own mount would, by path, whatever is mounted there when its session ends):
/// the owner calls `umount_and_join` while the mount is still its own.
pub struct Mounted {
    session: BackgroundSession,
    mountpoint: std::path::PathBuf,
    /// Mounted through fusermount3 (as an ordinary user): unmounted with it too.
    via_fusermount: bool,
}

impl Mounted {
    /// The session ended (the file system was unmounted, or it failed).
    pub fn is_finished(&self) -> bool {
        self.session.guard.is_finished()
    }

    /// Unmount; a busy mount (files open) is detached instead, and its connection
    /// lives on until they close: Ok(true). Only while the mount on the mount point
    /// is this one: this goes by path. The session ends when the kernel drops the
    /// connection (`join`).
    pub fn unmount(&self) -> std::io::Result<bool> {
        let mp = &self.mountpoint;
        let plain = if self.via_fusermount {
            fusermount::unmount(mp, false)
        } else {
            direct::unmount(mp, false)
        };
        if plain.is_ok() {
            return Ok(false);
        }
        if self.via_fusermount {
            fusermount::unmount(mp, true)?;
        } else {
            direct::unmount(mp, true)?;
        }
        Ok(true)
    }

    /// Wait for the session to end (someone else unmounts).
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
    }
}

/// Whether this process may open /dev/fuse and call mount(2) itself.
fn can_mount_directly() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return false;
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

/// Mount `fs` on `mountpoint` in background threads. Root mounts directly; anyone else
/// (or root where /dev/fuse cannot be opened) through the setuid fusermount3, as
/// libfuse does.
pub fn spawn(fs: FuseFs, mountpoint: &Path, config: &Config) -> std::io::Result<Mounted> {
    let allow_other = config.acl != SessionACL::Owner;
    let via_fusermount = !can_mount_directly();
    let fd = if via_fusermount {
        fusermount::mount(mountpoint, &config.mount_options, allow_other)?
    } else {
        direct::mount(mountpoint, &config.mount_options, allow_other)?
    };
    let notifier = fs.notifier_cell();
    let session = match fuser::Session::from_fd(fs, fd, config.acl, config.clone()) {
        Ok(s) => {
            // Before the session serves its first request.
            let _ = notifier.set(s.notifier());
            s.spawn()
        }
        Err(e) => Err(e),
    };
    match session {
        Ok(session) => Ok(Mounted {
            session,
            mountpoint: mountpoint.to_path_buf(),
            via_fusermount,
        }),
        Err(e) => {
            // Mounted, but not served: take it down again (nothing else can be
            // mounted on it yet: we are the one who just did).
            let _ = if via_fusermount {
                fusermount::unmount(mountpoint, true)
            } else {
                direct::unmount(mountpoint, true)
            };
            Err(e)
        }
    }
}
