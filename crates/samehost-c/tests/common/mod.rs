//! A same-host service on a fresh /dev/shm volume image, run in this process (as
//! crates/samehost's tests do).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use zcfs_samehost::{Service, ServiceConfig};
use zcfs_types::identity::{IdentityMap, Squash};
use zcfs_volume::{MkfsOptions, Volume, VolumeConfig};

pub const IMAGE_SIZE: u64 = 64 << 20;

pub struct Served {
    pub vol: Arc<Volume>,
    pub svc: Arc<Service>,
    pub sock: PathBuf,
    image: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A service on a new image named after the test; root acts as root (trusted).
pub fn serve(name: &str) -> Served {
    let tag = format!("zcfs-shc-{}-{name}", std::process::id());
    let image = PathBuf::from(format!("/dev/shm/{tag}.img"));
    let sock = std::env::temp_dir().join(format!("{tag}.sock"));
    let _ = std::fs::remove_file(&image);
    Volume::mkfs(&image, IMAGE_SIZE, &MkfsOptions::default()).unwrap();
    let vol = Volume::open(&image, VolumeConfig::default()).unwrap();
    let mut cfg = ServiceConfig::new(&sock);
    cfg.identity = IdentityMap {
        squash: Squash::None,
        ..Default::default()
    };
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
    pub fn stop(&mut self) {
        self.svc.shutdown();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.image);
    }
}
