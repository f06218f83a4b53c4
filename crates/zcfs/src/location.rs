//! What `cp`, `cat` and `ls` take as an operand: a local path, or a path on a server as
//! `HOST:PORT:/path` (`[::1]:7070:/path` for an IPv6 address), as scp writes
//! `host:path`.
//!
//! An operand with no colon before its first slash is local (`./a:b` and `/x/a:b` are
//! local files); one with such a colon must be a server path, or it is an error that
//! says how to name a local file with a colon.

use anyhow::{bail, Result};
use std::fmt;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Remote {
        /// `HOST:PORT` as the client dials it (`[::1]:7070` for IPv6).
        addr: String,
        /// Absolute: the server's root is `/`.
        path: String,
    },
}

impl Location {
    pub fn parse(s: &str) -> Result<Location> {
        let head = s.split('/').next().unwrap_or("");
        if s.is_empty() {
            bail!("an empty operand names no file");
        }
        if !head.contains(':') {
            return Ok(Location::Local(PathBuf::from(s)));
        }
        let hint = || {
            format!(
                "{s}: a server path is HOST:PORT:/path ([::1]:PORT:/path for IPv6); \
                 for a local file whose name has a colon, write ./{s}"
            )
        };
        // HOST: up to the colon before the port; a bracketed IPv6 address has its own.
        let (host, rest) = if let Some(v6) = s.strip_prefix('[') {
            let Some(end) = v6.find(']') else {
                bail!("{}: no `]` closes the IPv6 address", hint());
            };
            let Some(rest) = v6[end + 1..].strip_prefix(':') else {
                bail!("{}: no port after the IPv6 address", hint());
            };
            (&s[..end + 2], rest)
        } else {
            match s.split_once(':') {
                Some(x) => x,
                None => bail!("{}", hint()),
            }
        };
        let Some((port, path)) = rest.split_once(':') else {
            bail!("{}: no `:` after the port", hint());
        };
        if host.is_empty() || host == "[]" {
            bail!("{}: no host", hint());
        }
        match port.parse::<u16>() {
            Ok(p) if p != 0 => {}
            _ => bail!("{}: `{port}` is not a port (1-65535)", hint()),
        }
        if !path.starts_with('/') {
            bail!(
                "{}: the path on the server must be absolute (start with /)",
                hint()
            );
        }
        Ok(Location::Remote {
            addr: format!("{host}:{port}"),
            path: path.to_string(),
        })
    }
}

/// As the user wrote it (messages name operands this way).
impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(p) => write!(f, "{}", p.display()),
            Location::Remote { addr, path } => write!(f, "{addr}:{path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(addr: &str, path: &str) -> Location {
        Location::Remote {
            addr: addr.into(),
            path: path.into(),
        }
    }

    #[test]
    fn server_paths_with_names_ipv4_and_ipv6_hosts() {
        for (s, want) in [
            ("server:7070:/a/b", remote("server:7070", "/a/b")),
            ("10.0.0.5:7070:/", remote("10.0.0.5:7070", "/")),
            ("[::1]:7070:/p", remote("[::1]:7070", "/p")),
            ("[fe80::1%eth0]:1:/x", remote("[fe80::1%eth0]:1", "/x")),
            ("h:65535:/a:b", remote("h:65535", "/a:b")),
            ("h:1:/dir/", remote("h:1", "/dir/")),
        ] {
            assert_eq!(Location::parse(s).unwrap(), want, "{s}");
            assert_eq!(Location::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn no_colon_before_the_first_slash_is_local() {
        for s in ["file", "/abs/path", "./a:b", "/x/host:1:/y", "dir/a:b", "-"] {
            assert_eq!(
                Location::parse(s).unwrap(),
                Location::Local(s.into()),
                "{s}"
            );
        }
    }

    #[test]
    fn a_colon_that_is_no_server_path_is_refused_with_the_way_out() {
        for (s, why) in [
            ("host:/path", "port"),
            ("host:7070", "after the port"),
            ("host:port:/p", "not a port"),
            ("host:0:/p", "not a port"),
            ("host:65536:/p", "not a port"),
            (":7070:/p", "no host"),
            ("[]:7070:/p", "no host"),
            ("[::1:7070:/p", "`]`"),
            ("[::1]7070:/p", "no port"),
            ("host:7070:relative", "absolute"),
            ("host:7070:", "absolute"),
            ("a:b", "after the port"),
        ] {
            let e = Location::parse(s).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("./"), "{s}: {e}");
        }
        assert!(Location::parse("").is_err());
    }
}
