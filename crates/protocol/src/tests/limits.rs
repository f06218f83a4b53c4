//! Every limit of the wire format at its bound: headers, names, lists, data sizes,
//! groups; body errors that are answered; the operation table.

use super::*;

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

/// `new` takes `max` bytes of `fill` and refuses one more with `errno`.
fn at_the_bound<T>(
    what: &str,
    new: impl Fn(Vec<u8>) -> Result<T>,
    max: usize,
    fill: u8,
    errno: i32,
) {
    assert!(new(vec![fill; max]).is_ok(), "{what}: {max} bytes refused");
    match new(vec![fill; max + 1]) {
        Err(e) => assert_eq!(e.errno(), errno, "{what}: {} bytes", max + 1),
        Ok(_) => panic!("{what}: {} bytes taken", max + 1),
    }
}

#[test]
fn names_at_the_bound() {
    at_the_bound("name", Name::new, MAX_NAME, b'a', libc::ENAMETOOLONG);
    assert!(!Name::new(vec![b'a'; MAX_NAME + 1])
        .unwrap_err()
        .is_framing());
    for bad in [&b""[..], b"a/b", b"a\0b", b".", b".."] {
        assert_eq!(Name::new(bad).unwrap_err().errno(), libc::EINVAL, "{bad:?}");
    }
    assert!(LookupName::new(".").is_ok() && LookupName::new("..").is_ok());
    at_the_bound(
        "lookup",
        LookupName::new,
        MAX_NAME,
        b'a',
        libc::ENAMETOOLONG,
    );
    at_the_bound(
        "target",
        SymlinkTarget::new,
        MAX_SYMLINK,
        b'/',
        libc::ENAMETOOLONG,
    );
    assert_eq!(SymlinkTarget::new("").unwrap_err().errno(), libc::EINVAL);
    at_the_bound(
        "xattr name",
        XattrName::new,
        MAX_XATTR_NAME,
        b'u',
        libc::ERANGE,
    );
    at_the_bound(
        "xattr value",
        XattrValue::new,
        MAX_XATTR_VALUE,
        0,
        libc::E2BIG,
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
        commit: false,
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
    assert_eq!(ALL_OPS.len(), 34);
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
    // A resent tmpfile is answered from the cache: it must not make a second orphan.
    assert!(Op::TmpFile.cached() && !Op::TmpFile.idempotent());
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

/// The largest xattr messages fit a body: a 64 KiB value each way, and a listxattr
/// reply of `MAX_XATTR_LIST` bytes of names in the shape that costs the most on the
/// wire (one-byte names) and in the longest names.
#[test]
fn the_largest_xattr_messages_fit_a_body() {
    let node = NodeRef { ino: 2, gen: 1 };
    let name = XattrName::new(vec![b'u'; MAX_XATTR_NAME]).unwrap();
    let value = XattrValue::new(vec![7; MAX_XATTR_VALUE]).unwrap();
    let req = Request::Setxattr(SetxattrReq {
        node,
        name,
        value: value.clone(),
        flags: 0,
    });
    let (h, body) = req.encode(1, Cred { uid: 0, gid: 0 });
    let h = ReqHeader::decode(&h).unwrap();
    assert!(body.len() <= MAX_BODY);
    assert_eq!(Request::decode(&h, &body).unwrap(), req);
    let lists = [
        (0..MAX_XATTR_LIST / 2)
            .map(|i| vec![b'a' + (i % 26) as u8])
            .collect::<Vec<_>>(),
        (0..MAX_XATTR_LIST / (MAX_XATTR_NAME + 1))
            .map(|i| {
                let mut n = format!("user.{i:03}").into_bytes();
                n.resize(MAX_XATTR_NAME, b'x');
                n
            })
            .collect(),
    ];
    for names in lists {
        assert_eq!(
            names.iter().map(|n| n.len() + 1).sum::<usize>(),
            MAX_XATTR_LIST
        );
        let names = List::new(
            names
                .into_iter()
                .map(|n| XattrName::new(n).unwrap())
                .collect(),
        )
        .unwrap();
        for reply in [
            Reply::Listxattr(ListxattrReply { names }),
            Reply::Getxattr(GetxattrReply {
                value: value.clone(),
            }),
        ] {
            let body = reply.encode();
            let h = RespHeader::ok(reply.op(), 1, body.len() as u32, 0);
            let h = RespHeader::decode(&h.encode()).expect("within the reply limits");
            assert_eq!(Reply::decode(h.op, &body).unwrap(), reply);
        }
    }
}

/// Every request that makes an inode carries the caller's umask, which has permission
/// bits only: 0o777 decodes, any other bit is a body error (EINVAL) -- TmpFile as well
/// as Mknod, Mkdir and Create.
#[test]
fn a_umask_beyond_the_permission_bits_is_refused_by_every_creating_request() {
    let parent = NodeRef::ino(1);
    let name = || Name::new("f").unwrap();
    let reqs = |umask: u32| -> Vec<Request> {
        vec![
            MknodReq {
                parent,
                name: name(),
                mode: 0o100644,
                rdev: 0,
                umask,
            }
            .into(),
            MkdirReq {
                parent,
                name: name(),
                mode: 0o755,
                umask,
            }
            .into(),
            CreateReq {
                parent,
                name: name(),
                mode: 0o644,
                flags: libc::O_RDWR,
                umask,
            }
            .into(),
            TmpFileReq {
                parent,
                mode: 0o644,
                umask,
                flags: libc::O_RDWR,
            }
            .into(),
        ]
    };
    let decode = |r: &Request| {
        let (h, body) = r.encode(1, Cred::default());
        Request::decode(&ReqHeader::decode(&h).unwrap(), &body)
    };
    for r in reqs(0o777) {
        assert_eq!(decode(&r).unwrap(), r);
    }
    for umask in [0o1000, 0o7777, u32::MAX] {
        let got: Vec<(Op, i32)> = reqs(umask)
            .iter()
            .map(|r| (r.op(), decode(r).map_or_else(|e| e.errno(), |_| 0)))
            .collect();
        let want: Vec<(Op, i32)> = [Op::Mknod, Op::Mkdir, Op::Create, Op::TmpFile]
            .into_iter()
            .map(|op| (op, libc::EINVAL))
            .collect();
        assert_eq!(got, want, "umask {umask:o}");
    }
}
