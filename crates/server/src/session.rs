//! Sessions: what the server holds for one client across its connections.
//!
//! A session is named by the random id in the client's Hello; every connection with
//! that id shares it. It owns the client's open handles (server fh -> inode, backend
//! fh, flags) and the inode references the server took for it (every entry it sent).
//! When its last connection ends it waits out the grace period: a connection with the
//! same id resumes it; otherwise the reaper gives every handle and reference back to
//! the backend. Locks here are held for table updates only, never across socket I/O or
//! a backend call, and a panic elsewhere never poisons them for the others (`lock`).
//!
//! A session also keeps the replies it sent (the **reply cache**, as NFSv4.1's session
//! slots do): every request with session side effects (`Op::cached`: everything but
//! read, write, lseek, ping and stats) is remembered by its request id, unique within
//! a client's session, with its encoded reply. A client that lost a connection resends
//! such a request with the same id on another connection; the server answers from the
//! cache without executing it again (or, while the first is still running, waits for it
//! and answers with its reply). So a create whose reply was lost leaves no unknown
//! handle behind, and a release or forget lost on the way is applied exactly once. The
//! cache is bounded per session by `REPLY_CACHE_ENTRIES` and `REPLY_CACHE_BYTES`,
//! oldest evicted first; a request resent after its reply was evicted executes again.

use crate::ServerStats;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, Error};
use zcfs_protocol::Op;

mod lanes;
pub(crate) use lanes::{Fence, Lanes};

/// Most replies one session's reply cache keeps (oldest evicted first). A client
/// resends what it had in flight on a lost connection (by default 2 connections of 64
/// requests), right after reconnecting: this leaves room for eight times that.
pub const REPLY_CACHE_ENTRIES: usize = 1024;
/// Most bytes (reply headers and bodies) one session's reply cache keeps. Every reply
/// body fits (`MAX_BODY` is 256 KiB), so 16 of the largest are kept.
pub const REPLY_CACHE_BYTES: usize = 4 << 20;

/// Lock a mutex of the session tables, whether or not a panicking thread held it: they
/// are changed in small steps that leave them consistent, so one panicking request
/// must not take every other client's session down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An open handle of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Handle {
    pub ino: u64,
    /// Generation the inode had when opened (0 = not known).
    pub gen: u64,
    /// The backend's own handle.
    pub backend_fh: u64,
    pub flags: i32,
}

/// What a request does through a handle: checked against the flags it was opened with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// read
    Read,
    /// write, fallocate
    Write,
    /// flush, fsync, release: any open handle
    Any,
}

impl Handle {
    /// Whether the handle was opened for `a` (O_RDONLY reads, O_WRONLY writes, O_RDWR
    /// both; the fourth access mode, 3, neither).
    pub fn allows(&self, a: Access) -> bool {
        let mode = self.flags & libc::O_ACCMODE;
        match a {
            Access::Read => mode == libc::O_RDONLY || mode == libc::O_RDWR,
            Access::Write => mode == libc::O_WRONLY || mode == libc::O_RDWR,
            Access::Any => true,
        }
    }
}

/// The replies a session sent for requests with side effects, by request id.
#[derive(Default)]
struct ReplyCache {
    done: HashMap<u64, (Op, Arc<[u8]>)>,
    /// Ids in `done`, oldest first.
    order: VecDeque<u64>,
    /// Bytes in `done`.
    bytes: usize,
    /// Ids being executed now (their replies are not known yet).
    running: HashSet<u64>,
}

impl ReplyCache {
    fn remove(&mut self, id: u64) {
        if let Some((_, r)) = self.done.remove(&id) {
            self.bytes -= r.len();
            // Rare (an id reused for another operation): a linear search is fine.
            if let Some(i) = self.order.iter().position(|&x| x == id) {
                self.order.remove(i);
            }
        }
    }

