//! Stopping on a signal without touching anyone else's mount.
//!
//! Unmounting goes by path (umount2, fusermount3 -u): right only while the mount on top
//! of the mount point is still ours. After a lazy detach (`umount -l` with files open)
//! our FUSE connection lives on, detached, and the mount point may already hold the
//! next mount. Then the connection is ended through the FUSE control file system
//! (`/sys/fs/fuse/connections/DEV/abort`, writable by the mount's owner): the session
//! ends, and the files still open on the detached mount get ENOTCONN, as they would
//! when the process dies.

use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;

/// Where the FUSE control file system is mounted.
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// The connection number in the control file system of the mount whose device
/// (mountinfo field 3, "MAJOR:MINOR") is `dev`: FUSE mounts have major 0, and the
/// directory is named by the minor.
fn connection_of(dev: &str) -> Result<u32> {
    match dev.split_once(':') {
        Some(("0", minor)) => minor
            .parse()
            .map_err(|_| anyhow!("device {dev}: bad minor number")),
        _ => bail!("device {dev} is not a FUSE connection's (major 0)"),
    }
}

/// End the session of a detached mount: abort its connection (device `dev` as
/// mountinfo gave it at mount time) and wait for the session's threads. If that cannot
/// be done, the session is left running as the process exits (its threads hold the
/// backend: the caller syncs rather than closes it).
pub(super) fn end_connection(session: zcfs_fuse::Mounted, dev: Option<&str>) {
    match dev.map(abort_connection) {
        Some(Ok(())) => {
            if let Err(e) = session.join() {
                tracing::warn!("session ended: {e}");
            }
        }
        r => {
            let why = match r {
                Some(Err(e)) => format!("{e:#}"),
                _ => "its device is unknown".into(),
            };
            tracing::warn!(
                "cannot end the detached mount's connection ({why}): exiting with it open"
            );
            // Nothing in it unmounts by path; it just must not be waited for.
            std::mem::forget(session);
        }
    }
}

/// End our FUSE connection (device `dev` as mountinfo gave it at mount time). Mounts the
/// control file system first if nobody has (only root may).
fn abort_connection(dev: &str) -> Result<()> {
    let n = connection_of(dev)?;
    let abort = Path::new(FUSECTL).join(n.to_string()).join("abort");
    if !Path::new(FUSECTL).join(n.to_string()).exists() {
        mount_fusectl()?;
    }
    std::fs::write(&abort, b"1").with_context(|| format!("writing {}", abort.display()))
}

fn mount_fusectl() -> Result<()> {
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (src, target, fstype) = (c("fusectl"), c(FUSECTL), c("fusectl"));
    // SAFETY: mount(2) with valid C strings and no data.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        // Mounted meanwhile (or before us, somewhere we did not look) is fine.
        if e.raw_os_error() != Some(libc::EBUSY) {
            bail!("mounting the FUSE control file system on {FUSECTL}: {e}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_is_the_minor_of_a_major_0_device() {
        assert_eq!(connection_of("0:57").unwrap(), 57);
        assert!(connection_of("8:1").is_err());
        assert!(connection_of("0:x").is_err());
        assert!(connection_of("57").is_err());
    }
}
