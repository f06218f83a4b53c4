//! What the remote tests share: two network namespaces joined by a veth pair (through
//! zcfs-netns), a `zcfs serve` in the server namespace, clients and FUSE mounts in the
//! client namespace, and small helpers. Root required, as in CI.

use super::{
    assert_fsck_clean, mkfs, mounted, sh, spawn_serving, wait_until_mounted, zcfs, zcfs_bin,
};
use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, Ctx};
use zcfs_client::{ClientConfig, RemoteFs};
use zcfs_netns::{owned_name, Pair, CLI_IF, SRV_IF};

/// The secret every test server is started with and every test client sends.
pub const SECRET: &[u8] = b"a-test-secret-of-enough-length";

static NEXT: AtomicU32 = AtomicU32::new(1);

/// Two namespaces, server (198.18.100.1) and client (198.18.100.2), joined by a veth
/// pair; removed on drop (and, after a crash, by the next test run's sweep: the names
/// carry this process's pid).
pub struct Net {
    pair: Pair,
}

impl Net {
    pub fn new() -> Net {
        Net::with_queues(1)
    }

    /// With `queues` queues on each end (the layer-2 lane needs 2: commands and data).
    pub fn with_queues(queues: u32) -> Net {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let base = owned_name(std::process::id(), &format!("t{n}"));
        Net {
            pair: Pair::create_with_queues(&base, 100, queues).unwrap(),
        }
    }

    /// `with_queues(queues)`, and a second veth pair between the namespaces for the
    /// layer-2 lane alone: [`LANE_SRV_IF`] and [`LANE_CLI_IF`], two queues each, no
    /// addresses (TCP keeps to the first pair).
    pub fn with_lane_pair(queues: u32) -> Net {
        let net = Net::with_queues(queues);
        net.pair.add_lane_link().unwrap();
        net
    }

    /// `ip ARGS` in the server namespace (`srv`) or the client's; its output (it must
    /// succeed).
    pub fn ip(&self, srv: bool, args: &[&str]) -> String {
        let ns = if srv { &self.pair.srv } else { &self.pair.cli };
        let out = ns.command("ip").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "ip {args:?} in {}: {}",
            ns.name(),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `ip -d link show DEV` in the server namespace (`srv`) or the client's.
    pub fn link_show(&self, srv: bool, dev: &str) -> String {
        self.ip(srv, &["-d", "link", "show", dev])
    }

    /// The address `zcfs serve` listens on in the server namespace.
    pub fn addr(&self) -> String {
        format!("{}:7070", self.pair.srv_ip)
    }

    /// Take the client's end of the link down (a cut cable) or up again.
    pub fn link(&self, up: bool) {
        self.pair.link(up).unwrap();
    }

    /// Shape both directions of the link to `rate` (e.g. "20mbit"): sends then take
    /// time, as on a slow network.
    pub fn shape(&self, rate: &str) {
        self.pair.shape(rate).unwrap();
    }

    /// Run `f` on a thread inside the client namespace (sockets it opens live there).
    pub fn in_cli<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.pair.cli.run(f).unwrap()
    }

    /// A program started inside the server namespace (the child is the program itself).
    pub fn srv_command(&self, program: impl AsRef<OsStr>) -> Command {
        self.pair.srv.command(program)
    }

    /// A program started inside the client namespace. It enters the network namespace
    /// only (as `nsenter --net` does), so a mount it makes is visible here.
    pub fn cli_command(&self, program: impl AsRef<OsStr>) -> Command {
        self.pair.cli.command(program)
    }
}

/// A volume image and a `zcfs serve` of it in the server namespace.
pub struct Served {
    pub image: PathBuf,
    child: Option<Child>,
    pub secret: PathBuf,
}

impl Served {
    pub fn new(net: &Net, name: &str, extra: &[&str]) -> Served {
        Served::sized(net, name, "1G", extra)
    }

