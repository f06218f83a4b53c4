//! `zcfs serve SOURCE`: export a volume image (or `null`) on a Unix socket (by default
//! /run/zcfs/NAME.sock) or TCP until SIGINT, SIGTERM or SIGHUP, then print the server's
//! counters on stderr.

use crate::backend::OpenedBackend;
use crate::process::{sd_notify, StopSignals};
use crate::secret::read_secret;
use crate::server_report::format_report;
use crate::source::Source;
use anyhow::{anyhow, bail, Result};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use zcfs_server::Address;
use zcfs_server::Squash;
use zcfs_volume::{PersistMode, VolumeConfig};

/// Where the default Unix sockets go (created 0755 when missing).
pub const SOCKET_DIR: &str = "/run/zcfs";

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Volume image, or `null` to measure the network path alone.
    source: String,
    /// Address to listen on: unix:PATH (default unix:/run/zcfs/NAME.sock, NAME the
    /// image's file name without its extension), or [tcp:]HOST:PORT. On the Unix socket
    /// a local process acts only as itself (root as anyone); TCP, loopback included,
    /// needs --secret-file or --insecure.
    #[arg(long)]
    listen: Option<String>,
    /// File holding the shared secret (mode 0600 or stricter) for mutual
    /// authentication and per-message MACs.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Allow unauthenticated clients on TCP (anyone who can reach the port may act as
    /// any user but root; as root too with --no-root-squash).
    #[arg(long)]
    insecure: bool,
    /// Requests as root act as root (by default they act as the anonymous user).
    #[arg(long, conflicts_with = "squash_all")]
    no_root_squash: bool,
    /// Every request acts as the anonymous user and group.
    #[arg(long)]
    squash_all: bool,
    /// The anonymous user's uid.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_ANON_ID)]
    anon_uid: u32,
    /// The anonymous user's gid.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_ANON_ID)]
    anon_gid: u32,
    #[arg(long)]
    read_only: bool,
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Requests each client may pipeline.
    #[arg(long, default_value_t = 64)]
    max_inflight: u32,
    /// Receive writes into a buffer and copy them into PM (measurement only).
    #[arg(long)]
    one_copy: bool,
    /// Group-commit batch size (1 = every operation durable before its reply).
    #[arg(long)]
    batch: Option<usize>,
    /// Persistence: msync, or cache-line flushes (clwb, clflushopt, clflush) even
    /// where the mapping is not synchronous (to measure what PM would cost).
    #[arg(long)]
    persist: Option<String>,
    /// Seconds a client's open files and references outlive its last connection
    /// (a client that reconnects within this keeps them).
    #[arg(long, default_value_t = zcfs_server::DEFAULT_GRACE.as_secs_f64())]
    grace: f64,
    /// Seconds a client may stall (not read a reply, or stop in the middle of a
    /// request) before it is dropped.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_PEER_TIMEOUT.as_secs_f64())]
    peer_timeout: f64,
    /// Seconds a connection may stay idle (no request begun) before it is closed; the
    /// client reconnects on its next call and keeps its session within --grace.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_IDLE_TIMEOUT.as_secs_f64())]
    idle_timeout: f64,
    /// Most connections still in the handshake (not authenticated yet) at once; kept
    /// below --max-connections.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_MAX_HANDSHAKES)]
    max_unauthenticated: usize,
    /// Most connections still in the handshake at once from one source address.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_MAX_HANDSHAKES_PER_ADDR)]
    max_unauthenticated_per_source: usize,
    /// Most connections open at once from one source (IP address; uid on the Unix
    /// socket); kept below --max-connections, so no one source takes every slot.
    #[arg(long, default_value_t = zcfs_server::DEFAULT_MAX_CONNECTIONS_PER_SOURCE)]
    max_connections_per_source: usize,
    /// What the per-message MACs cover (needs --secret-file): `headers` (default:
    /// headers and bodies; bulk data moves zero-copy, unMACed) or `full` (bulk data too,
    /// keyed BLAKE3; every client then uses it).
    #[arg(long, default_value = "headers")]
    integrity: zcfs_protocol::channel::Integrity,
    /// Answer Prometheus scrapes (`GET /metrics`, plain HTTP) on HOST:PORT: per
    /// operation counts, errors, bytes and latency histograms, and the server's
    /// counters. Port 0 picks one (printed on stdout).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    /// Serve the layer-2 lane on this interface (AF_XDP; root): small requests and
    /// reads of sessions that offer it ride raw Ethernet frames, one session at a time.
    /// The image must be on tmpfs, hugetlbfs or device-dax (it is the data socket's
    /// UMEM).
    #[arg(long, value_name = "IFACE")]
    l2: Option<String>,
    /// How the layer-2 service thread waits for frames: busy (spin) or wait (poll).
    #[arg(long, default_value = "wait", requires = "l2")]
    l2_poll: String,
    /// Also serve the same-host interface (rings and buffers shared with applications
    /// on this host, docs/samehost.md) on this Unix socket, default
    /// /run/zcfs/NAME.samehost.sock (0666: the server decides by identity). Volume
    /// images only.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "")]
    samehost: Option<String>,
    /// Members of this group get the same-host direct map (may read and write every
    /// file), besides root and the image file's owner.
    #[arg(long, value_name = "GID", requires = "samehost")]
    samehost_trust_group: Option<u32>,
}