    fn insert(&mut self, id: u64, op: Op, reply: Arc<[u8]>, max_entries: usize, max_bytes: usize) {
        self.remove(id);
        if reply.len() > max_bytes || max_entries == 0 {
            return;
        }
        while self.order.len() >= max_entries || self.bytes + reply.len() > max_bytes {
            let old = self
                .order
                .pop_front()
                .expect("bytes are held by some entry");
            let (_, r) = self.done.remove(&old).expect("order and done agree");
            self.bytes -= r.len();
        }
        self.bytes += reply.len();
        self.order.push_back(id);
        self.done.insert(id, (op, reply));
    }
}

/// What to do with a request whose reply is cached (see `Session::begin`).
pub(crate) enum Begin<'a> {
    /// Executed before: send this reply again.
    Replay(Arc<[u8]>),
    /// New: execute it, and give its reply to the claim.
    Run(Claim<'a>),
}

/// A request of a session being executed; its reply goes into the cache with `finish`.
/// Dropped unfinished (a panic), it stops being "running", so a resend executes.
pub(crate) struct Claim<'a> {
    session: &'a Session,
    id: u64,
    op: Op,
    done: bool,
}

impl Claim<'_> {
    /// The encoded reply (header and body): kept for resends of the same id.
    pub fn finish(mut self, reply: Arc<[u8]>) {
        self.done = true;
        let s = self.session;
        let mut c = lock(&s.replies);
        c.running.remove(&self.id);
        c.insert(self.id, self.op, reply, s.max_replies, s.max_reply_bytes);
        drop(c);
        s.replied.notify_all();
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.done {
            lock(&self.session.replies).running.remove(&self.id);
            self.session.replied.notify_all();
        }
    }
}

#[derive(Default)]
struct SessionState {
    connections: usize,
    /// When the last connection ended; None while connected.
    idle_since: Option<Instant>,
    handles: HashMap<u64, Handle>,
    /// Handles are numbered per session, from 1 (0 means "no handle" on the wire).
    last_fh: u64,
    /// Inode -> references held for this session (never 0: entries are removed).
    refs: HashMap<u64, u64>,
    /// Inodes with no link left that this session holds by reference alone (no open
    /// handle of it): orphans only its FORGET frees. At most `max_handles` of them
    /// (`Session::orphaned`). A subset of `refs`' keys.
    orphans: std::collections::HashSet<u64>,
    /// Inode -> opens under way (the backend opening it, the handle not added yet): held
    /// as a handle is, so no orphan decision gives its references back meanwhile.
    opening: HashMap<u64, u32>,
}

impl SessionState {
    fn holds_nothing(&self) -> bool {
        self.handles.is_empty() && self.refs.is_empty()
    }
}

pub(crate) struct Session {
    pub id: u64,
    /// Which start of session `id` in this process this is (from 1, never reused): the
    /// handshake tells the client, which revalidates when it changes, even if a
    /// connection it never heard back from started this one (`Welcome::session_serial`).
    pub serial: u64,
    max_handles: usize,
    state: Mutex<SessionState>,
    replies: Mutex<ReplyCache>,
    /// Signalled when a running request's reply is known.
    replied: Condvar,
    max_replies: usize,
    max_reply_bytes: usize,
    /// The client's current connection on each of its lanes.
    pub lanes: Arc<Lanes>,
}

/// An open under way (`Session::opening`).
pub(crate) struct Opening<'a> {
    session: &'a Session,
    ino: u64,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.session.state);
        if let Some(n) = st.opening.get_mut(&self.ino) {
            *n -= 1;
            if *n == 0 {
                st.opening.remove(&self.ino);
            }
        }
    }
}

fn ebadf(fh: u64) -> Error {
    Error::new(
        libc::EBADF,
        format!("handle {fh} is not an open handle of this client for this inode"),
    )
}

impl Session {
    fn new(id: u64, serial: u64, max_handles: usize, limits: ReplyLimits) -> Session {
        Session {
            id,
            serial,
            max_handles,
            state: Mutex::new(SessionState::default()),
            replies: Mutex::new(ReplyCache::default()),
            replied: Condvar::new(),
            max_replies: limits.entries,
            max_reply_bytes: limits.bytes,
            lanes: Arc::default(),
        }
    }

