//! Read pins: readers use data blocks without holding the volume lock, and a freed block
//! is reused only once no reader still uses it.
//!
//! A reader, under the state's read lock, looks up the blocks it needs and pins them
//! ([`ReadPins::pin`]: one entry per run of adjacent blocks, so a large contiguous read
//! costs one entry), then drops the lock; the returned [`ReadPin`] keeps them pinned
//! until the reader is done (e.g. the reply has left on the socket). Blocks a change
//! takes out of a file are reused only after a checkpoint that finds them unpinned
//! ([`ReadPins::is_pinned`], under the write lock). Pinning under the read lock is what
//! makes this sound: a writer, which holds the write lock, cannot free a block between
//! the reader's lookup and its pin.
//!
//! Pins name blocks, not points in time, so a stalled reader (up to its peer timeout)
//! delays the reuse of the blocks it reads and nothing else: writers elsewhere on the
//! volume do not run out of space because of it.

use crate::sync::Mutex;

/// The pinned runs of active readers: (first block, end block, reader).
#[derive(Debug, Default)]
pub(crate) struct ReadPins {
    active: Mutex<Active>,
}

#[derive(Debug, Default)]
struct Active {
    runs: Vec<(u64, u64, u64)>,
    next_id: u64,
}

/// One reader's pins; dropping it ends the read.
#[must_use = "the pin ends when dropped"]
#[derive(Debug)]
pub(crate) struct ReadPin<'a> {
    pins: &'a ReadPins,
    id: u64,
}

impl ReadPins {
    /// Pin the runs `[first, end)` of blocks. Call under the state's read (or write)
    /// lock, with the runs the reader just looked up.
    pub(crate) fn pin(&self, runs: impl IntoIterator<Item = (u64, u64)>) -> ReadPin<'_> {
        let mut a = self.active.lock().unwrap();
        a.next_id += 1;
        let id = a.next_id;
        a.runs.extend(runs.into_iter().map(|(s, e)| (s, e, id)));
        ReadPin { pins: self, id }
    }

    /// Pin as `pin` does, for a reader that outlives any borrow (a same-host lease):
    /// the pin lasts until [`ReadPins::unpin`] with the id returned.
    pub(crate) fn pin_detached(&self, runs: impl IntoIterator<Item = (u64, u64)>) -> u64 {
        let p = self.pin(runs);
        let id = p.id;
        std::mem::forget(p);
        id
    }

    /// End the pins of reader `id` (from `pin_detached`).
    pub(crate) fn unpin(&self, id: u64) {
        let mut a = self.active.lock().unwrap();
        a.runs.retain(|r| r.2 != id);
    }

    /// A snapshot of what is pinned now, for checking many blocks (a checkpoint).
    pub(crate) fn pinned(&self) -> Pinned {
        Pinned(
            self.active
                .lock()
                .unwrap()
                .runs
                .iter()
                .map(|&(s, e, _)| (s, e))
                .collect(),
        )
    }

    #[cfg(all(test, not(loom)))]
    pub(crate) fn readers(&self) -> usize {
        let a = self.active.lock().unwrap();
        let mut ids: Vec<u64> = a.runs.iter().map(|r| r.2).collect();
        ids.dedup();
        ids.len()
    }
}

/// Pinned runs at one moment (taken under the state's write lock, so no reader can add
/// one meanwhile).
pub(crate) struct Pinned(Vec<(u64, u64)>);

impl Pinned {
    pub(crate) fn contains(&self, b: u64) -> bool {
        self.0.iter().any(|&(s, e)| s <= b && b < e)
    }
}

impl Drop for ReadPin<'_> {
    fn drop(&mut self) {
        self.pins.unpin(self.id);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pins_cover_their_runs_until_dropped() {
        let p = ReadPins::default();
        let a = p.pin([(10, 20)]);
        let b = p.pin([(15, 16), (40, 41)]);
        let now = p.pinned();
        assert!(now.contains(10) && now.contains(19) && now.contains(40));
        assert!(!now.contains(20) && !now.contains(9) && !now.contains(39));
        assert_eq!(p.readers(), 2);
        drop(a);
        let now = p.pinned();
        assert!(now.contains(15) && !now.contains(16) && !now.contains(10));
        drop(b);
        assert!(!p.pinned().contains(40));
        assert_eq!(p.readers(), 0);
    }

    #[test]
    fn a_detached_pin_lasts_until_unpinned() {
        let p = ReadPins::default();
        let id = p.pin_detached([(5, 7)]);
        let other = p.pin([(5, 6)]);
        drop(other);
        assert!(p.pinned().contains(5) && p.pinned().contains(6));
        p.unpin(id);
        assert!(!p.pinned().contains(5));
        assert_eq!(p.readers(), 0);
    }
}

/// Model check (loom) of the protocol around the pins: a reader looks its block up and
/// pins it under the read lock, then reads it without the lock; a writer replaces the
/// block (copy-on-write), frees it at a checkpoint when unpinned, and reuses it at once.
/// loom explores every interleaving and reports the reuse racing the unlocked read if
/// the rule is broken. Run: `RUSTFLAGS="--cfg loom" cargo test -p zcfs-volume --release
/// --lib loom`.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::{Arc, RwLock};

    struct State {
        /// The file's one data block.
        mapped: u64,
        free: Vec<u64>,
        deferred: Vec<u64>,
    }

    struct Vol {
        state: RwLock<State>,
        pins: ReadPins,
        blocks: [UnsafeCell<u64>; 3],
    }

    /// `honest`: false pins after dropping the read lock (the mistake this rules out),
    /// which must be caught.
    fn scenario(honest: bool) {
        loom::model(move || {
            let vol = Arc::new(Vol {
                state: RwLock::new(State {
                    mapped: 0,
                    free: vec![1, 2],
                    deferred: vec![],
                }),
                pins: ReadPins::default(),
                blocks: [UnsafeCell::new(100), UnsafeCell::new(0), UnsafeCell::new(0)],
            });
            let v = vol.clone();
            let reader = loom::thread::spawn(move || {
                let (b, pin) = if honest {
                    let st = v.state.read().unwrap();
                    (st.mapped, v.pins.pin([(st.mapped, st.mapped + 1)]))
                } else {
                    let b = v.state.read().unwrap().mapped;
                    (b, v.pins.pin([(b, b + 1)]))
                };
                // The read the volume makes without its lock (e.g. a socket send).
                let got = v.blocks[b as usize].with(|p| unsafe { *p });
                assert!(got == 100 || got == 200, "read a reused block: {got}");
                drop(pin);
            });
            // Writer: copy-on-write into a fresh block, then swap it in.
            {
                let nb = vol.state.write().unwrap().free.pop().unwrap();
                vol.blocks[nb as usize].with_mut(|p| unsafe { *p = 200 });
                let mut st = vol.state.write().unwrap();
                let old = std::mem::replace(&mut st.mapped, nb);
                st.deferred.push(old);
            }
            // Checkpoint: release what is unpinned, then reuse it at once.
            let reused = {
                let mut st = vol.state.write().unwrap();
                let pinned = vol.pins.pinned();
                let (go, keep): (Vec<u64>, Vec<u64>) =
                    st.deferred.drain(..).partition(|&b| !pinned.contains(b));
                st.deferred = keep;
                st.free.extend(go);
                st.free.pop()
            };
            if let Some(b) = reused {
                vol.blocks[b as usize].with_mut(|p| unsafe { *p = 999 });
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
    fn loom_mutation_pinning_after_the_lock_is_caught() {
        scenario(false);
    }
}
