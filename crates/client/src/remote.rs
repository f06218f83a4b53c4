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
//!   waited for, sent again if its connection is lost) and the cached names of the
//!   inode dropped. A name is answered from the cache only while the server holds a
//!   reference to its inode, so the number cannot have been reused meanwhile.
//! - A readdirplus listing counts each entry's server reference as the listing's until
//!   it passes the entry on; then, in one step, as the caller's. A node keeps living
//!   while a listing holds references to it (whatever the caller forgets meanwhile),
//!   and the listing gives back exactly the references of the entries it did not pass
//!   on, also when the callback panics.
//! - Server references belong to one session: each reply says which (its epoch), and
//!   what came from a session the client has since lost is not counted.
//! - Caches: attributes and names for the attribute timeout. An operation that changes
//!   an inode refreshes (from its reply) or drops every cached copy of it.

mod behind;
mod known_dirs;
mod listing;
mod meta;
mod open;
mod pipelined;

pub use pipelined::{ReadTicket, WriteTicket};

use crate::{lock, Caller, Client, ClientConfig, Ticket};
use behind::{GatherSink, GatheredWrite, Report, WriteBehind};
pub use behind::{GATHER_BYTES, GATHER_DELAY, GATHER_WRITES, GATHER_WRITE_MAX, WRITE_BEHIND_MAX};
use known_dirs::{Change, KnownDirs};
use listing::Listing;
use meta::Meta;
use open::OpenFiles;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use zcfs_backend::*;
use zcfs_protocol::{
    AccessReq, CreateReq, FallocateReq, FlushReq, FsyncReq, GetattrReq, GetxattrReq, LinkReq,
    ListxattrReq, LookupReq, LseekReq, MkdirReq, MknodReq, OpenReq, ReadReq, ReaddirReq,
    ReadlinkReq, ReleaseReq, RemovexattrReq, RenameReq, RmdirReq, SetattrReq, SetxattrReq,
    StatfsReq, StatsReq, SymlinkReq, SyncAllReq, TmpFileReq, UnlinkReq, WriteReq,
};
use zcfs_protocol::{
    Cred, ForgetItem, ForgetReq, List, LookupName, MadeReply, Name, NodeRef, Operation, ProtoError,
    RemovedReply, RenameFlags, Request, SymlinkTarget, Wire, XattrName, XattrValue, MAX_DATA,
    MAX_ENTRIES, MAX_FORGET_ITEMS,
};

/// Entries asked for per readdirplus round trip: each carries a reference, and those a
/// caller does not take (its buffer is full) are given back, so ask for about what a
/// FUSE reply holds.
const READDIRPLUS_BATCH: u32 = 128;

/// The largest write-behind write sent with `commit` (made durable before its reply):
/// a close after small writes then needs no FLUSH round trip. Larger writes leave the
/// commit to the close, which costs one round trip for many bytes.
pub const COMMIT_WRITE_MAX: usize = 64 << 10;

/// A write's bytes as the frontend hands them over.
enum WriteBytes<'a> {
    Mem(&'a [u8]),
    /// In a pipe: spliced into the socket (`Client::submit_piped`).
    Piped(&'a mut dyn PipedData),
}

impl WriteBytes<'_> {
    fn len(&self) -> usize {
        match self {
            WriteBytes::Mem(d) => d.len(),
            WriteBytes::Piped(p) => p.remaining(),
        }
    }
}

/// The server's handle behind our handle `fh`.
fn server_fh_of(open: &Mutex<OpenFiles>, fh: u64) -> Result<u64> {
    match lock(open).get(fh) {
        Some(f) if f.reopen_owed => Err(Error::new(
            libc::ENOTCONN,
            "this file is not open on the server again yet: the connection was lost while \
             it was re-opened after the server lost the session",
        )),
        Some(f) => f
            .server_fh
            .ok_or_else(|| Error::new(libc::ESTALE, "the server restarted and this file is gone")),
        // Handles the kernel made before we knew of them (or 0): pass through.
        None => Ok(0),
    }
}

/// A request carrying a server handle, refused EBADF, after the session changed since
/// the handle was read (`epoch`): it was resent into the new session with the old
/// session's handle, while the reconnection re-opened the file under a new one. Sent
/// again with that one, it is answered.
fn stale_handle(client: &Client, e: &Error, epoch: u64) -> bool {
    e.errno == libc::EBADF && client.epoch() != epoch
}

/// A read of `size` bytes at `offset` through server handle `sfh`.
fn read_req(node: NodeRef, sfh: u64, offset: u64, size: u32) -> Request {
    ReadReq {
        node,
        fh: sfh,
        offset,
        size: size.min(MAX_DATA as u32),
    }
    .into()
}

/// A read's reply carries at most what was asked for: more is a broken (or, without
/// MACs, forged) reply, never handed on.
fn checked_read(data: &[u8], size: u32) -> Result<()> {
    if data.len() > size as usize {
        return Err(Error::new(
            libc::EIO,
            format!("the server sent {} bytes for a read of {size}", data.len()),
        ));
    }
    Ok(())
}

/// Who opened a file: uid and gid, supplementary groups.
type Opener = (Cred, Vec<u32>);

/// The open that makes an open file known to a new session again: as it was opened,
/// less what only the first open does (create, truncate).
fn reopen_req(ino: u64, gen: u64, flags: i32) -> Request {
    OpenReq {
        node: NodeRef::new(ino, gen),
        flags: flags & !libc::O_TRUNC & !libc::O_CREAT & !libc::O_EXCL,
    }
    .into()
}

/// The release of server handle `fh` of `ino`.
fn release_req(ino: u64, gen: u64, fh: u64) -> Request {
    ReleaseReq {
        node: NodeRef::new(ino, gen),
        fh,
    }
    .into()
}

struct OpenFile {
    ino: u64,
    gen: u64,
    flags: i32,
    /// The server's handle; None once the server lost it (restart and the file is gone,
    /// or not re-opened yet: `reopen_owed`).
    server_fh: Option<u64>,
    /// Its re-open after a lost session was cut short with the connection: the next
    /// connection made re-opens it (`RestartHook`), with the same request id
    /// (`reopen_id`, 0 when none is owed).
    reopen_owed: bool,
    reopen_id: u64,
    /// The session epoch `server_fh` belongs to.
    epoch: u64,
    /// Who opened it: re-opened as them after a server restart.
    opener: Opener,
    /// Writes through it begun (counted): a reply said written, which is durable
    /// only once a commit is (group commit).
    written: u64,
    /// Of those, how many had left the client (every request of the write sent, or
    /// it failed): an fsync or flush sent after them covers them.
    sent: u64,
    /// `sent` when its last successful fsync or flush was sent: a write begun after
    /// that, or still being sent then, is not made durable by it (`written > durable`).
    durable: u64,
    /// The server restarted (or lost our session) while `written > durable`: what its
    /// previous instance answered may be gone, so the next fsync or flush reports EIO
    /// (as an NFS client learns from the write verifier).
    lost: bool,
    /// Writes begun through it not known to be committed: every one counts until its
    /// reply says the server committed it (`WriteReq::commit`), or a flush or fsync
    /// covering every write sent makes it 0. At 0 (and nothing being sent), a close
    /// needs no FLUSH round trip.
    uncommitted: u64,
    /// Changes of the inode other than writes (`changed_uncommitted`) begun while it
    /// was open, and of those how many were answered: a flush or fsync sent after a
    /// change was answered covers it; one begun before its reply, or still being
    /// answered, is not covered (its `uncommitted` count stays).
    changes: u64,
    changed: u64,
    /// The server restarted while another handle of the file had writes not durable:
    /// the next fsync through this one reports EIO (fsync is of the file; under the
    /// writeback cache the kernel writes through any handle). Once.
    peer_lost: bool,
}

