//! Write-behind: writes the caller does not wait for (the FUSE mount's buffered writes).
//!
//! A write is sent at once (its bytes leave the caller's buffer before `submit`
//! returns, so nothing is copied or kept here) and answered as written, the FUSE writer
//! even before the bytes leave (they stay borrowed until the send returns); its reply
//! is collected later. What must see its effect waits for it first:
//! - a later write or read overlapping its range (the server executes one connection's
//!   requests in order, but a client spreads requests over several connections, so two
//!   overlapping writes in flight could land in either order; disjoint ones commute);
//! - flush (close(2)), fsync, release, getattr, setattr, fallocate and lseek of the
//!   inode, and sync_all: every write of the inode. A flush or fsync is sent before
//!   the replies are collected, behind the writes on the connection they went out on
//!   (`settle_behind`): the server runs one connection's requests in order.
//!
//! A write goes out without its inode's queue held: it is queued as being sent, the
//! writer answered, then sent, so the writer's next write of the file does not wait for
//! this one's trip through the socket. Whatever needs replies waits for the sends first
//! (`InodeQueue::all_sent`), and while someone waits no new write is queued
//! (`InodeQueue::gate`), so writers that keep writing cannot starve it.
//!
//! An error (ENOSPC, a short write, a lost connection) is kept with the handle that
//! wrote and reported by that handle's next flush or fsync, as NFS does (another
//! descriptor's close must not take it from the writer); the data of a write lost with its
//! connection is not sent again (it is no longer here), so that error is EIO.
//!
//! Bounds: replies held here occupy in-flight slots of the connections (a slot is free
//! once its ticket is gone), so at most `limit` tickets are held over all inodes, half of
//! one connection's slots and at most [`WRITE_BEHIND_MAX`]: the other half stays free
//! for calls, which then can never wait on a ticket nobody collects. A write that finds
//! the bound reached collects its own inode's oldest, or is sent and waited for.

use crate::{lock, Ticket};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zcfs_backend::{Error, Result};
use zcfs_protocol::{Cred, NodeRef, Operation, Wire, WriteReq};

/// The most write replies held at once over all inodes of a mount.
pub const WRITE_BEHIND_MAX: usize = 32;

/// Buffered writes of at most this many bytes are gathered (`WriteBehind::gather`):
/// a 4 KiB write's trip through the socket cost the mount about a third of its CPU per
/// write (the send runs the network stack of both ends), more than the FUSE request.
/// Larger writes go out alone (spliced from 32 KiB on).
pub const GATHER_WRITE_MAX: usize = 16 << 10;
/// A gather is sent once it holds this many writes ...
pub const GATHER_WRITES: usize = 16;
/// ... or this many bytes ...
pub const GATHER_BYTES: usize = 128 << 10;
/// ... or once its oldest write has waited this long: the longest a write answered
/// here stays in the mount before it leaves (another client sees it no sooner).
pub const GATHER_DELAY: Duration = Duration::from_micros(500);

const _: () = assert!(GATHER_WRITES <= crate::SUBMIT_BATCH_MAX);
const _: () = assert!(GATHER_WRITES * GATHER_WRITE_MAX >= GATHER_BYTES);

/// One write in flight: its byte range, the handle it went through and the ticket of
/// its reply.
struct Pending {
    start: u64,
    end: u64,
    fh: u64,
    /// Sent with `WriteReq::commit` (made durable before its reply).
    commit: bool,
    /// Which write this is (`Queue::next_id`), for its sender to find it again.
    id: u64,
    /// None while its writer sends it, without the queue's lock (`WriteBehind::send`):
    /// whoever needs tickets waits for `InodeQueue::sent` first (`all_sent`).
    ticket: Option<Ticket>,
}

