//! **A test tool**, never part of the transport: [`Lossy`] wraps any [`FrameIo`] (in
//! practice a real AF_XDP socket) and loses, duplicates and reorders the frames it
//! transmits, with a seeded RNG and rates in parts per million, so the protocol's loss
//! handling is exercised on real sockets the way the simulator's
//! [`crate::sim::Injector`] exercises it without privileges. Through a [`LossyHandle`]
//! the test changes the rates while an [`crate::Endpoint`] owns the wrapper (e.g. 100 %
//! loss: the sending process "died"), reads the [`LossyCounters`], and sends frames of
//! its own on the segment as a neighbour would.
//!
//! The wrapper keeps the [`FrameIo`] contract for its caller:
//! - a lost frame is not sent; its address goes straight to the completions;
//! - a duplicated frame is sent twice and its address completes once (the second
//!   completion is swallowed);
//! - a reordered frame is held back and sent after the next frame (or at the next
//!   [`FrameIo::recv`] or [`FrameIo::wait`] when none follows), so it is never held for
//!   long;
//! - frames the inner TX ring did not take are kept in a backlog and sent first at the
//!   next call; the caller sees them as queued, which they are.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use zcfs_xsk::{Desc, FrameIo, Region};

/// What a [`Lossy`] did to the frames it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossyCounters {
    /// Frames the caller transmitted.
    pub frames: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Frames sent for the test through [`LossyHandle::inject`].
    pub injected: u64,
}

struct Shared {
    loss_ppm: u32,
    dup_ppm: u32,
    reorder_ppm: u32,
    rng: u64,
    counters: LossyCounters,
    inject: VecDeque<(u64, Vec<u8>)>,
}

impl Shared {
    fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn hit(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.next() % 1_000_000 < ppm as u64
    }
}

/// The test's hold on a [`Lossy`] owned by someone else.
#[derive(Clone)]
pub struct LossyHandle(Arc<Mutex<Shared>>);

impl LossyHandle {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A test tool: a panic elsewhere poisoned it, the counters are still readable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Change the rates (parts per million of transmitted frames).
    pub fn set_rates(&self, loss_ppm: u32, dup_ppm: u32, reorder_ppm: u32) {
        let mut s = self.lock();
        s.loss_ppm = loss_ppm;
        s.dup_ppm = dup_ppm;
        s.reorder_ppm = reorder_ppm;
    }

    pub fn counters(&self) -> LossyCounters {
        self.lock().counters
    }

    /// Send `frame` on the segment from `addr` of the wrapped socket's region, at the
    /// wrapper's next call, as a neighbour on the segment would. `addr` must be memory
    /// the wrapper's user never uses (and a multiple of [`zcfs_xsk::TX_ADDR_ALIGN`]).
    pub fn inject(&self, addr: u64, frame: &[u8]) {
        self.lock().inject.push_back((addr, frame.to_vec()));
    }
}

/// A test-only [`FrameIo`] that loses, duplicates and reorders transmitted frames (see
/// the module documentation).
pub struct Lossy<F: FrameIo> {
    inner: F,
    shared: Arc<Mutex<Shared>>,
    /// Addresses of lost frames, handed out as completions.
    lost: VecDeque<u64>,
    /// Completions to swallow per address (duplicates and injected frames).
    swallow: HashMap<u64, u32>,
    /// Frames queued by the caller and not yet taken by the inner TX ring.
    backlog: VecDeque<Desc>,
    /// A frame held back to be overtaken.
    held: Option<Desc>,
}

impl<F: FrameIo> Lossy<F> {
    /// Wrap `inner` with these rates (parts per million) and RNG seed.
    pub fn new(inner: F, seed: u64, loss_ppm: u32, dup_ppm: u32, reorder_ppm: u32) -> Self {
        Lossy {
            inner,
            shared: Arc::new(Mutex::new(Shared {
                loss_ppm,
                dup_ppm,
                reorder_ppm,
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                counters: LossyCounters::default(),
                inject: VecDeque::new(),
            })),
            lost: VecDeque::new(),
            swallow: HashMap::new(),
            backlog: VecDeque::new(),
            held: None,
        }
    }

    /// A perfect link (rates can be raised through the handle).
    pub fn clean(inner: F) -> Self {
        Self::new(inner, 1, 0, 0, 0)
    }

    pub fn handle(&self) -> LossyHandle {
        LossyHandle(self.shared.clone())
    }

    pub fn inner(&self) -> &F {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send what waits: injected frames, a frame held since an earlier call, the backlog.
    fn flush(&mut self, release_held: bool) {
        let injected: Vec<(u64, Vec<u8>)> = self.lock().inject.drain(..).collect();
        for (addr, f) in injected {
            if self.inner.region().write(addr, &f).is_ok() {
                *self.swallow.entry(addr).or_default() += 1;
                self.lock().counters.injected += 1;
                self.backlog.push_front(Desc {
                    addr,
                    len: f.len() as u32,
                });
            }
        }
        if release_held {
            if let Some(h) = self.held.take() {
                self.backlog.push_back(h);
            }
        }
        if !self.backlog.is_empty() {
            let batch: Vec<Desc> = self.backlog.iter().copied().collect();
            let n = self.inner.transmit(&batch);
            self.backlog.drain(..n);
        }
    }
}

impl<F: FrameIo> FrameIo for Lossy<F> {
    fn region(&self) -> &Region {
        self.inner.region()
    }

    fn fill(&mut self, addrs: &[u64]) -> usize {
        self.inner.fill(addrs)
    }

    fn fill_free(&self) -> usize {
        self.inner.fill_free()
    }

    fn recv(&mut self, out: &mut Vec<Desc>, max: usize) -> usize {
        self.flush(true);
        self.inner.recv(out, max)
    }

    fn transmit(&mut self, frames: &[Desc]) -> usize {
        self.flush(true);
        let mut s = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        let (loss, dup, reorder) = (s.loss_ppm, s.dup_ppm, s.reorder_ppm);
        for &f in frames {
            s.counters.frames += 1;
            if s.hit(loss) {
                s.counters.lost += 1;
                self.lost.push_back(f.addr);
                continue;
            }
            if self.held.is_none() && s.hit(reorder) {
                s.counters.reordered += 1;
                self.held = Some(f);
                continue;
            }
            self.backlog.push_back(f);
            if s.hit(dup) {
                s.counters.duplicated += 1;
                *self.swallow.entry(f.addr).or_default() += 1;
                self.backlog.push_back(f);
            }
            if let Some(h) = self.held.take() {
                self.backlog.push_back(h);
            }
        }
        drop(s);
        self.flush(false);
        frames.len()
    }

    fn completions(&mut self, out: &mut Vec<u64>, max: usize) -> usize {
        // A held frame stays held until the next recv or wait: a caller that asks for
        // completions before each frame still sees its frames overtaken.
        self.flush(false);
        let mut n = 0;
        while n < max {
            let Some(a) = self.lost.pop_front() else {
                break;
            };
            out.push(a);
            n += 1;
        }
        if n < max {
            let mut got = Vec::new();
            self.inner.completions(&mut got, max - n);
            for a in got {
                match self.swallow.get_mut(&a) {
                    Some(k) => {
                        *k -= 1;
                        if *k == 0 {
                            self.swallow.remove(&a);
                        }
                    }
                    None => {
                        out.push(a);
                        n += 1;
                    }
                }
            }
        }
        n
    }

    fn wait(&mut self, timeout: Duration) -> io::Result<bool> {
        self.flush(true);
        self.inner.wait(timeout)
    }
}
