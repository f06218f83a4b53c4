//! The mount options: `-o a,b,c=d` as sshfs takes them, and the flags that repeat a few.

use super::MountArgs;
use anyhow::{anyhow, bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use zcfs_fuse::{FuseOptions, MountOption, SessionACL};

/// What the options of a mount ask for.
#[derive(Debug)]
pub struct MountPlan {
    pub fuse: FuseOptions,
    pub mount_options: Vec<MountOption>,
    pub acl: SessionACL,
    pub threads: usize,
    /// `-o readers=N`: at most N FUSE threads wait for requests at once, the rest wait
    /// to be let in (`zcfs_fuse::read_gate`). None, or N at least `threads`: all of
    /// them, no gate (the default: the gate makes queue-depth reads faster and
    /// metadata slower, `zcfs_fuse::read_gate::QD_READERS`).
    pub readers: Option<usize>,
    pub read_only: bool,
    pub batch_ops: Option<usize>,
    /// `ClientConfig::gather_writes` (`-o gather`, the default, or `nogather`).
    pub gather_writes: bool,
    pub secret_file: Option<PathBuf>,
    pub timeout: Option<Duration>,
    /// `-o integrity=full`: require the server to MAC bulk data too.
    pub integrity: zcfs_protocol::channel::Integrity,
    /// `remount`: change the flags of the existing mount at the mount point.
    pub remount: bool,
    /// The kernel's read-ahead window for the mount (`read_ahead_kb=`).
    pub read_ahead_kb: u32,
    /// `--metrics` / `-o metrics=ADDR:PORT`: answer Prometheus scrapes there.
    pub metrics: Option<String>,
    /// `--l2 IFACE` / `-o l2=IFACE`: offer the server the layer-2 lane on IFACE.
    pub l2: Option<String>,
    /// `-o l2_poll=busy|wait`.
    pub l2_poll: Option<zcfs_client::l2::L2Poll>,
    /// `-o l2_read_max=BYTES`: reads up to this size ride layer 2.
    pub l2_read_max: Option<u32>,
    /// `-o l2_write_max=BYTES`: writes up to this size ride layer 2 (0: none).
    pub l2_write_max: Option<u32>,
    /// `-o l2_land_max=BYTES`: larger writes up to this size land in place (0: none;
    /// default: 1 MiB with `l2_poll=busy`, none with `wait`).
    pub l2_land_max: Option<u32>,
    /// The options given that only a new mount applies (all but the generic mount
    /// flags and the options zcfs ignores): a remount names them as left unchanged.
    pub fixed_at_mount: Vec<String>,
}

/// The read-ahead window a mount asks for by default. The kernel gives a FUSE mount
/// 128 KiB, which leaves a sequential reader waiting for one round trip per 128 KiB;
/// measured on a remote mount (loopback, 512 MiB file, cold cache): 128 KiB read
/// 315-386 MB/s, 1 MiB 664-682, 16 MiB 826-892. The window only grows for sequential
/// readers, so random readers do not pay for it.
pub const READ_AHEAD_KB_DEFAULT: u32 = 16 << 10;
/// FUSE worker threads by default. A request that waits for the server (metadata, a
/// write that must be durable, fsync) holds its thread for the round trip, so the
/// threads bound those in flight. (Reads do not hold one.) Measured with 4 threads
/// against 16 (session 33, veth, 4 rounds): creating 2,000 files took 0.68 s against
/// 0.61, a cold `ls -l` of them 0.097 s against 0.061.
pub const DEFAULT_THREADS: usize = 16;
/// The most threads `-o threads=` and `-o readers=` take.
pub const MAX_THREADS: usize = 64;
/// The largest `read_ahead_kb=` accepted.
pub const READ_AHEAD_KB_MAX: u32 = 256 << 10;

/// A mount option's `-o` name and fuser option.
type Named = (&'static str, MountOption);

/// The generic mount flags zcfs passes on: the mount(2) flag, the option that sets it
/// and the one that clears it (dirsync has none).
#[rustfmt::skip]
const MOUNT_FLAGS: &[(u64, Named, Option<Named>)] = &[
    (libc::MS_RDONLY, ("ro", MountOption::RO), Some(("rw", MountOption::RW))),
    (libc::MS_NOSUID, ("nosuid", MountOption::NoSuid), Some(("suid", MountOption::Suid))),
    (libc::MS_NODEV, ("nodev", MountOption::NoDev), Some(("dev", MountOption::Dev))),
    (libc::MS_NOEXEC, ("noexec", MountOption::NoExec), Some(("exec", MountOption::Exec))),
    (libc::MS_NOATIME, ("noatime", MountOption::NoAtime), Some(("atime", MountOption::Atime))),
    (libc::MS_SYNCHRONOUS, ("sync", MountOption::Sync), Some(("async", MountOption::Async))),
    (libc::MS_DIRSYNC, ("dirsync", MountOption::DirSync), None),
];

/// The fuser option of the generic mount flag `name`.
fn mount_flag(name: &str) -> Option<&'static MountOption> {
    MOUNT_FLAGS
        .iter()
        .flat_map(|(_, set, clear)| std::iter::once(set).chain(clear))
        .find(|(n, _)| *n == name)
        .map(|(_, o)| o)
}

/// What `o` does to the mount(2) flags on a remount: the flag, and whether it is set
/// (or cleared); None for an option that is not a generic mount flag.
pub(super) fn flag_effect(o: &MountOption) -> Option<(u64, bool)> {
    MOUNT_FLAGS.iter().find_map(|(bit, set, clear)| {
        if set.1 == *o {
            Some((*bit, true))
        } else if clear.as_ref().is_some_and(|c| c.1 == *o) {
            Some((*bit, false))
        } else {
            None
        }
    })
}

/// fstab and mount(8) conventions that are not ours to act on (`comment=` takes a
/// value; so may `x-...`).
const FSTAB_CONVENTIONS: &[&str] = &[
    "_netdev", "nofail", "noauto", "auto", "user", "users", "nouser", "defaults",
];

/// Whether option `k` (with value `v`) is an fstab or mount(8) convention.
fn fstab_convention(k: &str, v: Option<&str>) -> bool {
    (v.is_none() && FSTAB_CONVENTIONS.contains(&k))
        || (k == "comment" && v.is_some())
        || k.starts_with("x-")
}

/// Whether option `k` (with value `v`) is one a remount acts on (a generic mount flag,
/// `remount` itself) or one zcfs ignores anyway (generic options, fstab conventions).
fn changes_on_remount(k: &str, v: Option<&str>) -> bool {
    k == "remount"
        || mount_flag(k).is_some()
        || GENERIC_IGNORED.contains(&k)
        || GENERIC_IGNORED_WITH_VALUE.contains(&k)
        || fstab_convention(k, v)
}

/// Generic mount(8) options that ask nothing of zcfs here (atime variants the kernel
/// applies to every mount, LSM contexts, flags FUSE ignores): accepted, logged, not
/// acted on, so fstab lines and tools that pass them work.
const GENERIC_IGNORED: &[&str] = &[
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "iversion",
    "noiversion",
    "mand",
    "nomand",
    "silent",
    "loud",
    "owner",
    "group",
    "symfollow",
    "nosymfollow",
];

/// Generic mount(8) options with a value that zcfs does not act on (SELinux contexts).
const GENERIC_IGNORED_WITH_VALUE: &[&str] = &["context", "fscontext", "defcontext", "rootcontext"];

pub fn parse_options(a: &MountArgs) -> Result<MountPlan> {
    let mut p = MountPlan {
        fuse: FuseOptions::default(),
        mount_options: vec![
            MountOption::FSName(format!("zcfs:{}", a.source)),
            MountOption::Subtype("zcfs".into()),
        ],
        acl: SessionACL::Owner,
        threads: a.threads.unwrap_or(DEFAULT_THREADS),
        readers: None,
        read_only: false,
        batch_ops: None,
        gather_writes: true,
        secret_file: a.secret_file.clone(),
        timeout: None,
        integrity: Default::default(),
        remount: false,
        read_ahead_kb: READ_AHEAD_KB_DEFAULT,
        metrics: a.metrics.clone(),
        l2: a.l2.clone(),
        l2_poll: None,
        l2_read_max: None,
        l2_write_max: None,
        l2_land_max: None,
        fixed_at_mount: Vec::new(),
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
        if !changes_on_remount(k, v) {
            p.fixed_at_mount.push(opt.to_string());
        }
        match (k, v) {
            ("allow_other", None) => p.acl = SessionACL::All,
            ("allow_root", None) => p.acl = SessionACL::RootAndOwner,
            ("default_permissions", None) => {
                p.fuse.default_permissions = true;
                p.mount_options.push(MountOption::DefaultPermissions)
            }
            ("ro", None) => {
                p.read_only = true;
                p.mount_options.push(MountOption::RO)
            }
            (k, None) if mount_flag(k).is_some() => {
                p.mount_options.push(mount_flag(k).expect("checked").clone())
            }
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
            // Buffered writes are sent without waiting (errors at close/fsync, as NFS
            // does); `sync_writes` waits for each.
            ("sync_writes", None) => p.fuse.write_behind = false,
            ("write_behind", None) => p.fuse.write_behind = true,
            // Small buffered writes are gathered and sent several at once (at most
            // GATHER_DELAY late); `nogather` sends each as it comes.
            ("gather", None) => p.gather_writes = true,
            ("nogather", None) => p.gather_writes = false,
            // Large buffered writes' pages go from /dev/fuse into the socket by splice(2);
            // `nosplice` reads them into memory and sends the copy.
            ("splice", None) => p.fuse.splice = true,
            ("nosplice", None) => p.fuse.splice = false,
            ("no_readdirplus", None) => p.fuse.readdirplus = false,
            ("threads", Some(v)) => p.threads = num(k, v)?.clamp(1, MAX_THREADS as u64) as usize,
            ("readers", Some(v)) => {
                p.readers = Some(num(k, v)?.clamp(1, MAX_THREADS as u64) as usize)
            }
            ("attr_timeout" | "entry_timeout", Some(v)) => {
                p.fuse.timeout = Duration::from_secs_f64(v.parse().map_err(|_| anyhow!("-o {k}={v}: not seconds"))?)
            }
            ("read_ahead_kb", Some(v)) => {
                let kb = num(k, v)?;
                if kb > u64::from(READ_AHEAD_KB_MAX) {
                    bail!("-o read_ahead_kb={v}: at most {READ_AHEAD_KB_MAX}");
                }
                p.read_ahead_kb = kb as u32;
            }
            ("max_write", Some(v)) => p.fuse.max_write = num(k, v)?.clamp(4096, 16 << 20) as u32,
            ("batch", Some(v)) => p.batch_ops = Some(num(k, v)?.max(1) as usize),
            ("secret_file", Some(v)) => p.secret_file = Some(v.into()),
            ("metrics", Some(v)) => p.metrics = Some(v.into()),
            ("l2", Some(v)) => p.l2 = Some(v.into()),
            ("l2_poll", Some(v)) => p.l2_poll = Some(v.parse().map_err(|e| anyhow!("-o l2_poll={v}: {e}"))?),
            ("l2_read_max", Some(v)) => p.l2_read_max = Some(num(k, v)?.clamp(1, zcfs_protocol::l2::MAX_READ as u64) as u32),
            ("l2_write_max", Some(v)) => p.l2_write_max = Some(num(k, v)?.min(zcfs_protocol::l2::MAX_WRITE as u64) as u32),
            ("l2_land_max", Some(v)) => p.l2_land_max = Some(num(k, v)?.min(zcfs_protocol::l2::MAX_LANDING_WRITE as u64) as u32),
            ("integrity", Some(v)) => p.integrity = v.parse().map_err(|e| anyhow!("-o integrity={v}: {e}"))?,
            ("timeout", Some(v)) => p.timeout = Some(Duration::from_secs_f64(v.parse().map_err(|_| anyhow!("-o timeout={v}: not seconds"))?)),
            ("remount", None) => p.remount = true,
            // POSIX ACLs are on by default, as on ext4.
            ("acl", None) => p.fuse.acl = true,
            ("noacl", None) => p.fuse.acl = false,
            // LSM labels as plain xattrs (NFS's `seclabel`); by default not carried.
            ("seclabel", None) => p.fuse.seclabel = true,
            ("noseclabel", None) => p.fuse.seclabel = false,
            (k, None) if GENERIC_IGNORED.contains(&k) => {
                tracing::info!("-o {k}: a generic mount option zcfs does not act on; ignored")
            }
            (k, Some(_)) if GENERIC_IGNORED_WITH_VALUE.contains(&k) => {
                tracing::info!("-o {opt}: a generic mount option zcfs does not act on; ignored")
            }
            (k, v) if fstab_convention(k, v) => {}
            _ => bail!(
                "unknown mount option {opt:?}. Known: allow_other, allow_root, default_permissions, ro, rw, \
                 [no]suid, [no]dev, [no]exec, [no]atime, sync, async, dirsync, uid=, gid=, umask=, fsname=, \
                 subtype=, cache=none|metadata|auto|always, writeback, direct_io, no_readdirplus, threads=, readers=, \
                 attr_timeout=, max_write=, read_ahead_kb=, batch=, [no]gather, secret_file=, timeout=, integrity=headers|full, [no]acl, [no]seclabel, metrics=, l2=, l2_poll=busy|wait, l2_read_max=, l2_write_max=, l2_land_max="
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

#[cfg(test)]
mod tests {
    use super::*;
    use zcfs_fuse::CacheMode;

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
            metrics: None,
            l2: None,
        }
    }

    #[test]
    fn threads_and_readers_are_bounded() {
        let p = parse_options(&args("")).unwrap();
        assert_eq!((p.threads, p.readers), (DEFAULT_THREADS, None));
        let p = parse_options(&args("threads=0,readers=0")).unwrap();
        assert_eq!((p.threads, p.readers), (1, Some(1)));
        let p = parse_options(&args("threads=64,readers=64")).unwrap();
        assert_eq!((p.threads, p.readers), (MAX_THREADS, Some(MAX_THREADS)));
        let p = parse_options(&args("threads=65,readers=65")).unwrap();
        assert_eq!((p.threads, p.readers), (MAX_THREADS, Some(MAX_THREADS)));
    }

    #[test]
    fn l2_options_name_the_interface_poll_and_threshold() {
        let p = parse_options(&args("l2=veth0,l2_poll=busy,l2_read_max=8192")).unwrap();
        assert_eq!(p.l2.as_deref(), Some("veth0"));
        assert_eq!(p.l2_poll, Some(zcfs_client::l2::L2Poll::Busy));
        assert_eq!(p.l2_read_max, Some(8192));
        // The threshold is bounded by what one layer-2 read carries.
        let p = parse_options(&args("l2_read_max=999999999")).unwrap();
        assert_eq!(p.l2_read_max, Some(zcfs_protocol::l2::MAX_READ));
        // Writes: bounded by what one layer-2 request carries; 0 keeps them on TCP.
        let p = parse_options(&args("l2_write_max=4096")).unwrap();
        assert_eq!(p.l2_write_max, Some(4096));
        let p = parse_options(&args("l2_write_max=999999999")).unwrap();
        assert_eq!(p.l2_write_max, Some(zcfs_protocol::l2::MAX_WRITE));
        let p = parse_options(&args("l2_write_max=0")).unwrap();
        assert_eq!(p.l2_write_max, Some(0));
        // At the bound, above it (clamped) and off.
        let most = zcfs_protocol::l2::MAX_LANDING_WRITE;
        let p = parse_options(&args(&format!("l2_land_max={most}"))).unwrap();
        assert_eq!(p.l2_land_max, Some(most));
        let p = parse_options(&args(&format!("l2_land_max={}", most as u64 + 1))).unwrap();
        assert_eq!(p.l2_land_max, Some(most));
        let p = parse_options(&args("l2_land_max=0")).unwrap();
        assert_eq!(p.l2_land_max, Some(0));
        assert!(parse_options(&args("l2_poll=sometimes")).is_err());
    }

    #[test]
    fn metrics_option_gives_the_scrape_address() {
        let p = parse_options(&args("metrics=127.0.0.1:9471,ro")).unwrap();
        assert_eq!(p.metrics.as_deref(), Some("127.0.0.1:9471"));
        assert_eq!(parse_options(&args("ro")).unwrap().metrics, None);
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

    #[test]
    fn a_remount_knows_which_options_only_a_new_mount_applies() {
        let p = parse_options(&args(
            "remount,ro,nosuid,relatime,_netdev,x-systemd.automount",
        ))
        .unwrap();
        assert!(p.fixed_at_mount.is_empty(), "{:?}", p.fixed_at_mount);
        let p = parse_options(&args("remount,rw,seclabel,noacl,cache=none")).unwrap();
        assert_eq!(p.fixed_at_mount, ["seclabel", "noacl", "cache=none"]);
    }

    #[test]
    fn security_labels_are_carried_only_when_asked() {
        assert!(!parse_options(&args("rw")).unwrap().fuse.seclabel);
        assert!(parse_options(&args("seclabel")).unwrap().fuse.seclabel);
        assert!(
            !parse_options(&args("seclabel,noseclabel"))
                .unwrap()
                .fuse
                .seclabel
        );
    }

    #[test]
    fn generic_mount_options_are_accepted_and_remount_is_recognised() {
        let all = GENERIC_IGNORED.join(",") + ",acl,context=system_u:object_r:tmp_t:s0";
        assert!(parse_options(&args(&all)).is_ok(), "{all}");
        let p = parse_options(&args("remount,ro,nosuid")).unwrap();
        assert!(p.remount && p.read_only);
        assert!(!parse_options(&args("rw")).unwrap().remount);
    }
}
