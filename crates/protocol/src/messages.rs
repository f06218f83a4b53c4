//! One struct per request and per reply body, with named fields; each codec is derived
//! from the field list (`wire_struct!`). Which request goes with which reply is the
//! table in `ops.rs`.

use crate::wire::wire_struct;
use crate::*;
use zcfs_backend::{Attr, DirEntry, DirState, SetAttr, StatFs};

/// `offset` and `offset + len` at or below 2^63 - 1 (off_t).
fn check_range(offset: u64, len: u64) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= MAX_OFFSET => Ok(()),
        _ => Err(ProtoError::Invalid("offset + length beyond 2^63")),
    }
}

/// A umask has permission bits only.
fn check_umask(umask: u32) -> Result<()> {
    if umask & !0o777 != 0 {
        return Err(ProtoError::Invalid("umask beyond the permission bits"));
    }
    Ok(())
}

fn check_data_size(size: u32) -> Result<()> {
    check_limit("data size", size as usize, MAX_DATA, libc::EINVAL)
}

// ---- requests ----

wire_struct! {
    pub struct LookupReq {
        pub parent: NodeRef,
        pub name: LookupName,
    }
}

wire_struct! {
    pub struct GetattrReq {
        pub node: NodeRef,
    }
}

wire_struct! {
    /// `fh`: the handle the change comes through (ftruncate), 0 for none; a size change
    /// through a handle opened for writing needs no write permission on the file.
    /// `commit`: make the change durable (commit the volume's log) before the reply,
    /// so a close after it needs no FLUSH round trip (the reply says whether it did).
    pub struct SetattrReq {
        pub node: NodeRef,
        pub set: SetAttr,
        pub fh: u64,
        pub commit: bool,
    }
}

wire_struct! {
    /// The attributes after a setattr, and whether it was committed before the reply
    /// (asked with `commit`).
    pub struct SetattrReply {
        pub attr: Attr,
        pub committed: bool,
    }
}

wire_struct! {
    pub struct ReadlinkReq {
        pub node: NodeRef,
    }
}

wire_struct! {
    pub struct MknodReq {
        pub parent: NodeRef,
        pub name: Name,
        /// File type and permission bits.
        pub mode: u32,
        pub rdev: u32,
        /// The caller's umask, which the server applies unless the directory has a
        /// default ACL (0: `mode` is already masked).
        pub umask: u32,
    }
    check(r) {
        check_umask(r.umask)
    }
}

wire_struct! {
    pub struct MkdirReq {
        pub parent: NodeRef,
        pub name: Name,
        pub mode: u32,
        /// The caller's umask, which the server applies unless the directory has a
        /// default ACL (0: `mode` is already masked).
        pub umask: u32,
    }
    check(r) {
        check_umask(r.umask)
    }
}

wire_struct! {
    pub struct UnlinkReq {
        pub parent: NodeRef,
        pub name: Name,
    }
}

wire_struct! {
    pub struct RmdirReq {
        pub parent: NodeRef,
        pub name: Name,
    }
}

wire_struct! {
    pub struct SymlinkReq {
        pub parent: NodeRef,
        pub name: Name,
        pub target: SymlinkTarget,
    }
}

wire_struct! {
    pub struct RenameReq {
        pub parent: NodeRef,
        pub name: Name,
        pub new_parent: NodeRef,
        pub new_name: Name,
        pub flags: RenameFlags,
    }
}

wire_struct! {
    pub struct LinkReq {
        /// The inode that gets another name.
        pub node: NodeRef,
        pub new_parent: NodeRef,
        pub new_name: Name,
    }
}

wire_struct! {
    pub struct OpenReq {
        pub node: NodeRef,
        /// open(2) flags.
        pub flags: i32,
    }
}

wire_struct! {
    pub struct CreateReq {
        pub parent: NodeRef,
        pub name: Name,
        pub mode: u32,
        pub flags: i32,
        /// The caller's umask, which the server applies unless the directory has a
        /// default ACL (0: `mode` is already masked).
        pub umask: u32,
    }
    check(r) {
        check_umask(r.umask)
    }
}

wire_struct! {
    /// open(2) with O_TMPFILE: a regular file in `parent` that no directory names (link
    /// count 0), answered as a create (an entry with a reference, and a handle).
    pub struct TmpFileReq {
        pub parent: NodeRef,
        /// Type (0 or S_IFREG) and permission bits, masked by `umask` on the server.
        pub mode: u32,
        pub umask: u32,
        /// open(2) flags: O_WRONLY or O_RDWR; O_EXCL makes the file unlinkable.
        pub flags: i32,
    }
    check(r) {
        check_umask(r.umask)
    }
}

wire_struct! {
    /// The reply's data (up to `size` bytes, short at end of file) follows its header.
    pub struct ReadReq {
        pub node: NodeRef,
        /// A handle from open/create of this session, or 0 for none.
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
    }
    check(r) {
        check_data_size(r.size)?;
        check_range(r.offset, r.size as u64)
    }
}

