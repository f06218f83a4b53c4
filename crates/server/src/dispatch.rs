//! Requests other than read and write: generation checks, the session's handles and
//! references, and the backend call.

use crate::conn::{ro, Lane};
use crate::session::{Access, Handle};
use std::sync::atomic::Ordering;
use zcfs_backend::{Backend, Ctx, DirEntry, DirState, Error, Result};
use zcfs_protocol::*;

/// ESTALE for a node whose generation no longer matches.
pub(crate) fn stale(n: NodeRef) -> Error {
    Error::new(
        libc::ESTALE,
        format!(
            "inode {} generation {} is gone (stale file handle)",
            n.ino, n.gen
        ),
    )
}

/// ESTALE for an inode no directory names (an O_TMPFILE file, a file unlinked while
/// open) that the session does not hold: on Linux only the processes that have it open
/// reach it, so another client must not link, open, read, write or hold it.
fn unreachable(ino: u64) -> Error {
    Error::new(
        libc::ESTALE,
        format!("inode {ino} has no name and this client holds no reference to it"),
    )
}

/// References taken to check generations, given back when the operation is done, so
/// the check and the operation see the same inode (for the lane's request: `'a`).
pub(crate) struct Held<'a, const N: usize> {
    _refs: [Option<HeldOwned>; N],
    _lane: std::marker::PhantomData<&'a ()>,
}

/// The reference [`Lane::hold_owned`] took on one inode, given back when this drops: for
/// one node of a [`Held`], or alone for an operation that outlives the call that
/// checked it (a layer-2 landing write waits for its data across the lane's polls).
pub(crate) struct HeldOwned {
    backend: std::sync::Arc<dyn Backend>,
    ino: u64,
}

impl Drop for HeldOwned {
    fn drop(&mut self) {
        self.backend.forget(self.ino, 1);
    }
}

/// The caller of a request that creates an inode, with the umask it sent.
fn creator(ctx: &Ctx, umask: u32) -> Ctx {
    let mut c = ctx.clone();
    c.cred.umask = umask;
    c
}

fn backend_err(what: &'static str) -> impl Fn(ProtoError) -> Error {
    move |e| {
        Error::new(
            libc::EIO,
            format!("the backend returned an invalid {what}: {e}"),
        )
    }
}

