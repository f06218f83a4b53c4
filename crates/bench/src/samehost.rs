//! `zcfs-bench samehost`: the same-host interface (issue 13) beside the other ways an
//! application on the server's host reaches a volume, in one run:
//!
//! - `direct`: direct map (zcfs-samehost), from another process: a read leases the
//!   extents, reads every cache line of the bytes in place and releases the lease; a
//!   write reserves blocks, fills them through the writable window and commits them;
//! - `shared`: shared buffer (zcfs-samehost), from another process: the server copies
//!   between PM and the registered buffer;
//! - `fuse-local`: a local `zcfs mount` of an image of the same kind, O_DIRECT
//!   pread/pwrite from this process;
//! - `in-process`: `Volume::read`/`Volume::write` on the volume in this process.
//!
//! 4 KiB random reads and writes, 1 MiB random reads and writes, QD1. The service runs
//! in this process; its client is this binary again (`samehost-client`, hidden) in a
//! child process, which prints its rows as JSON lines. Copies per byte of the same-host
//! rows come from the service's counters (the deltas over each measurement).

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_samehost::client::{Client, Piece, Place, NO_NEW_SIZE};
use zcfs_samehost::{Service, ServiceConfig, StatsSnapshot};
use zcfs_volume::{Cred, MkfsOptions, Volume, VolumeConfig, ROOT_INO};

/// The request sizes measured.
pub const SIZES: [usize; 2] = [4 << 10, 1 << 20];
/// Operations per measurement at 4 KiB (full mode; quick mode a tenth).
pub const MAX_SMALL_OPS: usize = 20_000;
/// Operations per measurement at 1 MiB (full mode; quick mode a tenth).
pub const MAX_LARGE_OPS: usize = 400;
/// The file read and written (full mode; quick mode a quarter).
pub const FILE_BYTES: u64 = 256 << 20;
/// Image size for the service's volume and for the FUSE mount's.
const IMAGE_BYTES: u64 = 1 << 30;
/// How long to wait for the FUSE mount to appear.
const MOUNT_WAIT: Duration = Duration::from_secs(10);

/// One measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShRow {
    /// `direct`, `shared`, `fuse-local` or `in-process`.
    pub path: String,
    pub op: String,
    pub size: usize,
    pub ops: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub mb_s: f64,
    /// User-space copies per payload byte (from the service's counters for `direct` and
    /// `shared`); `None` where no counter says (see `note`).
    pub copies_per_byte: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Measurement parameters, shared with the child.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub quick: bool,
    pub secs: f64,
    pub rounds: usize,
}

impl Params {
    fn file_bytes(&self) -> u64 {
        if self.quick {
            FILE_BYTES / 4
        } else {
            FILE_BYTES
        }
    }
    fn max_ops(&self, size: usize) -> usize {
        let n = if size <= 4096 {
            MAX_SMALL_OPS
        } else {
            MAX_LARGE_OPS
        };
        if self.quick {
            n / 10
        } else {
            n
        }
    }
    fn args(&self) -> Vec<String> {
        vec![
            format!("--secs={}", self.secs),
            format!("--rounds={}", self.rounds),
            if self.quick {
                "--quick".into()
            } else {
                "--full".into()
            },
        ]
    }
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A random `size`-aligned offset inside a file of `file` bytes.
fn rand_off(x: &mut u64, file: u64, size: usize) -> u64 {
    xorshift(x) % (file / size as u64) * size as u64
}

/// Latencies (ns) of one measurement, as a row.
fn to_row(path: &str, op: &str, size: usize, mut lat: Vec<u64>, el: Duration) -> ShRow {
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            0.0
        } else {
            lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1e3
        }
    };
    ShRow {
        path: path.into(),
        op: op.into(),
        size,
        ops: lat.len() as u64,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
        mb_s: lat.len() as f64 * size as f64 / el.as_secs_f64().max(1e-9) / 1e6,
        copies_per_byte: None,
        note: None,
    }
}

