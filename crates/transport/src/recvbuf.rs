//! A receive buffer in front of a socket: one recv takes a message's header and body
//! together, and the messages behind it when a peer sent several at once (a client with
//! requests in flight), instead of one recv per part. Bulk payloads still land where
//! their reader wants them: only what the buffer already holds is copied out of it, the
//! rest is read straight into the destination.

use std::io::{IoSliceMut, Read};
use std::os::fd::AsRawFd;

/// The buffer's size: enough for many small requests (a read request is about a
/// hundred bytes), small enough that little of a large write's payload passes through
/// it (at most this much of each message is copied instead of landing in place).
pub const RECV_BUF_SIZE: usize = 16 << 10;

/// Bytes received from a socket ahead of their reader (see the module's doc). Owned by
/// whoever reads the socket, and handed on with it.
pub struct RecvBuf {
    buf: Box<[u8]>,
    /// The buffered bytes are `buf[start..end]`.
    start: usize,
    end: usize,
}

impl Default for RecvBuf {
    fn default() -> Self {
        RecvBuf::new(RECV_BUF_SIZE)
    }
}

impl RecvBuf {
    pub fn new(capacity: usize) -> RecvBuf {
        RecvBuf {
            buf: vec![0u8; capacity.max(1)].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// The bytes received and not taken yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Drop the first `n` buffered bytes (they were used in place).
    pub fn consume(&mut self, n: usize) {
        assert!(n <= self.len(), "consumed more than was buffered");
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// One read from `r` into the free space (the buffered bytes moved to the front
    /// first when the space after them is gone): the bytes it added, 0 at end of
    /// stream. The buffer must not be full.
    pub fn fill_once(&mut self, r: &mut impl Read) -> std::io::Result<usize> {
        self.fill_once_upto(r, usize::MAX)
    }

    /// `fill_once`, taking at most `max` bytes (at least 1): for a reader that wants
    /// only the rest of one message start, and nothing behind it.
    pub fn fill_once_upto(&mut self, r: &mut impl Read, max: usize) -> std::io::Result<usize> {
        assert!(
            self.len() < self.capacity(),
            "filling a full receive buffer"
        );
        if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = (self.buf.len() - self.end).min(max.max(1));
        let n = r.read(&mut self.buf[self.end..self.end + room])?;
        self.end += n;
        Ok(n)
    }

    /// Append up to `n` buffered bytes to `v`: how many.
    pub fn take_to_vec(&mut self, v: &mut Vec<u8>, n: usize) -> usize {
        let n = n.min(self.len());
        v.extend_from_slice(&self.buf[self.start..self.start + n]);
        self.consume(n);
        n
    }

    /// Copy buffered bytes into `dst` (as many as both have): how many.
    pub fn take_into(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.len());
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.consume(n);
        n
    }

    /// Fill `dst` exactly: first from the buffer, the rest read from `r` straight into
    /// `dst` (never through the buffer). Returns how many bytes came from the buffer.
    pub fn read_exact_through(
        &mut self,
        r: &mut impl Read,
        dst: &mut [u8],
    ) -> std::io::Result<usize> {
        let k = self.take_into(dst);
        r.read_exact(&mut dst[k..])?;
        Ok(k)
    }

    /// Fill every slice of `dst` exactly: the buffered bytes first, then readv from `r`
    /// into what is left of them. Returns how many bytes came from the buffer.
    pub fn read_exact_vectored_through(
        &mut self,
        r: &mut impl Read,
        dst: &mut [&mut [u8]],
    ) -> std::io::Result<usize> {
        let mut copied = 0;
        let mut first = 0;
        let mut offset = 0;
        for d in dst.iter_mut() {
            let k = self.take_into(d);
            copied += k;
            if k < d.len() {
                offset = k;
                break;
            }
            first += 1;
        }
        if first < dst.len() {
            let (head, tail) = dst[first..].split_at_mut(1);
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(tail.len() + 1);
            iov.push(IoSliceMut::new(&mut head[0][offset..]));
            iov.extend(tail.iter_mut().map(|d| IoSliceMut::new(d)));
            crate::read_exact_vectored(r, &mut iov)?;
        }
        Ok(copied)
    }
}

/// `Read` by recv(2) on a shared socket (`&Stream` has no `Read`): for filling a
/// receive buffer from a socket whose reader is one thread at a time by other means.
pub struct RecvFd<'a, F: AsRawFd>(pub &'a F);

impl<F: AsRawFd> Read for RecvFd<'_, F> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes of writes for the call.
        let r = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out its bytes at most `step` at a time.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        reads: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.reads += 1;
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn a_header_and_body_come_in_one_read_and_the_rest_goes_straight_to_its_place() {
        let data = bytes(100_000);
        let mut r = Trickle {
            data: &data,
            step: usize::MAX,
            reads: 0,
        };
        let mut b = RecvBuf::new(1000);
        assert_eq!(b.fill_once(&mut r).unwrap(), 1000);
        assert_eq!(r.reads, 1);
        assert_eq!(&b.buffered()[..64], &data[..64]);
        b.consume(64);
        let mut body = vec![0u8; 36];
        assert_eq!(b.read_exact_through(&mut r, &mut body).unwrap(), 36);
        assert_eq!(body, data[64..100]);
        assert_eq!(r.reads, 1, "the body was in the buffer");
        // A payload of 50,000 bytes in three pieces: 900 from the buffer, the rest read
        // into the pieces themselves.
        let (mut a, mut m, mut z) = (vec![0u8; 500], vec![0u8; 40_000], vec![0u8; 9_500]);
        let copied = b
            .read_exact_vectored_through(&mut r, &mut [&mut a, &mut m, &mut z])
            .unwrap();
        assert_eq!(copied, 900);
        assert!(b.is_empty());
        let got = [a, m, z].concat();
        assert_eq!(got, data[100..50_100]);
        // What follows starts where the payload ended.
        assert_eq!(b.fill_once(&mut r).unwrap(), 1000);
        assert_eq!(b.buffered(), &data[50_100..51_100]);
    }

