//! Types every layer of zcfs shares, so the volume, the backends, the wire protocol and
//! the frontends speak of an inode's attributes in one vocabulary (no mirrored sets and
//! no conversions between them): attributes, times, attribute changes, file system
//! statistics, and the error of the backend interface (an errno, with detail only when
//! there is more to say: the common errors allocate nothing).

pub mod identity;

use std::borrow::Cow;
use std::fmt;

/// Inode number of the root directory.
pub const ROOT: u64 = 1;

/// Seconds and nanoseconds since the epoch.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Time {
    pub sec: i64,
    pub nsec: u32,
}

impl Time {
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
}

/// Attributes of an inode; `mode` carries the file type bits (S_IFMT).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Attr {
    pub ino: u64,
    /// Told apart from an earlier inode that had the same number (never 0).
    pub generation: u64,
    pub size: u64,
    /// 512-byte units, as st_blocks.
    pub blocks: u64,
    pub atime: Time,
    pub mtime: Time,
    pub ctime: Time,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
    /// Known to have no extended attributes (hence no ACL): a client may answer a
    /// lookup of one without asking. False when unknown.
    pub no_xattrs: bool,
}

impl Attr {
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }
}

/// A directory's name set as of one moment: the count of its changes (`version`, from
/// a start of the server's choosing) and how many names it held then. A client that
/// saw it empty at one version, and after each change of its own exactly one version
/// more, knows every name in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirState {
    pub version: u64,
    pub entries: u64,
}

/// A time to set: now, or a given one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(Time),
}

/// Attribute changes (chmod, chown, truncate, utimes); `None` leaves a field alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

impl SetAttr {
    pub fn is_empty(&self) -> bool {
        *self == SetAttr::default()
    }
}

/// File system statistics (statfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// An error as a POSIX frontend reports it: an errno, and a detail when there is more
/// to say than the errno's own text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Error {
    pub errno: i32,
    detail: Option<Box<str>>,
}

impl Error {
    /// An errno with a message.
    pub fn new(errno: i32, msg: impl Into<String>) -> Error {
        Error {
            errno,
            detail: Some(msg.into().into_boxed_str()),
        }
    }
    /// Just an errno (allocates nothing).
    pub const fn errno(errno: i32) -> Error {
        Error {
            errno,
            detail: None,
        }
    }
    /// The message: the detail, or the errno's own text.
    pub fn msg(&self) -> Cow<'_, str> {
        match &self.detail {
            Some(d) => Cow::Borrowed(d),
            None => Cow::Owned(std::io::Error::from_raw_os_error(self.errno).to_string()),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.msg(), errno_name(self.errno))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::new(e.raw_os_error().unwrap_or(libc::EIO), e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Short errno names for messages.
pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOENT => "ENOENT",
        libc::EEXIST => "EEXIST",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ENOSPC => "ENOSPC",
        libc::EINVAL => "EINVAL",
        libc::EIO => "EIO",
        libc::EPERM => "EPERM",
        libc::EACCES => "EACCES",
        libc::ENODATA => "ENODATA",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ESTALE => "ESTALE",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ENOTCONN => "ENOTCONN",
        libc::EMLINK => "EMLINK",
        libc::EFBIG => "EFBIG",
        libc::ERANGE => "ERANGE",
        libc::EBADF => "EBADF",
        libc::EBUSY => "EBUSY",
        libc::E2BIG => "E2BIG",
        libc::EMFILE => "EMFILE",
        libc::ENXIO => "ENXIO",
        libc::ENODEV => "ENODEV",
        libc::EPIPE => "EPIPE",
        libc::ELOOP => "ELOOP",
        libc::ESPIPE => "ESPIPE",
        libc::EXDEV => "EXDEV",
        libc::ETXTBSY => "ETXTBSY",
        _ => "errno",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_errno_alone_says_what_it_is_and_a_detail_wins() {
        let e = Error::errno(libc::ENOENT);
        assert_eq!(
            e.to_string(),
            "No such file or directory (os error 2) (ENOENT)"
        );
        let e = Error::new(libc::EINVAL, "bad name");
        assert_eq!(e.to_string(), "bad name (EINVAL)");
        assert_eq!(
            Error::from(std::io::Error::from_raw_os_error(libc::EIO)).errno,
            libc::EIO
        );
    }
}

/// Who does an operation, as the file system checks permissions: user, primary group,
/// supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group need not be repeated).
    pub groups: Vec<u32>,
    /// Permissions were already checked by a party the backend trusts (a kernel mounted
    /// with `default_permissions`, an administrative tool): only the identity matters,
    /// as owner of new files.
    pub checked: bool,
    /// The caller's file-creation mask, cleared from a new inode's mode unless its
    /// directory has a default ACL (which then stands in for it). 0 when the mode
    /// arrives already masked.
    pub umask: u32,
}

impl Cred {
    /// Root: passes every permission check (as a process with the capabilities).
    pub const ROOT: Cred = Cred {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
        checked: false,
        umask: 0,
    };

    pub fn root() -> Cred {
        Cred::ROOT
    }
    pub fn new(uid: u32, gid: u32, groups: Vec<u32>) -> Cred {
        Cred {
            uid,
            gid,
            groups,
            checked: false,
            umask: 0,
        }
    }
    /// An identity whose permissions a trusted party has checked already.
    pub fn checked(uid: u32, gid: u32) -> Cred {
        Cred {
            uid,
            gid,
            groups: Vec::new(),
            checked: true,
            umask: 0,
        }
    }
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
    /// Whether the caller is in group `gid` (primary or supplementary).
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
    /// Whether permission checks apply to this caller at all.
    pub fn bypasses_checks(&self) -> bool {
        self.checked || self.is_root()
    }
}
