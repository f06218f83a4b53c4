//! Opening the backend a SOURCE names, for `mount` and `serve`, and connecting to a
//! server, for `mount` and `stat`.

use crate::secret::read_secret;
use crate::source::Source;
use anyhow::{anyhow, Context, Result};
use std::path::Path;
use std::sync::Arc;
use zcfs_backend::Backend;
use zcfs_client::{ClientConfig, RemoteFs};
use zcfs_volume::{Volume, VolumeConfig};

/// A backend, and the local volume behind it if there is one: its owner syncs and
/// closes it after the last request.
pub struct OpenedBackend {
    pub backend: Arc<dyn Backend>,
    pub volume: Option<Arc<Volume>>,
    /// The client of a remote backend (its layer-2 lane and per-path counters).
    pub client: Option<Arc<zcfs_client::Client>>,
}

/// How long opening a volume waits for another process to let go of it.
pub const HOLDER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// How often it looks again meanwhile.
const HOLDER_POLL: std::time::Duration = std::time::Duration::from_millis(50);

impl OpenedBackend {
    /// Open what `source` names: the null backend as is, a volume image with the
    /// configuration `volume` gives, a server address as `remote` does.
    pub fn open(
        source: &Source,
        volume: impl FnOnce() -> Result<VolumeConfig>,
        remote: impl FnOnce(&str) -> Result<OpenedBackend>,
    ) -> Result<OpenedBackend> {
        match source {
            Source::Null => Ok(OpenedBackend::null()),
            Source::Image(image) => OpenedBackend::volume(image, volume()?),
            Source::Remote(addr) => remote(addr),
        }
    }

    pub fn null() -> OpenedBackend {
        OpenedBackend {
            backend: Arc::new(zcfs_backend::null::NullFs::default()),
            volume: None,
            client: None,
        }
    }

    /// Open the volume at `image`. If another process holds it, wait up to
    /// `HOLDER_WAIT` for it to let go: a mount that was just unmounted closes its volume
    /// a moment later, and a remount at once (scripts, systemd restarts) must not fail
    /// for that. Still held after the wait: the error names the holder.
    pub fn volume(image: &Path, cfg: VolumeConfig) -> Result<OpenedBackend> {
        let start = std::time::Instant::now();
        let vol = loop {
            match Volume::open(image, cfg.clone()) {
                Err(zcfs_volume::FsError::Busy(_)) if start.elapsed() < HOLDER_WAIT => {
                    std::thread::sleep(HOLDER_POLL);
                }
                r => break r.with_context(|| format!("opening the volume {}", image.display()))?,
            }
        };
        // Only where populating costs page tables alone (the volume checks: a DAX
        // device, or an allocated tmpfs image as mkfs makes it).
        vol.prefault_in_background();
        Ok(OpenedBackend {
            backend: Arc::new(zcfs_local::LocalFs::new(vol.clone())),
            volume: Some(vol),
            client: None,
        })
    }

    pub fn remote(cfg: ClientConfig) -> Result<OpenedBackend> {
        let fs = connect(cfg)?;
        let client = fs.client().clone();
        Ok(OpenedBackend {
            backend: Arc::new(fs),
            volume: None,
            client: Some(client),
        })
    }
}

/// The client configuration for the server at `addr`, with the secret from `secret_file`.
pub fn client_config(addr: &str, secret_file: Option<&Path>) -> Result<ClientConfig> {
    let mut cfg = ClientConfig::new(addr);
    cfg.secret = secret_file.map(read_secret).transpose()?;
    Ok(cfg)
}

pub fn connect(cfg: ClientConfig) -> Result<RemoteFs> {
    RemoteFs::connect(cfg).map_err(|e| anyhow!("{e}"))
}
