//! Round trips of every request and reply kind, arbitrary bytes, and every limit at its
//! bound.

use crate::*;
use proptest::prelude::*;
use zcfs_backend::{Attr, DirEntry, SetAttr, SetTime, StatFs, Time};

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
    (any::<[u64; 4]>(), time(), time(), time(), any::<[u32; 6]>()).prop_map(|(a, at, mt, ct, b)| {
        Attr {
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
        }
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
        Op::Setattr => (node(), setattr(), any::<u64>())
            .prop_map(|(node, set, fh)| SetattrReq { node, set, fh }.into())
            .boxed(),
        Op::Readlink => node().prop_map(|node| ReadlinkReq { node }.into()).boxed(),
        Op::Mknod => (node(), name(), any::<u32>(), any::<u32>())
            .prop_map(|(parent, name, mode, rdev)| {
                MknodReq {
                    parent,
                    name,
                    mode,
                    rdev,
                }
                .into()
            })
            .boxed(),
        Op::Mkdir => (node(), name(), any::<u32>())
            .prop_map(|(parent, name, mode)| MkdirReq { parent, name, mode }.into())
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
                    parent,
                    name,
                    mode,
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
        Op::Write => (node(), any::<u64>(), span())
            .prop_map(|(node, fh, (offset, size))| {
                WriteReq {
                    node,
                    fh,
                    offset,
                    size,
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
    match op {
        Op::Lookup => entry_reply().prop_map(Reply::Lookup).boxed(),
        Op::Getattr => attr_reply().prop_map(Reply::Getattr).boxed(),
        Op::Setattr => attr_reply().prop_map(Reply::Setattr).boxed(),
        Op::Readlink => target()
            .prop_map(|target| Reply::Readlink(ReadlinkReply { target }))
            .boxed(),
        Op::Mknod => entry_reply().prop_map(Reply::Mknod).boxed(),
        Op::Mkdir => entry_reply().prop_map(Reply::Mkdir).boxed(),
        Op::Unlink => attr_reply().prop_map(Reply::Unlink).boxed(),
        Op::Rmdir => attr_reply().prop_map(Reply::Rmdir).boxed(),
        Op::Symlink => entry_reply().prop_map(Reply::Symlink).boxed(),
        Op::Rename => Just(Reply::Rename(EmptyReply {})).boxed(),
        Op::Link => entry_reply().prop_map(Reply::Link).boxed(),
        Op::Open => (1u64..)
            .prop_map(|fh| Reply::Open(OpenReply { fh }))
            .boxed(),
        Op::Create => (attr(), 1u64..)
            .prop_map(|(attr, fh)| Reply::Create(CreateReply { attr, fh }))
            .boxed(),
        Op::Read => Just(Reply::Read(EmptyReply {})).boxed(),
        Op::Write => any::<u32>()
            .prop_map(|written| Reply::Write(WriteReply { written }))
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

/// A raw request header (for bodies the typed API refuses to build).
fn raw_header(op: Op, body_len: usize, data_len: u32) -> ReqHeader {
    ReqHeader::new(op, 7, body_len as u32, data_len, Cred::default())
}

fn lookup_body(name_len: usize) -> Vec<u8> {
    let mut b = NodeRef::ino(1).encode();
    (name_len as u16).put(&mut b);
    b.extend(std::iter::repeat_n(b'x', name_len));
    b
}

#[test]
fn header_limits_at_the_bound_are_framing_errors() {
    let ok = raw_header(Op::Write, MAX_BODY, MAX_DATA as u32);
    assert_eq!(ReqHeader::decode(&ok.encode()).unwrap(), ok);
    let cases = [
        raw_header(Op::Statfs, MAX_BODY + 1, 0),
        raw_header(Op::Write, 0, MAX_DATA as u32 + 1),
        raw_header(Op::Read, 0, 1),
    ];
    for h in cases {
        let e = ReqHeader::decode(&h.encode()).unwrap_err();
        assert!(e.is_framing(), "{e}");
        assert_eq!(e.errno(), libc::EPROTO);
    }
    let mut b = raw_header(Op::Statfs, 0, 0).encode();
    b[3] = 200;
    assert_eq!(ReqHeader::decode(&b), Err(ProtoError::UnknownOp(200)));
    b[3] = 0;
    assert_eq!(ReqHeader::decode(&b), Err(ProtoError::UnknownOp(0)));
    b[3] = Op::Statfs as u8;
    b[2] = 1;
    assert_eq!(ReqHeader::decode(&b), Err(ProtoError::BadVersion(1)));
    b[0] = 0;
    assert!(matches!(
        ReqHeader::decode(&b),
        Err(ProtoError::BadMagic(_))
    ));

    // Replies: status 1..=4095, lengths within the limits, data only on reads.
    let ok = RespHeader::ok(Op::Read, 1, MAX_BODY as u32, MAX_DATA as u32);
    assert_eq!(RespHeader::decode(&ok.encode()).unwrap(), ok);
    let e = RespHeader::error(Op::Lookup, 1, MAX_ERRNO);
    assert_eq!(RespHeader::decode(&e.encode()).unwrap().status, MAX_ERRNO);
    assert_eq!(RespHeader::error(Op::Lookup, 1, 99_999).status, MAX_ERRNO);
    for bad in [
        RespHeader {
            status: MAX_ERRNO + 1,
            ..e
        },
        RespHeader { status: -1, ..e },
        RespHeader { body_len: 4, ..e },
        RespHeader::ok(Op::Read, 1, MAX_BODY as u32 + 1, 0),
        RespHeader::ok(Op::Read, 1, 0, MAX_DATA as u32 + 1),
        RespHeader::ok(Op::Getattr, 1, 0, 1),
    ] {
        assert!(RespHeader::decode(&bad.encode()).unwrap_err().is_framing());
    }
}

#[test]
fn names_at_the_bound() {
    assert!(Name::new(vec![b'a'; MAX_NAME]).is_ok());
    let e = Name::new(vec![b'a'; MAX_NAME + 1]).unwrap_err();
    assert_eq!(e.errno(), libc::ENAMETOOLONG);
    assert!(!e.is_framing());
    for bad in [&b""[..], b"a/b", b"a\0b", b".", b".."] {
        assert_eq!(Name::new(bad).unwrap_err().errno(), libc::EINVAL, "{bad:?}");
    }
    assert!(LookupName::new(".").is_ok() && LookupName::new("..").is_ok());
    assert_eq!(
        LookupName::new(vec![b'a'; MAX_NAME + 1])
            .unwrap_err()
            .errno(),
        libc::ENAMETOOLONG
    );
    assert!(SymlinkTarget::new(vec![b'/'; MAX_SYMLINK]).is_ok());
    assert_eq!(
        SymlinkTarget::new(vec![b'/'; MAX_SYMLINK + 1])
            .unwrap_err()
            .errno(),
        libc::ENAMETOOLONG
    );
    assert_eq!(SymlinkTarget::new("").unwrap_err().errno(), libc::EINVAL);
    assert!(XattrName::new(vec![b'u'; MAX_XATTR_NAME]).is_ok());
    assert_eq!(
        XattrName::new(vec![b'u'; MAX_XATTR_NAME + 1])
            .unwrap_err()
            .errno(),
        libc::ERANGE
    );
    assert!(XattrValue::new(vec![0; MAX_XATTR_VALUE]).is_ok());
    assert_eq!(
        XattrValue::new(vec![0; MAX_XATTR_VALUE + 1])
            .unwrap_err()
            .errno(),
        libc::E2BIG
    );
}

#[test]
fn a_well_framed_300_byte_name_is_a_body_error_with_enametoolong() {
    for len in [MAX_NAME, MAX_NAME + 1, 300] {
        let body = lookup_body(len);
        let h = raw_header(Op::Lookup, body.len(), 0);
        let h = ReqHeader::decode(&h.encode()).unwrap();
        match Request::decode(&h, &body) {
            Ok(Request::Lookup(r)) => assert_eq!(r.name.len(), MAX_NAME, "{len}"),
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                assert!(len > MAX_NAME);
                assert!(!e.is_framing());
                assert_eq!(e.errno(), libc::ENAMETOOLONG);
            }
        }
    }
    // Even when the body is too short to hold the name it claims.
    let mut body = lookup_body(10);
    body[16..18].copy_from_slice(&300u16.to_le_bytes());
    let h = raw_header(Op::Lookup, body.len(), 0);
    assert_eq!(
        Request::decode(&h, &body).unwrap_err().errno(),
        libc::ENAMETOOLONG
    );
}

#[test]
fn lists_at_the_bound() {
    let item = ForgetItem { ino: 5, count: 1 };
    let full = ForgetReq {
        items: List::new(vec![item; MAX_FORGET_ITEMS]).unwrap(),
    };
    let (h, body) = Request::from(full.clone()).encode(1, Cred::default());
    let h = ReqHeader::decode(&h).unwrap();
    assert_eq!(Request::decode(&h, &body).unwrap(), Request::Forget(full));
    assert!(List::<ForgetItem, MAX_FORGET_ITEMS>::new(vec![item; MAX_FORGET_ITEMS + 1]).is_err());
    // One more item than allowed on the wire: a body error.
    let mut body = Vec::new();
    (MAX_FORGET_ITEMS as u32 + 1).put(&mut body);
    for _ in 0..=MAX_FORGET_ITEMS {
        item.put(&mut body);
    }
    let h = raw_header(Op::Forget, body.len(), 0);
    let e = Request::decode(&h, &body).unwrap_err();
    assert!(!e.is_framing());
    assert_eq!(e.errno(), libc::EINVAL);
    // A count of 0 is not a forget.
    let mut body = Vec::new();
    1u32.put(&mut body);
    ForgetItem { ino: 5, count: 0 }.put(&mut body);
    assert!(Request::decode(&raw_header(Op::Forget, body.len(), 0), &body).is_err());

    // Listxattr: the most names fit in one body.
    let names = vec![XattrName::new("u").unwrap(); MAX_XATTR_NAMES];
    let r = Reply::Listxattr(ListxattrReply {
        names: List::new(names).unwrap(),
    });
    let body = r.encode();
    assert!(body.len() <= MAX_BODY);
    assert_eq!(Reply::decode(Op::Listxattr, &body).unwrap(), r);
    let mut over = Vec::new();
    (MAX_XATTR_NAMES as u32 + 1).put(&mut over);
    assert!(Reply::decode(Op::Listxattr, &over).is_err());

    // Readdir: at most MAX_ENTRIES entries asked for and returned.
    let e = DirEntry {
        name: b"n".to_vec(),
        ino: 2,
        kind: 0,
        next: 1,
        attr: None,
    };
    let r = Reply::Readdir(ReaddirReply {
        entries: List::new(vec![e.clone(); MAX_ENTRIES]).unwrap(),
    });
    assert_eq!(Reply::decode(Op::Readdir, &r.encode()).unwrap(), r);
    let mut over = Vec::new();
    (MAX_ENTRIES as u32 + 1).put(&mut over);
    for _ in 0..=MAX_ENTRIES {
        e.put(&mut over);
    }
    assert!(Reply::decode(Op::Readdir, &over).is_err());
    for (n, ok) in [
        (0, false),
        (1, true),
        (MAX_ENTRIES as u32, true),
        (MAX_ENTRIES as u32 + 1, false),
    ] {
        let body = ReaddirReq {
            dir: NodeRef::ino(1),
            cookie: 0,
            plus: true,
            max_entries: n,
        }
        .encode();
        let h = raw_header(Op::Readdir, body.len(), 0);
        assert_eq!(Request::decode(&h, &body).is_ok(), ok, "{n} entries");
    }
}

#[test]
fn data_sizes_and_offsets_at_the_bound() {
    let read = |offset: u64, size: u32| {
        let body = ReadReq {
            node: NodeRef::ino(2),
            fh: 0,
            offset,
            size,
        }
        .encode();
        Request::decode(&raw_header(Op::Read, body.len(), 0), &body)
    };
    assert!(read(0, MAX_DATA as u32).is_ok());
    assert_eq!(
        read(0, MAX_DATA as u32 + 1).unwrap_err().errno(),
        libc::EINVAL
    );
    assert!(read(MAX_OFFSET - 10, 10).is_ok());
    assert!(read(MAX_OFFSET - 10, 11).is_err());
    assert!(read(u64::MAX, 1).is_err(), "overflow");
    // A write's size must be the header's data length.
    let body = WriteReq {
        node: NodeRef::ino(2),
        fh: 0,
        offset: 0,
        size: 100,
    }
    .encode();
    assert!(Request::decode(&raw_header(Op::Write, body.len(), 100), &body).is_ok());
    let e = Request::decode(&raw_header(Op::Write, body.len(), 99), &body).unwrap_err();
    assert!(!e.is_framing());
    let fall = |offset: u64, len: u64| {
        let body = FallocateReq {
            node: NodeRef::ino(2),
            fh: 0,
            offset,
            len,
            mode: 0,
        }
        .encode();
        Request::decode(&raw_header(Op::Fallocate, body.len(), 0), &body)
    };
    assert!(fall(1, MAX_OFFSET - 1).is_ok());
    assert!(fall(1, MAX_OFFSET).is_err());
}

#[test]
fn body_errors_are_answerable() {
    // Trailing bytes, a short body, a reserved field, bad flags: answered, not dropped.
    let (h, mut body) = Request::from(GetattrReq {
        node: NodeRef::ino(1),
    })
    .encode(1, Cred::default());
    let mut hd = ReqHeader::decode(&h).unwrap();
    body.push(0);
    hd.body_len += 1;
    let e = Request::decode(&hd, &body).unwrap_err();
    assert!(!e.is_framing() && e.errno() == libc::EINVAL, "{e}");
    body.truncate(10);
    hd.body_len = 10;
    assert_eq!(
        Request::decode(&hd, &body).unwrap_err(),
        ProtoError::Truncated("u64")
    );
    // More groups than the body holds.
    let (h, body) = Request::from(PingReq {}).encode(1, Cred::default());
    let mut hd = ReqHeader::decode(&h).unwrap();
    hd.ngroups = 1;
    let e = ReqHeader::decode(&hd.encode())
        .and_then(|h| Request::decode(&h, &body))
        .unwrap_err();
    assert!(!e.is_framing() && e.errno() == libc::EINVAL, "{e}");
    let mut rename = RenameReq {
        parent: NodeRef::ino(1),
        name: Name::new("a").unwrap(),
        new_parent: NodeRef::ino(1),
        new_name: Name::new("b").unwrap(),
        flags: RenameFlags::default(),
    }
    .encode();
    let n = rename.len();
    rename[n - 4..].copy_from_slice(&3u32.to_le_bytes());
    let e = Request::decode(&raw_header(Op::Rename, n, 0), &rename).unwrap_err();
    assert_eq!(e, ProtoError::Invalid("rename flags"));
    assert!(RenameFlags::new(3).is_err());
}

#[test]
fn the_table_is_consistent() {
    assert_eq!(ALL_OPS.len(), 30);
    for (i, &op) in ALL_OPS.iter().enumerate() {
        assert_eq!(Op::from_u8(op as u8), Ok(op));
        assert!((op as usize) < OP_SLOTS);
        assert!(ALL_OPS[..i].iter().all(|o| o.name() != op.name()));
    }
    assert!(
        !Op::Forget.idempotent(),
        "a resent forget would give back too much"
    );
    assert!(
        !Op::Forget.mutates(),
        "a read-only export still takes references back"
    );
    assert!(Op::Write.mutates() && !Op::Read.mutates());
    // Every operation that is not idempotent has its reply cached (it may be resent
    // only within the session whose cache holds it); the data paths never.
    for &op in ALL_OPS {
        assert!(op.idempotent() || op.cached(), "{}", op.name());
    }
    assert!(!Op::Read.cached() && !Op::Write.cached());
    assert!(Op::Forget.cached() && Op::Release.cached() && Op::Create.cached());
}

/// A request carries up to `MAX_GROUPS` supplementary groups: at the bound they go out
/// and come back in order; one more is refused by the encoder (nothing to send), and a
/// header naming one more is a body error (answered EINVAL), not a framing error.
#[test]
fn groups_travel_up_to_the_bound() {
    let req = Request::from(GetattrReq {
        node: NodeRef::ino(7),
    });
    let cred = Cred {
        uid: 1001,
        gid: 1001,
    };
    for n in [0, 1, MAX_GROUPS] {
        let groups: Vec<u32> = (0..n as u32).map(|g| 5000 + g).collect();
        let (h, body) = req.encode_with_groups(3, cred, &groups).unwrap();
        let hd = ReqHeader::decode(&h).unwrap();
        assert_eq!(hd.ngroups as usize, n);
        assert_eq!(body.len(), n * 4 + req.encode(3, cred).1.len());
        let (back, g) = Request::decode_with_groups(&hd, &body).unwrap();
        assert_eq!((back, g), (req.clone(), groups));
    }
    let over: Vec<u32> = (0..MAX_GROUPS as u32 + 1).collect();
    let e = req.encode_with_groups(3, cred, &over).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    // A peer that sends MAX_GROUPS + 1 anyway (gids in the body, count in the header).
    let (h, mut body) = req
        .encode_with_groups(3, cred, &over[..MAX_GROUPS])
        .unwrap();
    let mut hd = ReqHeader::decode(&h).unwrap();
    body.splice(0..0, 9u32.to_le_bytes());
    hd.ngroups += 1;
    hd.body_len += 4;
    let hd = ReqHeader::decode(&hd.encode()).expect("the frame is fine");
    let e = Request::decode_with_groups(&hd, &body).unwrap_err();
    assert!(!e.is_framing() && e.errno() == libc::EINVAL, "{e}");
}
