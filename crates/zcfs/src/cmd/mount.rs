//! `zcfs mount SOURCE MOUNTPOINT`, in the foreground or as a `--daemon`, and
//! `zcfs umount MOUNTPOINT`.

mod options;
mod stop;

use crate::backend::{client_config, OpenedBackend};
use crate::process::{sd_notify, spawn_detached, ChildReport, ReadyPipe, StopSignals};
use crate::source::Source;
use anyhow::{anyhow, bail, Context, Result};
use options::{parse_options, MountPlan};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use zcfs_fuse::{CacheMode, Config, FuseFs};
use zcfs_volume::VolumeConfig;

/// The arguments of `zcfs mount` (and of the mount.fuse.zcfs helper).
#[derive(Debug, Clone, clap::Args)]
pub struct MountArgs {
    /// A volume image, HOST:PORT of a server, or `null`.
    pub source: String,
    pub mountpoint: PathBuf,
    /// Mount options, comma separated (allow_other, default_permissions, ro, uid=,
    /// gid=, umask=, cache=, writeback, direct_io, threads=, ...).
    #[arg(short = 'o', action = clap::ArgAction::Append)]
    pub options: Vec<String>,
    /// What the kernel may cache: none, metadata, auto (default) or always.
    #[arg(long)]
    pub cache: Option<CacheMode>,
    /// Let the kernel buffer writes (writeback cache).
    #[arg(long)]
    pub writeback: bool,
    /// Bypass the page cache for file data.
    #[arg(long)]
    pub direct_io: bool,
    /// FUSE worker threads (default 16: each waits for one server round trip).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Return once the mount is live, leaving it running in the background.
    #[arg(long)]
    pub daemon: bool,
    /// Shared secret for a remote SOURCE that requires one.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Answer Prometheus scrapes (`GET /metrics`, plain HTTP) on HOST:PORT: per FUSE
    /// operation counts, errors and latency histograms (also `-o metrics=`).
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<String>,
    /// Offer a remote SOURCE the layer-2 lane on this interface (also `-o l2=`;
    /// `-o l2_poll=busy|wait`, `-o l2_read_max=BYTES`, `-o l2_write_max=BYTES`,
    /// `-o l2_land_max=BYTES`).
    #[arg(long, value_name = "IFACE")]
    pub l2: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
    /// Detach now even if busy; the mount goes away when no longer used.
    #[arg(long)]
    lazy: bool,
}

/// `zcfs mount`; `args` is the command line after the program name, which `--daemon`
/// hands to its child.
pub fn run(a: &MountArgs, args: &[OsString]) -> Result<i32> {
    let plan = parse_options(a)?;
    if plan.remount {
        return remount(&a.mountpoint, &plan);
    }
    if a.daemon {
        return run_detached(a, args);
    }
    // Set when a `--daemon` parent waits for us.
    let mut ready_pipe = ReadyPipe::from_env();
    let result = mount_until_unmounted(a, &mut ready_pipe);
    if let (Err(e), Some(pipe)) = (&result, ready_pipe) {
        pipe.failed(e);
    }
    result
}

/// `--daemon`: run the same command without `--daemon` in a detached child; return once
/// it has mounted, or fail with its error.
fn run_detached(a: &MountArgs, args: &[OsString]) -> Result<i32> {
    let child_args: Vec<OsString> = args.iter().filter(|x| *x != "--daemon").cloned().collect();
    match spawn_detached(&child_args).context("starting the mount process")? {
        ChildReport::Ready { pid } => {
            println!(
                "mounted {} on {} (pid {pid})",
                a.source,
                a.mountpoint.display()
            );
            Ok(0)
        }
        ChildReport::Failed(e) => bail!("{e}"),
        ChildReport::Silent => bail!("the mount process exited without mounting"),
    }
}

