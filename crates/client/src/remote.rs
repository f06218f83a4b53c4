//! RemoteFs: the Backend over a zcfs server.
//!
//! - Names, symlink targets and xattrs are checked before sending (a name over 255
//!   bytes is ENAMETOOLONG at once, the server never sees it).
//! - Every inode's generation is remembered from every attribute set received, and
//!   sent with each request naming it: the server answers ESTALE when that number now
//!   names another file.
//! - References (the Backend contract) are counted twice per inode: those handed to our
//!   caller, and those the server holds for our session (one per entry it sent). When
//!   the caller's count drops to zero the server's are given back (a Forget, not
//!   waited for) and the cached names of the inode dropped. A name is answered from the
//!   cache only while the server holds a reference to its inode, so the number cannot
//!   have been reused meanwhile.
//! - Caches: attributes and names for the attribute timeout. An operation that changes
//!   an inode refreshes (from its reply) or drops every cached copy of it.

use crate::{Client, ClientConfig};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zcfs_backend::*;
use zcfs_protocol::{
    CreateReq, FallocateReq, FlushReq, FsyncReq, GetattrReq, GetxattrReq, LinkReq, ListxattrReq,
    LookupReq, MkdirReq, MknodReq, OpenReq, ReadReq, ReaddirReq, ReadlinkReq, ReleaseReq,
    RemovexattrReq, RenameReq, RmdirReq, SetattrReq, SetxattrReq, StatfsReq, StatsReq, SymlinkReq,
    SyncAllReq, UnlinkReq, WriteReq,
};
use zcfs_protocol::{
    Cred, ForgetItem, ForgetReq, List, LookupName, Name, NodeRef, Operation, ProtoError,
    RenameFlags, Request, SymlinkTarget, Wire, XattrName, XattrValue, MAX_DATA, MAX_ENTRIES,
    MAX_FORGET_ITEMS,
};

/// Entries asked for per readdirplus round trip: each carries a reference, and those a
/// caller does not take (its buffer is full) are given back, so ask for about what a
/// FUSE reply holds.
const READDIRPLUS_BATCH: u32 = 128;

struct OpenFile {
    ino: u64,
    gen: u64,
    flags: i32,
    /// The server's handle; None once the server lost it (restart and the file is gone).
    server_fh: Option<u64>,
}

/// What we know of an inode.
#[derive(Default)]
struct Node {
    /// Its generation (0 = not known yet).
    gen: u64,
    /// References handed to our caller and not yet forgotten.
    caller_refs: u64,
    /// References the server holds for our session.
    server_refs: u64,
    /// Name cache keys that pointed at it (dropped with it).
    names: Vec<(u64, Vec<u8>)>,
}

#[derive(Default)]
struct Meta {
    attrs: HashMap<u64, (Attr, Instant)>,
    names: HashMap<(u64, Vec<u8>), (u64, Instant)>,
    /// Extended attributes known to be absent: `ls -l` asks for ACLs of every entry.
    no_xattr: HashMap<(u64, Vec<u8>), Instant>,
    nodes: HashMap<u64, Node>,
}

impl Meta {
    fn drop_caches(&mut self) {
        self.attrs.clear();
        self.names.clear();
        self.no_xattr.clear();
    }

    /// The caller is done with `ino`: drop what we know of it. Returns the server's
    /// references to give back.
    fn drop_node(&mut self, ino: u64) -> u64 {
        let Some(node) = self.nodes.remove(&ino) else {
            return 0;
        };
        for key in node.names {
            if self.names.get(&key).is_some_and(|(i, _)| *i == ino) {
                self.names.remove(&key);
            }
        }
        self.attrs.remove(&ino);
        node.server_refs
    }
}