    /// `new` with a volume of `size` (mkfs's --size).
    pub fn sized(net: &Net, name: &str, size: &str, extra: &[&str]) -> Served {
        let image = PathBuf::from(format!(
            "/dev/shm/zcfs-remote-{name}-{}.img",
            std::process::id()
        ));
        mkfs(&image, size, &["--root-owner", "1000:1000"]);
        let secret = image.with_extension("secret");
        fs::write(&secret, [SECRET, b"\n"].concat()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
        let mut s = Served {
            image,
            child: None,
            secret,
        };
        s.start(net, extra);
        s
    }

    /// Start (or restart) the server; returns once it is serving.
    pub fn start(&mut self, net: &Net, extra: &[&str]) {
        let (child, line) = spawn_serving(
            net.srv_command(zcfs_bin())
                .arg("serve")
                .arg(&self.image)
                .args(["--listen", &net.addr(), "--secret-file"])
                .arg(&self.secret)
                // The tests act as root on the client; "--root-squash" (not an option
                // of the server) asks for its default, root squash, and "--squash-all"
                // excludes this.
                .args(
                    (!extra
                        .iter()
                        .any(|a| *a == "--root-squash" || *a == "--squash-all"))
                    .then_some("--no-root-squash"),
                )
                .args(extra.iter().filter(|a| **a != "--root-squash"))
                .stderr(Stdio::piped()),
        );
        assert!(line.starts_with("serving"), "server did not start: {line}");
        self.child = Some(child);
    }

    /// Signal the server, wait for it, and return what it wrote on stderr.
    pub fn kill(&mut self, sig: i32) -> String {
        let mut c = self.child.take().unwrap();
        // SAFETY: signalling our own child (zcfs itself: it enters the namespace, then
        // execs).
        unsafe { libc::kill(c.id() as i32, sig) };
        c.wait().unwrap();
        let mut err = String::new();
        c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        err
    }

    /// Send `sig` to the server without waiting for it (SIGSTOP, SIGCONT).
    pub fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, sig) };
    }

    pub fn client(&self, net: &Net, timeout: Duration) -> RemoteFs {
        client(net, timeout)
    }

    /// fsck of the image must find it clean (stop the server first).
    pub fn fsck(&self) {
        assert_fsck_clean(&self.image, "");
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::remove_file(&self.image);
        let _ = fs::remove_file(&self.secret);
    }
}

/// A client with the test secret (call from inside the client namespace).
pub fn client(net: &Net, timeout: Duration) -> RemoteFs {
    let mut cfg = ClientConfig::new(&net.addr());
    cfg.secret = Some(SECRET.to_vec());
    cfg.timeout = timeout;
    RemoteFs::connect(cfg).unwrap()
}

/// The caller of the test's requests: uid and gid 1000.
pub fn ctx() -> Ctx {
    Ctx::user(1000, 1000)
}

/// Read `len` bytes at `off` into one buffer.
pub fn read_all(fs: &dyn Backend, ino: u64, fh: u64, off: u64, len: u32) -> Vec<u8> {
    let mut out = Vec::new();
    fs.read(ino, fh, off, len, &mut |s: &[&[u8]]| {
        for x in s {
            out.extend_from_slice(x);
        }
        Ok(())
    })
    .unwrap();
    out
}

/// `zcfs mount` of the server, run inside the client namespace (it enters the network
/// namespace only, so the mount is visible here). Killed and detached on drop.
pub struct RemoteMount {
    pub mp: PathBuf,
    child: Option<Child>,
}

impl RemoteMount {
    pub fn new(net: &Net, srv: &Served, tag: &str, opts: &[&str]) -> RemoteMount {
        RemoteMount::logged(net, srv, tag, opts, Stdio::null())
    }

    /// `new`, the mount process's stderr (its log) going to `stderr`.
    pub fn logged(
        net: &Net,
        srv: &Served,
        tag: &str,
        opts: &[&str],
        stderr: impl Into<Stdio>,
    ) -> RemoteMount {
        let mp = std::env::temp_dir().join(format!("zcfs-remote-{tag}-{}", std::process::id()));
        fs::create_dir_all(&mp).unwrap();
        let mut child = net
            .cli_command(zcfs_bin())
            .arg("mount")
            .arg(net.addr())
            .arg(&mp)
            .arg("--secret-file")
            .arg(&srv.secret)
            .args(opts)
            .stderr(stderr)
            .spawn()
            .unwrap();
        wait_until_mounted(&mut child, &mp);
        RemoteMount {
            mp,
            child: Some(child),
        }
    }

    /// A path inside the mount.
    pub fn path(&self, p: &str) -> String {
        format!("{}/{p}", self.mp.display())
    }

