//! Test hook: each committed operation, described at the level of the API, in commit
//! order (emitted under the state's write lock), so concurrency tests can replay what
//! happened on a model and compare.

use crate::ops::RenameFlags;

#[doc(hidden)]
#[derive(Debug, Clone)]
pub enum Traced {
    /// A new inode (file, directory, symlink, special file) named `name` in `parent`.
    Create {
        parent: u64,
        name: Vec<u8>,
        ino: u64,
        mode: u32,
    },
    /// A new regular file that no directory names (O_TMPFILE), link count 0.
    TmpFile {
        ino: u64,
        mode: u32,
    },
    Link {
        ino: u64,
        parent: u64,
        name: Vec<u8>,
    },
    Unlink {
        parent: u64,
        name: Vec<u8>,
    },
    Rmdir {
        parent: u64,
        name: Vec<u8>,
    },
    Rename {
        parent: u64,
        name: Vec<u8>,
        new_parent: u64,
        new_name: Vec<u8>,
        flags: RenameFlags,
    },
    /// One atomic piece of a write; `first_word` is the first 8 bytes written (tests
    /// put a tag there to tell writes apart).
    Write {
        ino: u64,
        offset: u64,
        len: u64,
        first_word: u64,
    },
    Truncate {
        ino: u64,
        size: u64,
    },
    /// Attributes (mode, owner, times) or xattrs changed.
    Attr {
        ino: u64,
    },
    /// Pages placed or freed (pflush, pfree).
    Pages {
        ino: u64,
    },
    /// An orphan freed (last reference of an unlinked file gone).
    Freed {
        ino: u64,
    },
}