pub struct RemoteFs {
    client: Arc<Client>,
    meta: Arc<Mutex<Meta>>,
    open: Arc<Mutex<HashMap<u64, OpenFile>>>,
    next_fh: AtomicU64,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

fn cred(ctx: &Ctx) -> Cred {
    Cred {
        uid: ctx.uid,
        gid: ctx.gid,
    }
}

/// A request the protocol refuses to carry: refused here, with the same errno.
fn invalid(e: ProtoError) -> Error {
    Error::new(e.errno(), e.to_string())
}

fn name(n: &[u8]) -> Result<Name> {
    Name::new(n).map_err(invalid)
}

impl RemoteFs {
    /// Connect to a server (fails at once with a clear error if it cannot).
    pub fn connect(cfg: ClientConfig) -> Result<RemoteFs> {
        let client = Arc::new(Client::new(cfg));
        let fs = RemoteFs {
            client: client.clone(),
            meta: Arc::new(Mutex::new(Meta::default())),
            open: Arc::new(Mutex::new(HashMap::new())),
            next_fh: AtomicU64::new(1),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        };
        let (open, meta) = (fs.open.clone(), fs.meta.clone());
        client.set_on_restart(Box::new(move |c: &Client| {
            {
                // The server holds nothing for us any more; what it said may be stale.
                let mut m = meta.lock().unwrap();
                m.drop_caches();
                for n in m.nodes.values_mut() {
                    n.server_refs = 0;
                }
            }
            // Re-open what was open, so the server knows the handles again; the
            // generation makes sure it is the same file (an unlinked-but-open file
            // did not survive a restart: that handle is stale).
            let files: Vec<(u64, u64, u64, i32)> = open
                .lock()
                .unwrap()
                .iter()
                .map(|(fh, f)| (*fh, f.ino, f.gen, f.flags))
                .collect();
            for (fh, ino, gen, flags) in files {
                let req: Request = OpenReq {
                    node: NodeRef::new(ino, gen),
                    flags: flags & !libc::O_TRUNC & !libc::O_CREAT & !libc::O_EXCL,
                }
                .into();
                let server_fh = c
                    .submit(&req, Cred::default(), &[])
                    .and_then(crate::Ticket::wait)
                    .ok()
                    .and_then(|r| <OpenReq as Operation>::Reply::decode(&r.body).ok())
                    .map(|r| r.fh);
                if let Some(f) = open.lock().unwrap().get_mut(&fh) {
                    f.server_fh = server_fh;
                }
            }
        }));
        client.connect()?;
        Ok(fs)
    }

    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Send `req` and decode its reply.
    fn call<O: Operation>(&self, ctx: &Ctx, req: O) -> Result<O::Reply> {
        self.call_with(ctx, req, &[])
    }

    fn call_with<O: Operation>(&self, ctx: &Ctx, req: O, data: &[&[u8]]) -> Result<O::Reply> {
        let r = self.client.call(&req.into(), cred(ctx), data)?;
        O::Reply::decode(&r.body)
            .map_err(|e| Error::new(libc::EIO, format!("malformed {} reply: {e}", O::OP.name())))
    }

    fn caching(&self) -> bool {
        !self.client.config().attr_ttl.is_zero()
    }

    fn ttl_ok(&self, t: &Instant) -> bool {
        t.elapsed() < self.client.config().attr_ttl
    }

    /// `ino` with the generation we know (0 when we know none).
    fn node(&self, ino: u64) -> NodeRef {
        let gen = self
            .meta
            .lock()
            .unwrap()
            .nodes
            .get(&ino)
            .map_or(0, |n| n.gen);
        NodeRef::new(ino, gen)
    }

    /// Attributes received: remember the generation, cache them.
    fn remember(&self, a: &Attr) {
        let mut m = self.meta.lock().unwrap();
        self.remember_locked(&mut m, a);
    }

    fn remember_locked(&self, m: &mut Meta, a: &Attr) {
        m.nodes.entry(a.ino).or_default().gen = a.generation;
        if self.caching() {
            m.attrs.insert(a.ino, (a.clone(), Instant::now()));
        }
    }

    fn forget_attr(&self, ino: u64) {
        self.meta.lock().unwrap().attrs.remove(&ino);
    }

    /// A name in `parent` changed: drop it and the parent's attributes.
    fn forget_name(&self, parent: u64, name: &[u8]) {
        let mut m = self.meta.lock().unwrap();
        m.names.remove(&(parent, name.to_vec()));
        m.attrs.remove(&parent);
    }

