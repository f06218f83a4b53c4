//! RemoteFs: the Backend over a zcfs server.

use crate::{Client, ClientConfig, Response};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zcfs_backend::*;
use zcfs_protocol::{Cred, Reply, Request, MAX_DATA, MAX_ENTRIES};

struct OpenFile {
    ino: u64,
    flags: i32,
    /// The server's handle; None once the server lost it (restart and the file is gone).
    server_fh: Option<u64>,
}

#[derive(Default)]
struct Caches {
    attrs: HashMap<u64, (Attr, Instant)>,
    names: HashMap<(u64, Vec<u8>), (u64, Instant)>,
    /// Extended attributes known to be absent: `ls -l` asks for ACLs of every entry.
    no_xattr: HashMap<(u64, Vec<u8>), Instant>,
}

pub struct RemoteFs {
    client: Arc<Client>,
    caches: Arc<Mutex<Caches>>,
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

fn decode(req: &Request, r: &Response) -> Result<Reply> {
    Reply::decode(req.op(), &r.hdr, &r.body)
        .map_err(|e| Error::new(libc::EIO, format!("malformed reply: {e}")))
}

fn bad_reply() -> Error {
    Error::new(libc::EIO, "unexpected reply from the server")
}

impl RemoteFs {
    /// Connect to a server (fails at once with a clear error if it cannot).
    pub fn connect(cfg: ClientConfig) -> Result<RemoteFs> {
        let client = Arc::new(Client::new(cfg));
        let fs = RemoteFs {
            client: client.clone(),
            caches: Arc::new(Mutex::new(Caches::default())),
            open: Arc::new(Mutex::new(HashMap::new())),
            next_fh: AtomicU64::new(1),
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        };
        let (open, caches) = (fs.open.clone(), fs.caches.clone());
        client.set_on_restart(Box::new(move |c: &Client| {
            *caches.lock().unwrap() = Caches::default();
            // Re-open what was open, so the new server process knows the handles (an
            // unlinked-but-open file did not survive the restart: that handle is stale).
            let files: Vec<(u64, u64, i32)> = open
                .lock()
                .unwrap()
                .iter()
                .map(|(fh, f)| (*fh, f.ino, f.flags))
                .collect();
            for (fh, ino, flags) in files {
                let req = Request::Open {
                    ino,
                    flags: flags & !libc::O_TRUNC & !libc::O_CREAT,
                };
                let server_fh = c
                    .submit(&req, Cred::default(), &[])
                    .and_then(crate::Ticket::wait)
                    .ok()
                    .map(|r| r.hdr.aux);
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

    fn call(&self, ctx: &Ctx, req: Request) -> Result<Reply> {
        let r = self.client.call(&req, cred(ctx), &[])?;
        decode(&req, &r)
    }

    fn ttl_ok(&self, t: &Instant) -> bool {
        t.elapsed() < self.client.config().attr_ttl
    }

    fn remember(&self, a: &Attr) {
        if !self.client.config().attr_ttl.is_zero() {
            self.caches
                .lock()
                .unwrap()
                .attrs
                .insert(a.ino, (a.clone(), Instant::now()));
        }
    }

    fn forget_attr(&self, ino: u64) {
        self.caches.lock().unwrap().attrs.remove(&ino);
    }

    fn forget_name(&self, parent: u64, name: &[u8]) {
        let mut c = self.caches.lock().unwrap();
        c.names.remove(&(parent, name.to_vec()));
        c.attrs.remove(&parent);
    }

    fn entry(&self, parent: u64, name: &[u8], r: Result<Reply>) -> Result<Attr> {
        match r? {
            Reply::Attr(a) => {
                self.remember(&a);
                if !self.client.config().attr_ttl.is_zero() {
                    let mut c = self.caches.lock().unwrap();
                    c.names
                        .insert((parent, name.to_vec()), (a.ino, Instant::now()));
                    c.attrs.remove(&parent);
                }
                Ok(a)
            }
            _ => Err(bad_reply()),
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

    fn track(&self, ino: u64, flags: i32, server_fh: u64) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.open.lock().unwrap().insert(
            fh,
            OpenFile {
                ino,
                flags,
                server_fh: Some(server_fh),
            },
        );
        fh
    }

    /// Server-side counters as JSON (`zcfs stat ADDR:PORT`).
    pub fn server_stats(&self) -> Result<Vec<u8>> {
        match self.call(&Ctx::default(), Request::Stats)? {
            Reply::Stats(j) => Ok(j),
            _ => Err(bad_reply()),
        }
    }
}

impl Backend for RemoteFs {
    fn lookup(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        let cached = {
            let c = self.caches.lock().unwrap();
            c.names
                .get(&(parent, name.to_vec()))
                .filter(|(_, t)| self.ttl_ok(t))
                .map(|(i, _)| *i)
        };
        if let Some(ino) = cached {
            if let Ok(a) = self.getattr(ino) {
                return Ok(a);
            }
        }
        let r = self.call(
            ctx,
            Request::Lookup {
                parent,
                name: name.to_vec(),
            },
        );
        self.entry(parent, name, r)
    }

    fn getattr(&self, ino: u64) -> Result<Attr> {
        if let Some((a, t)) = self.caches.lock().unwrap().attrs.get(&ino) {
            if self.ttl_ok(t) {
                return Ok(a.clone());
            }
        }
        match self.call(&Ctx::default(), Request::Getattr { ino })? {
            Reply::Attr(a) => {
                self.remember(&a);
                Ok(a)
            }
            _ => Err(bad_reply()),
        }
    }

    fn setattr(&self, ctx: &Ctx, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.forget_attr(ino);
        match self.call(
            ctx,
            Request::Setattr {
                ino,
                set: set.clone(),
            },
        )? {
            Reply::Attr(a) => {
                self.remember(&a);
                Ok(a)
            }
            _ => Err(bad_reply()),
        }
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        match self.call(&Ctx::default(), Request::Readlink { ino })? {
            Reply::Bytes(b) => Ok(b),
            _ => Err(bad_reply()),
        }
    }

    fn mknod(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr> {
        let r = self.call(
            ctx,
            Request::Mknod {
                parent,
                name: name.to_vec(),
                mode,
                rdev,
            },
        );
        self.entry(parent, name, r)
    }

    fn mkdir(&self, ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        let r = self.call(
            ctx,
            Request::Mkdir {
                parent,
                name: name.to_vec(),
                mode,
            },
        );
        self.entry(parent, name, r)
    }

    fn unlink(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        let target = self
            .caches
            .lock()
            .unwrap()
            .names
            .get(&(parent, name.to_vec()))
            .map(|(i, _)| *i);
        self.forget_name(parent, name);
        if let Some(t) = target {
            self.forget_attr(t);
        }
        self.call(
            ctx,
            Request::Unlink {
                parent,
                name: name.to_vec(),
            },
        )?;
        Ok(Attr {
            ino: target.unwrap_or(0),
            ..Default::default()
        })
    }

    fn rmdir(&self, ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> {
        self.forget_name(parent, name);
        self.call(
            ctx,
            Request::Rmdir {
                parent,
                name: name.to_vec(),
            },
        )?;
        Ok(Attr::default())
    }

    fn symlink(&self, ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        let r = self.call(
            ctx,
            Request::Symlink {
                parent,
                name: name.to_vec(),
                target: target.to_vec(),
            },
        );
        self.entry(parent, name, r)
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        {
            // Names, parents and the inodes involved all change: start afresh.
            let mut c = self.caches.lock().unwrap();
            *c = Caches::default();
        }
        let req = Request::Rename {
            parent,
            name: name.to_vec(),
            newparent,
            newname: newname.to_vec(),
            flags,
        };
        self.call(ctx, req).map(|_| ())
    }

    fn link(&self, ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        self.forget_attr(ino);
        let r = self.call(
            ctx,
            Request::Link {
                ino,
                newparent,
                newname: newname.to_vec(),
            },
        );
        self.entry(newparent, newname, r)
    }

    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64> {
        if flags & libc::O_TRUNC != 0 {
            self.forget_attr(ino);
        }
        match self.call(ctx, Request::Open { ino, flags })? {
            Reply::Handle(sfh) => Ok(self.track(ino, flags, sfh)),
            _ => Err(bad_reply()),
        }
    }

    fn create(
        &self,
        ctx: &Ctx,
        parent: u64,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, u64)> {
        self.forget_name(parent, name);
        match self.call(
            ctx,
            Request::Create {
                parent,
                name: name.to_vec(),
                mode,
                flags,
            },
        )? {
            Reply::Created(a, sfh) => {
                self.remember(&a);
                Ok((
                    a.clone(),
                    self.track(a.ino, flags & !libc::O_CREAT & !libc::O_EXCL, sfh),
                ))
            }
            _ => Err(bad_reply()),
        }
    }

    fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        sink: &mut ReadSink<'_>,
    ) -> Result<()> {
        let size = size.min(MAX_DATA as u32);
        let req = Request::Read {
            ino,
            fh: self.server_fh(fh)?,
            offset,
            size,
        };
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
        let sfh = self.server_fh(fh)?;
        let mut done = 0usize;
        for chunk in data.chunks(MAX_DATA) {
            let req = Request::Write {
                ino,
                fh: sfh,
                offset: offset + done as u64,
                size: chunk.len() as u32,
            };
            let r = self.client.call(&req, Cred::default(), &[chunk])?;
            match decode(&req, &r)? {
                Reply::Written(n) => done += n as usize,
                _ => return Err(bad_reply()),
            }
        }
        self.written_bytes.fetch_add(done as u64, Ordering::Relaxed);
        Ok(done as u32)
    }

    fn flush(&self, ino: u64, fh: u64) -> Result<()> {
        let fh = self.server_fh(fh).unwrap_or(0);
        self.call(&Ctx::default(), Request::Flush { ino, fh })
            .map(|_| ())
    }

    fn release(&self, ino: u64, fh: u64) -> Result<()> {
        let f = self.open.lock().unwrap().remove(&fh);
        match f.and_then(|f| f.server_fh) {
            Some(sfh) => self
                .call(&Ctx::default(), Request::Release { ino, fh: sfh })
                .map(|_| ()),
            None => Ok(()),
        }
    }

    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        let fh = self.server_fh(fh).unwrap_or(0);
        self.call(&Ctx::default(), Request::Fsync { ino, fh, datasync })
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
        loop {
            let req = Request::Readdir {
                ino,
                cookie,
                plus,
                max_entries: MAX_ENTRIES as u32,
            };
            let Reply::Entries(es) = self.call(&Ctx::default(), req)? else {
                return Err(bad_reply());
            };
            if es.is_empty() {
                return Ok(());
            }
            for e in es {
                cookie = e.next;
                if let Some(a) = &e.attr {
                    self.remember(a);
                }
                if !f(e) {
                    return Ok(());
                }
            }
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        match self.call(&Ctx::default(), Request::Statfs)? {
            Reply::StatFs(s) => Ok(s),
            _ => Err(bad_reply()),
        }
    }

    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.forget_attr(ino);
        self.caches
            .lock()
            .unwrap()
            .no_xattr
            .remove(&(ino, name.to_vec()));
        let req = Request::Setxattr {
            ino,
            name: name.to_vec(),
            value: value.to_vec(),
            flags,
        };
        self.call(&Ctx::default(), req).map(|_| ())
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let key = (ino, name.to_vec());
        if self
            .caches
            .lock()
            .unwrap()
            .no_xattr
            .get(&key)
            .is_some_and(|t| self.ttl_ok(t))
        {
            return Err(Error::errno(libc::ENODATA));
        }
        match self.call(
            &Ctx::default(),
            Request::Getxattr {
                ino,
                name: name.to_vec(),
            },
        ) {
            Ok(Reply::Bytes(b)) => Ok(b),
            Ok(_) => Err(bad_reply()),
            Err(e) => {
                if e.errno == libc::ENODATA && !self.client.config().attr_ttl.is_zero() {
                    self.caches
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
        match self.call(&Ctx::default(), Request::Listxattr { ino })? {
            Reply::Names(n) => Ok(n),
            _ => Err(bad_reply()),
        }
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.forget_attr(ino);
        self.call(
            &Ctx::default(),
            Request::Removexattr {
                ino,
                name: name.to_vec(),
            },
        )
        .map(|_| ())
    }

    fn fallocate(&self, ino: u64, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.forget_attr(ino);
        let fh = self.server_fh(fh)?;
        self.call(
            &Ctx::default(),
            Request::Fallocate {
                ino,
                fh,
                offset,
                len,
                mode,
            },
        )
        .map(|_| ())
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
        self.call(&Ctx::default(), Request::SyncAll).map(|_| ())
    }
}
