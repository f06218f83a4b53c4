//! The control protocol on the same-host Unix socket: small typed messages, each a
//! little-endian `u32` length and that many bytes (a tag byte, then the fields), with
//! file descriptors passed alongside by `SCM_RIGHTS`. One request, one reply, in order.
//! The data path is not here: it is the rings (ring.rs).
//!
//! [`Request::decode`] is what the server runs on a peer's bytes: it never panics and
//! refuses anything malformed with a [`ProtoError`] (fuzzed: fuzz/fuzz_targets/samehost.rs).

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::unix::net::UnixStream;

/// Version of this protocol (Hello).
pub const PROTOCOL_VERSION: u32 = 2;
/// Largest message body (a path of [`MAX_PATH`] bytes and its fields fit).
pub const MAX_MESSAGE: usize = 8192;
/// Longest path an Open names (PATH_MAX).
pub const MAX_PATH: usize = 4096;
/// Most descriptors one message carries (the rings' reply: the memfd and two eventfds).
pub const MAX_FDS: usize = 3;
/// Longest error message in a reply.
pub const MAX_ERROR_TEXT: usize = 1024;

/// A malformed message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("message ends early")]
    Short,
    #[error("unknown message tag {0}")]
    UnknownTag(u8),
    #[error("message of {0} bytes exceeds {MAX_MESSAGE}")]
    TooLong(usize),
    #[error("{0} bytes left over after the message")]
    Trailing(usize),
    #[error("path of {0} bytes (1..={MAX_PATH}, no NUL)")]
    BadPath(usize),
    #[error("message carried {got} file descriptors, expected {want}")]
    Fds { got: usize, want: usize },
    #[error("control data truncated (too many file descriptors)")]
    Truncated,
}

/// An application's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// First message: the protocol version, and whether the application asks for the
    /// direct map (answered with whether it is trusted).
    Hello { version: u32, want_direct: bool },
    /// Make the rings: `entries` (a power of two) in each. Reply `Rings` with three
    /// descriptors: the rings' memfd, the eventfd application -> server, the eventfd
    /// server -> application.
    SetupRings { entries: u32 },
    /// Register the memfd passed along (sealed against shrinking) as a buffer of `len`
    /// bytes. Reply `Buffer`.
    RegisterBuffer { len: u64 },
    /// Open (with O_CREAT: create) a regular file by its path in the volume, as the
    /// peer. Reply `Opened`.
    Open {
        path: Vec<u8>,
        flags: i32,
        mode: u32,
    },
    /// Close a handle. Reply `Done`.
    Close { handle: u32 },
    /// Ask for the volume image (trusted peers only). Reply `DirectMap` with three
    /// descriptors: the image read-only, read-write, and the change counters
    /// (read-only; see `MapGeometry::change_slots`).
    DirectMap,
    /// The service's counters. Reply `Stats`.
    Stats,
}

/// Where the data area lies in the image a `DirectMap` reply passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapGeometry {
    /// Byte offset of the first data block in the image.
    pub data_start: u64,
    /// Byte offset just past the last data block.
    pub data_end: u64,
    /// Block size (4096).
    pub block_size: u32,
    /// Size of the image file.
    pub image_size: u64,
    /// Counters in the change-counter memfd (`u64` each): the one at a file's
    /// `change_slot` moves whenever the file changes (zcfs_volume's changes.rs).
    pub change_slots: u32,
}

/// The server's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Hello {
        version: u32,
        trusted: bool,
    },
    Rings {
        entries: u32,
        size: u64,
    },
    Buffer {
        id: u32,
    },
    /// `change_slot`: the file's counter in the direct map's change counters.
    Opened {
        handle: u32,
        size: u64,
        change_slot: u32,
    },
    Done,
    DirectMap(MapGeometry),
    Stats {
        json: Vec<u8>,
    },
    Error {
        errno: i32,
        message: String,
    },
}

mod tag {
    pub const HELLO: u8 = 1;
    pub const SETUP_RINGS: u8 = 2;
    pub const REGISTER_BUFFER: u8 = 3;
    pub const OPEN: u8 = 4;
    pub const CLOSE: u8 = 5;
    pub const DIRECT_MAP: u8 = 6;
    pub const STATS: u8 = 7;
    pub const R_HELLO: u8 = 101;
    pub const R_RINGS: u8 = 102;
    pub const R_BUFFER: u8 = 103;
    pub const R_OPENED: u8 = 104;
    pub const R_DONE: u8 = 105;
    pub const R_DIRECT_MAP: u8 = 106;
    pub const R_STATS: u8 = 107;
    pub const R_ERROR: u8 = 199;
}

struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], ProtoError> {
        if self.0.len() < n {
            return Err(ProtoError::Short);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> Result<&[u8], ProtoError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn end(self) -> Result<(), ProtoError> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(32);
        match self {
            Request::Hello {
                version,
                want_direct,
            } => {
                o.push(tag::HELLO);
                o.extend_from_slice(&version.to_le_bytes());
                o.push(*want_direct as u8);
            }
            Request::SetupRings { entries } => {
                o.push(tag::SETUP_RINGS);
                o.extend_from_slice(&entries.to_le_bytes());
            }
            Request::RegisterBuffer { len } => {
                o.push(tag::REGISTER_BUFFER);
                o.extend_from_slice(&len.to_le_bytes());
            }
            Request::Open { path, flags, mode } => {
                o.push(tag::OPEN);
                o.extend_from_slice(&flags.to_le_bytes());
                o.extend_from_slice(&mode.to_le_bytes());
                put_bytes(&mut o, path);
            }
            Request::Close { handle } => {
                o.push(tag::CLOSE);
                o.extend_from_slice(&handle.to_le_bytes());
            }
            Request::DirectMap => o.push(tag::DIRECT_MAP),
            Request::Stats => o.push(tag::STATS),
        }
        o
    }

    /// Parse a request from a peer (hostile bytes: never panics).
    pub fn decode(b: &[u8]) -> Result<Request, ProtoError> {
        if b.len() > MAX_MESSAGE {
            return Err(ProtoError::TooLong(b.len()));
        }
        let mut r = Rd(b);
        let req = match r.u8()? {
            tag::HELLO => Request::Hello {
                version: r.u32()?,
                want_direct: r.u8()? != 0,
            },
            tag::SETUP_RINGS => Request::SetupRings { entries: r.u32()? },
            tag::REGISTER_BUFFER => Request::RegisterBuffer { len: r.u64()? },
            tag::OPEN => {
                let flags = r.u32()? as i32;
                let mode = r.u32()?;
                let path = r.bytes()?;
                if path.is_empty() || path.len() > MAX_PATH || path.contains(&0) {
                    return Err(ProtoError::BadPath(path.len()));
                }
                Request::Open {
                    path: path.to_vec(),
                    flags,
                    mode,
                }
            }
            tag::CLOSE => Request::Close { handle: r.u32()? },
            tag::DIRECT_MAP => Request::DirectMap,
            tag::STATS => Request::Stats,
            t => return Err(ProtoError::UnknownTag(t)),
        };
        r.end()?;
        Ok(req)
    }

    /// Descriptors this request comes with.
    pub fn fds(&self) -> usize {
        match self {
            Request::RegisterBuffer { .. } => 1,
            _ => 0,
        }
    }
}

