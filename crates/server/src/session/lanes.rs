//! Lanes: the connection a session's client currently uses on each of its connection
//! indexes (`zcfs_protocol::handshake::Lane`).
//!
//! A client gives up on a connection when a reply times out; what it had sent may still
//! sit in a kernel queue (a cut link retransmits it once the link is back) or in the
//! server's receive buffer. If the server executed it after the client's next request
//! on a new connection, a write the caller was told had failed would overwrite a later
//! one. So a connection that takes over a lane *fences* the older one first: the server
//! shuts its socket (nothing more is read from it) and waits until its thread has
//! finished the request it was executing, and only then answers the new Hello.

use super::lock;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use zcfs_protocol::handshake::Lane;

/// Shuts down a connection's socket (from any thread): its reads fail from then on.
pub(crate) type Fence = Arc<dyn Fn() + Send + Sync>;

/// Why a connection could not take over its lane.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum LaneRefused {
    #[error("lane {index}: generation {generation} is not newer than the session's {current} (a late connection the client gave up on)")]
    Stale {
        index: u16,
        generation: u32,
        current: u32,
    },
    #[error(
        "lane {index}: the connection it replaces was still executing a request after {waited:?}"
    )]
    Busy { index: u16, waited: Duration },
}

/// Set once a connection's thread is done with its requests.
#[derive(Default)]
struct Done {
    finished: Mutex<bool>,
    cv: Condvar,
}

