//! Two network namespaces joined by a veth pair (198.18.N.0/24, the RFC 2544
//! benchmarking range), optionally shaped with tc tbf. Removed on drop.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::process::Command;

pub struct Net {
    pub srv: String,
    pub cli: String,
    pub srv_if: String,
    pub cli_if: String,
    pub srv_ip: String,
    pub cli_ip: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (apt-get install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Net {
    pub fn new(tag: &str, subnet: u8) -> Result<Net> {
        let n = Net {
            srv: format!("zbsrv{tag}"),
            cli: format!("zbcli{tag}"),
            srv_if: format!("zbs{tag}"),
            cli_if: format!("zbc{tag}"),
            srv_ip: format!("198.18.{subnet}.1"),
            cli_ip: format!("198.18.{subnet}.2"),
        };
        // Leftovers of an interrupted run.
        let _ = Command::new("ip").args(["netns", "del", &n.srv]).output();
        let _ = Command::new("ip").args(["netns", "del", &n.cli]).output();
        ip(&["netns", "add", &n.srv])?;
        ip(&["netns", "add", &n.cli])?;
        ip(&[
            "link", "add", &n.srv_if, "type", "veth", "peer", "name", &n.cli_if,
        ])?;
        ip(&["link", "set", &n.srv_if, "netns", &n.srv])?;
        ip(&["link", "set", &n.cli_if, "netns", &n.cli])?;
        ip(&[
            "-n",
            &n.srv,
            "addr",
            "add",
            &format!("{}/24", n.srv_ip),
            "dev",
            &n.srv_if,
        ])?;
        ip(&[
            "-n",
            &n.cli,
            "addr",
            "add",
            &format!("{}/24", n.cli_ip),
            "dev",
            &n.cli_if,
        ])?;
        for (ns, i) in [(&n.srv, &n.srv_if), (&n.cli, &n.cli_if)] {
            ip(&["-n", ns, "link", "set", i, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }

    /// Shape both directions to `rate` (e.g. "1gbit") with a token bucket.
    pub fn shape(&self, rate: &str) -> Result<()> {
        for (ns, i) in [(&self.srv, &self.srv_if), (&self.cli, &self.cli_if)] {
            let out = Command::new("ip")
                .args([
                    "netns", "exec", ns, "tc", "qdisc", "replace", "dev", i, "root", "tbf", "rate",
                    rate, "burst", "256kb", "latency", "50ms",
                ])
                .output()?;
            if !out.status.success() {
                bail!("tc tbf on {i}: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        Ok(())
    }

    /// Run `f` on a thread inside namespace `ns` (its sockets live there).
    pub fn within<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
        let path = format!("/var/run/netns/{ns}");
        let file = File::open(&path).with_context(|| format!("opening {path}"))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on this thread only, with a valid namespace fd.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!("setns {ns}: {}", std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("benchmark thread panicked"))?
        })
    }

    /// Spawn a thread living in namespace `ns` for good (servers).
    pub fn spawn_in(
        ns: &str,
        f: impl FnOnce() + Send + 'static,
    ) -> Result<std::thread::JoinHandle<()>> {
        let file = File::open(format!("/var/run/netns/{ns}"))?;
        Ok(std::thread::spawn(move || {
            // SAFETY: setns on this thread only, with a valid namespace fd.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
                f()
            }
        }))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.srv])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.cli])
            .output();
    }
}