/// Run `op` until `max` operations or `secs` seconds, whichever comes first.
fn measure(
    p: &Params,
    path: &str,
    opname: &str,
    size: usize,
    mut op: impl FnMut() -> Result<()>,
) -> Result<ShRow> {
    let max = p.max_ops(size);
    let deadline = Duration::from_secs_f64(p.secs);
    let mut lat = Vec::with_capacity(max);
    let t = Instant::now();
    while lat.len() < max && t.elapsed() < deadline {
        let s = Instant::now();
        op()?;
        lat.push(s.elapsed().as_nanos() as u64);
    }
    Ok(to_row(path, opname, size, lat, t.elapsed()))
}

/// The row of the median round (by p50).
fn median(mut runs: Vec<ShRow>) -> ShRow {
    runs.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
    runs.swap_remove(runs.len() / 2)
}

/// Median of step `i` of the direct writes' steps, in µs.
fn phase_p50(phases: &[[Duration; 3]], i: usize) -> f64 {
    let mut v: Vec<Duration> = phases.iter().map(|p| p[i]).collect();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Sum of one word per cache line: the application reads the bytes in place.
fn touch(b: &[u8]) -> u64 {
    b.chunks(64).map(|c| c[0] as u64).sum()
}

/// Copies per payload byte of a mode, from two snapshots of the counters.
fn copies(before: &StatsSnapshot, after: &StatsSnapshot, direct: bool) -> Option<f64> {
    let (copied, bytes) = if direct {
        (
            after.direct_copied_bytes - before.direct_copied_bytes,
            (after.direct_read_bytes + after.direct_commit_bytes)
                - (before.direct_read_bytes + before.direct_commit_bytes),
        )
    } else {
        (
            after.shared_copied_bytes - before.shared_copied_bytes,
            (after.shared_read_bytes + after.shared_write_bytes)
                - (before.shared_read_bytes + before.shared_write_bytes),
        )
    };
    (bytes > 0).then(|| copied as f64 / bytes as f64)
}

/// The child: connect to `sock`, measure the same-host rows round by round
/// (interleaved), print each median row as a JSON line.
pub fn client(sock: &Path, p: Params) -> Result<()> {
    let mut c = Client::connect(sock).context("connect to the same-host service")?;
    let buf = c.register_buffer(1 << 20)?;
    let f = c.open("/data", libc::O_RDWR, 0)?;
    let out = c.open("/out", libc::O_RDWR | libc::O_CREAT, 0o644)?;
    c.direct_map()
        .context("direct map (run as root or the image's owner)")?;
    let file = p.file_bytes();
    let src: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + 1) as u8).collect();
    c.buffer_mut(buf)?.copy_from_slice(&src);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut sink = 0u64;
    // The runs of each measurement, in measurement order.
    let mut runs: Vec<Vec<ShRow>> = Vec::new();
    for _ in 0..p.rounds.max(1) {
        let mut i = 0usize;
        for size in SIZES {
            for (path, opname) in [
                ("shared", "read"),
                ("direct", "read"),
                ("mapped", "read"),
                ("shared", "write"),
                ("direct", "write"),
            ] {
                let before = c.stats()?;
                // Direct writes: the time of each step (reserve, fill, commit).
                let mut phases: Vec<[Duration; 3]> = Vec::new();
                let mut r = match (path, opname) {
                    ("shared", "read") => measure(&p, path, opname, size, || {
                        let off = rand_off(&mut x, file, size);
                        let n = c.read(f.handle, off, buf, 0, size as u64)?;
                        if n != size {
                            bail!("short read {n}");
                        }
                        Ok(())
                    })?,
                    ("shared", "write") => measure(&p, path, opname, size, || {
                        let off = rand_off(&mut x, file, size);
                        c.write(out.handle, off, buf, 0, size as u64)?;
                        Ok(())
                    })?,
                    ("direct", "read") => measure(&p, path, opname, size, || {
                        let off = rand_off(&mut x, file, size);
                        let l = c.read_extents(f.handle, off, size as u64)?;
                        let m = c.mapped().context("mapped")?;
                        for e in &l.extents {
                            if let Some(b) = m.bytes(e) {
                                sink = sink.wrapping_add(touch(b));
                            }
                        }
                        c.release(l.id)?;
                        Ok(())
                    })?,
                    ("mapped", "read") => measure(&p, path, opname, size, || {
                        let off = rand_off(&mut x, file, size);
                        let mut n = 0;
                        for piece in c.read_mapped(f.handle, off, size as u64)? {
                            if let Piece::Data(b) = piece {
                                sink = sink.wrapping_add(touch(b));
                            }
                            n += piece.len();
                        }
                        if n != size as u64 {
                            bail!("short mapped read {n}");
                        }
                        Ok(())
                    })?,
                    _ => measure(&p, path, opname, size, || {
                        let off = rand_off(&mut x, file, size);
                        let t0 = Instant::now();
                        let mut r = c.reserve(size / 4096)?;
                        let t1 = Instant::now();
                        r.window().fill(&src[..size]);
                        let t2 = Instant::now();
                        c.commit(vec![Place {
                            handle: out.handle,
                            file_offset: off,
                            reservation: r,
                            new_size: NO_NEW_SIZE,
                        }])?;
                        phases.push([t1 - t0, t2 - t1, t2.elapsed()]);
                        Ok(())
                    })?,
                };
                let after = c.stats()?;
                r.copies_per_byte = match path {
                    // In place: nothing is copied (the leases it takes count no bytes
                    // copied either).
                    "mapped" => Some(0.0),
                    _ => copies(&before, &after, path == "direct"),
                };
                r.note = Some(match (path, opname) {
                    ("direct", "read") => {
                        "READ_EXTENTS (lease) + read every cache line in place + LEASE_RELEASE"
                            .into()
                    }
                    ("mapped", "read") => format!(
                        "read_mapped: the 1 MiB chunks' leases kept, checked by one load of \
                         the file's change counter; read every cache line in place \
                         ({} chunks kept)",
                        c.mapped_chunks()
                    ),
                    ("direct", "write") => format!(
                        "RESERVE + fill the window + COMMIT (atomic); p50 reserve {:.1} µs, \
                         fill {:.1} µs, commit {:.1} µs",
                        phase_p50(&phases, 0),
                        phase_p50(&phases, 1),
                        phase_p50(&phases, 2)
                    ),
                    _ => "one copy by the server between PM and the registered buffer".into(),
                });
                match runs.get_mut(i) {
                    Some(v) => v.push(r),
                    None => runs.push(vec![r]),
                }
                i += 1;
            }
        }
    }
    std::hint::black_box(sink);
    for v in runs {
        println!("{}", serde_json::to_string(&median(v))?);
    }
    Ok(())
}