#[cfg(test)]
impl OpenFile {
    fn for_test(ino: u64) -> OpenFile {
        OpenFile {
            ino,
            gen: 1,
            flags: 0,
            server_fh: Some(1),
            reopen_owed: false,
            reopen_id: 0,
            epoch: 0,
            opener: (Caller::process().cred, Vec::new()),
            written: 0,
            sent: 0,
            durable: 0,
            lost: false,
            uncommitted: 0,
            changes: 0,
            changed: 0,
            peer_lost: false,
        }
    }
}

pub struct RemoteFs {
    client: Arc<Client>,
    meta: Arc<Mutex<Meta>>,
    open: Arc<Mutex<OpenFiles>>,
    next_fh: AtomicU64,
    read_bytes: Arc<AtomicU64>,
    written_bytes: AtomicU64,
    /// Flushes and fsyncs sent behind the writes they cover (`durable_behind_writes`).
    flushes_behind: AtomicU64,
    /// Flushes and fsyncs that needed no round trip: every write was committed
    /// (`durable_by_commits`).
    durable_by_commits: AtomicU64,
    /// Directories whose every name we know (lookups of other names answered here).
    known: Mutex<KnownDirs>,
    /// Lookups answered "no such name" from `known`.
    lookups_answered_here: AtomicU64,
    behind: WriteBehind,
}

/// Who the caller is, as the request carries it: uid, gid and supplementary groups.
fn cred(ctx: &Ctx) -> Caller<'_> {
    Caller {
        cred: Cred {
            uid: ctx.cred.uid,
            gid: ctx.cred.gid,
        },
        groups: &ctx.cred.groups,
    }
}

/// This process as the caller, for requests made for no caller in particular
/// (statfs, flush, fsync, sync, stats): a server that knows this process (a Unix socket)
/// lets it act as itself, whoever it is.
/// A write through a handle being sent (`RemoteFs::written_through`): dropped once it
/// left the client, or failed.
pub(super) struct Sending<'a> {
    fs: &'a RemoteFs,
    fh: u64,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if let Some(f) = lock(&self.fs.open).get_mut(self.fh) {
            f.sent += 1;
        }
    }
}

/// Sends the mount's gathered small writes (`behind::Gather`) through its client.
struct BatchSender {
    client: Arc<Client>,
    open: Arc<Mutex<OpenFiles>>,
}

impl GatherSink for BatchSender {
    fn send_batch(&self, writes: &[&GatheredWrite], gathered: bool) -> Vec<Result<Ticket>> {
        if gathered {
            self.client.count_gathered(writes.len());
        }
        // A lost connection is made again first, and with it the files re-opened:
        // the server's handles are looked up after that (as `server_fh` does).
        let revived = self.client.revive_lost();
        let handles: Vec<Result<u64>> = writes
            .iter()
            .map(|w| {
                revived
                    .clone()
                    .and_then(|()| server_fh_of(&self.open, w.fh))
            })
            .collect();
        let msgs: Vec<(Request, Caller<'_>, &[u8])> = writes
            .iter()
            .zip(&handles)
            .filter_map(|(w, h)| {
                let req = WriteReq {
                    node: w.node,
                    fh: *h.as_ref().ok()?,
                    offset: w.offset,
                    size: w.data.len() as u32,
                    commit: w.commit,
                };
                let cred = Caller {
                    cred: w.cred,
                    groups: &w.groups,
                };
                Some((req.into(), cred, &w.data[..]))
            })
            .collect();
        let mut sent = self.client.submit_batch(&msgs).map(Vec::into_iter);
        // Each has left the client, or failed to (`Sending`): a flush or fsync sent
        // from now on covers it.
        {
            let mut open = lock(&self.open);
            for w in writes {
                if let Some(f) = open.get_mut(w.fh) {
                    f.sent += 1;
                }
            }
        }
        handles
            .into_iter()
            .map(|h| {
                h?;
                match &mut sent {
                    Ok(tickets) => Ok(tickets.next().expect("a ticket per request sent")),
                    Err(e) => Err(e.clone()),
                }
            })
            .collect()
    }
}

/// A change other than a write being made (`RemoteFs::changed_uncommitted`): counted
/// as answered for the handles it was begun against when dropped; if the server said
/// it committed the change before answering (`committed`), it no longer counts as
/// uncommitted either.
pub(super) struct Changing<'a> {
    fs: &'a RemoteFs,
    fhs: Vec<u64>,
    committed: bool,
}

impl Drop for Changing<'_> {
    fn drop(&mut self) {
        let mut open = lock(&self.fs.open);
        for &h in &self.fhs {
            if let Some(f) = open.get_mut(h) {
                f.changed += 1;
                // The count this change added at its start is still there: nothing
                // clears `uncommitted` while a change is being answered (`made_durable`
                // needs every change begun answered before its round trip).
                if self.committed {
                    f.uncommitted = f.uncommitted.saturating_sub(1);
                }
            }
        }
    }
}

/// What a flush or fsync sent now covers of a handle: the writes sent and the changes
/// answered before it.
#[derive(Clone, Copy)]
struct Mark {
    sent: u64,
    changed: u64,
}

/// A reply of a change of a directory: its attributes and name-set state after it.
trait DirAfter {
    fn dir_after(&self) -> (Option<&Attr>, Option<DirState>);
}

macro_rules! dir_after {
    ($($t:ty),*) => {$(
        impl DirAfter for $t {
            fn dir_after(&self) -> (Option<&Attr>, Option<DirState>) {
                (self.parent.as_ref(), self.parent_state)
            }
        }
    )*};
}
dir_after!(MadeReply, RemovedReply, zcfs_protocol::CreateReply);