impl<'a> Lane<'a> {
    /// Check the generation of every node that names one, and that each node is
    /// reachable by this session (`reachable`), holding it for the operation. A node
    /// without a generation is held too unless the session holds it already (or it is
    /// the root): the inode checked is then the one the operation sees (its number
    /// cannot be freed and reused for another client's tmpfile in between).
    pub(crate) fn hold<const N: usize>(&self, nodes: [NodeRef; N]) -> Result<Held<'a, N>> {
        let mut refs = [const { None }; N];
        for (r, n) in refs.iter_mut().zip(nodes) {
            // On an error the references taken so far go back as `refs` drops.
            *r = self.hold_owned(n)?;
        }
        Ok(Held {
            _refs: refs,
            _lane: std::marker::PhantomData,
        })
    }

    /// [`Lane::hold`] of one node, the reference kept by the returned guard (None: the
    /// node needs none, as `hold` decides).
    pub(crate) fn hold_owned(&self, n: NodeRef) -> Result<Option<HeldOwned>> {
        if n.gen == 0 && (n.ino == zcfs_backend::ROOT || self.session.holds(n.ino)) {
            return Ok(None);
        }
        match self.shared.backend.hold(n.ino, n.gen) {
            Ok(a) => {
                let held = HeldOwned {
                    backend: self.shared.backend.clone(),
                    ino: n.ino,
                };
                self.reachable(n.ino, a.nlink)?;
                Ok(Some(held))
            }
            Err(e) if e.errno == libc::ENOENT || e.errno == libc::ESTALE => Err(stale(n)),
            Err(e) => Err(e),
        }
    }

    /// A peer names inodes by number, so it can name one that no directory names (an
    /// O_TMPFILE file, a file unlinked while open, a removed directory): only a session
    /// that holds it (an entry it was given, or an open handle) may reach it, as on
    /// Linux only its openers can. `nlink` is its link count, read while it is held.
    pub(crate) fn reachable(&self, ino: u64, nlink: u32) -> Result<()> {
        if nlink == 0 && !self.session.holds(ino) {
            return Err(unreachable(ino));
        }
        Ok(())
    }

    /// A handle named by (node, fh) for flush/fsync/fallocate, open for `access`, with
    /// its generation check held for the operation.
    fn handle_for(
        &self,
        ctx: &Ctx,
        node: NodeRef,
        fh: u64,
        access: Access,
    ) -> Result<(u64, Held<'a, 1>)> {
        let (bfh, check) = self.resolve(ctx, node, fh, access)?;
        let held = self.hold([if check { node } else { NodeRef::ino(node.ino) }])?;
        Ok((bfh, held))
    }

    /// `ino` may have no link left: a session that holds it by reference alone counts
    /// it among its orphans, and past its bound gives its references back to the
    /// backend (`Session::orphaned`), which frees the inode if no one else holds it.
    /// `everyone`: a name was removed, so every session holding `ino` is asked (another
    /// client's lookup of it counts as much as this one's: review 29b); else only this
    /// session (its handle was released).
    fn orphaned(&self, ino: u64, everyone: bool) {
        let b = &self.shared.backend;
        let ask = |s: &crate::session::Session| {
            s.orphaned(
                ino,
                || b.getattr(ino).is_ok_and(|a| a.nlink == 0),
                |n| {
                    tracing::debug!(
                        session = s.id,
                        ino,
                        "a client holds more unlinked inodes by reference than its handle limit: this one's references are given back"
                    );
                    b.forget(ino, n);
                    self.shared
                        .stats
                        .orphans_given_back
                        .fetch_add(1, Ordering::Relaxed);
                },
            )
        };
        if everyone {
            self.shared.names_removed.fetch_add(1, Ordering::SeqCst);
            for s in self.shared.sessions.all() {
                ask(&s);
            }
        } else {
            ask(self.session);
        }
    }

    /// An entry goes to the client: the session holds its reference.
    fn entry(&self, attr: zcfs_backend::Attr) -> EntryReply {
        self.session.add_ref(attr.ino);
        EntryReply { attr }
    }

    /// An inode made in (or linked into) `parent`: its entry and the directory's
    /// attributes after the change.
    fn made(&self, attr: zcfs_backend::Attr, parent: u64) -> MadeReply {
        // A new directory's state, read before anything else could change it much:
        // the client takes it as "every name known" only if it is still empty.
        let made_state = if attr.is_dir() {
            self.shared.backend.dir_state(attr.ino).ok()
        } else {
            None
        };
        let EntryReply { attr } = self.entry(attr);
        let (parent, parent_state) = self.dir_after(parent);
        MadeReply {
            attr,
            parent,
            parent_state,
            made_state,
        }
    }

    /// A directory's attributes and name-set version after an operation changed it,
    /// for the client to cache (it need not ask again). Read after the change, not with
    /// it: a version more than one past what the client knew tells it someone else
    /// changed the directory too. The operation is done whatever this finds: what
    /// cannot be read now is sent as unknown.
    fn dir_after(&self, dir: u64) -> (Option<zcfs_backend::Attr>, Option<DirState>) {
        let b = &self.shared.backend;
        // The version first: a change between the two reads then shows in the version
        // (which the client checks) rather than only in the attributes.
        let state = b.dir_state(dir).ok();
        (b.getattr(dir).ok(), state)
    }

    /// A new inode the backend made and opened (create, tmpfile): the session keeps
    /// its handle and the entry's reference; a refused handle gives the reference back.
    /// `parent`: the directory a create named it in (None: a tmpfile).
    fn created(
        &self,
        (attr, backend_fh): (zcfs_backend::Attr, u64),
        flags: i32,
        parent: Option<u64>,
    ) -> Result<CreateReply> {
        let fh = self
            .add_handle(Handle {
                ino: attr.ino,
                gen: attr.generation,
                backend_fh,
                flags,
            })
            .inspect_err(|_| self.shared.backend.forget(attr.ino, 1))?;
        let EntryReply { attr } = self.entry(attr);
        let (parent, parent_state) = parent.map_or((None, None), |p| self.dir_after(p));
        Ok(CreateReply {
            attr,
            fh,
            parent,
            parent_state,
        })
    }

    /// Register a handle the backend opened; on refusal (too many) close it again.
    fn add_handle(&self, h: Handle) -> Result<u64> {
        self.session.add_handle(h).inspect_err(|_| {
            let _ = self.shared.backend.release(h.ino, h.backend_fh);
        })
    }

    pub(crate) fn dispatch(&self, ctx: &Ctx, req: Request) -> Result<Reply> {
        // A name removed while this request ran asked only the sessions that held its
        // inode then: one this request gave a reference to after the backend answered
        // (a lookup, readdirplus, a link...), or whose open failed with the `opening`
        // guard up, was not counted (review 29c). Then this session asks again for
        // what the request took. One atomic load each side when nothing was removed.
        let since = self.shared.names_removed.load(Ordering::SeqCst);
        let opened = match &req {
            Request::Open(r) => Some(r.node.ino),
            _ => None,
        };
        let r = self.dispatch_once(ctx, req);
        if self.shared.names_removed.load(Ordering::SeqCst) != since {
            match &r {
                Ok(reply) => {
                    for ino in referenced(reply) {
                        self.orphaned(ino, false);
                    }
                }
                Err(_) => {
                    if let Some(ino) = opened {
                        self.orphaned(ino, false);
                    }
                }
            }
        }
        r
    }

    fn dispatch_once(&self, ctx: &Ctx, req: Request) -> Result<Reply> {
        let b = &*self.shared.backend;
        let op = req.op();
        if op.mutates() && self.shared.cfg.read_only {
            return Err(ro());
        }
        Ok(match req {
            Request::L2Setup(_) | Request::L2Release(_) => {
                return Err(Error::new(
                    libc::EINVAL,
                    "l2setup and l2release are answered by their connection",
                ))
            }
            // "." names the node itself, whatever its type (a client opening a file
            // handle: FUSE's export support looks a node id up this way).
            Request::Lookup(r) if &*r.name == b"." => {
                let a = b.hold(r.parent.ino, r.parent.gen)?;
                self.reachable(a.ino, a.nlink)
                    .inspect_err(|_| b.forget(a.ino, 1))?;
                Reply::Lookup(self.entry(a))
            }
            Request::Lookup(r) => {
                let _g = self.hold([r.parent])?;
                Reply::Lookup(self.entry(b.lookup(ctx, r.parent.ino, &r.name)?))
            }
            Request::Getattr(r) => {
                let _g = self.hold([r.node])?;
                Reply::Getattr(AttrReply {
                    attr: b.getattr(r.node.ino)?,
                })
            }
            Request::Setattr(r) if r.fh != 0 => {
                // Through a handle (ftruncate): it must be this session's, opened for
                // writing, and the backend is given its own handle for it.
                let (bfh, _g) = self.handle_for(ctx, r.node, r.fh, Access::Write)?;
                let attr = b.setattr(ctx, r.node.ino, &r.set, bfh)?;
                Reply::Setattr(SetattrReply {
                    attr,
                    committed: r.commit && b.flush(r.node.ino, bfh).is_ok(),
                })
            }
            Request::Setattr(r) => {
                let _g = self.hold([r.node])?;
                let attr = b.setattr(ctx, r.node.ino, &r.set, 0)?;
                Reply::Setattr(SetattrReply {
                    attr,
                    // As a FLUSH would: the backend commits the whole log.
                    committed: r.commit && b.flush(r.node.ino, 0).is_ok(),
                })
            }
            Request::Access(r) => {
                let _g = self.hold([r.node])?;
                b.access(ctx, r.node.ino, r.mask)?;
                Reply::Access(EmptyReply {})
            }
            Request::Readlink(r) => {
                let _g = self.hold([r.node])?;
                let target = SymlinkTarget::new(b.readlink(r.node.ino)?)
                    .map_err(backend_err("symlink target"))?;
                Reply::Readlink(ReadlinkReply { target })
            }
            Request::Mknod(r) => {
                let _g = self.hold([r.parent])?;
                let a = b.mknod(
                    &creator(ctx, r.umask),
                    r.parent.ino,
                    &r.name,
                    r.mode,
                    r.rdev,
                )?;
                Reply::Mknod(self.made(a, r.parent.ino))
            }
            Request::Mkdir(r) => {
                let _g = self.hold([r.parent])?;
                let c = creator(ctx, r.umask);
                let a = b.mkdir(&c, r.parent.ino, &r.name, r.mode)?;
                Reply::Mkdir(self.made(a, r.parent.ino))
            }
            Request::Unlink(r) => {
                let _g = self.hold([r.parent])?;
                let attr = b.unlink(ctx, r.parent.ino, &r.name)?;
                if attr.nlink == 0 {
                    self.orphaned(attr.ino, true);
                }
                let (parent, parent_state) = self.dir_after(r.parent.ino);
                Reply::Unlink(RemovedReply {
                    attr,
                    parent,
                    parent_state,
                })
            }
            Request::Rmdir(r) => {
                let _g = self.hold([r.parent])?;
                let attr = b.rmdir(ctx, r.parent.ino, &r.name)?;
                self.orphaned(attr.ino, true);
                let (parent, parent_state) = self.dir_after(r.parent.ino);
                Reply::Rmdir(RemovedReply {
                    attr,
                    parent,
                    parent_state,
                })
            }
            Request::Symlink(r) => {
                let _g = self.hold([r.parent])?;
                let a = b.symlink(ctx, r.parent.ino, &r.name, &r.target)?;
                Reply::Symlink(self.made(a, r.parent.ino))
            }
            Request::Rename(r) => {
                let _g = self.hold([r.parent, r.new_parent])?;
                let replaced = b.rename(
                    ctx,
                    r.parent.ino,
                    &r.name,
                    r.new_parent.ino,
                    &r.new_name,
                    r.flags.bits(),
                )?;
                if let Some(ino) = replaced {
                    self.orphaned(ino, true);
                }
                Reply::Rename(EmptyReply {})
            }
            Request::Link(r) => {
                let _g = self.hold([r.node, r.new_parent])?;
                let a = b.link(ctx, r.node.ino, r.new_parent.ino, &r.new_name)?;
                self.session.linked(r.node.ino);
                Reply::Link(self.made(a, r.new_parent.ino))
            }
            Request::Open(r) => {
                let write =
                    r.flags & libc::O_ACCMODE != libc::O_RDONLY || r.flags & libc::O_TRUNC != 0;
                if write && self.shared.cfg.read_only {
                    return Err(ro());
                }
                // Counted as held from here, before the node is taken: no orphan
                // decision gives the inode's references back while it is taken and
                // opened (review 29b); one made before makes the take fail (ESTALE).
                let _opening = self.session.opening(r.node.ino);
                let _g = self.hold([r.node])?;
                self.session.has_room()?;
                let backend_fh = b.open(ctx, r.node.ino, r.flags)?;
                // Close-to-open: the client refreshes its caches from these (after
                // the open, which may have truncated).
                let attr = b.getattr(r.node.ino).inspect_err(|_| {
                    let _ = b.release(r.node.ino, backend_fh);
                })?;
                let fh = self.add_handle(Handle {
                    ino: r.node.ino,
                    gen: r.node.gen,
                    backend_fh,
                    flags: r.flags,
                })?;
                Reply::Open(OpenReply { fh, attr })
            }
            Request::Create(r) => {
                let _g = self.hold([r.parent])?;
                self.session.has_room()?;
                let c = creator(ctx, r.umask);
                let made = b.create(&c, r.parent.ino, &r.name, r.mode, r.flags)?;
                Reply::Create(self.created(made, r.flags, Some(r.parent.ino))?)
            }
            Request::TmpFile(r) => {
                // As create: the session keeps the handle and the entry's reference,
                // so a session that ends without releasing them frees the orphan.
                let _g = self.hold([r.parent])?;
                self.session.has_room()?;
                let c = creator(ctx, r.umask);
                let made = b.tmpfile(&c, r.parent.ino, r.mode, r.flags)?;
                Reply::TmpFile(self.created(made, r.flags, None)?)
            }
            Request::Flush(r) => {
                let (bfh, _g) = self.handle_for(ctx, r.node, r.fh, Access::Any)?;
                b.flush(r.node.ino, bfh)?;
                Reply::Flush(EmptyReply {})
            }
            Request::Release(r) => {
                // fh 0 names no handle: there is nothing of this client's to release.
                let h = self.session.take_handle(r.fh, r.node.ino)?;
                b.release(h.ino, h.backend_fh)?;
                self.orphaned(h.ino, false);
                Reply::Release(EmptyReply {})
            }
            Request::Fsync(r) => {
                let (bfh, _g) = self.handle_for(ctx, r.node, r.fh, Access::Any)?;
                b.fsync(r.node.ino, bfh, r.datasync)?;
                Reply::Fsync(EmptyReply {})
            }
            Request::Readdir(r) => {
                let _g = self.hold([r.dir])?;
                // Listing needs read permission on the directory (opendir's check; the
                // protocol has no directory handles, so each batch is checked).
                b.access(ctx, r.dir.ino, zcfs_backend::R_OK)?;
                Reply::Readdir(self.readdir(r)?)
            }
            Request::Statfs(_) => Reply::Statfs(StatfsReply {
                statfs: b.statfs()?,
            }),
            Request::Setxattr(r) => {
                let _g = self.hold([r.node])?;
                b.setxattr(ctx, r.node.ino, &r.name, &r.value, r.flags)?;
                Reply::Setxattr(EmptyReply {})
            }
            Request::Getxattr(r) => {
                let _g = self.hold([r.node])?;
                let value = XattrValue::new(b.getxattr(ctx, r.node.ino, &r.name)?)
                    .map_err(|e| Error::new(e.errno(), e.to_string()))?;
                Reply::Getxattr(GetxattrReply { value })
            }
            Request::Listxattr(r) => {
                let _g = self.hold([r.node])?;
                let names = b.listxattr(ctx, r.node.ino)?;
                let len = names.iter().map(|n| n.len() + 1).sum::<usize>();
                if len > MAX_XATTR_LIST {
                    return Err(Error::new(
                        libc::E2BIG,
                        format!("xattr names take {len} bytes, more than {MAX_XATTR_LIST}"),
                    ));
                }
                let names = names
                    .into_iter()
                    .map(XattrName::new)
                    .collect::<zcfs_protocol::Result<Vec<_>>>()
                    .and_then(List::new)
                    .map_err(backend_err("xattr name list"))?;
                Reply::Listxattr(ListxattrReply { names })
            }
            Request::Removexattr(r) => {
                let _g = self.hold([r.node])?;
                b.removexattr(ctx, r.node.ino, &r.name)?;
                Reply::Removexattr(EmptyReply {})
            }
            Request::Fallocate(r) => {
                let (bfh, _g) = self.handle_for(ctx, r.node, r.fh, Access::Write)?;
                b.fallocate(ctx, r.node.ino, bfh, r.offset, r.len, r.mode)?;
                Reply::Fallocate(EmptyReply {})
            }
            Request::Lseek(r) => {
                // Any open handle (as lseek(2) on any descriptor); without one, what an
                // open for reading would need (the layout says what the file holds).
                let access = if r.fh == 0 { Access::Read } else { Access::Any };
                let (bfh, _g) = self.handle_for(ctx, r.node, r.fh, access)?;
                Reply::Lseek(LseekReply {
                    offset: b.lseek(r.node.ino, bfh, r.offset, r.whence)?,
                })
            }
            Request::SyncAll(_) => {
                b.sync_all()?;
                Reply::SyncAll(EmptyReply {})
            }
            Request::Ping(_) => Reply::Ping(EmptyReply {}),
            Request::Stats(_) => {
                let r = self.shared.report();
                let json = serde_json::to_vec(&r)
                    .map_err(|e| Error::new(libc::EIO, e.to_string()))
                    .and_then(|j| Blob::new(j).map_err(|e| Error::new(libc::EIO, e.to_string())))?;
                Reply::Stats(StatsReply { json })
            }
            Request::Forget(r) => {
                for item in r.items.iter() {
                    let n = self.session.take_refs(item.ino, item.count);
                    if n > 0 {
                        b.forget(item.ino, n);
                    }
                }
                Reply::Forget(EmptyReply {})
            }
            Request::Read(_) | Request::Write(_) => {
                return Err(Error::new(libc::EIO, "data requests take the data path"))
            }
        })
    }

    /// Entries that fit the reply body and the asked count. With `plus` each entry
    /// sent is a reference of the session; one the backend produced but the reply
    /// cannot carry is given back at once.
    fn readdir(&self, r: ReaddirReq) -> Result<ReaddirReply> {
        let b = &*self.shared.backend;
        let mut out: Vec<DirEntry> = Vec::new();
        let mut refused: Vec<u64> = Vec::new();
        // The reply body is a u32 count, then the entries.
        let mut budget = MAX_BODY - 4;
        let res = b.readdir(r.dir.ino, r.cookie, r.plus, &mut |e| {
            let need = e.wire_len();
            if need > budget || out.len() >= r.max_entries as usize {
                refused.push(e.ino);
                return false;
            }
            budget -= need;
            out.push(e);
            true
        });
        if r.plus {
            // Forget outside the backend's readdir (it may hold its own locks).
            for ino in &refused {
                b.forget(*ino, 1);
            }
            if res.is_err() {
                for e in &out {
                    b.forget(e.ino, 1);
                }
            }
        }
        res?;
        // At most `max_entries` (≤ MAX_ENTRIES) were taken: the list is within bounds.
        let entries = List::new(out).expect("readdir entries within MAX_ENTRIES");
        if r.plus {
            for e in entries.iter() {
                self.session.add_ref(e.ino);
            }
        }
        Ok(ReaddirReply { entries })
    }
}

/// The inodes a reply gave the session a reference to.
fn referenced(reply: &Reply) -> Vec<u64> {
    match reply {
        Reply::Lookup(e) => vec![e.attr.ino],
        Reply::Mknod(m) | Reply::Mkdir(m) | Reply::Symlink(m) | Reply::Link(m) => {
            vec![m.attr.ino]
        }
        Reply::Create(c) | Reply::TmpFile(c) => vec![c.attr.ino],
        Reply::Readdir(d) => d.entries.iter().map(|e| e.ino).collect(),
        _ => Vec::new(),
    }
}
