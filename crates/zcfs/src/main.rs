//! `zcfs`: the command-line tool. Errors are reported here with what failed and what to
//! do; the libraries below return typed errors.

mod backend;
mod mount;
mod process;
mod secret;
mod source;

use anyhow::{anyhow, bail, Context, Result};
use backend::{client_config, connect, OpenedBackend};
use clap::{Parser, Subcommand};
use source::Source;
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use zcfs_volume::{MkfsOptions, Owner, Volume, VolumeConfig, ROOT_INO};

#[derive(Parser)]
#[command(
    name = "zcfs",
    version,
    about = "zcfs: a zero-copy, crash-consistent file system for persistent memory"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Create a volume on IMAGE (a file, e.g. in /dev/shm, or a /dev/dax device).
    Mkfs {
        image: PathBuf,
        /// Volume size, e.g. 1G, 512M, 65536 (ignored for DAX devices).
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// Overwrite an existing volume or a non-empty file.
        #[arg(long)]
        force: bool,
        /// Number of inodes (default: one per 16 KiB).
        #[arg(long)]
        inodes: Option<u64>,
        /// Size of the operation log ring (default: 1/64 of the volume, 64 KiB..64 MiB).
        #[arg(long, value_parser = parse_size)]
        log_size: Option<u64>,
    },
    /// Check a volume. Exit status: 0 clean, 1 problems all repaired, 4 problems left,
    /// 8 the check could not run.
    Fsck {
        image: PathBuf,
        /// Repair what is safe to repair (link counts, block counts, orphan inodes).
        #[arg(long)]
        repair: bool,
        #[arg(long)]
        json: bool,
    },
    /// Geometry, usage, log state and persistence mode of a volume image, or the
    /// counters of a running server (TARGET = HOST:PORT).
    Stat {
        target: String,
        #[arg(long)]
        json: bool,
        /// Shared secret for a server that requires one.
        #[arg(long)]
        secret_file: Option<PathBuf>,
    },
    /// Export a volume (or `null`) over TCP.
    Serve {
        /// Volume image, or `null` to measure the network path alone.
        source: String,
        /// Address to listen on. Anything but loopback needs --secret-file or --insecure.
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: std::net::SocketAddr,
        /// File holding the shared secret for mutual HMAC-SHA256 authentication.
        #[arg(long)]
        secret_file: Option<PathBuf>,
        /// Allow unauthenticated clients on a non-loopback address.
        #[arg(long)]
        insecure: bool,
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
    },
    /// Mount SOURCE (a volume image, HOST:PORT, or `null`) on MOUNTPOINT through FUSE.
    /// Runs in the foreground until unmounted or sent SIGINT/SIGTERM.
    Mount(mount::MountArgs),
    /// Unmount a zcfs mount.
    Umount {
        mountpoint: PathBuf,
        /// Detach now even if busy; the mount goes away when no longer used.
        #[arg(long)]
        lazy: bool,
    },
    /// Install /sbin/mount.fuse.zcfs so `mount -t fuse.zcfs` and fstab lines work.
    InstallHelper {
        #[arg(long, default_value = "/sbin/mount.fuse.zcfs")]
        path: PathBuf,
    },
    /// Test helper: write files into a volume, printing each fsync it completes.
    #[command(hide = true)]
    SelftestWriter {
        image: PathBuf,
        #[arg(long, default_value_t = 1000)]
        files: u64,
        #[arg(long, default_value_t = 10)]
        fsync_every: u64,
    },
}

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_lowercase().as_str() {
                "k" | "kb" | "kib" => 1u64 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "t" | "tb" | "tib" => 1 << 40,
                other => return Err(format!("unknown size unit {other:?} (use K, M, G or T)")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("not a size: {s:?}"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let argv0 = std::env::args().next().unwrap_or_default();
    let result = if argv0.ends_with("mount.fuse.zcfs") {
        mount::helper_main(std::env::args().skip(1).collect())
    } else {
        run(Cli::parse())
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zcfs: {e:#}");
            8
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Mkfs {
            image,
            size,
            force,
            inodes,
            log_size,
        } => mkfs(&image, size, force, inodes, log_size),
        Cmd::Fsck {
            image,
            repair,
            json,
        } => fsck(&image, repair, json),
        Cmd::Stat {
            target,
            json,
            secret_file,
        } => match target.parse::<Source>()? {
            Source::Image(image) => stat(&image, json),
            Source::Remote(addr) => remote_stat(&addr, secret_file.as_deref(), json),
            Source::Null => bail!("`null` has nothing to show: give a volume image or HOST:PORT"),
        },
        Cmd::Serve {
            source,
            listen,
            secret_file,
            insecure,
            read_only,
            max_connections,
            max_inflight,
            one_copy,
            batch,
            persist,
            grace,
            peer_timeout,
        } => serve(
            &source,
            listen,
            secret_file.as_deref(),
            insecure,
            read_only,
            max_connections,
            max_inflight,
            one_copy,
            batch,
            persist.as_deref(),
            grace,
            peer_timeout,
        ),
        Cmd::Mount(a) => mount::mount(&a),
        Cmd::Umount { mountpoint, lazy } => mount::umount(&mountpoint, lazy),
        Cmd::InstallHelper { path } => {
            let exe = std::env::current_exe()?;
            let _ = std::fs::remove_file(&path);
            std::os::unix::fs::symlink(&exe, &path)
                .with_context(|| format!("linking {} to {}", path.display(), exe.display()))?;
            println!("{} -> {}: `mount -t fuse.zcfs SOURCE MOUNTPOINT -o OPTIONS` and fstab lines now work", path.display(), exe.display());
            Ok(0)
        }
        Cmd::SelftestWriter {
            image,
            files,
            fsync_every,
        } => selftest_writer(&image, files, fsync_every),
    }
}

fn mkfs(
    image: &Path,
    size: u64,
    force: bool,
    inodes: Option<u64>,
    log_size: Option<u64>,
) -> Result<i32> {
    let meta = std::fs::metadata(image).ok();
    let is_file = meta.as_ref().is_none_or(|m| m.is_file());
    if !force {
        if Volume::probe(image) {
            bail!(
                "{} already holds a zcfs volume; add --force to overwrite it",
                image.display()
            );
        }
        if meta.as_ref().is_some_and(|m| m.is_file() && m.len() > 0) {
            bail!(
                "{} exists and is not empty; add --force to overwrite it",
                image.display()
            );
        }
    }
    if !is_file
        && meta
            .as_ref()
            .is_some_and(|m| !m.file_type().is_char_device())
    {
        bail!(
            "{} is neither a regular file nor a DAX device",
            image.display()
        );
    }
    Volume::mkfs(
        image,
        size,
        &MkfsOptions {
            inodes,
            log_bytes: log_size,
        },
    )
    .with_context(|| format!("making a volume on {}", image.display()))?;
    let vol = Volume::open(
        image,
        VolumeConfig {
            read_only: true,
            ..Default::default()
        },
    )?;
    let info = vol.info();
    println!(
        "created {}: {} bytes, {} data blocks of 4 KiB, {} inodes, {} KiB log, persistence {}",
        image.display(),
        info.size_bytes,
        info.data_blocks_total,
        info.inodes_total,
        info.log_ring_bytes / 1024,
        persistence_of(image)
    );
    Ok(0)
}

/// The persistence mode a read-write open would use (read-only opens map privately).
fn persistence_of(image: &Path) -> String {
    zcfs_pmem::Region::open(image, &zcfs_pmem::OpenParams::default())
        .map(|r| r.mode().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

fn fsck(image: &Path, repair: bool, json: bool) -> Result<i32> {
    let report = zcfs_volume::fsck::fsck_path(image, repair)
        .with_context(|| format!("checking {}", image.display()))?;
    let code = if report.is_clean() {
        if report.repaired.is_empty() {
            0
        } else {
            1
        }
    } else {
        4
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(code);
    }
    println!(
        "{}: {} inodes ({} directories, {} files, {} symlinks), {} blocks in use, {} log entries replayed",
        image.display(),
        report.inodes,
        report.directories,
        report.files,
        report.symlinks,
        report.blocks_used,
        report.entries_replayed
    );
    for n in &report.notes {
        println!("note: {n}");
    }
    for r in &report.repaired {
        println!("repaired: {r}");
    }
    for p in &report.problems {
        println!("PROBLEM: {p}");
    }
    if report.is_clean() {
        println!("clean");
    } else {
        println!(
            "{} problem(s){}",
            report.problems.len(),
            if repair {
                " left after repair"
            } else {
                "; run with --repair to fix what is safe to fix"
            }
        );
    }
    Ok(code)
}

fn stat(image: &Path, json: bool) -> Result<i32> {
    let vol = match Volume::open(
        image,
        VolumeConfig {
            read_only: true,
            ..Default::default()
        },
    ) {
        Ok(v) => v,
        Err(zcfs_volume::FsError::Busy(m)) => {
            // A live volume's image changes under a reader: ask its server instead.
            bail!("{m}; for a served volume, `zcfs stat ADDRESS` shows its figures")
        }
        Err(e) => return Err(anyhow!(e).context(format!("opening {}", image.display()))),
    };
    let mut info = vol.info();
    info.persistence = persistence_of(image);
    if json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(0);
    }
    let g = &info.geometry;
    let used = info.data_blocks_total - info.data_blocks_free;
    println!("volume     {}", image.display());
    println!("uuid       {}", info.uuid);
    println!(
        "size       {} bytes ({} blocks of 4 KiB)",
        info.size_bytes, g.total_blocks
    );
    println!(
        "layout     superblocks 0-1, log {}+{}, inode table {}+{}, data {}+{}",
        g.log_start, g.log_blocks, g.itable_start, g.itable_blocks, g.data_start, g.data_blocks
    );
    println!(
        "data       {} of {} blocks used ({:.1} %)",
        used,
        info.data_blocks_total,
        100.0 * used as f64 / info.data_blocks_total.max(1) as f64
    );
    println!(
        "inodes     {} of {} used",
        info.inodes_total - info.inodes_free,
        info.inodes_total
    );
    println!(
        "log        ring {} KiB; at open: {} entries replayed{}",
        info.log_ring_bytes / 1024,
        info.recovery.entries_replayed,
        if info.recovery.was_clean {
            " (clean shutdown)"
        } else {
            " (recovered from a crash)"
        }
    );
    println!("mounts     {}", info.mount_count);
    println!("persist    {}", info.persistence);
    Ok(0)
}

/// Deterministic content of selftest file `i`.
fn selftest_content(i: u64) -> Vec<u8> {
    let len = (i * 7919) % 20000 + 1;
    (0..len)
        .map(|j| (i as u8).wrapping_mul(17).wrapping_add(j as u8))
        .collect()
}

fn selftest_writer(image: &Path, files: u64, fsync_every: u64) -> Result<i32> {
    let vol = Volume::open(image, VolumeConfig::default())?;
    let owner = Owner { uid: 0, gid: 0 };
    let dir = match vol.lookup(ROOT_INO, b"selftest") {
        Ok(a) => a.ino,
        Err(_) => vol.mkdir(ROOT_INO, b"selftest", 0o755, owner)?.ino,
    };
    let mut out = std::io::stdout().lock();
    for i in 0..files {
        let name = format!("f{i:06}");
        let a = vol.create(dir, name.as_bytes(), 0o644, owner, 0)?;
        vol.write(a.ino, 0, &selftest_content(i))?;
        if (i + 1) % fsync_every == 0 {
            vol.fsync(a.ino)?;
            writeln!(out, "synced {i}")?;
            out.flush()?;
        }
    }
    Ok(0)
}

fn remote_stat(addr: &str, secret: Option<&Path>, json: bool) -> Result<i32> {
    let mut cfg = client_config(addr, secret)?;
    cfg.connections = 1;
    let fs = connect(cfg)?;
    let raw = fs.server_stats().map_err(|e| anyhow!("{addr}: {e}"))?;
    let r: zcfs_server::StatsReport = serde_json::from_slice(&raw)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", format_report(&r));
    }
    Ok(0)
}

fn format_report(r: &zcfs_server::StatsReport) -> String {
    let mut out = format!(
        "connections {} active, {} total; rejected: {} malformed, {} authentication, {} over limit\n\
         payload     {} bytes read, {} written; {:.3} user-space copies per payload byte\n",
        r.connections_active,
        r.connections_total,
        r.rejected_malformed,
        r.rejected_auth,
        r.rejected_limit,
        r.payload_bytes_read,
        r.payload_bytes_written,
        r.user_copies_per_payload_byte
    );
    out += &format!(
        "{:<12} {:>10} {:>8} {:>14} {:>10} {:>10}\n",
        "op", "count", "errors", "bytes", "mean us", "max us"
    );
    for (name, o) in &r.ops {
        out += &format!(
            "{name:<12} {:>10} {:>8} {:>14} {:>10.1} {:>10.1}\n",
            o.count, o.errors, o.bytes, o.mean_us, o.max_us
        );
    }
    out
}

fn parse_persist(p: &str) -> Result<zcfs_volume::PersistMode> {
    use zcfs_pmem::FlushInstr;
    Ok(match p {
        "msync" => zcfs_volume::PersistMode::Msync,
        "clwb" => zcfs_volume::PersistMode::CacheLine(FlushInstr::Clwb),
        "clflushopt" => zcfs_volume::PersistMode::CacheLine(FlushInstr::Clflushopt),
        "clflush" => zcfs_volume::PersistMode::CacheLine(FlushInstr::Clflush),
        other => bail!("--persist {other}: use msync, clwb, clflushopt or clflush"),
    })
}

#[allow(clippy::too_many_arguments)]
fn serve(
    source: &str,
    listen: std::net::SocketAddr,
    secret_file: Option<&Path>,
    insecure: bool,
    read_only: bool,
    max_connections: usize,
    max_inflight: u32,
    one_copy: bool,
    batch: Option<usize>,
    persist: Option<&str>,
    grace: f64,
    peer_timeout: f64,
) -> Result<i32> {
    let seconds = |flag: &str, v: f64| {
        std::time::Duration::try_from_secs_f64(v)
            .map_err(|_| anyhow!("--{flag} {v}: give a number of seconds, 0 or more"))
    };
    let grace = seconds("grace", grace)?;
    let peer_timeout = seconds("peer-timeout", peer_timeout)?;
    if peer_timeout.is_zero() {
        bail!("--peer-timeout 0: a peer needs some time to answer");
    }
    let secret = secret_file.map(secret::read_secret).transpose()?;
    if !listen.ip().is_loopback() && secret.is_none() && !insecure {
        bail!("listening on {listen} (not loopback) needs --secret-file FILE, or --insecure to allow anyone on the network");
    }
    let authenticated = secret.is_some();
    let source: Source = source.parse()?;
    let OpenedBackend { backend, volume } = match &source {
        Source::Null => OpenedBackend::null(),
        Source::Image(image) => {
            let mut cfg = VolumeConfig {
                read_only,
                persist: persist.map(parse_persist).transpose()?,
                ..Default::default()
            };
            if let Some(b) = batch {
                cfg.batch_ops = b.max(1);
            }
            OpenedBackend::volume(image, cfg)?
        }
        Source::Remote(addr) => {
            bail!("{addr} is a server address: `zcfs serve` exports a volume image or `null`")
        }
    };
    let signals = process::StopSignals::block();
    let server = std::sync::Arc::new(
        zcfs_server::Server::bind(
            backend,
            zcfs_server::ServerConfig {
                listen,
                secret,
                read_only,
                max_connections,
                max_inflight,
                one_copy,
                grace,
                peer_timeout,
                ..Default::default()
            },
        )
        .map_err(|e| anyhow!("{e} (is another server using the port?)"))?,
    );
    let addr = server.local_addr();
    let s2 = server.clone();
    // Runs until shutdown, then waits for the connections and releases every session.
    let acceptor = std::thread::Builder::new()
        .name("zcfs-accept".into())
        .spawn(move || s2.run())?;
    println!(
        "serving {source} on {addr}{}{}",
        if authenticated {
            " (authenticated)"
        } else {
            ""
        },
        if read_only { " read-only" } else { "" }
    );
    use std::io::Write as _;
    std::io::stdout().flush()?;
    process::sd_notify("READY=1");
    while signals.wait(std::time::Duration::from_secs(1)).is_none() {}
    process::sd_notify("STOPPING=1");
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
