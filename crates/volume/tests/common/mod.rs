//! Shared by the volume's integration tests: a simple in-memory model of the file tree
//! (the oracle), path-level operations applied to both model and volume, and a
//! canonical dump of each for comparison.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
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

#[derive(Debug, Clone)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
}

#[derive(Debug, Clone)]
struct MNode {
    kind: Kind,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    parent: u64,
}

/// The oracle: the same operations on plain maps.
#[derive(Debug, Clone)]
pub struct Model {
    nodes: HashMap<u64, MNode>,
    next: u64,
}

fn split(path: &str) -> (Vec<&str>, &str) {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (last, dirs) = parts.split_last().expect("path has a name");
    (dirs.to_vec(), last)
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    pub fn new() -> Model {
        let mut nodes = HashMap::new();
        nodes.insert(
            1,
            MNode {
                kind: Kind::Dir(BTreeMap::new()),
                mode: S_IFDIR | 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                xattrs: BTreeMap::new(),
                parent: 1,
            },
        );
        Model { nodes, next: 2 }
    }

    fn children(&self, d: u64) -> Result<&BTreeMap<Vec<u8>, u64>, i32> {
        match &self.nodes[&d].kind {
            Kind::Dir(c) => Ok(c),
            _ => Err(libc::ENOTDIR),
        }
    }
    fn children_mut(&mut self, d: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.nodes.get_mut(&d).unwrap().kind {
            Kind::Dir(c) => c,
            _ => unreachable!(),
        }
    }
    fn resolve_dir(&self, parts: &[&str]) -> Result<u64, i32> {
        let mut cur = 1;
        for p in parts {
            cur = *self.children(cur)?.get(p.as_bytes()).ok_or(ENOENT)?;
        }
        self.children(cur)?;
        Ok(cur)
    }
    fn resolve(&self, path: &str) -> Result<u64, i32> {
        let (dirs, name) = split(path);
        let d = self.resolve_dir(&dirs)?;
        self.children(d)?
            .get(name.as_bytes())
            .copied()
            .ok_or(ENOENT)
    }
    fn is_dir(&self, ino: u64) -> bool {
        matches!(self.nodes[&ino].kind, Kind::Dir(_))
    }
    fn is_within(&self, mut d: u64, anc: u64) -> bool {
        loop {
            if d == anc {
                return true;
            }
            if d == 1 {
                return false;
            }
            d = self.nodes[&d].parent;
        }
    }
    fn new_node(&mut self, kind: Kind, mode: u32, parent: u64) -> u64 {
        let ino = self.next;
        self.next += 1;
        let nlink = if matches!(kind, Kind::Dir(_)) { 2 } else { 1 };
        self.nodes.insert(
            ino,
            MNode {
                kind,
                mode,
                uid: 0,
                gid: 0,
                nlink,
                xattrs: BTreeMap::new(),
                parent,
            },
        );
        ino
    }
    fn drop_link(&mut self, ino: u64) {
        let n = self.nodes.get_mut(&ino).unwrap();
        if matches!(n.kind, Kind::Dir(_)) || n.nlink <= 1 {
            self.nodes.remove(&ino);
        } else {
            n.nlink -= 1;
        }
    }
    fn file_mut(&mut self, ino: u64) -> Result<&mut Vec<u8>, i32> {
        match &mut self.nodes.get_mut(&ino).unwrap().kind {
            Kind::File(d) => Ok(d),
            Kind::Dir(_) => Err(libc::EISDIR),
            Kind::Symlink(_) => Err(libc::EINVAL),
        }
    }

    pub fn apply(&mut self, op: &Step) -> Result<(), i32> {
        match op {
            Step::Failing(..) => Err(-1),
            Step::Create(p) | Step::Mkdir(p) | Step::Symlink(p, _) => {
                let (dirs, name) = split(p);
                let d = self.resolve_dir(&dirs)?;
                if name.len() > 255 {
                    return Err(libc::ENAMETOOLONG);
                }
                if self.children(d)?.contains_key(name.as_bytes()) {
                    return Err(libc::EEXIST);
                }
                let (kind, mode) = match op {
                    Step::Create(_) => (Kind::File(vec![]), S_IFREG | 0o644),
                    Step::Mkdir(_) => (Kind::Dir(BTreeMap::new()), S_IFDIR | 0o755),
                    Step::Symlink(_, t) => (Kind::Symlink(t.as_bytes().to_vec()), S_IFLNK | 0o777),
                    _ => unreachable!(),
                };
                let is_dir = matches!(kind, Kind::Dir(_));
                // setgid directories: the group comes from the directory, and
                // subdirectories inherit the bit.
                let (pmode, pgid) = (self.nodes[&d].mode, self.nodes[&d].gid);
                let sgid = pmode & S_ISGID != 0;
                let mode = if sgid && is_dir { mode | S_ISGID } else { mode };
                let ino = self.new_node(kind, mode, d);
                if sgid {
                    self.nodes.get_mut(&ino).unwrap().gid = pgid;
                }
                self.children_mut(d).insert(name.as_bytes().to_vec(), ino);
                if is_dir {
                    self.nodes.get_mut(&d).unwrap().nlink += 1;
                }
                Ok(())
            }
            Step::Write(p, off, len, seed) => {
                let ino = self.resolve(p)?;
                let data = self.file_mut(ino)?;
                let end = *off as usize + len;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*off as usize..end].copy_from_slice(&pattern(*off, *len, *seed));
                Ok(())
            }
            Step::Truncate(p, size) => {
                let ino = self.resolve(p)?;
                self.file_mut(ino)?.resize(*size as usize, 0);
                Ok(())
            }
            Step::PunchHole(p, off, len) => {
                let ino = self.resolve(p)?;
                let data = self.file_mut(ino)?;
                let end = ((off + len) as usize).min(data.len());
                for b in data.iter_mut().take(end).skip(*off as usize) {
                    *b = 0;
                }
                Ok(())
            }
            Step::Link(from, to) => {
                // As Linux: both paths resolved, then EEXIST, then EPERM for directories.
                let ino = self.resolve(from)?;
                let (dirs, name) = split(to);
                let d = self.resolve_dir(&dirs)?;
                if self.children(d)?.contains_key(name.as_bytes()) {
                    return Err(libc::EEXIST);
                }
                if self.is_dir(ino) {
                    return Err(libc::EPERM);
                }
                self.children_mut(d).insert(name.as_bytes().to_vec(), ino);
                self.nodes.get_mut(&ino).unwrap().nlink += 1;
                Ok(())
            }
            Step::Unlink(p) | Step::Rmdir(p) => {
                let (dirs, name) = split(p);
                let d = self.resolve_dir(&dirs)?;
                let ino = *self.children(d)?.get(name.as_bytes()).ok_or(ENOENT)?;
                if matches!(op, Step::Unlink(_)) {
                    if self.is_dir(ino) {
                        return Err(libc::EISDIR);
                    }
                } else {
                    if !self.is_dir(ino) {
                        return Err(libc::ENOTDIR);
                    }
                    if !self.children(ino)?.is_empty() {
                        return Err(libc::ENOTEMPTY);
                    }
                    self.nodes.get_mut(&d).unwrap().nlink -= 1;
                }
                self.children_mut(d).remove(name.as_bytes());
                self.drop_link(ino);
                Ok(())
            }
            Step::Rename(from, to, flags) => {
                let (d1s, n1) = split(from);
                let p1 = self.resolve_dir(&d1s)?;
                let src = *self.children(p1)?.get(n1.as_bytes()).ok_or(ENOENT)?;
                let (d2s, n2) = split(to);
                let p2 = self.resolve_dir(&d2s)?;
                let dst = self.children(p2)?.get(n2.as_bytes()).copied();
                let src_dir = self.is_dir(src);
                if flags & 2 != 0 {
                    let dst = dst.ok_or(ENOENT)?;
                    let dst_dir = self.is_dir(dst);
                    if (src_dir && self.is_within(p2, src)) || (dst_dir && self.is_within(p1, dst))
                    {
                        return Err(libc::EINVAL);
                    }
                    if p1 == p2 && n1 == n2 {
                        return Ok(());
                    }
                    self.children_mut(p1).insert(n1.as_bytes().to_vec(), dst);
                    self.children_mut(p2).insert(n2.as_bytes().to_vec(), src);
                    if p1 != p2 {
                        if src_dir {
                            self.nodes.get_mut(&src).unwrap().parent = p2;
                            self.nodes.get_mut(&p1).unwrap().nlink -= 1;
                            self.nodes.get_mut(&p2).unwrap().nlink += 1;
                        }
                        if dst_dir {
                            self.nodes.get_mut(&dst).unwrap().parent = p1;
                            self.nodes.get_mut(&p2).unwrap().nlink -= 1;
                            self.nodes.get_mut(&p1).unwrap().nlink += 1;
                        }
                    }
                    return Ok(());
                }
                if let Some(d) = dst {
                    if flags & 1 != 0 {
                        return Err(libc::EEXIST);
                    }
                    if d == src {
                        return Ok(());
                    }
                    let dst_dir = self.is_dir(d);
                    match (src_dir, dst_dir) {
                        (true, false) => return Err(libc::ENOTDIR),
                        (false, true) => return Err(libc::EISDIR),
                        (true, true) if !self.children(d)?.is_empty() => {
                            return Err(libc::ENOTEMPTY)
                        }
                        _ => {}
                    }
                }
                if src_dir && self.is_within(p2, src) {
                    return Err(libc::EINVAL);
                }
                self.children_mut(p1).remove(n1.as_bytes());
                if let Some(d) = dst {
                    let dst_dir = self.is_dir(d);
                    self.drop_link(d);
                    if dst_dir {
                        self.nodes.get_mut(&p2).unwrap().nlink -= 1;
                    }
                }
                self.children_mut(p2).insert(n2.as_bytes().to_vec(), src);
                if src_dir && p1 != p2 {
                    self.nodes.get_mut(&src).unwrap().parent = p2;
                    self.nodes.get_mut(&p1).unwrap().nlink -= 1;
                    self.nodes.get_mut(&p2).unwrap().nlink += 1;
                }
                Ok(())
            }
            Step::Chmod(p, m) => {
                let ino = self.resolve(p)?;
                let n = self.nodes.get_mut(&ino).unwrap();
                n.mode = (n.mode & S_IFMT) | (m & 0o7777);
                Ok(())
            }
            Step::Chown(p, u, g) => {
                let ino = self.resolve(p)?;
                let n = self.nodes.get_mut(&ino).unwrap();
                n.uid = *u;
                n.gid = *g;
                // Linux (`chown_common`, `setattr_should_drop_sgid`): a chown of a
                // non-directory drops set-user-ID whoever asks, and set-group-ID when
                // the file is group-executable (the model's caller is root, who is
                // privileged; a non-executable set-group-ID bit stays).
                if n.mode & S_IFMT != S_IFDIR {
                    n.mode &= !0o4000;
                    if n.mode & 0o010 != 0 {
                        n.mode &= !S_ISGID;
                    }
                }
                Ok(())
            }
            Step::SetXattr(p, k, v) => {
                let ino = self.resolve(p)?;
                // Linux: user.* attributes only on regular files and directories.
                let symlink = matches!(self.nodes[&ino].kind, Kind::Symlink(_));
                if symlink && k.starts_with("user.") {
                    return Err(libc::EPERM);
                }
                self.nodes
                    .get_mut(&ino)
                    .unwrap()
                    .xattrs
                    .insert(k.as_bytes().to_vec(), v.clone());
                Ok(())
            }
            Step::RemoveXattr(p, k) => {
                let ino = self.resolve(p)?;
                let symlink = matches!(self.nodes[&ino].kind, Kind::Symlink(_));
                if symlink && k.starts_with("user.") {
                    return Err(libc::EPERM);
                }
                self.nodes
                    .get_mut(&ino)
                    .unwrap()
                    .xattrs
                    .remove(k.as_bytes())
                    .map(|_| ())
                    .ok_or(libc::ENODATA)
            }
            Step::Fallocate(p, off, len, mode) => {
                let ino = self.resolve(p)?;
                let data = self.file_mut(ino)?;
                let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
                let end = (off + len) as usize;
                if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
                    let to = end.min(data.len());
                    for b in data.iter_mut().take(to).skip(*off as usize) {
                        *b = 0;
                    }
                }
                if !keep && data.len() < end {
                    data.resize(end, 0);
                }
                Ok(())
            }
            Step::Fsync(p) => self.resolve(p).map(|_| ()),
        }
    }

    /// Canonical dump: one line per path, hard links named by their first path.
    pub fn dump(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut first: HashMap<u64, String> = HashMap::new();
        self.dump_dir(1, "", &mut out, &mut first);
        out
    }

    fn dump_dir(
        &self,
        d: u64,
        prefix: &str,
        out: &mut Vec<String>,
        first: &mut HashMap<u64, String>,
    ) {
        let n = &self.nodes[&d];
        if let Kind::Dir(children) = &n.kind {
            out.push(line(
                prefix,
                "dir",
                n.mode,
                n.uid,
                n.gid,
                n.nlink,
                &[],
                &n.xattrs,
                None,
            ));
            for (name, &c) in children {
                let path = format!("{prefix}/{}", String::from_utf8_lossy(name));
                if let Some(p) = first.get(&c) {
                    out.push(format!("{path} -> link of {p}"));
                    continue;
                }
                first.insert(c, path.clone());
                let cn = &self.nodes[&c];
                match &cn.kind {
                    Kind::Dir(_) => self.dump_dir(c, &path, out, first),
                    Kind::File(data) => out.push(line(
                        &path, "file", cn.mode, cn.uid, cn.gid, cn.nlink, data, &cn.xattrs, None,
                    )),
                    Kind::Symlink(t) => out.push(line(
                        &path,
                        "symlink",
                        cn.mode,
                        cn.uid,
                        cn.gid,
                        cn.nlink,
                        &[],
                        &cn.xattrs,
                        Some(t),
                    )),
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn line(
    path: &str,
    kind: &str,
    mode: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
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

/// Dump the volume the same way.
pub fn dump_volume(vol: &Volume) -> Result<Vec<String>, FsError> {
    let mut out = Vec::new();
    let mut first: HashMap<u64, String> = HashMap::new();
    dump_vdir(vol, ROOT_INO, "", &mut out, &mut first)?;
    Ok(out)
}

fn dump_vdir(
    vol: &Volume,
    d: u64,
    prefix: &str,
    out: &mut Vec<String>,
    first: &mut HashMap<u64, String>,
) -> Result<(), FsError> {
    let a = vol.getattr(d)?;
    let x = xattrs_of(vol, d)?;
    out.push(line(
        prefix,
        "dir",
        a.mode,
        a.uid,
        a.gid,
        a.nlink,
        &[],
        &x,
        None,
    ));
    let mut entries = Vec::new();
    vol.readdir(d, 0, |e| {
        entries.push(e);
        true
    })?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
        if let Some(p) = first.get(&e.ino) {
            out.push(format!("{path} -> link of {p}"));
            continue;
        }
        first.insert(e.ino, path.clone());
        let a = vol.getattr(e.ino)?;
        let x = xattrs_of(vol, e.ino)?;
        match a.mode & S_IFMT {
            S_IFDIR => dump_vdir(vol, e.ino, &path, out, first)?,
            S_IFLNK => {
                let t = vol.readlink(e.ino)?;
                out.push(line(
                    &path,
                    "symlink",
                    a.mode,
                    a.uid,
                    a.gid,
                    a.nlink,
                    &[],
                    &x,
                    Some(&t),
                ));
            }
            _ => {
                let mut data = vec![0u8; a.size as usize];
                let n = vol.read(e.ino, 0, &mut data)?;
                assert_eq!(n, data.len(), "short read of {path}");
                out.push(line(
                    &path, "file", a.mode, a.uid, a.gid, a.nlink, &data, &x, None,
                ));
            }
        }
    }
    Ok(())
}

fn xattrs_of(vol: &Volume, ino: u64) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, FsError> {
    let mut m = BTreeMap::new();
    for k in vol.listxattr(&Cred::ROOT, ino)? {
        let v = vol.getxattr(&Cred::ROOT, ino, &k)?;
        m.insert(k, v);
    }
    Ok(m)
}

fn vresolve_dir(vol: &Volume, parts: &[&str]) -> Result<u64, i32> {
    let mut cur = ROOT_INO;
    for p in parts {
        cur = vol
            .lookup(&Cred::ROOT, cur, p.as_bytes())
            .map_err(|e| e.errno())?
            .ino;
    }
    vol.dir_len(cur).map_err(|e| e.errno())?;
    Ok(cur)
}

fn vresolve(vol: &Volume, path: &str) -> Result<u64, i32> {
    let (dirs, name) = split(path);
    let d = vresolve_dir(vol, &dirs)?;
    Ok(vol
        .lookup(&Cred::ROOT, d, name.as_bytes())
        .map_err(|e| e.errno())?
        .ino)
}

/// A setattr as root on the inode at `path`, as `apply_volume` reports it.
fn root_setattr(vol: &Volume, path: &str, set: SetAttr) -> Result<(), i32> {
    vol.setattr(
        &Cred::ROOT,
        vresolve(vol, path)?,
        &set,
        SizeRight::Permission,
    )
    .map(|_| ())
    .map_err(|e| e.errno())
}

/// Apply a path-level operation to the volume; errors as errno.
pub fn apply_volume(vol: &Volume, op: &Step) -> Result<(), i32> {
    let e = |e: FsError| e.errno();
    match op {
        Step::Failing(inner, n) => {
            let plan = vol.config().faults.clone().expect("a fault plan");
            plan.fail_nth(Some(*n));
            let r = apply_volume(vol, inner);
            let hit = plan.seen() >= *n;
            plan.fail_nth(None);
            assert!(hit, "{inner:?} has fewer than {n} budget checks");
            assert!(r.is_err(), "{inner:?} with check {n} failing succeeded");
            r
        }
        Step::Create(p) | Step::Mkdir(p) | Step::Symlink(p, _) => {
            let (dirs, name) = split(p);
            let d = vresolve_dir(vol, &dirs)?;
            match op {
                Step::Create(_) => vol.create(&Cred::ROOT, d, name.as_bytes(), S_IFREG | 0o644, 0),
                Step::Mkdir(_) => vol.mkdir(&Cred::ROOT, d, name.as_bytes(), 0o755),
                Step::Symlink(_, t) => vol.symlink(&Cred::ROOT, d, name.as_bytes(), t.as_bytes()),
                _ => unreachable!(),
            }
            .map(|_| ())
            .map_err(e)
        }
        Step::Write(p, off, len, seed) => {
            let ino = vresolve(vol, p)?;
            vol.write(&Cred::ROOT, ino, *off, &pattern(*off, *len, *seed))
                .map(|_| ())
                .map_err(e)
        }
        Step::Truncate(p, size) => vol
            .truncate(&Cred::ROOT, vresolve(vol, p)?, *size)
            .map_err(e),
        Step::PunchHole(p, off, len) => vol
            .pfree(&Cred::ROOT, vresolve(vol, p)?, *off, *len)
            .map_err(e),
        Step::Link(from, to) => {
            let ino = vresolve(vol, from)?;
            let (dirs, name) = split(to);
            let d = vresolve_dir(vol, &dirs)?;
            vol.link(&Cred::ROOT, ino, d, name.as_bytes())
                .map(|_| ())
                .map_err(e)
        }
        Step::Unlink(p) | Step::Rmdir(p) => {
            let (dirs, name) = split(p);
            let d = vresolve_dir(vol, &dirs)?;
            if matches!(op, Step::Unlink(_)) {
                vol.unlink(&Cred::ROOT, d, name.as_bytes())
                    .map(|_| ())
                    .map_err(e)
            } else {
                vol.rmdir(&Cred::ROOT, d, name.as_bytes())
                    .map(|_| ())
                    .map_err(e)
            }
        }
        Step::Rename(from, to, flags) => {
            let (d1s, n1) = split(from);
            let p1 = vresolve_dir(vol, &d1s)?;
            vol.lookup(&Cred::ROOT, p1, n1.as_bytes()).map_err(e)?;
            let (d2s, n2) = split(to);
            let p2 = vresolve_dir(vol, &d2s)?;
            vol.rename(
                &Cred::ROOT,
                p1,
                n1.as_bytes(),
                p2,
                n2.as_bytes(),
                RenameFlags::from_bits(*flags).map_err(e)?,
            )
            .map_err(e)
        }
        Step::Chmod(p, m) => root_setattr(
            vol,
            p,
            SetAttr {
                mode: Some(*m),
                ..Default::default()
            },
        ),
        Step::Chown(p, u, g) => root_setattr(
            vol,
            p,
            SetAttr {
                uid: Some(*u),
                gid: Some(*g),
                ..Default::default()
            },
        ),
        Step::SetXattr(p, k, v) => vol
            .setxattr(
                &Cred::ROOT,
                vresolve(vol, p)?,
                k.as_bytes(),
                v,
                XattrMode::Any,
            )
            .map_err(e),
        Step::RemoveXattr(p, k) => vol
            .removexattr(&Cred::ROOT, vresolve(vol, p)?, k.as_bytes())
            .map_err(e),
        Step::Fallocate(p, off, len, mode) => {
            let ino = vresolve(vol, p)?;
            let m = zcfs_volume::FallocMode::from_bits(*mode).map_err(e)?;
            vol.fallocate(&Cred::ROOT, ino, *off, *len, m).map_err(e)
        }
        Step::Fsync(p) => vol.fsync(vresolve(vol, p)?).map_err(e),
    }
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
    ]
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
