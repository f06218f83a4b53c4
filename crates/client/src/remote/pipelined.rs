//! Reads and writes sent without waiting for their replies, through an open handle:
//! several in flight at once (what `zcfs cp` does to move a file at the link's speed).
//! A caller keeps its own bound on how many it has outstanding; every connection also
//! blocks a submit while the server's in-flight limit is reached.

use super::{cred, RemoteFs};
use crate::{Caller, Ticket};
use std::sync::atomic::Ordering;
use zcfs_backend::{Ctx, Error, Result};
use zcfs_protocol::{Operation, ReadReq, Request, Wire, WriteReq};

/// A read sent; `wait` gives its data (fewer bytes than asked at the end of the file,
/// none past it).
pub struct ReadTicket<'a> {
    fs: &'a RemoteFs,
    ticket: Ticket,
    size: u32,
}

/// A write sent (its data already left from the caller's buffer); `wait` gives the
/// count the server wrote (fewer than sent when the volume filled part way).
pub struct WriteTicket<'a> {
    fs: &'a RemoteFs,
    ticket: Ticket,
    size: u32,
}

impl RemoteFs {
    /// The most bytes one `submit_read` or `submit_write` may move: the limit the
    /// server negotiated.
    pub fn max_io(&self) -> Result<usize> {
        self.client.max_data()
    }

    /// Send a read of `size` bytes at `offset` through handle `fh` (from `open` or
    /// `create`) without waiting. `size` above `max_io` is EINVAL.
    pub fn submit_read(&self, ino: u64, fh: u64, offset: u64, size: u32) -> Result<ReadTicket<'_>> {
        self.check_io(size as usize)?;
        let req: Request = ReadReq {
            node: self.node(ino),
            fh: self.server_fh(fh)?,
            offset,
            size,
        }
        .into();
        let ticket = self.client.submit(&req, Caller::process(), &[])?;
        Ok(ReadTicket {
            fs: self,
            ticket,
            size,
        })
    }

    /// Send `data` to be written at `offset` through handle `fh` without waiting for
    /// the reply; the buffer may be reused as soon as this returns. More than
    /// `max_io` bytes is EINVAL.
    pub fn submit_write(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
    ) -> Result<WriteTicket<'_>> {
        self.check_io(data.len())?;
        self.forget_attr(ino);
        // The handle first: a write refused here (the file gone in a restart) was never
        // begun, so it is not counted as one a later restart may have lost.
        let req: Request = WriteReq {
            node: self.node(ino),
            fh: self.server_fh(fh)?,
            offset,
            size: data.len() as u32,
            commit: false,
        }
        .into();
        let _sending = self.written_through(fh);
        let ticket = self.client.submit(&req, cred(ctx), &[data])?;
        Ok(WriteTicket {
            fs: self,
            ticket,
            size: data.len() as u32,
        })
    }

    fn check_io(&self, size: usize) -> Result<()> {
        let max = self.max_io()?;
        if size > max {
            return Err(Error::new(
                libc::EINVAL,
                format!("an I/O of {size} bytes; the server takes at most {max} in one request"),
            ));
        }
        Ok(())
    }
}

impl ReadTicket<'_> {
    pub fn wait(self) -> Result<Vec<u8>> {
        let r = self.ticket.wait()?;
        let n = r.data.len();
        if n > self.size as usize {
            // More than asked for is a broken (or, without MACs, forged) reply.
            return Err(Error::new(
                libc::EIO,
                format!("the server sent {n} bytes for a read of {}", self.size),
            ));
        }
        self.fs.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
        self.fs
            .client
            .bytes_received
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(r.data)
    }
}

impl WriteTicket<'_> {
    pub fn wait(self) -> Result<u32> {
        let r = self.ticket.wait()?;
        let written = <WriteReq as Operation>::Reply::decode(&r.body)
            .map_err(|e| Error::new(libc::EIO, format!("malformed write reply: {e}")))?
            .written;
        if written > self.size {
            return Err(Error::new(
                libc::EIO,
                format!(
                    "the server wrote {written} bytes of a {}-byte request",
                    self.size
                ),
            ));
        }
        self.fs
            .written_bytes
            .fetch_add(written as u64, Ordering::Relaxed);
        Ok(written)
    }
}