struct Image(PathBuf);
impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn fill_file(v: &Volume, name: &[u8], bytes: u64) -> Result<u64> {
    let ino = v.create(&Cred::ROOT, ROOT_INO, name, 0o644, 0)?.ino;
    let chunk = vec![0x5au8; 8 << 20];
    let mut off = 0;
    while off < bytes {
        let n = chunk.len().min((bytes - off) as usize);
        v.write(&Cred::ROOT, ino, off, &chunk[..n])?;
        off += n as u64;
    }
    Ok(ino)
}

/// In-process rows: `Volume::read`/`write` on `v`.
fn in_process(v: &Volume, data: u64, out: u64, p: &Params) -> Result<Vec<ShRow>> {
    let file = p.file_bytes();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rows = Vec::new();
    for size in SIZES {
        for write in [false, true] {
            let mut runs = Vec::new();
            for _ in 0..p.rounds.max(1) {
                let mut buf = vec![0x33u8; size];
                let opname = if write { "write" } else { "read" };
                let mut r = measure(p, "in-process", opname, size, || {
                    let off = rand_off(&mut x, file, size);
                    if write {
                        v.write(&Cred::ROOT, out, off, &buf)?;
                    } else {
                        v.read(data, off, &mut buf)?;
                    }
                    Ok(())
                })?;
                r.copies_per_byte = Some(1.0);
                r.note = Some(
                    "Volume::read/write in the volume's process: one copy between PM and the caller's buffer"
                        .into(),
                );
                runs.push(r);
            }
            rows.push(median(runs));
        }
    }
    Ok(rows)
}