    /// A request with session side effects (`Op::cached`) arrived: answer it from the
    /// reply cache if this id was executed before (with this operation), wait for it if
    /// it is executing now (a resend that overtook the first attempt), or claim it.
    /// (Tests: the server's requests wait with a deadline, `begin_until`.)
    #[cfg(test)]
    pub fn begin(&self, id: u64, op: Op) -> Begin<'_> {
        loop {
            if let Some(b) = self.begin_until(id, op, Instant::now() + Duration::from_secs(1)) {
                return b;
            }
        }
    }

    /// `begin`, waiting for a running attempt no longer than `until`: None if it is
    /// still running then (`until` now or past: do not wait).
    pub fn begin_until(&self, id: u64, op: Op, until: Instant) -> Option<Begin<'_>> {
        let mut c = lock(&self.replies);
        loop {
            if let Some((was, reply)) = c.done.get(&id) {
                if *was == op {
                    return Some(Begin::Replay(reply.clone()));
                }
                // The id named another operation (a client breaking the rule that
                // ids are unique): this one is new.
                c.remove(id);
            }
            if !c.running.contains(&id) {
                break;
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            c = self
                .replied
                .wait_timeout(c, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        c.running.insert(id);
        Some(Begin::Run(Claim {
            session: self,
            id,
            op,
            done: false,
        }))
    }

    /// Replies cached (tests and stats): count, bytes.
    pub fn cached_replies(&self) -> (usize, usize) {
        let c = lock(&self.replies);
        (c.done.len(), c.bytes)
    }

    /// One more reference held for the client to `ino`.
    pub fn add_ref(&self, ino: u64) {
        let mut st = lock(&self.state);
        let n = st.refs.entry(ino).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// Take up to `n` references to `ino` back (never more than the session holds);
    /// returns how many to give back to the backend.
    pub fn take_refs(&self, ino: u64, n: u64) -> u64 {
        let mut st = lock(&self.state);
        let Some(have) = st.refs.get_mut(&ino) else {
            return 0;
        };
        let taken = n.min(*have);
        *have -= taken;
        if *have == 0 {
            st.refs.remove(&ino);
            st.orphans.remove(&ino);
        }
        taken
    }

    /// `ino` may have been left with no link (its last name removed, or the last
    /// handle of an unlinked or O_TMPFILE file released). If this session holds it by
    /// reference alone and `no_link()` (asked under the session's lock) says it has no
    /// link, it is one of the session's orphans: space that only its FORGET gives back,
    /// seen in no directory. A session may hold at most `max_handles` of them (the
    /// bound on what it may hold open): past that, its references to `ino` are given
    /// up here and handed to `give_back` (for the backend), still under the lock, so an
    /// open of `ino` by this session comes wholly before (then it is not an orphan) or
    /// after (then the inode may be gone: ESTALE, as for any inode not held). The
    /// client's own FORGET later takes nothing (`take_refs`). A kernel client forgets
    /// an unlinked inode as soon as no one uses it, so only a client that holds many
    /// such at once (or never forgets) meets the bound. Whether it gave them up.
    pub fn orphaned(
        &self,
        ino: u64,
        no_link: impl FnOnce() -> bool,
        give_back: impl FnOnce(u64),
    ) -> bool {
        let mut st = lock(&self.state);
        if !st.refs.contains_key(&ino) || st.opening.contains_key(&ino) {
            return false;
        }
        // Linked (mostly: every release of a file with a name comes here), or a link
        // made since by this session's Link, which runs beside this on another
        // connection: no orphan. Asked before the scan of the handles, the dearer look
        // for a session with many open.
        if !no_link() {
            st.orphans.remove(&ino);
            return false;
        }
        if st.handles.values().any(|h| h.ino == ino) {
            return false;
        }
        st.orphans.insert(ino);
        if st.orphans.len() <= self.max_handles {
            return false;
        }
        st.orphans.remove(&ino);
        let n = st.refs.remove(&ino).expect("checked above");
        give_back(n);
        true
    }

    /// An open of `ino` by this session is under way until the guard drops (after
    /// `add_handle`, or the open failed): `orphaned` leaves `ino` alone meanwhile.
    pub fn opening(&self, ino: u64) -> Opening<'_> {
        *lock(&self.state).opening.entry(ino).or_insert(0) += 1;
        Opening { session: self, ino }
    }

    /// `ino` has a name again (linked, e.g. an O_TMPFILE file by linkat): no orphan.
    pub fn linked(&self, ino: u64) {
        lock(&self.state).orphans.remove(&ino);
    }

    /// Orphans the session holds by reference alone (tests).
    #[cfg(test)]
    pub fn orphans(&self) -> usize {
        lock(&self.state).orphans.len()
    }

    /// Whether this session holds `ino`: a reference (an entry it was given) or an
    /// open handle. Only such a session may name an inode that no directory names.
    pub fn holds(&self, ino: u64) -> bool {
        let st = lock(&self.state);
        st.refs.contains_key(&ino) || st.handles.values().any(|h| h.ino == ino)
    }

    /// References held for `ino` (tests and stats).
    #[cfg(test)]
    pub fn refs_of(&self, ino: u64) -> u64 {
        lock(&self.state).refs.get(&ino).copied().unwrap_or(0)
    }

    /// Whether another handle fits (checked before asking the backend to open).
    pub fn has_room(&self) -> Result<(), Error> {
        if lock(&self.state).handles.len() >= self.max_handles {
            return Err(self.too_many());
        }
        Ok(())
    }

    fn too_many(&self) -> Error {
        Error::new(
            libc::EMFILE,
            format!(
                "this client has {} handles open, the most a session may",
                self.max_handles
            ),
        )
    }

    /// Register an open handle; returns the fh the client will name it by.
    pub fn add_handle(&self, h: Handle) -> Result<u64, Error> {
        let mut st = lock(&self.state);
        if st.handles.len() >= self.max_handles {
            return Err(self.too_many());
        }
        st.last_fh += 1;
        let fh = st.last_fh;
        // Held by a handle now: no orphan while it is open (counted again at its
        // release if it still has no link).
        st.orphans.remove(&h.ino);
        st.handles.insert(fh, h);
        Ok(fh)
    }

    /// The handle `fh` of this session, if it is open for `ino` and for `access`.
    pub fn handle(&self, fh: u64, ino: u64, access: Access) -> Result<Handle, Error> {
        match lock(&self.state).handles.get(&fh) {
            Some(h) if h.ino == ino && h.allows(access) => Ok(*h),
            Some(h) if h.ino == ino => Err(Error::new(
                libc::EBADF,
                format!(
                    "handle {fh} was opened with flags {:#o}, not for {}",
                    h.flags,
                    match access {
                        Access::Read => "reading",
                        _ => "writing",
                    }
                ),
            )),
            _ => Err(ebadf(fh)),
        }
    }

    /// Remove the handle `fh` (open for `ino`) from the session, to release it.
    pub fn take_handle(&self, fh: u64, ino: u64) -> Result<Handle, Error> {
        let mut st = lock(&self.state);
        match st.handles.get(&fh) {
            Some(h) if h.ino == ino => Ok(st.handles.remove(&fh).expect("present")),
            _ => Err(ebadf(fh)),
        }
    }

    fn drain(&self) -> (Vec<Handle>, Vec<(u64, u64)>) {
        let mut st = lock(&self.state);
        st.orphans.clear();
        (
            st.handles.drain().map(|(_, h)| h).collect(),
            st.refs.drain().collect(),
        )
    }
}

/// Totals over every session, for the stats report.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SessionCounts {
    pub active: usize,
    pub in_grace: usize,
    pub handles: u64,
    pub references: u64,
    /// Replies kept in reply caches, and their bytes.
    pub replies_cached: u64,
    pub reply_cache_bytes: u64,
}

