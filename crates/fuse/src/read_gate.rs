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
//! while one is idle. A worker leaves the gate as soon as its read(2) returns, whatever
//! the request: what it does next (a read sent in microseconds, or a round trip that
//! waits for a stalled server) never keeps another worker off the device. In a burst,
//! the readers that took quick requests are back before the last of them takes one,
//! so few waiting workers are let in.
//!
//! (A first version let a worker that took a read keep its turn while it sent it, as
//! reads are answered on the reply's thread. Review 33g found sends that wait after
//! all, for an in-flight slot or behind a stalled write, leaving no worker reading;
//! keeping the turn measured no faster, so it went: tests/review33g.rs.)

use fuser::ReadGate;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The number of readers measured best for 4 KiB reads at queue depth 16 on a remote
/// mount over veth (session 33, same build, `-o readers=`, 5-6 rounds each): 62.0k IOPS
/// with two readers, 61.4-62.5k with four, 56.0k with eight, 53.2-54.4k with all
/// sixteen. Not the default: metadata paid for it (8 rounds, four readers against
/// sixteen: `tar x` 0.312 s against 0.290, creating 2,000 files 0.585 against 0.567, a
/// cold `ls -l` of them 0.074 against 0.059), so a mount gates its readers only when
/// asked (`-o readers=4`).
pub const QD_READERS: usize = 4;

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

    /// Workers of a session against a model device (a channel of requests, each the
    /// time it holds its worker), as the vendored fuser's loop drives the gate.
    fn workers(
        gate: &Arc<IdleReaders>,
        n: usize,
    ) -> (
        mpsc::Sender<Option<Duration>>,
        Vec<std::thread::JoinHandle<usize>>,
    ) {
        let (tx, rx) = mpsc::channel::<Option<Duration>>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n)
            .map(|_| {
                let (gate, rx) = (gate.clone(), rx.clone());
                std::thread::spawn(move || {
                    let mut served = 0;
                    loop {
                        if !gate.enter() {
                            return served;
                        }
                        let req = rx.lock().unwrap().recv();
                        gate.leave();
                        match req {
                            Ok(Some(hold)) => {
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
        let gate = Arc::new(IdleReaders::new(QD_READERS));
        let (tx, threads) = workers(&gate, QD_READERS + 6);
        until("QD_READERS read, six wait", || {
            gate.counts() == (QD_READERS, 6)
        });
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
            tx.send(Some(hold)).unwrap();
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

    /// A waiting worker is let in only when no worker is left reading: while one of two
    /// readers holds a request, the other reads alone.
    #[test]
    fn a_worker_is_let_in_only_when_none_reads() {
        let gate = Arc::new(IdleReaders::new(2));
        let (tx, threads) = workers(&gate, 5);
        until("two read, three wait", || gate.counts() == (2, 3));
        let hold = Duration::from_millis(300);
        tx.send(Some(hold)).unwrap();
        until("one reads", || gate.counts() == (1, 3));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(gate.counts(), (1, 3), "a worker was let in beside a reader");
        tx.send(Some(hold)).unwrap();
        until("one let in", || gate.counts() == (1, 2));
        tx.send(None).unwrap();
        drop(tx);
        let served: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(served, 2);
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