fn own() -> Ctx {
    let c = Caller::process().cred;
    Ctx::user(c.uid, c.gid)
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
        let open = Arc::new(Mutex::new(OpenFiles::default()));
        let fs = RemoteFs {
            client: client.clone(),
            meta: Arc::new(Mutex::new(Meta::default())),
            open: open.clone(),
            next_fh: AtomicU64::new(1),
            read_bytes: Arc::new(AtomicU64::new(0)),
            written_bytes: AtomicU64::new(0),
            flushes_behind: AtomicU64::new(0),
            durable_by_commits: AtomicU64::new(0),
            known: Mutex::new(KnownDirs::default()),
            lookups_answered_here: AtomicU64::new(0),
            behind: if client.config().gather_writes {
                WriteBehind::gathering(Arc::new(BatchSender {
                    client: client.clone(),
                    open: open.clone(),
                }))
            } else {
                WriteBehind::default()
            },
        };
        let (open, meta) = (fs.open.clone(), fs.meta.clone());
        // Runs before the new connection is handed out: no reply of the new session is
        // counted before the old session's references are forgotten.
        client.set_on_restart(Box::new(move |c: &Client, conn, epoch| {
            {
                // The server holds nothing for us any more; what it said may be stale.
                // (Once per epoch: a revalidation cut short and run again must not
                // forget the references the new session has taken since.)
                let mut m = lock(&meta);
                if m.epoch != epoch {
                    m.drop_caches();
                    m.epoch = epoch;
                    m.nodes.retain(|_, n| n.caller_refs > 0);
                    for n in m.nodes.values_mut() {
                        n.server_refs = 0;
                        n.listing = 0;
                    }
                }
            }
            // Re-open what was open, so the server knows the handles again; the
            // generation makes sure it is the same file (an unlinked-but-open file
            // did not survive a restart: that handle is stale). Files re-opened in
            // this epoch already (or opened in it) are left as they are.
            let files: Vec<(u64, u64, u64, i32, Opener, u64)> = lock(&open)
                .iter()
                .filter(|(_, f)| f.epoch != epoch || f.reopen_owed)
                .map(|(fh, f)| (*fh, f.ino, f.gen, f.flags, f.opener.clone(), f.reopen_id))
                .collect();
            let mut finished = true;
            for (fh, ino, gen, flags, (cred, groups), reopen_id) in files {
                let req = reopen_req(ino, gen, flags);
                // An owed re-open goes again with its first attempt's id: if that one
                // ran (its reply lost with the connection), the reply cache answers
                // with its handle instead of opening the file a second time (review
                // 32c: the first handle leaked).
                let id = match reopen_id {
                    0 => c.next_id(),
                    id => id,
                };
                let reply = c.call_on_id(
                    conn,
                    id,
                    &req,
                    Caller {
                        cred,
                        groups: &groups,
                    },
                );
                // Lost with the connection: owed, re-opened on the next one. Refused:
                // the file is gone (stale).
                let owed = reply.as_ref().is_err_and(crate::is_transport);
                finished &= !owed;
                let server_fh = reply
                    .ok()
                    .and_then(|r| <OpenReq as Operation>::Reply::decode(&r.body).ok())
                    .map(|r| r.fh);
                let mut files = lock(&open);
                if files.get(fh).is_none() && reopen_id != 0 {
                    // Closed while this owed re-open was out: its release recorded the
                    // orphan already (review 32f: recorded again here, and the handle
                    // released twice).
                    continue;
                }
                if let Some(f) = files.get_mut(fh) {
                    if f.epoch != epoch {
                        f.lost |= f.written > f.durable;
                    }
                    f.server_fh = server_fh;
                    f.epoch = epoch;
                    f.reopen_owed = owed;
                    f.reopen_id = if owed { id } else { 0 };
                } else if owed {
                    // Closed while its re-open was out, and the reply lost: that open
                    // may have run, so it goes again with its id later, and what it
                    // opened is released (review 32e: it leaked).
                    files.orphans.push(open::OrphanReopen {
                        ino,
                        gen,
                        flags,
                        opener: (cred, groups.clone()),
                        id,
                    });
                } else if let Some(sfh) = server_fh {
                    // Closed while it was re-opened (its release found no handle of
                    // this session to send): the handle just made goes back, or the
                    // server keeps it for the session's life (review 32c).
                    drop(files);
                    if let Err(e) = c.call_on(conn, &release_req(ino, gen, sfh), Caller::process())
                    {
                        finished &= !crate::is_transport(&e);
                    }
                }
            }
            // Re-opens owed for files closed since: sent again with their ids (the
            // reply cache gives the handle of one that ran), and the handle released.
            let orphans = std::mem::take(&mut lock(&open).orphans);
            for o in orphans {
                let (cred, groups) = &o.opener;
                let reply = c.call_on_id(
                    conn,
                    o.id,
                    &reopen_req(o.ino, o.gen, o.flags),
                    Caller {
                        cred: *cred,
                        groups,
                    },
                );
                // Refused (the file is gone) or undecodable: nothing to release.
                let released = reply.map(|r| {
                    <OpenReq as Operation>::Reply::decode(&r.body)
                        .ok()
                        .map(|r| {
                            c.call_on(conn, &release_req(o.ino, o.gen, r.fh), Caller::process())
                        })
                });
                let lost = match released {
                    Err(e) | Ok(Some(Err(e))) => crate::is_transport(&e),
                    Ok(_) => false,
                };
                if lost {
                    finished = false;
                    lock(&open).orphans.push(o);
                }
            }
            let mut open = lock(&open);
            let lost: std::collections::HashSet<u64> = open
                .iter()
                .map(|(_, f)| f)
                .filter(|f| f.lost)
                .map(|f| f.ino)
                .collect();
            for f in open.values_mut().filter(|f| lost.contains(&f.ino)) {
                f.peer_lost = true;
            }
            finished
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
        Ok(self.call_in(ctx, req, data)?.0)
    }

    /// `call_with`, also giving the session epoch the reply came from (what it says of
    /// the server's references is true in that session only).
    fn call_in<O: Operation>(&self, ctx: &Ctx, req: O, data: &[&[u8]]) -> Result<(O::Reply, u64)> {
        let r = self.client.call(&req.into(), cred(ctx), data)?;
        let reply = O::Reply::decode(&r.body)
            .map_err(|e| Error::new(libc::EIO, format!("malformed {} reply: {e}", O::OP.name())))?;
        Ok((reply, r.epoch))
    }

    fn caching(&self) -> bool {
        !self.client.config().attr_ttl.is_zero()
    }

    fn ttl_ok(&self, t: &Instant) -> bool {
        t.elapsed() < self.client.config().attr_ttl
    }

    /// `ino` with the generation we know (0 when we know none).
    fn node(&self, ino: u64) -> NodeRef {
        let gen = lock(&self.meta).nodes.get(&ino).map_or(0, |n| n.gen);
        NodeRef::new(ino, gen)
    }

    /// Give the server back references of session `epoch` (posted: not waited for,
    /// sent again if lost with a connection, dropped if the session is gone).
    fn send_forgets(&self, items: Vec<ForgetItem>, epoch: u64) {
        for chunk in items.chunks(MAX_FORGET_ITEMS) {
            let req: Request = ForgetReq {
                items: List::new(chunk.to_vec()).expect("chunk within the limit"),
            }
            .into();
            self.client.post(&req, Caller::process(), epoch);
        }
    }

    /// The server's handle behind `fh`, read once the connections the server closed
    /// are made again: a server that restarted has the file re-opened under a new
    /// handle by then (review 27: the first write after a restart went with the old
    /// session's handle and was refused EBADF).
    fn server_fh(&self, fh: u64) -> Result<u64> {
        self.client.revive_lost()?;
        server_fh_of(&self.open, fh)
    }

    /// A write through `fh` begins (marked before anything is sent: a restart after
    /// the send must find it); it counts as sent when the guard is dropped. Not
    /// durable until an fsync or flush sent after that.
    pub(super) fn written_through(&self, fh: u64) -> Sending<'_> {
        if let Some(f) = lock(&self.open).get_mut(fh) {
            f.written += 1;
            f.uncommitted += 1;
        }
        Sending { fs: self, fh }
    }

    /// `write_behind`, answering through `answer` (when given) once a slot is taken and
    /// before the bytes are sent.
    fn write_behind_with(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: WriteBytes<'_>,
        answer: Option<&mut dyn FnMut(u32)>,
    ) -> Result<u32> {
        let limit = behind::limit(self.client.max_inflight());
        let len = data.len();
        if len > MAX_DATA || limit == 0 || len == 0 {
            return self.write_now(ctx, ino, fh, offset, data);
        }
        let (node, sfh) = (self.node(ino), self.server_fh(fh)?);
        let end = offset
            .checked_add(len as u64)
            .ok_or_else(|| Error::new(libc::EFBIG, "write past the largest offset"))?;
        let n = len as u32;
        let early = answer.map(|a| {
            move || {
                // The attributes the caller may ask for next are the server's after
                // this write: forgotten before the caller goes on.
                self.forget_attr(ino);
                a(n)
            }
        });
        // Small writes are committed before their reply: a close after them (a small
        // file saved) then needs no FLUSH round trip. Larger ones leave it to the
        // close's FLUSH, sent behind them.
        let commit = len <= COMMIT_WRITE_MAX;
        // Only a write answered early (the FUSE path) is gathered: a caller that waits
        // for the send gets its error, as before.
        if let (WriteBytes::Mem(d), Some(_)) = (&data, &early) {
            if len <= GATHER_WRITE_MAX && self.behind.gathers() {
                return self.gather_write(ctx, ino, fh, offset, end, commit, d, early);
            }
        }
        let mut data = data;
        let sent = {
            let data = &mut data;
            self.behind
                .send(limit, ino, fh, offset, end, commit, early, || {
                    self.forget_attr(ino);
                    let req: Request = WriteReq {
                        node,
                        fh: sfh,
                        offset,
                        size: n,
                        commit,
                    }
                    .into();
                    // Counted as sent before the ticket is kept, so a flush that collects
                    // it (after taking the inode's queue) finds it counted.
                    let _sending = self.written_through(fh);
                    match data {
                        WriteBytes::Mem(d) => self.client.submit(&req, cred(ctx), &[d]),
                        WriteBytes::Piped(p) => self.client.submit_piped(&req, cred(ctx), *p),
                    }
                })?
        };
        if !sent {
            return self.write_now(ctx, ino, fh, offset, data);
        }
        self.written_bytes.fetch_add(len as u64, Ordering::Relaxed);
        Ok(n)
    }

    /// A small write answered (`early`) and gathered with others to be sent in one
    /// batch (`behind::Gather`); without a slot for its reply, written and waited for.
    #[allow(clippy::too_many_arguments)]
    fn gather_write(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        end: u64,
        commit: bool,
        data: &[u8],
        early: Option<impl FnOnce()>,
    ) -> Result<u32> {
        let limit = behind::limit(self.client.max_inflight());
        let c = cred(ctx);
        c.check()?;
        let write = GatheredWrite {
            fh,
            node: self.node(ino),
            offset,
            commit,
            cred: c.cred,
            groups: c.groups.to_vec(),
            data: data.to_vec(),
        };
        let answer = || {
            // Counted as begun once queued, before it is answered or sent (a restart
            // after the send must find it); `BatchSender` counts it sent.
            if let Some(f) = lock(&self.open).get_mut(fh) {
                f.written += 1;
                f.uncommitted += 1;
            }
            self.forget_attr(ino);
            if let Some(a) = early {
                a();
            }
        };
        if !self.behind.gather(limit, ino, offset, end, answer, write) {
            return self.write_now(ctx, ino, fh, offset, WriteBytes::Mem(data));
        }
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(data.len() as u32)
    }

    /// A write sent and waited for (what write-behind falls back to).
    fn write_now(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: WriteBytes<'_>,
    ) -> Result<u32> {
        match data {
            WriteBytes::Mem(d) => self.write(ctx, ino, fh, offset, d),
            WriteBytes::Piped(p) => {
                let buf = piped_to_vec(p)?;
                self.write(ctx, ino, fh, offset, &buf)
            }
        }
    }

    /// A flush or fsync with nothing left to commit: `ino`'s writes in flight are
    /// collected, and if every write begun through a handle of it here is sent and
    /// known committed (their replies said so), all are durable without a FLUSH or
    /// FSYNC round trip. None: some write is not known committed (or the server
    /// restarted meanwhile, or no write of `ino` went through write-behind); the
    /// caller makes them durable as usual.
    fn durable_by_commits(&self, ino: u64, report: Report) -> Option<Result<()>> {
        let (settled, all_committed) =
            self.behind.settle_taking_commits(ino, report, |commits| {
                let mut open = lock(&self.open);
                for (&h, &n) in commits {
                    if let Some(f) = open.get_mut(h) {
                        f.uncommitted = f.uncommitted.saturating_sub(n);
                    }
                }
                let fhs = open.handles_of(ino);
                // Every handle: nothing being sent, nothing begun that a commit did
                // not cover (a write whose reply said committed, or a flush since).
                // An fsync also reports a restart that lost another handle's writes
                // (`peer_lost`): that takes its round trip (`made_durable`).
                let fsync_of = match report {
                    Report::Fsync(h) => Some(h),
                    _ => None,
                };
                let all = fhs.iter().all(|&h| {
                    open.get(h).is_some_and(|f| {
                        let reports_loss = f.lost || (f.peer_lost && fsync_of == Some(h));
                        !reports_loss && f.written == f.sent && f.uncommitted == 0
                    })
                });
                if all {
                    for h in fhs {
                        if let Some(f) = open.get_mut(h) {
                            f.durable = f.sent;
                            f.uncommitted = 0;
                        }
                    }
                }
                all
            })?;
        // A write's error is the answer either way (kept for the handle, as settle).
        if let Err(e) = settled {
            return Some(Err(e));
        }
        if !all_committed {
            return None;
        }
        self.durable_by_commits.fetch_add(1, Ordering::Relaxed);
        Some(Ok(()))
    }

    /// `ino` is changed other than by a write (truncate, chmod, times, xattrs,
    /// fallocate): not committed by the server before the reply, so the next flush or
    /// fsync of any handle of it here must send its round trip (counted as a write not
    /// known committed, before the request goes out).
    fn changed_uncommitted(&self, ino: u64) -> Changing<'_> {
        let mut open = lock(&self.open);
        let fhs = open.handles_of(ino);
        for &h in &fhs {
            if let Some(f) = open.get_mut(h) {
                f.uncommitted += 1;
                f.changes += 1;
            }
        }
        Changing {
            fs: self,
            fhs,
            committed: false,
        }
    }

    /// How many flushes and fsyncs needed no round trip, every write they cover having
    /// been committed before its reply.
    pub fn durable_without_round_trip(&self) -> u64 {
        self.durable_by_commits.load(Ordering::Relaxed)
    }

    /// A flush (`fsync` None) or fsync of `fh` sent behind `ino`'s writes in flight, on
    /// their connection, before their replies are collected: the server runs it after
    /// them, so a close after a write costs one round trip. None: not sent (no write of
    /// `ino` in flight, or on several connections); the caller settles and sends.
    fn durable_behind_writes(&self, ino: u64, fh: u64, fsync: Option<bool>) -> Option<Result<()>> {
        let sfh = self.server_fh(fh).ok()?;
        let node = self.node(ino);
        let req: Request = match fsync {
            None => FlushReq { node, fh: sfh }.into(),
            Some(datasync) => FsyncReq {
                node,
                fh: sfh,
                datasync,
            }
            .into(),
        };
        let report = match fsync {
            None => Report::Handle(fh),
            Some(_) => Report::Fsync(fh),
        };
        let me = own();
        let (settled, (mark, sent)) = self.behind.settle_behind(ino, report, |newest| {
            // Every write of `ino` sent so far is in flight ahead of this request (the
            // queue is locked): what its success makes durable.
            let mark = self.written_mark(fh);
            (
                mark,
                self.client.submit_behind(newest, &req, cred(&me), &[]),
            )
        })?;
        // A write's error is the answer (the request's reply, dropped, changes nothing).
        if let Err(e) = settled {
            return Some(Err(e));
        }
        self.flushes_behind.fetch_add(1, Ordering::Relaxed);
        let r = match sent.and_then(Ticket::wait) {
            Ok(_) => Ok(()),
            // The writes were answered, so they ran: any flush sent now covers them.
            Err(e) if crate::is_transport(&e) => self.client.call(&req, cred(&me), &[]).map(|_| ()),
            Err(e) => Err(e),
        };
        Some(self.made_durable(fh, mark, fsync.is_some(), r))
    }

    /// How many flushes and fsyncs went out behind the writes they cover, without
    /// waiting for those writes' replies first.
    pub fn flushes_sent_behind(&self) -> u64 {
        self.flushes_behind.load(Ordering::Relaxed)
    }

    /// How many writes through `fh` had left the client: taken as an fsync or flush of
    /// it is sent, what its success makes durable.
    fn written_mark(&self, fh: u64) -> Mark {
        lock(&self.open).get(fh).map_or(
            Mark {
                sent: 0,
                changed: 0,
            },
            |f| Mark {
                sent: f.sent,
                changed: f.changed,
            },
        )
    }

    /// An fsync (`fsync`) or flush of `fh`, sent when `mark` writes had been sent
    /// through it, returned `r`: success makes those durable, unless the server
    /// restarted meanwhile (then EIO, reported once; an fsync also reports a restart
    /// that lost another handle's writes to the file).
    fn made_durable(&self, fh: u64, mark: Mark, fsync: bool, r: Result<()>) -> Result<()> {
        r?;
        let Some(ino) = lock(&self.open).get(fh).map(|f| f.ino) else {
            return Ok(());
        };
        // The inode's queue is locked first (as `durable_by_commits` does): no write of
        // it is begun or collected between the check and dropping the counts of
        // committed replies the round trip made moot.
        let lost = self.behind.covered(ino, fh, |in_flight| {
            let mut open = lock(&self.open);
            let Some(f) = open.get_mut(fh) else {
                return (false, false);
            };
            let mut lost = std::mem::take(&mut f.lost);
            if fsync {
                lost |= std::mem::take(&mut f.peer_lost);
            }
            f.durable = f.durable.max(mark.sent);
            // Every write begun is covered, and none is in flight (its reply's count
            // would come later), and every change begun was answered before the
            // round trip was sent (one begun since, or being answered then, may have
            // run on the server after it): none is left uncommitted.
            let all = f.sent == mark.sent
                && f.written == mark.sent
                && f.changes == mark.changed
                && !in_flight;
            if all {
                f.uncommitted = 0;
            }
            (all, lost)
        });
        if lost {
            return Err(Error::new(
                libc::EIO,
                "the server restarted: writes through this file its previous instance \
                 answered may not have been committed",
            ));
        }
        Ok(())
    }

    fn track(&self, ctx: &Ctx, ino: u64, gen: u64, flags: i32, server_fh: u64, epoch: u64) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let c = cred(ctx);
        lock(&self.open).insert(
            fh,
            OpenFile {
                ino,
                gen,
                flags,
                server_fh: Some(server_fh),
                reopen_owed: false,
                reopen_id: 0,
                epoch,
                opener: (c.cred, c.groups.to_vec()),
                written: 0,
                sent: 0,
                durable: 0,
                lost: false,
                uncommitted: 0,
                changes: 0,
                changed: 0,
                peer_lost: false,
            },
        );
        fh
    }

    /// Make name `n` in `parent` (mknod, mkdir, symlink): the entry the server made is
    /// the caller's, and the parent's cached name and attributes are stale.
    fn made<O: Operation<Reply = MadeReply>>(
        &self,
        ctx: &Ctx,
        parent: u64,
        n: &[u8],
        req: O,
    ) -> Result<Attr> {
        self.forget_name(parent, n);
        let token = self.inval_token();
        let r = self.call_in(ctx, req, &[]);
        let (r, epoch) = self.known_change(parent, r, Change::Added(n))?;
        if r.attr.is_dir() {
            let ttl = self.client.config().attr_ttl;
            lock(&self.known).made(&r.attr, epoch, r.made_state, ttl, Instant::now());
        }
        let a = self.entry(r.attr, epoch, Some((parent, n)), token);
        self.dir_changed(parent, r.parent, token);
        Ok(a)
    }

    /// The outcome of `change`, ours, in directory `dir`: what we know of its names
    /// follows the reply's version of it, and an error forgets it (EEXIST: someone made
    /// the name we took as absent).
    fn known_change<R: DirAfter>(
        &self,
        dir: u64,
        r: Result<(R, u64)>,
        change: Change<'_>,
    ) -> Result<(R, u64)> {
        let mut k = lock(&self.known);
        match &r {
            Ok((reply, epoch)) => {
                let (after, state) = reply.dir_after();
                k.changed(dir, *epoch, after, state, change, Instant::now());
            }
            Err(_) => k.forget(dir),
        }
        r
    }

    /// Lookups answered "no such name" without asking the server, because we know
    /// every name of the directory (see `known_dirs`).
    pub fn lookups_answered_here(&self) -> u64 {
        self.lookups_answered_here.load(Ordering::Relaxed)
    }

    /// Remove name `n` from `parent` (unlink, rmdir): `req` makes the request of the
    /// parent and the checked name.
    fn remove<O: Operation<Reply = RemovedReply>>(
        &self,
        ctx: &Ctx,
        parent: u64,
        n: &[u8],
        req: impl FnOnce(NodeRef, Name) -> O,
    ) -> Result<Attr> {
        let req = req(self.node(parent), name(n)?);
        self.forget_name(parent, n);
        let token = self.inval_token();
        let r = self.call_in(ctx, req, &[]);
        let (r, _) = self.known_change(parent, r, Change::Removed(n))?;
        if r.attr.is_dir() {
            lock(&self.known).forget(r.attr.ino);
        }
        self.removed(&r.attr, token);
        self.dir_changed(parent, r.parent, token);
        Ok(r.attr)
    }

    /// After unlink/rmdir: the inode's attributes as they are now. Kept while we have
    /// it open (fstat of an open unlinked file shows nlink 0); an inode without names
    /// and not open is gone, so its attributes are dropped.
    fn removed(&self, a: &Attr, token: u64) {
        let open_here = lock(&self.open).has_ino(a.ino);
        if a.nlink > 0 || open_here {
            self.changed_to(a, token);
        } else {
            self.forget_attr(a.ino);
        }
    }

    /// A handle of `ino` was closed: an unlinked inode no longer open here may be gone,
    /// so its attributes (nlink 0) are not kept.
    fn closed(&self, ino: u64) {
        if lock(&self.open).has_ino(ino) {
            return;
        }
        self.behind.retire(ino);
        let mut m = lock(&self.meta);
        if m.attrs.get(&ino).is_some_and(|(a, _)| a.nlink == 0) {
            m.invalidate(ino);
        }
    }

    /// The cached attributes of `ino`, still fresh, say it has no extended attributes.
    fn known_without_xattrs(&self, ino: u64) -> bool {
        lock(&self.meta)
            .attrs
            .get(&ino)
            .is_some_and(|(a, t)| a.no_xattrs && self.ttl_ok(t))
    }

    /// Attributes a reply carried (lookup, link, hold, readdirplus) of an inode written through
    /// write-behind here: a write answered before the request went out may still have
    /// been in flight on another connection when the server answered, so the size may
    /// predate it (the kernel would take it as the file's). Wait for the inode's writes
    /// and ask again; on error keep what the reply said.
    fn after_writes(&self, a: Attr) -> Attr {
        if !self.behind.tracks(a.ino) {
            return a;
        }
        self.forget_attr(a.ino);
        self.getattr(a.ino).unwrap_or(a)
    }

    /// Small writes that went out gathered, and the sends that carried them
    /// (`behind::Gather`).
    pub fn gathered_writes(&self) -> (u64, u64) {
        self.client.gathered_writes()
    }

    /// Write replies held by write-behind now (at most [`WRITE_BEHIND_MAX`]).
    pub fn write_behind_held(&self) -> usize {
        self.behind.held()
    }

    /// Server-side counters as JSON (`zcfs stat ADDR:PORT`).
    pub fn server_stats(&self) -> Result<Vec<u8>> {
        Ok(self.call(&own(), StatsReq {})?.json.into_bytes())
    }

    /// References to `ino` (held for our caller, held by the server for us).
    pub fn references(&self, ino: u64) -> (u64, u64) {
        lock(&self.meta)
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
        let ttl = self.client.config().attr_ttl;
        let epoch_now = self.client.epoch();
        let gen = self.node(parent).gen;
        if lock(&self.known)
            .absent_for(parent, gen, name, &ctx.cred, epoch_now, ttl, Instant::now())
            .is_some()
        {
            self.lookups_answered_here.fetch_add(1, Ordering::Relaxed);
            return Err(Error::errno(libc::ENOENT));
        }
        let token = self.inval_token();
        let r = self.call_in(
            ctx,
            LookupReq {
                parent: self.node(parent),
                name: n,
            },
            &[],
        );
        // The server found no name we know is there: someone else removed it.
        if r.as_ref().is_err_and(|e| e.errno == libc::ENOENT) {
            lock(&self.known).forget(parent);
        }
        let (r, epoch) = r?;
        let a = self.entry(r.attr, epoch, Some((parent, name)), token);
        Ok(self.after_writes(a))
    }

    fn negative_ttl(&self, parent: u64) -> Option<std::time::Duration> {
        let ttl = self.client.config().attr_ttl;
        lock(&self.known).negative_ttl(parent, ttl, Instant::now())
    }

    fn lseek(&self, ino: u64, fh: u64, offset: u64, whence: i32) -> Result<u64> {
        self.behind.settle(ino, Report::Keep)?;
        let req = LseekReq {
            node: self.node(ino),
            fh: self.server_fh(fh)?,
            offset,
            whence,
        };
        Ok(self.call(&own(), req)?.offset)
    }

    /// The server takes the reference (a lookup of "." names any node itself).
    fn hold(&self, ino: u64, generation: u64) -> Result<Attr> {
        // FORGETs posted before (the kernel forgets a node, then looks its number up
        // for a file handle) reach the server first: taken after the lookup, the last
        // reference of an unlinked file would keep it for this lookup, and a handle
        // of a file no one holds any more would open (on tmpfs: ESTALE).
        if !self
            .client
            .wait_posted_for(ino, self.client.config().timeout)?
        {
            tracing::info!(
                ino,
                "looking up a node with earlier forgets still unanswered"
            );
        }
        let token = self.inval_token();
        let (r, epoch) = self.call_in(
            &own(),
            LookupReq {
                parent: NodeRef::new(ino, generation),
                name: LookupName::new(b".").map_err(invalid)?,
            },
            &[],
        )?;
        let a = self.entry(r.attr, epoch, None, token);
        Ok(self.after_writes(a))
    }

    fn forget(&self, ino: u64, n: u64) {
        let (count, epoch) = {
            let mut m = lock(&self.meta);
            let Some(node) = m.nodes.get_mut(&ino) else {
                return;
            };
            node.caller_refs = node.caller_refs.saturating_sub(n);
            (m.settle(ino), m.epoch)
        };
        if count > 0 {
            self.send_forgets(vec![ForgetItem { ino, count }], epoch);
        }
    }

    fn getattr(&self, ino: u64) -> Result<Attr> {
        self.behind.settle(ino, Report::Keep)?;
        if let Some((a, t)) = lock(&self.meta).attrs.get(&ino) {
            if self.ttl_ok(t) {
                return Ok(a.clone());
            }
        }
        let token = self.inval_token();
        let r = self.call(
            &own(),
            GetattrReq {
                node: self.node(ino),
            },
        )?;
        self.remember_since(&r.attr, token);
        Ok(r.attr)
    }

    fn setattr(&self, ctx: &Ctx, ino: u64, set: &SetAttr, fh: u64) -> Result<Attr> {
        // A directory's mode may stop letting everyone search it.
        lock(&self.known).forget(ino);
        let mut changing = self.changed_uncommitted(ino);
        self.behind.settle(ino, Report::Keep)?;
        self.forget_attr(ino);
        let fh = if fh == 0 { 0 } else { self.server_fh(fh)? };
        let token = self.inval_token();
        let r = self.call(
            ctx,
            SetattrReq {
                node: self.node(ino),
                set: set.clone(),
                fh,
                // Committed before the reply, always: a close or fsync through a handle
                // open here needs no FLUSH round trip for it (tar sets times, owner and
                // mode before close), and a handle opened while a truncate by path is
                // in flight (not charged with it) cannot skip one that the truncate
                // needed (review rv23c). A setattr is waited for anyway; the commit
                // adds the server's few µs to it.
                commit: true,
            },
        );
        changing.committed = r.as_ref().is_ok_and(|r| r.committed);
        // Counted as a change either way (see `Meta::replace`).
        match &r {
            Ok(r) => self.changed_to(&r.attr, token),
            Err(_) => self.forget_attr(ino),
        }
        Ok(r?.attr)
    }

    fn access(&self, ctx: &Ctx, ino: u64, mask: u32) -> Result<()> {
        let req = AccessReq {
            node: self.node(ino),
            mask,
        };
        self.call(ctx, req).map(|_| ())
    }

    /// Listing needs read permission, which only the server can tell.
    fn opendir(&self, ctx: &Ctx, ino: u64) -> Result<u64> {
        self.access(ctx, ino, zcfs_backend::R_OK)?;
        Ok(0)
    }

    fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let r = self.call(
            &own(),
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
            umask: ctx.cred.umask,
        };
        self.made(ctx, parent, n, req)
    }

    fn mkdir(&self, ctx: &Ctx, parent: u64, n: &[u8], mode: u32) -> Result<Attr> {
        let req = MkdirReq {
            parent: self.node(parent),
            name: name(n)?,
            mode,
            umask: ctx.cred.umask,
        };
        self.made(ctx, parent, n, req)
    }

    fn unlink(&self, ctx: &Ctx, parent: u64, n: &[u8]) -> Result<Attr> {
        self.remove(ctx, parent, n, |parent, name| UnlinkReq { parent, name })
    }

    fn rmdir(&self, ctx: &Ctx, parent: u64, n: &[u8]) -> Result<Attr> {
        self.remove(ctx, parent, n, |parent, name| RmdirReq { parent, name })
    }

    fn symlink(&self, ctx: &Ctx, parent: u64, n: &[u8], target: &[u8]) -> Result<Attr> {
        let req = SymlinkReq {
            parent: self.node(parent),
            name: name(n)?,
            target: SymlinkTarget::new(target).map_err(invalid)?,
        };
        self.made(ctx, parent, n, req)
    }

    fn rename(
        &self,
        ctx: &Ctx,
        parent: u64,
        n: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
    ) -> Result<Option<u64>> {
        let req = RenameReq {
            parent: self.node(parent),
            name: name(n)?,
            new_parent: self.node(newparent),
            new_name: name(newname)?,
            flags: RenameFlags::new(flags).map_err(invalid)?,
        };
        // Names, parents and the inodes involved all change: start afresh (what we
        // know of each inode's generation and references stays true).
        lock(&self.meta).drop_caches();
        {
            let mut k = lock(&self.known);
            k.forget(parent);
            k.forget(newparent);
        }
        // The protocol's reply does not say which inode lost the new name.
        let r = self.call(ctx, req).map(|_| None);
        // And again once done: a reply of a request sent before ours and answered
        // after it carries what was true before the rename (see `after_change`).
        lock(&self.meta).drop_caches();
        {
            let mut k = lock(&self.known);
            k.forget(parent);
            k.forget(newparent);
        }
        r
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
        let token = self.inval_token();
        let r = self.call_in(ctx, req, &[]);
        let (r, epoch) = self.known_change(newparent, r, Change::Added(newname))?;
        let a = self.entry(r.attr, epoch, Some((newparent, newname)), token);
        self.dir_changed(newparent, r.parent, token);
        // A write of the file answered before the link may still be on its way on
        // another connection: the reply's size may predate it.
        Ok(self.after_writes(a))
    }

    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64> {
        if flags & libc::O_TRUNC != 0 {
            self.forget_attr(ino);
        }
        let node = self.node(ino);
        let token = self.inval_token();
        let (r, epoch) = self.call_in(ctx, OpenReq { node, flags }, &[])?;
        // Close-to-open: what the file is now replaces whatever we had cached, unless
        // a write of ours may have been in flight when the server answered (see
        // `after_writes`): then the next getattr waits for the writes and asks.
        self.remember_since(&r.attr, token);
        if self.behind.tracks(ino) {
            self.forget_attr(ino);
        }
        Ok(self.track(ctx, ino, node.gen, flags, r.fh, epoch))
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
            umask: ctx.cred.umask,
        };
        self.forget_name(parent, n);
        let token = self.inval_token();
        let r = self.call_in(ctx, req, &[]);
        let (r, epoch) = self.known_change(parent, r, Change::Added(n))?;
        let a = self.entry(r.attr, epoch, Some((parent, n)), token);
        self.dir_changed(parent, r.parent, token);
        let fh = self.track(
            ctx,
            a.ino,
            a.generation,
            flags & !libc::O_CREAT & !libc::O_EXCL,
            r.fh,
            epoch,
        );
        Ok((a, fh))
    }

    fn tmpfile(&self, ctx: &Ctx, parent: u64, mode: u32, flags: i32) -> Result<(Attr, u64)> {
        let req = TmpFileReq {
            parent: self.node(parent),
            mode,
            umask: ctx.cred.umask,
            flags,
        };
        // No name is made and the parent does not change: nothing cached goes stale.
        let token = self.inval_token();
        let (r, epoch) = self.call_in(ctx, req, &[])?;
        let a = self.entry(r.attr, epoch, None, token);
        // Re-opened (after a lost session) as a plain open; the orphan will be gone
        // then, like any unlinked open file, and the handle stale.
        let fh = self.track(
            ctx,
            a.ino,
            a.generation,
            flags & !libc::O_TMPFILE & !libc::O_EXCL,
            r.fh,
            epoch,
        );
        Ok((a, fh))
    }

    fn read(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        reply: &mut dyn ReadReply,
    ) -> Result<()> {
        // Every write of the file in flight from `offset` on, not only those the range
        // overlaps: one past it may grow the file, and a read reaching the old end
        // must see the hole up to it, not a short count.
        self.behind.settle_range(ino, offset, u64::MAX);
        let epoch = self.client.epoch();
        let req = read_req(self.node(ino), self.server_fh(fh)?, offset, size);
        let r = match self.client.call(&req, Caller::process(), &[]) {
            Err(e) if stale_handle(&self.client, &e, epoch) => {
                let req = read_req(self.node(ino), self.server_fh(fh)?, offset, size);
                self.client.call(&req, Caller::process(), &[])?
            }
            r => r?,
        };
        self.read_bytes
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        self.client
            .bytes_received
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        checked_read(&r.data, size)?;
        reply.send(&[&r.data])
    }

    fn reads_then(&self) -> bool {
        self.client.config().l2.is_none()
    }

    /// `read` through `Client::call_then`: the caller's thread is free once the
    /// request is sent.
    fn read_then(&self, ino: u64, fh: u64, offset: u64, size: u32, done: ReadDone) {
        // Every write of the file in flight from `offset` on, not only those the range
        // overlaps: one past it may grow the file, and a read reaching the old end
        // must see the hole up to it, not a short count.
        self.behind.settle_range(ino, offset, u64::MAX);
        let epoch = self.client.epoch();
        let sfh = match self.server_fh(fh) {
            Ok(f) => f,
            Err(e) => return done(Err(e)),
        };
        let node = self.node(ino);
        let (client, read_bytes) = (self.client.clone(), self.read_bytes.clone());
        let open = self.open.clone();
        let finish = move |client: &Client, r: Result<crate::Response>| {
            done(r.and_then(|r| {
                checked_read(&r.data, size)?;
                read_bytes.fetch_add(r.data.len() as u64, Ordering::Relaxed);
                client
                    .bytes_received
                    .fetch_add(r.data.len() as u64, Ordering::Relaxed);
                Ok(r.data)
            }))
        };
        self.client.call_then(
            read_req(node, sfh, offset, size),
            Box::new(move |r| match r {
                Err(e) if stale_handle(&client, &e, epoch) => {
                    // Sent again with the re-opened file's handle, from a thread of its
                    // own: this one may be the connection's reader.
                    // `finish` moves into the thread only if it starts; else it runs here.
                    let slot = Arc::new(Mutex::new(Some(finish)));
                    let retry = {
                        let (client, theirs) = (client.clone(), slot.clone());
                        move || {
                            let Some(finish) = lock(&theirs).take() else {
                                return;
                            };
                            let r = server_fh_of(&open, fh).and_then(|sfh| {
                                let req = read_req(node, sfh, offset, size);
                                client.call(&req, Caller::process(), &[])
                            });
                            finish(&client, r)
                        }
                    };
                    if let Err(spawn) = std::thread::Builder::new()
                        .name("zcfs-reread".into())
                        .spawn(retry)
                    {
                        tracing::warn!("cannot start a thread to read again: {spawn}");
                        if let Some(finish) = lock(&slot).take() {
                            finish(&client, Err(e))
                        }
                    }
                }
                r => finish(&client, r),
            }),
        );
    }

    /// Sent in requests of at most MAX_DATA bytes, in order. A short reply ends the
    /// write there (the next bytes belong after what was written, not after the
    /// chunk), and so does an error after something was written: the count says how
    /// far the caller's bytes got, as write(2) does.
    fn write(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        // A buffered write of this range still in flight (it may be on another
        // connection) lands first: this one came later.
        let end = offset.saturating_add(data.len() as u64);
        self.behind.settle_range(ino, offset, end);
        self.forget_attr(ino);
        let (node, sfh) = (self.node(ino), self.server_fh(fh)?);
        // The count is a u32: a longer buffer is a short write.
        let data = &data[..data.len().min(u32::MAX as usize)];
        // Marked before anything is sent: a restart after the send must find it.
        let _sending = self.written_through(fh);
        let mut done = 0usize;
        while done < data.len() {
            let chunk = &data[done..data.len().min(done + MAX_DATA)];
            let req = WriteReq {
                node,
                fh: sfh,
                offset: offset + done as u64,
                size: chunk.len() as u32,
                commit: false,
            };
            let written = match self.call_with(ctx, req, &[chunk]) {
                Ok(r) => r.written as usize,
                Err(_) if done > 0 => break,
                Err(e) => return Err(e),
            };
            if written > chunk.len() {
                return Err(Error::new(
                    libc::EIO,
                    format!(
                        "the server wrote {written} bytes of a {}-byte request",
                        chunk.len()
                    ),
                ));
            }
            if written == 0 && done == 0 {
                // Nothing of a non-empty write taken: write(2) says why rather than 0,
                // which a caller would take as progress and write again.
                return Err(Error::new(
                    libc::ENOSPC,
                    format!("the server took none of a {}-byte write", chunk.len()),
                ));
            }
            done += written;
            if written < chunk.len() {
                break;
            }
        }
        self.written_bytes.fetch_add(done as u64, Ordering::Relaxed);
        Ok(done as u32)
    }

    /// Sent and answered as written; see `behind` for who waits for it. A write
    /// larger than one request, or one that finds every slot for held replies taken
    /// by other inodes, is written and waited for.
    fn write_behind(&self, ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.write_behind_with(ctx, ino, fh, offset, WriteBytes::Mem(data), None)
    }

    fn write_behind_answering(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        answer: &mut dyn FnMut(u32),
    ) -> Result<u32> {
        self.write_behind_with(ctx, ino, fh, offset, WriteBytes::Mem(data), Some(answer))
    }

    fn moves_piped_writes(&self) -> bool {
        self.client.sends_piped()
    }

    fn write_behind_piped(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        data: &mut dyn PipedData,
        answer: &mut dyn FnMut(u32),
    ) -> Result<u32> {
        self.write_behind_with(ctx, ino, fh, offset, WriteBytes::Piped(data), Some(answer))
    }

    /// close(2): the writes through the handle are waited for and made durable (the
    /// server commits). A close when no handle of the inode here has written since its
    /// last fsync or flush (a reader's, say) has nothing to make durable: no round trip.
    fn flush(&self, ino: u64, fh: u64) -> Result<()> {
        if let Some(r) = self.durable_by_commits(ino, Report::Handle(fh)) {
            return r;
        }
        if let Some(r) = self.durable_behind_writes(ino, fh, None) {
            return r;
        }
        self.behind.settle(ino, Report::Handle(fh))?;
        let clean = {
            let open = lock(&self.open);
            // A truncate, chmod, times or xattr change (`changed_uncommitted`) is not
            // committed by its reply either: a truncate at open, then close.
            open.contains(fh)
                && !open
                    .of_ino(ino)
                    .any(|f| f.written > f.durable || f.lost || f.uncommitted > 0)
        };
        if clean {
            return Ok(());
        }
        let mark = self.written_mark(fh);
        let sfh = self.server_fh(fh).unwrap_or(0);
        let node = self.node(ino);
        let r = self.call(&own(), FlushReq { node, fh: sfh }).map(|_| ());
        self.made_durable(fh, mark, false, r)
    }

    /// A release lost with its connection is sent again with the same id (the server's
    /// reply cache makes it count once; EBADF for the resend means the first did it).
    /// One that cannot be sent now is posted: it goes out with the next connection of
    /// the session, or is moot if the session is gone (its handles released with it).
    fn release(&self, ino: u64, fh: u64) -> Result<()> {
        // Writes in flight through this handle reach the server before it closes the
        // handle (they may have gone out on another connection). An error of this
        // handle its flush did not report has no one left to report it to: logged.
        let _ = self.behind.settle(ino, Report::Keep);
        self.behind.closed_handle(ino, fh);
        let f = {
            let mut open = lock(&self.open);
            let f = open.remove(fh);
            if let Some(f) = f.as_ref().filter(|f| f.reopen_owed && f.reopen_id != 0) {
                open.orphans.push(open::OrphanReopen {
                    ino: f.ino,
                    gen: f.gen,
                    flags: f.flags,
                    opener: f.opener.clone(),
                    id: f.reopen_id,
                });
            }
            f
        };
        if f.is_some() {
            self.closed(ino);
        }
        let Some((sfh, epoch)) = f.and_then(|f| Some((f.server_fh?, f.epoch))) else {
            return Ok(());
        };
        if epoch != self.client.epoch() {
            // A handle of a session gone (with its handles): not re-opened in the new
            // one yet, and now it never will be. Sent there, its number could name
            // another handle of the file in the new session (review 32c).
            return Ok(());
        }
        let req: Request = ReleaseReq {
            node: self.node(ino),
            fh: sfh,
        }
        .into();
        match self.client.exchange(&req, Caller::process(), &[]) {
            (Ok(_), _) => Ok(()),
            (Err(e), true) if e.errno == libc::EBADF => Ok(()),
            (Err(e), _) if crate::is_transport(&e) => {
                tracing::info!(ino, "release deferred until the server is back: {e}");
                self.client.post(&req, Caller::process(), epoch);
                Ok(())
            }
            (Err(e), _) => Err(e),
        }
    }

    fn fsync(&self, ino: u64, fh: u64, datasync: bool) -> Result<()> {
        if let Some(r) = self.durable_by_commits(ino, Report::Fsync(fh)) {
            return r;
        }
        if let Some(r) = self.durable_behind_writes(ino, fh, Some(datasync)) {
            return r;
        }
        self.behind.settle(ino, Report::Fsync(fh))?;
        let mark = self.written_mark(fh);
        let sfh = self.server_fh(fh).unwrap_or(0);
        let node = self.node(ino);
        let r = self
            .call(
                &own(),
                FsyncReq {
                    node,
                    fh: sfh,
                    datasync,
                },
            )
            .map(|_| ());
        self.made_durable(fh, mark, true, r)
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
            let token = self.inval_token();
            let (r, epoch) = self.call_in(&own(), req, &[])?;
            let mut es = r.entries.into_vec();
            for e in es.iter_mut() {
                if let Some(a) = e.attr.take() {
                    e.attr = Some(self.after_writes(a));
                }
            }
            if es.is_empty() {
                return Ok(());
            }
            // With `plus` each entry came with a server reference: the listing's until
            // it is passed on.
            let mut listing = plus.then(|| {
                let mut m = lock(&self.meta);
                let counted = m.epoch == epoch;
                for e in &es {
                    if let Some(a) = &e.attr {
                        self.remember_locked_since(&mut m, a, token);
                    }
                    if counted {
                        let node = m.nodes.entry(e.ino).or_default();
                        node.server_refs += 1;
                        node.listing += 1;
                    }
                }
                Listing {
                    fs: self,
                    epoch: counted.then_some(epoch),
                    inos: es.iter().map(|e| e.ino).collect(),
                    next: 0,
                    token,
                }
            });
            for e in es {
                cookie = e.next;
                if let Some(l) = listing.as_mut() {
                    l.hand_out(&e);
                }
                if !f(e) {
                    // What the listing did not pass on goes back when it is dropped.
                    return Ok(());
                }
            }
            drop(listing);
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        Ok(self.call(&own(), StatfsReq {})?.statfs)
    }

    fn setxattr(&self, ctx: &Ctx, ino: u64, n: &[u8], value: &[u8], flags: i32) -> Result<()> {
        // An ACL may stop letting everyone search a directory.
        lock(&self.known).forget(ino);
        let _changing = self.changed_uncommitted(ino);
        let req = SetxattrReq {
            node: self.node(ino),
            name: XattrName::new(n).map_err(invalid)?,
            value: XattrValue::new(value).map_err(invalid)?,
            flags,
        };
        {
            let mut m = lock(&self.meta);
            m.invalidate(ino);
            m.forget_xattr_absent(ino, n);
        }
        let r = self.call(ctx, req).map(|_| ());
        self.after_change(ino);
        r
    }

    fn getxattr(&self, ctx: &Ctx, ino: u64, n: &[u8]) -> Result<Vec<u8>> {
        let xname = XattrName::new(n).map_err(invalid)?;
        // `system.` and `security.` names are looked up without a permission check (as
        // on Linux), so the attributes saying the inode has none answer for any
        // caller: `ls -l` asks two per file.
        let unchecked = n.starts_with(b"system.") || n.starts_with(b"security.");
        if unchecked && self.known_without_xattrs(ino) {
            return Err(Error::errno(libc::ENODATA));
        }
        if lock(&self.meta).xattr_absent(ino, n, self.client.config().attr_ttl) {
            return Err(Error::errno(libc::ENODATA));
        }
        let req = GetxattrReq {
            node: self.node(ino),
            name: xname,
        };
        match self.call(ctx, req) {
            Ok(r) => Ok(r.value.into_bytes()),
            Err(e) => {
                if e.errno == libc::ENODATA && self.caching() {
                    lock(&self.meta).set_xattr_absent(ino, n, self.client.config().attr_ttl);
                }
                Err(e)
            }
        }
    }

    fn listxattr(&self, ctx: &Ctx, ino: u64) -> Result<Vec<Vec<u8>>> {
        if self.known_without_xattrs(ino) {
            return Ok(Vec::new());
        }
        let r = self.call(
            ctx,
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

    fn removexattr(&self, ctx: &Ctx, ino: u64, n: &[u8]) -> Result<()> {
        lock(&self.known).forget(ino);
        let _changing = self.changed_uncommitted(ino);
        let req = RemovexattrReq {
            node: self.node(ino),
            name: XattrName::new(n).map_err(invalid)?,
        };
        self.forget_attr(ino);
        let r = self.call(ctx, req).map(|_| ());
        self.after_change(ino);
        r
    }

    fn fallocate(
        &self,
        ctx: &Ctx,
        ino: u64,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
    ) -> Result<()> {
        let _changing = self.changed_uncommitted(ino);
        self.behind.settle(ino, Report::Keep)?;
        self.forget_attr(ino);
        let req = FallocateReq {
            node: self.node(ino),
            fh: self.server_fh(fh)?,
            offset,
            len,
            mode,
        };
        self.call(ctx, req).map(|_| ())
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
        let behind = self.behind.settle_all();
        self.call(&own(), SyncAllReq {}).map(|_| ())?;
        behind
    }

    fn cache_age(&self, ino: u64) -> std::time::Duration {
        lock(&self.meta).age(ino, self.client.config().attr_ttl)
    }
}
