//! Per-operation counts, errors and latency of a mount: each callback is timed from its
//! entry to its end (the reply is sent before it returns) by a guard on the stack, and
//! a reply answered with an errno marks it failed through a thread-local flag (a
//! callback and its reply run on one thread). Recording is two atomic adds and a load;
//! no lock.

use std::cell::Cell;
use std::time::Instant;
use zcfs_metrics::{OpMetrics, OpSnapshot, OpTable};

macro_rules! fuse_ops {
    ($($variant:ident => $name:literal,)*) => {
        /// The FUSE requests a mount counts.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(usize)]
        pub enum FuseOp { $($variant,)* }

        /// Every FuseOp with its name, in code order.
        pub const FUSE_OPS: &[(FuseOp, &str)] = &[$((FuseOp::$variant, $name),)*];
    };
}

fuse_ops!(
    Lookup => "lookup",
    Forget => "forget",
    Getattr => "getattr",
    Setattr => "setattr",
    Readlink => "readlink",
    Mknod => "mknod",
    Mkdir => "mkdir",
    Unlink => "unlink",
    Rmdir => "rmdir",
    Symlink => "symlink",
    Rename => "rename",
    Link => "link",
    Open => "open",
    Create => "create",
    Tmpfile => "tmpfile",
    Read => "read",
    Write => "write",
    Flush => "flush",
    Release => "release",
    Fsync => "fsync",
    Opendir => "opendir",
    Releasedir => "releasedir",
    Fsyncdir => "fsyncdir",
    Readdir => "readdir",
    Readdirplus => "readdirplus",
    Statfs => "statfs",
    Setxattr => "setxattr",
    Getxattr => "getxattr",
    Listxattr => "listxattr",
    Removexattr => "removexattr",
    Access => "access",
    Fallocate => "fallocate",
    Lseek => "lseek",
);

impl FuseOp {
    pub fn name(self) -> &'static str {
        FUSE_OPS[self as usize].1
    }
}

/// A table with a slot for every FuseOp.
pub(crate) fn fuse_op_table() -> OpTable {
    OpTable::new(FUSE_OPS.len())
}

/// The operations of `table` that ran, by name.
pub fn ran(table: &OpTable) -> Vec<(&'static str, OpSnapshot)> {
    table.ran(FUSE_OPS.iter().map(|&(op, name)| (op as usize, name)))
}

thread_local! {
    /// The reply of the callback running on this thread carried an errno.
    static FAILED: Cell<bool> = const { Cell::new(false) };
}

/// Mark the request being answered on this thread as failed.
#[inline]
pub(crate) fn note_error() {
    FAILED.with(|f| f.set(true))
}

/// Times a callback; records it when dropped (at the callback's end, after its reply).
pub(crate) struct Timed<'a> {
    op: &'a OpMetrics,
    start: Instant,
}

impl<'a> Timed<'a> {
    #[inline]
    pub(crate) fn start(op: &'a OpMetrics) -> Timed<'a> {
        FAILED.with(|f| f.set(false));
        Timed {
            op,
            start: Instant::now(),
        }
    }
}

impl Drop for Timed<'_> {
    #[inline]
    fn drop(&mut self) {
        let failed = FAILED.with(|f| f.replace(false));
        let ns = self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.op.record(ns, !failed, 0);
    }
}

/// Records a request answered elsewhere than in its callback (a read answered when the
/// backend's reply comes), timed from `start`.
pub(crate) fn record_since(op: &OpMetrics, start: Instant, ok: bool) {
    let ns = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    op.record(ns, ok, 0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_codes() {
        for (i, &(op, name)) in FUSE_OPS.iter().enumerate() {
            assert_eq!(op as usize, i);
            assert_eq!(op.name(), name);
        }
        assert_eq!(FuseOp::Lseek.name(), "lseek");
    }

    #[test]
    fn a_timed_callback_counts_once_and_an_errno_reply_marks_it_failed() {
        let t = fuse_op_table();
        {
            let _t = Timed::start(t.op(FuseOp::Create as usize));
        }
        {
            let _t = Timed::start(t.op(FuseOp::Create as usize));
            note_error();
        }
        // A flag left over from outside a timed callback does not leak into the next.
        note_error();
        {
            let _t = Timed::start(t.op(FuseOp::Getattr as usize));
        }
        let ran = ran(&t);
        let names: Vec<&str> = ran.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["getattr", "create"], "in FuseOp order");
        let (getattr, create) = (&ran[0].1, &ran[1].1);
        assert_eq!((create.count, create.errors), (2, 1));
        assert_eq!(create.latency.count(), 2);
        assert_eq!((getattr.count, getattr.errors), (1, 0));
    }
}
