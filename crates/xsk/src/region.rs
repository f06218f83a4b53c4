//! A UMEM region: memory shared with the kernel (and, on a server, the PM volume's
//! mapping), read and written by offset with raw copies.

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
}

/// Memory frames land in and leave from. The kernel writes received frames into it
/// while we hold it, so it is never handed out as `&[u8]`: reads and writes are raw
/// copies by offset, checked against the length.
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    /// Unmaps the memory on drop (for regions this crate mapped).
    unmap: bool,
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
        })
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
