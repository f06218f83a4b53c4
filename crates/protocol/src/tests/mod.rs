//! Round trips of every request and reply kind, arbitrary bytes, and every limit at its
//! bound.

use crate::*;
use proptest::prelude::*;
use zcfs_backend::{Attr, DirEntry, DirState, SetAttr, SetTime, StatFs, Time};

fn name_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        any::<u8>().prop_filter("no / or NUL", |c| *c != b'/' && *c != 0),
        1..=MAX_NAME,
    )
    .prop_filter("no dots", |n| n != b"." && n != b"..")
}

fn name() -> impl Strategy<Value = Name> {
    name_bytes().prop_map(|n| Name::new(n).unwrap())
}

fn lookup_name() -> impl Strategy<Value = LookupName> {
    prop_oneof![
        Just(LookupName::new(".").unwrap()),
        Just(LookupName::new("..").unwrap()),
        name_bytes().prop_map(|n| LookupName::new(n).unwrap()),
    ]
}

fn target() -> impl Strategy<Value = SymlinkTarget> {
    prop::collection::vec(1u8..=255, 1..=MAX_SYMLINK).prop_map(|t| SymlinkTarget::new(t).unwrap())
}

fn xname() -> impl Strategy<Value = XattrName> {
    prop::collection::vec(1u8..=255, 1..=MAX_XATTR_NAME).prop_map(|n| XattrName::new(n).unwrap())
}

fn xvalue() -> impl Strategy<Value = XattrValue> {
    prop::collection::vec(any::<u8>(), 0..5000).prop_map(|v| XattrValue::new(v).unwrap())
}

fn node() -> impl Strategy<Value = NodeRef> {
    (any::<u64>(), any::<u64>()).prop_map(|(ino, gen)| NodeRef { ino, gen })
}

fn time() -> impl Strategy<Value = Time> {
    (any::<i64>(), 0u32..1_000_000_000).prop_map(|(sec, nsec)| Time { sec, nsec })
}

fn attr() -> impl Strategy<Value = Attr> {
    (
        any::<[u64; 4]>(),
        time(),
        time(),
        time(),
        any::<[u32; 6]>(),
        any::<bool>(),
    )
        .prop_map(|(a, at, mt, ct, b, nx)| Attr {
            ino: a[0],
            generation: a[1],
            size: a[2],
            blocks: a[3],
            atime: at,
            mtime: mt,
            ctime: ct,
            mode: b[0],
            nlink: b[1],
            uid: b[2],
            gid: b[3],
            rdev: b[4],
            blksize: b[5],
            no_xattrs: nx,
        })
}

fn settime() -> impl Strategy<Value = Option<SetTime>> {
    prop_oneof![
        Just(None),
        Just(Some(SetTime::Now)),
        time().prop_map(|t| Some(SetTime::At(t)))
    ]
}

fn setattr() -> impl Strategy<Value = SetAttr> {
    (
        (
            prop::option::of(any::<u32>()),
            prop::option::of(any::<u32>()),
            prop::option::of(any::<u32>()),
        ),
        prop::option::of(0..=MAX_OFFSET),
        settime(),
        settime(),
    )
        .prop_map(|((mode, uid, gid), size, atime, mtime)| SetAttr {
            mode,
            uid,
            gid,
            size,
            atime,
            mtime,
        })
}

/// (offset, size) with offset + size within off_t.
fn span() -> impl Strategy<Value = (u64, u32)> {
    (0u64..=MAX_OFFSET - MAX_DATA as u64, 0u32..=MAX_DATA as u32)
}

fn entry(plus: bool) -> impl Strategy<Value = DirEntry> {
    (any::<u64>(), any::<u32>(), 1u64.., name(), attr()).prop_map(
        move |(ino, kind, next, name, a)| DirEntry {
            name: name.into_bytes(),
            ino,
            kind,
            next,
            attr: plus.then_some(a),
        },
    )
}

