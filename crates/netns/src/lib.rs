//! Network namespaces for zcfs's tests and benchmarks (root required).
//!
//! - [`Pair`]: two namespaces, a server side and a client side, joined by a veth pair with
//!   an address on each end (198.18.N.1 and 198.18.N.2, in the RFC 2544 benchmarking
//!   range); the client end can be taken down and up, both ends shaped with `tc tbf`.
//!   [`Pair::add_link`] joins them by a further veth pair without addresses (a layer-2
//!   lane on an interface of its own: [`LANE_SRV_IF`], [`LANE_CLI_IF`]).
//! - [`Netns`]: one namespace with its loopback up. Code runs inside it on a thread of its
//!   own ([`Netns::run`], [`Netns::spawn`]: the sockets that thread opens live there); a
//!   program runs inside it through [`Netns::command`], which moves the child into the
//!   network namespace only (as `nsenter --net` does), so a FUSE mount it makes is
//!   visible to every process on the host.
//! - Teardown: on drop, by name ([`teardown`]: the processes still inside are stopped,
//!   then the name is deleted), and after a crash ([`sweep`]): names made with
//!   [`owned_name`] carry their owner's pid, and a namespace whose owner is gone is
//!   removed by the next [`Pair::create`] or [`Netns::create`] (or `zcfs-bench netns sweep`).
//!
//! The veth ends are created directly inside their namespaces, so nothing is ever left in
//! the host's namespace and the interface names only need to be unique within one
//! namespace.

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where `ip netns` keeps its named namespaces.
pub const RUN_DIR: &str = "/var/run/netns";
/// The server end of a [`Pair`]'s veth, inside the server namespace.
pub const SRV_IF: &str = "veth-srv";
/// The client end of a [`Pair`]'s veth, inside the client namespace.
pub const CLI_IF: &str = "veth-cli";
/// The server end of the second veth pair [`Pair::add_lane_link`] makes.
pub const LANE_SRV_IF: &str = "veth-lane-srv";
/// The client end of the second veth pair [`Pair::add_lane_link`] makes.
pub const LANE_CLI_IF: &str = "veth-lane-cli";
/// Queues of each end of [`Pair::add_lane_link`]'s pair: zcfs's layer-2 lane sends
/// commands on queue 0 and data on queue 1.
pub const LANE_QUEUES: u32 = 2;
/// The most queues [`Pair::create_with_queues`] gives a veth end.
pub const MAX_VETH_QUEUES: u32 = 16;
/// The prefix of names that carry their owner's pid.
const OWNED_PREFIX: &str = "zcfs-";

/// A namespace name that carries the pid of the process responsible for it
/// (`zcfs-<owner>-<label>`), so [`sweep`] can remove it once that process is gone.
pub fn owned_name(owner: u32, label: &str) -> String {
    format!("{OWNED_PREFIX}{owner}-{label}")
}

/// The owner pid in a name made by [`owned_name`].
fn owner_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(OWNED_PREFIX)?;
    let (pid, label) = rest.split_once('-')?;
    if label.is_empty() {
        return None;
    }
    pid.parse().ok()
}

fn path_of(name: &str) -> PathBuf {
    PathBuf::from(RUN_DIR).join(name)
}