/// Whether the FUSE threads can splice requests (`-o splice`, the default): each needs
/// a pipe of 2 MiB, which takes CAP_SYS_RESOURCE or `fs.pipe-max-size` of at least that,
/// and room in it for a whole write (`max_write` at most 1 MiB, the default). Said once
/// when not: large writes are then copied through memory.
fn splice_usable(max_write: u32) -> bool {
    if max_write > zcfs_fuse::SPLICE_MAX_WRITE {
        tracing::info!(
            "large writes are copied, not spliced: max_write {max_write} is over {}",
            zcfs_fuse::SPLICE_MAX_WRITE
        );
        return false;
    }
    match zcfs_fuse::splice_pipe_available() {
        Ok(()) => true,
        Err(e) => {
            tracing::info!(
                "large writes are copied, not spliced: a 2 MiB pipe was refused ({e}); \
                 it needs CAP_SYS_RESOURCE or sysctl fs.pipe-max-size >= 2097152"
            );
            false
        }
    }
}

/// Mount, report readiness (taking `ready_pipe`), serve until unmounted or signalled,
/// and close the volume.
fn mount_until_unmounted(a: &MountArgs, ready_pipe: &mut Option<ReadyPipe>) -> Result<i32> {
    let plan = parse_options(a)?;
    preflight(&a.mountpoint)?;
    // Resolved before mounting: afterwards resolving it would ask the mount itself.
    let canonical_mp = a
        .mountpoint
        .canonicalize()
        .with_context(|| format!("mount point {}", a.mountpoint.display()))?;
    let source: Source = a.source.parse()?;
    let signals = StopSignals::block();
    let OpenedBackend {
        backend,
        volume,
        client,
    } = open(&source, &plan)?;
    let fs = FuseFs::new(backend.clone(), plan.fuse.clone());
    let stats = fs.stats.clone();
    // Bound before mounting, so a taken port fails the mount, not a live one.
    let metrics_http = match &plan.metrics {
        Some(m) => {
            let (scraped, lane) = (stats.clone(), client.clone());
            let http = zcfs_metrics::MetricsHttp::bind(m, Default::default(), move || {
                crate::mount_stats::prometheus(&scraped, lane.as_deref())
            })
            .map_err(|e| anyhow!("--metrics {m}: {e}"))?;
            eprintln!(
                "zcfs mount: metrics on http://{}/metrics",
                http.local_addr()
            );
            Some(http)
        }
        None => None,
    };
    let mut config = Config::default();
    config.mount_options = plan.mount_options.clone();
    config.acl = plan.acl;
    config.n_threads = Some(plan.threads);
    config.clone_fd = true;
    config.splice_writes = plan.fuse.splice && splice_usable(plan.fuse.max_write);
    if let Some(n) = plan.readers.filter(|&n| n < plan.threads) {
        config.read_gate = Some(zcfs_fuse::SharedReadGate(Arc::new(
            zcfs_fuse::read_gate::IdleReaders::new(n),
        )));
    }
    let session = zcfs_fuse::spawn(fs, &a.mountpoint, &config).map_err(|e| {
        let hint = match e.raw_os_error() {
            // fusermount3 explains its own refusals; this is a direct mount's.
            Some(libc::EPERM) | Some(libc::EACCES)
                if config.acl != zcfs_fuse::SessionACL::Owner =>
            {
                " (allow_other as a non-root user needs user_allow_other in /etc/fuse.conf)"
            }
            Some(libc::ENODEV) => " (is the fuse module loaded? `modprobe fuse`)",
            _ => "",
        };
        anyhow!("mounting {source} on {}: {e}{hint}", a.mountpoint.display())
    })?;
    // Which mount is ours (its id and device in mountinfo), to tell it from a later one.
    let ours = mount_at(&canonical_mp);
    match &ours {
        Some((_, dev)) => set_read_ahead(dev, plan.read_ahead_kb),
        None => tracing::info!(
            "read-ahead left as it is: {} not in mountinfo",
            canonical_mp.display()
        ),
    }
    // `zcfs stat MOUNTPOINT` asks this socket, named by the mount's device number.
    let stat_socket = ours.as_ref().and_then(|(_, dev)| {
        let (st, source, mp) = (stats.clone(), a.source.clone(), canonical_mp.clone());
        let lane = client.clone();
        let answer = move |prometheus: bool| {
            if prometheus {
                crate::mount_stats::prometheus(&st, lane.as_deref())
            } else {
                let r = crate::mount_stats::report(&st, &source, &mp, lane.as_deref());
                serde_json::to_string(&r).unwrap_or_else(|e| format!("error: {e}\n"))
            }
        };
        crate::mount_stats::StatSocket::listen(dev, answer)
            .map_err(|e| tracing::warn!("no stat socket, `zcfs stat` cannot ask this mount: {e:#}"))
            .ok()
    });
    tracing::info!(%source, mountpoint = %a.mountpoint.display(), threads = plan.threads, readers = ?plan.readers, "mounted");
    if let Some(pipe) = ready_pipe.take() {
        pipe.ready();
    }
    sd_notify("READY=1");
    let mut signalled = None;
    while !session.is_finished() {
        if let Some(sig) = signals.wait(Duration::from_millis(200)) {
            signalled = Some(sig);
            break;
        }
    }
    sd_notify("STOPPING=1");
    if let Some(sig) = signalled {
        let still_ours = matches!((&ours, mount_at(&canonical_mp)), (Some(o), Some(n)) if *o == n);
        tracing::info!(sig, "signal received: unmounting");
        let detached = if still_ours {
            session.unmount().unwrap_or_else(|e| {
                tracing::warn!("unmount: {e}");
                true
            })
        } else {
            // Detached already (files still open keep the connection alive), and the
            // mount point perhaps someone else's now: that mount is left alone.
            true
        };
        if detached {
            // Files still open on the detached mount would keep the session alive:
            // end our connection (they get ENOTCONN, as when the process dies).
            stop::end_connection(session, ours.as_ref().map(|(_, dev)| dev.as_str()));
        } else if let Err(e) = session.join() {
            tracing::warn!("session ended: {e}");
        }
    } else if let Err(e) = session.join() {
        tracing::warn!("session ended: {e}");
    }
    // Files still open keep a plain unmount from succeeding: detach, as libfuse does,
    // so no mount outlives its process; but only our own mount: once it was unmounted,
    // the mount point may already hold the next one (`umount; mount` at once).
    match (&ours, mount_at(&canonical_mp)) {
        (Some(ours), Some(now)) if *ours == now => {
            if let Err(e) = unmount(&a.mountpoint, true) {
                tracing::warn!("lazy unmount of {}: {e:#}", a.mountpoint.display());
            }
        }
        (_, Some(_)) => tracing::info!(
            mountpoint = %a.mountpoint.display(),
            "the mount point holds another mount now: leaving it"
        ),
        _ => {}
    }
    drop(stat_socket);
    drop(metrics_http);
    let s = backend.copy_stats();
    let f = &stats;
    use std::sync::atomic::Ordering::Relaxed;
    tracing::info!(
        requests = f.requests(),
        read = f.read_bytes.load(Relaxed),
        written = f.write_bytes.load(Relaxed),
        fuse_copies = f.user_copy_bytes.load(Relaxed),
        backend = %s,
        "unmounted"
    );
    drop(backend);
    if let Some(vol) = volume {
        // Last reference: closing writes the clean flag.
        if Arc::strong_count(&vol) > 1 {
            vol.sync()?;
        }
    }
    Ok(0)
}