#[derive(Default)]
struct Queue {
    inflight: VecDeque<Pending>,
    /// Writes being sent now (entries of `inflight` without a ticket).
    sending: usize,
    /// Threads waiting for them (`InodeQueue::all_sent`): a send wakes them only then.
    awaiting: usize,
    /// Writes held back from being queued while `awaiting` (`InodeQueue::gate`).
    gated: usize,
    next_id: u64,
    /// Per handle, the first error of a write through it collected since its last
    /// fsync, and whether a flush has reported it.
    errors: HashMap<u64, (Error, bool)>,
    /// Per handle, writes collected whose replies said they were committed, not yet
    /// taken (`settle_taking_commits`).
    committed: HashMap<u64, u64>,
}

/// Whose kept errors a settle gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Report {
    /// None: they stay for their handles' flush or fsync.
    Keep,
    /// The handle's (its flush), kept until the handle's fsync or release: every
    /// close of the handle reports it. A handle is shared by every descriptor of one
    /// open (dup, fork, and a child's close-on-exec), and the first of those closes is
    /// not necessarily the writer's own.
    Handle(u64),
    /// The handle's, else (without taking it) another handle's: fsync promises the
    /// inode's data, whichever handle wrote it.
    Fsync(u64),
    /// Every handle's (sync_all, or an inode no handle is left of).
    All,
}

/// An inode's writes in flight, and the signal that one of them has been sent.
#[derive(Default)]
struct InodeQueue {
    q: Mutex<Queue>,
    sent: Condvar,
    /// Where the mount's small writes wait to go out together (`WriteBehind::gather`).
    gather: Option<Arc<Gather>>,
}

impl InodeQueue {
    /// Wait until every write of the queue is sent (has its ticket). While `g` is then
    /// held, none can be added unsent: only `enqueue` adds them, under the lock.
    ///
    /// A write of the queue may be waiting in the gather: it is sent now (by this
    /// thread, without the queue's lock, which the sender takes to hand over the
    /// tickets). One put there after that finds `awaiting` set and sends the gather
    /// itself (`WriteBehind::gather`), so the wait below always ends.
    fn all_sent<'a>(&'a self, mut g: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        while g.sending > 0 {
            g.awaiting += 1;
            if let Some(gather) = &self.gather {
                drop(g);
                gather.flush();
                g = lock(&self.q);
            }
            if g.sending > 0 {
                g = self.sent.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            g.awaiting -= 1;
            if g.awaiting == 0 && g.gated > 0 {
                self.sent.notify_all();
            }
        }
        g
    }

    /// Before a write is queued: wait while someone waits for the writes being sent
    /// (`all_sent`). Otherwise writers of the inode that keep sending (on a slow link
    /// one's next write is queued while another's is still going out) leave it no
    /// moment without a send, and a close, fsync, stat or read of the file waits until
    /// they stop writing. The writes already queued are sent meanwhile: the wait ends.
    fn gate<'a>(&self, mut g: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        while g.awaiting > 0 {
            g.gated += 1;
            g = self.sent.wait(g).unwrap_or_else(|e| e.into_inner());
            g.gated -= 1;
        }
        g
    }

    /// The queue, every write in it sent.
    fn lock_sent(&self) -> MutexGuard<'_, Queue> {
        self.all_sent(lock(&self.q))
    }

    /// A write of the queue (held as `g`) is sent, or dropped unsent: wake whoever
    /// waits for the sends (a condvar's notify is a system call even with no one
    /// waiting).
    fn sent_one(&self, g: &Queue) {
        if g.awaiting > 0 {
            self.sent.notify_all();
        }
    }
}

