//! zcfs patch: a gate in front of the device's read (see PATCHES.md, the third patch).
//!
//! Every worker waits in read(2) of /dev/fuse when it has nothing to do, and the kernel
//! wakes one sleeping reader per request it queues: a burst of sixteen requests wakes
//! sixteen threads, though one could have read them back to back. A gate lets a file
//! system keep most idle workers off the device (waiting on the gate instead), so that
//! a burst wakes few threads, and let another worker in when the readers are busy.

use std::fmt;
use std::sync::Arc;

/// Asked by each worker around every read of the device.
pub trait ReadGate: Send + Sync + 'static {
    /// Before a read of the device: returns when this worker may read; false once the
    /// session ended (the worker stops).
    fn enter(&self) -> bool;
    /// The read returned (a request, or an error).
    fn leave(&self);
    /// The session ended: every worker waiting in `enter`, and every later `enter`,
    /// gets false.
    fn close(&self);
}

/// A gate shared by a session's workers (`Config::read_gate`).
#[derive(Clone)]
pub struct SharedReadGate(pub Arc<dyn ReadGate>);

impl fmt::Debug for SharedReadGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedReadGate")
    }
}

impl PartialEq for SharedReadGate {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedReadGate {}