/// Bounds of each session's reply cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyLimits {
    pub entries: usize,
    pub bytes: usize,
}

impl Default for ReplyLimits {
    fn default() -> Self {
        ReplyLimits {
            entries: REPLY_CACHE_ENTRIES,
            bytes: REPLY_CACHE_BYTES,
        }
    }
}

/// A connection's place in a session, from `Sessions::attach`; given back with
/// `detach` (the connection ended) or `abandon` (its handshake failed after all).
pub(crate) struct Attachment {
    pub session: Arc<Session>,
    pub resumed: bool,
    /// When the session went idle before this connection came (to restore it if the
    /// handshake fails: a failed handshake does not restart the grace period).
    idle_since: Option<Instant>,
}

/// The session table and its reaper.
pub(crate) struct Sessions {
    map: Mutex<SessionMap>,
    /// Wakes the reaper: a session went idle, or the server stops.
    wake: Condvar,
    grace: Duration,
    max_handles: usize,
    limits: ReplyLimits,
    /// Most sessions waiting out their grace period at once: beyond it the one idle
    /// longest expires at once, so peers that come and go with fresh session ids cannot
    /// pile up handles and cached replies.
    max_in_grace: usize,
}

#[derive(Default)]
struct SessionMap {
    sessions: HashMap<u64, Arc<Session>>,
    /// Sessions expired early (over `max_in_grace`), for the reaper to release.
    evicted: Vec<Arc<Session>>,
    stopping: bool,
    /// Sessions started so far: the last one's serial.
    serials: u64,
}

