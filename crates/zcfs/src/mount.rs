//! `zcfs mount` / `zcfs umount` and the `mount.fuse.zcfs` helper.

use crate::backend::{client_config, OpenedBackend};
use crate::process::{sd_notify, spawn_detached, ChildReport, ReadyPipe, StopSignals};
use crate::source::Source;
use anyhow::{anyhow, bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use zcfs_fuse::{CacheMode, Config, FuseFs, FuseOptions, MountOption, SessionACL};

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
    /// FUSE worker threads (default 4).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Return once the mount is live, leaving it running in the background.
    #[arg(long)]
    pub daemon: bool,
    /// Shared secret for a remote SOURCE that requires one.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
}

#[derive(Debug)]
struct Parsed {
    fuse: FuseOptions,
    mount_options: Vec<MountOption>,
    acl: SessionACL,
    threads: usize,
    read_only: bool,
    batch_ops: Option<usize>,
    secret_file: Option<PathBuf>,
    timeout: Option<Duration>,
}

fn parse_options(a: &MountArgs) -> Result<Parsed> {
    let mut p = Parsed {
        fuse: FuseOptions::default(),
        mount_options: vec![
            MountOption::FSName(format!("zcfs:{}", a.source)),
            MountOption::Subtype("zcfs".into()),
        ],
        acl: SessionACL::Owner,
        threads: a.threads.unwrap_or(4),
        read_only: false,
        batch_ops: None,
        secret_file: a.secret_file.clone(),
        timeout: None,
    };
    let num = |k: &str, v: &str| -> Result<u64> {
        v.parse().map_err(|_| anyhow!("-o {k}={v}: not a number"))
    };
    for opt in a
        .options
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty())
    {
        let (k, v) = opt
            .split_once('=')
            .map_or((opt, None), |(k, v)| (k, Some(v)));
        match (k, v) {
            ("allow_other", None) => p.acl = SessionACL::All,
            ("allow_root", None) => p.acl = SessionACL::RootAndOwner,
            ("default_permissions", None) => p.mount_options.push(MountOption::DefaultPermissions),
            ("ro", None) => {
                p.read_only = true;
                p.mount_options.push(MountOption::RO)
            }
            ("rw", None) => p.mount_options.push(MountOption::RW),
            ("suid", None) => p.mount_options.push(MountOption::Suid),
            ("nosuid", None) => p.mount_options.push(MountOption::NoSuid),
            ("dev", None) => p.mount_options.push(MountOption::Dev),
            ("nodev", None) => p.mount_options.push(MountOption::NoDev),
            ("exec", None) => p.mount_options.push(MountOption::Exec),
            ("noexec", None) => p.mount_options.push(MountOption::NoExec),
            ("atime", None) => p.mount_options.push(MountOption::Atime),
            ("noatime", None) => p.mount_options.push(MountOption::NoAtime),
            ("sync", None) => p.mount_options.push(MountOption::Sync),
            ("async", None) => p.mount_options.push(MountOption::Async),
            ("dirsync", None) => p.mount_options.push(MountOption::DirSync),
            ("uid", Some(v)) => p.fuse.uid = Some(num(k, v)? as u32),
            ("gid", Some(v)) => p.fuse.gid = Some(num(k, v)? as u32),
            ("umask", Some(v)) => {
                p.fuse.umask = Some(u32::from_str_radix(v, 8).map_err(|_| anyhow!("-o umask={v}: not an octal mask"))?)
            }
            ("fsname", Some(v)) => p.mount_options[0] = MountOption::FSName(v.into()),
            ("subtype", Some(v)) => p.mount_options[1] = MountOption::Subtype(v.into()),
            ("cache", Some(v)) => p.fuse.cache = v.parse().map_err(|e: String| anyhow!(e))?,
            ("writeback" | "writeback_cache", None) => p.fuse.writeback = true,
            ("direct_io", None) => p.fuse.direct_io = true,
            ("no_readdirplus", None) => p.fuse.readdirplus = false,
            ("threads", Some(v)) => p.threads = num(k, v)?.clamp(1, 64) as usize,
            ("attr_timeout" | "entry_timeout", Some(v)) => {
                p.fuse.timeout = Duration::from_secs_f64(v.parse().map_err(|_| anyhow!("-o {k}={v}: not seconds"))?)
            }
            ("max_write", Some(v)) => p.fuse.max_write = num(k, v)?.clamp(4096, 16 << 20) as u32,
            ("batch", Some(v)) => p.batch_ops = Some(num(k, v)?.max(1) as usize),
            ("secret_file", Some(v)) => p.secret_file = Some(v.into()),
            ("timeout", Some(v)) => p.timeout = Some(Duration::from_secs_f64(v.parse().map_err(|_| anyhow!("-o timeout={v}: not seconds"))?)),
            // fstab and mount(8) conventions that are not ours to act on.
            ("_netdev" | "nofail" | "noauto" | "auto" | "user" | "users" | "nouser" | "defaults", None) => {}
            ("comment", Some(_)) => {}
            (k, _) if k.starts_with("x-systemd.") || k.starts_with("x-") => {}
            _ => bail!(
                "unknown mount option {opt:?}. Known: allow_other, allow_root, default_permissions, ro, rw, \
                 [no]suid, [no]dev, [no]exec, [no]atime, sync, async, dirsync, uid=, gid=, umask=, fsname=, \
                 subtype=, cache=none|metadata|auto|always, writeback, direct_io, no_readdirplus, threads=, \
                 attr_timeout=, max_write=, batch=, secret_file=, timeout="
            ),
        }
    }
    if let Some(c) = a.cache {
        p.fuse.cache = c;
    }
    p.fuse.writeback |= a.writeback;
    p.fuse.direct_io |= a.direct_io;
    if p.acl == SessionACL::All && !p.mount_options.contains(&MountOption::DefaultPermissions) {
        tracing::warn!(
            "allow_other without default_permissions: the kernel will not check permissions"
        );
    }
    Ok(p)
}

