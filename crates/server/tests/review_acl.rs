//! Adversarial review of POSIX ACLs (issue 14) over the wire: a client that speaks
//! the protocol directly, as an ordinary user.

mod common;
use common::*;
use zcfs_backend::ROOT;
use zcfs_protocol::*;
use zcfs_server::{IdentityMap, ServerConfig};

const MIB: usize = 1 << 20;

/// user::rwx, user:1001:rwx, group::r-x, mask::rwx, other::---
fn named_acl() -> Vec<u8> {
    let mut b = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 7, 1001),
        (0x04, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(&perm.to_le_bytes());
        b.extend_from_slice(&id.to_le_bytes());
    }
    b
}

/// The owner of a directory with an access ACL sends one Setattr with a mode and a
/// size: the volume reserved a block for rewriting the ACL, then the truncate refused
/// the directory (EISDIR) and the transaction was dropped holding the block -- a panic
/// with the volume's state lock held, after which no request of anyone could change
/// the volume. It must be refused with EISDIR and leave the server working.
#[test]
fn a_chmod_and_size_setattr_on_an_acl_directory_does_not_take_the_server_down() {
    let srv = Running::start(
        memory_fs(64 * MIB),
        ServerConfig {
            identity: IdentityMap::default(),
            ..config()
        },
    );
    let mut raw = srv.raw(0x7101);
    let owner = Cred {
        uid: 1000,
        gid: 1000,
    };
    let mkdir = |raw: &mut Raw, name: &str| {
        raw.call_by(
            MkdirReq {
                umask: 0o022,
                parent: NodeRef::ino(ROOT),
                name: Name::new(name).unwrap(),
                mode: 0o777,
            },
            owner,
        )
    };
    let made = mkdir(&mut raw, "d");
    assert_eq!(made.status, 0);
    let d = MadeReply::decode(&made.body).unwrap().attr.ino;
    let set = raw.call_by(
        SetxattrReq {
            node: NodeRef::ino(d),
            name: XattrName::new("system.posix_acl_access").unwrap(),
            value: XattrValue::new(named_acl()).unwrap(),
            flags: 0,
        },
        owner,
    );
    assert_eq!(set.status, 0, "the owner sets an access ACL");
    let both = raw.call_by(
        SetattrReq {
            node: NodeRef::ino(d),
            set: zcfs_backend::SetAttr {
                mode: Some(0o700),
                size: Some(0),
                ..Default::default()
            },
            fh: 0,
            commit: false,
        },
        owner,
    );
    assert_eq!(both.status, libc::EISDIR, "mode and size of a directory");
    let mut raw2 = srv.raw(0x7102);
    let after = mkdir(&mut raw2, "after");
    assert_eq!(after.status, 0, "the volume takes changes afterwards");
}
