//! Answering fuser's replies from a backend's results: on success each request has its
//! own answer, on failure every reply carries the error's errno the same way.

use crate::convert::errno;
use fuser::{
    Errno, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr,
};
use zcfs_backend::XATTR_LIST_MAX;

/// A fuser reply that can be answered with an errno (each has its own `error`).
pub(crate) trait ErrorReply {
    fn fail(self, e: Errno);
}

/// The reply types the adapter answers, each failing through its own `error`.
macro_rules! error_replies {
    ($($t:ty),* $(,)?) => {
        $(impl ErrorReply for $t {
            fn fail(self, e: Errno) {
                crate::metrics::note_error();
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
        reply.fail(Errno::ERANGE)
    } else {
        reply.data(data)
    }
}

/// Answer a listxattr: as `xattr_reply`, and a list longer than XATTR_LIST_MAX (the
/// backend's E2BIG, or a longer list) as the kernel sees a full list of a local file
/// system: a size-0 probe learns XATTR_LIST_MAX (the kernel clamps any larger size to
/// it, fs/fuse/xattr.c), and a buffer of any size is too small: ERANGE, which the
/// kernel turns into E2BIG for a buffer of XATTR_LIST_MAX bytes (fs/xattr.c).
pub(crate) fn listxattr_reply(reply: ReplyXattr, size: u32, list: Result<Vec<u8>, i32>) {
    match xattr_answer(size, list.as_deref().map_err(|&e| e)) {
        XattrAnswer::Size(n) => reply.size(n),
        XattrAnswer::Data(d) => reply.data(d),
        XattrAnswer::Error(e) => reply.fail(Errno::from_i32(e)),
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum XattrAnswer<'a> {
    Size(u32),
    Data(&'a [u8]),
    Error(i32),
}

/// What a listxattr with a buffer of `size` bytes answers (see above).
pub(crate) fn xattr_answer(size: u32, r: Result<&[u8], i32>) -> XattrAnswer<'_> {
    let too_long = match r {
        Ok(d) => d.len() > XATTR_LIST_MAX,
        Err(e) => e == libc::E2BIG,
    };
    match r {
        _ if too_long && size == 0 => XattrAnswer::Size(XATTR_LIST_MAX as u32),
        _ if too_long => XattrAnswer::Error(libc::ERANGE),
        Err(e) => XattrAnswer::Error(e),
        Ok(d) if size == 0 => XattrAnswer::Size(d.len() as u32),
        Ok(d) if (size as usize) < d.len() => XattrAnswer::Error(libc::ERANGE),
        Ok(d) => XattrAnswer::Data(d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattr_answers_at_the_bounds() {
        let full = vec![b'a'; XATTR_LIST_MAX];
        let over = vec![b'a'; XATTR_LIST_MAX + 1];
        use XattrAnswer::*;
        assert_eq!(xattr_answer(0, Ok(b"ab")), Size(2));
        assert_eq!(xattr_answer(1, Ok(b"ab")), Error(libc::ERANGE));
        assert_eq!(xattr_answer(2, Ok(b"ab")), Data(b"ab"));
        assert_eq!(xattr_answer(0, Ok(&full)), Size(XATTR_LIST_MAX as u32));
        assert_eq!(xattr_answer(65536, Ok(&full)), Data(&full[..]));
        assert_eq!(xattr_answer(0, Ok(&over)), Size(XATTR_LIST_MAX as u32));
        assert_eq!(xattr_answer(65536, Ok(&over)), Error(libc::ERANGE));
        assert_eq!(
            xattr_answer(0, Err(libc::E2BIG)),
            Size(XATTR_LIST_MAX as u32)
        );
        assert_eq!(xattr_answer(100, Err(libc::E2BIG)), Error(libc::ERANGE));
        assert_eq!(xattr_answer(0, Err(libc::ENODATA)), Error(libc::ENODATA));
    }
}