impl Reply {
    pub fn error(errno: i32, message: impl Into<String>) -> Reply {
        let mut message = message.into();
        if message.len() > MAX_ERROR_TEXT {
            let mut cut = MAX_ERROR_TEXT;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Reply::Error { errno, message }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(32);
        match self {
            Reply::Hello { version, trusted } => {
                o.push(tag::R_HELLO);
                o.extend_from_slice(&version.to_le_bytes());
                o.push(*trusted as u8);
            }
            Reply::Rings { entries, size } => {
                o.push(tag::R_RINGS);
                o.extend_from_slice(&entries.to_le_bytes());
                o.extend_from_slice(&size.to_le_bytes());
            }
            Reply::Buffer { id } => {
                o.push(tag::R_BUFFER);
                o.extend_from_slice(&id.to_le_bytes());
            }
            Reply::Opened {
                handle,
                size,
                change_slot,
            } => {
                o.push(tag::R_OPENED);
                o.extend_from_slice(&handle.to_le_bytes());
                o.extend_from_slice(&size.to_le_bytes());
                o.extend_from_slice(&change_slot.to_le_bytes());
            }
            Reply::Done => o.push(tag::R_DONE),
            Reply::DirectMap(g) => {
                o.push(tag::R_DIRECT_MAP);
                o.extend_from_slice(&g.data_start.to_le_bytes());
                o.extend_from_slice(&g.data_end.to_le_bytes());
                o.extend_from_slice(&g.block_size.to_le_bytes());
                o.extend_from_slice(&g.image_size.to_le_bytes());
                o.extend_from_slice(&g.change_slots.to_le_bytes());
            }
            Reply::Stats { json } => {
                o.push(tag::R_STATS);
                put_bytes(&mut o, &json[..json.len().min(MAX_MESSAGE - 16)]);
            }
            Reply::Error { errno, message } => {
                o.push(tag::R_ERROR);
                o.extend_from_slice(&errno.to_le_bytes());
                put_bytes(&mut o, message.as_bytes());
            }
        }
        o
    }

    /// Parse a reply (the application's side).
    pub fn decode(b: &[u8]) -> Result<Reply, ProtoError> {
        if b.len() > MAX_MESSAGE {
            return Err(ProtoError::TooLong(b.len()));
        }
        let mut r = Rd(b);
        let rep = match r.u8()? {
            tag::R_HELLO => Reply::Hello {
                version: r.u32()?,
                trusted: r.u8()? != 0,
            },
            tag::R_RINGS => Reply::Rings {
                entries: r.u32()?,
                size: r.u64()?,
            },
            tag::R_BUFFER => Reply::Buffer { id: r.u32()? },
            tag::R_OPENED => Reply::Opened {
                handle: r.u32()?,
                size: r.u64()?,
                change_slot: r.u32()?,
            },
            tag::R_DONE => Reply::Done,
            tag::R_DIRECT_MAP => Reply::DirectMap(MapGeometry {
                data_start: r.u64()?,
                data_end: r.u64()?,
                block_size: r.u32()?,
                image_size: r.u64()?,
                change_slots: r.u32()?,
            }),
            tag::R_STATS => Reply::Stats {
                json: r.bytes()?.to_vec(),
            },
            tag::R_ERROR => Reply::Error {
                errno: r.u32()? as i32,
                message: String::from_utf8_lossy(r.bytes()?).into_owned(),
            },
            t => return Err(ProtoError::UnknownTag(t)),
        };
        r.end()?;
        Ok(rep)
    }

    /// Descriptors this reply comes with.
    pub fn fds(&self) -> usize {
        match self {
            Reply::Rings { .. } => 3,
            Reply::DirectMap(_) => 3,
            _ => 0,
        }
    }
}

/// Send one message (length, body) with `fds` attached.
pub fn send(sock: &UnixStream, body: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let len = (body.len() as u32).to_le_bytes();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    let total = 4 + body.len();
    let mut sent = rustix::net::sendmsg(
        sock.as_fd(),
        &[IoSlice::new(&len), IoSlice::new(body)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    // The descriptors went with the first byte; the rest (rare: a full socket
    // buffer) follows plainly.
    while sent < total {
        let rest: Vec<u8> = len.iter().chain(body).skip(sent).copied().collect();
        let n = rustix::net::send(sock.as_fd(), &rest, SendFlags::NOSIGNAL)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        sent += n;
    }
    Ok(())
}

/// Receive one message: its body and the descriptors attached. `None` at a clean end
/// of the stream (between messages).
pub fn recv(sock: &UnixStream) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    recv_within(sock, None)
}

/// [`recv`], with the whole message due within `limit` of its first bytes (TimedOut
/// otherwise): a peer cannot hold the reader by dripping a message a byte at a time.
pub fn recv_within(
    sock: &UnixStream,
    limit: Option<std::time::Duration>,
) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut len = [0u8; 4];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock.as_fd(),
        &mut [IoSliceMut::new(&mut len)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if r.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        return Err(std::io::Error::other(ProtoError::Truncated));
    }
    if r.bytes == 0 {
        return Ok(None);
    }
    let deadline = limit.map(|l| std::time::Instant::now() + l);
    if r.bytes < 4 {
        read_exact_by(sock, &mut len[r.bytes..], deadline)?;
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(std::io::Error::other(ProtoError::TooLong(n)));
    }
    let mut body = vec![0u8; n];
    read_exact_by(sock, &mut body, deadline)?;
    if let Some(l) = limit {
        sock.set_read_timeout(Some(l))?;
    }
    Ok(Some((body, fds)))
}

/// Fill `buf`, by `deadline` if one is given (each read's timeout is what is left).
fn read_exact_by(
    sock: &UnixStream,
    buf: &mut [u8],
    deadline: Option<std::time::Instant>,
) -> std::io::Result<()> {
    use std::io::ErrorKind;
    let mut s: &UnixStream = sock;
    let Some(deadline) = deadline else {
        return s.read_exact(buf);
    };
    let mut off = 0;
    while off < buf.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                ErrorKind::TimedOut,
                "control message not complete in time",
            ));
        }
        sock.set_read_timeout(Some(left))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => off += n,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let reqs = [
            Request::Hello {
                version: 1,
                want_direct: true,
            },
            Request::SetupRings { entries: 64 },
            Request::RegisterBuffer { len: 1 << 20 },
            Request::Open {
                path: b"/a/b".to_vec(),
                flags: libc::O_RDWR | libc::O_CREAT,
                mode: 0o644,
            },
            Request::Close { handle: 7 },
            Request::DirectMap,
            Request::Stats,
        ];
        for r in reqs {
            assert_eq!(Request::decode(&r.encode()).unwrap(), r);
        }
        let reps = [
            Reply::Hello {
                version: 1,
                trusted: false,
            },
            Reply::Rings {
                entries: 8,
                size: 4096,
            },
            Reply::Buffer { id: 3 },
            Reply::Opened {
                handle: 9,
                size: 5,
                change_slot: 4095,
            },
            Reply::Done,
            Reply::DirectMap(MapGeometry {
                data_start: 4096,
                data_end: 8192,
                block_size: 4096,
                image_size: 8192,
                change_slots: 4096,
            }),
            Reply::Stats {
                json: b"{}".to_vec(),
            },
            Reply::error(libc::EPERM, "no"),
        ];
        for r in reps {
            assert_eq!(Reply::decode(&r.encode()).unwrap(), r);
        }
    }

    #[test]
    fn malformed_requests_are_refused() {
        assert_eq!(Request::decode(&[]), Err(ProtoError::Short));
        assert_eq!(Request::decode(&[77]), Err(ProtoError::UnknownTag(77)));
        assert_eq!(Request::decode(&[tag::CLOSE, 1, 0]), Err(ProtoError::Short));
        assert_eq!(
            Request::decode(&[tag::STATS, 0]),
            Err(ProtoError::Trailing(1))
        );
        let big = vec![tag::STATS; MAX_MESSAGE + 1];
        assert_eq!(
            Request::decode(&big),
            Err(ProtoError::TooLong(MAX_MESSAGE + 1))
        );
        // Paths: empty, with a NUL, at and past the bound.
        let open = |p: &[u8]| {
            let mut o = vec![tag::OPEN, 0, 0, 0, 0, 0, 0, 0, 0];
            put_bytes(&mut o, p);
            Request::decode(&o)
        };
        assert_eq!(open(b""), Err(ProtoError::BadPath(0)));
        assert_eq!(open(b"a\0b"), Err(ProtoError::BadPath(3)));
        assert!(open(&vec![b'a'; MAX_PATH]).is_ok());
        assert_eq!(
            open(&vec![b'a'; MAX_PATH + 1]),
            Err(ProtoError::BadPath(MAX_PATH + 1))
        );
        // A length that claims more than is there.
        let mut o = vec![tag::OPEN, 0, 0, 0, 0, 0, 0, 0, 0];
        o.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Request::decode(&o), Err(ProtoError::Short));
    }

    /// The fuzz target's property (fuzz/fuzz_targets/samehost.rs) on a bounded number
    /// of pseudo-random inputs, so CI runs it without cargo-fuzz.
    #[test]
    fn random_bytes_decode_to_a_value_or_an_error() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for i in 0..20_000usize {
            let len = i % 64;
            let mut b: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if let Some(t) = b.first_mut() {
                // Mostly known tags, so bodies get exercised.
                *t = [
                    1, 2, 3, 4, 5, 6, 7, 101, 102, 103, 104, 105, 106, 107, 199, *t,
                ][i % 16];
            }
            if let Ok(r) = Request::decode(&b) {
                assert_eq!(Request::decode(&r.encode()), Ok(r));
            }
            if let Ok(r) = Reply::decode(&b) {
                assert_eq!(Reply::decode(&r.encode()), Ok(r));
            }
        }
    }

    #[test]
    fn descriptors_travel_with_their_message() {
        let (a, b) = UnixStream::pair().unwrap();
        let ev = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
        let body = Request::RegisterBuffer { len: 5 }.encode();
        send(&a, &body, &[ev.as_fd()]).unwrap();
        send(&a, &Request::Stats.encode(), &[]).unwrap();
        let (got, fds) = recv(&b).unwrap().unwrap();
        assert_eq!(got, body);
        assert_eq!(fds.len(), 1);
        let (got, fds) = recv(&b).unwrap().unwrap();
        assert_eq!(Request::decode(&got).unwrap(), Request::Stats);
        assert!(fds.is_empty());
        drop(a);
        assert!(recv(&b).unwrap().is_none());
    }
}
