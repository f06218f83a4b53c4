//! Moving one file's bytes from a source to a sink (`cp`, `cat`) with several requests
//! in flight: reads go out ahead, each read's data is sent on as a write as soon as it
//! is in, and at most `WINDOW` chunks of at most `CHUNK_MAX` bytes are outstanding
//! (reads and writes together), so a copy holds at most `WINDOW * CHUNK_MAX` bytes
//! whatever the file's size.
//!
//! Short reads and short writes are completed: a read that returns less than asked is
//! continued where it stopped until it is whole or returns nothing (the end of the
//! file, which may have moved since its size was read); a write that wrote less is sent
//! again from where it stopped until it is whole, and one that writes nothing is an
//! error (ENOSPC). A file that grew while it was copied is read on past its old size
//! until a read returns nothing.

use std::collections::VecDeque;
use zcfs_backend::{Error, Result};

/// Chunks in flight per file (reads and writes together): as the library benchmark's
/// queue depth, enough to keep a veth or 10 GbE link busy at 1 MiB per request.
pub const WINDOW: usize = 16;
/// The most bytes one request moves (less when the server negotiated less).
pub const CHUNK_MAX: usize = 1 << 20;

// A copy holds at most WINDOW * CHUNK_MAX bytes of data: keep it small, and a chunk
// within what one request may carry.
const _: () = assert!(WINDOW * CHUNK_MAX <= 64 << 20 && CHUNK_MAX <= zcfs_protocol::MAX_DATA);

/// Where a file's bytes come from: reads sent now and waited for later.
pub trait Source {
    type Pending;
    fn submit(&mut self, offset: u64, len: usize) -> Result<Self::Pending>;
    /// The bytes read: fewer than asked at the end of the file, none past it.
    fn wait(&mut self, p: Self::Pending) -> Result<Vec<u8>>;
    /// A buffer `wait` returned, written and no longer needed: a source that reads into
    /// buffers of its own may use it again (no allocation, no page faults per chunk).
    fn recycle(&mut self, _buf: Vec<u8>) {}
}

/// Where they go: writes sent now (the data leaves or is copied before `submit`
/// returns) and waited for later.
pub trait Sink {
    type Pending;
    fn submit(&mut self, offset: u64, data: &[u8]) -> Result<Self::Pending>;
    /// How many bytes were written (fewer when the volume filled part way).
    fn wait(&mut self, p: Self::Pending) -> Result<usize>;
}

