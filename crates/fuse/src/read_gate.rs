//! How many FUSE workers wait on the device at once.
//!
//! The kernel wakes one sleeping reader of /dev/fuse per request it queues. With every
//! idle worker reading, a burst of requests (fio at QD16, a parallel build) wakes a
//! thread per request, each a context switch, often on the other vCPU. Yet most
//! requests hold their worker only for a moment (a read is sent and answered on the
//! reply's thread), so one worker could have read them all back to back.
//! `IdleReaders` lets at most a few workers wait in read(2); the others wait here, and
//! one of them is let in when no worker is left reading (all are busy with requests
//! that hold them, a server round trip each), so a request never waits for a worker
//! while one is idle. A worker that read a request answered at once (a read, sent and
//! answered later on the reply's thread) keeps its turn and comes straight back to
//! read (the vendored fuser's `Turn`): a burst of reads is read by the turn holders
//! back to back, and a read that has to wait after all gives its turn back first
//! (`fuser::before_waiting`).

use fuser::ReadGate;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Workers that wait in read(2) of /dev/fuse at once by default: two, so that a
/// request that holds its worker (a metadata round trip) leaves another reading, and
/// the next request finds it without a worker being let in first.
pub const IDLE_READERS: usize = 2;

/// At most `max` workers read the device at once; one more is let in whenever none is.
pub struct IdleReaders {
    max: usize,
    state: Mutex<State>,
    let_in: Condvar,
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    /// Workers in read(2) of the device now.
    reading: usize,
    /// Workers waiting to be let in.
    waiting: usize,
    closed: bool,
}

impl IdleReaders {
    /// `max` is at least 1 (a gate of 0 would keep every worker out).
    pub fn new(max: usize) -> IdleReaders {
        IdleReaders {
            max: max.max(1),
            state: Mutex::new(State::default()),
            let_in: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent whatever panicked while holding it (each change is
        // one statement).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (reading, waiting) now.
    pub fn counts(&self) -> (usize, usize) {
        let st = self.lock();
        (st.reading, st.waiting)
    }
}

impl ReadGate for IdleReaders {
    fn enter(&self) -> bool {
        let mut st = self.lock();
        loop {
            if st.closed {
                return false;
            }
            if st.reading < self.max {
                st.reading += 1;
                return true;
            }
            st.waiting += 1;
            st = self.let_in.wait(st).unwrap_or_else(|e| e.into_inner());
            st.waiting -= 1;
        }
    }

    fn leave(&self) {
        let mut st = self.lock();
        st.reading = st
            .reading
            .checked_sub(1)
            .expect("a worker left the device it had not entered");
        // The last reader took a request that may hold it: let a waiting worker read
        // meanwhile. (Below `max` but above zero, a worker that finishes its request
        // comes back to read: no wake-up is spent on it.)
        if st.reading == 0 && st.waiting > 0 {
            self.let_in.notify_one();
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.let_in.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "never: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A request of the model device: how long it holds its worker, and whether the
    /// worker keeps its turn for it (answered at once, as a read).
    type Req = Option<(Duration, bool)>;

    /// Workers of a session against a model device (a channel of requests), as the
    /// vendored fuser's loop drives the gate.
    fn workers(
        gate: &Arc<IdleReaders>,
        n: usize,
    ) -> (mpsc::Sender<Req>, Vec<std::thread::JoinHandle<usize>>) {
        let (tx, rx) = mpsc::channel::<Req>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n)
            .map(|_| {
                let (gate, rx) = (gate.clone(), rx.clone());
                std::thread::spawn(move || {
                    let (mut served, mut kept) = (0, false);
                    loop {
                        if !kept && !gate.enter() {
                            return served;
                        }
                        let req = rx.lock().unwrap().recv();
                        kept = matches!(req, Ok(Some((_, true))));
                        if !kept {
                            gate.leave();
                        }
                        match req {
                            Ok(Some((hold, _))) => {
                                std::thread::sleep(hold);
                                served += 1;
                            }
                            // The device is gone: the session ended.
                            Ok(None) | Err(_) => {
                                gate.close();
                                return served;
                            }
                        }
                    }
                })
            })
            .collect();
        (tx, threads)
    }

    #[test]
    fn at_most_max_workers_read_and_the_rest_wait() {
        let gate = Arc::new(IdleReaders::new(IDLE_READERS));
        let (tx, threads) = workers(&gate, 8);
        until("two read, six wait", || gate.counts() == (2, 6));
        tx.send(None).unwrap();
        drop(tx);
        // Every worker stops: the one that met the end closed the gate for the rest.
        let served: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(served, 0);
        assert!(!gate.enter(), "a closed gate lets no one in");
    }

    /// Requests that hold their workers (a round trip each) never wait for a worker
    /// while one is idle: with every reader busy, a waiting worker is let in.
    #[test]
    fn requests_that_hold_their_workers_are_read_by_others() {
        let gate = Arc::new(IdleReaders::new(2));
        let (tx, threads) = workers(&gate, 6);
        until("two read", || gate.counts().0 == 2);
        let hold = Duration::from_millis(400);
        let t = Instant::now();
        for _ in 0..6 {
            tx.send(Some((hold, false))).unwrap();
        }
        // All six run at once: each is read by its own worker within the hold time.
        until("all six taken", || gate.counts() == (0, 0));
        assert!(
            t.elapsed() < hold,
            "six requests were not all taken while the first held ({:?})",
            t.elapsed()
        );
        tx.send(None).unwrap();
        drop(tx);
        let served: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(served, 6);
    }

    /// A burst of requests answered at once is read by the turn holder back to back:
    /// the workers waiting at the gate are never let in.
    #[test]
    fn a_burst_of_quick_requests_needs_no_waiting_worker() {
        let gate = Arc::new(IdleReaders::new(1));
        let (tx, threads) = workers(&gate, 4);
        until("one reads", || gate.counts() == (1, 3));
        for _ in 0..200 {
            tx.send(Some((Duration::ZERO, true))).unwrap();
        }
        tx.send(None).unwrap();
        drop(tx);
        let served: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(served.iter().sum::<usize>(), 200);
        assert_eq!(
            served.iter().filter(|&&n| n > 0).count(),
            1,
            "requests answered at once were spread over workers: {served:?}"
        );
        // The same burst of requests that hold their workers a moment each: another
        // worker is let in whenever the reader takes one.
        let gate = Arc::new(IdleReaders::new(1));
        let (tx, threads) = workers(&gate, 4);
        until("one reads", || gate.counts() == (1, 3));
        for _ in 0..200 {
            tx.send(Some((Duration::from_micros(200), false))).unwrap();
        }
        tx.send(None).unwrap();
        drop(tx);
        let served: Vec<usize> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(served.iter().sum::<usize>(), 200);
        assert!(served.iter().filter(|&&n| n > 0).count() > 1, "{served:?}");
    }

    #[test]
    fn a_gate_of_zero_is_a_gate_of_one() {
        let gate = IdleReaders::new(0);
        assert!(gate.enter());
        assert_eq!(gate.counts(), (1, 0));
        gate.leave();
        gate.close();
        assert!(!gate.enter());
    }
}
