//! Sessions: what the server holds for one client across its connections.
//!
//! A session is named by the random id in the client's Hello; every connection with
//! that id shares it. It owns the client's open handles (server fh -> inode, backend
//! fh, flags) and the inode references the server took for it (every entry it sent).
//! When its last connection ends it waits out the grace period: a connection with the
//! same id resumes it; otherwise the reaper gives every handle and reference back to
//! the backend. Locks here are held for table updates only, never across socket I/O or
//! a backend call.

use crate::ServerStats;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::{Backend, Error};

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
}

impl SessionState {
    fn holds_nothing(&self) -> bool {
        self.handles.is_empty() && self.refs.is_empty()
    }
}

pub(crate) struct Session {
    pub id: u64,
    max_handles: usize,
    state: Mutex<SessionState>,
}

fn ebadf(fh: u64) -> Error {
    Error::new(
        libc::EBADF,
        format!("handle {fh} is not an open handle of this client for this inode"),
    )
}

impl Session {
    /// One more reference held for the client to `ino`.
    pub fn add_ref(&self, ino: u64) {
        let mut st = self.state.lock().unwrap();
        let n = st.refs.entry(ino).or_insert(0);
        *n = n.saturating_add(1);
    }

    /// Take up to `n` references to `ino` back (never more than the session holds);
    /// returns how many to give back to the backend.
    pub fn take_refs(&self, ino: u64, n: u64) -> u64 {
        let mut st = self.state.lock().unwrap();
        let Some(have) = st.refs.get_mut(&ino) else {
            return 0;
        };
        let taken = n.min(*have);
        *have -= taken;
        if *have == 0 {
            st.refs.remove(&ino);
        }
        taken
    }

    /// References held for `ino` (tests and stats).
    #[cfg(test)]
    pub fn refs_of(&self, ino: u64) -> u64 {
        self.state
            .lock()
            .unwrap()
            .refs
            .get(&ino)
            .copied()
            .unwrap_or(0)
    }

