//! Xattr helpers of the xattr suites, as root.

use std::collections::BTreeMap;
use zcfs_volume::*;

const R: &Cred = &Cred::ROOT;

/// Set `name` to `value` on `ino` (create or replace).
pub fn set(vol: &Volume, ino: u64, name: &[u8], value: &[u8]) -> Result<()> {
    vol.setxattr(R, ino, name, value, XattrMode::Any)
}

/// Every xattr of `ino`, by name.
pub fn all_of(vol: &Volume, ino: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    vol.listxattr(R, ino)
        .unwrap()
        .into_iter()
        .map(|n| {
            let v = vol.getxattr(R, ino, &n).unwrap();
            (n, v)
        })
        .collect()
}

/// The blocks `ino` owns, in volume blocks.
pub fn blocks_of(vol: &Volume, ino: u64) -> u64 {
    vol.getattr(ino).unwrap().blocks / (BLOCK as u64 / 512)
}
