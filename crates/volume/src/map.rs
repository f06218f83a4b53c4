//! A file's block map: a radix tree of 512-pointer nodes on PM, mirrored in DRAM.
//!
//! Height 0: the root pointer is the data block of file block 0 (files up to 4 KiB need
//! no node). Height h >= 1: the root is a node at level h; level-1 nodes point at data
//! blocks; 0 is a hole. The DRAM mirror answers lookups; every change to an existing PM
//! node goes through [`MapSink`] as a redo record, new nodes are zero-filled directly.

use crate::error::{FsError, Result};
use crate::layout::{BLOCK_U64, NODE_SHIFT, PTRS_PER_NODE};
use std::collections::BTreeMap;

pub const MAX_HEIGHT: u8 = 6;

/// Where the map's PM side effects go (the transaction being built).
pub trait MapSink {
    /// A fresh node block, already zero-filled and written back on PM.
    fn new_node(&mut self) -> Result<u64>;
    /// Redo record: pointer `slot` of `node` becomes `val`.
    fn set_ptr(&mut self, node: u64, slot: usize, val: u64);
    /// Redo record: pointers `slot..slot+n` of `node` become 0.
    fn zero_ptrs(&mut self, node: u64, slot: usize, n: usize);
    /// A block (data or node) no longer referenced once this transaction commits.
    fn release(&mut self, block: u64);
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

    /// Point file block `fb` at `block` (non-zero). Returns the block it replaces.
    pub fn set(&mut self, fb: u64, block: u64, sink: &mut dyn MapSink) -> Result<Option<u64>> {
        debug_assert!(block != 0);
        while !covers(self.height, fb) {
            self.grow(sink)?;
        }
        if self.height == 0 {
            let old = std::mem::replace(&mut self.root, block);
            if old == 0 {
                self.data_blocks += 1;
            }
            return Ok((old != 0).then_some(old));
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
                let nb = sink.new_node()?;
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
        Ok((old != 0).then_some(old))
    }

    fn grow(&mut self, sink: &mut dyn MapSink) -> Result<()> {
        if self.height >= MAX_HEIGHT {
            return Err(FsError::TooBig);
        }
        let nb = sink.new_node()?;
        let mut node = Node::new(nb);
        if self.root != 0 {
            node.ptrs[0] = self.root;
            node.live = 1;
            sink.set_ptr(nb, 0, self.root);
        }
        self.height += 1;
        self.root = nb;
        self.nodes.insert((self.height, 0), node);
        Ok(())
    }

    /// Unmap file blocks `from..` (to the end of the file), releasing data blocks and
    /// every node left empty. Truncating to 0 returns the map to height 0.
    pub fn truncate_blocks(&mut self, from: u64, sink: &mut dyn MapSink) {
        self.punch(from, u64::MAX, sink);
        if from == 0 && self.height > 0 {
            // Only the empty root can be left: drop it too.
            for (_, n) in std::mem::take(&mut self.nodes) {
                sink.release(n.block);
            }
            self.height = 0;
            self.root = 0;
        }
    }

    /// Unmap file blocks in `from..to`, releasing data blocks and emptied nodes.
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
        let leaves: Vec<u64> = self
            .nodes
            .range((1, idx(1, from))..=(1, idx(1, to - 1)))
            .map(|(&(_, i), _)| i)
            .collect();
        for li in leaves {
            let lo = (li << NODE_SHIFT).max(from);
            let hi = ((li + 1) << NODE_SHIFT).min(to);
            let leaf = self.nodes.get_mut(&(1, li)).unwrap();
            let (s0, s1) = (slot(1, lo), slot(1, hi - 1) + 1);
            let mut cleared = 0;
            for p in &mut leaf.ptrs[s0..s1] {
                if *p != 0 {
                    sink.release(*p);
                    *p = 0;
                    cleared += 1;
                }
            }
            if cleared == 0 {
                continue;
            }
            leaf.live -= cleared;
            self.data_blocks -= cleared as u64;
            if leaf.live > 0 || self.height == 1 {
                sink.zero_ptrs(leaf.block, s0, s1 - s0);
            } else {
                self.drop_empty(1, li, sink);
            }
        }
    }

    /// Node (level, i) is empty and not the root: free it and unhook it from its parent,
    /// recursively upward.
    fn drop_empty(&mut self, level: u8, i: u64, sink: &mut dyn MapSink) {
        let node = self.nodes.remove(&(level, i)).unwrap();
        sink.release(node.block);
        let plevel = level + 1;
        let pi = i >> NODE_SHIFT;
        let s = (i & (PTRS_PER_NODE as u64 - 1)) as usize;
        let parent = self
            .nodes
            .get_mut(&(plevel, pi))
            .expect("parent node missing");
        parent.ptrs[s] = 0;
        parent.live -= 1;
        if parent.live > 0 || plevel == self.height {
            sink.zero_ptrs(parent.block, s, 1);
        } else {
            self.drop_empty(plevel, pi, sink);
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
