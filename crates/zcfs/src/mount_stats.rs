//! A mount's live figures: per FUSE operation counts, errors and latency histograms,
//! as a report (`zcfs stat MOUNTPOINT`, asked over a Unix socket the mount process
//! listens on) and in the Prometheus text format (`zcfs mount --metrics`).
//!
//! The socket is `SOCKET_DIR/mounts/MAJOR:MINOR.sock` (root's mounts; another user's in
//! `$XDG_RUNTIME_DIR/zcfs/mounts/`): a directory of their own, so no server's default
//! socket (`SOCKET_DIR/NAME.sock`, NAME an image's stem) can have a mount's name. It is
//! named by the mount's device number, which stat(2) of any
//! directory in the mount gives. Mode 0600 and a peer credential check: only root and
//! the mount's owner ask. It goes when the mount process ends; a killed process leaves
//! it behind, which the next mount with that device number replaces and `zcfs stat`
//! reports as stale.

use crate::cmd::serve::SOCKET_DIR;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_fuse::FuseStats;
use zcfs_metrics::{Exposition, OpReport};

/// The most bytes of a request on the stat socket (`json\n` or `prometheus\n`).
pub const STAT_REQUEST_MAX: usize = 64;
/// How long a peer of the stat socket may take to ask and to take the answer.
pub const STAT_DEADLINE: Duration = Duration::from_secs(5);
/// The most bytes `zcfs stat` reads of an answer.
pub const STAT_ANSWER_MAX: u64 = 16 << 20;

/// What `zcfs stat MOUNTPOINT` shows.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MountReport {
    pub source: String,
    pub mountpoint: String,
    pub pid: u32,
    /// Requests answered (every operation's count).
    pub requests: u64,
    pub payload_bytes_read: u64,
    pub payload_bytes_written: u64,
    /// Bytes copied in user space by the FUSE frontend.
    pub fuse_user_copy_bytes: u64,
    /// Written bytes moved from /dev/fuse into the socket by splice(2), never copied.
    #[serde(default)]
    pub spliced_write_bytes: u64,
    /// Small writes of a remote mount that went out gathered, and the sends that
    /// carried them (`-o gather`, the default).
    #[serde(default)]
    pub gathered_writes: u64,
    #[serde(default)]
    pub gather_sends: u64,
    /// The operations that ran, by name.
    pub ops: BTreeMap<String, OpReport>,
    /// The layer-2 lane of a remote mount that asked for one (`--l2`): state and
    /// requests per path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<zcfs_metrics::LaneReport>,
}

pub fn report(
    stats: &FuseStats,
    source: &str,
    mountpoint: &Path,
    client: Option<&zcfs_client::Client>,
) -> MountReport {
    let ops: BTreeMap<String, OpReport> = zcfs_fuse::metrics::ran(&stats.ops)
        .iter()
        .map(|(name, s)| (name.to_string(), OpReport::from(s)))
        .collect();
    MountReport {
        source: source.into(),
        mountpoint: mountpoint.display().to_string(),
        pid: std::process::id(),
        requests: ops.values().map(|o| o.count).sum(),
        payload_bytes_read: stats.read_bytes.load(Relaxed),
        payload_bytes_written: stats.write_bytes.load(Relaxed),
        fuse_user_copy_bytes: stats.user_copy_bytes.load(Relaxed),
        spliced_write_bytes: stats.spliced_write_bytes.load(Relaxed),
        gathered_writes: client.map_or(0, |c| c.gathered_writes().0),
        gather_sends: client.map_or(0, |c| c.gathered_writes().1),
        ops,
        l2: client.and_then(|c| c.lane_report()),
    }
}