/// The same-host socket's path: `--samehost PATH`, or beside the default socket.
fn samehost_path(given: &str, source: &Source) -> Result<PathBuf> {
    if !given.is_empty() {
        return Ok(PathBuf::from(given));
    }
    let Source::Image(p) = source else {
        bail!("--samehost needs a volume image");
    };
    let name = p
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "zcfs".into());
    let dir = PathBuf::from(SOCKET_DIR);
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| anyhow!("creating {}: {e}", dir.display()))?;
    }
    Ok(dir.join(format!("{name}.samehost.sock")))
}

/// `--listen`, or the default Unix socket for the source (its directory made if need
/// be: mode 0755, so anyone can reach the socket, 0666; the server decides by identity).
fn listen_address(a: &ServeArgs, source: &Source) -> Result<Address> {
    let addr = match &a.listen {
        Some(l) => l.parse::<Address>().map_err(|e| anyhow!("--listen {e}"))?,
        None => {
            let name = match source {
                Source::Image(p) => p
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "zcfs".into()),
                _ => "null".into(),
            };
            Address::Unix(PathBuf::from(SOCKET_DIR).join(format!("{name}.sock")))
        }
    };
    if let Address::Unix(p) = &addr {
        if let Some(dir) = p.parent().filter(|d| !d.exists()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| anyhow!("creating {}: {e}", dir.display()))?;
        }
    }
    Ok(addr)
}

fn seconds(flag: &str, v: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| anyhow!("--{flag} {v}: give a number of seconds, 0 or more"))
}

fn parse_persist(p: &str) -> Result<PersistMode> {
    use zcfs_pmem::FlushInstr;
    Ok(match p {
        "msync" => PersistMode::Msync,
        "clwb" => PersistMode::CacheLine(FlushInstr::Clwb),
        "clflushopt" => PersistMode::CacheLine(FlushInstr::Clflushopt),
        "clflush" => PersistMode::CacheLine(FlushInstr::Clflush),
        other => bail!("--persist {other}: use msync, clwb, clflushopt or clflush"),
    })
}

/// The backend to export. `--persist` and `--batch` apply to a volume only.
fn open(source: &Source, a: &ServeArgs) -> Result<OpenedBackend> {
    let volume = || {
        let mut cfg = VolumeConfig {
            read_only: a.read_only,
            persist: a.persist.as_deref().map(parse_persist).transpose()?,
            ..Default::default()
        };
        if let Some(b) = a.batch {
            cfg.batch_ops = b.max(1);
        }
        Ok(cfg)
    };
    OpenedBackend::open(source, volume, |addr| {
        bail!("{addr} is a server address: `zcfs serve` exports a volume image or `null`")
    })
}

