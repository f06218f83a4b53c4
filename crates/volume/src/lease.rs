//! Owned forms (holding an `Arc<Volume>`) of a read pin and of FLAC's page buffer, for
//! holders that outlive any borrow of the volume: the same-host interface
//! (zcfs-samehost) lends an application the blocks of a file it maps read-only
//! ([`Lease`]) and fresh blocks it fills through its own mapping ([`OwnedPages`]),
//! across many requests on its ring.

use crate::data::{check_file, Run};
use crate::error::{FsError, Result};
use crate::flac::PageBuf;
use crate::layout::{BLOCK, BLOCK_U64};
use crate::pm::FreshBlock;
use crate::volume::Volume;
use std::sync::Arc;

/// One extent of a [`Lease`]: `len` bytes of the file from `file_offset`, at byte
/// `image_offset` of the volume image (physically contiguous), or a hole (reads as
/// zeros; `image_offset` is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file_offset: u64,
    pub image_offset: u64,
    pub len: u64,
    pub hole: bool,
}

/// The blocks holding a range of a file, pinned: no overwrite, truncate or checkpoint
/// reuses them until the lease drops (it pins as a reader does, see pins.rs), so the
/// bytes at its extents stay the file's bytes as they were when it was taken.
#[must_use = "the lease ends when dropped"]
pub struct Lease {
    vol: Arc<Volume>,
    id: u64,
    extents: Vec<Extent>,
    blocks: u64,
}

impl Lease {
    /// The extents, in file order; they cover the range up to the end of the file.
    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }
    /// Data blocks pinned (holes pin nothing).
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
    /// Bytes covered (short of the range asked for at the end of the file).
    pub fn bytes(&self) -> u64 {
        self.extents.iter().map(|e| e.len).sum()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.vol.readers.unpin(self.id);
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("extents", &self.extents)
            .field("blocks", &self.blocks)
            .finish()
    }
}

/// Fresh zeroed blocks for a caller to fill through its own mapping of the image, then
/// place with [`OwnedPages::into_page_buf`] and `pflush_add`/`pflush_commit`; given back
/// to the allocator when dropped unplaced.
pub struct OwnedPages {
    vol: Arc<Volume>,
    blocks: Vec<FreshBlock>,
}

impl OwnedPages {
    pub fn pages(&self) -> usize {
        self.blocks.len()
    }
    /// Byte offset in the volume image of each page, in order.
    pub fn image_offsets(&self) -> Vec<u64> {
        self.blocks.iter().map(|b| b.no().0 * BLOCK_U64).collect()
    }
    /// The pages as a [`PageBuf`] of `vol` (which must be the volume they came from).
    pub fn into_page_buf(mut self, vol: &Volume) -> Result<PageBuf<'_>> {
        if !std::ptr::eq(Arc::as_ptr(&self.vol), vol) {
            return Err(FsError::Invalid("pages reserved on another volume".into()));
        }
        Ok(PageBuf {
            vol,
            blocks: std::mem::take(&mut self.blocks),
        })
    }
}

impl Drop for OwnedPages {
    fn drop(&mut self) {
        self.vol.give_back(std::mem::take(&mut self.blocks));
    }
}

impl Volume {
    /// Lease the blocks of `[off, off+len)` of a regular file (see [`Lease`]). The
    /// extents stop at the end of the file.
    pub fn lease(self: &Arc<Self>, ino: u64, off: u64, len: usize) -> Result<Lease> {
        let st = self.read_state();
        check_file(&st, ino)?;
        let runs = self.data_runs(&st, ino, off, len)?;
        let mut extents: Vec<Extent> = Vec::with_capacity(runs.len());
        let mut pins = Vec::new();
        let mut at = off;
        for r in runs {
            let (image_offset, n, hole) = match r {
                Run::Data(b, a, n) => {
                    pins.push((b.0, b.0 + (a + n).div_ceil(BLOCK) as u64));
                    (b.at(a as u64).0, n as u64, false)
                }
                Run::Hole(_, n) => (0, n as u64, true),
            };
            match extents.last_mut() {
                Some(e) if hole && e.hole => e.len += n,
                _ => extents.push(Extent {
                    file_offset: at,
                    image_offset,
                    len: n,
                    hole,
                }),
            }
            at += n;
        }
        let blocks = pins.iter().map(|(s, e)| e - s).sum();
        // Pinned under the read lock the lookup ran under (pins.rs).
        let id = self.readers.pin_detached(pins);
        drop(st);
        Ok(Lease {
            vol: self.clone(),
            id,
            extents,
            blocks,
        })
    }

    /// FLAC `reserve_pages`, owned: the pages outlive any borrow of the volume.
    pub fn reserve_pages_owned(self: &Arc<Self>, n: usize) -> Result<OwnedPages> {
        let mut p = self.reserve_pages(n)?;
        Ok(OwnedPages {
            vol: self.clone(),
            blocks: std::mem::take(&mut p.blocks),
        })
    }
}
