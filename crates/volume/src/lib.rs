//! The zcfs persistent-memory volume.
//!
//! One mapped region holds the superblocks, an operation log, an inode table and 4 KiB
//! data blocks (the RZCFS layout). Updates are crash-consistent through the CCM scheme:
//! data goes copy-on-write into fresh blocks, every metadata change is a redo record in
//! a checksummed, sequenced log entry, and an operation commits with one aligned 8-byte
//! tail store. DRAM holds the index (inodes, block maps, a per-directory hash), rebuilt
//! at mount. See docs/format.md for the byte layout and the commit protocol.

pub mod acl;
mod alloc;
mod changes;
mod commit;
mod config;
mod data;
mod dir;
mod error;
mod falloc;
mod flac;
pub mod fsck;
#[doc(hidden)]
pub mod fuzzing;
mod holder;
pub mod layout;
mod lease;
mod map;
mod names;
mod ops;
pub mod perm;
mod pins;
mod pm;
mod recovery;
mod refs;
mod rename;
mod sync;
mod tmpfile;
#[doc(hidden)]
pub mod trace;
mod volume;
mod zero;

pub use alloc::CLEAN_FIRST_MIN;
pub use changes::{change_slot, ChangeCounters, CHANGE_SLOTS, CHANGE_TABLE_BYTES};
pub use commit::{metadata_reserve, METADATA_RESERVE_MAX};
pub use config::{
    CommitFault, FaultPlan, MkfsOptions, RootDir, Stats, StatsSnapshot, TraceHook, VolumeConfig,
};
pub use data::{
    max_file_size, LandingExtent, WriteReservation, LANDING_CLOBBER, LANDING_EXTENT_MAX_BLOCKS,
    LANDING_FRONT, LANDING_GAP_BLOCKS, LANDING_GAP_BYTES, LANDING_GUARD_BYTES, LANDING_TAIL,
    MAX_RESERVATION,
};
pub use error::{FsError, Result};
pub use falloc::{FallocMode, Seek};
pub use flac::{AttachedPages, PageBuf, PflushTxn};
pub use holder::{read_holder, Holder};
pub use layout::{
    Geometry, OpType, Time, BLOCK, NAME_MAX, ROOT_INO, XATTR_ENTRY_COST, XATTR_LIST_MAX,
    XATTR_NAME_MAX, XATTR_SET_MAX, XATTR_SIZE_MAX,
};
pub use lease::{Extent, Lease, OwnedPages};
pub use ops::{
    Attr, DirEntry, RenameFlags, SetAttr, SetTime, SizeRight, StatFs, XattrMode, CAPABILITY_XATTR,
    MAX_LINKS, MAX_SYMLINK,
};
pub use volume::{RecoveryReport, Volume, VolumeInfo};
pub use zcfs_pmem::{PersistMode, Region};
pub use zcfs_types::Cred;
pub use zero::{CLEAN_TARGET, HOLE_SCAN_MAX_EXTENTS};

/// File type bits, re-exported for frontends.
pub mod mode {
    pub use crate::layout::{
        S_IFBLK, S_IFCHR, S_IFDIR, S_IFIFO, S_IFLNK, S_IFMT, S_IFREG, S_IFSOCK, S_ISGID,
    };
}
