//! Reading requests with splice(2) (zcfs patch): a worker thread splices each request
//! from /dev/fuse into a pipe of its own. The kernel puts a buffered write's data there
//! as references to the page-cache pages that hold it, not as a copy, so a file system
//! can move those bytes on (e.g. splice them into a socket) without ever copying them
//! into user space. Every other request is read out of the pipe into the usual buffer.

use std::cell::Cell;
use std::io;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::BorrowedFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;

/// The pipe's capacity: one request of the largest size the kernel sends (1 MiB of
/// data in 256 pages, or 257 when the write is not page-aligned, plus its header) must
/// fit in its slots, or the kernel fails the request with EIO. 512 slots of 4 KiB.
pub(crate) const PIPE_BYTES: usize = 2 << 20;

/// The largest `max_write` splicing is for: a write request's data (at most
/// `max_write`, in up to one page more than it fills) and its header page fit the pipe
/// whatever the kernel's request page limit, and the kernel's rule that a read of the
/// device has room for a whole write holds. A file system with a larger `max_write`
/// should not ask for `Config::splice_writes` (a worker refused by the kernel reads as
/// usual).
pub const SPLICE_MAX_WRITE: u32 = (PIPE_BYTES / 2) as u32;

/// Whether a worker could splice requests here: a pipe of [`PIPE_BYTES`] can be made
/// (zcfs patch). The error says why not.
pub fn splice_pipe_available() -> io::Result<()> {
    SplicePipe::new().map(drop)
}

/// A pipe a worker splices requests into. Empty between requests.
#[derive(Debug)]
pub(crate) struct SplicePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl SplicePipe {
    /// A pipe of `PIPE_BYTES`. Fails where the size is refused (an unprivileged process
    /// above /proc/sys/fs/pipe-max-size, or over its user's pipe page budget).
    pub(crate) fn new() -> io::Result<SplicePipe> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 writes two descriptors into the array it is given, which has room
        // for exactly two.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made by pipe2 and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_SETPIPE_SZ takes an int argument and touches no memory of ours.
        let got = unsafe {
            libc::fcntl(
                write.as_raw_fd(),
                libc::F_SETPIPE_SZ,
                PIPE_BYTES as libc::c_int,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        if (got as usize) < PIPE_BYTES {
            return Err(io::Error::other(format!(
                "pipe size {got} below {PIPE_BYTES}"
            )));
        }
        Ok(SplicePipe { read, write })
    }

    /// Splice the next request from `dev` into the pipe: its length.
    pub(crate) fn splice_from(&self, dev: BorrowedFd<'_>) -> nix::Result<usize> {
        // SAFETY: splice with null offsets moves between two descriptors we hold; it
        // touches no memory of ours.
        let n = unsafe {
            libc::splice(
                dev.as_raw_fd(),
                std::ptr::null_mut(),
                self.write.as_raw_fd(),
                std::ptr::null_mut(),
                PIPE_BYTES,
                0,
            )
        };
        if n < 0 {
            Err(nix::errno::Errno::last())
        } else {
            Ok(n as usize)
        }
    }

    /// Read exactly `buf.len()` bytes, which the pipe holds (a whole request was spliced
    /// in): a short read means the pipe lost its contents, an error.
    pub(crate) fn read_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            // SAFETY: reads into the unfilled tail of `buf`, within its bounds.
            let n = unsafe {
                libc::read(
                    self.read.as_raw_fd(),
                    buf[done..].as_mut_ptr().cast(),
                    buf.len() - done,
                )
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    fn read_fd(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }
}

/// The data of a write request, still in the pipe it was spliced into: `len` bytes,
/// taken by [`SplicedData::splice_into`] (no copy) or [`SplicedData::read_into`].
/// Whatever is not taken when the file system's `write_spliced` returns is thrown away.
#[derive(Debug)]
pub struct SplicedData<'a> {
    pipe: &'a SplicePipe,
    len: usize,
    taken: Cell<usize>,
    /// A read or splice failed: how much is still in the pipe is not known, so the
    /// pipe is not used again.
    failed: Cell<bool>,
}

impl<'a> SplicedData<'a> {
    pub(crate) fn new(pipe: &'a SplicePipe, len: usize) -> SplicedData<'a> {
        SplicedData {
            pipe,
            len,
            taken: Cell::new(0),
            failed: Cell::new(false),
        }
    }

    /// The write's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the write carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes not taken yet.
    pub fn remaining(&self) -> usize {
        self.len - self.taken.get()
    }

    /// Copy the next `dst.len()` bytes (at most `remaining()`) into `dst`.
    pub fn read_into(&self, dst: &mut [u8]) -> io::Result<()> {
        if dst.len() > self.remaining() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "read past the end of the spliced write",
            ));
        }
        self.taken.set(self.taken.get() + dst.len());
        let r = self.pipe.read_exact(dst);
        self.failed.set(self.failed.get() || r.is_err());
        r
    }

    /// Whether a read or splice of it failed (the pipe's contents are then unknown).
    pub(crate) fn failed(&self) -> bool {
        self.failed.get()
    }

    /// Move every remaining byte into `out` (a socket, say) with splice(2): the pages
    /// go by reference, nothing is copied. Blocks while `out` is full (a socket's send
    /// timeout applies). An error leaves the rest untaken.
    pub fn splice_into(&self, out: BorrowedFd<'_>) -> io::Result<()> {
        while self.remaining() > 0 {
            // SAFETY: splice with null offsets between the pipe and a descriptor the
            // caller lends us; it touches no memory of ours.
            let n = unsafe {
                libc::splice(
                    self.pipe.read_fd().as_raw_fd(),
                    std::ptr::null_mut(),
                    out.as_raw_fd(),
                    std::ptr::null_mut(),
                    self.remaining(),
                    libc::SPLICE_F_MOVE,
                )
            };
            match n {
                n if n > 0 => self.taken.set(self.taken.get() + n as usize),
                0 => return Err(io::ErrorKind::WriteZero.into()),
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        self.failed.set(true);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }
}
