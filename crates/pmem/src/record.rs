//! Recording mode: a trace of stores, flushes and fences for the crash model.

use crate::CACHE_LINE;

/// One persistence-relevant event, in program order.
#[derive(Debug, Clone)]
pub enum Event {
    /// Bytes stored at an offset (not yet written back).
    Store { off: usize, data: Vec<u8> },
    /// Write-back of the cache lines covering `[off, off+len)`.
    Flush { off: usize, len: usize },
    /// Ordering point: flushed lines become durable.
    Fence,
    /// A marker put in by the workload (operation boundaries).
    Mark(u64),
}

/// A finished recording: the image when recording began and every event since.
#[derive(Debug, Clone)]
pub struct Recording {
    pub base: Vec<u8>,
    pub events: Vec<Event>,
}

pub(crate) struct Recorder {
    base: Vec<u8>,
    /// The image as the trace so far describes it. Stores made through raw slices are
    /// not seen when made; a flush finds them by comparing memory with this shadow.
    shadow: Vec<u8>,
    events: Vec<Event>,
}

impl Recorder {
    pub(crate) fn new(base: Vec<u8>) -> Recorder {
        Recorder {
            shadow: base.clone(),
            base,
            events: Vec::new(),
        }
    }

    pub(crate) fn store(&mut self, off: usize, data: &[u8]) {
        self.shadow[off..off + data.len()].copy_from_slice(data);
        self.events.push(Event::Store {
            off,
            data: data.to_vec(),
        });
    }

    pub(crate) fn flush(&mut self, mem: &[u8], off: usize, len: usize) {
        let first = off / CACHE_LINE;
        let last = (off + len - 1) / CACHE_LINE;
        for line in first..=last {
            let s = line * CACHE_LINE;
            let e = (s + CACHE_LINE).min(mem.len());
            if mem[s..e] != self.shadow[s..e] {
                self.store(s, &mem[s..e]);
            }
        }
        self.events.push(Event::Flush { off, len });
    }

    pub(crate) fn fence(&mut self) {
        self.events.push(Event::Fence);
    }

    pub(crate) fn mark(&mut self, tag: u64) {
        self.events.push(Event::Mark(tag));
    }

    pub(crate) fn finish(self) -> Recording {
        Recording {
            base: self.base,
            events: self.events,
        }
    }
}