wire_struct! {
    /// `size` bytes of data follow the body; `size` equals the header's data length.
    /// `commit`: make the write durable (commit the volume's log) before the reply, so
    /// a close after it needs no FLUSH round trip (the reply says whether it did).
    pub struct WriteReq {
        pub node: NodeRef,
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub commit: bool,
    }
    check(r) {
        check_data_size(r.size)?;
        check_range(r.offset, r.size as u64)
    }
}

wire_struct! {
    pub struct FlushReq {
        pub node: NodeRef,
        pub fh: u64,
    }
}

wire_struct! {
    pub struct ReleaseReq {
        pub node: NodeRef,
        pub fh: u64,
    }
}

wire_struct! {
    pub struct FsyncReq {
        pub node: NodeRef,
        pub fh: u64,
        pub datasync: bool,
    }
}

wire_struct! {
    pub struct ReaddirReq {
        pub dir: NodeRef,
        /// Continue after the entry whose `next` this is (0 = from the start).
        pub cookie: u64,
        /// Entries carry attributes (and a reference each).
        pub plus: bool,
        /// 1..=`MAX_ENTRIES`.
        pub max_entries: u32,
    }
    check(r) {
        if r.max_entries == 0 || r.max_entries as usize > MAX_ENTRIES {
            return Err(ProtoError::Invalid("readdir entry count outside 1..=4096"));
        }
        Ok(())
    }
}

wire_struct! {
    pub struct StatfsReq {}
}

wire_struct! {
    pub struct SetxattrReq {
        pub node: NodeRef,
        pub name: XattrName,
        pub value: XattrValue,
        /// 0, XATTR_CREATE (1) or XATTR_REPLACE (2).
        pub flags: i32,
    }
    check(r) {
        if !(0..=2).contains(&r.flags) {
            return Err(ProtoError::Invalid("setxattr flags"));
        }
        Ok(())
    }
}

wire_struct! {
    pub struct GetxattrReq {
        pub node: NodeRef,
        pub name: XattrName,
    }
}

wire_struct! {
    pub struct ListxattrReq {
        pub node: NodeRef,
    }
}

wire_struct! {
    pub struct RemovexattrReq {
        pub node: NodeRef,
        pub name: XattrName,
    }
}

wire_struct! {
    pub struct FallocateReq {
        pub node: NodeRef,
        pub fh: u64,
        pub offset: u64,
        pub len: u64,
        /// fallocate(2) mode.
        pub mode: i32,
    }
    check(r) { check_range(r.offset, r.len) }
}

wire_struct! {
    /// lseek(2)'s SEEK_DATA (3) or SEEK_HOLE (4) from `offset`, on any open handle (or
    /// 0: authorized as an open for reading would be).
    pub struct LseekReq {
        pub node: NodeRef,
        pub fh: u64,
        pub offset: u64,
        pub whence: i32,
    }
}

wire_struct! {
    pub struct SyncAllReq {}
}

wire_struct! {
    pub struct PingReq {}
}

wire_struct! {
    pub struct StatsReq {}
}

wire_struct! {
    /// Give the layer-2 lane of the caller's session up, as a fence: answered once no
    /// lane request of the session is running, and none runs after (docs/protocol.md
    /// section 12).
    pub struct L2ReleaseReq {}
}

wire_struct! {
    /// Give back `count` references to `ino`.
    #[derive(Copy)]
    pub struct ForgetItem {
        pub ino: u64,
        pub count: u64,
    }
    check(i) {
        if i.count == 0 {
            return Err(ProtoError::Invalid("forget count 0"));
        }
        Ok(())
    }
}

wire_struct! {
    /// Give back references the server holds for this session (sent without waiting
    /// for the reply; never retried).
    pub struct ForgetReq {
        pub items: List<ForgetItem, MAX_FORGET_ITEMS>,
    }
}

wire_struct! {
    /// access(2): `mask` is R_OK (4) | W_OK (2) | X_OK (1), or 0 for existence.
    pub struct AccessReq {
        pub node: NodeRef,
        pub mask: u32,
    }
}

// ---- replies ----

wire_struct! {
    /// No body (a read's data travels after the header).
    pub struct EmptyReply {}
}

wire_struct! {
    /// An entry: the attributes of the inode named, and one reference to it for the
    /// session (given back with forget).
    pub struct EntryReply {
        pub attr: Attr,
    }
}

wire_struct! {
    /// Attributes, without a reference.
    pub struct AttrReply {
        pub attr: Attr,
    }
}

wire_struct! {
    /// An inode made or linked into a directory (mknod, mkdir, symlink, link): its
    /// entry (with a reference, as `EntryReply`) and the directory's attributes after
    /// the change (None: the server could not read them; the client asks when it
    /// needs them), the directory's name-set version read after the change, and for
    /// a mkdir the new directory's (None: not known, or not a mkdir).
    pub struct MadeReply {
        pub attr: Attr,
        pub parent: Option<Attr>,
        pub parent_state: Option<DirState>,
        pub made_state: Option<DirState>,
    }
}

