//! Shared by the volume's integration tests: a simple in-memory model of the file tree
//! (the oracle), path-level operations applied to both model and volume, and a
//! canonical dump of each for comparison.
#![allow(dead_code)]

mod model;
mod volume;
pub mod xattr;

// Not every suite uses both.
#[allow(unused_imports)]
pub use model::Model;
#[allow(unused_imports)]
pub use volume::{apply_volume, dump_volume};

use std::collections::BTreeMap;
use std::sync::Arc;
use zcfs_volume::mode::*;
use zcfs_volume::{
    Cred, FsError, MkfsOptions, Region, RenameFlags, SetAttr, SizeRight, Volume, VolumeConfig,
    XattrMode, ROOT_INO,
};

pub const ENOENT: i32 = libc::ENOENT;

#[derive(Debug, Clone)]
pub enum Step {
    Create(String),
    Mkdir(String),
    Symlink(String, String),
    /// path, offset, length, fill seed
    Write(String, u64, usize, u8),
    /// The same write through a landing reservation (`reserve_write_landing`), its
    /// blocks filled whole and the bytes in front of every extent clobbered, as a
    /// layer-2 receiver does (`land`).
    LandingWrite(String, u64, usize, u8),
    /// A landing reservation for that write, landed and clobbered like
    /// `LandingWrite`, then dropped without commit: changes nothing.
    LandingAbort(String, u64, usize, u8),
    Truncate(String, u64),
    Rename(String, String, u32),
    Link(String, String),
    Unlink(String),
    Rmdir(String),
    Chmod(String, u32),
    Chown(String, u32, u32),
    SetXattr(String, String, Vec<u8>),
    RemoveXattr(String, String),
    PunchHole(String, u64, u64),
    /// path, offset, length, Linux fallocate mode bits (not PUNCH_HOLE).
    Fallocate(String, u64, u64, i32),
    Fsync(String),
    /// The inner operation with the `n`-th budget check failing (the volume must have
    /// a fault plan): it must fail and change nothing.
    Failing(Box<Step>, u64),
}

impl Step {
    pub fn is_fsync(&self) -> bool {
        matches!(self, Step::Fsync(_))
    }
}

/// Deterministic data for a write.
pub fn pattern(off: u64, len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            ((off as usize + i) as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
                | 1
        })
        .collect()
}

pub(crate) fn split(path: &str) -> (Vec<&str>, &str) {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (last, dirs) = parts.split_last().expect("path has a name");
    (dirs.to_vec(), last)
}

/// One line of a canonical dump; `mode_owner` is [mode, uid, gid, nlink].
pub(crate) fn line(
    path: &str,
    kind: &str,
    [mode, uid, gid, nlink]: [u32; 4],
    data: &[u8],
    x: &BTreeMap<Vec<u8>, Vec<u8>>,
    target: Option<&Vec<u8>>,
) -> String {
    let crc = fnv1a(data);
    format!(
        "{path}/ {kind} mode={mode:o} uid={uid} gid={gid} nlink={nlink} size={} crc={crc:08x} xattrs={:?} target={:?}",
        data.len(),
        x.iter().map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v.clone())).collect::<Vec<_>>(),
        target.map(|t| String::from_utf8_lossy(t).into_owned())
    )
}

fn fnv1a(data: &[u8]) -> u32 {
    // Enough to tell contents apart in a test.
    let mut h: u32 = 0x811c9dc5;
    for &b in data {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h
}

/// A fresh volume in anonymous memory.
pub fn memory_volume(size: usize, cfg: VolumeConfig) -> Arc<Volume> {
    memory_volume_with(size, &small_mkfs(), cfg)
}

pub fn memory_volume_with(size: usize, mkfs: &MkfsOptions, cfg: VolumeConfig) -> Arc<Volume> {
    let mut region = Region::anonymous(size);
    Volume::mkfs_region(&mut region, mkfs).unwrap();
    Volume::open_region(region, cfg).unwrap()
}

pub fn small_mkfs() -> MkfsOptions {
    mkfs_with(64, 32 << 10)
}

/// Mkfs options with this many inodes and log bytes, the rest by default.
pub fn mkfs_with(inodes: u64, log_bytes: u64) -> MkfsOptions {
    MkfsOptions {
        inodes: Some(inodes),
        log_bytes: Some(log_bytes),
        ..Default::default()
    }
}

/// Create an empty file as root (mode 0644) and return its inode number.
pub fn new_file(vol: &Volume, parent: u64, name: &[u8]) -> u64 {
    vol.create(&Cred::ROOT, parent, name, 0o644, 0).unwrap().ino
}

/// fsck must find the volume clean.
pub fn assert_fsck_clean(vol: &Volume) {
    let report = zcfs_volume::fsck::check_volume(vol);
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}

/// Sync, copy the image, abandon the volume and open the copy with `cfg`.
pub fn remount_with(vol: Arc<Volume>, cfg: VolumeConfig) -> Arc<Volume> {
    vol.sync().unwrap();
    let img = image_of(&vol);
    vol.abandon();
    drop(vol);
    Volume::open_region(Region::from_image(&img), cfg).unwrap()
}

/// `remount_with` a synchronous configuration.
pub fn remount(vol: Arc<Volume>) -> Arc<Volume> {
    remount_with(vol, VolumeConfig::synchronous())
}

/// Apply `op` to the model and to the volume: both must give the same result (but
/// for a `Failing` step, whose budget check the model does not know). `what` names the
/// step in the failure message.
pub fn apply_both(model: &mut Model, vol: &Volume, op: &Step, what: &str) {
    let want = model.apply(op);
    let got = apply_volume(vol, op);
    if !matches!(op, Step::Failing(..)) {
        assert_eq!(got, want, "{what}: {op:?}");
    }
}

/// Set in the child process `in_own_process` starts.
const CHILD_ENV: &str = "ZCFS_TEST_CHILD";

/// For a test that must run alone in a process of its own: in the test process, run
/// test `name` of this binary again in a child process, require that the child ran
/// exactly that test and passed, and return false; in the child, return true (run the
/// test's body).
pub fn in_own_process(name: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name} in a child process failed:\n{text}"
    );
    assert!(
        text.contains("test result: ok. 1 passed"),
        "the child process did not run {name}:\n{text}"
    );
    false
}

