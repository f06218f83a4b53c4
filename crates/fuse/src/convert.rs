//! Conversions between fuser's types and the backend's.

use fuser::{Errno, FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zcfs_backend::{SetTime, Time};

pub(crate) fn sys_time(t: Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

pub(crate) fn time_of(t: SystemTime) -> Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            Time { sec, nsec }
        }
    }
}

pub(crate) fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(time_of(t)),
    }
}

pub(crate) fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(crate) fn errno(e: &zcfs_backend::Error) -> Errno {
    Errno::from_i32(e.errno)
}

/// A negative dentry: inode 0 tells the kernel to cache "does not exist".
pub(crate) fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_both_sides_of_the_epoch() {
        for t in [
            Time { sec: 0, nsec: 0 },
            Time {
                sec: 1_700_000_000,
                nsec: 123_456_789,
            },
            Time {
                sec: -1,
                nsec: 500_000_000,
            },
            Time {
                sec: -86_400,
                nsec: 1,
            },
        ] {
            assert_eq!(time_of(sys_time(t)), t, "{t:?}");
        }
    }

    #[test]
    fn file_types_map_to_fuse_kinds() {
        assert_eq!(kind(libc::S_IFDIR | 0o755), FileType::Directory);
        assert_eq!(kind(libc::S_IFLNK), FileType::Symlink);
        assert_eq!(kind(libc::S_IFIFO), FileType::NamedPipe);
        assert_eq!(kind(libc::S_IFSOCK), FileType::Socket);
        assert_eq!(kind(libc::S_IFCHR), FileType::CharDevice);
        assert_eq!(kind(libc::S_IFBLK), FileType::BlockDevice);
        assert_eq!(kind(libc::S_IFREG | 0o644), FileType::RegularFile);
        assert_eq!(
            negative_attr().ino,
            INodeNo(0),
            "a negative entry is inode 0"
        );
        assert_eq!(
            errno(&zcfs_backend::Error::errno(libc::ENOENT)),
            Errno::ENOENT
        );
        assert!(matches!(set_time(TimeOrNow::Now), SetTime::Now));
    }
}