fn context(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Run `ip ARGS`; an error carries ip's own message.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| context(e, "running ip (apt-get install iproute2)"))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// One named network namespace (`/var/run/netns/NAME`), held open. Removed with
/// [`teardown`] on drop if this value created it (and [`Netns::keep`] was not called).
pub struct Netns {
    name: String,
    file: Arc<File>,
    owned: bool,
}

impl Netns {
    /// Create namespace `name` with its loopback up, replacing a leftover of that name and
    /// sweeping the namespaces of owners that are gone.
    pub fn create(name: &str) -> io::Result<Netns> {
        sweep();
        teardown(name)?;
        ip(&["netns", "add", name])?;
        // From here on the namespace exists: a failure below removes it again on drop.
        let ns = Netns {
            name: name.to_string(),
            file: Arc::new(open(name)?),
            owned: true,
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// An existing namespace (not removed on drop).
    pub fn open(name: &str) -> io::Result<Netns> {
        Ok(Netns {
            name: name.to_string(),
            file: Arc::new(open(name)?),
            owned: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/var/run/netns/NAME`, what `nsenter --net=` takes.
    pub fn path(&self) -> PathBuf {
        path_of(&self.name)
    }

    /// Leave the namespace in place when this value is dropped; returns its name.
    pub fn keep(mut self) -> String {
        self.owned = false;
        std::mem::take(&mut self.name)
    }

    /// `ip -n NAME ARGS`.
    pub fn ip(&self, args: &[&str]) -> io::Result<()> {
        let mut a = vec!["-n", &self.name];
        a.extend_from_slice(args);
        ip(&a)
    }

    /// Move the calling thread into this namespace: the sockets it opens from now on live
    /// there. Other threads of the process are not affected.
    pub fn enter(&self) -> io::Result<()> {
        enter(&self.file, &self.name)
    }

    /// Run `f` on a new thread inside this namespace and return what it returns. A panic
    /// in `f` is passed on to the caller.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> io::Result<T> {
        std::thread::scope(|s| {
            let h = s.spawn(|| {
                self.enter()?;
                Ok(f())
            });
            match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Start a thread that lives inside this namespace for good (a server's accept loop).
    /// Returns once the thread is inside.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> io::Result<JoinHandle<T>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let (file, name) = (self.file.clone(), self.name.clone());
        let h = std::thread::spawn(move || {
            if let Err(e) = enter(&file, &name) {
                tx.send(Err(e)).ok();
                // Ends the thread without running `f` (and without a panic message).
                std::panic::resume_unwind(Box::new(()));
            }
            tx.send(Ok(())).ok();
            f()
        });
        match rx.recv() {
            Ok(Ok(())) => Ok(h),
            Ok(Err(e)) => {
                let _ = h.join();
                Err(e)
            }
            Err(_) => Err(io::Error::other("namespace thread ended before entering")),
        }
    }

    /// A command whose process enters this network namespace before it executes `program`
    /// (as `nsenter --net=PATH program` does, without an intermediate process: the child
    /// is `program` itself). It keeps the mount namespace, so a mount it makes is visible
    /// outside.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new(program);
        let file = self.file.clone();
        // SAFETY: the closure runs in the child between fork and exec and only makes the
        // setns system call (async-signal-safe) on a descriptor the Arc keeps open.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.owned {
            let _ = teardown(&self.name);
        }
    }
}

fn enter(ns: &File, name: &str) -> io::Result<()> {
    // SAFETY: setns on the calling thread only, with a valid namespace fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(context(
            io::Error::last_os_error(),
            format_args!("setns {name}"),
        ));
    }
    Ok(())
}

fn open(name: &str) -> io::Result<File> {
    let path = path_of(name);
    File::open(&path).map_err(|e| context(e, format_args!("opening {}", path.display())))
}

/// The processes whose network namespace is `name` (what `ip netns pids` lists), other
/// than this one.
pub fn pids_in(name: &str) -> Vec<u32> {
    let Ok(ns) = std::fs::metadata(path_of(name)) else {
        return Vec::new();
    };
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .is_ok_and(|m| (m.dev(), m.ino()) == (ns.dev(), ns.ino()))
        })
        .collect()
}

/// Remove namespace `name` if it exists: the processes still inside get SIGTERM, those
/// left after two seconds SIGKILL, then the name is deleted (the namespace and its veth
/// end go away once nothing holds them). Nothing to do is not an error.
pub fn teardown(name: &str) -> io::Result<()> {
    if !path_of(name).exists() {
        return Ok(());
    }
    let signal = |pids: &[u32], sig| {
        for &p in pids {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(p as i32, sig) };
        }
    };
    let mut left = pids_in(name);
    signal(&left, libc::SIGTERM);
    let t = Instant::now();
    while !left.is_empty() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
        left = pids_in(name);
    }
    signal(&left, libc::SIGKILL);
    ip(&["netns", "del", name])
}

/// Remove every namespace named by [`owned_name`] whose owner process no longer exists
/// (left behind by a crash or a SIGKILL). Returns the names removed.
pub fn sweep() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(RUN_DIR) else {
        return Vec::new();
    };
    let mut gone = Vec::new();
    for e in dir.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let Some(owner) = owner_of(&name) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{owner}")).exists() && teardown(&name).is_ok() {
            gone.push(name);
        }
    }
    gone
}

/// Two namespaces joined by a veth pair: `srv` holds [`SRV_IF`] with `srv_ip`, `cli`
/// holds [`CLI_IF`] with `cli_ip` (a /24), both ends and both loopbacks up. Both
/// namespaces are removed on drop unless [`Pair::keep`] is called.
pub struct Pair {
    pub srv: Netns,
    pub cli: Netns,
    pub srv_ip: Ipv4Addr,
    pub cli_ip: Ipv4Addr,
}

impl Pair {
    /// Namespaces `BASE-srv` and `BASE-cli` (make BASE with [`owned_name`] so a crash
    /// leaves nothing behind for long), addresses 198.18.SUBNET.1 and .2. Each pair is
    /// isolated from every other, so pairs may share a subnet.
    pub fn create(base: &str, subnet: u8) -> io::Result<Pair> {
        Pair::create_with_queues(base, subnet, 1)
    }

    /// As [`Pair::create`], with `queues` RX and TX queues on each veth end (veth hands a
    /// frame sent on TX queue q to the peer's RX queue q: the layer-2 transport keeps
    /// commands and data apart that way). At most [`MAX_VETH_QUEUES`].
    pub fn create_with_queues(base: &str, subnet: u8, queues: u32) -> io::Result<Pair> {
        check_queues(queues)?;
        let srv = Netns::create(&format!("{base}-srv"))?;
        let cli = Netns::create(&format!("{base}-cli"))?;
        veth(&srv, SRV_IF, &cli, CLI_IF, queues)?;
        let pair = Pair {
            srv,
            cli,
            srv_ip: Ipv4Addr::new(198, 18, subnet, 1),
            cli_ip: Ipv4Addr::new(198, 18, subnet, 2),
        };
        for (ns, dev, addr) in [
            (&pair.srv, SRV_IF, pair.srv_ip),
            (&pair.cli, CLI_IF, pair.cli_ip),
        ] {
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ns.ip(&["link", "set", dev, "up"])?;
        }
        Ok(pair)
    }

    /// Join the two namespaces by one more veth pair, `srv_if` in the server namespace
    /// and `cli_if` in the client's, `queues` queues on each end, both ends up and
    /// without addresses: a link for raw Ethernet frames only (TCP keeps to the first
    /// pair, the only one with an IP route). Removed with the namespaces.
    pub fn add_link(&self, srv_if: &str, cli_if: &str, queues: u32) -> io::Result<()> {
        check_queues(queues)?;
        veth(&self.srv, srv_if, &self.cli, cli_if, queues)?;
        for (ns, dev) in [(&self.srv, srv_if), (&self.cli, cli_if)] {
            ns.ip(&["link", "set", dev, "up"])?;
        }
        Ok(())
    }

    /// [`Pair::add_link`] of the layer-2 lane's own pair: [`LANE_SRV_IF`] and
    /// [`LANE_CLI_IF`], [`LANE_QUEUES`] queues each.
    pub fn add_lane_link(&self) -> io::Result<()> {
        self.add_link(LANE_SRV_IF, LANE_CLI_IF, LANE_QUEUES)
    }

    /// Take the client end of the link down (a cut cable) or bring it back up.
    pub fn link(&self, up: bool) -> io::Result<()> {
        self.cli
            .ip(&["link", "set", CLI_IF, if up { "up" } else { "down" }])
    }

    /// Shape both directions to `rate` (e.g. "1gbit") with a token bucket.
    pub fn shape(&self, rate: &str) -> io::Result<()> {
        for (ns, dev) in [(&self.srv, SRV_IF), (&self.cli, CLI_IF)] {
            let out = ns
                .command("tc")
                .args(["qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate])
                .args(["burst", "256kb", "latency", "50ms"])
                .output()
                .map_err(|e| context(e, "running tc (apt-get install iproute2)"))?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "tc tbf on {dev} in {}: {}",
                    ns.name(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        Ok(())
    }

    /// Leave both namespaces in place when this value is dropped (for [`teardown`] by
    /// name later); returns the server and client namespace names.
    pub fn keep(self) -> (String, String) {
        (self.srv.keep(), self.cli.keep())
    }
}

fn check_queues(queues: u32) -> io::Result<()> {
    if queues == 0 || queues > MAX_VETH_QUEUES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a veth pair takes 1 to {MAX_VETH_QUEUES} queues, not {queues}"),
        ));
    }
    Ok(())
}

/// A veth pair, `a_if` created in `a` and `b_if` in `b`, `queues` queues on each end.
fn veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str, queues: u32) -> io::Result<()> {
    let q = queues.to_string();
    let mut args = vec!["link", "add", a_if, "netns", a.name()];
    let multi = ["numtxqueues", &q, "numrxqueues", &q];
    if queues > 1 {
        args.extend_from_slice(&multi);
    }
    args.extend_from_slice(&["type", "veth", "peer", "name", b_if, "netns", b.name()]);
    if queues > 1 {
        args.extend_from_slice(&multi);
    }
    ip(&args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_is_read_back_from_an_owned_name() {
        assert_eq!(owner_of(&owned_name(4242, "t1-srv")), Some(4242));
        assert_eq!(owner_of("zcfs-4242-"), None);
        assert_eq!(owner_of("zcfs-x-srv"), None);
        assert_eq!(owner_of("zsrv1234"), None);
    }

    /// Root only: skipped (passes) for other users.
    #[test]
    fn a_pair_carries_tcp_and_is_gone_after_drop() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let base = owned_name(std::process::id(), "selftest");
        let pair = Pair::create(&base, 250).unwrap();
        let addr = std::net::SocketAddr::from((pair.srv_ip, 7999));
        // The client connects only once the server listens (else: refused, at random).
        let (listening, ready) = std::sync::mpsc::channel();
        let server = pair
            .srv
            .spawn(move || {
                let l = std::net::TcpListener::bind(addr).unwrap();
                listening.send(()).unwrap();
                let (mut s, _) = l.accept().unwrap();
                io::Write::write_all(&mut s, b"hi").unwrap();
            })
            .unwrap();
        ready.recv().unwrap();
        let got = pair
            .cli
            .run(|| {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                let mut b = String::new();
                io::Read::read_to_string(&mut s, &mut b).unwrap();
                b
            })
            .unwrap();
        assert_eq!(got, "hi");
        server.join().unwrap();
        let out = pair
            .cli
            .command("ip")
            .args(["-o", "addr"])
            .output()
            .unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("198.18.250.2/24"));
        pair.link(false).unwrap();
        pair.link(true).unwrap();
        drop(pair);
        assert!(!path_of(&format!("{base}-srv")).exists());
        assert!(!path_of(&format!("{base}-cli")).exists());
    }

    /// Root only: a second link between the namespaces of a pair is up, has the queues
    /// asked for and no IPv4 address, and the route to the server stays on the first
    /// pair's ends.
    #[test]
    fn a_lane_link_joins_the_pair_without_addresses() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let base = owned_name(std::process::id(), "lanelink");
        let pair = Pair::create(&base, 249).unwrap();
        pair.add_lane_link().unwrap();
        let out = |ns: &Netns, args: &[&str]| {
            let o = ns.command("ip").args(args).output().unwrap();
            assert!(o.status.success(), "ip {args:?}");
            String::from_utf8(o.stdout).unwrap()
        };
        for (ns, dev) in [(&pair.srv, LANE_SRV_IF), (&pair.cli, LANE_CLI_IF)] {
            let link = out(ns, &["-d", "link", "show", dev]);
            assert!(link.contains(",UP,"), "{dev} is up: {link}");
            assert!(
                link.contains(&format!(
                    "numtxqueues {LANE_QUEUES} numrxqueues {LANE_QUEUES}"
                )),
                "{dev}'s queues: {link}"
            );
            assert_eq!(out(ns, &["-4", "-o", "addr", "show", "dev", dev]), "");
        }
        let route = out(&pair.cli, &["route", "get", &pair.srv_ip.to_string()]);
        assert!(route.contains(&format!("dev {CLI_IF} ")), "{route}");
        assert!(
            pair.add_link("x-srv", "x-cli", 0).is_err(),
            "a veth end takes at least one queue"
        );
        drop(pair);
        assert!(!path_of(&format!("{base}-srv")).exists());
    }

    /// Root only: a namespace whose owner died is removed by the next sweep, with the
    /// process left inside it; a living owner's is not touched.
    #[test]
    fn sweep_removes_what_a_dead_owner_left() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let mut gone = Command::new("true").spawn().unwrap();
        let dead = gone.id();
        gone.wait().unwrap();
        let alive = owned_name(std::process::id(), "alive");
        let kept = Netns::create(&alive).unwrap();
        let orphan = Netns::create(&owned_name(dead, "orphan")).unwrap().keep();
        let mut inside = Netns::open(&orphan)
            .unwrap()
            .command("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        // spawn returns after the exec, so the child is inside by now. Another test's
        // create (or another process's) may be sweeping it at the same time: this sweep's
        // teardown then finds it half gone and leaves it to that one, so the removal is
        // waited for (bounded).
        sweep();
        let removed_by = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while path_of(&orphan).exists() && std::time::Instant::now() < removed_by {
            std::thread::sleep(std::time::Duration::from_millis(20));
            sweep();
        }
        assert!(!path_of(&orphan).exists());
        assert!(
            !inside.wait().unwrap().success(),
            "the process inside was stopped"
        );
        assert!(path_of(&alive).exists());
        drop(kept);
        assert!(!path_of(&alive).exists());
    }
}