/// Mount points in /proc/self/mountinfo (field 5, with octal escapes decoded).
fn mounted_paths() -> Vec<PathBuf> {
    let Ok(s) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return vec![];
    };
    s.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| {
            PathBuf::from(
                p.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\134", "\\"),
            )
        })
        .collect()
}

pub fn is_mounted(mp: &Path) -> bool {
    match mp.canonicalize() {
        Ok(c) => mounted_paths().contains(&c),
        // A dead FUSE mount cannot be resolved (ENOTCONN): look its path up as given.
        Err(_) => mounted_paths().iter().any(|p| p == mp),
    }
}

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

fn which(bin: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

/// The backend to mount; `-o ro` and `-o batch=` apply to a volume, `-o secret_file=`
/// and `-o timeout=` to a server.
fn open(source: &Source, p: &Parsed) -> Result<OpenedBackend> {
    match source {
        Source::Null => Ok(OpenedBackend::null()),
        Source::Image(image) => {
            let mut cfg = zcfs_volume::VolumeConfig {
                read_only: p.read_only,
                ..Default::default()
            };
            if let Some(b) = p.batch_ops {
                cfg.batch_ops = b;
            }
            OpenedBackend::volume(image, cfg)
        }
        Source::Remote(addr) => {
            let connect = || {
                let mut cfg = client_config(addr, p.secret_file.as_deref())?;
                if let Some(t) = p.timeout {
                    cfg.timeout = t;
                }
                OpenedBackend::remote(cfg)
            };
            connect().with_context(|| {
                format!(
                    "{addr} is neither `null`, an existing volume image, nor a reachable HOST:PORT"
                )
            })
        }
    }
}

/// Run a mount in the foreground until unmounted or signalled.
pub fn mount(a: &MountArgs) -> Result<i32> {
    if a.daemon {
        return daemonize(a);
    }
    // Set when a `--daemon` parent waits for us.
    let mut ready_pipe = ReadyPipe::from_env();
    let result = mount_until_unmounted(a, &mut ready_pipe);
    if let (Err(e), Some(pipe)) = (&result, ready_pipe) {
        pipe.failed(e);
    }
    result
}

/// Mount, report readiness (taking `ready_pipe`), serve until unmounted or signalled,
/// and close the volume.
fn mount_until_unmounted(a: &MountArgs, ready_pipe: &mut Option<ReadyPipe>) -> Result<i32> {
    let p = parse_options(a)?;
    preflight(&a.mountpoint)?;
    let source: Source = a.source.parse()?;
    let signals = StopSignals::block();
    let OpenedBackend { backend, volume } = open(&source, &p)?;
    let fs = FuseFs::new(backend.clone(), p.fuse.clone());
    let stats = fs.stats.clone();
    let mut config = Config::default();
    config.mount_options = p.mount_options.clone();
    config.acl = p.acl;
    config.n_threads = Some(p.threads);
    config.clone_fd = true;
    let session = zcfs_fuse::spawn(fs, &a.mountpoint, &config).map_err(|e| {
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                " (allow_other as a non-root user needs user_allow_other in /etc/fuse.conf)"
            }
            Some(libc::ENODEV) => " (is the fuse module loaded? `modprobe fuse`)",
            _ => "",
        };
        anyhow!("mounting {source} on {}: {e}{hint}", a.mountpoint.display())
    })?;
    tracing::info!(%source, mountpoint = %a.mountpoint.display(), threads = p.threads, "mounted");
    if let Some(pipe) = ready_pipe.take() {
        pipe.ready();
    }
    sd_notify("READY=1");
    let mut signalled = None;
    while !session.guard.is_finished() {
        if let Some(sig) = signals.wait(Duration::from_millis(200)) {
            signalled = Some(sig);
            break;
        }
    }
    sd_notify("STOPPING=1");
    if let Some(sig) = signalled {
        tracing::info!(sig, "signal received: unmounting");
        if let Err(e) = session.umount_and_join() {
            tracing::warn!("unmount: {e}");
        }
    } else if let Err(e) = session.join() {
        tracing::warn!("session ended: {e}");
    }
    // Files still open keep a plain unmount from succeeding: detach, as libfuse does,
    // so no mount outlives its process.
    if is_mounted(&a.mountpoint) {
        if let Err(e) = umount(&a.mountpoint, true) {
            tracing::warn!("lazy unmount of {}: {e:#}", a.mountpoint.display());
        }
    }
    let s = backend.copy_stats();
    let f = &stats;
    use std::sync::atomic::Ordering::Relaxed;
    tracing::info!(
        requests = f.requests.load(Relaxed),
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

/// `--daemon`: run the mount in a detached child; return once it is live.
fn daemonize(a: &MountArgs) -> Result<i32> {
    let mut args: Vec<OsString> = std::env::args_os()
        .skip(1)
        .filter(|x| x != "--daemon")
        .collect();
    if std::env::args()
        .next()
        .is_some_and(|a0| a0.ends_with("mount.fuse.zcfs"))
    {
        args = vec![
            "mount".into(),
            a.source.clone().into(),
            a.mountpoint.clone().into(),
        ];
        for o in &a.options {
            args.extend(["-o".into(), o.into()]);
        }
    }
    match spawn_detached(&args).context("starting the mount process")? {
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

/// `zcfs umount MOUNTPOINT`.
pub fn umount(mp: &Path, lazy: bool) -> Result<i32> {
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

/// argv[0] == mount.fuse.zcfs: `mount.fuse.zcfs SOURCE MOUNTPOINT [-o opts] [-n -s -v -f]`,
/// as mount(8) calls it for `-t fuse.zcfs` and fstab lines.
pub fn helper_main(args: Vec<String>) -> Result<i32> {
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut it = args.into_iter();
    while let Some(x) = it.next() {
        match x.as_str() {
            "-o" => options.push(it.next().ok_or_else(|| anyhow!("-o needs a value"))?),
            "-n" | "-s" | "-v" | "-f" | "-i" => {}
            _ if x.starts_with("-o") => options.push(x[2..].to_string()),
            _ => pos.push(x),
        }
    }
    let [source, mountpoint] = <[String; 2]>::try_from(pos)
        .map_err(|_| anyhow!("usage: mount.fuse.zcfs SOURCE MOUNTPOINT [-o OPTIONS]"))?;
    mount(&MountArgs {
        source,
        mountpoint: mountpoint.into(),
        options,
        cache: None,
        writeback: false,
        direct_io: false,
        threads: None,
        daemon: true,
        secret_file: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(o: &str) -> MountArgs {
        MountArgs {
            source: "null".into(),
            mountpoint: "/mnt".into(),
            options: vec![o.into()],
            cache: None,
            writeback: false,
            direct_io: false,
            threads: None,
            daemon: false,
            secret_file: None,
        }
    }

    #[test]
    fn options_parse_like_sshfs() {
        let p = parse_options(&args("allow_other,default_permissions,uid=1000,gid=100,umask=022,cache=metadata,_netdev,nofail,x-systemd.automount,threads=8")).unwrap();
        assert_eq!(p.acl, SessionACL::All);
        assert!(p.mount_options.contains(&MountOption::DefaultPermissions));
        assert_eq!(
            (p.fuse.uid, p.fuse.gid, p.fuse.umask),
            (Some(1000), Some(100), Some(0o22))
        );
        assert_eq!(p.fuse.cache, CacheMode::Metadata);
        assert_eq!(p.threads, 8);
        assert!(parse_options(&args("bogus"))
            .unwrap_err()
            .to_string()
            .contains("unknown mount option"));
        assert!(parse_options(&args("umask=9z")).is_err());
        assert!(parse_options(&args("ro")).unwrap().read_only);
    }
}
