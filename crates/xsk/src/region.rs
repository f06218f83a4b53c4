//! A UMEM region: memory shared with the kernel (and, on a server, the PM volume's
//! mapping), read and written by offset with raw copies.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::ptr::NonNull;

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("region access {offset}+{len} is beyond its end ({size} bytes)")]
    OutOfBounds {
        offset: u64,
        len: usize,
        size: usize,
    },
    #[error("mapping {len} bytes failed: {source}")]
    Map { len: usize, source: std::io::Error },
    #[error(
        "{path}: a UMEM cannot be a file on {fs}: the kernel refuses long-term write pins on \
         page-cache files (EFAULT at XDP_UMEM_REG); use a file on tmpfs (/dev/shm) or \
         hugetlbfs, or a device-dax character device"
    )]
    UnsupportedBacking { path: String, fs: String },
    #[error("{path}: checking the file's backing failed: {source}")]
    Stat {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: its length {len} is not a multiple of the mapping granule {granule} \
         (the staging area must start page-aligned right after it)"
    )]
    Unaligned {
        path: String,
        len: u64,
        granule: usize,
    },
    #[error("region size {len} is empty or exceeds the UMEM limit of {max} bytes")]
    TooLarge { len: u128, max: u64 },
}

/// The largest region: AF_XDP's unaligned-chunk addresses carry the offset in 48 bits.
pub const MAX_REGION_LEN: u64 = 1 << 48;
/// tmpfs's (and /dev/shm's) `f_type` in statfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;
/// hugetlbfs's `f_type` in statfs.
const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// Memory frames land in and leave from. The kernel writes received frames into it
/// while we hold it, so it is never handed out as `&[u8]`: reads and writes are raw
/// copies by offset, checked against the length.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// Unmaps the memory on drop (for regions this crate mapped).
    unmap: bool,
    /// Bytes from offset 0 that map a file ([`Region::map_file`]).
    file_len: usize,
}

/// What backs a file offered as a UMEM, and how it must be mapped.
struct Backing {
    len: u64,
    granule: usize,
}

impl Backing {
    fn of(file: &File, path: &str) -> Result<Backing, RegionError> {
        let stat_err = |source| RegionError::Stat {
            path: path.to_string(),
            source,
        };
        let meta = file.metadata().map_err(stat_err)?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        if meta.file_type().is_char_device() {
            let rdev = meta.rdev();
            let (major, minor) = (libc::major(rdev), libc::minor(rdev));
            let sys = format!("/sys/dev/char/{major}:{minor}");
            let subsystem = std::fs::read_link(format!("{sys}/subsystem")).ok();
            let is_dax = subsystem
                .as_ref()
                .and_then(|s| s.file_name())
                .is_some_and(|n| n == "dax");
            if !is_dax {
                return Err(RegionError::UnsupportedBacking {
                    path: path.to_string(),
                    fs: format!("a character device ({major}:{minor}) that is not device-dax"),
                });
            }
            let read = |f: &str| -> Result<u64, RegionError> {
                std::fs::read_to_string(format!("{sys}/{f}"))
                    .map_err(stat_err)?
                    .trim()
                    .parse()
                    .map_err(|e| stat_err(std::io::Error::other(format!("{sys}/{f}: {e}"))))
            };
            let len = read("size")?;
            let granule = read("align").unwrap_or(page as u64) as usize;
            return Ok(Backing {
                len,
                granule: granule.max(page),
            });
        }
        // SAFETY: fstatfs writes a statfs into `st`, which is plain data; the result is
        // checked.
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) } != 0 {
            return Err(stat_err(std::io::Error::last_os_error()));
        }
        let granule = match st.f_type as i64 {
            TMPFS_MAGIC => page,
            HUGETLBFS_MAGIC => (st.f_bsize as usize).max(page),
            other => {
                return Err(RegionError::UnsupportedBacking {
                    path: path.to_string(),
                    fs: fs_name(other),
                })
            }
        };
        Ok(Backing {
            len: meta.len(),
            granule,
        })
    }
}

/// A file system's name from its statfs magic, for error messages.
fn fs_name(magic: i64) -> String {
    let name = match magic {
        0xEF53 => "ext2/ext3/ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0x0102_1994 => "tmpfs",
        0x2FC1_2FC1 => "zfs",
        0x6573_5546 => "fuse",
        0x6462_6720 => "debugfs",
        0x0187 => "autofs",
        _ => return format!("a file system with magic {magic:#x}"),
    };
    name.to_string()
}

// SAFETY: a Region is a pointer and a length to a mapping that lives as long as the
// Region; all access is by raw copies whose ordering with the kernel's writes the ring
// protocol (fill/RX, TX/completion) provides.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only allows raw copies into and out of the mapping.
unsafe impl Sync for Region {}