    /// Send the mount process `sig` and wait until it exited (the mount may stay).
    pub fn stop(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, sig) };
            c.wait().unwrap();
        }
    }

    /// The mount process's pid, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Whether the mount process exited within `within`.
    pub fn exits_within(&mut self, within: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < within {
            let Some(c) = self.child.as_mut() else {
                return true;
            };
            if c.try_wait().unwrap().is_some() {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Kill the mount process with `sig` and detach the mount.
    pub fn kill(&mut self, sig: i32) {
        self.stop(sig);
        if mounted(&self.mp) {
            let _ = zcfs().arg("umount").arg("--lazy").arg(&self.mp).output();
        }
    }
}

impl Drop for RemoteMount {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
        let _ = fs::remove_dir(&self.mp);
    }
}

/// `stat` through a mount: link count, size, mtime seconds.
pub fn stat_via(path: &str) -> (u32, u64, i64) {
    let out = sh(&format!("stat -c '%h %s %Y' {path}"));
    let v: Vec<&str> = out.split_whitespace().collect();
    (
        v[0].parse().unwrap(),
        v[1].parse().unwrap(),
        v[2].parse().unwrap(),
    )
}

/// The unmodified programs of the remote mount tests on the mount at `mp`: cp, tar,
/// rsync, grep, git (clone and fsck) and sqlite3, each result checked. `tag` keeps the
/// scratch repository of concurrent callers apart.
pub fn unmodified_programs(mp: &std::path::Path, tag: &str) {
    let d = mp.to_str().unwrap().to_owned();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/../protocol");
    sh(&format!("cp -a {src} {d}/copy && diff -r {src} {d}/copy"));
    sh(&format!("tar -C {d} -cf {d}/t.tar copy && mkdir {d}/x && tar -C {d}/x -xf {d}/t.tar && diff -r {src} {d}/x/copy"));
    sh(&format!("rsync -a {src}/ {d}/r/ && diff -r {src} {d}/r"));
    assert!(
        sh(&format!("grep -rl 'pub enum Op' {d}/copy | wc -l"))
            .trim()
            .parse::<u32>()
            .unwrap()
            >= 1
    );
    let repo = std::env::temp_dir().join(format!("zcfs-remote-repo-{tag}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&repo);
    sh(&format!("git init -q {r} && cd {r} && echo a > a && git add a && git -c user.name=t -c user.email=t@e commit -qm a", r = repo.display()));
    sh(&format!(
        "git clone -q {} {d}/clone && git -C {d}/clone fsck --full",
        repo.display()
    ));
    fs::remove_dir_all(&repo).unwrap();
    let out = sh(&format!("sqlite3 {d}/db 'create table t(x); insert into t values(1),(2),(3); select sum(x) from t; pragma integrity_check;'"));
    assert_eq!(out.trim(), "6\nok");
}

/// The layer-2 lane's interfaces: the server's and the client's end of the veth pair.
pub const L2_SRV_IF: &str = SRV_IF;
pub const L2_CLI_IF: &str = CLI_IF;
/// The ends of the second veth pair of [`Net::with_lane_pair`] (the lane's own).
pub const LANE_SRV_IF: &str = zcfs_netns::LANE_SRV_IF;
pub const LANE_CLI_IF: &str = zcfs_netns::LANE_CLI_IF;

/// Whether the layer-2 tests can run here (root, zcfs built with its XDP program);
/// ZCFS_REQUIRE_L2=1 makes "no" a failure.
pub fn l2_ready() -> bool {
    let require = std::env::var("ZCFS_REQUIRE_L2").is_ok_and(|v| v == "1");
    // SAFETY: geteuid has no preconditions.
    let ok = unsafe { libc::geteuid() } == 0 && zcfs_xsk::xdp_object_available();
    assert!(
        ok || !require,
        "ZCFS_REQUIRE_L2=1 but not root or no XDP program"
    );
    if !ok {
        eprintln!("skipped: needs root and zcfs's XDP program");
    }
    ok
}

/// A client with the test secret offering the layer-2 lane on the client's veth end
/// (call from inside the client namespace).
pub fn client_l2(net: &Net, timeout: Duration) -> RemoteFs {
    client_l2_on(net, L2_CLI_IF, timeout)
}

/// A client with the test secret offering the layer-2 lane on `iface` (call from
/// inside the client namespace).
pub fn client_l2_on(net: &Net, iface: &str, timeout: Duration) -> RemoteFs {
    let mut cfg = ClientConfig::new(&net.addr());
    cfg.secret = Some(SECRET.to_vec());
    cfg.timeout = timeout;
    cfg.l2 = Some(zcfs_client::l2::L2Options::new(iface));
    RemoteFs::connect(cfg).unwrap()
}

/// [`client_l2_on`] that lands every write the lane takes above the inline limit (a
/// waiting lane lands none by default).
pub fn client_l2_landing(net: &Net, iface: &str, timeout: Duration) -> RemoteFs {
    let mut cfg = ClientConfig::new(&net.addr());
    cfg.secret = Some(SECRET.to_vec());
    cfg.timeout = timeout;
    let mut o = zcfs_client::l2::L2Options::new(iface);
    o.land_max = Some(zcfs_protocol::l2::MAX_LANDING_WRITE);
    cfg.l2 = Some(o);
    RemoteFs::connect(cfg).unwrap()
}

/// `zcfs stat TARGET --json` (a mount point, or the server's address asked from the
/// client namespace), parsed.
pub fn stat_json(net: &Net, srv: &Served, target: &str) -> serde_json::Value {
    let out = net
        .cli_command(zcfs_bin())
        .args(["stat", target, "--json", "--secret-file"])
        .arg(&srv.secret)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "zcfs stat {target}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Durability rounds against a server of its own (`tag`): each round, `act(fs, round)`
/// runs with a fresh client in the client namespace and the server is killed with
/// SIGKILL right after it (before the group commit's delay could commit what `act`
/// left uncommitted); after a restart, `check(fs, round)` runs with another fresh
/// client. fsck of the image at the end.
pub fn killed_after_each(
    tag: &str,
    rounds: usize,
    act: impl Fn(&RemoteFs, usize) + Sync,
    check: impl Fn(&RemoteFs, usize) + Sync,
) {
    let net = Net::new();
    let mut srv = Served::new(&net, tag, &[]);
    for round in 0..rounds {
        net.in_cli(|| {
            act(&srv.client(&net, Duration::from_secs(10)), round);
            srv.kill(libc::SIGKILL);
        });
        srv.start(&net, &[]);
        net.in_cli(|| check(&srv.client(&net, Duration::from_secs(10)), round));
    }
    srv.kill(libc::SIGTERM);
    srv.fsck();
}

/// A new file `name` in the root (mode 0644) opened with `flags`: its attributes and
/// handle.
pub fn create_file(fs: &RemoteFs, name: &str, flags: i32) -> (zcfs_backend::Attr, u64) {
    fs.create(
        &ctx(),
        zcfs_backend::ROOT,
        name.as_bytes(),
        libc::S_IFREG | 0o644,
        flags,
    )
    .unwrap()
}

/// `len` bytes from `seed` (xorshift): position-dependent, so a block read from the
/// wrong place or a shifted copy does not match, and different for every seed.
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A tiny deterministic generator (xorshift), so a failure names its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The server's counters (`zcfs stat` JSON), asked through `fs`.
pub fn server_stats_json(fs: &RemoteFs) -> serde_json::Value {
    serde_json::from_slice(&fs.server_stats().unwrap()).unwrap()
}

/// Wait (bounded: 15 s) until the server has expired at least `n` sessions.
pub fn wait_for_expired_sessions(observer: &RemoteFs, n: u64) {
    let t = Instant::now();
    while server_stats_json(observer)["sessions_expired"]
        .as_u64()
        .unwrap()
        < n
    {
        assert!(t.elapsed() < Duration::from_secs(15), "no session expired");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The server's `handles_open` once it is 0, or as it is after `within` (polled).
pub fn handles_open_settled(observer: &RemoteFs, within: Duration) -> Option<u64> {
    let t = Instant::now();
    loop {
        let held = server_stats_json(observer)["handles_open"].as_u64();
        if held == Some(0) || t.elapsed() >= within {
            return held;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A client with the test secret to `addr` (a server or a relay to one), with
/// `timeout` and `connections` lanes.
pub fn secret_client_to(addr: &str, timeout: Duration, connections: usize) -> RemoteFs {
    let mut cfg = ClientConfig::new(addr);
    cfg.secret = Some(SECRET.to_vec());
    cfg.timeout = timeout;
    cfg.connections = connections;
    RemoteFs::connect(cfg).unwrap()
}

/// Requests (bounded: 40 s) against a stopped server until a full connection attempt
/// stalled (a request that took at least half the timeout and says "stalled").
pub fn until_a_full_attempt_stalls(fs: &RemoteFs, timeout: Duration) {
    let t = Instant::now();
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "no full attempt stalled"
        );
        let r = Instant::now();
        let e = fs.server_stats().unwrap_err();
        let took = r.elapsed();
        eprintln!("  request failed in {took:?}: {e}");
        if took >= timeout / 2 && e.to_string().contains("stalled") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A mount process's FUSE workers (threads `fuser-N`) and how many of them wait in
/// read(2) of /dev/fuse now.
pub fn fuse_threads(pid: i32) -> (usize, usize) {
    let (mut all, mut reading) = (0, 0);
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (0, 0);
    };
    for t in dir {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        let worker = comm
            .trim_end()
            .strip_prefix("fuser-")
            .is_some_and(|n| n.parse::<u32>().is_ok());
        if !worker {
            continue;
        }
        all += 1;
        let wchan = std::fs::read_to_string(t.join("wchan")).unwrap_or_default();
        reading += usize::from(wchan.starts_with("fuse_dev_do_read"));
    }
    (all, reading)
}

/// One 4 KiB buffer aligned for O_DIRECT.
pub struct AlignedPage(Box<[u8; 8192]>);

impl AlignedPage {
    pub fn new() -> AlignedPage {
        AlignedPage(Box::new([0u8; 8192]))
    }
    pub fn bytes(&mut self) -> &mut [u8] {
        let off = self.0.as_ptr().align_offset(4096);
        &mut self.0[off..off + 4096]
    }
}
