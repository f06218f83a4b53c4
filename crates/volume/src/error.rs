//! Typed errors of the volume, with their errno for frontends.

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("no space left on the volume")]
    NoSpace,
    #[error("no free inodes left on the volume")]
    NoInodes,
    #[error("extended attributes of this inode would exceed their space (1 MiB encoded)")]
    NoSpaceXattr,
    #[error("extended attribute value of {0} bytes is larger than 65536")]
    XattrValueTooBig(usize),
    #[error("extended attribute name must be 1 to 255 bytes without NUL")]
    XattrNameRange,
    #[error("extended attribute names need {0} bytes, more than a listxattr can return (65536)")]
    XattrListTooBig(usize),
    #[error("file name longer than 255 bytes")]
    NameTooLong,
    #[error("no such extended attribute")]
    NoXattr,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("stale inode handle")]
    Stale,
    #[error("operation not permitted: {0}")]
    NotPermitted(String),
    #[error("permission denied: {0}")]
    AccessDenied(String),
    #[error("too many links")]
    TooManyLinks,
    #[error("file too large")]
    TooBig,
    #[error("no data (or hole) at or past the offset: it is at or past the end of the file")]
    PastEnd,
    #[error("not a zcfs volume (bad magic)")]
    NotZcfs,
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("volume is corrupt: {0}")]
    Corrupt(String),
    #[error("volume is read-only")]
    ReadOnly,
    #[error("the volume turned read-only after a persistence failure")]
    Failed,
    #[error("{0}")]
    Busy(String),
    #[error("one transaction of {bytes} bytes of log exceeds the most one log entry can hold ({max} bytes); make it smaller or the log larger (mkfs --log-size)")]
    TransactionTooLarge { bytes: u64, max: u64 },
    #[error(transparent)]
    Pmem(#[from] zcfs_pmem::PmemError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl FsError {
    /// The errno a POSIX frontend should return.
    pub fn errno(&self) -> i32 {
        use FsError::*;
        match self {
            NotFound => libc::ENOENT,
            Exists => libc::EEXIST,
            NotDir => libc::ENOTDIR,
            IsDir => libc::EISDIR,
            NotEmpty => libc::ENOTEMPTY,
            NoSpace | NoInodes | NoSpaceXattr => libc::ENOSPC,
            NameTooLong => libc::ENAMETOOLONG,
            XattrValueTooBig(_) | XattrListTooBig(_) => libc::E2BIG,
            XattrNameRange => libc::ERANGE,
            NoXattr => libc::ENODATA,
            Invalid(_) => libc::EINVAL,
            Stale => libc::ESTALE,
            TooManyLinks => libc::EMLINK,
            NotPermitted(_) => libc::EPERM,
            AccessDenied(_) => libc::EACCES,
            TooBig => libc::EFBIG,
            PastEnd => libc::ENXIO,
            Unsupported(_) => libc::EOPNOTSUPP,
            ReadOnly | Failed => libc::EROFS,
            Busy(_) => libc::EBUSY,
            TransactionTooLarge { .. } => libc::E2BIG,
            NotZcfs | Corrupt(_) => libc::EIO,
            Pmem(zcfs_pmem::PmemError::Locked { .. }) => libc::EBUSY,
            Pmem(_) => libc::EIO,
            Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

pub type Result<T> = std::result::Result<T, FsError>;

/// The backend interface's error: common errors as a bare errno (no allocation), the
/// others with their message.
impl From<FsError> for zcfs_types::Error {
    fn from(e: FsError) -> zcfs_types::Error {
        use FsError::*;
        match e {
            NotFound | Exists | NotDir | IsDir | NotEmpty | NoSpace | NoInodes | NameTooLong
            | NoXattr | Stale | TooManyLinks | TooBig | PastEnd | ReadOnly => {
                zcfs_types::Error::errno(e.errno())
            }
            other => zcfs_types::Error::new(other.errno(), other.to_string()),
        }
    }
}
