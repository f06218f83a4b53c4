//! A file's block map: a radix tree of 512-pointer nodes on PM, mirrored in DRAM.
//!
//! Height 0: the root pointer is the data block of file block 0 (files up to 4 KiB need
//! no node). Height h >= 1: the root is a node at level h; level-1 nodes point at data
//! blocks; 0 is a hole. The DRAM mirror answers lookups; every change to an existing PM
//! node goes through [`MapSink`] as a redo record, new nodes are zero-filled directly.

use crate::error::{FsError, Result};
use crate::layout::{BLOCK_U64, NODE_SHIFT, PTRS_PER_NODE, REC_HDR};
use std::collections::BTreeMap;

pub const MAX_HEIGHT: u8 = 6;

/// Where the map's PM side effects go (the transaction being built).
pub trait MapSink {
    /// A fresh node block, already zero-filled and written back on PM. Taken from blocks
    /// reserved before the operation started (see [`FileMap::plan_set`]), so it cannot fail.
    fn new_node(&mut self) -> u64;
    /// Redo record: pointer `slot` of `node` becomes `val`.
    fn set_ptr(&mut self, node: u64, slot: usize, val: u64);
    /// Redo record: pointers `slot..slot+n` of `node` become 0.
    fn zero_ptrs(&mut self, node: u64, slot: usize, n: usize);
    /// A block (data or node) no longer referenced once this transaction commits.
    fn release(&mut self, block: u64);
}

/// What setting a range of file blocks will take, worked out before anything changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SetPlan {
    /// Node blocks the change allocates (new levels on top, new interior nodes, leaves).
    pub new_nodes: u64,
    /// Leaves whose pointers change (each costs one redo record).
    pub leaves: u64,
}

impl SetPlan {
    /// Upper bound on the redo-record bytes of the map changes (headers included), for
    /// `blocks` data pointers. A new node costs one pointer record in its parent (or, for
    /// a new top level, one for the old root), a leaf one record holding its pointers.
    pub fn record_bytes(&self, blocks: u64) -> u64 {
        (REC_HDR as u64 + 8) * self.new_nodes + REC_HDR as u64 * self.leaves + 8 * blocks
    }
}

#[derive(Debug, Clone)]
struct Node {
    block: u64,
    ptrs: Box<[u64; PTRS_PER_NODE]>,
    live: u16,
}

