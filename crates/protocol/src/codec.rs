//! Encoding and decoding of headers, request bodies and reply bodies.

use crate::*;
use zcfs_backend::{SetTime, Time};

/// Bounds-checked little-endian reader over a body.
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cur<'a> {
    fn new(b: &'a [u8]) -> Cur<'a> {
        Cur { b, at: 0 }
    }
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or(ProtoError::Truncated(what))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn i64(&mut self, what: &'static str) -> Result<i64> {
        Ok(self.u64(what)? as i64)
    }
    fn bytes16(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>> {
        let n = self.u16(what)? as usize;
        if n > max {
            return Err(ProtoError::TooLarge { what, len: n, max });
        }
        Ok(self.take(n, what)?.to_vec())
    }
    fn bytes32(&mut self, what: &'static str, max: usize) -> Result<Vec<u8>> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(ProtoError::TooLarge { what, len: n, max });
        }
        Ok(self.take(n, what)?.to_vec())
    }
    fn name(&mut self, what: &'static str) -> Result<Vec<u8>> {
        let n = self.bytes16(what, MAX_NAME)?;
        check_name(&n)?;
        Ok(n)
    }
    fn end(&self) -> Result<()> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(ProtoError::Invalid("trailing bytes in body"))
        }
    }
}

/// File names on the wire: 1..=255 bytes, no '/' or NUL. "." and ".." are allowed only
/// for lookup (checked by the caller).
pub fn check_name(n: &[u8]) -> Result<()> {
    if n.is_empty() || n.len() > MAX_NAME || n.iter().any(|&c| c == b'/' || c == 0) {
        return Err(ProtoError::Invalid("file name"));
    }
    Ok(())
}

fn no_dots(n: &[u8]) -> Result<()> {
    if n == b"." || n == b".." {
        return Err(ProtoError::Invalid("file name . or .."));
    }
    Ok(())
}

fn check_offset(o: u64) -> Result<()> {
    if o > i64::MAX as u64 {
        return Err(ProtoError::Invalid("offset beyond 2^63"));
    }
    Ok(())
}