/// The backend to mount; `-o ro` and `-o batch=` apply to a volume, `-o secret_file=`
/// and `-o timeout=` to a server.
fn open(source: &Source, plan: &MountPlan) -> Result<OpenedBackend> {
    let volume = || {
        let mut cfg = VolumeConfig {
            read_only: plan.read_only,
            ..Default::default()
        };
        if let Some(b) = plan.batch_ops {
            cfg.batch_ops = b;
        }
        Ok(cfg)
    };
    let remote = |addr: &str| {
        let connect = || {
            let mut cfg = client_config(addr, plan.secret_file.as_deref())?;
            if let Some(t) = plan.timeout {
                cfg.timeout = t;
            }
            cfg.integrity = plan.integrity;
            cfg.gather_writes = plan.gather_writes;
            if let Some(iface) = &plan.l2 {
                let mut o = zcfs_client::l2::L2Options::new(iface);
                if let Some(p) = plan.l2_poll {
                    o.poll = p;
                }
                if let Some(m) = plan.l2_read_max {
                    o.read_max = m;
                }
                if let Some(m) = plan.l2_write_max {
                    o.write_max = m;
                }
                if let Some(m) = plan.l2_land_max {
                    o.land_max = Some(m);
                }
                cfg.l2 = Some(o);
            }
            // cache=none: no cache of names and attributes in the client either
            // (a cached name would skip the server's search-permission check, as
            // a kernel-cached one skips it without default_permissions).
            if plan.fuse.cache == zcfs_fuse::CacheMode::None {
                cfg.attr_ttl = Duration::ZERO;
            }
            OpenedBackend::remote(cfg)
        };
        connect().with_context(|| {
            format!(
                "{addr} is neither `null`, an existing volume image, nor a reachable server address"
            )
        })
    };
    OpenedBackend::open(source, volume, remote)
}