/// A strategy for every request kind: the match is exhaustive, so a new operation
/// does not compile until it has one.
fn request_for(op: Op) -> BoxedStrategy<Request> {
    match op {
        Op::Lookup => (node(), lookup_name())
            .prop_map(|(parent, name)| LookupReq { parent, name }.into())
            .boxed(),
        Op::Getattr => node().prop_map(|node| GetattrReq { node }.into()).boxed(),
        Op::Setattr => (node(), setattr(), any::<u64>(), any::<bool>())
            .prop_map(|(node, set, fh, commit)| {
                SetattrReq {
                    node,
                    set,
                    fh,
                    commit,
                }
                .into()
            })
            .boxed(),
        Op::Readlink => node().prop_map(|node| ReadlinkReq { node }.into()).boxed(),
        Op::Mknod => (node(), name(), any::<u32>(), any::<u32>())
            .prop_map(|(parent, name, mode, rdev)| {
                MknodReq {
                    umask: 0,
                    parent,
                    name,
                    mode,
                    rdev,
                }
                .into()
            })
            .boxed(),
        Op::Mkdir => (node(), name(), any::<u32>())
            .prop_map(|(parent, name, mode)| {
                MkdirReq {
                    umask: 0,
                    parent,
                    name,
                    mode,
                }
                .into()
            })
            .boxed(),
        Op::Unlink => (node(), name())
            .prop_map(|(parent, name)| UnlinkReq { parent, name }.into())
            .boxed(),
        Op::Rmdir => (node(), name())
            .prop_map(|(parent, name)| RmdirReq { parent, name }.into())
            .boxed(),
        Op::Symlink => (node(), name(), target())
            .prop_map(|(parent, name, target)| {
                SymlinkReq {
                    parent,
                    name,
                    target,
                }
                .into()
            })
            .boxed(),
        Op::Rename => (node(), name(), node(), name(), 0u32..=2)
            .prop_map(|(parent, name, new_parent, new_name, f)| {
                RenameReq {
                    parent,
                    name,
                    new_parent,
                    new_name,
                    flags: RenameFlags::new(f).unwrap(),
                }
                .into()
            })
            .boxed(),
        Op::Link => (node(), node(), name())
            .prop_map(|(node, new_parent, new_name)| {
                LinkReq {
                    node,
                    new_parent,
                    new_name,
                }
                .into()
            })
            .boxed(),
        Op::Open => (node(), any::<i32>())
            .prop_map(|(node, flags)| OpenReq { node, flags }.into())
            .boxed(),
        Op::Create => (node(), name(), any::<u32>(), any::<i32>())
            .prop_map(|(parent, name, mode, flags)| {
                CreateReq {
                    umask: 0,
                    parent,
                    name,
                    mode,
                    flags,
                }
                .into()
            })
            .boxed(),
        Op::TmpFile => (node(), any::<u32>(), 0u32..=0o777, any::<i32>())
            .prop_map(|(parent, mode, umask, flags)| {
                TmpFileReq {
                    parent,
                    mode,
                    umask,
                    flags,
                }
                .into()
            })
            .boxed(),
        Op::Read => (node(), any::<u64>(), span())
            .prop_map(|(node, fh, (offset, size))| {
                ReadReq {
                    node,
                    fh,
                    offset,
                    size,
                }
                .into()
            })
            .boxed(),
        Op::Write => (node(), any::<u64>(), span(), any::<bool>())
            .prop_map(|(node, fh, (offset, size), commit)| {
                WriteReq {
                    node,
                    fh,
                    offset,
                    size,
                    commit,
                }
                .into()
            })
            .boxed(),
        Op::Flush => (node(), any::<u64>())
            .prop_map(|(node, fh)| FlushReq { node, fh }.into())
            .boxed(),
        Op::Release => (node(), any::<u64>())
            .prop_map(|(node, fh)| ReleaseReq { node, fh }.into())
            .boxed(),
        Op::Fsync => (node(), any::<u64>(), any::<bool>())
            .prop_map(|(node, fh, datasync)| FsyncReq { node, fh, datasync }.into())
            .boxed(),
        Op::Readdir => (node(), any::<u64>(), any::<bool>(), 1..=MAX_ENTRIES as u32)
            .prop_map(|(dir, cookie, plus, max_entries)| {
                ReaddirReq {
                    dir,
                    cookie,
                    plus,
                    max_entries,
                }
                .into()
            })
            .boxed(),
        Op::Statfs => Just(StatfsReq {}.into()).boxed(),
        Op::Setxattr => (node(), xname(), xvalue(), 0i32..=2)
            .prop_map(|(node, name, value, flags)| {
                SetxattrReq {
                    node,
                    name,
                    value,
                    flags,
                }
                .into()
            })
            .boxed(),
        Op::Getxattr => (node(), xname())
            .prop_map(|(node, name)| GetxattrReq { node, name }.into())
            .boxed(),
        Op::Listxattr => node().prop_map(|node| ListxattrReq { node }.into()).boxed(),
        Op::Removexattr => (node(), xname())
            .prop_map(|(node, name)| RemovexattrReq { node, name }.into())
            .boxed(),
        Op::Lseek => (node(), any::<u64>(), 0u64..=MAX_OFFSET, any::<i32>())
            .prop_map(|(node, fh, offset, whence)| {
                LseekReq {
                    node,
                    fh,
                    offset,
                    whence,
                }
                .into()
            })
            .boxed(),
        Op::Fallocate => (node(), any::<u64>(), 0u64..=MAX_OFFSET, any::<i32>())
            .prop_flat_map(|(node, fh, offset, mode)| {
                (0..=MAX_OFFSET - offset).prop_map(move |len| {
                    FallocateReq {
                        node,
                        fh,
                        offset,
                        len,
                        mode,
                    }
                    .into()
                })
            })
            .boxed(),
        Op::SyncAll => Just(SyncAllReq {}.into()).boxed(),
        Op::Ping => Just(PingReq {}.into()).boxed(),
        Op::Access => (node(), 0u32..8)
            .prop_map(|(node, mask)| AccessReq { node, mask }.into())
            .boxed(),
        Op::Stats => Just(StatsReq {}.into()).boxed(),
        Op::L2Release => Just(L2ReleaseReq {}.into()).boxed(),
        Op::L2Setup => (0u64..1 << 48, any::<u32>(), any::<u32>(), any::<[u8; 24]>())
            .prop_map(|(mac, cmd_queue, data_queue, g)| {
                L2SetupReq {
                    mac,
                    cmd_queue,
                    data_queue,
                    geometry: Blob::new(g.to_vec()).unwrap(),
                }
                .into()
            })
            .boxed(),
        Op::Forget => prop::collection::vec((any::<u64>(), 1u64..), 0..50)
            .prop_map(|items| {
                ForgetReq {
                    items: List::new(
                        items
                            .into_iter()
                            .map(|(ino, count)| ForgetItem { ino, count })
                            .collect(),
                    )
                    .unwrap(),
                }
                .into()
            })
            .boxed(),
    }
}