    #[test]
    fn a_partial_message_at_the_end_of_the_space_is_moved_to_the_front() {
        let data = bytes(3000);
        let mut r = Trickle {
            data: &data,
            step: 700,
            reads: 0,
        };
        let mut b = RecvBuf::new(1000);
        assert_eq!(b.fill_once(&mut r).unwrap(), 700);
        b.consume(650);
        assert_eq!(b.fill_once(&mut r).unwrap(), 300, "to the end of the space");
        assert_eq!(b.buffered(), &data[650..1000]);
        // Full at the back: the 350 bytes move to the front and 650 more fit.
        assert_eq!(b.fill_once(&mut r).unwrap(), 650);
        assert_eq!(b.buffered(), &data[650..1650]);
        assert_eq!(b.len(), b.capacity());
    }

    #[test]
    fn reading_through_an_empty_buffer_reads_only_into_the_destination() {
        let data = bytes(5000);
        let mut r = Trickle {
            data: &data,
            step: 1234,
            reads: 0,
        };
        let mut b = RecvBuf::new(64);
        let (mut x, mut y) = (vec![0u8; 10], vec![0u8; 4000]);
        assert_eq!(
            b.read_exact_vectored_through(&mut r, &mut [&mut x, &mut y])
                .unwrap(),
            0
        );
        assert_eq!([x, y].concat(), data[..4010]);
        assert!(b.is_empty());
        // A short stream is an error, not a short fill.
        let mut tail = vec![0u8; 2000];
        let e = b.read_exact_through(&mut r, &mut tail).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn empty_destinations_take_nothing() {
        let data = bytes(10);
        let mut r = Trickle {
            data: &data,
            step: 10,
            reads: 0,
        };
        let mut b = RecvBuf::new(64);
        b.fill_once(&mut r).unwrap();
        let mut none: [&mut [u8]; 0] = [];
        assert_eq!(b.read_exact_vectored_through(&mut r, &mut none).unwrap(), 0);
        let (mut e, mut f): ([u8; 0], [u8; 0]) = ([], []);
        assert_eq!(
            b.read_exact_vectored_through(&mut r, &mut [&mut e, &mut f])
                .unwrap(),
            0
        );
        assert_eq!(b.len(), 10);
    }
}