/// A write queued as being sent whose sender unwinds (a panic in `answer` or `send`)
/// before it is sent: taken out of the queue again, its slot given back and its handle
/// told (EIO at its flush), so that no settle of the inode waits for it forever.
struct Unsent<'a> {
    wb: &'a WriteBehind,
    q: &'a InodeQueue,
    id: u64,
    fh: u64,
    /// Cleared once the send returned (its result is handled as usual).
    armed: bool,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut g = lock(&self.q.q);
        g.sending -= 1;
        if let Some(at) = g.inflight.iter().position(|p| p.id == self.id) {
            g.inflight.remove(at);
            self.wb.held.fetch_sub(1, Ordering::AcqRel);
        }
        g.errors.entry(self.fh).or_insert((
            Error::new(
                libc::EIO,
                "a write-behind write was abandoned before it was sent",
            ),
            false,
        ));
        self.q.sent_one(&g);
    }
}

#[derive(Default)]
pub(super) struct WriteBehind {
    inodes: Mutex<HashMap<u64, Arc<InodeQueue>>>,
    held: Arc<AtomicUsize>,
    /// Small writes gathered into one send (None: each write is sent by its writer).
    gather: Option<Arc<Gather>>,
}

/// How many replies may be held when a connection has `max_inflight` slots.
pub(super) fn limit(max_inflight: u32) -> usize {
    (max_inflight as usize / 2).min(WRITE_BEHIND_MAX)
}

impl WriteBehind {
    /// Write-behind whose small writes are gathered and sent together by `sink`
    /// (see [`Gather`]); a thread sends a gather whose oldest write has waited
    /// [`GATHER_DELAY`].
    pub fn gathering(sink: Arc<dyn GatherSink>) -> WriteBehind {
        let held = Arc::new(AtomicUsize::new(0));
        let gather = Arc::new(Gather {
            buf: Mutex::new(GatherBuf::default()),
            wake: Condvar::new(),
            sink,
            held: held.clone(),
        });
        let g = gather.clone();
        let spawned = std::thread::Builder::new()
            .name("zcfs-gather".into())
            .spawn(move || g.run());
        if let Err(e) = spawned {
            // Without the thread a gather would wait for the next write or settle:
            // send every write at once instead.
            tracing::warn!("no thread for gathered writes ({e}): each write is sent alone");
            return WriteBehind::default();
        }
        WriteBehind {
            inodes: Mutex::new(HashMap::new()),
            held,
            gather: Some(gather),
        }
    }

    /// Whether small writes are gathered (`gather` may be called).
    pub fn gathers(&self) -> bool {
        self.gather.is_some()
    }

    fn queue_of(&self, ino: u64) -> Option<Arc<InodeQueue>> {
        lock(&self.inodes).get(&ino).cloned()
    }

    fn queue_for(&self, ino: u64) -> Arc<InodeQueue> {
        lock(&self.inodes)
            .entry(ino)
            .or_insert_with(|| {
                Arc::new(InodeQueue {
                    gather: self.gather.clone(),
                    ..InodeQueue::default()
                })
            })
            .clone()
    }