impl Done {
    /// Wait until finished or `deadline`; whether it finished.
    fn wait_until(&self, deadline: Instant) -> bool {
        let mut f = lock(&self.finished);
        while !*f {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            f = self
                .cv
                .wait_timeout(f, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

struct Occupant {
    generation: u32,
    fence: Fence,
    done: Arc<Done>,
}

/// A session's lanes.
#[derive(Default)]
pub(crate) struct Lanes {
    map: Mutex<HashMap<u16, Occupant>>,
}

/// A connection's hold on its lane, for as long as it executes requests: dropped when
/// its thread is done with them, which lets a connection fencing it go on.
pub(crate) struct LaneHold {
    lanes: Arc<Lanes>,
    index: u16,
    generation: u32,
    done: Arc<Done>,
}

impl Drop for LaneHold {
    fn drop(&mut self) {
        let mut m = lock(&self.lanes.map);
        if m.get(&self.index)
            .is_some_and(|o| o.generation == self.generation)
        {
            m.remove(&self.index);
        }
        drop(m);
        *lock(&self.done.finished) = true;
        self.done.cv.notify_all();
    }
}

impl Lanes {
    /// Take `lane` for a new connection (`fence` shuts it down). The older connection on
    /// the lane is fenced, and waited for up to `wait`: Busy if it is still executing
    /// then (it stays fenced; the client dials again). A generation not newer than the
    /// lane's is Stale. Generation 0 takes no lane (Ok(None)).
    pub fn take_over(
        self: &Arc<Self>,
        lane: Lane,
        fence: Fence,
        wait: Duration,
    ) -> Result<Option<LaneHold>, LaneRefused> {
        if lane.generation == 0 {
            return Ok(None);
        }
        let deadline = Instant::now() + wait;
        loop {
            let mut m = lock(&self.map);
            let Some(o) = m.get(&lane.index) else {
                let done = Arc::new(Done::default());
                m.insert(
                    lane.index,
                    Occupant {
                        generation: lane.generation,
                        fence,
                        done: done.clone(),
                    },
                );
                return Ok(Some(LaneHold {
                    lanes: self.clone(),
                    index: lane.index,
                    generation: lane.generation,
                    done,
                }));
            };
            if o.generation >= lane.generation {
                return Err(LaneRefused::Stale {
                    index: lane.index,
                    generation: lane.generation,
                    current: o.generation,
                });
            }
            let (old_fence, done) = (o.fence.clone(), o.done.clone());
            drop(m);
            old_fence();
            if !done.wait_until(deadline) {
                return Err(LaneRefused::Busy {
                    index: lane.index,
                    waited: wait,
                });
            }
            // It left the lane: take it (unless a newer connection came meanwhile).
        }
    }

    /// The generation on lane `index` (tests).
    #[cfg(test)]
    fn generation(&self, index: u16) -> Option<u32> {
        lock(&self.map).get(&index).map(|o| o.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn lane(index: u16, generation: u32) -> Lane {
        Lane { index, generation }
    }

    /// Take `lane` with a fresh fence: the answer, and how often the fence was called.
    fn take(
        lanes: &Arc<Lanes>,
        lane: Lane,
        wait: Duration,
    ) -> (Result<Option<LaneHold>, LaneRefused>, Arc<AtomicUsize>) {
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        let fence: Fence = Arc::new(move || {
            n2.fetch_add(1, Ordering::SeqCst);
        });
        (lanes.take_over(lane, fence, wait), n)
    }

    /// Take `lane`, which must be granted: the hold, and the fence's count.
    fn hold(lanes: &Arc<Lanes>, index: u16, generation: u32) -> (LaneHold, Arc<AtomicUsize>) {
        let (r, fenced) = take(lanes, lane(index, generation), WAIT);
        (r.unwrap().unwrap(), fenced)
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn a_newer_connection_fences_the_older_and_waits_until_it_is_done() {
        let lanes = Arc::new(Lanes::default());
        let (old, fenced1) = hold(&lanes, 3, 1);
        let l2 = lanes.clone();
        let t = std::thread::spawn(move || take(&l2, lane(3, 2), WAIT));
        // The old connection is told to stop, and the new one waits for it.
        while fenced1.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !t.is_finished(),
            "took over before the old connection was done"
        );
        drop(old);
        let (new, fenced2) = t.join().unwrap();
        let new = new.unwrap().unwrap();
        assert_eq!(lanes.generation(3), Some(2));
        assert_eq!(fenced2.load(Ordering::SeqCst), 0);
        drop(new);
        assert_eq!(lanes.generation(3), None);
    }

    #[test]
    fn an_older_or_equal_generation_is_stale_and_fences_nothing() {
        let lanes = Arc::new(Lanes::default());
        let (_cur, fenced) = hold(&lanes, 0, 5);
        for g in [1, 5] {
            assert_eq!(
                take(&lanes, lane(0, g), WAIT).0.err(),
                Some(LaneRefused::Stale {
                    index: 0,
                    generation: g,
                    current: 5
                })
            );
        }
        assert_eq!(fenced.load(Ordering::SeqCst), 0);
        assert_eq!(lanes.generation(0), Some(5));
    }

    #[test]
    fn a_connection_still_executing_past_the_wait_refuses_the_new_one_and_stays_fenced() {
        let lanes = Arc::new(Lanes::default());
        let (old, fenced1) = hold(&lanes, 1, 1);
        let wait = Duration::from_millis(30);
        assert!(matches!(
            take(&lanes, lane(1, 2), wait).0,
            Err(LaneRefused::Busy { index: 1, .. })
        ));
        // The next attempt waits for the same old connection again.
        assert!(take(&lanes, lane(1, 3), wait).0.is_err());
        assert_eq!(fenced1.load(Ordering::SeqCst), 2);
        drop(old);
        assert!(take(&lanes, lane(1, 4), wait).0.unwrap().is_some());
    }

    #[test]
    fn lanes_are_independent_and_generation_zero_takes_none() {
        let lanes = Arc::new(Lanes::default());
        let (_a, fenced1) = hold(&lanes, 0, 1);
        let _b = hold(&lanes, 1, 1);
        assert!(take(&lanes, Lane::NONE, WAIT).0.unwrap().is_none());
        assert_eq!(fenced1.load(Ordering::SeqCst), 0);
    }
}
