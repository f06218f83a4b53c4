//! xattr system calls on a path, answering the errno as the error (for the tests of
//! labels and capabilities through mounts).

use super::reference::{cpath, errno};
use std::ffi::CString;
use std::path::Path;

/// getxattr into a 4 KiB buffer.
pub fn get(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid C strings and a buffer of `buf.len()` bytes.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

pub fn set(p: &Path, name: &str, value: &[u8]) -> Result<(), i32> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid C strings and a buffer of `value.len()` bytes.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r < 0 {
        return Err(errno());
    }
    Ok(())
}

pub fn remove(p: &Path, name: &str) -> Result<(), i32> {
    let (p, n) = (cpath(p), CString::new(name).unwrap());
    // SAFETY: valid C strings.
    if unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) } < 0 {
        return Err(errno());
    }
    Ok(())
}

/// The names in a listxattr buffer.
pub fn names_of(buf: &[u8]) -> Vec<String> {
    buf.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// The names listxattr gives, sorted.
pub fn list(p: &Path) -> Vec<String> {
    let p = cpath(p);
    let mut buf = vec![0u8; 65536];
    // SAFETY: a valid C string and a buffer of `buf.len()` bytes.
    let r = unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    assert!(r >= 0, "listxattr: errno {}", errno());
    let mut names = names_of(&buf[..r as usize]);
    names.sort();
    names
}

/// A file capability: VFS_CAP_REVISION_2, CAP_NET_BIND_SERVICE permitted.
pub fn capability() -> Vec<u8> {
    [0x0200_0000u32, 1 << 10, 0, 0, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}
