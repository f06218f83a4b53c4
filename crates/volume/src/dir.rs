//! DRAM index of one directory: name -> entry, position -> name, and free space in its
//! blocks. Rebuilt at mount from the directory blocks.
//!
//! A position is `block_index * 128 + unit`; it is stable while the entry lives, so it
//! serves as the readdir cookie.

use crate::layout::{dirent_units, UNITS_PER_BLOCK};
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub ino: u64,
    pub dtype: u8,
    pub pos: u32,
}

#[derive(Debug, Clone)]
pub struct Dir {
    by_name: HashMap<Box<[u8]>, Entry>,
    by_pos: BTreeMap<u32, Box<[u8]>>,
    /// Per directory block: bit set = unit used.
    used: Vec<u128>,
    /// Lowest block that may have room (hint).
    hint: usize,
    /// Counts every change of the name set (an entry added, removed or pointed at
    /// another inode) by one, from a start that differs between openings of the
    /// volume: a client that knows every name of the directory at one version and sees
    /// the version one higher after its own change knows no one else changed it
    /// (NFSv4's change attribute, for names only). Kept in DRAM only.
    version: u64,
}

impl Default for Dir {
    fn default() -> Dir {
        Dir {
            by_name: HashMap::new(),
            by_pos: BTreeMap::new(),
            used: Vec::new(),
            hint: 0,
            version: version_base(),
        }
    }
}

/// Where the versions of this process's directories start: a value from the clock and
/// the process id, so a version seen before a restart is not met again by chance after
/// it (clients also forget what they knew with the session).
fn version_base() -> u64 {
    static BASE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        // Leave room below 2^63 for the counts.
        (t ^ u64::from(std::process::id()).rotate_left(32)) >> 2
    })
}

fn run_mask(unit: usize, units: usize) -> u128 {
    let m = if units == 128 {
        u128::MAX
    } else {
        (1u128 << units) - 1
    };
    m << unit
}

impl Dir {
    /// An index over `blocks` directory blocks (entries are added with `insert`).
    /// Knowing every block, also trailing ones left empty, keeps a new block from being
    /// placed over a mapped one.
    pub fn with_blocks(blocks: usize) -> Dir {
        Dir {
            used: vec![0; blocks],
            ..Dir::default()
        }
    }

    /// Never place entries in block `bi` (a hole in a damaged directory).
    pub fn mark_full(&mut self, bi: usize) {
        self.used[bi] = u128::MAX;
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }
    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
    pub fn blocks(&self) -> usize {
        self.used.len()
    }
    pub fn get(&self, name: &[u8]) -> Option<Entry> {
        self.by_name.get(name).copied()
    }
    /// The count of name-set changes (see the field).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Record an entry found at mount (or placed by `place`).
    pub fn insert(&mut self, name: &[u8], e: Entry) -> bool {
        let (blk, unit) = (
            e.pos as usize / UNITS_PER_BLOCK,
            e.pos as usize % UNITS_PER_BLOCK,
        );
        while self.used.len() <= blk {
            self.used.push(0);
        }
        let m = run_mask(unit, dirent_units(name.len()));
        if self.used[blk] & m != 0 || self.by_name.contains_key(name) {
            return false;
        }
        self.used[blk] |= m;
        self.by_pos.insert(e.pos, name.into());
        self.by_name.insert(name.into(), e);
        self.version += 1;
        true
    }

    pub fn remove(&mut self, name: &[u8]) -> Option<Entry> {
        let e = self.by_name.remove(name)?;
        self.by_pos.remove(&e.pos);
        let (blk, unit) = (
            e.pos as usize / UNITS_PER_BLOCK,
            e.pos as usize % UNITS_PER_BLOCK,
        );
        self.used[blk] &= !run_mask(unit, dirent_units(name.len()));
        self.hint = self.hint.min(blk);
        self.version += 1;
        Some(e)
    }

    /// Change the inode an entry points to (rename over / exchange), keeping its place.
    pub fn retarget(&mut self, name: &[u8], ino: u64, dtype: u8) -> Option<Entry> {
        let e = self.by_name.get_mut(name)?;
        e.ino = ino;
        e.dtype = dtype;
        self.version += 1;
        Some(*e)
    }

    /// Find room for a name: Some(pos) in an existing block, or None when a new block is
    /// needed (its position is then `blocks() * 128`).
    pub fn find_room(&mut self, name_len: usize) -> Option<u32> {
        let units = dirent_units(name_len);
        for blk in self.hint..self.used.len() {
            let used = self.used[blk];
            if used == u128::MAX {
                if blk == self.hint {
                    self.hint += 1;
                }
                continue;
            }
            let mut unit = 0;
            while unit + units <= UNITS_PER_BLOCK {
                let m = run_mask(unit, units);
                if used & m == 0 {
                    return Some((blk * UNITS_PER_BLOCK + unit) as u32);
                }
                // Skip past the highest used unit inside the window.
                let clash = used & m;
                unit = 128 - clash.leading_zeros() as usize;
            }
        }
        None
    }

    /// Entries with position >= `from`, in position order.
    pub fn iter_from(&self, from: u32) -> impl Iterator<Item = (&[u8], Entry)> + '_ {
        self.by_pos
            .range(from..)
            .map(move |(_, name)| (&name[..], self.by_name[name]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_remove_reuse() {
        let mut d = Dir::default();
        assert_eq!(d.find_room(10), None);
        for i in 0..200u32 {
            let name = format!("file-{i:05}");
            let pos = d.find_room(name.len()).unwrap_or(d.blocks() as u32 * 128);
            assert!(d.insert(
                name.as_bytes(),
                Entry {
                    ino: i as u64 + 2,
                    dtype: 8,
                    pos
                }
            ));
        }
        assert_eq!(d.len(), 200);
        assert_eq!(d.blocks(), 2); // 26-byte entries take one unit each, 128 per block
        let e = d.remove(b"file-00005").unwrap();
        assert_eq!(d.find_room(10), Some(e.pos));
        assert!(!d.insert(
            b"file-00006",
            Entry {
                ino: 9,
                dtype: 8,
                pos: e.pos
            }
        ));
        let names: Vec<_> = d.iter_from(0).map(|(n, _)| n.to_vec()).collect();
        assert_eq!(names.len(), 199);
        let long = vec![b'x'; 255];
        let pos = d.find_room(255).unwrap();
        assert!(d.insert(
            &long,
            Entry {
                ino: 1,
                dtype: 8,
                pos
            }
        ));
    }

    #[test]
    fn every_change_of_the_name_set_counts_one_and_nothing_else_counts() {
        let mut d = Dir::default();
        let v0 = d.version();
        let e = |ino, pos| Entry { ino, dtype: 8, pos };
        assert!(d.insert(b"a", e(2, 0)));
        assert_eq!(d.version(), v0 + 1);
        // Refused: a name taken, a place taken.
        assert!(!d.insert(b"a", e(3, 1)));
        assert!(!d.insert(b"b", e(3, 0)));
        assert_eq!(d.version(), v0 + 1);
        assert!(d.retarget(b"a", 4, 8).is_some());
        assert!(d.retarget(b"missing", 4, 8).is_none());
        assert_eq!(d.version(), v0 + 2);
        assert!(d.remove(b"missing").is_none());
        assert!(d.remove(b"a").is_some());
        assert_eq!(d.version(), v0 + 3);
        // Looking does not count.
        let _ = (d.get(b"a"), d.find_room(1), d.len());
        assert_eq!(d.version(), v0 + 3);
    }
}