/// The FUSE rows: mount a fresh image with `zcfs mount`, O_DIRECT pread/pwrite.
fn fuse_local(zcfs: &Path, tag: &str, p: &Params) -> Result<Vec<ShRow>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let img = Image(PathBuf::from(format!("/dev/shm/{tag}-fuse.img")));
    let st = std::process::Command::new(zcfs)
        .arg("mkfs")
        .arg(&img.0)
        .args(["--size", &IMAGE_BYTES.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("run {}", zcfs.display()))?;
    if !st.success() {
        bail!("zcfs mkfs failed");
    }
    let mp = std::env::temp_dir().join(format!("{tag}-mnt"));
    std::fs::create_dir_all(&mp)?;
    let mut child = std::process::Command::new(zcfs)
        .arg("mount")
        .arg(&img.0)
        .arg(&mp)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|m| {
                m.lines()
                    .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap_or("")))
            })
            .unwrap_or(false)
    };
    let t = Instant::now();
    while !mounted() && t.elapsed() < MOUNT_WAIT {
        if let Some(s) = child.try_wait()? {
            let _ = std::fs::remove_dir(&mp);
            bail!("zcfs mount exited ({s})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let result = (|| -> Result<Vec<ShRow>> {
        if !mounted() {
            bail!("no mount at {} after {:?}", mp.display(), MOUNT_WAIT);
        }
        let file = p.file_bytes();
        let fpath = mp.join("data");
        {
            let f = std::fs::File::create(&fpath)?;
            let chunk = vec![0x5au8; 8 << 20];
            let mut off = 0;
            while off < file {
                f.write_all_at(&chunk, off)?;
                off += chunk.len() as u64;
            }
            f.sync_all()?;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&fpath)?;
        // O_DIRECT wants an aligned buffer.
        let layout = std::alloc::Layout::from_size_align(1 << 20, 4096)?;
        // SAFETY: non-zero size; freed below with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            bail!("out of memory");
        }
        // SAFETY: `ptr` is a live allocation of 1 MiB, used only here.
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 1 << 20) };
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut rows = Vec::new();
        let r = (|| -> Result<()> {
            for size in SIZES {
                for write in [false, true] {
                    let mut runs = Vec::new();
                    for _ in 0..p.rounds.max(1) {
                        let opname = if write { "write" } else { "read" };
                        let mut r = measure(p, "fuse-local", opname, size, || {
                            let off = rand_off(&mut x, file, size);
                            if write {
                                f.write_all_at(&buf[..size], off)?;
                            } else {
                                f.read_exact_at(&mut buf[..size], off)?;
                            }
                            Ok(())
                        })?;
                        r.note = Some(
                            "O_DIRECT pread/pwrite on a local zcfs mount: the kernel copies between the application and /dev/fuse, zcfs once between /dev/fuse's buffer and PM (no counter: 1 user-space copy in zcfs, plus the kernel's)"
                                .into(),
                        );
                        runs.push(r);
                    }
                    rows.push(median(runs));
                }
            }
            Ok(())
        })();
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(ptr, layout) };
        r.map(|_| rows)
    })();
    let um = std::process::Command::new("umount").arg(&mp).status();
    if !matches!(um, Ok(s) if s.success()) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&mp)
            .status();
    }
    let t = Instant::now();
    while child.try_wait()?.is_none() && t.elapsed() < MOUNT_WAIT {
        std::thread::sleep(Duration::from_millis(20));
    }
    if child.try_wait()?.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir(&mp);
    result
}