/// Copy everything `src` holds to `dst` at the same offsets, `size_hint` being the size
/// the source had when the copy began, in chunks of `chunk` bytes with at most `window`
/// outstanding. `progress` is told each chunk's bytes once they are written. Returns the
/// bytes copied.
pub fn copy_data<S: Source, D: Sink>(
    src: &mut S,
    dst: &mut D,
    size_hint: u64,
    chunk: usize,
    window: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<u64> {
    if chunk == 0 || window == 0 {
        return Err(Error::new(
            libc::EINVAL,
            "a copy needs a chunk and a window",
        ));
    }
    let mut reads: VecDeque<(u64, usize, S::Pending)> = VecDeque::new();
    let mut writes: VecDeque<(u64, Vec<u8>, D::Pending)> = VecDeque::new();
    let (mut next, mut copied, mut eof) = (0u64, 0u64, false);
    loop {
        // Read ahead while there is room; past the size the file had, one read at a
        // time (it is there to find the end).
        while !eof && reads.len() + writes.len() < window && (next < size_hint || reads.is_empty())
        {
            let len = if next < size_hint {
                chunk.min((size_hint - next).min(usize::MAX as u64) as usize)
            } else {
                chunk
            };
            reads.push_back((next, len, src.submit(next, len)?));
            next += len as u64;
        }
        if let Some((offset, len, p)) = reads.pop_front() {
            let mut data = src.wait(p)?;
            while data.len() < len {
                let more = src.submit(offset + data.len() as u64, len - data.len())?;
                let more = src.wait(more)?;
                if more.is_empty() {
                    eof = true;
                    break;
                }
                data.extend_from_slice(&more);
            }
            if data.len() > len {
                return Err(Error::new(
                    libc::EIO,
                    format!("a read of {len} bytes returned {}", data.len()),
                ));
            }
            if eof {
                // What was read ahead lies past the end: nothing to copy.
                for (_, _, p) in reads.drain(..) {
                    src.wait(p)?;
                }
            }
            if !data.is_empty() {
                let p = dst.submit(offset, &data)?;
                writes.push_back((offset, data, p));
            }
        }
        // Retire writes when the window is full, or when no read is left to wait for.
        while !writes.is_empty() && (reads.len() + writes.len() >= window || reads.is_empty()) {
            let (offset, data, p) = writes.pop_front().expect("not empty");
            let mut done = dst.wait(p)?;
            while done < data.len() {
                let p = dst.submit(offset + done as u64, &data[done..])?;
                match dst.wait(p)? {
                    0 => {
                        return Err(Error::new(
                            libc::ENOSPC,
                            format!(
                                "the destination took {} of {} bytes at offset {offset} and then none (out of space?)",
                                done,
                                data.len()
                            ),
                        ))
                    }
                    n => done += n,
                }
            }
            if done > data.len() {
                return Err(Error::new(
                    libc::EIO,
                    format!("a write of {} bytes wrote {done}", data.len()),
                ));
            }
            copied = copied.max(offset + done as u64);
            progress(done as u64);
            src.recycle(data);
        }
        if eof && reads.is_empty() && writes.is_empty() {
            return Ok(copied);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// An in-memory file that answers reads of at most `max_read` bytes and counts what
    /// is outstanding (shared with its sink).
    struct MemSource {
        data: Vec<u8>,
        max_read: usize,
        outstanding: Rc<Cell<usize>>,
        peak: Rc<Cell<usize>>,
        /// Grows by this much (once) when the read at its old end is submitted.
        grow: Vec<u8>,
    }

    impl Source for MemSource {
        type Pending = Vec<u8>;
        fn submit(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
            self.outstanding.set(self.outstanding.get() + 1);
            self.peak.set(self.peak.get().max(self.outstanding.get()));
            if offset as usize >= self.data.len() && !self.grow.is_empty() {
                let g = std::mem::take(&mut self.grow);
                self.data.extend(g);
            }
            let start = (offset as usize).min(self.data.len());
            let end = (start + len.min(self.max_read)).min(self.data.len());
            Ok(self.data[start..end].to_vec())
        }
        fn wait(&mut self, p: Vec<u8>) -> Result<Vec<u8>> {
            self.outstanding.set(self.outstanding.get() - 1);
            Ok(p)
        }
    }

    /// A file that takes at most `max_write` bytes per write and `room` bytes in all.
    struct MemSink {
        data: Vec<u8>,
        max_write: usize,
        room: usize,
        outstanding: Rc<Cell<usize>>,
        peak: Rc<Cell<usize>>,
    }

    impl Sink for MemSink {
        type Pending = usize;
        fn submit(&mut self, offset: u64, data: &[u8]) -> Result<usize> {
            self.outstanding.set(self.outstanding.get() + 1);
            self.peak.set(self.peak.get().max(self.outstanding.get()));
            let end = offset as usize + data.len().min(self.max_write);
            let end = end.min(self.room).max(offset as usize);
            let n = end - offset as usize;
            if self.data.len() < end {
                self.data.resize(end, 0);
            }
            self.data[offset as usize..end].copy_from_slice(&data[..n]);
            Ok(n)
        }
        fn wait(&mut self, n: usize) -> Result<usize> {
            self.outstanding.set(self.outstanding.get() - 1);
            Ok(n)
        }
    }

    fn pair(len: usize, max_read: usize, max_write: usize) -> (MemSource, MemSink) {
        let (o, p) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
        let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 253) as u8).collect();
        (
            MemSource {
                data,
                max_read,
                outstanding: o.clone(),
                peak: p.clone(),
                grow: Vec::new(),
            },
            MemSink {
                data: Vec::new(),
                max_write,
                room: usize::MAX,
                outstanding: o,
                peak: p,
            },
        )
    }

    fn copy(s: &mut MemSource, d: &mut MemSink, hint: u64, chunk: usize, window: usize) -> u64 {
        let mut seen = 0;
        let n = copy_data(s, d, hint, chunk, window, &mut |b| seen += b).unwrap();
        assert_eq!(seen, n, "progress adds up to the bytes copied");
        n
    }

    #[test]
    fn sizes_around_the_window_copy_whole_and_never_exceed_it() {
        let (chunk, window) = (64, 4);
        for len in [
            0,
            1,
            chunk - 1,
            chunk,
            chunk + 1,
            chunk * window - 1,
            chunk * window,
            chunk * window + 1,
            chunk * window * 3 + 7,
        ] {
            let (mut s, mut d) = pair(len, usize::MAX, usize::MAX);
            assert_eq!(copy(&mut s, &mut d, len as u64, chunk, window), len as u64);
            assert_eq!(d.data, s.data, "len {len}");
            assert!(
                s.peak.get() <= window,
                "len {len}: {} in flight",
                s.peak.get()
            );
            if len >= chunk * window {
                assert_eq!(s.peak.get(), window, "len {len}: the window is used");
            }
        }
    }

    #[test]
    fn short_reads_and_short_writes_are_completed() {
        let (mut s, mut d) = pair(10_000, 37, 19);
        assert_eq!(copy(&mut s, &mut d, 10_000, 256, 3), 10_000);
        assert_eq!(d.data, s.data);
    }

    #[test]
    fn a_file_that_shrank_or_grew_is_copied_as_it_is_read() {
        let (mut s, mut d) = pair(1000, usize::MAX, usize::MAX);
        assert_eq!(copy(&mut s, &mut d, 5000, 128, 4), 1000, "shrank");
        assert_eq!(d.data, s.data);
        let (mut s, mut d) = pair(1000, usize::MAX, usize::MAX);
        s.grow = vec![7u8; 700];
        assert_eq!(copy(&mut s, &mut d, 1000, 128, 4), 1700, "grew");
        assert_eq!(d.data, s.data);
    }

    #[test]
    fn a_full_destination_is_enospc() {
        let (mut s, mut d) = pair(1000, usize::MAX, usize::MAX);
        d.room = 300;
        let e = copy_data(&mut s, &mut d, 1000, 128, 4, &mut |_| ()).unwrap_err();
        assert_eq!(e.errno, libc::ENOSPC, "{e}");
        assert!(e.to_string().contains("out of space"), "{e}");
    }

    #[test]
    fn no_chunk_or_no_window_is_refused() {
        let (mut s, mut d) = pair(10, usize::MAX, usize::MAX);
        assert!(copy_data(&mut s, &mut d, 10, 0, 4, &mut |_| ()).is_err());
        assert!(copy_data(&mut s, &mut d, 10, 4, 0, &mut |_| ()).is_err());
    }
}