/// A copy of the volume's whole image.
pub fn image_of(vol: &Volume) -> Vec<u8> {
    // SAFETY: tests call this while no operation runs.
    unsafe { vol.test_door().image() }
}

/// A small tree every suite starts from: directories, files, a hard link, a
/// subdirectory, a symlink and an xattr.
pub fn prepared_tree() -> Vec<Step> {
    vec![
        Step::Mkdir("d1".into()),
        Step::Mkdir("d2".into()),
        Step::Create("d1/f".into()),
        Step::Write("d1/f".into(), 0, 3000, 1),
        Step::Create("d2/g".into()),
        Step::Write("d2/g".into(), 0, 5000, 2),
        Step::Link("d1/f".into(), "h".into()),
        Step::Mkdir("d1/sub".into()),
        Step::Symlink("s".into(), "d1/f".into()),
        Step::SetXattr("d1/f".into(), "user.a".into(), vec![1, 2, 3]),
        Step::SetXattr("d1/f".into(), ACCESS.into(), acl_value(0o6, 0o4)),
        Step::SetXattr("d1/sub".into(), DEFAULT.into(), acl_value(0o7, 0o5)),
    ]
}

pub const ACCESS: &str = "system.posix_acl_access";
pub const DEFAULT: &str = "system.posix_acl_default";