    /// Whether another handle fits (checked before asking the backend to open).
    pub fn has_room(&self) -> Result<(), Error> {
        if self.state.lock().unwrap().handles.len() >= self.max_handles {
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
        let mut st = self.state.lock().unwrap();
        if st.handles.len() >= self.max_handles {
            return Err(self.too_many());
        }
        st.last_fh += 1;
        let fh = st.last_fh;
        st.handles.insert(fh, h);
        Ok(fh)
    }

    /// The handle `fh` of this session, if it is open for `ino`.
    pub fn handle(&self, fh: u64, ino: u64) -> Result<Handle, Error> {
        match self.state.lock().unwrap().handles.get(&fh) {
            Some(h) if h.ino == ino => Ok(*h),
            _ => Err(ebadf(fh)),
        }
    }

    /// Remove the handle `fh` (open for `ino`) from the session, to release it.
    pub fn take_handle(&self, fh: u64, ino: u64) -> Result<Handle, Error> {
        let mut st = self.state.lock().unwrap();
        match st.handles.get(&fh) {
            Some(h) if h.ino == ino => Ok(st.handles.remove(&fh).expect("present")),
            _ => Err(ebadf(fh)),
        }
    }

    fn drain(&self) -> (Vec<Handle>, Vec<(u64, u64)>) {
        let mut st = self.state.lock().unwrap();
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
}

/// The session table and its reaper.
pub(crate) struct Sessions {
    map: Mutex<SessionMap>,
    /// Wakes the reaper: a session went idle, or the server stops.
    wake: Condvar,
    grace: Duration,
    max_handles: usize,
}

#[derive(Default)]
struct SessionMap {
    sessions: HashMap<u64, Arc<Session>>,
    stopping: bool,
}

impl Sessions {
    pub fn new(grace: Duration, max_handles: usize) -> Sessions {
        Sessions {
            map: Mutex::new(SessionMap::default()),
            wake: Condvar::new(),
            grace,
            max_handles,
        }
    }

    /// A connection with session id `id` arrived: join the session, or start one.
    /// Returns the session and whether it already existed (resumed).
    pub fn attach(&self, id: u64) -> (Arc<Session>, bool) {
        let mut m = self.map.lock().unwrap();
        if let Some(s) = m.sessions.get(&id) {
            let s = s.clone();
            let mut st = s.state.lock().unwrap();
            st.connections += 1;
            st.idle_since = None;
            drop(st);
            return (s, true);
        }
        let s = Arc::new(Session {
            id,
            max_handles: self.max_handles,
            state: Mutex::new(SessionState {
                connections: 1,
                ..Default::default()
            }),
        });
        m.sessions.insert(id, s.clone());
        (s, false)
    }

    /// A connection of `s` ended: the last one starts the grace period.
    pub fn detach(&self, s: &Arc<Session>) {
        self.end_connection(s, false);
    }

    /// A connection of `s` failed its handshake: as `detach`, but a session left
    /// without connections and holding nothing is forgotten at once (peers that fail
    /// authentication do not fill the table with empty sessions).
    pub fn abandon(&self, s: &Arc<Session>) {
        self.end_connection(s, true);
    }

    fn end_connection(&self, s: &Arc<Session>, forget_if_empty: bool) {
        let mut m = self.map.lock().unwrap();
        let mut st = s.state.lock().unwrap();
        st.connections -= 1;
        if st.connections > 0 {
            return;
        }
        if forget_if_empty && st.holds_nothing() {
            drop(st);
            if m.sessions.get(&s.id).is_some_and(|x| Arc::ptr_eq(x, s)) {
                m.sessions.remove(&s.id);
            }
            return;
        }
        st.idle_since = Some(Instant::now());
        drop(st);
        drop(m);
        self.wake.notify_all();
    }

    pub fn counts(&self) -> SessionCounts {
        let m = self.map.lock().unwrap();
        let mut c = SessionCounts::default();
        for s in m.sessions.values() {
            let st = s.state.lock().unwrap();
            if st.connections > 0 {
                c.active += 1;
            } else {
                c.in_grace += 1;
            }
            c.handles += st.handles.len() as u64;
            c.references += st.refs.values().sum::<u64>();
        }
        c
    }

    /// The reaper: until `stop`, release each session whose grace period ran out.
    pub fn reap(&self, backend: &dyn Backend, stats: &ServerStats) {
        let mut m = self.map.lock().unwrap();
        while !m.stopping {
            let now = Instant::now();
            let mut expired = Vec::new();
            let mut next: Option<Instant> = None;
            m.sessions.retain(|_, s| {
                let st = s.state.lock().unwrap();
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
                m = self.map.lock().unwrap();
                continue;
            }
            m = match next {
                Some(t) => {
                    self.wake
                        .wait_timeout(m, t.saturating_duration_since(now))
                        .unwrap()
                        .0
                }
                None => self.wake.wait(m).unwrap(),
            };
        }
    }

    /// Stop the reaper and release every session (server shutdown, after every
    /// connection ended).
    pub fn stop(&self, backend: &dyn Backend, stats: &ServerStats) {
        let all: Vec<Arc<Session>> = {
            let mut m = self.map.lock().unwrap();
            m.stopping = true;
            m.sessions.drain().map(|(_, s)| s).collect()
        };
        self.wake.notify_all();
        for s in all {
            release(&s, backend, stats);
        }
    }
}

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
mod tests {
    use super::*;
    use zcfs_backend::null::NullFs;

    fn handle(ino: u64) -> Handle {
        Handle {
            ino,
            gen: 1,
            backend_fh: 0,
            flags: 0,
        }
    }

    #[test]
    fn references_never_go_below_zero() {
        let t = Sessions::new(Duration::from_secs(60), 8);
        let (s, resumed) = t.attach(7);
        assert!(!resumed);
        s.add_ref(5);
        s.add_ref(5);
        assert_eq!(s.take_refs(5, 3), 2);
        assert_eq!(s.take_refs(5, 1), 0);
        assert_eq!(s.take_refs(6, 1), 0);
        assert_eq!(s.refs_of(5), 0);
    }

    #[test]
    fn handles_are_per_session_and_bounded() {
        let t = Sessions::new(Duration::from_secs(60), 2);
        let (a, _) = t.attach(1);
        let (b, _) = t.attach(2);
        let fa = a.add_handle(handle(10)).unwrap();
        assert_eq!(b.take_handle(fa, 10).unwrap_err().errno, libc::EBADF);
        assert_eq!(a.handle(fa, 11).unwrap_err().errno, libc::EBADF);
        assert_eq!(a.take_handle(fa, 11).unwrap_err().errno, libc::EBADF);
        assert_eq!(a.handle(fa, 10).unwrap().ino, 10);
        // The bound: exactly `max_handles` fit.
        a.add_handle(handle(11)).unwrap();
        assert!(a.has_room().is_err());
        assert_eq!(a.add_handle(handle(12)).unwrap_err().errno, libc::EMFILE);
        a.take_handle(fa, 10).unwrap();
        assert!(a.has_room().is_ok());
        assert_ne!(
            a.add_handle(handle(12)).unwrap(),
            fa,
            "numbers are not reused"
        );
    }

    #[test]
    fn a_session_outlives_its_connections_by_the_grace_period() {
        let t = Arc::new(Sessions::new(Duration::from_millis(300), 8));
        let stats = Arc::new(ServerStats::default());
        let reaper = {
            let (t, stats) = (t.clone(), stats.clone());
            std::thread::spawn(move || t.reap(&NullFs::default(), &stats))
        };
        // A failed handshake's empty session is forgotten at once.
        let (s, _) = t.attach(1);
        t.abandon(&s);
        assert_eq!(t.counts().in_grace, 0);
        // An empty session of a client that was connected waits out the grace period.
        let (s, resumed) = t.attach(1);
        assert!(!resumed);
        t.detach(&s);
        assert_eq!(t.counts().in_grace, 1);
        let (s, resumed) = t.attach(1);
        assert!(resumed);
        s.add_ref(9);
        t.detach(&s);
        // Resumed within grace...
        std::thread::sleep(Duration::from_millis(100));
        let (s2, resumed) = t.attach(1);
        assert!(resumed && Arc::ptr_eq(&s, &s2));
        assert_eq!(s2.refs_of(9), 1);
        t.detach(&s2);
        assert_eq!(t.counts().in_grace, 1);
        // ... and released after it.
        std::thread::sleep(Duration::from_millis(600));
        assert_eq!(t.counts().in_grace, 0);
        assert_eq!(stats.sessions_expired.load(Ordering::Relaxed), 1);
        assert_eq!(stats.expired_references.load(Ordering::Relaxed), 1);
        assert!(!t.attach(1).1, "a new session after expiry");
        t.stop(&NullFs::default(), &stats);
        reaper.join().unwrap();
    }
}