    /// Queue a write of `start..end` of `ino` through `fh` as being sent: the writes in
    /// flight that overlap it are waited for first, and a slot is taken (collecting this
    /// inode's oldest write when every slot is held). None: no slot (the caller sends
    /// and waits itself). Some: the queue, the write's id in it (`sending` counts it),
    /// and whether other writes of the inode are in flight (streaming); it asks to be
    /// committed as `commit(streaming)` says.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        limit: usize,
        ino: u64,
        fh: u64,
        start: u64,
        end: u64,
        commit: impl FnOnce(bool) -> bool,
    ) -> Option<(Arc<InodeQueue>, u64, bool)> {
        let q = self.queue_for(ino);
        let mut g = q.gate(lock(&q.q));
        if g.inflight.iter().any(|p| p.start < end && start < p.end) {
            g = q.all_sent(g);
            wait_overlapping(self, &mut g, start, end);
        }
        loop {
            let held = self.held.load(Ordering::Acquire);
            if held < limit {
                if self
                    .held
                    .compare_exchange(held, held + 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break;
                }
                continue;
            }
            if g.inflight.front().is_some_and(|p| p.ticket.is_none()) {
                g = q.all_sent(g);
            }
            if !collect_front(self, &mut g) {
                return None;
            }
        }
        let id = g.next_id;
        g.next_id += 1;
        let streaming = !g.inflight.is_empty();
        g.inflight.push_back(Pending {
            start,
            end,
            fh,
            commit: commit(streaming),
            id,
            ticket: None,
        });
        g.sending += 1;
        drop(g);
        Some((q, id, streaming))
    }

    /// A small write (at most [`GATHER_WRITE_MAX`] bytes, its bytes in `write.data`)
    /// queued as `send` queues one, answered (`answer`), then put in the gather: it goes
    /// out with the others there in one send, once [`GATHER_WRITES`] writes or
    /// [`GATHER_BYTES`] bytes are gathered (by this thread), when something waits for
    /// the inode's writes (`InodeQueue::all_sent`), or after [`GATHER_DELAY`] (the
    /// gather's thread). False: no slot, nothing queued, `answer` not called (the
    /// caller sends and waits). A failed send is kept for the handle's flush or fsync.
    pub fn gather(
        &self,
        limit: usize,
        ino: u64,
        start: u64,
        end: u64,
        answer: impl FnOnce(),
        write: GatheredWrite,
    ) -> bool {
        let gather = self
            .gather
            .as_ref()
            .expect("gather is called only when gathers() says so");
        debug_assert!(write.data.len() <= GATHER_WRITE_MAX);
        // A gathered write does not ask to be committed: the server commits once for
        // all of them at the close's FLUSH (sent behind them) instead of once per write,
        // and, not committing, answers it with the others (`Out::reply_as`). One sent
        // alone asks as the caller said (a small file's one write: its close then needs
        // no FLUSH).
        let asked = write.commit;
        let commit = |streaming: bool| asked && !streaming;
        let Some((q, id, streaming)) = self.enqueue(limit, ino, write.fh, start, end, commit)
        else {
            return false;
        };
        let mut write = write;
        write.commit = commit(streaming);
        let mut unsent = Unsent {
            wb: self,
            q: &q,
            id,
            fh: write.fh,
            armed: true,
        };
        answer();
        unsent.armed = false;
        let e = Entry {
            q: q.clone(),
            id,
            start,
            write,
        };
        if !streaming {
            // The inode's first write in flight (a small file saved, say): its close
            // may follow at once and would wait for it, so it goes out now. Only
            // writes behind others of their inode are gathered.
            gather.send_now(e);
            return true;
        }
        gather.put(e);
        // Someone waits for this inode's writes and may have looked into the gather
        // before this one was put there: it is sent now.
        let waited = lock(&q.q).awaiting > 0;
        if waited {
            gather.flush();
        }
        true
    }

    /// Send a write of `start..end` of `ino` with `send` and keep its ticket: first the
    /// writes in flight that overlap it are waited for, and a slot is taken (collecting
    /// this inode's oldest write when every slot is held). Ok(false): no slot, nothing
    /// sent (the caller sends and waits itself).
    ///
    /// `commit`: the write asks to be committed before its reply.
    ///
    /// `answer`, when given, is called once the slot is taken and before `send`: the
    /// writer is told "written" while the bytes leave. A failed `send` is then kept
    /// for the handle's flush or fsync like a failed reply (Ok(true)); without
    /// `answer` it is returned. The write is queued (as being sent) before the answer
    /// and `send` runs without the queue's lock: the writer's next write of the inode
    /// need not wait for this one's trip through the socket, and whatever must see this
    /// write (a flush, an overlapping read or write) finds it queued and waits for its
    /// send first (`InodeQueue::all_sent`).
    #[allow(clippy::too_many_arguments)]
    pub fn send(
        &self,
        limit: usize,
        ino: u64,
        fh: u64,
        start: u64,
        end: u64,
        commit: bool,
        answer: Option<impl FnOnce()>,
        send: impl FnOnce() -> Result<Ticket>,
    ) -> Result<bool> {
        let Some((q, id, _)) = self.enqueue(limit, ino, fh, start, end, |_| commit) else {
            return Ok(false);
        };
        let mut unsent = Unsent {
            wb: self,
            q: &q,
            id,
            fh,
            armed: true,
        };
        let answered = answer.is_some();
        if let Some(answer) = answer {
            answer();
        }
        let sent = send();
        unsent.armed = false;
        hand_over(&self.held, &q, id, fh, start..end, sent, answered).map(|()| true)
    }

    /// Whether `ino` was written here since its last handle here was closed (its
    /// writes may be in flight, or landed after a reply another request carried).
    pub fn tracks(&self, ino: u64) -> bool {
        lock(&self.inodes).contains_key(&ino)
    }

    /// Wait for `ino`'s writes that overlap `start..end` (a read of that range).
    pub fn settle_range(&self, ino: u64, start: u64, end: u64) {
        if let Some(q) = self.queue_of(ino) {
            let mut g = q.lock_sent();
            wait_overlapping(self, &mut g, start, end);
        }
    }

    /// Wait for every write of `ino`, and give back (and forget) the first error kept
    /// for the handles `report` names.
    pub fn settle(&self, ino: u64, report: Report) -> Result<()> {
        let Some(q) = self.queue_of(ino) else {
            return Ok(());
        };
        let mut g = q.lock_sent();
        while collect_front(self, &mut g) {}
        reported(&mut g, report)
    }

    /// When every write of `ino` in flight asked to be committed: `settle`, then,
    /// with the queue still locked (no write of `ino` sent between), hand `take` the
    /// count of writes per handle whose replies said they were committed since it was
    /// last called. None (nothing waited for): `ino` has no queue here, or a write in
    /// flight did not ask (a FLUSH is needed; `settle_behind` sends it behind them).
    pub fn settle_taking_commits<T>(
        &self,
        ino: u64,
        report: Report,
        take: impl FnOnce(&HashMap<u64, u64>) -> T,
    ) -> Option<(Result<()>, T)> {
        let q = self.queue_of(ino)?;
        let mut g = q.lock_sent();
        if !g.inflight.iter().all(|p| p.commit) {
            return None;
        }
        while collect_front(self, &mut g) {}
        let settled = reported(&mut g, report);
        let commits = std::mem::take(&mut g.committed);
        Some((settled, take(&commits)))
    }

    /// A flush or fsync through `fh` succeeded: `covered` runs with `ino`'s queue locked
    /// (no write of it sent or collected meanwhile), told whether a write through `fh`
    /// is still in flight, and says whether every write begun through `fh` is made
    /// durable (its `uncommitted` then 0). If so, the counts of committed replies kept
    /// for `fh` are dropped: they are of writes that flush covered, and taken later
    /// they would cancel a later change's count (a close then skipping its FLUSH).
    pub fn covered<T>(&self, ino: u64, fh: u64, covered: impl FnOnce(bool) -> (bool, T)) -> T {
        let Some(q) = self.queue_of(ino) else {
            return covered(false).1;
        };
        let mut g = q.lock_sent();
        let in_flight = g.inflight.iter().any(|p| p.fh == fh);
        let (all, t) = covered(in_flight);
        if all {
            g.committed.remove(&fh);
        }
        t
    }

    /// `send` a request behind the writes of `ino` in flight, then `settle` as asked.
    /// The writes that went out on another connection than the newest one are waited
    /// for first (being older, they are mostly answered by then); `send` then gets the
    /// newest one's ticket, to send on that connection, whose requests the server runs
    /// in order: the request runs after every write of `ino`. A close's FLUSH so costs
    /// one round trip instead of two (the writes' replies, then the flush's). `send`
    /// runs with the inode's queue locked: no write of `ino` is sent between it and the
    /// settle. None (nothing sent, nothing waited for): no write of `ino` in flight.
    pub fn settle_behind<T>(
        &self,
        ino: u64,
        report: Report,
        send: impl FnOnce(&Ticket) -> T,
    ) -> Option<(Result<()>, T)> {
        let q = self.queue_of(ino)?;
        let mut g = q.lock_sent();
        // The newest is never collected here: the loop ends when all are on its
        // connection, which it is.
        while let Some(newest) = g.inflight.back() {
            let on = |p: &Pending| match (&p.ticket, &newest.ticket) {
                (Some(a), Some(b)) => a.same_connection(b),
                _ => unreachable!("every write is sent while the queue is held so"),
            };
            if g.inflight.iter().all(on) {
                break;
            }
            collect_front(self, &mut g);
        }
        let newest = g.inflight.back()?.ticket.as_ref();
        let sent = send(newest.expect("every write is sent while the queue is held so"));
        while collect_front(self, &mut g) {}
        Some((reported(&mut g, report), sent))
    }

    /// Handle `fh` of `ino` is closed: an error kept for it has no one left to report
    /// it to (its flush did not): logged.
    pub fn closed_handle(&self, ino: u64, fh: u64) {
        if let Some(q) = self.queue_of(ino) {
            if let Some((e, false)) = lock(&q.q).errors.remove(&fh) {
                tracing::warn!(
                    ino,
                    fh,
                    "a write-behind error no flush reported: {}",
                    e.msg()
                );
            }
        }
    }

    /// `settle` for every inode (sync_all): the first error.
    pub fn settle_all(&self) -> Result<()> {
        let inos: Vec<u64> = lock(&self.inodes).keys().copied().collect();
        let mut first = Ok(());
        for ino in inos {
            let r = self.settle(ino, Report::All);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// The inode has no open handle left here: wait for its writes and drop its queue
    /// (an error not reported by now has no one left to report it to; it is logged).
    pub fn retire(&self, ino: u64) {
        if let Err(e) = self.settle(ino, Report::All) {
            tracing::warn!(ino, "a write-behind error no flush reported: {}", e.msg());
        }
        let mut m = lock(&self.inodes);
        if let Some(q) = m.get(&ino) {
            // Only when no one else holds it (a writer through a handle opened since).
            if Arc::strong_count(q) == 1 && lock(&q.q).inflight.is_empty() {
                m.remove(&ino);
            }
        }
    }

    /// Replies held now (tests).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// A write queued as being sent (write `id` of `q`, through `fh`, of `range`) went out
/// (`sent` is its ticket) or did not: the ticket goes to its queue, or the write leaves
/// the queue and its slot is given back. The error of an answered write (`keep_error`)
/// is kept for the handle's flush or fsync, a lost connection's as EIO; else it is
/// returned. Whoever waits for the queue's sends is woken.
fn hand_over(
    held: &AtomicUsize,
    q: &InodeQueue,
    id: u64,
    fh: u64,
    range: std::ops::Range<u64>,
    sent: Result<Ticket>,
    keep_error: bool,
) -> Result<()> {
    let mut g = lock(&q.q);
    g.sending -= 1;
    let at = g
        .inflight
        .iter()
        .position(|p| p.id == id)
        .expect("a write being sent stays queued: collecting waits for sends");
    let r = match sent {
        Ok(ticket) => {
            g.inflight[at].ticket = Some(ticket);
            Ok(())
        }
        Err(e) => {
            g.inflight.remove(at);
            held.fetch_sub(1, Ordering::AcqRel);
            if keep_error {
                let e = if crate::is_transport(&e) {
                    Error::new(
                        libc::EIO,
                        format!(
                            "a write of {} bytes at offset {} could not be sent: {}",
                            range.end - range.start,
                            range.start,
                            e.msg()
                        ),
                    )
                } else {
                    e
                };
                g.errors.entry(fh).or_insert((e, false));
                Ok(())
            } else {
                Err(e)
            }
        }
    };
    q.sent_one(&g);
    r
}

/// The first error kept for the handles `report` names (see `Report`).
fn reported(g: &mut Queue, report: Report) -> Result<()> {
    let e = match report {
        Report::Keep => None,
        Report::Handle(fh) => g.errors.get_mut(&fh).map(|(e, reported)| {
            *reported = true;
            e.clone()
        }),
        Report::Fsync(fh) => g
            .errors
            .remove(&fh)
            .map(|(e, _)| e)
            .or_else(|| g.errors.values().next().map(|(e, _)| e.clone())),
        Report::All => {
            let mut all: Vec<(u64, (Error, bool))> = g.errors.drain().collect();
            all.sort_by_key(|(fh, _)| *fh);
            all.into_iter().next().map(|(_, (e, _))| e)
        }
    };
    e.map_or(Ok(()), Err)
}

/// Collect the oldest write of the queue: false if it has none.
/// The caller holds the queue with every write in it sent (`InodeQueue::all_sent`).
fn collect_front(wb: &WriteBehind, q: &mut Queue) -> bool {
    let Some(p) = q.inflight.pop_front() else {
        return false;
    };
    let want = p.end - p.start;
    let ticket = p
        .ticket
        .expect("collected only while every write of the queue is sent");
    let r = ticket.wait().and_then(|resp| {
        let reply = <WriteReq as Operation>::Reply::decode(&resp.body)
            .map_err(|e| Error::new(libc::EIO, format!("malformed write reply: {e}")))?;
        if u64::from(reply.written) == want && reply.committed {
            *q.committed.entry(p.fh).or_default() += 1;
        }
        if u64::from(reply.written) != want {
            return Err(Error::new(
                libc::ENOSPC,
                format!(
                    "the server wrote {} of {want} bytes at offset {} (write-behind)",
                    reply.written, p.start
                ),
            ));
        }
        Ok(())
    });
    wb.held.fetch_sub(1, Ordering::AcqRel);
    if let Err(e) = r {
        let e = if crate::is_transport(&e) {
            Error::new(
                libc::EIO,
                format!(
                    "a write of {want} bytes at offset {} was lost with its connection: {}",
                    p.start,
                    e.msg()
                ),
            )
        } else {
            e
        };
        q.errors.entry(p.fh).or_insert((e, false));
    }
    true
}

/// Collect writes in order up to the last one overlapping `start..end`.
fn wait_overlapping(wb: &WriteBehind, q: &mut Queue, start: u64, end: u64) {
    if let Some(last) = q
        .inflight
        .iter()
        .rposition(|p| p.start < end && start < p.end)
    {
        for _ in 0..=last {
            collect_front(wb, q);
        }
    }
}

/// A small write waiting in the gather: everything its request needs, its bytes copied
/// out of the writer's buffer (which is answered and reused before the send).
pub(super) struct GatheredWrite {
    /// The handle it is written through (the server's is looked up as it is sent:
    /// a restart in between re-opens the file under a new one).
    pub fh: u64,
    pub node: NodeRef,
    pub offset: u64,
    pub commit: bool,
    pub cred: Cred,
    pub groups: Vec<u32>,
    pub data: Vec<u8>,
}

/// Sends a gather's writes in one batch (the mount: `RemoteFs`'s client).
pub(super) trait GatherSink: Send + Sync {
    /// Send `writes` in order: per write, its reply's ticket or why it was not sent.
    /// `gathered`: they come from the gather (else one write sent alone), for the
    /// counters.
    fn send_batch(&self, writes: &[&GatheredWrite], gathered: bool) -> Vec<Result<Ticket>>;
}

/// One gathered write and the queue that holds it as being sent.
struct Entry {
    q: Arc<InodeQueue>,
    id: u64,
    start: u64,
    write: GatheredWrite,
}

#[derive(Default)]
struct GatherBuf {
    entries: Vec<Entry>,
    bytes: usize,
    /// When the oldest entry was put here.
    since: Option<Instant>,
    stop: bool,
}

/// Small buffered writes of every inode of a mount, answered and waiting to go out
/// together: one vectored send, one wake-up of the server, one trip through the
/// network stack for up to [`GATHER_WRITES`] writes. The writes stay queued in their
/// inodes' queues as being sent, so whatever must see them (a flush, fsync, getattr,
/// an overlapping read or write) sends the gather first (`InodeQueue::all_sent`).
/// They go out in the order they were answered, on one connection, which the server
/// runs in order.
pub(super) struct Gather {
    buf: Mutex<GatherBuf>,
    /// The thread that sends a gather that waited `GATHER_DELAY`.
    wake: Condvar,
    sink: Arc<dyn GatherSink>,
    held: Arc<AtomicUsize>,
}

impl Gather {
    /// Put a write in; send the gather now if it is full.
    fn put(&self, e: Entry) {
        let full = {
            let mut b = lock(&self.buf);
            b.bytes += e.write.data.len();
            b.entries.push(e);
            if b.since.is_none() {
                b.since = Some(Instant::now());
                self.wake.notify_one();
            }
            b.entries.len() >= GATHER_WRITES || b.bytes >= GATHER_BYTES
        };
        if full {
            self.flush();
        }
    }

    /// Send what is gathered now (nothing: no-op). Each write's ticket, or its
    /// error, is handed to its queue as `WriteBehind::send` does.
    pub(super) fn flush(&self) {
        let batch = {
            let mut b = lock(&self.buf);
            b.bytes = 0;
            b.since = None;
            std::mem::take(&mut b.entries)
        };
        if batch.is_empty() {
            return;
        }
        let writes: Vec<&GatheredWrite> = batch.iter().map(|e| &e.write).collect();
        let mut sent = self.sink.send_batch(&writes, true);
        assert_eq!(sent.len(), batch.len(), "a ticket or an error per write");
        for (e, r) in batch.into_iter().zip(sent.drain(..)) {
            self.finish(e, r);
        }
    }

    /// Send one write alone, now (as `flush` sends a gather).
    fn send_now(&self, e: Entry) {
        let mut sent = self.sink.send_batch(&[&e.write], false);
        let r = sent.pop().expect("a ticket or an error per write");
        self.finish(e, r);
    }

    /// Hand a sent write's ticket (or the error that kept it from going out) to its
    /// queue, as the tail of `WriteBehind::send` does for a write answered early.
    fn finish(&self, e: Entry, sent: Result<Ticket>) {
        let range = e.start..e.start + e.write.data.len() as u64;
        let kept = hand_over(&self.held, &e.q, e.id, e.write.fh, range, sent, true);
        debug_assert!(
            kept.is_ok(),
            "an answered write's error is kept, not returned"
        );
    }

    /// The gather's thread: sends a gather once its oldest write has waited
    /// `GATHER_DELAY` (a full one is sent by the writer that filled it).
    fn run(&self) {
        loop {
            let mut b = lock(&self.buf);
            loop {
                if b.stop {
                    return;
                }
                match b.since {
                    None => b = self.wake.wait(b).unwrap_or_else(|e| e.into_inner()),
                    Some(t) => {
                        let due = t + GATHER_DELAY;
                        let now = Instant::now();
                        if now >= due {
                            break;
                        }
                        b = self
                            .wake
                            .wait_timeout(b, due - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                    }
                }
            }
            drop(b);
            self.flush();
        }
    }
}

impl Drop for WriteBehind {
    /// The gather's thread ends; what it still holds goes out now.
    fn drop(&mut self) {
        if let Some(g) = &self.gather {
            lock(&g.buf).stop = true;
            g.wake.notify_all();
            g.flush();
        }
    }
}
