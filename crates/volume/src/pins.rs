//! Read pins: readers use data blocks without holding the volume lock, and a freed block
//! is reused only once no reader that could still see it is left.
//!
//! Every change to the volume's state happens under the state's write lock and moves a
//! counter, the *epoch*, forward by one. A reader, under the read lock, registers the
//! epoch it saw ([`ReadPins::enter`]), takes the addresses of the blocks it needs, and
//! drops the lock; the returned [`ReadPin`] keeps the registration until the reader is
//! done (e.g. the reply has left on the socket). A block taken out of a file by the
//! change that moved the epoch from `t` to `t + 1` is tagged `t`: every reader that could
//! have seen it registered at an epoch `<= t`. So the block may be reused once the oldest
//! registered epoch is `> t` ([`ReadPins::reusable`]). A stalled reader therefore delays
//! reuse of what was freed after it started, never the writers themselves, and never
//! another reader.

use crate::sync::Mutex;
use std::collections::BTreeMap;

/// The registry of active readers: epoch -> number of readers that saw it.
#[derive(Debug, Default)]
pub(crate) struct ReadPins {
    active: Mutex<BTreeMap<u64, usize>>,
}

/// One reader's registration; dropping it ends the read.
#[must_use = "the pin ends when dropped"]
#[derive(Debug)]
pub(crate) struct ReadPin<'a> {
    pins: &'a ReadPins,
    epoch: u64,
}

impl ReadPins {
    /// Register a reader that saw the state at `epoch`. Call under the state's read
    /// (or write) lock, so the epoch is the one of the state the reader looks at.
    pub(crate) fn enter(&self, epoch: u64) -> ReadPin<'_> {
        *self.active.lock().unwrap().entry(epoch).or_insert(0) += 1;
        ReadPin { pins: self, epoch }
    }

    /// The oldest epoch an active reader saw.
    pub(crate) fn oldest(&self) -> Option<u64> {
        self.active.lock().unwrap().keys().next().copied()
    }

    /// Whether a block freed with tag `t` may be reused now.
    pub(crate) fn reusable(oldest: Option<u64>, t: u64) -> bool {
        oldest.is_none_or(|o| t < o)
    }

    #[cfg(test)]
    pub(crate) fn readers(&self) -> usize {
        self.active.lock().unwrap().values().sum()
    }
}

impl Drop for ReadPin<'_> {
    fn drop(&mut self) {
        let mut a = self.pins.active.lock().unwrap();
        let n = a
            .get_mut(&self.epoch)
            .expect("a pin's epoch is registered until it drops");
        *n -= 1;
        if *n == 0 {
            a.remove(&self.epoch);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn oldest_follows_registrations() {
        let p = ReadPins::default();
        assert_eq!(p.oldest(), None);
        let a = p.enter(5);
        let b = p.enter(3);
        let c = p.enter(3);
        assert_eq!(p.oldest(), Some(3));
        assert!(
            !ReadPins::reusable(p.oldest(), 3),
            "tag 3: a reader saw epoch 3"
        );
        assert!(ReadPins::reusable(p.oldest(), 2));
        drop(b);
        assert_eq!(p.oldest(), Some(3));
        drop(c);
        assert_eq!(p.oldest(), Some(5));
        drop(a);
        assert_eq!((p.oldest(), p.readers()), (None, 0));
        assert!(ReadPins::reusable(None, u64::MAX));
    }
}

/// Model check (loom) of the protocol around the pins: a reader takes a block under the
/// read lock and reads it without the lock; a writer replaces the block (copy-on-write),
/// frees it at a checkpoint when the pins allow, and reuses it at once. loom explores
/// every interleaving and reports the reuse racing the unlocked read if the rule is
/// wrong. Run: `RUSTFLAGS="--cfg loom" cargo test -p zcfs-volume --release --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::{Arc, RwLock};

    struct State {
        epoch: u64,
        /// The file's one data block.
        mapped: usize,
        free: Vec<usize>,
        deferred: Vec<(usize, u64)>,
    }

    struct Vol {
        state: RwLock<State>,
        pins: ReadPins,
        blocks: [UnsafeCell<u64>; 3],
    }

    /// `honest`: false tags freed blocks one epoch too early, which must be caught.
    fn scenario(honest: bool) {
        loom::model(move || {
            let vol = Arc::new(Vol {
                state: RwLock::new(State {
                    epoch: 1,
                    mapped: 0,
                    free: vec![1, 2],
                    deferred: vec![],
                }),
                pins: ReadPins::default(),
                blocks: [UnsafeCell::new(100), UnsafeCell::new(0), UnsafeCell::new(0)],
            });
            let v = vol.clone();
            let reader = loom::thread::spawn(move || {
                let (b, pin) = {
                    let st = v.state.read().unwrap();
                    (st.mapped, v.pins.enter(st.epoch))
                };
                // The read the volume makes without its lock (e.g. a socket send).
                let got = v.blocks[b].with(|p| unsafe { *p });
                assert!(got == 100 || got == 200, "read a reused block: {got}");
                drop(pin);
            });
            // Writer: copy-on-write into a fresh block, then swap it in.
            {
                let nb = vol.state.write().unwrap().free.pop().unwrap();
                vol.blocks[nb].with_mut(|p| unsafe { *p = 200 });
                let mut st = vol.state.write().unwrap();
                let old = std::mem::replace(&mut st.mapped, nb);
                let tag = if honest { st.epoch } else { st.epoch - 1 };
                st.epoch += 1;
                st.deferred.push((old, tag));
            }
            // Checkpoint: release what the pins allow, then reuse it at once.
            let reused = {
                let mut st = vol.state.write().unwrap();
                let oldest = vol.pins.oldest();
                let (go, keep): (Vec<_>, Vec<_>) = st
                    .deferred
                    .drain(..)
                    .partition(|&(_, t)| ReadPins::reusable(oldest, t));
                st.deferred = keep;
                st.free.extend(go.into_iter().map(|(b, _)| b));
                st.free.pop()
            };
            if let Some(b) = reused {
                vol.blocks[b].with_mut(|p| unsafe { *p = 999 });
            }
            reader.join().unwrap();
        });
    }

    #[test]
    fn loom_a_pinned_block_is_never_reused_under_a_reader() {
        scenario(true);
    }

    #[test]
    #[should_panic]
    fn loom_mutation_tagging_one_epoch_early_is_caught() {
        scenario(false);
    }
}
