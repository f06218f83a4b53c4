//! What `mount`, `serve` and `stat` take as SOURCE: `null`, a volume image, or a
//! server's address as `zcfs serve` prints it (`unix:PATH`, `tcp:HOST:PORT`, or
//! HOST:PORT).

use anyhow::{anyhow, Error};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The null backend: no storage, to measure the FUSE or network path alone.
    Null,
    /// A volume image: a file (e.g. in /dev/shm) or a DAX device.
    Image(PathBuf),
    /// A `zcfs serve` at an address (`unix:PATH`, `[tcp:]HOST:PORT`; resolved when
    /// connecting).
    Remote(String),
}

impl FromStr for Source {
    type Err = Error;

    /// `null` first, then `unix:` and `tcp:` addresses, then an existing path (a path
    /// may contain a colon; a socket is a server's), then HOST:PORT.
    fn from_str(s: &str) -> Result<Source, Error> {
        use std::os::unix::fs::FileTypeExt;
        if s == "null" {
            return Ok(Source::Null);
        }
        if s.starts_with("unix:") || s.starts_with("tcp:") {
            s.parse::<zcfs_server::Address>()?;
            return Ok(Source::Remote(s.into()));
        }
        let not_a_path = match std::fs::metadata(s) {
            Ok(m) if m.file_type().is_socket() => return Ok(Source::Remote(format!("unix:{s}"))),
            Ok(_) => return Ok(Source::Image(s.into())),
            Err(e) => e,
        };
        let host_port = s
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if host_port {
            return Ok(Source::Remote(s.into()));
        }
        Err(anyhow!(
            "{s} is neither `null`, an existing volume image ({not_a_path}), nor a server address (unix:PATH, [tcp:]HOST:PORT)"
        ))
    }
}

/// As the user wrote it: the mount's fsname and the messages show it.
impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Null => f.write_str("null"),
            Source::Image(path) => write!(f, "{}", path.display()),
            Source::Remote(addr) => f.write_str(addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_then_existing_path_then_host_port() {
        assert_eq!("null".parse::<Source>().unwrap(), Source::Null);
        assert_eq!(
            "/dev/null".parse::<Source>().unwrap(),
            Source::Image("/dev/null".into())
        );
        for addr in [
            "127.0.0.1:7070",
            "server.example:7070",
            "[::1]:7070",
            "tcp:127.0.0.1:7070",
            "unix:/run/zcfs/vol.sock",
        ] {
            assert_eq!(addr.parse::<Source>().unwrap(), Source::Remote(addr.into()));
        }
        for bad in [
            "/nonexistent/vol.img",
            "server",
            ":7070",
            "host:port",
            "host:70000",
        ] {
            let e = bad.parse::<Source>().unwrap_err().to_string();
            assert!(
                e.contains("`null`") && e.contains("volume image") && e.contains("HOST:PORT"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn shows_as_written() {
        for s in ["null", "/dev/null", "10.0.0.5:7070", "unix:/x/y.sock"] {
            assert_eq!(s.parse::<Source>().unwrap().to_string(), s);
        }
    }
}
