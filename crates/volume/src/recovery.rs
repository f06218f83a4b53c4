//! Mount-time recovery: replay the log from the checkpoint to the tail, then rebuild the
//! DRAM state (inodes, maps, directory index, allocators) from the home locations.

use crate::alloc::{BlockAlloc, InodeAlloc};
use crate::dir::{Dir, Entry};
use crate::error::{FsError, Result};
use crate::layout::*;
use crate::map::FileMap;
use crate::volume::{Batch, Inode, LogState, RecoveryReport, State};
use std::collections::{BTreeMap, HashMap, HashSet};
use zcfs_pmem::Region;

/// Replay committed entries in `[head, tail)`, stopping at the first torn or
/// out-of-sequence one; then make the result durable and empty the log.
/// Runs before the volume exists: the region is the caller's alone (`&mut`).
pub(crate) fn replay(region: &mut Region, geo: &Geometry) -> Result<(LogState, RecoveryReport)> {
    let hdr = geo.log_header_off();
    let ring = geo.ring_len();
    let tail = region.read_u64(hdr + TAIL_WORD);
    let head = region.read_u64(hdr + HEAD_WORD);
    if head > tail || tail - head > ring || !head.is_multiple_of(64) || !tail.is_multiple_of(64) {
        return Err(FsError::Corrupt(format!(
            "log words are inconsistent: head {head}, tail {tail}, ring {ring}"
        )));
    }
    let meta_start = geo.itable_start * BLOCK_U64;
    let region_len = geo.total_blocks * BLOCK_U64;
    let mut report = RecoveryReport::default();
    let mut lsn = head;
    let mut seq: Option<u64> = None;
    while lsn < tail {
        let pos = lsn % ring;
        let at = geo.ring_off() + pos as usize;
        let buf = &region.bytes()[at..at + (ring - pos) as usize];
        // `decode` bounds the length by the space left in the ring.
        let advance = buf.len().min(LogEntry::peek_len(buf).unwrap_or(LOG_HDR)) as u64;
        let entry = match LogEntry::decode(buf, region_len) {
            Ok(e) => e,
            Err(e) => {
                report.stopped_early = Some(format!("entry at lsn {lsn}: {e}"));
                break;
            }
        };
        if entry.lsn != lsn || seq.is_some_and(|s| entry.seq != s + 1) {
            report.stopped_early = Some(format!(
                "entry at lsn {lsn} is out of sequence (lsn {}, seq {})",
                entry.lsn, entry.seq
            ));
            break;
        }
        if let Some(r) = entry.records.iter().find(|r| r.addr < meta_start) {
            report.stopped_early = Some(format!(
                "entry at lsn {lsn} writes to {} below the inode table",
                r.addr
            ));
            break;
        }
        for r in &entry.records {
            match &r.data {
                RecData::Bytes(b) => region.store(r.addr as usize, b),
                RecData::Zero(n) => region.store_zero(r.addr as usize, *n as usize),
            }
            region.flush(r.addr as usize, r.len());
            report.records_applied += 1;
        }
        if entry.op != OpType::Pad {
            report.entries_replayed += 1;
        }
        seq = Some(entry.seq);
        lsn += advance;
    }
    if let Some(why) = &report.stopped_early {
        tracing::warn!("log replay stopped before the tail: {why}");
    }
    // Replayed homes durable first, then the log emptied (tail first, so head <= tail
    // holds at every instant; a crash here just replays again).
    region.fence()?;
    if lsn != tail {
        region.write_u64(hdr + TAIL_WORD, lsn);
        region.flush(hdr + TAIL_WORD, 8);
        region.fence()?;
    }
    if head != lsn {
        region.write_u64(hdr + HEAD_WORD, lsn);
        region.flush(hdr + HEAD_WORD, 8);
        region.fence()?;
    }
    Ok((
        LogState {
            head: lsn,
            tail: lsn,
            next: lsn,
            seq: seq.unwrap_or(0),
        },
        report,
    ))
}

fn block(img: &[u8], b: u64) -> &[u8] {
    let o = (b * BLOCK_U64) as usize;
    &img[o..o + BLOCK]
}

fn read_node(img: &[u8], b: u64) -> [u64; PTRS_PER_NODE] {
    let s = block(img, b);
    let mut out = [0u64; PTRS_PER_NODE];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u64_at(s, i * 8..i * 8 + 8);
    }
    out
}

