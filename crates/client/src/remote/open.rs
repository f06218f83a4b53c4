//! The files a RemoteFs has open: by handle, with an index by inode, so what a close
//! or an unlink asks of an inode's handles costs as many steps as it has handles, not
//! as many as the mount has open files.

use super::OpenFile;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

#[derive(Default)]
pub(super) struct OpenFiles {
    by_fh: HashMap<u64, OpenFile>,
    /// The handles of each inode with any (never an empty list).
    by_ino: HashMap<u64, Vec<u64>>,
    /// Files closed while their re-open was owed: that re-open may have run on the
    /// server (its reply lost), so the restart hook sends it again with its id and
    /// releases the handle the reply cache gives back (review 32d: it leaked).
    pub(super) orphans: Vec<OrphanReopen>,
}

/// A re-open owed for a file closed since (`OpenFiles::orphans`).
pub(super) struct OrphanReopen {
    pub ino: u64,
    pub gen: u64,
    pub flags: i32,
    pub opener: super::Opener,
    /// The request id of the re-open that may have run.
    pub id: u64,
}

impl OpenFiles {
    pub(super) fn insert(&mut self, fh: u64, f: OpenFile) {
        let ino = f.ino;
        if let Some(old) = self.by_fh.insert(fh, f) {
            self.unindex(old.ino, fh);
        }
        self.by_ino.entry(ino).or_default().push(fh);
    }

    pub(super) fn remove(&mut self, fh: u64) -> Option<OpenFile> {
        let f = self.by_fh.remove(&fh)?;
        self.unindex(f.ino, fh);
        Some(f)
    }

    fn unindex(&mut self, ino: u64, fh: u64) {
        if let Entry::Occupied(mut e) = self.by_ino.entry(ino) {
            e.get_mut().retain(|h| *h != fh);
            if e.get().is_empty() {
                e.remove();
            }
        }
    }

    pub(super) fn get(&self, fh: u64) -> Option<&OpenFile> {
        self.by_fh.get(&fh)
    }

    pub(super) fn get_mut(&mut self, fh: u64) -> Option<&mut OpenFile> {
        self.by_fh.get_mut(&fh)
    }

    pub(super) fn contains(&self, fh: u64) -> bool {
        self.by_fh.contains_key(&fh)
    }

    /// Whether any handle of `ino` is open here.
    pub(super) fn has_ino(&self, ino: u64) -> bool {
        self.by_ino.contains_key(&ino)
    }

    /// The handles of `ino` open here.
    pub(super) fn handles_of(&self, ino: u64) -> Vec<u64> {
        self.by_ino.get(&ino).cloned().unwrap_or_default()
    }

    /// The open files of `ino`.
    pub(super) fn of_ino(&self, ino: u64) -> impl Iterator<Item = &OpenFile> {
        self.by_ino
            .get(&ino)
            .into_iter()
            .flatten()
            .filter_map(|fh| self.by_fh.get(fh))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &OpenFile)> {
        self.by_fh.iter()
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut OpenFile> {
        self.by_fh.values_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ino: u64) -> OpenFile {
        OpenFile::for_test(ino)
    }

    #[test]
    fn the_inode_index_follows_inserts_and_removes() {
        let mut o = OpenFiles::default();
        o.insert(1, file(10));
        o.insert(2, file(10));
        o.insert(3, file(11));
        assert_eq!(o.of_ino(10).count(), 2);
        assert!(o.has_ino(11));
        assert!(o.remove(1).is_some());
        assert!(o.remove(1).is_none(), "removed twice");
        assert_eq!(o.of_ino(10).count(), 1);
        assert!(o.remove(2).is_some());
        assert!(!o.has_ino(10), "an inode without handles stays indexed");
        assert!(o.by_ino.values().all(|v| !v.is_empty()));
        // A handle number reused for another inode moves in the index.
        o.insert(3, file(12));
        assert!(!o.has_ino(11) && o.has_ino(12));
        assert_eq!(o.of_ino(12).count(), 1);
    }
}