wire_struct! {
    /// A name removed (unlink, rmdir): the inode's attributes as they are now, and the
    /// directory's after the change (None: unknown).
    pub struct RemovedReply {
        pub attr: Attr,
        pub parent: Option<Attr>,
        pub parent_state: Option<DirState>,
    }
}

wire_struct! {
    pub struct ReadlinkReply {
        pub target: SymlinkTarget,
    }
}

wire_struct! {
    pub struct OpenReply {
        /// A handle of this session (never 0).
        pub fh: u64,
        /// The file's attributes as the open found them (close-to-open: the client
        /// refreshes what it and its kernel cache of the file).
        pub attr: Attr,
    }
}

wire_struct! {
    /// An entry (with a reference) and a handle; for a create, the directory's
    /// attributes after it (None for a tmpfile, which names nothing, or unknown).
    pub struct CreateReply {
        pub attr: Attr,
        pub fh: u64,
        pub parent: Option<Attr>,
        pub parent_state: Option<DirState>,
    }
}

wire_struct! {
    pub struct WriteReply {
        pub written: u32,
        /// The write was made durable before the reply (asked with `commit`).
        pub committed: bool,
    }
}

wire_struct! {
    /// Where lseek's answer lands.
    pub struct LseekReply {
        pub offset: u64,
    }
}

wire_struct! {
    /// With `plus`, each entry carries attributes and one reference.
    pub struct ReaddirReply {
        pub entries: List<DirEntry, MAX_ENTRIES>,
    }
}

wire_struct! {
    pub struct StatfsReply {
        pub statfs: StatFs,
    }
}

wire_struct! {
    pub struct GetxattrReply {
        pub value: XattrValue,
    }
}

wire_struct! {
    pub struct ListxattrReply {
        pub names: List<XattrName, MAX_XATTR_NAMES>,
    }
}

wire_struct! {
    /// The server's counters as JSON.
    pub struct StatsReply {
        pub json: Blob,
    }
}

// ---- the layer-2 lane (protocol 8) ----

/// Bytes of an encoded `zcfs_l2::SlotGeometry`.
pub const L2_GEOMETRY_LEN: usize = 24;
/// Bytes of the nonce an accepting server sends.
pub const L2_NONCE_LEN: usize = 32;
/// Longest refusal reason a server sends (bytes).
pub const L2_MAX_REASON: usize = 512;

wire_struct! {
    /// Offer of the layer-2 lane (after the handshake, on TCP): the client's MAC (the
    /// low 48 bits, big-endian byte order of the address), its command and data queue
    /// ids, and its receive-slot geometry (`zcfs_l2::SlotGeometry::encode`).
    pub struct L2SetupReq {
        pub mac: u64,
        pub cmd_queue: u32,
        pub data_queue: u32,
        pub geometry: Blob,
    }
    check(v) {
        if v.mac >> 48 != 0 {
            return Err(ProtoError::Invalid("a MAC address beyond 48 bits"));
        }
        if v.geometry.len() != L2_GEOMETRY_LEN {
            return Err(ProtoError::Invalid("slot geometry of the wrong length"));
        }
        Ok(())
    }
}

wire_struct! {
    /// The server's answer: accepted (its MAC, queues and a random nonce; `reason`
    /// empty) or refused (`reason` says why; the session stays on TCP).
    pub struct L2SetupReply {
        pub accepted: bool,
        pub mac: u64,
        pub cmd_queue: u32,
        pub data_queue: u32,
        /// The most bytes of a write that lands in place (`l2::KIND_LANDING_WRITE`);
        /// 0: none does (the server's lane does not map its volume's image).
        pub land_max: u32,
        pub nonce: Blob,
        pub reason: Blob,
    }
    check(v) {
        if v.mac >> 48 != 0 {
            return Err(ProtoError::Invalid("a MAC address beyond 48 bits"));
        }
        if v.land_max > crate::l2::MAX_LANDING_WRITE {
            return Err(ProtoError::Invalid("a landing write limit beyond MAX_LANDING_WRITE"));
        }
        if v.accepted && v.nonce.len() != L2_NONCE_LEN {
            return Err(ProtoError::Invalid("an accepting l2setup reply without its nonce"));
        }
        check_limit("l2setup reason", v.reason.len(), L2_MAX_REASON, libc::EINVAL)
    }
}

/// A MAC address as the `mac` field carries it.
pub fn mac_to_u64(mac: [u8; 6]) -> u64 {
    mac.iter().fold(0u64, |a, b| a << 8 | *b as u64)
}

/// The `mac` field as a MAC address.
pub fn mac_from_u64(v: u64) -> [u8; 6] {
    let b = v.to_be_bytes();
    [b[2], b[3], b[4], b[5], b[6], b[7]]
}