    /// An entry the server sent (it holds a reference for us), handed to our caller
    /// (one reference for it). `name`: where it was found, to cache; `changed`: the
    /// parent directory was modified.
    fn entry(&self, a: Attr, name: Option<(u64, &[u8])>, changed: bool) -> Attr {
        let mut m = self.meta.lock().unwrap();
        self.remember_locked(&mut m, &a);
        let node = m.nodes.get_mut(&a.ino).expect("remembered");
        node.server_refs += 1;
        node.caller_refs += 1;
        if let Some((parent, n)) = name {
            let key = (parent, n.to_vec());
            if self.caching() {
                if !node.names.contains(&key) {
                    node.names.push(key.clone());
                }
                m.names.insert(key, (a.ino, Instant::now()));
            }
            if changed {
                m.attrs.remove(&parent);
            }
        }
        a
    }

    /// A lookup answered from the name cache, if the server still holds a reference
    /// to the inode cached under that name (so its number was not reused).
    fn cached_lookup(&self, parent: u64, name: &[u8]) -> Option<Attr> {
        if !self.caching() {
            return None;
        }
        let (ino, attr) = {
            let mut m = self.meta.lock().unwrap();
            let (ino, t) = *m.names.get(&(parent, name.to_vec()))?;
            if !self.ttl_ok(&t) {
                return None;
            }
            let attr = m
                .attrs
                .get(&ino)
                .filter(|(_, t)| self.ttl_ok(t))
                .map(|(a, _)| a.clone());
            let node = m.nodes.get_mut(&ino)?;
            if node.server_refs == 0 {
                return None;
            }
            // The caller's reference, taken under the lock: a concurrent forget cannot
            // give the server's back between the check and here.
            node.caller_refs += 1;
            (ino, attr)
        };
        match attr {
            Some(a) => Some(a),
            None => match self.getattr(ino) {
                Ok(a) => Some(a),
                Err(_) => {
                    self.forget(ino, 1);
                    None
                }
            },
        }
    }

    /// Give the server back its references to inodes our caller holds none of.
    fn release_unheld(&self, inos: &[u64]) {
        let mut items = Vec::new();
        {
            let mut m = self.meta.lock().unwrap();
            for &ino in inos {
                if m.nodes.get(&ino).is_some_and(|n| n.caller_refs == 0) {
                    let count = m.drop_node(ino);
                    if count > 0 {
                        items.push(ForgetItem { ino, count });
                    }
                }
            }
        }
        self.send_forgets(items);
    }

    fn send_forgets(&self, items: Vec<ForgetItem>) {
        for chunk in items.chunks(MAX_FORGET_ITEMS) {
            let req: Request = ForgetReq {
                items: List::new(chunk.to_vec()).expect("chunk within the limit"),
            }
            .into();
            // Not waited for. With no connection up there is nothing to send it on;
            // if the session is then lost the server gave the references back itself,
            // and if it is resumed they stay held until the session ends.
            self.client.post(&req, Cred::default());
        }
    }

    fn server_fh(&self, fh: u64) -> Result<u64> {
        match self.open.lock().unwrap().get(&fh) {
            Some(f) => f.server_fh.ok_or_else(|| {
                Error::new(libc::ESTALE, "the server restarted and this file is gone")
            }),
            // Handles the kernel made before we knew of them (or 0): pass through.
            None => Ok(0),
        }
    }

    fn track(&self, ino: u64, gen: u64, flags: i32, server_fh: u64) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap().insert(
            fh,
            OpenFile {
                ino,
                gen,
                flags,
                server_fh: Some(server_fh),
            },
        );
        fh
    }

    /// After unlink/rmdir: the inode's attributes as they are now. Kept while we have
    /// it open (fstat of an open unlinked file shows nlink 0); an inode without names
    /// and not open is gone, so its attributes are dropped.
    fn removed(&self, a: &Attr) {
        let open_here = self.open.lock().unwrap().values().any(|f| f.ino == a.ino);
        if a.nlink > 0 || open_here {
            self.remember(a);
        } else {
            self.forget_attr(a.ino);
        }
    }

    /// A handle of `ino` was closed: an unlinked inode no longer open here may be gone,
    /// so its attributes (nlink 0) are not kept.
    fn closed(&self, ino: u64) {
        if self.open.lock().unwrap().values().any(|f| f.ino == ino) {
            return;
        }
        let mut m = self.meta.lock().unwrap();
        if m.attrs.get(&ino).is_some_and(|(a, _)| a.nlink == 0) {
            m.attrs.remove(&ino);
        }
    }