pub fn run(a: &ServeArgs) -> Result<i32> {
    let grace = seconds("grace", a.grace)?;
    let peer_timeout = seconds("peer-timeout", a.peer_timeout)?;
    if peer_timeout.is_zero() {
        bail!("--peer-timeout 0: a peer needs some time to answer");
    }
    let idle_timeout = seconds("idle-timeout", a.idle_timeout)?;
    if idle_timeout.is_zero() {
        bail!("--idle-timeout 0: a connection needs some time between requests");
    }
    if a.integrity == zcfs_protocol::channel::Integrity::Full && a.secret_file.is_none() {
        bail!("--integrity full needs --secret-file FILE: without a secret there are no MACs");
    }
    let secret = a.secret_file.as_deref().map(read_secret).transpose()?;
    let source: Source = a.source.parse()?;
    let listen = listen_address(a, &source)?;
    if let Address::Tcp(_) = listen {
        if secret.is_none() && !a.insecure {
            bail!("listening on {listen} (TCP, loopback included) needs --secret-file FILE, or --insecure to allow anyone who can reach it");
        }
    }
    let authenticated = secret.is_some();
    let identity = zcfs_server::IdentityMap {
        squash: if a.squash_all {
            Squash::All
        } else if a.no_root_squash {
            Squash::None
        } else {
            Squash::Root
        },
        anon_uid: a.anon_uid,
        anon_gid: a.anon_gid,
    };
    // The layer-2 port first: a refused image or interface fails the start.
    let l2 = match &a.l2 {
        Some(ifname) => {
            let poll: zcfs_server::l2::L2Poll =
                a.l2_poll.parse().map_err(|e| anyhow!("--l2-poll: {e}"))?;
            let Source::Image(path) = &source else {
                bail!("--l2 needs a volume image (its mapping is the data socket's UMEM)");
            };
            let image = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?;
            let port = zcfs_server::l2::L2Port::open(ifname, &image, poll)
                .map_err(|e| anyhow!("--l2 {ifname}: {e}"))?;
            Some((port, poll))
        }
        None => None,
    };
    if a.samehost.is_some() && !matches!(source, Source::Image(_)) {
        bail!("--samehost needs a volume image (not {source})");
    }
    let OpenedBackend {
        backend, volume, ..
    } = open(&source, a)?;
    let samehost = match (&a.samehost, &volume) {
        (Some(given), Some(vol)) => {
            let path = samehost_path(given, &source)?;
            let mut cfg = zcfs_samehost::ServiceConfig::new(&path);
            cfg.identity = identity;
            cfg.trust_group = a.samehost_trust_group;
            cfg.read_only = a.read_only;
            let svc = Arc::new(
                zcfs_samehost::Service::bind(vol.clone(), cfg)
                    .map_err(|e| anyhow!("--samehost: {e}"))?,
            );
            let run = svc.clone();
            let t = std::thread::Builder::new()
                .name("zcfs-samehost".into())
                .spawn(move || run.run())?;
            Some((svc, t))
        }
        (Some(_), None) => bail!("--samehost needs a volume image"),
        _ => None,
    };
    let signals = StopSignals::block();
    let server = Arc::new(
        zcfs_server::Server::bind(
            backend,
            zcfs_server::ServerConfig {
                listen,
                identity,
                secret,
                read_only: a.read_only,
                max_connections: a.max_connections,
                max_inflight: a.max_inflight,
                one_copy: a.one_copy,
                grace,
                peer_timeout,
                idle_timeout,
                integrity: a.integrity,
                max_handshakes: a.max_unauthenticated,
                max_handshakes_per_addr: a.max_unauthenticated_per_source,
                max_connections_per_source: a.max_connections_per_source,
                ..Default::default()
            },
        )
        .map_err(|e| anyhow!("{e} (is another server using it?)"))?,
    );
    let addr = server.local_addr();
    let l2_mode = match l2 {
        Some((port, poll)) => {
            let mode = port.mode();
            server.start_l2(port, poll)?;
            format!(
                " layer-2 on {} ({mode:?} mode, {poll:?} poll)",
                a.l2.as_deref().unwrap_or("")
            )
        }
        None => String::new(),
    };
    let metrics = match &a.metrics {
        Some(m) => {
            let scraped = server.clone();
            let http = zcfs_metrics::MetricsHttp::bind(m, Default::default(), move || {
                scraped.prometheus()
            })
            .map_err(|e| anyhow!("--metrics {m}: {e}"))?;
            Some(http)
        }
        None => None,
    };
    let accepting = server.clone();
    // Runs until shutdown, then waits for the connections and releases every session.
    let acceptor = std::thread::Builder::new()
        .name("zcfs-accept".into())
        .spawn(move || accepting.run())?;
    println!(
        "serving {source} on {addr}{}{}{l2_mode}",
        if authenticated {
            match a.integrity {
                zcfs_protocol::channel::Integrity::Full => " (authenticated, integrity full)",
                zcfs_protocol::channel::Integrity::Headers => " (authenticated)",
            }
        } else {
            ""
        },
        if a.read_only { " read-only" } else { "" }
    );
    if let Some(m) = &metrics {
        println!("metrics on http://{}/metrics", m.local_addr());
    }
    if let Some((svc, _)) = &samehost {
        println!("same-host interface on {}", svc.path().display());
    }
    // Scripts wait for this line; stdout may be a pipe.
    std::io::stdout().flush()?;
    sd_notify("READY=1");
    while signals.wait(Duration::from_secs(1)).is_none() {}
    sd_notify("STOPPING=1");
    drop(metrics);
    if let Some((svc, t)) = samehost {
        svc.shutdown();
        t.join().map_err(|_| anyhow!("same-host thread panicked"))?;
        let st = svc.stats();
        eprintln!(
            "same-host   shared {} reads {} writes ({} bytes, {} copies/byte); direct {} extent reads {} commits ({} bytes, {} copies/byte)",
            st.shared_read_ops,
            st.shared_write_ops,
            st.shared_read_bytes + st.shared_write_bytes,
            st.shared_copies_per_byte,
            st.direct_read_ops,
            st.direct_commit_ops,
            st.direct_read_bytes + st.direct_commit_bytes,
            st.direct_copies_per_byte
        );
    }
    server.shutdown();
    acceptor
        .join()
        .map_err(|_| anyhow!("accept thread panicked"))?;
    let report = server.report();
    eprint!(
        "zcfs serve: shut down\n{}sessions    {} resumed, {} released; {} invalid requests answered, {} stalled peers dropped\n",
        format_report(&report),
        report.sessions_resumed,
        report.sessions_expired,
        report.rejected_invalid,
        report.dropped_stalled
    );
    drop(server);
    if let Some(vol) = volume {
        vol.sync()?;
    }
    Ok(0)
}