/// Refuse, with the fix, what would make the mount fail less clearly later.
fn preflight(mp: &Path) -> Result<()> {
    if !Path::new("/dev/fuse").exists() {
        bail!("FUSE is not available: /dev/fuse is missing. Load the module with `modprobe fuse` and install fuse3 (`apt-get install fuse3`)");
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root && which("fusermount3").is_none() && which("fusermount").is_none() {
        bail!("fusermount3 is missing (needed to mount as a non-root user): install fuse3 (`apt-get install fuse3`)");
    }
    match std::fs::metadata(mp) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("mount point {} is not a directory", mp.display()),
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "mount point {} is busy: a zcfs mount there lost its process. Run `zcfs umount {}` first",
            mp.display(),
            mp.display()
        ),
        Err(e) => bail!("mount point {}: {e} (create it with `mkdir -p {}`)", mp.display(), mp.display()),
    }
    if is_mounted(mp) {
        bail!("mount point {} is busy: something is mounted there already. Run `zcfs umount {}` first", mp.display(), mp.display());
    }
    Ok(())
}

/// `bin` in $PATH.
fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

/// Mount points in /proc/self/mountinfo (field 5, with octal escapes decoded).
fn mounted_paths() -> Vec<PathBuf> {
    let Ok(s) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return vec![];
    };
    s.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(mountinfo_path)
        .collect()
}

/// A path as mountinfo writes it: the kernel escapes space, tab, newline and backslash
/// as a backslash and three octal digits (`seq_path`'s " \t\n\\"); every such escape
/// is decoded (review 28b: a mount point with a newline was never found).
fn mountinfo_path(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = |c: u8| (b'0'..=b'7').contains(&c);
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|&c| octal(c)) {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, &c| a * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// The read-ahead window of the mount whose device is `dev` ("major:minor", from
/// mountinfo). Never by a stat of the mount point: answered by this process's own FUSE
/// threads, such a stat left the process in D state for ever when it was killed right
/// then (its threads gone, its main thread waiting for the answer: helper-27). Best
/// effort: without the right to write sysfs (not root) the kernel's 128 KiB stays.
fn set_read_ahead(dev: &str, kb: u32) {
    let knob = format!("/sys/class/bdi/{dev}/read_ahead_kb");
    if let Err(e) = std::fs::write(&knob, kb.to_string()) {
        tracing::info!("read-ahead left as it is: {knob}: {e}");
    }
}

/// The mount on top at `mp` (as /proc/self/mountinfo names it: mount id and device),
/// if any.
fn mount_at(mp: &Path) -> Option<(String, String)> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    s.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.len() > 4 && mountinfo_path(f[4]) == mp {
                Some((f[0].to_string(), f[2].to_string()))
            } else {
                None
            }
        })
        .next_back()
}

fn is_mounted(mp: &Path) -> bool {
    match mp.canonicalize() {
        Ok(c) => mounted_paths().contains(&c),
        // A dead FUSE mount cannot be resolved (ENOTCONN): look its path up as given.
        Err(_) => mounted_paths().iter().any(|p| p == mp),
    }
}