/// The whole benchmark: rows in the order direct, shared, fuse-local, in-process, and
/// the reasons for any path left out.
pub fn run(p: Params, zcfs: Option<PathBuf>) -> Result<(Vec<ShRow>, Vec<String>)> {
    let tag = format!("zcfs-bench-samehost-{}", std::process::id());
    let img = Image(PathBuf::from(format!("/dev/shm/{tag}.img")));
    Volume::mkfs(&img.0, IMAGE_BYTES, &MkfsOptions::default())?;
    // Allocated whole, as `zcfs mkfs` makes an image by default (so the same-host
    // client populates its mapping of it, as it would for a served image).
    {
        use std::os::unix::io::AsRawFd;
        let f = std::fs::OpenOptions::new().write(true).open(&img.0)?;
        // SAFETY: fallocate on a descriptor we own, mode 0 (allocate, keep contents
        // and size); no memory is passed.
        if unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, IMAGE_BYTES as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error()).context("allocating the image");
        }
    }
    let vol = Volume::open(&img.0, VolumeConfig::default())?;
    // As `zcfs serve` does: fresh blocks come already faulted in.
    vol.prefault_in_background();
    let data = fill_file(&vol, b"data", p.file_bytes())?;
    let out = fill_file(&vol, b"out", p.file_bytes())?;
    let mut skipped = Vec::new();
    // Same-host rows: the service here, the client in a child process.
    let sock = std::env::temp_dir().join(format!("{tag}.sock"));
    let mut cfg = ServiceConfig::new(&sock);
    cfg.identity.squash = zcfs_types::identity::Squash::None;
    let svc = Arc::new(Service::bind(vol.clone(), cfg)?);
    let run = svc.clone();
    let t = std::thread::spawn(move || run.run());
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("samehost-client")
        .arg(&sock)
        .args(p.args())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("start the same-host client")?;
    let mut sh_rows = Vec::new();
    let lines = std::io::BufReader::new(child.stdout.take().context("stdout")?)
        .lines()
        .collect::<std::io::Result<Vec<String>>>();
    let status = child.wait()?;
    svc.shutdown();
    t.join().expect("service thread");
    drop(svc);
    for l in lines? {
        sh_rows.push(serde_json::from_str::<ShRow>(&l).context("a row from the client")?);
    }
    if !status.success() {
        bail!("the same-host client failed ({status})");
    }
    let mut rows: Vec<ShRow> = Vec::new();
    for path in ["direct", "mapped", "shared"] {
        rows.extend(sh_rows.iter().filter(|r| r.path == path).cloned());
    }
    // FUSE on a local mount of another image of the same kind.
    let zcfs = crate::remote::zcfs_path(zcfs.as_deref())?;
    if !zcfs.exists() {
        skipped.push(format!("fuse-local: {} not found", zcfs.display()));
    } else if !Path::new("/dev/fuse").exists() {
        skipped.push("fuse-local: no /dev/fuse".into());
    } else {
        match fuse_local(&zcfs, &tag, &p) {
            Ok(r) => rows.extend(r),
            Err(e) => skipped.push(format!("fuse-local: {e:#}")),
        }
    }
    rows.extend(in_process(&vol, data, out, &p)?);
    for s in &skipped {
        eprintln!("skipped {s}");
    }
    Ok((rows, skipped))
}

/// The side-by-side table for samehost.md and docs/benchmarks.md.
pub fn summary(rows: &[ShRow], skipped: &[String]) -> String {
    let mut out = String::from(
        "### Same host: direct map and shared buffer beside a local FUSE mount and in-process calls\n\n",
    );
    out += "| op | size | path | p50 µs | p99 µs | MB/s | copies per byte |\n|---|---:|---|---:|---:|---:|---:|\n";
    for op in ["read", "write"] {
        for size in SIZES {
            for path in ["direct", "mapped", "shared", "fuse-local", "in-process"] {
                if let Some(r) = rows
                    .iter()
                    .find(|r| r.path == path && r.op == op && r.size == size)
                {
                    out += &format!(
                        "| {op} | {} | {path} | {:.2} | {:.2} | {:.0} | {} |\n",
                        crate::report::human(size),
                        r.p50_us,
                        r.p99_us,
                        r.mb_s,
                        r.copies_per_byte
                            .map_or("n/a".into(), |c| format!("{c:.2}"))
                    );
                }
            }
        }
    }
    for r in rows
        .iter()
        .filter(|r| r.path == "direct" && r.op == "write")
    {
        if let Some(n) = &r.note {
            out += &format!("\ndirect write {}: {n}\n", crate::report::human(r.size));
        }
    }
    for s in skipped {
        out += &format!("\nskipped {s}\n");
    }
    out
}