impl Node {
    fn new(block: u64) -> Node {
        Node {
            block,
            ptrs: Box::new([0; PTRS_PER_NODE]),
            live: 0,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct FileMap {
    pub height: u8,
    pub root: u64,
    /// (level, index) -> node. Index of the node at level l holding file block fb is
    /// fb >> (9 * l).
    nodes: BTreeMap<(u8, u64), Node>,
    data_blocks: u64,
}

fn covers(height: u8, fb: u64) -> bool {
    match height {
        0 => fb == 0,
        h => (h as u32 * NODE_SHIFT) >= 64 || fb >> (h as u32 * NODE_SHIFT) == 0,
    }
}

fn slot(level: u8, fb: u64) -> usize {
    ((fb >> ((level as u32 - 1) * NODE_SHIFT)) & (PTRS_PER_NODE as u64 - 1)) as usize
}

fn idx(level: u8, fb: u64) -> u64 {
    fb.checked_shr(level as u32 * NODE_SHIFT).unwrap_or(0)
}

impl FileMap {
    /// Blocks owned: data blocks plus node blocks.
    pub fn owned_blocks(&self) -> u64 {
        self.data_blocks + self.nodes.len() as u64
    }

    pub fn get(&self, fb: u64) -> Option<u64> {
        if !covers(self.height, fb) {
            return None;
        }
        if self.height == 0 {
            return (self.root != 0).then_some(self.root);
        }
        let leaf = self.nodes.get(&(1, idx(1, fb)))?;
        let p = leaf.ptrs[slot(1, fb)];
        (p != 0).then_some(p)
    }

    /// Call `f(fb, block)` for file blocks `fb0..fb0+n` (None = hole), one leaf lookup
    /// per 512 blocks.
    pub fn for_range(&self, fb0: u64, n: u64, mut f: impl FnMut(u64, Option<u64>)) {
        let mut fb = fb0;
        let end = fb0 + n;
        while fb < end {
            if self.height == 0 {
                f(
                    fb,
                    if fb == 0 && self.root != 0 {
                        Some(self.root)
                    } else {
                        None
                    },
                );
                fb += 1;
                continue;
            }
            let leaf = if covers(self.height, fb) {
                self.nodes.get(&(1, idx(1, fb)))
            } else {
                None
            };
            let leaf_end = ((fb >> NODE_SHIFT) + 1) << NODE_SHIFT;
            while fb < end.min(leaf_end) {
                let p = leaf.map_or(0, |l| l.ptrs[slot(1, fb)]);
                f(fb, (p != 0).then_some(p));
                fb += 1;
            }
        }
    }

    /// Height a map needs to hold file block `fb`.
    fn height_for(fb: u64) -> u8 {
        let mut h = 0u8;
        while !covers(h, fb) {
            h += 1;
        }
        h
    }

    /// What pointing file blocks `fb0..fb0+n` at (new) blocks will take: nodes to
    /// allocate and leaves to change. Exact for the map as it is now.
    pub fn plan_set(&self, fb0: u64, n: u64) -> SetPlan {
        if n == 0 {
            return SetPlan::default();
        }
        let last = fb0 + n - 1;
        let target = self.height.max(Self::height_for(last));
        if target == 0 {
            return SetPlan::default(); // only block 0, held by the root pointer itself
        }
        let mut plan = SetPlan {
            // Growing from height h to h' allocates the nodes (l, 0) for l in h+1..=h'.
            new_nodes: (target - self.height) as u64,
            leaves: idx(1, last) - idx(1, fb0) + 1,
        };
        for level in 1..target {
            let (a, b) = (idx(level, fb0), idx(level, last));
            let existing = self.nodes.range((level, a)..=(level, b)).count() as u64;
            // Node (level, 0) appears with a new top level when it does not exist yet.
            let from_grow = (level > self.height && a == 0) as u64;
            plan.new_nodes += (b - a + 1) - existing - from_grow;
        }
        plan
    }

    /// Point file block `fb` at `block` (non-zero). Returns the block it replaces. The
    /// nodes it needs come from `sink.new_node` (reserved beforehand from `plan_set`).
    pub fn set(&mut self, fb: u64, block: u64, sink: &mut dyn MapSink) -> Option<u64> {
        debug_assert!(block != 0);
        while !covers(self.height, fb) {
            self.grow(sink);
        }
        if self.height == 0 {
            let old = std::mem::replace(&mut self.root, block);
            if old == 0 {
                self.data_blocks += 1;
            }
            return (old != 0).then_some(old);
        }
        let mut level = self.height;
        let mut node_block = self.root;
        while level > 1 {
            let s = slot(level, fb);
            let child_key = (level - 1, idx(level - 1, fb));
            let parent = self
                .nodes
                .get_mut(&(level, idx(level, fb)))
                .expect("map node missing");
            if parent.ptrs[s] == 0 {
                let nb = sink.new_node();
                parent.ptrs[s] = nb;
                parent.live += 1;
                sink.set_ptr(node_block, s, nb);
                self.nodes.insert(child_key, Node::new(nb));
            }
            node_block = self.nodes[&child_key].block;
            level -= 1;
        }
        let leaf = self.nodes.get_mut(&(1, idx(1, fb))).expect("leaf missing");
        let s = slot(1, fb);
        let old = std::mem::replace(&mut leaf.ptrs[s], block);
        if old == 0 {
            leaf.live += 1;
            self.data_blocks += 1;
        }
        sink.set_ptr(leaf.block, s, block);
        (old != 0).then_some(old)
    }

    fn grow(&mut self, sink: &mut dyn MapSink) {
        assert!(
            self.height < MAX_HEIGHT,
            "file block beyond the map's reach"
        );
        let nb = sink.new_node();
        let mut node = Node::new(nb);
        if self.root != 0 {
            node.ptrs[0] = self.root;
            node.live = 1;
            sink.set_ptr(nb, 0, self.root);
        }
        self.height += 1;
        self.root = nb;
        self.nodes.insert((self.height, 0), node);
    }

    /// Unmap file blocks `from..` (to the end of the file), releasing data blocks and
    /// every node left empty. Truncating to 0 returns the map to height 0 and needs no
    /// redo record at all: the inode record's root pointer is the only reference.
    pub fn truncate_blocks(&mut self, from: u64, sink: &mut dyn MapSink) {
        if from == 0 {
            self.clear(sink);
        } else {
            self.punch(from, u64::MAX, sink);
        }
    }

    /// Release every block of the map (no records: nothing will point at them).
    pub fn clear(&mut self, sink: &mut dyn MapSink) {
        for b in self.all_blocks() {
            sink.release(b);
        }
        *self = FileMap::default();
    }

    /// Unmap file blocks in `from..to`, releasing data blocks and emptied nodes.
    ///
    /// Only the nodes that straddle an end of the range survive with changes, at most
    /// two per level, and each gets one redo record zeroing one contiguous run of
    /// slots; nodes wholly inside the range are released without records (nothing
    /// points at them once their parent's slot is zero). So a punch or truncate costs at
    /// most `2 * MAX_HEIGHT` records however large the file.
    pub fn punch(&mut self, from: u64, to: u64, sink: &mut dyn MapSink) {
        if from >= to {
            return;
        }
        if self.height == 0 {
            if from == 0 && self.root != 0 {
                sink.release(self.root);
                self.root = 0;
                self.data_blocks -= 1;
            }
            return;
        }
        if self.punch_node(self.height, 0, from, to, sink) {
            // Nothing is left: drop the root too and go back to height 0.
            let root = self.nodes.remove(&(self.height, 0)).expect("root node");
            sink.release(root.block);
            self.height = 0;
            self.root = 0;
        }
    }

    /// Most redo records one `punch` can produce.
    pub const PUNCH_MAX_RECORDS: u64 = 2 * MAX_HEIGHT as u64;

    /// Unmap `from..to` below node (level, i). Returns whether the node is left empty;
    /// an empty node gets no record (its parent drops it), a non-empty one gets one.
    fn punch_node(
        &mut self,
        level: u8,
        i: u64,
        from: u64,
        to: u64,
        sink: &mut dyn MapSink,
    ) -> bool {
        let span = 1u64 << ((level as u32 - 1) * NODE_SHIFT);
        let start = i << (level as u32 * NODE_SHIFT);
        let end = start.saturating_add(span * PTRS_PER_NODE as u64);
        let (lo, hi) = (from.max(start), to.min(end));
        let node = &self.nodes[&(level, i)];
        if lo >= hi {
            return node.live == 0;
        }
        let (s0, s1) = (
            ((lo - start) / span) as usize,
            ((hi - 1 - start) / span) as usize,
        );
        let ptrs: Vec<u64> = node.ptrs[s0..=s1].to_vec();
        let block = node.block;
        let mut cleared: Vec<usize> = Vec::new();
        for (k, &p) in ptrs.iter().enumerate() {
            if p == 0 {
                continue;
            }
            let s = s0 + k;
            let child = (i << NODE_SHIFT) + s as u64;
            let (cs, ce) = (start + s as u64 * span, start + (s as u64 + 1) * span);
            let gone = if level == 1 {
                sink.release(p);
                self.data_blocks -= 1;
                true
            } else if cs >= from && ce <= to {
                self.release_subtree(level - 1, child, sink);
                true
            } else if self.punch_node(level - 1, child, from, to, sink) {
                let n = self.nodes.remove(&(level - 1, child)).expect("child node");
                sink.release(n.block);
                true
            } else {
                false
            };
            if gone {
                cleared.push(s);
            }
        }
        let node = self.nodes.get_mut(&(level, i)).expect("node");
        for &s in &cleared {
            node.ptrs[s] = 0;
        }
        node.live -= cleared.len() as u16;
        let empty = node.live == 0;
        if let (false, Some(&a), Some(&b)) = (empty, cleared.first(), cleared.last()) {
            // Slots between a and b are cleared or were holes: one contiguous record.
            sink.zero_ptrs(block, a, b - a + 1);
        }
        empty
    }

    /// Release node (level, i), everything below it, and the data blocks it reaches.
    fn release_subtree(&mut self, level: u8, i: u64, sink: &mut dyn MapSink) {
        for l in (1..=level).rev() {
            let shift = (level - l) as u32 * NODE_SHIFT;
            let (a, b) = (i << shift, ((i + 1) << shift) - 1);
            let keys: Vec<(u8, u64)> = self.nodes.range((l, a)..=(l, b)).map(|(k, _)| *k).collect();
            for k in keys {
                let n = self.nodes.remove(&k).expect("node");
                if l == 1 {
                    for &p in n.ptrs.iter().filter(|&&p| p != 0) {
                        sink.release(p);
                        self.data_blocks -= 1;
                    }
                }
                sink.release(n.block);
            }
        }
    }

    /// Every block the map owns: node blocks and the data blocks leaves point at
    /// (interior pointers name nodes, which are listed once as nodes).
    pub fn all_blocks(&self) -> Vec<u64> {
        let mut v = Vec::with_capacity(self.owned_blocks() as usize);
        if self.height == 0 && self.root != 0 {
            v.push(self.root);
        }
        for (&(level, _), n) in &self.nodes {
            v.push(n.block);
            if level == 1 {
                v.extend(n.ptrs.iter().copied().filter(|&p| p != 0));
            }
        }
        v
    }

    /// Data blocks (not nodes) the map points at.
    pub fn data_blocks(&self) -> u64 {
        self.data_blocks
    }

    /// The first mapped file block at or after `fb` (SEEK_DATA), visiting only the
    /// leaves that exist.
    pub fn next_data(&self, fb: u64) -> Option<u64> {
        if self.height == 0 {
            return (fb == 0 && self.root != 0).then_some(0);
        }
        for (&(_, i), n) in self.nodes.range((1, idx(1, fb))..=(1, u64::MAX)) {
            let from = if i == idx(1, fb) { slot(1, fb) } else { 0 };
            if let Some(s) = n.ptrs[from..].iter().position(|&p| p != 0) {
                return Some((i << NODE_SHIFT) + (from + s) as u64);
            }
        }
        None
    }

    /// The first unmapped file block at or after `fb` (SEEK_HOLE).
    pub fn next_hole(&self, fb: u64) -> u64 {
        if self.height == 0 {
            return if fb == 0 && self.root != 0 { 1 } else { fb };
        }
        let mut fb = fb;
        // Each round either returns or moves to the next leaf, which must exist to
        // hold data: bounded by the number of leaves.
        for _ in 0..=self.nodes.len() {
            if self.get(fb).is_none() {
                return fb;
            }
            let leaf = &self.nodes[&(1, idx(1, fb))];
            let from = slot(1, fb);
            if let Some(s) = leaf.ptrs[from..].iter().position(|&p| p == 0) {
                return fb - from as u64 + (from + s) as u64;
            }
            fb = (idx(1, fb) + 1) << NODE_SHIFT;
        }
        fb
    }

    /// Highest mapped file block + 1 (0 when empty).
    pub fn mapped_end(&self) -> u64 {
        if self.height == 0 {
            return (self.root != 0) as u64;
        }
        self.nodes
            .range((1, 0)..=(1, u64::MAX))
            .next_back()
            .and_then(|(&(_, i), n)| {
                n.ptrs
                    .iter()
                    .rposition(|&p| p != 0)
                    .map(|s| (i << NODE_SHIFT) + s as u64 + 1)
            })
            .unwrap_or(0)
    }

    /// Rebuild from PM. `read_node` returns a node block's 512 pointers; `is_data`
    /// validates a pointer. Fails on out-of-range or repeated pointers within the map.
    pub fn load(
        root: u64,
        height: u8,
        read_node: &dyn Fn(u64) -> [u64; PTRS_PER_NODE],
        is_data: &dyn Fn(u64) -> bool,
    ) -> Result<FileMap> {
        let mut m = FileMap {
            height,
            root,
            ..Default::default()
        };
        if height > MAX_HEIGHT {
            return Err(FsError::Corrupt(format!("map height {height}")));
        }
        if root == 0 {
            if height != 0 {
                return Err(FsError::Corrupt("map of height > 0 without a root".into()));
            }
            return Ok(m);
        }
        if !is_data(root) {
            return Err(FsError::Corrupt(format!(
                "map root {root} outside the data area"
            )));
        }
        if height == 0 {
            m.data_blocks = 1;
            return Ok(m);
        }
        let mut stack = vec![(height, 0u64, root)];
        while let Some((level, i, block)) = stack.pop() {
            let ptrs = read_node(block);
            let mut node = Node::new(block);
            for (s, &p) in ptrs.iter().enumerate() {
                if p == 0 {
                    continue;
                }
                if !is_data(p) {
                    return Err(FsError::Corrupt(format!(
                        "map node {block} slot {s} points outside the data area ({p})"
                    )));
                }
                node.ptrs[s] = p;
                node.live += 1;
                if level > 1 {
                    stack.push((level - 1, (i << NODE_SHIFT) + s as u64, p));
                } else {
                    m.data_blocks += 1;
                }
            }
            m.nodes.insert((level, i), node);
        }
        Ok(m)
    }

    /// Byte address of a node's pointer slot.
    pub fn ptr_addr(node: u64, slot: usize) -> u64 {
        node * BLOCK_U64 + slot as u64 * 8
    }
}
