//! A volume image in /dev/shm mounted by a foreground `zcfs mount`, for the tests
//! that need a real FUSE mount.

use super::{assert_fsck_clean, mkfs, mounted, wait_until_mounted, zcfs};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn unique(name: &str) -> String {
    format!("zcfs-fuse-{name}-{}", std::process::id())
}

/// A volume image in /dev/shm and a foreground `zcfs mount` of it.
pub struct Mount {
    pub image: Option<PathBuf>,
    pub mp: PathBuf,
    pub child: Option<Child>,
}

impl Mount {
    pub fn volume(name: &str, size: &str, extra: &[&str]) -> Mount {
        Mount::volume_with(name, size, extra, &[])
    }

    /// A fresh volume (mkfs `extra` arguments) mounted with `mount_args`.
    pub fn volume_with(name: &str, size: &str, extra: &[&str], mount_args: &[&str]) -> Mount {
        assert!(
            Path::new("/dev/fuse").exists(),
            "these tests need /dev/fuse (run as root with the fuse module)"
        );
        let image = PathBuf::from(format!("/dev/shm/{}.img", unique(name)));
        mkfs(&image, size, extra);
        let mut m = Mount {
            image: Some(image.clone()),
            mp: PathBuf::new(),
            child: None,
        };
        m.start(image.to_str().unwrap(), mount_args);
        m
    }

    pub fn start(&mut self, source: &str, args: &[&str]) {
        self.mp = std::env::temp_dir().join(unique(&format!("mp{}", rand_suffix())));
        fs::create_dir_all(&self.mp).unwrap();
        let child = zcfs()
            .arg("mount")
            .arg(source)
            .arg(&self.mp)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until_mounted(self.child.insert(child), &self.mp);
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.mp.join(p)
    }

    /// SIGTERM and wait: the process unmounts and closes the volume cleanly.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "mount process exited with {st}");
                    break;
                }
                assert!(
                    t.elapsed() < Duration::from_secs(20),
                    "mount did not stop on SIGTERM"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(!mounted(&self.mp), "still mounted after SIGTERM");
            let _ = fs::remove_dir(&self.mp);
        }
    }

    /// Stop (clean unmount), then fsck.
    pub fn fsck_after_stop(mut self) {
        self.stop();
        self.fsck();
    }

    pub fn fsck(&self) {
        assert_fsck_clean(self.image.as_ref().unwrap(), "");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            let _ = Command::new("umount").arg("-l").arg(&self.mp).status();
        }
        let _ = fs::remove_dir(&self.mp);
        if let Some(i) = &self.image {
            let _ = fs::remove_file(i);
        }
    }
}

pub fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
