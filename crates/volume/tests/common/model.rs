//! The oracle: the file tree as plain maps, the same path-level steps applied to it,
//! and its canonical dump.

use super::*;
use std::collections::{BTreeMap, HashMap};
use zcfs_volume::acl::{self, Acl, ACCESS_XATTR, DEFAULT_XATTR};

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

impl MNode {
    fn mode_owner(&self) -> [u32; 4] {
        [self.mode, self.uid, self.gid, self.nlink]
    }
}

/// The oracle: the same operations on plain maps.
#[derive(Debug, Clone)]
pub struct Model {
    nodes: HashMap<u64, MNode>,
    next: u64,
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
    /// The extended attributes of the inode at `path`, to change attribute `name`.
    /// Linux: user.* attributes only on regular files and directories.
    fn xattrs_mut(
        &mut self,
        path: &str,
        name: &str,
    ) -> Result<&mut BTreeMap<Vec<u8>, Vec<u8>>, i32> {
        let ino = self.resolve(path)?;
        let n = self.nodes.get_mut(&ino).unwrap();
        if matches!(n.kind, Kind::Symlink(_)) && name.starts_with("user.") {
            return Err(libc::EPERM);
        }
        Ok(&mut n.xattrs)
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
                // A default ACL of the directory is inherited (the ACL arithmetic is the
                // volume's own, checked against tmpfs elsewhere; here what matters is
                // that it lands with the create, atomically).
                let mut xattrs = BTreeMap::new();
                let mut mode = mode;
                if let (Some(dacl), false) = (
                    self.nodes[&d].xattrs.get(DEFAULT_XATTR),
                    matches!(op, Step::Symlink(..)),
                ) {
                    let inh = acl::inherit(Some(dacl), mode, 0, is_dir).unwrap();
                    mode = inh.mode;
                    if let Some(a) = inh.access {
                        xattrs.insert(ACCESS_XATTR.to_vec(), a);
                    }
                    if let Some(a) = inh.default {
                        xattrs.insert(DEFAULT_XATTR.to_vec(), a);
                    }
                }
                let ino = self.new_node(kind, mode, d);
                self.nodes.get_mut(&ino).unwrap().xattrs = xattrs;
                if sgid {
                    self.nodes.get_mut(&ino).unwrap().gid = pgid;
                }
                self.children_mut(d).insert(name.as_bytes().to_vec(), ino);
                if is_dir {
                    self.nodes.get_mut(&d).unwrap().nlink += 1;
                }
                Ok(())
            }
            Step::Write(p, off, len, seed) | Step::LandingWrite(p, off, len, seed) => {
                let ino = self.resolve(p)?;
                let data = self.file_mut(ino)?;
                let end = *off as usize + len;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*off as usize..end].copy_from_slice(&pattern(*off, *len, *seed));
                Ok(())
            }
            Step::LandingAbort(p, ..) => {
                // Fails as a write would (no such file, a directory), else no change.
                let ino = self.resolve(p)?;
                self.file_mut(ino)?;
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
                // The access ACL follows the mode (`posix_acl_chmod`).
                if let Some(bytes) = n.xattrs.get_mut(ACCESS_XATTR) {
                    let mut a = Acl::decode(bytes).unwrap();
                    a.chmod(n.mode);
                    *bytes = a.encode();
                }
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
            Step::SetXattr(p, k, v) if k.as_bytes() == ACCESS_XATTR => {
                // The mode takes the ACL's bits; an ACL the mode says entirely goes.
                let a = Acl::decode(v).map_err(|_| libc::EINVAL)?;
                let ino = self.resolve(p)?;
                let n = self.nodes.get_mut(&ino).unwrap();
                let (rwx, equiv) = a.equiv_mode();
                n.mode = (n.mode & !0o777) | rwx;
                if equiv {
                    n.xattrs.remove(ACCESS_XATTR);
                } else {
                    n.xattrs.insert(ACCESS_XATTR.to_vec(), a.encode());
                }
                Ok(())
            }
            Step::SetXattr(p, k, v) if k.as_bytes() == DEFAULT_XATTR => {
                let a = Acl::decode(v).map_err(|_| libc::EINVAL)?;
                let ino = self.resolve(p)?;
                if !self.is_dir(ino) {
                    return Err(libc::EACCES);
                }
                let n = self.nodes.get_mut(&ino).unwrap();
                n.xattrs.insert(DEFAULT_XATTR.to_vec(), a.encode());
                Ok(())
            }
            Step::SetXattr(p, k, v) => {
                self.xattrs_mut(p, k)?
                    .insert(k.as_bytes().to_vec(), v.clone());
                Ok(())
            }
            // Removing an ACL there is none of succeeds, as on Linux.
            Step::RemoveXattr(p, k) if k.starts_with("system.posix_acl_") => {
                let ino = self.resolve(p)?;
                self.nodes
                    .get_mut(&ino)
                    .unwrap()
                    .xattrs
                    .remove(k.as_bytes());
                Ok(())
            }
            Step::RemoveXattr(p, k) => self
                .xattrs_mut(p, k)?
                .remove(k.as_bytes())
                .map(|_| ())
                .ok_or(libc::ENODATA),
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
            out.push(line(prefix, "dir", n.mode_owner(), &[], &n.xattrs, None));
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
                    Kind::File(data) => {
                        out.push(line(&path, "file", cn.mode_owner(), data, &cn.xattrs, None))
                    }
                    Kind::Symlink(t) => out.push(line(
                        &path,
                        "symlink",
                        cn.mode_owner(),
                        &[],
                        &cn.xattrs,
                        Some(t),
                    )),
                }
            }
        }
    }
}
