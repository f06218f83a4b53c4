//! Opening the backend a SOURCE names, for `mount` and `serve`, and connecting to a
//! server, for `mount` and `stat`.

use crate::secret::read_secret;
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
}

impl OpenedBackend {
    pub fn null() -> OpenedBackend {
        OpenedBackend {
            backend: Arc::new(zcfs_backend::null::NullFs::default()),
            volume: None,
        }
    }

    pub fn volume(image: &Path, cfg: VolumeConfig) -> Result<OpenedBackend> {
        let vol = Volume::open(image, cfg)
            .with_context(|| format!("opening the volume {}", image.display()))?;
        Ok(OpenedBackend {
            backend: Arc::new(zcfs_local::LocalFs::new(vol.clone())),
            volume: Some(vol),
        })
    }

    pub fn remote(cfg: ClientConfig) -> Result<OpenedBackend> {
        Ok(OpenedBackend {
            backend: Arc::new(connect(cfg)?),
            volume: None,
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
