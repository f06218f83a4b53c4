//! Who a request acts as: the peer rule and the export's identity map live in
//! zcfs-types (shared with the same-host interface, zcfs-samehost); re-exported here.

pub use zcfs_types::identity::*;
