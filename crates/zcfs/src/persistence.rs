//! The persistence mode `mkfs` and `stat` show for a volume image.

use std::path::Path;

/// The persistence mode a read-write open of `image` would use (read-only opens map
/// privately, so they cannot tell).
pub fn persistence_of(image: &Path) -> String {
    zcfs_pmem::Region::open(image, &zcfs_pmem::OpenParams::default())
        .map(|r| r.mode().to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}