    /// Server-side counters as JSON (`zcfs stat ADDR:PORT`).
    pub fn server_stats(&self) -> Result<Vec<u8>> {
        Ok(self.call(&Ctx::default(), StatsReq {})?.json.into_bytes())
    }

    /// References to `ino` (held for our caller, held by the server for us).
    pub fn references(&self, ino: u64) -> (u64, u64) {
        self.meta
            .lock()
            .unwrap()
            .nodes
            .get(&ino)
            .map_or((0, 0), |n| (n.caller_refs, n.server_refs))
    }
}

impl Backend for RemoteFs {
    fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        let n = LookupName::new(name).map_err(invalid)?;
        if let Some(a) = self.cached_lookup(parent, name) {
            return Ok(a);
        }
        let r = self.call(
            ctx,
            LookupReq {
                parent: self.node(parent),
                name: n,
            },
        )?;
        Ok(self.entry(r.attr, Some((parent, name)), false))
    }

    fn forget(&self, ino: u64, n: u64) {
        let count = {
            let mut m = self.meta.lock().unwrap();
            let Some(node) = m.nodes.get_mut(&ino) else {
                return;
            };
            node.caller_refs = node.caller_refs.saturating_sub(n);
            if node.caller_refs > 0 {
                return;
            }
            m.drop_node(ino)
        };
        if count > 0 {
            self.send_forgets(vec![ForgetItem { ino, count }]);
        }
    }

    fn getattr(&self, ino: u64) -> Result<Attr> {
        if let Some((a, t)) = self.meta.lock().unwrap().attrs.get(&ino) {
            if self.ttl_ok(t) {
                return Ok(a.clone());
            }
        }
        let r = self.call(
            &Ctx::default(),
            GetattrReq {
                node: self.node(ino),
            },
        )?;
        self.remember(&r.attr);
        Ok(r.attr)
    }

    fn setattr(&self, ctx: &Ctx, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.forget_attr(ino);
        let r = self.call(
            ctx,
            SetattrReq {
                node: self.node(ino),
                set: set.clone(),
            },
        )?;
        self.remember(&r.attr);
        Ok(r.attr)
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let r = self.call(
            &Ctx::default(),
            ReadlinkReq {
                node: self.node(ino),
            },
        )?;
        Ok(r.target.into_bytes())
    }

    fn mknod(&self, ctx: &Ctx, parent: u64, n: &[u8], mode: u32, rdev: u32) -> Result<Attr> {
        let req = MknodReq {
            parent: self.node(parent),
            name: name(n)?,
            mode,
            rdev,
        };
        self.forget_name(parent, n);
        let r = self.call(ctx, req)?;
        Ok(self.entry(r.attr, Some((parent, n)), true))
    }

    fn mkdir(&self, ctx: &Ctx, parent: u64, n: &[u8], mode: u32) -> Result<Attr> {
        let req = MkdirReq {
            parent: self.node(parent),
            name: name(n)?,
            mode,
        };
        self.forget_name(parent, n);
        let r = self.call(ctx, req)?;
        Ok(self.entry(r.attr, Some((parent, n)), true))
    }

    fn unlink(&self, ctx: &Ctx, parent: u64, n: &[u8]) -> Result<Attr> {
        let req = UnlinkReq {
            parent: self.node(parent),
            name: name(n)?,
        };
        self.forget_name(parent, n);
        let r = self.call(ctx, req)?;
        self.removed(&r.attr);
        Ok(r.attr)
    }

    fn rmdir(&self, ctx: &Ctx, parent: u64, n: &[u8]) -> Result<Attr> {
        let req = RmdirReq {
            parent: self.node(parent),
            name: name(n)?,
        };
        self.forget_name(parent, n);
        let r = self.call(ctx, req)?;
        self.removed(&r.attr);
        Ok(r.attr)
    }

    fn symlink(&self, ctx: &Ctx, parent: u64, n: &[u8], target: &[u8]) -> Result<Attr> {
        let req = SymlinkReq {
            parent: self.node(parent),
            name: name(n)?,
            target: SymlinkTarget::new(target).map_err(invalid)?,
        };
        self.forget_name(parent, n);
        let r = self.call(ctx, req)?;
        Ok(self.entry(r.attr, Some((parent, n)), true))
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        n: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        let req = RenameReq {
            parent: self.node(parent),
            name: name(n)?,
            new_parent: self.node(newparent),
            new_name: name(newname)?,
            flags: RenameFlags::new(flags).map_err(invalid)?,
        };
        // Names, parents and the inodes involved all change: start afresh (what we
        // know of each inode's generation and references stays true).
        self.meta.lock().unwrap().drop_caches();
        self.call(ctx, req).map(|_| ())
    }

    fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        let req = LinkReq {
            node: self.node(ino),
            new_parent: self.node(newparent),
            new_name: name(newname)?,
        };
        // The inode's link count changes: its cached attributes are replaced by the
        // reply's.
        self.forget_attr(ino);
        self.forget_name(newparent, newname);
        let r = self.call(ctx, req)?;
        Ok(self.entry(r.attr, Some((newparent, newname)), true))
    }

    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64> {
        if flags & libc::O_TRUNC != 0 {
            self.forget_attr(ino);
        }
        let node = self.node(ino);
        let r = self.call(ctx, OpenReq { node, flags })?;
        Ok(self.track(ino, node.gen, flags, r.fh))
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        n: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, u64)> {
        let req = CreateReq {
            parent: self.node(parent),
            name: name(n)?,
            mode,
            flags,
        };
        self.forget_name(parent, n);
        let r = self.call(ctx, req)?;
        let a = self.entry(r.attr, Some((parent, n)), true);
        let fh = self.track(
            a.ino,
            a.generation,
            flags & !libc::O_CREAT & !libc::O_EXCL,
            r.fh,
        );
        Ok((a, fh))
    }

    fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        sink: &mut ReadSink<'_>,
    ) -> Result<()> {
        let req: Request = ReadReq {
            node: self.node(ino),
            fh: self.server_fh(fh)?,
            offset,
            size: size.min(MAX_DATA as u32),
        }
        .into();
        let r = self.client.call(&req, Cred::default(), &[])?;
        self.read_bytes
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        self.client
            .bytes_received
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        sink(&[&r.data])
    }

    fn write(&self, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.forget_attr(ino);
        let (node, sfh) = (self.node(ino), self.server_fh(fh)?);
        let mut done = 0usize;
        for chunk in data.chunks(MAX_DATA) {
            let req = WriteReq {
                node,
                fh: sfh,
                offset: offset + done as u64,
                size: chunk.len() as u32,
            };
            done += self.call_with(&Ctx::default(), req, &[chunk])?.written as usize;
        }
        self.written_bytes.fetch_add(done as u64, Ordering::Relaxed);
        Ok(done as u32)
    }

    fn flush(&self, ino: u64, fh: u64) -> Result<()> {
        let fh = self.server_fh(fh).unwrap_or(0);
        let node = self.node(ino);
        self.call(&Ctx::default(), FlushReq { node, fh })
            .map(|_| ())
    }

    fn release(&self, ino: u64, fh: u64) -> Result<()> {
        let f = self.open.lock().unwrap().remove(&fh);
        if f.is_some() {
            self.closed(ino);
        }
        match f.and_then(|f| f.server_fh) {
            Some(sfh) => {
                let node = self.node(ino);
                self.call(&Ctx::default(), ReleaseReq { node, fh: sfh })
                    .map(|_| ())
            }
            None => Ok(()),
        }
    }

    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let fh = self.server_fh(fh).unwrap_or(0);
        let node = self.node(ino);
        self.call(&Ctx::default(), FsyncReq { node, fh, datasync })
            .map(|_| ())
    }

    fn readdir(
        &self,
        ino: u64,
        offset: u64,
        plus: bool,
        f: &mut dyn FnMut(DirEntry) -> bool,
    ) -> Result<()> {
        let mut cookie = offset;
        let dir = self.node(ino);
        let max_entries = if plus {
            READDIRPLUS_BATCH
        } else {
            MAX_ENTRIES as u32
        };
        loop {
            let req = ReaddirReq {
                dir,
                cookie,
                plus,
                max_entries,
            };
            let es = self.call(&Ctx::default(), req)?.entries.into_vec();
            if es.is_empty() {
                return Ok(());
            }
            // With `plus` each entry came with a server reference; each one passed on
            // is a reference of our caller's.
            let mut left: Vec<u64> = if plus {
                let mut m = self.meta.lock().unwrap();
                for e in &es {
                    match &e.attr {
                        Some(a) => self.remember_locked(&mut m, a),
                        None => {
                            m.nodes.entry(e.ino).or_default();
                        }
                    }
                    m.nodes.get_mut(&e.ino).expect("present").server_refs += 1;
                }
                es.iter().map(|e| e.ino).collect()
            } else {
                Vec::new()
            };
            let mut more = true;
            for (i, e) in es.into_iter().enumerate() {
                cookie = e.next;
                if plus {
                    let mut m = self.meta.lock().unwrap();
                    m.nodes.get_mut(&e.ino).expect("present").caller_refs += 1;
                }
                if !f(e) {
                    if plus {
                        left.drain(..=i);
                    }
                    more = false;
                    break;
                }
            }
            if plus && more {
                left.clear();
            }
            // Entries fetched but not passed on: the server's references go back.
            self.release_unheld(&left);
            if !more {
                return Ok(());
            }
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        Ok(self.call(&Ctx::default(), StatfsReq {})?.statfs)
    }

    fn setxattr(&self, ino: u64, n: &[u8], value: &[u8], flags: i32) -> Result<()> {
        let req = SetxattrReq {
            node: self.node(ino),
            name: XattrName::new(n).map_err(invalid)?,
            value: XattrValue::new(value).map_err(invalid)?,
            flags,
        };
        {
            let mut m = self.meta.lock().unwrap();
            m.attrs.remove(&ino);
            m.no_xattr.remove(&(ino, n.to_vec()));
        }
        self.call(&Ctx::default(), req).map(|_| ())
    }

    fn getxattr(&self, ino: u64, n: &[u8]) -> Result<Vec<u8>> {
        let xname = XattrName::new(n).map_err(invalid)?;
        let key = (ino, n.to_vec());
        if self
            .meta
            .lock()
            .unwrap()
            .no_xattr
            .get(&key)
            .is_some_and(|t| self.ttl_ok(t))
        {
            return Err(Error::errno(libc::ENODATA));
        }
        let req = GetxattrReq {
            node: self.node(ino),
            name: xname,
        };
        match self.call(&Ctx::default(), req) {
            Ok(r) => Ok(r.value.into_bytes()),
            Err(e) => {
                if e.errno == libc::ENODATA && self.caching() {
                    self.meta
                        .lock()
                        .unwrap()
                        .no_xattr
                        .insert(key, Instant::now());
                }
                Err(e)
            }
        }
    }

    fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let r = self.call(
            &Ctx::default(),
            ListxattrReq {
                node: self.node(ino),
            },
        )?;
        Ok(r.names
            .into_vec()
            .into_iter()
            .map(|n| n.into_bytes())
            .collect())
    }

    fn removexattr(&self, ino: u64, n: &[u8]) -> Result<()> {
        let req = RemovexattrReq {
            node: self.node(ino),
            name: XattrName::new(n).map_err(invalid)?,
        };
        self.forget_attr(ino);
        self.call(&Ctx::default(), req).map(|_| ())
    }

    fn fallocate(&self, ino: u64, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.forget_attr(ino);
        let req = FallocateReq {
            node: self.node(ino),
            fh: self.server_fh(fh)?,
            offset,
            len,
            mode,
        };
        self.call(&Ctx::default(), req).map(|_| ())
    }

    fn copy_stats(&self) -> CopyStats {
        CopyStats {
            payload_bytes_read: self.read_bytes.load(Ordering::Relaxed),
            payload_bytes_written: self.written_bytes.load(Ordering::Relaxed),
            // Writes leave from the caller's buffer by writev; read data is received
            // into the buffer handed to the caller.
            user_copy_bytes: 0,
        }
    }

    fn sync_all(&self) -> Result<()> {
        self.call(&Ctx::default(), SyncAllReq {}).map(|_| ())
    }
}
