//! Answering fuser's replies from a backend's results: on success each request has its
//! own answer, on failure every reply carries the error's errno the same way.

use crate::convert::errno;
use fuser::{
    Errno, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};

/// A fuser reply that can be answered with an errno (each has its own `error`).
pub(crate) trait ErrorReply {
    fn fail(self, e: Errno);
}

/// The reply types the adapter answers, each failing through its own `error`.
macro_rules! error_replies {
    ($($t:ty),* $(,)?) => {
        $(impl ErrorReply for $t {
            fn fail(self, e: Errno) {
                self.error(e)
            }
        })*
    };
}

error_replies!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyLseek,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr,
);

/// Answer `reply` with `ok` and the result's value, or with the error's errno.
pub(crate) fn answer<R: ErrorReply, T>(
    reply: R,
    r: zcfs_backend::Result<T>,
    ok: impl FnOnce(R, T),
) {
    match r {
        Ok(v) => ok(reply, v),
        Err(e) => reply.fail(errno(&e)),
    }
}

/// Answer a request that returns nothing to the kernel (whatever the backend returns).
pub(crate) fn ok_or_error<T>(reply: ReplyEmpty, r: zcfs_backend::Result<T>) {
    answer(reply, r, |reply, _| reply.ok())
}

/// getxattr/listxattr protocol: size 0 asks for the length; too small is ERANGE.
pub(crate) fn xattr_reply(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32)
    } else if (size as usize) < data.len() {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(data)
    }
}