/// A strategy for every reply kind (exhaustive, as `request_for`).
fn reply_for(op: Op) -> BoxedStrategy<Reply> {
    let entry_reply = || attr().prop_map(|attr| EntryReply { attr });
    let attr_reply = || attr().prop_map(|attr| AttrReply { attr });
    let dir_state = || {
        proptest::option::of(
            (any::<u64>(), any::<u64>())
                .prop_map(|(version, entries)| DirState { version, entries }),
        )
    };
    let made_reply = move || {
        (
            attr(),
            proptest::option::of(attr()),
            dir_state(),
            dir_state(),
        )
            .prop_map(|(attr, parent, parent_state, made_state)| MadeReply {
                attr,
                parent,
                parent_state,
                made_state,
            })
    };
    let removed_reply = move || {
        (attr(), proptest::option::of(attr()), dir_state()).prop_map(
            |(attr, parent, parent_state)| RemovedReply {
                attr,
                parent,
                parent_state,
            },
        )
    };
    match op {
        Op::Lookup => entry_reply().prop_map(Reply::Lookup).boxed(),
        Op::Getattr => attr_reply().prop_map(Reply::Getattr).boxed(),
        Op::Setattr => (attr(), any::<bool>())
            .prop_map(|(attr, committed)| Reply::Setattr(SetattrReply { attr, committed }))
            .boxed(),
        Op::Readlink => target()
            .prop_map(|target| Reply::Readlink(ReadlinkReply { target }))
            .boxed(),
        Op::Mknod => made_reply().prop_map(Reply::Mknod).boxed(),
        Op::Mkdir => made_reply().prop_map(Reply::Mkdir).boxed(),
        Op::Unlink => removed_reply().prop_map(Reply::Unlink).boxed(),
        Op::Rmdir => removed_reply().prop_map(Reply::Rmdir).boxed(),
        Op::Symlink => made_reply().prop_map(Reply::Symlink).boxed(),
        Op::Rename => Just(Reply::Rename(EmptyReply {})).boxed(),
        Op::Link => made_reply().prop_map(Reply::Link).boxed(),
        Op::Open => (1u64.., attr())
            .prop_map(|(fh, attr)| Reply::Open(OpenReply { fh, attr }))
            .boxed(),
        Op::Create => (attr(), 1u64.., proptest::option::of(attr()), dir_state())
            .prop_map(|(attr, fh, parent, parent_state)| {
                Reply::Create(CreateReply {
                    attr,
                    fh,
                    parent,
                    parent_state,
                })
            })
            .boxed(),
        Op::TmpFile => (attr(), 1u64..)
            .prop_map(|(attr, fh)| {
                Reply::TmpFile(CreateReply {
                    attr,
                    fh,
                    parent: None,
                    parent_state: None,
                })
            })
            .boxed(),
        Op::Read => Just(Reply::Read(EmptyReply {})).boxed(),
        Op::Write => (any::<u32>(), any::<bool>())
            .prop_map(|(written, committed)| Reply::Write(WriteReply { written, committed }))
            .boxed(),
        Op::Flush => Just(Reply::Flush(EmptyReply {})).boxed(),
        Op::Release => Just(Reply::Release(EmptyReply {})).boxed(),
        Op::Fsync => Just(Reply::Fsync(EmptyReply {})).boxed(),
        Op::Readdir => any::<bool>()
            .prop_flat_map(|plus| prop::collection::vec(entry(plus), 0..20))
            .prop_map(|es| {
                Reply::Readdir(ReaddirReply {
                    entries: List::new(es).unwrap(),
                })
            })
            .boxed(),
        Op::Statfs => (any::<[u64; 5]>(), any::<[u32; 3]>())
            .prop_map(|(a, b)| {
                Reply::Statfs(StatfsReply {
                    statfs: StatFs {
                        blocks: a[0],
                        bfree: a[1],
                        bavail: a[2],
                        files: a[3],
                        ffree: a[4],
                        bsize: b[0],
                        namelen: b[1],
                        frsize: b[2],
                    },
                })
            })
            .boxed(),
        Op::Setxattr => Just(Reply::Setxattr(EmptyReply {})).boxed(),
        Op::Getxattr => xvalue()
            .prop_map(|value| Reply::Getxattr(GetxattrReply { value }))
            .boxed(),
        Op::Listxattr => prop::collection::vec(xname(), 0..20)
            .prop_map(|n| {
                Reply::Listxattr(ListxattrReply {
                    names: List::new(n).unwrap(),
                })
            })
            .boxed(),
        Op::Removexattr => Just(Reply::Removexattr(EmptyReply {})).boxed(),
        Op::Fallocate => Just(Reply::Fallocate(EmptyReply {})).boxed(),
        Op::Lseek => any::<u64>()
            .prop_map(|offset| Reply::Lseek(LseekReply { offset }))
            .boxed(),
        Op::SyncAll => Just(Reply::SyncAll(EmptyReply {})).boxed(),
        Op::Ping => Just(Reply::Ping(EmptyReply {})).boxed(),
        Op::Access => Just(Reply::Access(EmptyReply {})).boxed(),
        Op::Stats => prop::collection::vec(any::<u8>(), 0..2000)
            .prop_map(|j| {
                Reply::Stats(StatsReply {
                    json: Blob::new(j).unwrap(),
                })
            })
            .boxed(),
        Op::Forget => Just(Reply::Forget(EmptyReply {})).boxed(),
        Op::L2Release => Just(Reply::L2Release(EmptyReply {})).boxed(),
        Op::L2Setup => (
            any::<bool>(),
            0u64..1 << 48,
            any::<[u8; 32]>(),
            "[a-z ]{0,40}",
        )
            .prop_map(|(accepted, mac, nonce, why)| {
                Reply::L2Setup(L2SetupReply {
                    accepted,
                    mac,
                    cmd_queue: 0,
                    data_queue: 1,
                    land_max: 1 << 20,
                    nonce: Blob::new(if accepted { nonce.to_vec() } else { vec![] }).unwrap(),
                    reason: Blob::new(why.into_bytes()).unwrap(),
                })
            })
            .boxed(),
    }
}

