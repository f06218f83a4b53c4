//! One connection of a client: its writer (socket and MAC, held together), the table of
//! requests waiting for replies, the reader thread that matches replies to them and checks
//! their tags, and the ticket a caller waits on.

use crate::{lock, Response, Slot};
use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;
use zcfs_backend::Error;
use zcfs_protocol::channel::{Mac, TAG_LEN};
use zcfs_protocol::handshake::Welcome;
use zcfs_protocol::{Op, Request, RespHeader, RESP_HDR};
use zcfs_transport::Stream;

/// A request sent without waiting for its reply (a forget), kept until the reply
/// comes, to send again (with its id) if its connection is lost first.
pub(crate) struct Posted {
    pub(crate) req: Request,
    /// The session epoch it belongs to: moot once the session is gone.
    pub(crate) epoch: u64,
    /// The connection it went out on (dead: not sent yet, or lost).
    pub(crate) conn: Weak<Conn>,
}

pub(crate) type PostedTable = Arc<Mutex<HashMap<u64, Posted>>>;

/// The sending side of a connection: the socket, and its MAC when authenticated (held
/// together: a message's sequence number is its place on the wire).
pub(crate) struct Writer {
    pub(crate) s: Stream,
    pub(crate) mac: Option<Mac>,
}

pub(crate) struct Conn {
    pub(crate) writer: Mutex<Writer>,
    /// The same socket, to shut it down without waiting for a writer.
    pub(crate) control: Stream,
    /// Requests waiting for their replies: operation, and where the reply goes (None:
    /// posted, no one waits; its reply only clears it from `posted`).
    pub(crate) pending: Mutex<HashMap<u64, (Op, Option<Slot>)>>,
    pub(crate) posted: PostedTable,
    pub(crate) broken: AtomicBool,
    pub(crate) welcome: Welcome,
    /// The client's session epoch when this connection was handed out.
    pub(crate) epoch: AtomicU64,
    pub(crate) inflight: (Mutex<u32>, Condvar),
}

impl Conn {
    pub(crate) fn break_with(&self, why: &str) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            tracing::warn!("connection lost: {why}");
        }
        self.close(why);
    }

    /// Shut the socket (the reader thread then ends) and fail what is pending.
    pub(crate) fn close(&self, why: &str) {
        self.broken.store(true, Ordering::SeqCst);
        let _ = self.control.shutdown(std::net::Shutdown::Both);
        for (_, (_, slot)) in lock(&self.pending).drain() {
            if let Some(slot) = slot {
                let _ = slot.try_send(Err(Error::new(
                    libc::ENOTCONN,
                    format!("connection to the server lost: {why}"),
                )));
            }
        }
    }

    pub(crate) fn is_up(&self) -> bool {
        !self.broken.load(Ordering::SeqCst)
    }
}

/// A submitted request; `wait` for its reply.
pub struct Ticket {
    pub(crate) rx: Receiver<Result<Response, Error>>,
    pub(crate) conn: Arc<Conn>,
    pub(crate) id: u64,
    pub(crate) timeout: Duration,
    pub(crate) addr: String,
}

impl Ticket {
    pub fn wait(self) -> Result<Response, Error> {
        let r = match self.rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(_) => {
                lock(&self.conn.pending).remove(&self.id);
                self.conn.break_with("reply timed out");
                Err(Error::new(
                    libc::ETIMEDOUT,
                    format!(
                        "no reply from {} within {:?} (server or link down?)",
                        self.addr, self.timeout
                    ),
                ))
            }
        };
        let resp = r?;
        if resp.hdr.status != 0 {
            return Err(Error::errno(resp.hdr.status));
        }
        Ok(resp)
    }
}

impl Drop for Ticket {
    /// Release the in-flight slot, waited for or not.
    fn drop(&mut self) {
        let (m, cv) = &self.conn.inflight;
        *lock(m) -= 1;
        cv.notify_one();
    }
}

/// A reply as received: header, body, data.
pub(crate) type Received = (RespHeader, Vec<u8>, Vec<u8>);

/// Receive one reply (header, body, tag, data, data tag) and check its tags. Err: why
/// the connection must end, and the id of a reply that failed its check (that caller
/// gets EIO: it must not get data it cannot trust, nor a resend of a request whose
/// answer was tampered with).
pub(crate) fn recv_reply(
    s: &mut Stream,
    mac: &mut Option<Mac>,
) -> Result<Received, (String, Option<u64>)> {
    let mut hb = [0u8; RESP_HDR];
    s.read_exact(&mut hb)
        .map_err(|e| (format!("receive: {e}"), None))?;
    let h = RespHeader::decode(&hb).map_err(|e| (format!("malformed reply: {e}"), None))?;
    let tag_len = if mac.is_some() { TAG_LEN } else { 0 };
    // Into fresh capacity: no zero-fill of a buffer the kernel is about to write.
    let (mut body, mut data) = (
        Vec::with_capacity(h.body_len as usize + tag_len),
        Vec::with_capacity(h.data_len as usize + tag_len),
    );
    zcfs_transport::recv_into_vec(s, &mut body, h.body_len as usize + tag_len)
        .map_err(|e| (format!("receive: {e}"), None))?;
    let mut m = None;
    if let Some(mac) = mac.as_mut() {
        let tag: [u8; TAG_LEN] = body[h.body_len as usize..]
            .try_into()
            .expect("TAG_LEN bytes");
        body.truncate(h.body_len as usize);
        let mm = mac.begin(&hb, &body);
        mm.verify(&tag).map_err(|e| (e.to_string(), Some(h.id)))?;
        if mac.data_tagged(h.data_len as usize) {
            m = Some(mm);
        }
    }
    zcfs_transport::recv_into_vec(s, &mut data, h.data_len as usize)
        .map_err(|e| (format!("receive: {e}"), None))?;
    if let Some(mut mm) = m {
        let mut tag = [0u8; TAG_LEN];
        s.read_exact(&mut tag)
            .map_err(|e| (format!("receive: {e}"), None))?;
        mm.data(&data);
        mm.verify_data(&tag)
            .map_err(|e| (e.to_string(), Some(h.id)))?;
    }
    Ok((h, body, data))
}

pub(crate) fn read_loop(mut s: Stream, mut mac: Option<Mac>, conn: Arc<Conn>) {
    let why = loop {
        let (h, body, data) = match recv_reply(&mut s, &mut mac) {
            Ok(x) => x,
            Err((why, forged)) => {
                if let Some(id) = forged {
                    if let Some((_, Some(slot))) = lock(&conn.pending).remove(&id) {
                        let _ = slot.try_send(Err(Error::new(
                            libc::EIO,
                            format!("the reply failed its integrity check: {why}"),
                        )));
                    }
                }
                break why;
            }
        };
        let Some((op, slot)) = lock(&conn.pending).remove(&h.id) else {
            // A reply to a request that timed out: drop it.
            continue;
        };
        if op != h.op {
            break format!(
                "reply {} for {} carries op {}",
                h.id,
                op.name(),
                h.op.name()
            );
        }
        match slot {
            Some(slot) => {
                let epoch = conn.epoch.load(Ordering::SeqCst);
                let _ = slot.try_send(Ok(Response {
                    hdr: h,
                    body,
                    data,
                    epoch,
                }));
            }
            // A posted request answered: nothing to send again.
            None => {
                lock(&conn.posted).remove(&h.id);
            }
        }
    };
    conn.break_with(&why);
}