/// The mount's figures in the Prometheus text format (`zcfs_mount_*`; the lane's
/// `zcfs_mount_l2_*` and `zcfs_mount_path_requests_total` with `--l2`).
pub fn prometheus(stats: &FuseStats, client: Option<&zcfs_client::Client>) -> String {
    let mut e = Exposition::new();
    e.counter(
        "zcfs_mount_payload_read_bytes_total",
        "Payload bytes read through the mount.",
        stats.read_bytes.load(Relaxed),
    );
    e.counter(
        "zcfs_mount_payload_written_bytes_total",
        "Payload bytes written through the mount.",
        stats.write_bytes.load(Relaxed),
    );
    e.counter(
        "zcfs_mount_user_copy_bytes_total",
        "Bytes copied in user space by the FUSE frontend.",
        stats.user_copy_bytes.load(Relaxed),
    );
    e.counter(
        "zcfs_mount_spliced_write_bytes_total",
        "Written bytes moved from /dev/fuse into the socket by splice(2), never copied.",
        stats.spliced_write_bytes.load(Relaxed),
    );
    if let Some(c) = client {
        let (writes, sends) = c.gathered_writes();
        e.counter(
            "zcfs_mount_gathered_writes_total",
            "Small writes that went out gathered, several in one send.",
            writes,
        );
        e.counter(
            "zcfs_mount_gather_sends_total",
            "Sends that carried gathered writes.",
            sends,
        );
    }
    e.ops("zcfs_mount", &zcfs_fuse::metrics::ran(&stats.ops), false);
    if let Some(lane) = client.and_then(|c| c.lane_report()) {
        lane.prometheus(&mut e, "zcfs_mount");
    }
    e.finish()
}

/// The subdirectory of SOCKET_DIR (and of `$XDG_RUNTIME_DIR/zcfs`) for mounts' sockets.
pub const MOUNT_SOCKET_SUBDIR: &str = "mounts";

/// Where this process puts its mounts' sockets: `SOCKET_DIR/mounts` as root, else
/// `$XDG_RUNTIME_DIR/zcfs/mounts` (None without it).
fn own_socket_dir() -> Option<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from(SOCKET_DIR).join(MOUNT_SOCKET_SUBDIR));
    }
    std::env::var_os("XDG_RUNTIME_DIR")
        .map(|d| PathBuf::from(d).join("zcfs").join(MOUNT_SOCKET_SUBDIR))
}

/// Where `zcfs stat` looks, in order: root's directory, then the caller's own.
fn socket_dirs() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from(SOCKET_DIR).join(MOUNT_SOCKET_SUBDIR)];
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        v.push(PathBuf::from(d).join("zcfs").join(MOUNT_SOCKET_SUBDIR));
    }
    v
}

fn socket_name(dev: &str) -> String {
    format!("{dev}.sock")
}