/// Rebuild the DRAM state from the image (after replay). `problem` decides whether a
/// finding is fatal (mount) or collected (fsck); structural impossibilities are always
/// fatal.
pub(crate) fn load_state(
    img: &[u8],
    geo: &Geometry,
    log: LogState,
    problem: &mut dyn FnMut(String) -> Result<()>,
) -> Result<State> {
    let mut balloc = BlockAlloc::new(geo.data_start, geo.data_blocks);
    let mut ialloc = InodeAlloc::default();
    let mut gens = vec![0u32; geo.inode_count as usize];
    let mut inodes: HashMap<u64, Inode> = HashMap::new();
    let mut shared: HashSet<u64> = HashSet::new();
    let mut damaged_xattrs: HashSet<u64> = HashSet::new();
    let is_data = |b: u64| geo.is_data_block(b);
    for ino in 1..=geo.inode_count {
        let bytes = &img[geo.inode_off(ino)..geo.inode_off(ino) + INODE_SIZE];
        let rec = match InodeRec::decode(bytes) {
            Ok(r) => r,
            Err(e) => {
                problem(format!("inode slot {ino}: {e}"))?;
                ialloc.insert(ino);
                continue;
            }
        };
        gens[(ino - 1) as usize] = rec.gen;
        if rec.ino == 0 {
            ialloc.insert(ino);
            continue;
        }
        if rec.ino != ino {
            problem(format!("inode slot {ino} holds inode number {}", rec.ino))?;
            ialloc.insert(ino);
            continue;
        }
        let map = match load_map(img, &rec, &is_data) {
            Ok(m) => m,
            Err(e) => {
                problem(format!("inode {ino}: {e}"))?;
                FileMap::default()
            }
        };
        for b in map.all_blocks() {
            if !balloc.mark_used(b) {
                problem(format!("block {b} of inode {ino} is owned twice"))?;
                shared.insert(b);
            }
        }
        let mut rec = rec;
        let (xattrs, xattr_blocks) = match load_xattrs(img, &mut rec, &is_data, &mut balloc) {
            Ok(loaded) => loaded,
            Err((e, owned)) => {
                problem(format!("inode {ino}: {e}"))?;
                damaged_xattrs.insert(ino);
                (BTreeMap::new(), owned)
            }
        };
        inodes.insert(
            ino,
            Inode {
                rec,
                map,
                xattrs,
                xattr_blocks,
            },
        );
    }
    match inodes.get(&ROOT_INO) {
        Some(r) if r.rec.is_dir() => {}
        _ => {
            return Err(FsError::Corrupt(
                "the root directory (inode 1) is missing".into(),
            ))
        }
    }
    let mut dirs: HashMap<u64, Dir> = HashMap::new();
    let dir_inos: Vec<u64> = inodes
        .iter()
        .filter(|(_, i)| i.rec.is_dir())
        .map(|(&n, _)| n)
        .collect();
    for ino in dir_inos {
        let inode = &inodes[&ino];
        // Every mapped block, also trailing ones left empty, so a new block is never
        // placed over a mapped one. (Bounded by the map, not by the recorded size.)
        let span = inode.map.mapped_end();
        if inode.rec.size != span * BLOCK_U64 {
            problem(format!(
                "directory {ino}: size {} does not match its {span} blocks",
                inode.rec.size
            ))?;
        }
        let mut dir = Dir::with_blocks(span as usize);
        for bi in 0..span {
            let Some(b) = inode.map.get(bi) else {
                problem(format!("directory {ino}: hole at block {bi}"))?;
                dir.mark_full(bi as usize);
                continue;
            };
            let block = block(img, b);
            let mut unit = 0;
            while unit < UNITS_PER_BLOCK {
                match Dirent::decode_at(block, unit) {
                    Ok(None) => unit += 1,
                    Ok(Some((d, units))) => {
                        let pos = (bi as usize * UNITS_PER_BLOCK + unit) as u32;
                        let target_ok = inodes
                            .get(&d.ino)
                            .is_some_and(|t| dtype_of(t.rec.mode) == d.dtype);
                        if !target_ok {
                            problem(format!(
                                "directory {ino}: entry {:?} points to missing or mistyped inode {}",
                                String::from_utf8_lossy(&d.name),
                                d.ino
                            ))?;
                        } else if !dir.insert(
                            &d.name,
                            Entry {
                                ino: d.ino,
                                dtype: d.dtype,
                                pos,
                            },
                        ) {
                            problem(format!(
                                "directory {ino}: duplicate entry {:?}",
                                String::from_utf8_lossy(&d.name)
                            ))?;
                        }
                        unit += units;
                    }
                    Err(e) => {
                        problem(format!("directory {ino} block {bi}: {e}"))?;
                        unit += 1;
                    }
                }
            }
        }
        dirs.insert(ino, dir);
    }
    // Inodes sharing a block (a damaged image, fsck only): freeing either would free
    // the block twice, so repairs leave them alone.
    let mut tainted = HashSet::new();
    if !shared.is_empty() {
        for (&ino, i) in &inodes {
            if i.map.all_blocks().iter().any(|b| shared.contains(b)) {
                tainted.insert(ino);
            }
        }
    }
    // A link count of 0 means "removed while still referenced": such an inode is named
    // by no directory. One that is named (or the root) is damaged, not an orphan.
    let named: HashSet<u64> = dirs
        .values()
        .flat_map(|d| d.iter_from(0).map(|(_, e)| e.ino))
        .collect();
    for (&ino, i) in &inodes {
        if i.rec.nlink == 0 && (ino == ROOT_INO || named.contains(&ino)) {
            problem(format!(
                "inode {ino} is named by a directory but has link count 0"
            ))?;
        }
    }
    let reserved = inodes.values().map(|i| i.rec.cow_reserve).sum();
    Ok(State {
        reserved,
        drawing: HashMap::new(),
        inodes,
        dirs,
        balloc,
        ialloc,
        gens,
        log,
        batch: Batch::default(),
        deferred_frees: Vec::new(),
        deferred_pinned: 0,
        pins: HashMap::new(),
        tainted,
        damaged_xattrs,
        linkable: HashSet::new(),
    })
}