fn any_request() -> impl Strategy<Value = Request> {
    (0..ALL_OPS.len()).prop_flat_map(|i| request_for(ALL_OPS[i]))
}

fn any_reply() -> impl Strategy<Value = Reply> {
    (0..ALL_OPS.len()).prop_flat_map(|i| reply_for(ALL_OPS[i]))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn requests_round_trip(r in any_request(), id in any::<u64>(), uid in any::<u32>(), gid in any::<u32>()) {
        let (h, body) = r.encode(id, Cred { uid, gid });
        let hd = ReqHeader::decode(&h).unwrap();
        prop_assert_eq!(hd.op, r.op());
        prop_assert_eq!(hd.id, id);
        prop_assert_eq!(hd.cred(), Cred { uid, gid });
        prop_assert_eq!(hd.body_len as usize, body.len());
        prop_assert_eq!(hd.data_len, r.data_len());
        prop_assert_eq!(Request::decode(&hd, &body).unwrap(), r);
    }

    #[test]
    fn replies_round_trip(r in any_reply(), id in any::<u64>()) {
        let body = r.encode();
        let data_len = if r.op() == Op::Read { 4096 } else { 0 };
        let h = RespHeader::ok(r.op(), id, body.len() as u32, data_len);
        let hd = RespHeader::decode(&h.encode()).unwrap();
        prop_assert_eq!(hd, h);
        prop_assert_eq!(Reply::decode(hd.op, &body).unwrap(), r);
    }

    #[test]
    fn arbitrary_bytes_never_panic(hdr in prop::collection::vec(any::<u8>(), REQ_HDR), body in prop::collection::vec(any::<u8>(), 0..600)) {
        let h: [u8; REQ_HDR] = hdr.clone().try_into().unwrap();
        if let Ok(h) = ReqHeader::decode(&h) {
            if let Err(e) = Request::decode(&h, &body) {
                prop_assert!(!e.is_framing(), "a body error must not be a framing error: {e}");
            }
        }
        let rh: [u8; RESP_HDR] = hdr.try_into().unwrap();
        let _ = RespHeader::decode(&rh);
        for &op in ALL_OPS {
            let _ = Reply::decode(op, &body);
        }
    }

    /// Any byte of a valid body changed: a value or a body error, never a panic or a
    /// framing error (the header still frames the message).
    #[test]
    fn corrupted_bodies_are_body_errors(r in any_request(), at in any::<usize>(), v in any::<u8>()) {
        let (h, mut body) = r.encode(1, Cred::default());
        let hd = ReqHeader::decode(&h).unwrap();
        if !body.is_empty() {
            let i = at % body.len();
            body[i] = v;
        }
        match Request::decode(&hd, &body) {
            // One encoding per value: what decodes encodes back to the same bytes.
            Ok(r) => prop_assert_eq!(r.encode(1, Cred::default()).1, body),
            Err(e) => {
                prop_assert!(!e.is_framing());
                prop_assert!(e.errno() > 0 && e.errno() <= MAX_ERRNO);
            }
        }
    }

    /// The same for replies.
    #[test]
    fn corrupted_reply_bodies_are_body_errors(r in any_reply(), at in any::<usize>(), v in any::<u8>()) {
        let mut body = r.encode();
        if !body.is_empty() {
            let i = at % body.len();
            body[i] = v;
        }
        match Reply::decode(r.op(), &body) {
            Ok(r2) => prop_assert_eq!(r2.encode(), body),
            Err(e) => prop_assert!(!e.is_framing()),
        }
    }
}

mod limits;

#[test]
fn attr_flags_round_trip_and_unknown_flags_are_refused() {
    let a = Attr {
        ino: 7,
        no_xattrs: true,
        ..Default::default()
    };
    let mut b = Vec::new();
    a.put(&mut b);
    assert_eq!(b.len(), ATTR_LEN);
    // The flags follow the 92 bytes of fields.
    assert_eq!(b[92..96], ATTR_NO_XATTRS.to_le_bytes());
    assert_eq!(Attr::get(&mut Reader::new(&b)).unwrap(), a);
    b[92] |= 2;
    assert!(
        Attr::get(&mut Reader::new(&b)).is_err(),
        "unknown flag accepted"
    );
}