impl Sessions {
    pub fn new(grace: Duration, max_handles: usize) -> Sessions {
        Sessions::with_limits(grace, max_handles, ReplyLimits::default())
    }

    pub fn with_limits(grace: Duration, max_handles: usize, limits: ReplyLimits) -> Sessions {
        Sessions {
            map: Mutex::new(SessionMap::default()),
            wake: Condvar::new(),
            grace,
            max_handles,
            limits,
            max_in_grace: DEFAULT_MAX_SESSIONS_IN_GRACE,
        }
    }

    /// At most `n` (at least 1) sessions wait out their grace period at once.
    pub fn with_max_in_grace(mut self, n: usize) -> Sessions {
        self.max_in_grace = n.max(1);
        self
    }

    /// Over `max_in_grace` idle sessions: expire those idle longest now (out of the
    /// table at once, released by the reaper).
    fn evict_over_limit(&self, m: &mut SessionMap) {
        loop {
            let idle: Vec<(Instant, u64)> = m
                .sessions
                .values()
                .filter_map(|s| {
                    let st = lock(&s.state);
                    match st.idle_since {
                        Some(t) if st.connections == 0 => Some((t, s.id)),
                        _ => None,
                    }
                })
                .collect();
            if idle.len() <= self.max_in_grace {
                return;
            }
            let (_, oldest) = idle.into_iter().min().expect("over the limit");
            let s = m.sessions.remove(&oldest).expect("listed");
            tracing::info!(
                session = format!("{oldest:016x}"),
                limit = self.max_in_grace,
                "session expired early: too many sessions in their grace period"
            );
            m.evicted.push(s);
        }
    }

    /// An authenticated connection (or any, when the server has no secret) with
    /// session id `id`: join the session, or start one.
    pub fn attach(&self, id: u64) -> Attachment {
        let mut m = lock(&self.map);
        if let Some(s) = m.sessions.get(&id) {
            let s = s.clone();
            let mut st = lock(&s.state);
            st.connections += 1;
            let idle_since = st.idle_since.take();
            drop(st);
            return Attachment {
                session: s,
                resumed: true,
                idle_since,
            };
        }
        m.serials += 1;
        let s = Arc::new(Session::new(id, m.serials, self.max_handles, self.limits));
        lock(&s.state).connections = 1;
        m.sessions.insert(id, s.clone());
        Attachment {
            session: s,
            resumed: false,
            idle_since: None,
        }
    }

    /// A connection ended: the last one of its session starts the grace period.
    pub fn detach(&self, a: Attachment) {
        let mut m = lock(&self.map);
        let mut st = lock(&a.session.state);
        st.connections -= 1;
        if st.connections > 0 {
            return;
        }
        st.idle_since = Some(Instant::now());
        drop(st);
        self.evict_over_limit(&mut m);
        drop(m);
        self.wake.notify_all();
    }