/// An ACL with a named user (1000) and a mask: owner `owner`, everyone else `rest`.
pub fn acl_value(owner: u16, rest: u16) -> Vec<u8> {
    use zcfs_volume::acl::{GROUP_OBJ, MASK, OTHER, USER, USER_OBJ};
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm) in [
        (USER_OBJ, owner),
        (USER, rest),
        (GROUP_OBJ, rest),
        (MASK, rest),
        (OTHER, rest),
    ] {
        let id: u32 = if tag == USER { 1000 } else { u32::MAX };
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Each kind of operation once, on the prepared tree, with a name.
pub fn single_ops() -> Vec<(&'static str, Step)> {
    vec![
        ("create", Step::Create("d1/new".into())),
        ("mkdir", Step::Mkdir("d2/newdir".into())),
        ("symlink", Step::Symlink("d2/s2".into(), "../h".into())),
        ("write-aligned", Step::Write("d2/g".into(), 4096, 4096, 5)),
        ("write-unaligned", Step::Write("d1/f".into(), 100, 50, 6)),
        ("write-cross", Step::Write("d2/g".into(), 3000, 6000, 7)),
        ("append", Step::Write("d1/f".into(), 3000, 2000, 8)),
        ("overwrite", Step::Write("d1/f".into(), 0, 3000, 9)),
        ("truncate-down", Step::Truncate("d2/g".into(), 1000)),
        ("truncate-up", Step::Truncate("d1/f".into(), 9000)),
        ("rename-new", Step::Rename("d1/f".into(), "d1/f2".into(), 0)),
        ("rename-over", Step::Rename("d2/g".into(), "d1/f".into(), 0)),
        (
            "rename-across",
            Step::Rename("d2/g".into(), "d1/g".into(), 0),
        ),
        (
            "rename-dir",
            Step::Rename("d1/sub".into(), "d2/sub".into(), 0),
        ),
        (
            "rename-exchange",
            Step::Rename("d1/f".into(), "d2/g".into(), 2),
        ),
        ("link", Step::Link("d2/g".into(), "d1/g2".into())),
        ("unlink-linked", Step::Unlink("h".into())),
        ("unlink-last", Step::Unlink("d2/g".into())),
        ("rmdir", Step::Rmdir("d1/sub".into())),
        ("setattr", Step::Chmod("d1/f".into(), 0o600)),
        ("chown", Step::Chown("d2/g".into(), 5, 6)),
        (
            "xattr-set",
            Step::SetXattr("d2/g".into(), "user.b".into(), vec![9]),
        ),
        (
            "xattr-remove",
            Step::RemoveXattr("d1/f".into(), "user.a".into()),
        ),
        ("punch", Step::PunchHole("d2/g".into(), 0, 4096)),
        // ACLs: a create that inherits a default ACL writes its xattr block in the
        // same transaction; setting an access ACL moves the mode (setattr above
        // rewrites d1/f's ACL).
        ("create-inherit", Step::Create("d1/sub/a".into())),
        ("mkdir-inherit", Step::Mkdir("d1/sub/ad".into())),
        (
            "acl-set",
            Step::SetXattr("d2/g".into(), ACCESS.into(), acl_value(0o7, 0o1)),
        ),
        (
            "fallocate-grow",
            Step::Fallocate("d1/f".into(), 1000, 20000, 0),
        ),
        (
            "fallocate-keep",
            Step::Fallocate("d2/g".into(), 0, 64 << 10, libc::FALLOC_FL_KEEP_SIZE),
        ),
        (
            "zero-range",
            Step::Fallocate("d2/g".into(), 100, 6000, libc::FALLOC_FL_ZERO_RANGE),
        ),
        ("fsync", Step::Fsync("d1/f".into())),
    ]
}

/// Bytes a layer-2 receiver leaves in the parts of edge blocks outside the write, and
/// in front of every extent (arbitrary: commit must replace or ignore them).
pub const LANDING_JUNK: u8 = 0xA5;

/// Write `data` at `off` of `ino` as a layer-2 receiver would: a landing reservation,
/// every extent's blocks filled whole (the write's bytes in place, junk around them),
/// the [`zcfs_volume::LANDING_CLOBBER`] bytes in front of every extent overwritten with
/// junk (stores nobody flushes, like a NIC's), then commit.
pub fn land(vol: &Volume, ino: u64, off: u64, data: &[u8]) -> Result<usize, FsError> {
    let r = land_uncommitted(vol, ino, off, data)?;
    let gaps: Vec<u64> = r
        .landing_extents()
        .iter()
        .map(|e| e.offset / zcfs_volume::BLOCK as u64 - 1)
        .collect();
    let n = r.commit()?;
    // The gaps are free again and in no file.
    let mapped = vol.test_door().file_blocks(ino).unwrap();
    for g in gaps {
        assert!(vol.test_door().block_is_free(g), "gap {g} not freed");
        assert!(!mapped.contains(&g), "gap {g} in the file");
    }
    Ok(n)
}

/// `land` up to the commit: the reservation, landed and clobbered.
pub fn land_uncommitted<'v>(
    vol: &'v Volume,
    ino: u64,
    off: u64,
    data: &[u8],
) -> Result<zcfs_volume::WriteReservation<'v>, FsError> {
    use zcfs_volume::{BLOCK, LANDING_CLOBBER, LANDING_GAP_BYTES};
    let mut r = vol.reserve_write_landing(&Cred::ROOT, ino, off, data.len())?;
    let exts = r.landing_extents().to_vec();
    let end = off + data.len() as u64;
    for (e, s) in exts.iter().zip(r.landing_mut()) {
        let blocks = &mut s[LANDING_GAP_BYTES as usize..];
        assert_eq!(blocks.len(), e.blocks as usize * BLOCK);
        for (i, b) in blocks.iter_mut().enumerate() {
            let at = e.file_offset + i as u64;
            *b = if (off..end).contains(&at) {
                data[(at - off) as usize]
            } else {
                LANDING_JUNK
            };
        }
    }
    for e in &exts {
        let front = (e.offset - LANDING_CLOBBER) as usize;
        // SAFETY: the bytes in front of the extent are in its gap block, which the
        // reservation holds; no view of it is alive.
        unsafe {
            vol.test_door()
                .store_unflushed(front, &[LANDING_JUNK; LANDING_CLOBBER as usize])
        };
    }
    Ok(r)
}

/// Allocate every byte of the image at `path` (fallocate), as `zcfs mkfs` does by
/// default: only then does `Volume::prefault_in_background` run.
pub fn allocate_whole(path: &std::path::Path) {
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    // SAFETY: fallocate on a descriptor we own, plain integers.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as libc::off_t) };
    assert_eq!(rc, 0, "fallocate {}", path.display());
}
