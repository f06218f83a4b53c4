//! The null backend: answers every request at once without storing anything, to measure
//! a frontend's own cost (DPFS's null backend). The root directory is empty; every name
//! looked up exists as a regular file of 1 TiB that reads as zeros and swallows writes.

use crate::*;

pub struct NullFs {
    start: Time,
}

const FILE_SIZE: u64 = 1 << 40;
static ZEROS: [u8; 1 << 20] = [0; 1 << 20];

impl Default for NullFs {
    fn default() -> Self {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        NullFs {
            start: Time {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
        }
    }
}

/// A stable inode number per name (FNV-1a), never the root's.
fn ino_of(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 1) | 2
}

impl NullFs {
    fn attr(&self, ino: u64) -> Attr {
        let dir = ino == ROOT;
        Attr {
            ino,
            generation: 1,
            size: if dir { 0 } else { FILE_SIZE },
            blocks: 0,
            atime: self.start,
            mtime: self.start,
            ctime: self.start,
            mode: if dir {
                libc::S_IFDIR | 0o777
            } else {
                libc::S_IFREG | 0o666
            },
            nlink: if dir { 2 } else { 1 },
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            no_xattrs: true,
        }
    }
}

fn rofs<T>() -> Result<T> {
    Err(Error::new(libc::EPERM, "the null backend has only files"))
}

impl Backend for NullFs {
    fn lookup(&self, _ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        if parent != ROOT {
            return Err(Error::errno(libc::ENOENT));
        }
        Ok(self.attr(ino_of(name)))
    }
    fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(self.attr(ino))
    }
    fn setattr(&self, _ctx: &Ctx, ino: u64, _set: &SetAttr, _fh: u64) -> Result<Attr> {
        Ok(self.attr(ino))
    }
    /// Anyone may do anything (writes are accepted and dropped).
    fn access(&self, _ctx: &Ctx, ino: u64, _mask: u32) -> Result<()> {
        self.getattr(ino).map(|_| ())
    }
    fn readlink(&self, _ino: u64) -> Result<Vec<u8>> {
        Err(Error::errno(libc::EINVAL))
    }
    fn mknod(&self, _ctx: &Ctx, _parent: u64, name: &[u8], _mode: u32, _rdev: u32) -> Result<Attr> {
        Ok(self.attr(ino_of(name)))
    }
    fn mkdir(&self, _ctx: &Ctx, _parent: u64, _name: &[u8], _mode: u32) -> Result<Attr> {
        rofs()
    }
    fn unlink(&self, _ctx: &Ctx, _parent: u64, name: &[u8]) -> Result<Attr> {
        let mut a = self.attr(ino_of(name));
        a.nlink = 0;
        Ok(a)
    }
    fn rmdir(&self, _ctx: &Ctx, _parent: u64, _name: &[u8]) -> Result<Attr> {
        rofs()
    }
    fn symlink(&self, _ctx: &Ctx, _parent: u64, _name: &[u8], _target: &[u8]) -> Result<Attr> {
        rofs()
    }
    fn rename(
        &self,
        _ctx: &Ctx,
        _p: u64,
        _n: &[u8],
        _np: u64,
        _nn: &[u8],
        _flags: u32,
    ) -> Result<Option<u64>> {
        Ok(None)
    }
    fn link(&self, _ctx: &Ctx, _ino: u64, _np: u64, _nn: &[u8]) -> Result<Attr> {
        rofs()
    }
    fn open(&self, _ctx: &Ctx, _ino: u64, _flags: i32) -> Result<u64> {
        Ok(0)
    }
    fn create(
        &self,
        _ctx: &Ctx,
        _parent: u64,
        name: &[u8],
        _mode: u32,
        _flags: i32,
    ) -> Result<(Attr, u64)> {
        Ok((self.attr(ino_of(name)), 0))
    }
    fn read(
        &self,
        _ino: u64,
        _fh: u64,
        offset: u64,
        size: u32,
        reply: &mut dyn ReadReply,
    ) -> Result<()> {
        let n = (size as u64).min(FILE_SIZE.saturating_sub(offset)) as usize;
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len());
            parts.push(&ZEROS[..k]);
            left -= k;
        }
        reply.send(&parts)
    }
    fn write(&self, _ctx: &Ctx, _ino: u64, _fh: u64, _offset: u64, data: &[u8]) -> Result<u32> {
        Ok(data.len() as u32)
    }
    fn release(&self, _ino: u64, _fh: u64) -> Result<()> {
        Ok(())
    }
    fn fsync(&self, _ino: u64, _fh: u64, _datasync: bool) -> Result<()> {
        Ok(())
    }
    fn readdir(
        &self,
        _ino: u64,
        _offset: u64,
        _plus: bool,
        _f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        Ok(())
    }
    fn statfs(&self) -> Result<StatFs> {
        Ok(StatFs {
            blocks: 1 << 28,
            bfree: 1 << 28,
            bavail: 1 << 28,
            files: 1 << 20,
            ffree: 1 << 20,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }
    fn setxattr(
        &self,
        _ctx: &Ctx,
        _ino: u64,
        _name: &[u8],
        _value: &[u8],
        _flags: i32,
    ) -> Result<()> {
        Err(Error::errno(libc::EOPNOTSUPP))
    }
    fn getxattr(&self, _ctx: &Ctx, _ino: u64, _name: &[u8]) -> Result<Vec<u8>> {
        Err(Error::errno(libc::ENODATA))
    }
    fn listxattr(&self, _ctx: &Ctx, _ino: u64) -> Result<Vec<Vec<u8>>> {
        Ok(vec![])
    }
    fn removexattr(&self, _ctx: &Ctx, _ino: u64, _name: &[u8]) -> Result<()> {
        Err(Error::errno(libc::ENODATA))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_without_storing() {
        let n = NullFs::default();
        let ctx = Ctx::default();
        let a = n.lookup(&ctx, ROOT, b"file").unwrap();
        assert_eq!(a.size, FILE_SIZE);
        assert_eq!(a.ino, n.lookup(&ctx, ROOT, b"file").unwrap().ino);
        assert_ne!(a.ino, ROOT);
        assert_eq!(n.write(&ctx, a.ino, 0, 0, &[1; 100]).unwrap(), 100);
        let mut got = 0;
        n.read(a.ino, 0, FILE_SIZE - 10, 4096, &mut |s: &[&[u8]]| {
            got = s.iter().map(|x| x.len()).sum();
            Ok(())
        })
        .unwrap();
        assert_eq!(got, 10);
        assert!(n.getattr(ROOT).unwrap().is_dir());
    }
}