    /// A connection's handshake failed after it attached (the peer went away before the
    /// last message reached it): the session is as if it had never come. A session it
    /// started is forgotten; one in grace keeps its deadline.
    pub fn abandon(&self, a: Attachment) {
        let mut m = lock(&self.map);
        let s = &a.session;
        let mut st = lock(&s.state);
        st.connections -= 1;
        if st.connections > 0 {
            return;
        }
        if !a.resumed && st.holds_nothing() {
            drop(st);
            if m.sessions.get(&s.id).is_some_and(|x| Arc::ptr_eq(x, s)) {
                m.sessions.remove(&s.id);
            }
            return;
        }
        // Connections that ended while this one was counted did not start the grace
        // period: it starts now.
        st.idle_since = Some(a.idle_since.unwrap_or_else(Instant::now));
        drop(st);
        self.evict_over_limit(&mut m);
        drop(m);
        self.wake.notify_all();
    }

    /// Every session now (those in their grace period too).
    pub fn all(&self) -> Vec<Arc<Session>> {
        lock(&self.map).sessions.values().cloned().collect()
    }

    pub fn counts(&self) -> SessionCounts {
        let m = lock(&self.map);
        let mut c = SessionCounts::default();
        for s in m.sessions.values() {
            let st = lock(&s.state);
            if st.connections > 0 {
                c.active += 1;
            } else {
                c.in_grace += 1;
            }
            c.handles += st.handles.len() as u64;
            c.references += st.refs.values().sum::<u64>();
            drop(st);
            let (n, bytes) = s.cached_replies();
            c.replies_cached += n as u64;
            c.reply_cache_bytes += bytes as u64;
        }
        c
    }

    /// The reaper: until `stop`, release each session whose grace period ran out.
    pub fn reap(&self, backend: &dyn Backend, stats: &ServerStats) {
        let mut m = lock(&self.map);
        while !m.stopping {
            let now = Instant::now();
            let mut expired = std::mem::take(&mut m.evicted);
            let mut next: Option<Instant> = None;
            m.sessions.retain(|_, s| {
                let st = lock(&s.state);
                match st.idle_since {
                    Some(t) if st.connections == 0 => {
                        let deadline = t + self.grace;
                        if deadline <= now {
                            expired.push(s.clone());
                            return false;
                        }
                        next = Some(next.map_or(deadline, |n| n.min(deadline)));
                        true
                    }
                    _ => true,
                }
            });
            if !expired.is_empty() {
                // Give everything back without the table locked.
                drop(m);
                for s in expired {
                    tracing::info!(session = format!("{:016x}", s.id), "session expired");
                    release(&s, backend, stats);
                }
                m = lock(&self.map);
                continue;
            }
            m = match next {
                Some(t) => {
                    self.wake
                        .wait_timeout(m, t.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.wake.wait(m).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }

    /// Stop the reaper and release every session (server shutdown, after every
    /// connection ended).
    pub fn stop(&self, backend: &dyn Backend, stats: &ServerStats) {
        let all: Vec<Arc<Session>> = {
            let mut m = lock(&self.map);
            m.stopping = true;
            let mut all: Vec<Arc<Session>> = std::mem::take(&mut m.evicted);
            all.extend(m.sessions.drain().map(|(_, s)| s));
            all
        };
        self.wake.notify_all();
        for s in all {
            release(&s, backend, stats);
        }
    }
}

/// Most sessions in their grace period at once, by default (the server sets it to its
/// connection limit).
pub const DEFAULT_MAX_SESSIONS_IN_GRACE: usize = 64;

/// Give a session's handles and references back to the backend.
fn release(s: &Session, backend: &dyn Backend, stats: &ServerStats) {
    let (handles, refs) = s.drain();
    for h in &handles {
        if let Err(e) = backend.release(h.ino, h.backend_fh) {
            tracing::warn!(ino = h.ino, "releasing an expired session's handle: {e}");
        }
    }
    let mut n = 0;
    for &(ino, count) in &refs {
        backend.forget(ino, count);
        n += count;
    }
    stats.sessions_expired.fetch_add(1, Ordering::Relaxed);
    stats
        .expired_handles
        .fetch_add(handles.len() as u64, Ordering::Relaxed);
    stats.expired_references.fetch_add(n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests;