/// A mount's stat socket, answered on a thread of its own; removed when dropped.
pub struct StatSocket {
    path: PathBuf,
    /// The socket file's identity (inode, change time): once the mount is gone its
    /// device number is free, and the next mount's socket may have the same name (and,
    /// on tmpfs, even the inode number); that one is left alone.
    id: FileId,
    /// The listening socket, owned by the thread until it ends: `Drop` shuts it down to
    /// wake the thread's accept (waking it by connecting to the path would reach
    /// whatever socket has that name now, or nothing).
    listen_fd: std::os::fd::RawFd,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatSocket {
    /// Listen for the mount with device `dev` (MAJOR:MINOR); `answer(prometheus)`
    /// renders the answer.
    pub fn listen(
        dev: &str,
        answer: impl Fn(bool) -> String + Send + 'static,
    ) -> Result<StatSocket> {
        let dir = own_socket_dir()
            .ok_or_else(|| anyhow!("no directory for the stat socket: XDG_RUNTIME_DIR is unset"))?;
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&dir)
                .with_context(|| format!("creating {}", dir.display()))?;
        }
        let path = dir.join(socket_name(dev));
        // The device number is ours while we are mounted: a socket of that name is a
        // killed mount's (nobody answers), or one of a mount that just ended whose
        // process has not removed it yet. Either way it is replaced.
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(anyhow!(e).context(format!("removing the old {}", path.display())))
            }
            _ => {}
        }
        let listener =
            UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("chmod 0600 {}", path.display()))?;
        let id = file_id(&path).with_context(|| format!("stat {}", path.display()))?;
        let listen_fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("zcfs-stat".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stopping.load(Relaxed) {
                        break;
                    }
                    match conn {
                        Ok(c) => {
                            if let Err(e) = serve_one(c, &answer) {
                                tracing::debug!("stat socket: {e:#}");
                            }
                        }
                        // No descriptors left, say: wait a little rather than spin.
                        Err(_) => std::thread::sleep(Duration::from_millis(100)),
                    }
                }
            })?;
        Ok(StatSocket {
            path,
            id,
            listen_fd,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for StatSocket {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        // SAFETY: the descriptor is the listener the thread still owns (it closes it
        // only after seeing `stop`, which it can see only once this accept returns);
        // shutdown makes a blocked accept fail at once, whatever holds the path now.
        unsafe { libc::shutdown(self.listen_fd, libc::SHUT_RDWR) };
        if file_id(&self.path).ok() == Some(self.id) {
            let _ = std::fs::remove_file(&self.path);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type FileId = (u64, i64, i64);

fn file_id(path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Answer one peer: root or our own user, one request line, within the bounds.
fn serve_one(mut c: UnixStream, answer: &impl Fn(bool) -> String) -> Result<()> {
    let uid = zcfs_transport::peer_cred(&c)?.uid;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if uid != 0 && uid != me {
        let _ = c.write_all(b"error: only root and the mount's owner may ask\n");
        bail!("peer uid {uid} refused");
    }
    let deadline = Instant::now() + STAT_DEADLINE;
    let mut buf = [0u8; STAT_REQUEST_MAX];
    let mut len = 0;
    let line = loop {
        if let Some(end) = buf[..len].iter().position(|&b| b == b'\n') {
            break &buf[..end];
        }
        if len == buf.len() {
            bail!("request longer than {STAT_REQUEST_MAX} bytes");
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("peer stalled");
        }
        c.set_read_timeout(Some(left))?;
        match c.read(&mut buf[len..])? {
            0 => bail!("peer closed before asking"),
            n => len += n,
        }
    };
    let body = match line {
        b"json" => answer(false),
        b"prometheus" => answer(true),
        other => format!(
            "error: unknown request {:?}: ask `json` or `prometheus`\n",
            String::from_utf8_lossy(other)
        ),
    };
    let left = deadline.saturating_duration_since(Instant::now());
    c.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    c.write_all(body.as_bytes())?;
    Ok(())
}

/// The device number of `dir` (MAJOR:MINOR).
fn device_of(dir: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(dir) {
        Ok(m) => {
            let dev = m.dev();
            Ok(format!("{}:{}", libc::major(dev), libc::minor(dev)))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => bail!(
            "{}: a FUSE mount whose process is gone (transport endpoint not connected): \
             nothing to ask; unmount it with `zcfs umount {}`",
            dir.display(),
            dir.display()
        ),
        Err(e) => bail!("{}: {e}", dir.display()),
    }
}

/// The file system type of the mount with device `dev` (from /proc/self/mountinfo).
fn fstype_of(dev: &str) -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    s.lines()
        .filter(|l| l.split(' ').nth(2) == Some(dev))
        .filter_map(|l| l.split(" - ").nth(1)?.split(' ').next().map(String::from))
        .next_back()
}

/// Why no candidate socket answered.
#[derive(Debug)]
enum Unanswered {
    /// Nobody listens on it (the first such).
    Stale(PathBuf),
    Denied(PathBuf),
    Other(PathBuf, std::io::Error),
}

/// Connect to the first of `candidates` that answers. A stale socket (root's killed
/// mount, say) must not hide the live socket of a user's mount with that device number,
/// so stale ones are passed over; a refusal for permission or another error ends the
/// search (that socket is live but not ours to ask).
fn first_answering(candidates: &[PathBuf]) -> Result<(UnixStream, PathBuf), Unanswered> {
    let mut stale = None;
    for path in candidates {
        match UnixStream::connect(path) {
            Ok(s) => return Ok((s, path.clone())),
            Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => {
                stale.get_or_insert_with(|| path.clone());
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(Unanswered::Denied(path.clone()))
            }
            Err(e) => return Err(Unanswered::Other(path.clone(), e)),
        }
    }
    Err(Unanswered::Stale(stale.unwrap_or_else(|| {
        candidates.first().cloned().unwrap_or_default()
    })))
}

/// Ask the mount that holds directory `dir` for its figures (`prometheus`: as text in
/// that format; else as a JSON MountReport).
pub fn ask(dir: &Path, prometheus: bool) -> Result<String> {
    let dev = device_of(dir)?;
    let fstype = fstype_of(&dev).unwrap_or_else(|| "unknown".into());
    if !fstype.starts_with("fuse") {
        bail!(
            "{} is a directory on a {fstype} file system, not in a zcfs mount: `zcfs stat` takes a zcfs mount point, a volume image or a server's address",
            dir.display()
        );
    }
    let name = socket_name(&dev);
    let candidates: Vec<PathBuf> = socket_dirs()
        .into_iter()
        .map(|d| d.join(&name))
        .filter(|p| p.exists())
        .collect();
    if candidates.is_empty() {
        bail!(
            "{} is a FUSE mount ({fstype}, device {dev}) without a zcfs stat socket ({SOCKET_DIR}/{MOUNT_SOCKET_SUBDIR}/{name}): not a zcfs mount, one still starting, or one whose mount process predates `zcfs stat MOUNTPOINT`",
            dir.display()
        );
    }
    let (mut c, path) = first_answering(&candidates).map_err(|e| match e {
        Unanswered::Stale(path) => anyhow!(
            "{}: its stat socket {} is stale, nobody answers it: the mount process is gone (killed?). \
             If it is still mounted, `zcfs umount --lazy {}`; the next mount with device {dev} replaces the socket",
            dir.display(),
            path.display(),
            dir.display()
        ),
        Unanswered::Denied(path) => anyhow!(
            "{}: permission denied: only root and the user who mounted {} may ask",
            path.display(),
            dir.display()
        ),
        Unanswered::Other(path, e) => anyhow!("{}: {e}", path.display()),
    })?;
    c.set_read_timeout(Some(STAT_DEADLINE))?;
    c.set_write_timeout(Some(STAT_DEADLINE))?;
    c.write_all(if prometheus {
        b"prometheus\n"
    } else {
        b"json\n"
    })?;
    let mut out = String::new();
    c.take(STAT_ANSWER_MAX)
        .read_to_string(&mut out)
        .with_context(|| format!("reading the answer of {}", path.display()))?;
    if let Some(e) = out.strip_prefix("error: ") {
        bail!("{}: {}", path.display(), e.trim_end());
    }
    Ok(out)
}

/// `zcfs stat MOUNTPOINT`.
pub fn mount_stat(dir: &Path, json: bool) -> Result<i32> {
    let raw = ask(dir, false)?;
    let r: MountReport = serde_json::from_str(&raw)
        .with_context(|| format!("the answer of the mount at {}", dir.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", format_mount_report(&r));
    }
    Ok(0)
}

pub fn format_mount_report(r: &MountReport) -> String {
    let lane = r.l2.as_ref().map(|l| l.text()).unwrap_or_default();
    format!(
        "mount       {} on {} (pid {})\n\
         requests    {}; payload {} bytes read, {} written; {} bytes copied in user space, {} spliced; \
         {} small writes gathered into {} sends\n{lane}{}",
        r.source,
        r.mountpoint,
        r.pid,
        r.requests,
        r.payload_bytes_read,
        r.payload_bytes_written,
        r.fuse_user_copy_bytes,
        r.spliced_write_bytes,
        r.gathered_writes,
        r.gather_sends,
        crate::server_report::format_ops(&r.ops, false)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ask over a connected pair (our own uid, so the peer check passes).
    fn exchange(request: &[u8]) -> (Result<()>, String) {
        let (mut client, server) = UnixStream::pair().unwrap();
        client.write_all(request).unwrap();
        let r = serve_one(server, &|prometheus| {
            if prometheus { "text\n" } else { "{}" }.to_string()
        });
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut out = String::new();
        let _ = client.read_to_string(&mut out);
        (r, out)
    }

    #[test]
    fn a_request_at_the_size_bound_is_answered_one_byte_more_is_refused() {
        let (r, out) = exchange(b"json\n");
        assert!(r.is_ok());
        assert_eq!(out, "{}");
        assert_eq!(exchange(b"prometheus\n").1, "text\n");
        // A line of exactly STAT_REQUEST_MAX bytes (newline included) is read and
        // answered (an unknown request); one byte more is refused unanswered.
        let mut at = vec![b'x'; STAT_REQUEST_MAX - 1];
        at.push(b'\n');
        let (r, out) = exchange(&at);
        assert!(r.is_ok());
        assert!(out.starts_with("error: unknown request"), "{out}");
        let mut over = vec![b'x'; STAT_REQUEST_MAX];
        over.push(b'\n');
        let (r, out) = exchange(&over);
        assert!(
            r.unwrap_err().to_string().contains("longer than"),
            "refused"
        );
        assert_eq!(out, "");
    }

    #[test]
    fn a_peer_that_closes_before_asking_is_an_error_not_a_hang() {
        let (client, server) = UnixStream::pair().unwrap();
        drop(client);
        let r = serve_one(server, &|_| String::new());
        assert!(r.unwrap_err().to_string().contains("closed before asking"));
    }

    /// Drop `s` on a thread of its own; whether that drop ends within twice the
    /// deadline (a scrape in progress may hold it up to STAT_DEADLINE; none is here).
    fn drop_ends(s: StatSocket) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(s);
            let _ = tx.send(());
        });
        rx.recv_timeout(2 * STAT_DEADLINE).is_ok()
    }

    /// A device number no real mount has, unique to this test process.
    fn fake_dev(n: u32) -> String {
        format!("4095:{}", std::process::id() * 4 + n)
    }

    #[test]
    fn dropping_a_stat_socket_replaced_by_the_next_mount_ends() {
        let dev = fake_dev(1);
        let old = StatSocket::listen(&dev, |_| "old\n".into()).unwrap();
        // The old mount's device number is free again and the next mount takes it
        // (the case `id` is kept for): it replaces the socket file.
        let new = StatSocket::listen(&dev, |_| "new\n".into()).unwrap();
        let old_ended = drop_ends(old);
        let new_path = new.path.clone();
        assert!(new_path.exists(), "the new mount's socket is left alone");
        let new_ended = drop_ends(new);
        assert!(old_ended, "dropping the replaced stat socket hangs forever");
        assert!(new_ended);
    }

    #[test]
    fn dropping_a_stat_socket_whose_file_was_removed_ends() {
        let s = StatSocket::listen(&fake_dev(2), |_| String::new()).unwrap();
        std::fs::remove_file(&s.path).unwrap();
        assert!(drop_ends(s), "dropping the stat socket hangs forever");
    }

    #[test]
    fn a_stale_socket_does_not_hide_a_live_one_after_it() {
        let dir = std::env::temp_dir().join(format!("zcfs-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (stale, live) = (dir.join("stale.sock"), dir.join("live.sock"));
        drop(UnixListener::bind(&stale).unwrap()); // the file stays, nobody listens
        let l = UnixListener::bind(&live).unwrap();
        let got = first_answering(&[stale.clone(), live.clone()]).map(|(_, p)| p);
        let only_stale = first_answering(std::slice::from_ref(&stale));
        drop(l);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got.unwrap(), live);
        assert!(matches!(only_stale, Err(Unanswered::Stale(p)) if p == stale));
    }

    #[test]
    fn listen_leaves_a_servers_default_socket_alone() {
        // `zcfs serve IMAGE` listens on SOCKET_DIR/STEM.sock by default, and a stem can
        // be anything a file name can: the names a mount's socket has had, say. Those
        // live sockets are never a mount's to replace.
        let dev = fake_dev(3);
        // SAFETY: geteuid has no preconditions.
        let server_dir = if unsafe { libc::geteuid() } == 0 {
            PathBuf::from(SOCKET_DIR)
        } else {
            own_socket_dir().unwrap().parent().unwrap().to_path_buf()
        };
        std::fs::create_dir_all(&server_dir).unwrap();
        let stems = [format!("mount-{dev}"), dev.clone(), format!("{dev}.sock")];
        let live: Vec<(PathBuf, UnixListener, FileId)> = stems
            .iter()
            .map(|stem| {
                let p = server_dir.join(format!("{stem}.sock"));
                let _ = std::fs::remove_file(&p);
                let l = UnixListener::bind(&p).unwrap();
                let id = file_id(&p).unwrap();
                (p, l, id)
            })
            .collect();
        let r = StatSocket::listen(&dev, |_| String::new());
        let kept: Vec<bool> = live
            .iter()
            .map(|(p, _, id)| file_id(p).ok() == Some(*id))
            .collect();
        let ours = r.as_ref().map(|s| s.path.clone()).ok();
        drop(r);
        for (p, l, _) in live {
            drop(l);
            let _ = std::fs::remove_file(&p);
        }
        assert!(ours.is_some(), "the mount's own socket could not be made");
        assert_eq!(
            kept,
            vec![true; stems.len()],
            "a live server socket was unlinked (stems {stems:?})"
        );
    }
}