/// `-o remount,...`: change the flags of the zcfs mount at `mp` in place (mount(2)
/// with MS_REMOUNT), as mount(8) does for other file systems. The flags the mount has
/// and the options do not name stay as they are (a remount with `ro` keeps `nosuid`).
fn remount(mp: &Path, plan: &MountPlan) -> Result<i32> {
    if !is_mounted(mp) {
        bail!("-o remount: nothing is mounted on {}", mp.display());
    }
    // Not refused: mount(8) passes a remount the fstab line's options too.
    if !plan.fixed_at_mount.is_empty() {
        let fixed = plan.fixed_at_mount.join(",");
        eprintln!(
            "zcfs mount: -o remount of {}: {fixed}: only a new mount applies these; they stay as mounted \
             (a remount changes ro, rw, [no]suid, [no]dev, [no]exec, [no]atime, sync, async, dirsync)",
            mp.display()
        );
        tracing::warn!(options = %fixed, "remount leaves these options as mounted");
    }
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())
        .map_err(|_| anyhow!("mount point {} contains a NUL byte", mp.display()))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        bail!(
            "-o remount: {}: {}",
            mp.display(),
            std::io::Error::last_os_error()
        );
    }
    let has = |f: u64| st.f_flag & f != 0;
    let keep = |on: bool, bit: u64| if on { bit } else { 0 };
    let mut flags: u64 = libc::MS_REMOUNT
        | keep(has(libc::ST_RDONLY), libc::MS_RDONLY)
        | keep(has(libc::ST_NOSUID), libc::MS_NOSUID)
        | keep(has(libc::ST_NODEV), libc::MS_NODEV)
        | keep(has(libc::ST_NOEXEC), libc::MS_NOEXEC)
        | keep(has(libc::ST_NOATIME), libc::MS_NOATIME)
        | keep(has(libc::ST_SYNCHRONOUS), libc::MS_SYNCHRONOUS);
    for o in &plan.mount_options {
        match options::flag_effect(o) {
            Some((bit, true)) => flags |= bit,
            Some((bit, false)) => flags &= !bit,
            None => {}
        }
    }
    // SAFETY: mount(2) with no source, type or data, on a valid C string path.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let hint = if e.raw_os_error() == Some(libc::EPERM) {
            " (remounting needs root)"
        } else {
            ""
        };
        bail!("-o remount of {}: {e}{hint}", mp.display());
    }
    tracing::info!(mountpoint = %mp.display(), read_only = flags & libc::MS_RDONLY != 0, "remounted");
    Ok(0)
}

/// `zcfs umount MOUNTPOINT [--lazy]`.
pub fn run_umount(a: &UmountArgs) -> Result<i32> {
    unmount(&a.mountpoint, a.lazy)
}

/// Unmount `mp`: umount2 as root, fusermount3 otherwise (whose failure is exit status 1).
fn unmount(mp: &Path, lazy: bool) -> Result<i32> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a valid NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
            return Ok(0);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EBUSY) {
            bail!("{} is busy (a process uses it); close it, or detach now with `zcfs umount --lazy {}`", mp.display(), mp.display());
        }
        bail!("unmounting {}: {e}", mp.display());
    }
    let bin = which("fusermount3")
        .or_else(|| which("fusermount"))
        .ok_or_else(|| anyhow!("fusermount3 is missing: apt-get install fuse3"))?;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let st = cmd.arg(mp).status()?;
    Ok(if st.success() { 0 } else { 1 })
}

#[cfg(test)]
mod mountinfo_tests {
    use super::mountinfo_path;
    use std::path::PathBuf;

    #[test]
    fn mountinfo_paths_decode_every_octal_escape() {
        assert_eq!(
            mountinfo_path("/tmp/a\\040b\\011c\\012d\\134e"),
            PathBuf::from("/tmp/a b\tc\nd\\e")
        );
        // Not an escape: kept as it is (too short at the end, not octal, over 255).
        assert_eq!(mountinfo_path("/x\\01"), PathBuf::from("/x\\01"));
        assert_eq!(mountinfo_path("/x\\09a"), PathBuf::from("/x\\09a"));
        assert_eq!(mountinfo_path("/x\\777"), PathBuf::from("/x\\777"));
        assert_eq!(mountinfo_path("/plain"), PathBuf::from("/plain"));
    }
}
