//! Field types with their limits: inode references, names, symlink targets, xattr names
//! and values, bounded lists, and the codecs of the Backend's attribute types. A value
//! of one of these types is valid by construction (`new` checks what `get` checks), so
//! a client finds a bad name before sending it.

use crate::wire::{wire_struct, Reader, Wire};
use crate::*;
use std::ops::Deref;
use zcfs_backend::{Attr, DirEntry, DirState, SetAttr, SetTime, StatFs, Time};

wire_struct! {
    /// An inode as a request names it: its number and, when the sender knows it, its
    /// generation (0 = not checked). A server answers ESTALE when the inode with that
    /// number has another generation, so a stale number never reaches a new file.
    #[derive(Copy, Hash, Default)]
    pub struct NodeRef {
        pub ino: u64,
        pub gen: u64,
    }
}

impl NodeRef {
    pub fn new(ino: u64, gen: u64) -> NodeRef {
        NodeRef { ino, gen }
    }
    /// An inode number without a generation check.
    pub fn ino(ino: u64) -> NodeRef {
        NodeRef { ino, gen: 0 }
    }
}

/// A byte string type: a length prefix of type `$len`, at most `$max` bytes (longer
/// is `TooLong` with `$errno`), and a content rule `$valid`.
macro_rules! bytes_type {
    ($(#[$m:meta])* $name:ident, $what:literal, $len:ty, $max:expr, $errno:expr, $valid:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Vec<u8>);

        impl $name {
            pub fn new(b: impl Into<Vec<u8>>) -> Result<$name> {
                let b = b.into();
                Self::check_len(b.len())?;
                ($valid)(&b)?;
                Ok($name(b))
            }
            fn check_len(len: usize) -> Result<()> {
                check_limit($what, len, $max, $errno)
            }
            pub fn as_bytes(&self) -> &[u8] {
                &self.0
            }
            pub fn into_bytes(self) -> Vec<u8> {
                self.0
            }
        }

        impl Deref for $name {
            type Target = [u8];
            fn deref(&self) -> &[u8] {
                &self.0
            }
        }

        impl Wire for $name {
            fn put(&self, out: &mut Vec<u8>) {
                // Fits: `new` and `get` bound the length far below the prefix's range.
                (self.0.len() as $len).put(out);
                out.extend_from_slice(&self.0);
            }
            fn get(r: &mut Reader<'_>) -> Result<Self> {
                let n = <$len>::get(r)? as usize;
                // The limit first: a 300-byte name is "too long" even in a short body.
                Self::check_len(n)?;
                let b = r.take(n, $what)?;
                ($valid)(b)?;
                Ok($name(b.to_vec()))
            }
            fn wire_len(&self) -> usize {
                std::mem::size_of::<$len>() + self.0.len()
            }
        }
    };
}

fn file_name_chars(n: &[u8]) -> Result<()> {
    if n.is_empty() {
        return Err(ProtoError::Invalid("empty file name"));
    }
    if n.iter().any(|&c| c == b'/' || c == 0) {
        return Err(ProtoError::Invalid("file name with '/' or NUL"));
    }
    Ok(())
}

fn entry_name(n: &[u8]) -> Result<()> {
    file_name_chars(n)?;
    if n == b"." || n == b".." {
        return Err(ProtoError::Invalid("file name . or .."));
    }
    Ok(())
}

fn no_nul(what: &'static str) -> impl Fn(&[u8]) -> Result<()> {
    move |b: &[u8]| {
        if b.is_empty() || b.contains(&0) {
            Err(ProtoError::Invalid(what))
        } else {
            Ok(())
        }
    }
}

fn anything(_: &[u8]) -> Result<()> {
    Ok(())
}

bytes_type!(
    /// A directory entry's name: 1..=255 bytes, no '/' or NUL, not "." or "..".
    Name, "file name", u16, MAX_NAME, libc::ENAMETOOLONG, entry_name
);
bytes_type!(
    /// A name to look up: as `Name`, but "." and ".." are allowed.
    LookupName, "file name", u16, MAX_NAME, libc::ENAMETOOLONG, file_name_chars
);
bytes_type!(
    /// A symlink's target: 1..=4095 bytes without NUL.
    SymlinkTarget, "symlink target", u16, MAX_SYMLINK, libc::ENAMETOOLONG,
    no_nul("symlink target empty or with NUL")
);
bytes_type!(
    /// An extended attribute's name: 1..=255 bytes without NUL.
    XattrName, "xattr name", u16, MAX_XATTR_NAME, libc::ERANGE,
    no_nul("xattr name empty or with NUL")
);
bytes_type!(
    /// An extended attribute's value: up to 64 KiB.
    XattrValue, "xattr value", u32, MAX_XATTR_VALUE, libc::E2BIG, anything
);
bytes_type!(
    /// Opaque bytes up to a body's size (the server's counters as JSON).
    Blob, "blob", u32, MAX_BODY, libc::E2BIG, anything
);

/// Linux renameat2 flags: 0, RENAME_NOREPLACE (1) or RENAME_EXCHANGE (2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RenameFlags(u32);

impl RenameFlags {
    pub const NOREPLACE: u32 = 1;
    pub const EXCHANGE: u32 = 2;

    pub fn new(bits: u32) -> Result<RenameFlags> {
        match bits {
            0 | Self::NOREPLACE | Self::EXCHANGE => Ok(RenameFlags(bits)),
            _ => Err(ProtoError::Invalid("rename flags")),
        }
    }
    pub fn bits(self) -> u32 {
        self.0
    }
}

impl Wire for RenameFlags {
    fn put(&self, out: &mut Vec<u8>) {
        self.0.put(out)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        RenameFlags::new(u32::get(r)?)
    }
}

/// A list of at most `MAX` items: a u32 count, then the items.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List<T, const MAX: usize>(Vec<T>);

impl<T, const MAX: usize> List<T, MAX> {
    pub fn new(items: Vec<T>) -> Result<Self> {
        Self::check_len(items.len())?;
        Ok(List(items))
    }
    fn check_len(len: usize) -> Result<()> {
        check_limit("list", len, MAX, libc::EINVAL)
    }
    pub fn into_vec(self) -> Vec<T> {
        self.0
    }
}

impl<T, const MAX: usize> Deref for List<T, MAX> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Wire, const MAX: usize> Wire for List<T, MAX> {
    fn put(&self, out: &mut Vec<u8>) {
        (self.0.len() as u32).put(out);
        for x in &self.0 {
            x.put(out);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        let n = u32::get(r)? as usize;
        Self::check_len(n)?;
        // Every item takes at least one byte: never reserve more than the body holds.
        let mut v = Vec::with_capacity(n.min(r.remaining()));
        for _ in 0..n {
            v.push(T::get(r)?);
        }
        Ok(List(v))
    }
}

impl Wire for Time {
    fn put(&self, out: &mut Vec<u8>) {
        self.sec.put(out);
        self.nsec.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        let sec = i64::get(r)?;
        let nsec = u32::get(r)?;
        if nsec >= 1_000_000_000 {
            return Err(ProtoError::Invalid("nanoseconds of 1e9 or more"));
        }
        Ok(Time { sec, nsec })
    }
}

impl Wire for DirState {
    fn put(&self, out: &mut Vec<u8>) {
        self.version.put(out);
        self.entries.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(DirState {
            version: u64::get(r)?,
            entries: u64::get(r)?,
        })
    }
}

/// Attr flag: the inode has no extended attributes.
pub const ATTR_NO_XATTRS: u32 = 1;
/// Every attr flag this version knows (others are refused).
pub const ATTR_FLAGS_KNOWN: u32 = ATTR_NO_XATTRS;

/// The fields, the flags, then zero padding to `ATTR_LEN` (room for later fields).
impl Wire for Attr {
    fn put(&self, out: &mut Vec<u8>) {
        let start = out.len();
        for v in [self.ino, self.generation, self.size, self.blocks] {
            v.put(out);
        }
        for t in [self.atime, self.mtime, self.ctime] {
            t.put(out);
        }
        for v in [
            self.mode,
            self.nlink,
            self.uid,
            self.gid,
            self.rdev,
            self.blksize,
        ] {
            v.put(out);
        }
        let flags = if self.no_xattrs { ATTR_NO_XATTRS } else { 0 };
        flags.put(out);
        out.resize(start + ATTR_LEN, 0);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        let start = r.position();
        let a = Attr {
            ino: u64::get(r)?,
            generation: u64::get(r)?,
            size: u64::get(r)?,
            blocks: u64::get(r)?,
            atime: Time::get(r)?,
            mtime: Time::get(r)?,
            ctime: Time::get(r)?,
            mode: u32::get(r)?,
            nlink: u32::get(r)?,
            uid: u32::get(r)?,
            gid: u32::get(r)?,
            rdev: u32::get(r)?,
            blksize: u32::get(r)?,
            no_xattrs: false,
        };
        let flags = u32::get(r)?;
        if flags & !ATTR_FLAGS_KNOWN != 0 {
            return Err(ProtoError::Invalid("unknown attr flags"));
        }
        let a = Attr {
            no_xattrs: flags & ATTR_NO_XATTRS != 0,
            ..a
        };
        let pad = r.take(ATTR_LEN - (r.position() - start), "attr padding")?;
        if pad.iter().any(|&b| b != 0) {
            return Err(ProtoError::Invalid("attr padding is not zero"));
        }
        Ok(a)
    }
    fn wire_len(&self) -> usize {
        ATTR_LEN
    }
}

fn put_settime(out: &mut Vec<u8>, t: Option<SetTime>) {
    let (kind, at) = match t {
        None => (0u8, Time::default()),
        Some(SetTime::Now) => (1, Time::default()),
        Some(SetTime::At(t)) => (2, t),
    };
    kind.put(out);
    at.put(out);
}

fn get_settime(r: &mut Reader<'_>) -> Result<Option<SetTime>> {
    let kind = u8::get(r)?;
    let t = Time::get(r)?;
    // One encoding per value: a time that is not used is zero.
    match kind {
        0 | 1 if t != Time::default() => {
            Err(ProtoError::Invalid("time to set: unused time not zero"))
        }
        0 => Ok(None),
        1 => Ok(Some(SetTime::Now)),
        2 => Ok(Some(SetTime::At(t))),
        _ => Err(ProtoError::Invalid("time to set: kind other than 0, 1, 2")),
    }
}

const SET_MODE: u32 = 1;
const SET_UID: u32 = 2;
const SET_GID: u32 = 4;
const SET_SIZE: u32 = 8;

/// Valid bits (1 mode, 2 uid, 4 gid, 8 size), mode, uid, gid u32, size u64, then atime
/// and mtime each as kind u8 (0 unchanged, 1 now, 2 set) + time.
impl Wire for SetAttr {
    fn put(&self, out: &mut Vec<u8>) {
        let valid = if self.mode.is_some() { SET_MODE } else { 0 }
            | if self.uid.is_some() { SET_UID } else { 0 }
            | if self.gid.is_some() { SET_GID } else { 0 }
            | if self.size.is_some() { SET_SIZE } else { 0 };
        valid.put(out);
        self.mode.unwrap_or(0).put(out);
        self.uid.unwrap_or(0).put(out);
        self.gid.unwrap_or(0).put(out);
        self.size.unwrap_or(0).put(out);
        put_settime(out, self.atime);
        put_settime(out, self.mtime);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        let valid = u32::get(r)?;
        if valid & !(SET_MODE | SET_UID | SET_GID | SET_SIZE) != 0 {
            return Err(ProtoError::Invalid("setattr valid bits"));
        }
        let mode = u32::get(r)?;
        let uid = u32::get(r)?;
        let gid = u32::get(r)?;
        let size = u64::get(r)?;
        if size > MAX_OFFSET {
            return Err(ProtoError::Invalid("size beyond 2^63"));
        }
        // One encoding per value: a field without its valid bit is zero.
        let unused = |bit: u32, v: u64| valid & bit == 0 && v != 0;
        if unused(SET_MODE, mode as u64)
            || unused(SET_UID, uid as u64)
            || unused(SET_GID, gid as u64)
            || unused(SET_SIZE, size)
        {
            return Err(ProtoError::Invalid(
                "setattr field set without its valid bit",
            ));
        }
        Ok(SetAttr {
            mode: (valid & SET_MODE != 0).then_some(mode),
            uid: (valid & SET_UID != 0).then_some(uid),
            gid: (valid & SET_GID != 0).then_some(gid),
            size: (valid & SET_SIZE != 0).then_some(size),
            atime: get_settime(r)?,
            mtime: get_settime(r)?,
        })
    }
}

impl Wire for StatFs {
    fn put(&self, out: &mut Vec<u8>) {
        for v in [self.blocks, self.bfree, self.bavail, self.files, self.ffree] {
            v.put(out);
        }
        for v in [self.bsize, self.namelen, self.frsize] {
            v.put(out);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        Ok(StatFs {
            blocks: u64::get(r)?,
            bfree: u64::get(r)?,
            bavail: u64::get(r)?,
            files: u64::get(r)?,
            ffree: u64::get(r)?,
            bsize: u32::get(r)?,
            namelen: u32::get(r)?,
            frsize: u32::get(r)?,
        })
    }
}

/// ino u64, kind u32, next cookie u64 (never 0), name, optional attributes.
impl Wire for DirEntry {
    fn put(&self, out: &mut Vec<u8>) {
        self.ino.put(out);
        self.kind.put(out);
        self.next.put(out);
        (self.name.len() as u16).put(out);
        out.extend_from_slice(&self.name);
        self.attr.put(out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self> {
        let ino = u64::get(r)?;
        let kind = u32::get(r)?;
        let next = u64::get(r)?;
        if next == 0 {
            return Err(ProtoError::Invalid("directory entry cookie 0"));
        }
        let name = Name::get(r)?.into_bytes();
        let attr = Option::<Attr>::get(r)?;
        Ok(DirEntry {
            name,
            ino,
            kind,
            next,
            attr,
        })
    }
    fn wire_len(&self) -> usize {
        8 + 4 + 8 + 2 + self.name.len() + 1 + if self.attr.is_some() { ATTR_LEN } else { 0 }
    }
}