use crate::ops::Xattrs;

/// An inode's xattr set and the blocks holding it, each block marked owned. A head
/// block out of range or owned twice is dropped from the record (it is not the
/// inode's to free); for it, a damaged index or a damaged stream the error comes with
/// the blocks that could be claimed, which stay the inode's (a repair releases them
/// with the set: `State::damaged_xattrs`).
fn load_xattrs(
    img: &[u8],
    rec: &mut InodeRec,
    is_data: &dyn Fn(u64) -> bool,
    balloc: &mut BlockAlloc,
) -> std::result::Result<(Xattrs, Vec<u64>), (FsError, Vec<u64>)> {
    let xb = rec.xattr_block;
    if xb == 0 {
        return Ok((BTreeMap::new(), Vec::new()));
    }
    if !is_data(xb) || !balloc.mark_used(xb) {
        rec.xattr_block = 0;
        return Err((
            FsError::Corrupt(format!("xattr block {xb} is out of range or owned twice")),
            Vec::new(),
        ));
    }
    let mut owned = vec![xb];
    let set = match decode_xattr_head(block(img, xb)) {
        Ok(XattrHead::Single(x)) => Ok(x),
        Ok(XattrHead::Index {
            count,
            used,
            crc,
            blocks,
        }) => {
            let mut bad = None;
            for &b in &blocks {
                if is_data(b) && balloc.mark_used(b) {
                    owned.push(b);
                } else if bad.is_none() {
                    bad = Some(b);
                }
            }
            match bad {
                Some(b) => Err(FsError::Corrupt(format!(
                    "xattr index {xb} lists block {b}, out of range or owned twice"
                ))),
                None => {
                    let mut stream = Vec::with_capacity(blocks.len() * BLOCK);
                    for &b in &blocks {
                        stream.extend_from_slice(block(img, b));
                    }
                    decode_xattr_stream(&stream, count, used, crc)
                }
            }
        }
        Err(e) => Err(e),
    };
    match set {
        Ok(x) => Ok((x, owned)),
        Err(e) => Err((e, owned)),
    }
}

fn load_map(img: &[u8], rec: &InodeRec, is_data: &dyn Fn(u64) -> bool) -> Result<FileMap> {
    // Each node may be visited once: a hostile image with shared or cyclic nodes must
    // not make loading explode.
    let seen = std::cell::RefCell::new(HashSet::new());
    let dup = std::cell::Cell::new(None);
    let map = FileMap::load(
        rec.map_root,
        rec.map_height,
        &|b| {
            if !seen.borrow_mut().insert(b) {
                dup.set(Some(b));
                return [0; PTRS_PER_NODE];
            }
            read_node(img, b)
        },
        is_data,
    )?;
    if let Some(b) = dup.get() {
        return Err(FsError::Corrupt(format!(
            "map node {b} is referenced twice"
        )));
    }
    Ok(map)
}