impl Region {
    /// `len` bytes of zeroed anonymous shared memory (the simulator's and a client's UMEM).
    pub fn anonymous(len: usize) -> Result<Region, RegionError> {
        // SAFETY: a fresh anonymous mapping; the arguments are checked by the kernel and
        // the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED || len == 0 {
            return Err(RegionError::Map {
                len,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Region {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned null"),
            len,
            unmap: true,
            file_len: 0,
        })
    }

    /// A region over `file`'s whole length (mapped MAP_SHARED, so what lands in the region
    /// is in the file) followed contiguously by `staging_len` bytes (rounded up to the
    /// mapping granule) of zeroed anonymous shared memory: a server registers its PM
    /// volume plus a staging area for TX frames as one UMEM. The staging area starts at
    /// offset [`Region::file_len`].
    ///
    /// The file must be on tmpfs or hugetlbfs, or be a device-dax character device: the
    /// kernel pins UMEM pages for writing for as long as the socket lives, which it refuses
    /// for page-cache files (ext4, xfs, overlay, ...): [`RegionError::UnsupportedBacking`].
    pub fn map_file(file: &File, staging_len: usize) -> Result<Region, RegionError> {
        let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| format!("fd {}", file.as_raw_fd()));
        let backing = Backing::of(file, &path)?;
        let granule = backing.granule;
        let file_len = backing.len;
        if file_len % granule as u64 != 0 {
            return Err(RegionError::Unaligned {
                path,
                len: file_len,
                granule,
            });
        }
        let staging = (staging_len as u128).div_ceil(granule as u128) * granule as u128;
        let total = file_len as u128 + staging;
        if total == 0 || total > MAX_REGION_LEN as u128 {
            return Err(RegionError::TooLarge {
                len: total,
                max: MAX_REGION_LEN,
            });
        }
        let (file_len, staging, total) = (file_len as usize, staging as usize, total as usize);
        let map_err = |len| RegionError::Map {
            len,
            source: std::io::Error::last_os_error(),
        };
        // One virtual range for both parts: reserve it inaccessible, with room to align
        // its start to the granule (hugetlbfs needs huge-page-aligned fixed mappings).
        let reserve_len = total + granule;
        // SAFETY: a fresh PROT_NONE anonymous reservation; checked against MAP_FAILED.
        let reserve = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reserve == libc::MAP_FAILED {
            return Err(map_err(reserve_len));
        }
        let base = (reserve as usize).next_multiple_of(granule);
        // From here on a Region owns [base, base + total): trim the reservation to that,
        // and any failure below unmaps it through the Region's drop.
        let head = base - reserve as usize;
        let tail = reserve_len - head - total;
        // SAFETY: both pieces lie in the reservation made above and outside
        // [base, base + total), which nothing else uses.
        unsafe {
            if head > 0 {
                libc::munmap(reserve, head);
            }
            if tail > 0 {
                libc::munmap((base + total) as *mut libc::c_void, tail);
            }
        }
        let region = Region {
            ptr: NonNull::new(base as *mut u8).expect("mmap returned null"),
            len: total,
            unmap: true,
            file_len,
        };
        if file_len > 0 {
            // SAFETY: MAP_FIXED over the first `file_len` bytes of our own reservation.
            let p = unsafe {
                libc::mmap(
                    base as *mut libc::c_void,
                    file_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(map_err(file_len));
            }
        }
        if staging > 0 {
            // SAFETY: MAP_FIXED over the rest of our own reservation.
            let p = unsafe {
                libc::mmap(
                    (base + file_len) as *mut libc::c_void,
                    staging,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_POPULATE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(map_err(staging));
            }
        }
        Ok(region)
    }

    /// Bytes of the region that are a file's mapping (from offset 0); the rest, if any, is
    /// the anonymous staging area. 0 for an anonymous region.
    pub fn file_len(&self) -> usize {
        self.file_len
    }

    /// The region's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region has no bytes (never true for a mapped region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address, for registering the region with the kernel.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: u64, len: usize) -> Result<usize, RegionError> {
        let end = offset.checked_add(len as u64);
        match end {
            Some(end) if end <= self.len as u64 => Ok(offset as usize),
            _ => Err(RegionError::OutOfBounds {
                offset,
                len,
                size: self.len,
            }),
        }
    }

    /// Copy `buf.len()` bytes at `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        let at = self.check(offset, buf.len())?;
        // SAFETY: `at + buf.len()` is within the mapping (checked); `buf` is a distinct
        // Rust buffer, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    /// Copy `data` to `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
        let at = self.check(offset, data.len())?;
        // SAFETY: as in `read`, with the copy the other way.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), data.len())
        };
        Ok(())
    }

    /// Move `len` bytes from `from` to `to` within the region (the ranges may overlap).
    pub fn copy_within(&self, from: u64, to: u64, len: usize) -> Result<(), RegionError> {
        let src = self.check(from, len)?;
        let dst = self.check(to, len)?;
        // SAFETY: both ranges are within the mapping (checked); `copy` allows overlap.
        unsafe { std::ptr::copy(self.ptr.as_ptr().add(src), self.ptr.as_ptr().add(dst), len) };
        Ok(())
    }

    /// CRC32C of `len` bytes at `offset`, read in place.
    pub fn crc32c(&self, offset: u64, len: usize) -> Result<u32, RegionError> {
        let at = self.check(offset, len)?;
        // SAFETY: the range is within the mapping (checked). The slice lives only for
        // this call; a concurrent write by the kernel to bytes the caller does not own
        // would only give a wrong checksum, which the protocol treats as a bad block.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(at), len) };
        Ok(crc32c::crc32c(bytes))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.unmap {
            // SAFETY: the mapping was made by this Region with this length and nobody
            // else unmaps it.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_are_bounded_by_the_region() {
        let r = Region::anonymous(8192).unwrap();
        r.write(8190, b"ab").unwrap();
        let mut b = [0u8; 2];
        r.read(8190, &mut b).unwrap();
        assert_eq!(&b, b"ab");
        assert!(matches!(
            r.write(8191, b"ab"),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.read(u64::MAX, &mut b),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert_eq!(r.crc32c(8190, 2).unwrap(), crc32c::crc32c(b"ab"));
        r.copy_within(8190, 0, 2).unwrap();
        r.read(0, &mut b).unwrap();
        assert_eq!(&b, b"ab");
    }
}