fn put_bytes16(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_bytes32(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

impl ReqHeader {
    pub fn encode(&self) -> [u8; REQ_HDR] {
        let mut b = [0u8; REQ_HDR];
        b[0..2].copy_from_slice(&REQ_MAGIC.to_le_bytes());
        b[2] = VERSION as u8;
        b[3] = self.op;
        b[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.ino.to_le_bytes());
        b[24..32].copy_from_slice(&self.fh.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.size.to_le_bytes());
        b[44..48].copy_from_slice(&self.flags.to_le_bytes());
        b[48..52].copy_from_slice(&self.uid.to_le_bytes());
        b[52..56].copy_from_slice(&self.gid.to_le_bytes());
        b[56..60].copy_from_slice(&self.mode.to_le_bytes());
        b[60..64].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    /// Decode and check the limits a receiver needs before reading further.
    pub fn decode(b: &[u8; REQ_HDR]) -> Result<ReqHeader> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != REQ_MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        if b[2] as u16 != VERSION {
            return Err(ProtoError::BadVersion(b[2] as u16));
        }
        let h = ReqHeader {
            op: b[3],
            body_len: u32_at(4),
            id: u64_at(8),
            ino: u64_at(16),
            fh: u64_at(24),
            offset: u64_at(32),
            size: u32_at(40),
            flags: u32_at(44),
            uid: u32_at(48),
            gid: u32_at(52),
            mode: u32_at(56),
            aux: u32_at(60),
        };
        let op = Op::from_u8(h.op)?;
        if h.body_len as usize > MAX_BODY {
            return Err(ProtoError::TooLarge {
                what: "request body",
                len: h.body_len as usize,
                max: MAX_BODY,
            });
        }
        if h.size as usize > MAX_DATA {
            return Err(ProtoError::TooLarge {
                what: "data",
                len: h.size as usize,
                max: MAX_DATA,
            });
        }
        if matches!(op, Op::Read | Op::Write | Op::Fallocate) {
            check_offset(h.offset)?;
            check_offset(h.offset.saturating_add(h.size as u64))?;
        }
        Ok(h)
    }

    /// Bytes of bulk data that follow the body (writes only).
    pub fn data_len(&self) -> usize {
        if self.op == Op::Write as u8 {
            self.size as usize
        } else {
            0
        }
    }

    pub fn cred(&self) -> Cred {
        Cred {
            uid: self.uid,
            gid: self.gid,
        }
    }
}

impl RespHeader {
    pub fn encode(&self) -> [u8; RESP_HDR] {
        let mut b = [0u8; RESP_HDR];
        b[0..2].copy_from_slice(&RESP_MAGIC.to_le_bytes());
        b[2] = VERSION as u8;
        b[3] = self.op;
        b[4..8].copy_from_slice(&self.status.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..20].copy_from_slice(&self.body_len.to_le_bytes());
        b[20..24].copy_from_slice(&self.data_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; RESP_HDR]) -> Result<RespHeader> {
        let magic = u16::from_le_bytes([b[0], b[1]]);
        if magic != RESP_MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        if b[2] as u16 != VERSION {
            return Err(ProtoError::BadVersion(b[2] as u16));
        }
        let h = RespHeader {
            op: b[3],
            status: i32::from_le_bytes(b[4..8].try_into().unwrap()),
            id: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            body_len: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            data_len: u32::from_le_bytes(b[20..24].try_into().unwrap()),
            aux: u64::from_le_bytes(b[24..32].try_into().unwrap()),
        };
        Op::from_u8(h.op)?;
        if h.body_len as usize > MAX_BODY {
            return Err(ProtoError::TooLarge {
                what: "response body",
                len: h.body_len as usize,
                max: MAX_BODY,
            });
        }
        if h.data_len as usize > MAX_DATA {
            return Err(ProtoError::TooLarge {
                what: "response data",
                len: h.data_len as usize,
                max: MAX_DATA,
            });
        }
        if h.status < 0 || h.status > 4095 {
            return Err(ProtoError::Invalid("status"));
        }
        Ok(h)
    }
}

fn put_time(out: &mut Vec<u8>, t: Time) {
    out.extend_from_slice(&t.sec.to_le_bytes());
    out.extend_from_slice(&t.nsec.to_le_bytes());
}

fn get_time(c: &mut Cur<'_>) -> Result<Time> {
    let sec = c.i64("time")?;
    let nsec = c.u32("time")?;
    if nsec >= 1_000_000_000 {
        return Err(ProtoError::Invalid("nanoseconds"));
    }
    Ok(Time { sec, nsec })
}

pub fn encode_attr(out: &mut Vec<u8>, a: &Attr) {
    let start = out.len();
    for v in [a.ino, a.generation, a.size, a.blocks] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    put_time(out, a.atime);
    put_time(out, a.mtime);
    put_time(out, a.ctime);
    for v in [a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.resize(start + ATTR_LEN, 0);
}

fn decode_attr(c: &mut Cur<'_>) -> Result<Attr> {
    let start = c.at;
    let a = Attr {
        ino: c.u64("attr")?,
        generation: c.u64("attr")?,
        size: c.u64("attr")?,
        blocks: c.u64("attr")?,
        atime: get_time(c)?,
        mtime: get_time(c)?,
        ctime: get_time(c)?,
        mode: c.u32("attr")?,
        nlink: c.u32("attr")?,
        uid: c.u32("attr")?,
        gid: c.u32("attr")?,
        rdev: c.u32("attr")?,
        blksize: c.u32("attr")?,
    };
    c.take(ATTR_LEN - (c.at - start), "attr padding")?;
    Ok(a)
}

fn put_settime(out: &mut Vec<u8>, t: Option<SetTime>) {
    match t {
        None => {
            out.push(0);
            put_time(out, Time::default())
        }
        Some(SetTime::Now) => {
            out.push(1);
            put_time(out, Time::default())
        }
        Some(SetTime::At(t)) => {
            out.push(2);
            put_time(out, t)
        }
    }
}

fn get_settime(c: &mut Cur<'_>) -> Result<Option<SetTime>> {
    let k = c.u8("settime")?;
    let t = get_time(c)?;
    match k {
        0 => Ok(None),
        1 => Ok(Some(SetTime::Now)),
        2 => Ok(Some(SetTime::At(t))),
        _ => Err(ProtoError::Invalid("settime kind")),
    }
}

impl Request {
    pub fn op(&self) -> Op {
        match self {
            Request::Lookup { .. } => Op::Lookup,
            Request::Getattr { .. } => Op::Getattr,
            Request::Setattr { .. } => Op::Setattr,
            Request::Readlink { .. } => Op::Readlink,
            Request::Mknod { .. } => Op::Mknod,
            Request::Mkdir { .. } => Op::Mkdir,
            Request::Unlink { .. } => Op::Unlink,
            Request::Rmdir { .. } => Op::Rmdir,
            Request::Symlink { .. } => Op::Symlink,
            Request::Rename { .. } => Op::Rename,
            Request::Link { .. } => Op::Link,
            Request::Open { .. } => Op::Open,
            Request::Create { .. } => Op::Create,
            Request::Read { .. } => Op::Read,
            Request::Write { .. } => Op::Write,
            Request::Flush { .. } => Op::Flush,
            Request::Release { .. } => Op::Release,
            Request::Fsync { .. } => Op::Fsync,
            Request::Readdir { .. } => Op::Readdir,
            Request::Statfs => Op::Statfs,
            Request::Setxattr { .. } => Op::Setxattr,
            Request::Getxattr { .. } => Op::Getxattr,
            Request::Listxattr { .. } => Op::Listxattr,
            Request::Removexattr { .. } => Op::Removexattr,
            Request::Fallocate { .. } => Op::Fallocate,
            Request::SyncAll => Op::SyncAll,
            Request::Ping => Op::Ping,
            Request::Stats => Op::Stats,
        }
    }

    /// Header and body for this request (write data goes after them).
    pub fn encode(&self, id: u64, cred: Cred) -> ([u8; REQ_HDR], Vec<u8>) {
        let mut h = ReqHeader {
            op: self.op() as u8,
            id,
            uid: cred.uid,
            gid: cred.gid,
            ..Default::default()
        };
        let mut body = Vec::new();
        match self {
            Request::Lookup { parent, name }
            | Request::Unlink { parent, name }
            | Request::Rmdir { parent, name } => {
                h.ino = *parent;
                put_bytes16(&mut body, name);
            }
            Request::Getattr { ino } | Request::Readlink { ino } | Request::Listxattr { ino } => {
                h.ino = *ino
            }
            Request::Setattr { ino, set } => {
                h.ino = *ino;
                let valid = set.mode.is_some() as u32
                    | (set.uid.is_some() as u32) << 1
                    | (set.gid.is_some() as u32) << 2
                    | (set.size.is_some() as u32) << 3;
                body.extend_from_slice(&valid.to_le_bytes());
                body.extend_from_slice(&set.mode.unwrap_or(0).to_le_bytes());
                body.extend_from_slice(&set.uid.unwrap_or(0).to_le_bytes());
                body.extend_from_slice(&set.gid.unwrap_or(0).to_le_bytes());
                body.extend_from_slice(&set.size.unwrap_or(0).to_le_bytes());
                put_settime(&mut body, set.atime);
                put_settime(&mut body, set.mtime);
            }
            Request::Mknod {
                parent,
                name,
                mode,
                rdev,
            } => {
                h.ino = *parent;
                h.mode = *mode;
                h.aux = *rdev;
                put_bytes16(&mut body, name);
            }
            Request::Mkdir { parent, name, mode } => {
                h.ino = *parent;
                h.mode = *mode;
                put_bytes16(&mut body, name);
            }
            Request::Symlink {
                parent,
                name,
                target,
            } => {
                h.ino = *parent;
                put_bytes16(&mut body, name);
                put_bytes16(&mut body, target);
            }
            Request::Rename {
                parent,
                name,
                newparent,
                newname,
                flags,
            } => {
                h.ino = *parent;
                h.fh = *newparent;
                h.flags = *flags;
                put_bytes16(&mut body, name);
                put_bytes16(&mut body, newname);
            }
            Request::Link {
                ino,
                newparent,
                newname,
            } => {
                h.ino = *ino;
                h.fh = *newparent;
                put_bytes16(&mut body, newname);
            }
            Request::Open { ino, flags } => {
                h.ino = *ino;
                h.flags = *flags as u32;
            }
            Request::Create {
                parent,
                name,
                mode,
                flags,
            } => {
                h.ino = *parent;
                h.mode = *mode;
                h.flags = *flags as u32;
                put_bytes16(&mut body, name);
            }
            Request::Read {
                ino,
                fh,
                offset,
                size,
            }
            | Request::Write {
                ino,
                fh,
                offset,
                size,
            } => {
                h.ino = *ino;
                h.fh = *fh;
                h.offset = *offset;
                h.size = *size;
            }
            Request::Flush { ino, fh } | Request::Release { ino, fh } => {
                h.ino = *ino;
                h.fh = *fh;
            }
            Request::Fsync { ino, fh, datasync } => {
                h.ino = *ino;
                h.fh = *fh;
                h.flags = *datasync as u32;
            }
            Request::Readdir {
                ino,
                cookie,
                plus,
                max_entries,
            } => {
                h.ino = *ino;
                h.offset = *cookie;
                h.flags = *plus as u32;
                h.size = *max_entries;
            }
            Request::Setxattr {
                ino,
                name,
                value,
                flags,
            } => {
                h.ino = *ino;
                h.flags = *flags as u32;
                put_bytes16(&mut body, name);
                put_bytes32(&mut body, value);
            }
            Request::Getxattr { ino, name } | Request::Removexattr { ino, name } => {
                h.ino = *ino;
                put_bytes16(&mut body, name);
            }
            Request::Fallocate {
                ino,
                fh,
                offset,
                len,
                mode,
            } => {
                h.ino = *ino;
                h.fh = *fh;
                h.offset = *offset;
                h.flags = *mode as u32;
                body.extend_from_slice(&len.to_le_bytes());
            }
            Request::Statfs | Request::SyncAll | Request::Ping | Request::Stats => {}
        }
        h.body_len = body.len() as u32;
        (h.encode(), body)
    }

    /// Decode a request from its (already checked) header and body.
    pub fn decode(h: &ReqHeader, body: &[u8]) -> Result<Request> {
        let op = Op::from_u8(h.op)?;
        if body.len() != h.body_len as usize {
            return Err(ProtoError::Truncated("request body"));
        }
        let mut c = Cur::new(body);
        let ino = h.ino;
        let r = match op {
            Op::Lookup => Request::Lookup {
                parent: ino,
                name: c.name("name")?,
            },
            Op::Unlink => Request::Unlink {
                parent: ino,
                name: named(&mut c)?,
            },
            Op::Rmdir => Request::Rmdir {
                parent: ino,
                name: named(&mut c)?,
            },
            Op::Getattr => Request::Getattr { ino },
            Op::Readlink => Request::Readlink { ino },
            Op::Listxattr => Request::Listxattr { ino },
            Op::Setattr => {
                let valid = c.u32("setattr")?;
                if valid & !0xf != 0 {
                    return Err(ProtoError::Invalid("setattr valid bits"));
                }
                let mode = c.u32("setattr")?;
                let uid = c.u32("setattr")?;
                let gid = c.u32("setattr")?;
                let size = c.u64("setattr")?;
                check_offset(size)?;
                let atime = get_settime(&mut c)?;
                let mtime = get_settime(&mut c)?;
                let set = SetAttr {
                    mode: (valid & 1 != 0).then_some(mode),
                    uid: (valid & 2 != 0).then_some(uid),
                    gid: (valid & 4 != 0).then_some(gid),
                    size: (valid & 8 != 0).then_some(size),
                    atime,
                    mtime,
                };
                Request::Setattr { ino, set }
            }
            Op::Mknod => Request::Mknod {
                parent: ino,
                name: named(&mut c)?,
                mode: h.mode,
                rdev: h.aux,
            },
            Op::Mkdir => Request::Mkdir {
                parent: ino,
                name: named(&mut c)?,
                mode: h.mode,
            },
            Op::Symlink => {
                let name = named(&mut c)?;
                let target = c.bytes16("symlink target", MAX_SYMLINK)?;
                if target.is_empty() || target.contains(&0) {
                    return Err(ProtoError::Invalid("symlink target"));
                }
                Request::Symlink {
                    parent: ino,
                    name,
                    target,
                }
            }
            Op::Rename => {
                if h.flags & !3 != 0 || h.flags == 3 {
                    return Err(ProtoError::Invalid("rename flags"));
                }
                Request::Rename {
                    parent: ino,
                    name: named(&mut c)?,
                    newparent: h.fh,
                    newname: named(&mut c)?,
                    flags: h.flags,
                }
            }
            Op::Link => Request::Link {
                ino,
                newparent: h.fh,
                newname: named(&mut c)?,
            },
            Op::Open => Request::Open {
                ino,
                flags: h.flags as i32,
            },
            Op::Create => Request::Create {
                parent: ino,
                name: named(&mut c)?,
                mode: h.mode,
                flags: h.flags as i32,
            },
            Op::Read => Request::Read {
                ino,
                fh: h.fh,
                offset: h.offset,
                size: h.size,
            },
            Op::Write => Request::Write {
                ino,
                fh: h.fh,
                offset: h.offset,
                size: h.size,
            },
            Op::Flush => Request::Flush { ino, fh: h.fh },
            Op::Release => Request::Release { ino, fh: h.fh },
            Op::Fsync => Request::Fsync {
                ino,
                fh: h.fh,
                datasync: h.flags & 1 != 0,
            },
            Op::Readdir => {
                if h.size == 0 || h.size as usize > MAX_ENTRIES {
                    return Err(ProtoError::Invalid("readdir entry count"));
                }
                Request::Readdir {
                    ino,
                    cookie: h.offset,
                    plus: h.flags & 1 != 0,
                    max_entries: h.size,
                }
            }
            Op::Statfs => Request::Statfs,
            Op::Setxattr => {
                let name = xattr_name(&mut c)?;
                let value = c.bytes32("xattr value", MAX_XATTR_VALUE)?;
                Request::Setxattr {
                    ino,
                    name,
                    value,
                    flags: h.flags as i32,
                }
            }
            Op::Getxattr => Request::Getxattr {
                ino,
                name: xattr_name(&mut c)?,
            },
            Op::Removexattr => Request::Removexattr {
                ino,
                name: xattr_name(&mut c)?,
            },
            Op::Fallocate => {
                let len = c.u64("fallocate")?;
                check_offset(h.offset.saturating_add(len))?;
                Request::Fallocate {
                    ino,
                    fh: h.fh,
                    offset: h.offset,
                    len,
                    mode: h.flags as i32,
                }
            }
            Op::SyncAll => Request::SyncAll,
            Op::Ping => Request::Ping,
            Op::Stats => Request::Stats,
        };
        c.end()?;
        Ok(r)
    }
}

fn named(c: &mut Cur<'_>) -> Result<Vec<u8>> {
    let n = c.name("name")?;
    no_dots(&n)?;
    Ok(n)
}

fn xattr_name(c: &mut Cur<'_>) -> Result<Vec<u8>> {
    let n = c.bytes16("xattr name", MAX_XATTR_NAME)?;
    if n.is_empty() || n.contains(&0) {
        return Err(ProtoError::Invalid("xattr name"));
    }
    Ok(n)
}

impl Reply {
    /// Body bytes and the header's aux value for this reply.
    pub fn encode(&self) -> (Vec<u8>, u64) {
        let mut b = Vec::new();
        let mut aux = 0;
        match self {
            Reply::Empty => {}
            Reply::Attr(a) => encode_attr(&mut b, a),
            Reply::Created(a, fh) => {
                encode_attr(&mut b, a);
                aux = *fh;
            }
            Reply::Handle(fh) => aux = *fh,
            Reply::Written(n) => aux = *n as u64,
            Reply::Bytes(v) | Reply::Stats(v) => b.extend_from_slice(v),
            Reply::Entries(es) => {
                b.extend_from_slice(&(es.len() as u32).to_le_bytes());
                for e in es {
                    b.extend_from_slice(&e.ino.to_le_bytes());
                    b.extend_from_slice(&e.kind.to_le_bytes());
                    b.extend_from_slice(&e.next.to_le_bytes());
                    b.push(e.attr.is_some() as u8);
                    put_bytes16(&mut b, &e.name);
                    if let Some(a) = &e.attr {
                        encode_attr(&mut b, a);
                    }
                }
            }
            Reply::Names(ns) => {
                b.extend_from_slice(&(ns.len() as u32).to_le_bytes());
                for n in ns {
                    put_bytes16(&mut b, n);
                }
            }
            Reply::StatFs(s) => {
                for v in [s.blocks, s.bfree, s.bavail, s.files, s.ffree] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
                for v in [s.bsize, s.namelen, s.frsize] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        (b, aux)
    }

    /// Decode the body of a successful reply to `op`.
    pub fn decode(op: Op, h: &RespHeader, body: &[u8]) -> Result<Reply> {
        if body.len() != h.body_len as usize {
            return Err(ProtoError::Truncated("response body"));
        }
        let mut c = Cur::new(body);
        let r = match op {
            Op::Lookup
            | Op::Getattr
            | Op::Setattr
            | Op::Mknod
            | Op::Mkdir
            | Op::Symlink
            | Op::Link => Reply::Attr(decode_attr(&mut c)?),
            Op::Create => Reply::Created(decode_attr(&mut c)?, h.aux),
            Op::Open => Reply::Handle(h.aux),
            Op::Write => {
                let n = u32::try_from(h.aux).map_err(|_| ProtoError::Invalid("written count"))?;
                Reply::Written(n)
            }
            Op::Readlink | Op::Getxattr => Reply::Bytes(c.take(body.len(), "bytes")?.to_vec()),
            Op::Stats => Reply::Stats(c.take(body.len(), "stats")?.to_vec()),
            Op::Readdir => {
                let n = c.u32("entries")? as usize;
                if n > MAX_ENTRIES {
                    return Err(ProtoError::TooLarge {
                        what: "directory entries",
                        len: n,
                        max: MAX_ENTRIES,
                    });
                }
                let mut es = Vec::with_capacity(n);
                for _ in 0..n {
                    let ino = c.u64("entry")?;
                    let kind = c.u32("entry")?;
                    let next = c.u64("entry")?;
                    let has_attr = c.u8("entry")?;
                    let name = c.name("entry name")?;
                    let attr = match has_attr {
                        0 => None,
                        1 => Some(decode_attr(&mut c)?),
                        _ => return Err(ProtoError::Invalid("entry attr flag")),
                    };
                    if next == 0 {
                        return Err(ProtoError::Invalid("entry cookie 0"));
                    }
                    es.push(DirEntry {
                        name,
                        ino,
                        kind,
                        next,
                        attr,
                    });
                }
                Reply::Entries(es)
            }
            Op::Listxattr => {
                let n = c.u32("names")? as usize;
                if n > MAX_BODY / 3 {
                    return Err(ProtoError::TooLarge {
                        what: "xattr names",
                        len: n,
                        max: MAX_BODY / 3,
                    });
                }
                let mut ns = Vec::with_capacity(n);
                for _ in 0..n {
                    ns.push(c.bytes16("xattr name", MAX_XATTR_NAME)?);
                }
                Reply::Names(ns)
            }
            Op::Statfs => {
                let mut v = [0u64; 5];
                for x in &mut v {
                    *x = c.u64("statfs")?;
                }
                Reply::StatFs(StatFs {
                    blocks: v[0],
                    bfree: v[1],
                    bavail: v[2],
                    files: v[3],
                    ffree: v[4],
                    bsize: c.u32("statfs")?,
                    namelen: c.u32("statfs")?,
                    frsize: c.u32("statfs")?,
                })
            }
            Op::Read
            | Op::Unlink
            | Op::Rmdir
            | Op::Rename
            | Op::Flush
            | Op::Release
            | Op::Fsync
            | Op::Setxattr
            | Op::Removexattr
            | Op::Fallocate
            | Op::SyncAll
            | Op::Ping => Reply::Empty,
        };
        c.end()?;
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            any::<u8>().prop_filter("no / or NUL", |c| *c != b'/' && *c != 0),
            1..=255,
        )
        .prop_filter("no dots", |n| n != b"." && n != b"..")
    }

    fn time() -> impl Strategy<Value = Time> {
        (any::<i64>(), 0u32..1_000_000_000).prop_map(|(sec, nsec)| Time { sec, nsec })
    }

    fn attr() -> impl Strategy<Value = Attr> {
        (any::<[u64; 4]>(), time(), time(), time(), any::<[u32; 6]>()).prop_map(
            |(a, at, mt, ct, b)| Attr {
                ino: a[0],
                generation: a[1],
                size: a[2],
                blocks: a[3],
                atime: at,
                mtime: mt,
                ctime: ct,
                mode: b[0],
                nlink: b[1],
                uid: b[2],
                gid: b[3],
                rdev: b[4],
                blksize: b[5],
            },
        )
    }

    fn settime() -> impl Strategy<Value = Option<SetTime>> {
        prop_oneof![
            Just(None),
            Just(Some(SetTime::Now)),
            time().prop_map(|t| Some(SetTime::At(t)))
        ]
    }

    fn offset() -> impl Strategy<Value = u64> {
        0u64..(i64::MAX as u64 - MAX_DATA as u64)
    }

    fn request() -> impl Strategy<Value = Request> {
        let ino = any::<u64>();
        prop_oneof![
            (ino, name()).prop_map(|(parent, name)| Request::Lookup { parent, name }),
            ino.prop_map(|ino| Request::Getattr { ino }),
            (
                ino,
                (
                    prop::option::of(any::<u32>()),
                    prop::option::of(any::<u32>()),
                    prop::option::of(any::<u32>())
                ),
                prop::option::of(0u64..i64::MAX as u64),
                settime(),
                settime()
            )
                .prop_map(|(ino, (mode, uid, gid), size, atime, mtime)| {
                    Request::Setattr {
                        ino,
                        set: SetAttr {
                            mode,
                            uid,
                            gid,
                            size,
                            atime,
                            mtime,
                        },
                    }
                }),
            (ino, name(), any::<u32>(), any::<u32>()).prop_map(|(parent, name, mode, rdev)| {
                Request::Mknod {
                    parent,
                    name,
                    mode,
                    rdev,
                }
            }),
            (
                ino,
                name(),
                name(),
                prop::collection::vec(1u8..=255, 1..4095)
            )
                .prop_map(|(parent, name, _, target)| Request::Symlink {
                    parent,
                    name,
                    target
                }),
            (ino, name(), any::<u64>(), name(), 0u32..3).prop_map(
                |(parent, name, newparent, newname, flags)| Request::Rename {
                    parent,
                    name,
                    newparent,
                    newname,
                    flags
                }
            ),
            (ino, any::<u64>(), offset(), 0u32..=MAX_DATA as u32).prop_map(
                |(ino, fh, offset, size)| Request::Write {
                    ino,
                    fh,
                    offset,
                    size
                }
            ),
            (ino, any::<u64>(), offset(), 0u32..=MAX_DATA as u32).prop_map(
                |(ino, fh, offset, size)| Request::Read {
                    ino,
                    fh,
                    offset,
                    size
                }
            ),
            (ino, any::<u64>(), any::<bool>(), 1u32..=MAX_ENTRIES as u32).prop_map(
                |(ino, cookie, plus, max_entries)| Request::Readdir {
                    ino,
                    cookie,
                    plus,
                    max_entries
                }
            ),
            (
                ino,
                prop::collection::vec(1u8..=255, 1..255),
                prop::collection::vec(any::<u8>(), 0..5000),
                0i32..3
            )
                .prop_map(|(ino, name, value, flags)| Request::Setxattr {
                    ino,
                    name,
                    value,
                    flags
                }),
            (ino, any::<u64>(), offset(), 0u64..1 << 40, any::<i32>()).prop_map(
                |(ino, fh, offset, len, mode)| Request::Fallocate {
                    ino,
                    fh,
                    offset,
                    len,
                    mode
                }
            ),
            Just(Request::Statfs),
            Just(Request::Stats),
        ]
    }

    proptest! {
        #[test]
        fn requests_round_trip(r in request(), id in any::<u64>(), uid in any::<u32>(), gid in any::<u32>()) {
            let (h, body) = r.encode(id, Cred { uid, gid });
            let hd = ReqHeader::decode(&h).unwrap();
            prop_assert_eq!(hd.id, id);
            prop_assert_eq!(hd.cred(), Cred { uid, gid });
            prop_assert_eq!(Request::decode(&hd, &body).unwrap(), r);
        }

        #[test]
        fn replies_round_trip(a in attr(), fh in any::<u64>(), names in prop::collection::vec(name(), 0..20), n in any::<u32>()) {
            let entries: Vec<DirEntry> = names.iter().enumerate().map(|(i, nm)| DirEntry {
                name: nm.clone(), ino: i as u64, kind: 0o100000, next: i as u64 + 1, attr: (i % 2 == 0).then(|| a.clone())
            }).collect();
            for (op, r) in [
                (Op::Getattr, Reply::Attr(a.clone())),
                (Op::Create, Reply::Created(a.clone(), fh)),
                (Op::Open, Reply::Handle(fh)),
                (Op::Write, Reply::Written(n)),
                (Op::Readdir, Reply::Entries(entries)),
                (Op::Listxattr, Reply::Names(names.clone())),
                (Op::Readlink, Reply::Bytes(names.concat())),
                (Op::Statfs, Reply::StatFs(StatFs { blocks: fh, bfree: 1, bavail: 2, files: 3, ffree: 4, bsize: 4096, namelen: 255, frsize: n })),
            ] {
                let (body, aux) = r.encode();
                let h = RespHeader { op: op as u8, status: 0, id: 1, body_len: body.len() as u32, data_len: 0, aux };
                let hd = RespHeader::decode(&h.encode()).unwrap();
                prop_assert_eq!(Reply::decode(op, &hd, &body).unwrap(), r);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(hdr in prop::collection::vec(any::<u8>(), REQ_HDR), body in prop::collection::vec(any::<u8>(), 0..600)) {
            let h: [u8; REQ_HDR] = hdr.try_into().unwrap();
            if let Ok(h) = ReqHeader::decode(&h) {
                let _ = Request::decode(&h, &body);
            }
            let rh: [u8; RESP_HDR] = h_resp(&body);
            if let Ok(rh) = RespHeader::decode(&rh) {
                for op in ALL_OPS {
                    let _ = Reply::decode(op, &rh, &body);
                }
            }
        }
    }

    fn h_resp(b: &[u8]) -> [u8; RESP_HDR] {
        let mut h = [0u8; RESP_HDR];
        for (i, x) in b.iter().take(RESP_HDR).enumerate() {
            h[i] = *x;
        }
        h
    }

    #[test]
    fn limits_are_enforced() {
        let (mut h, _) = Request::Read {
            ino: 1,
            fh: 0,
            offset: 0,
            size: 10,
        }
        .encode(1, Cred::default());
        h[40..44].copy_from_slice(&(MAX_DATA as u32 + 1).to_le_bytes());
        assert!(matches!(
            ReqHeader::decode(&h),
            Err(ProtoError::TooLarge { .. })
        ));
        let (mut h, _) = Request::Statfs.encode(1, Cred::default());
        h[4..8].copy_from_slice(&(MAX_BODY as u32 + 1).to_le_bytes());
        assert!(matches!(
            ReqHeader::decode(&h),
            Err(ProtoError::TooLarge { .. })
        ));
        h[3] = 200;
        assert!(matches!(
            ReqHeader::decode(&h),
            Err(ProtoError::UnknownOp(200))
        ));
        h[0] = 0;
        assert!(matches!(
            ReqHeader::decode(&h),
            Err(ProtoError::BadMagic(_))
        ));
        let (h, _) = Request::Read {
            ino: 1,
            fh: 0,
            offset: u64::MAX - 5,
            size: 10,
        }
        .encode(1, Cred::default());
        assert!(ReqHeader::decode(&h).is_err(), "offset overflow accepted");
        // Names with '/' or "..", and a body that does not match its length.
        for bad in [&b"a/b"[..], b"..", b""] {
            let (h, body) = Request::Unlink {
                parent: 1,
                name: bad.to_vec(),
            }
            .encode(1, Cred::default());
            assert!(Request::decode(&ReqHeader::decode(&h).unwrap(), &body).is_err());
        }
        let (h, mut body) = Request::Lookup {
            parent: 1,
            name: b"x".to_vec(),
        }
        .encode(1, Cred::default());
        body.push(0);
        assert!(Request::decode(&ReqHeader::decode(&h).unwrap(), &body).is_err());
        assert!(Request::decode(&ReqHeader::decode(&h).unwrap(), &body[..2]).is_err());
    }
}
