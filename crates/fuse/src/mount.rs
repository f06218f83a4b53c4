//! Mounting a `FuseFs`: directly as root, through fusermount3 otherwise.

use crate::{fusermount, FuseFs};
use fuser::{BackgroundSession, Config, SessionACL};
use std::path::Path;

/// A mounted file system served by background threads.
pub struct Mounted {
    session: BackgroundSession,
    /// Mounted through fusermount3 (as an ordinary user): unmounted with it too.
    via_fusermount: Option<std::path::PathBuf>,
}

impl Mounted {
    /// The session ended (the file system was unmounted, or it failed).
    pub fn is_finished(&self) -> bool {
        self.session.guard.is_finished()
    }

    /// Whether it was mounted through fusermount3.
    pub fn via_fusermount(&self) -> bool {
        self.via_fusermount.is_some()
    }

    /// Unmount and wait for the session to end.
    pub fn umount_and_join(self) -> std::io::Result<()> {
        match &self.via_fusermount {
            None => self.session.umount_and_join(),
            Some(mp) => {
                // The session thread ends when the kernel says the mount is gone.
                fusermount::unmount(mp, false).or_else(|_| fusermount::unmount(mp, true))?;
                self.session.join()
            }
        }
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
    if can_mount_directly() {
        return Ok(Mounted {
            session: fuser::spawn_mount(fs, mountpoint, config)?,
            via_fusermount: None,
        });
    }
    let fd = fusermount::mount(
        mountpoint,
        &config.mount_options,
        config.acl != SessionACL::Owner,
    )?;
    let session = match fuser::Session::from_fd(fs, fd, config.acl, config.clone()) {
        Ok(s) => s.spawn(),
        Err(e) => Err(e),
    };
    match session {
        Ok(session) => Ok(Mounted {
            session,
            via_fusermount: Some(mountpoint.to_path_buf()),
        }),
        Err(e) => {
            // Mounted, but not served: take it down again.
            let _ = fusermount::unmount(mountpoint, true);
            Err(e)
        }
    }
}
