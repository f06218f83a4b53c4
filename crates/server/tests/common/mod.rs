//! Shared by the server's tests (no root needed): a volume in anonymous memory, a
//! server on 127.0.0.1:0, clients (RemoteFs and raw protocol connections), and a
//! backend wrapper that keeps account of references and handles as the Backend
//! contract defines them.
#![allow(dead_code, unused_macros)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcfs_backend::*;
use zcfs_client::{ClientConfig, RemoteFs};
use zcfs_protocol::handshake::Lane;
use zcfs_protocol::{Cred, ReqHeader, Request, RespHeader, RESP_HDR};
use zcfs_server::{Server, ServerConfig, StatsReport};
use zcfs_transport::Stream;
use zcfs_volume::{MkfsOptions, Region, RootDir, Volume, VolumeConfig};

/// A fresh volume of `size` bytes in anonymous memory, as a Backend. Its root belongs
/// to the tests' caller (`ctx()`).
pub fn memory_fs(size: usize) -> Arc<zcfs_local::LocalFs> {
    let mut region = Region::anonymous(size);
    Volume::mkfs_region(
        &mut region,
        &MkfsOptions {
            inodes: Some(256),
            log_bytes: Some(1 << 20),
            root: RootDir {
                uid: 1000,
                gid: 1000,
                mode: 0o755,
            },
        },
    )
    .unwrap();
    let vol = Volume::open_region(region, VolumeConfig::synchronous()).unwrap();
    Arc::new(zcfs_local::LocalFs::new(vol))
}

/// A server on 127.0.0.1:0 without root squash (the tests' raw connections act as
/// root; tests/identity.rs covers the identity rules).
pub fn config() -> ServerConfig {
    ServerConfig {
        listen: zcfs_transport::Address::Tcp("127.0.0.1:0".into()),
        identity: zcfs_server::IdentityMap {
            squash: zcfs_server::Squash::None,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A server running on its own thread; shut down (and every session released) on drop.
pub struct Running {
    pub server: Arc<Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    pub fn start(backend: Arc<dyn Backend>, cfg: ServerConfig) -> Running {
        let server = Arc::new(Server::bind(backend, cfg).unwrap());
        let s2 = server.clone();
        let thread = std::thread::spawn(move || s2.run());
        Running {
            server,
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.tcp_addr().expect("a TCP server")
    }

    pub fn report(&self) -> StatsReport {
        self.server.report()
    }

    pub fn client(&self) -> RemoteFs {
        self.client_with(|_| {})
    }

    pub fn client_with(&self, tweak: impl FnOnce(&mut ClientConfig)) -> RemoteFs {
        let mut cfg = ClientConfig::new(&self.addr().to_string());
        cfg.timeout = Duration::from_secs(10);
        tweak(&mut cfg);
        RemoteFs::connect(cfg).unwrap()
    }

    pub fn raw(&self, session: u64) -> Raw {
        Raw::connect(self.addr(), session)
    }

    /// Stop the server and wait until it released everything.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(t) = self.thread.take() {
            self.server.shutdown();
            t.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// A protocol connection driven by hand.
pub struct Raw {
    pub s: Stream,
    next_id: u64,
}

/// A reply as it came: status, body, data.
pub struct RawReply {
    pub status: i32,
    pub body: Vec<u8>,
    pub data: Vec<u8>,
}

impl Raw {
    pub fn connect(addr: SocketAddr, session: u64) -> Raw {
        Raw::handshake(TcpStream::connect(addr).unwrap().into(), session)
    }

    /// A connection to a server's Unix socket (as whoever the calling thread runs as).
    pub fn connect_unix(path: &std::path::Path, session: u64) -> Raw {
        Raw::handshake(
            std::os::unix::net::UnixStream::connect(path)
                .unwrap()
                .into(),
            session,
        )
    }

    /// `connect_unix`, or None when the server refuses the connection (it closes it
    /// instead of answering the hello).
    pub fn try_connect_unix(path: &std::path::Path, session: u64) -> Option<Raw> {
        let mut s: Stream = std::os::unix::net::UnixStream::connect(path).ok()?.into();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        zcfs_transport::client_handshake(&mut s, None, session, Default::default()).ok()?;
        Some(Raw { s, next_id: 1 })
    }

    fn handshake(s: Stream, session: u64) -> Raw {
        Raw::handshake_on_lane(s, session, Lane::NONE).unwrap()
    }

    /// A connection on `lane` of the session (the server fences the lane's older
    /// connection first); Err when the server refuses it.
    pub fn connect_on_lane(
        addr: SocketAddr,
        session: u64,
        lane: Lane,
    ) -> std::result::Result<Raw, zcfs_transport::TransportError> {
        Raw::handshake_on_lane(TcpStream::connect(addr).unwrap().into(), session, lane)
    }

    fn handshake_on_lane(
        mut s: Stream,
        session: u64,
        lane: Lane,
    ) -> std::result::Result<Raw, zcfs_transport::TransportError> {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        zcfs_transport::client_handshake_on_lane(&mut s, None, session, lane, Default::default())?;
        Ok(Raw { s, next_id: 1 })
    }

    /// A connection whose receive buffer is `rcvbuf` bytes from the start (set before
    /// connecting, so the window never grows): a peer that stops reading stalls the
    /// sender soon.
    pub fn connect_small_window(addr: SocketAddr, session: u64, rcvbuf: i32) -> Raw {
        use std::os::unix::io::FromRawFd;
        let SocketAddr::V4(v4) = addr else {
            panic!("IPv4 only")
        };
        // SAFETY: a plain socket/setsockopt/connect sequence on a descriptor we own;
        // every pointer and length describes a local of the right type, and the
        // descriptor is handed to TcpStream, which closes it.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            let r = libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                &rcvbuf as *const i32 as *const libc::c_void,
                4,
            );
            assert_eq!(r, 0);
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            let r = libc::connect(
                fd,
                &sa as *const libc::sockaddr_in as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
            Raw::handshake(TcpStream::from_raw_fd(fd).into(), session)
        }
    }

    /// Send a request and wait for its reply.
    pub fn call(&mut self, req: impl Into<Request>) -> RawReply {
        self.call_with(req, &[])
    }

    pub fn call_with(&mut self, req: impl Into<Request>, data: &[u8]) -> RawReply {
        self.call_as(req, Cred::default(), &[], data)
    }

    /// Send a request (no data) naming `cred` as its caller, and wait for its reply.
    pub fn call_by(&mut self, req: impl Into<Request>, cred: Cred) -> RawReply {
        self.call_as(req, cred, &[], &[])
    }

    /// Send a request naming `cred` and `groups` as its caller, and wait for its reply.
    pub fn call_as(
        &mut self,
        req: impl Into<Request>,
        cred: Cred,
        groups: &[u32],
        data: &[u8],
    ) -> RawReply {
        let req = req.into();
        self.next_id += 1;
        let (h, body) = req.encode_with_groups(self.next_id, cred, groups).unwrap();
        self.send(&h, &body, data);
        self.receive(self.next_id)
    }

    /// Send exactly these bytes as one message.
    pub fn send(&mut self, h: &[u8], body: &[u8], data: &[u8]) {
        self.s.write_all(h).unwrap();
        self.s.write_all(body).unwrap();
        self.s.write_all(data).unwrap();
    }

    /// Send a header built by hand (with any body) and wait for the reply.
    pub fn call_raw(&mut self, h: ReqHeader, body: &[u8], data: &[u8]) -> RawReply {
        self.send(&h.encode(), body, data);
        self.receive(h.id)
    }

    pub fn receive(&mut self, id: u64) -> RawReply {
        let (got, r) = self.receive_any();
        assert_eq!(got, id, "replies come in order on one connection");
        r
    }

    /// The next reply, whichever request it answers (a reply that waits for another
    /// request's attempt comes when it is ready): its id and the reply.
    pub fn receive_any(&mut self) -> (u64, RawReply) {
        let mut hb = [0u8; RESP_HDR];
        self.s.read_exact(&mut hb).unwrap();
        let h = RespHeader::decode(&hb).unwrap();
        let mut body = vec![0u8; h.body_len as usize];
        self.s.read_exact(&mut body).unwrap();
        let mut data = vec![0u8; h.data_len as usize];
        self.s.read_exact(&mut data).unwrap();
        (
            h.id,
            RawReply {
                status: h.status,
                body,
                data,
            },
        )
    }
}

pub fn ctx() -> Ctx {
    Ctx::user(1000, 1000)
}

pub fn read_all(fs: &dyn Backend, ino: u64, fh: u64, off: u64, len: u32) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    fs.read(ino, fh, off, len, &mut |s: &[&[u8]]| {
        for x in s {
            out.extend_from_slice(x);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Create and open (read-write) file `name` in the root as `ctx()`: its attributes,
/// with a reference, and the handle.
pub fn file(fs: &dyn Backend, name: &[u8]) -> (Attr, u64) {
    fs.create(&ctx(), ROOT, name, libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap()
}

/// Create `n` empty files `{prefix}{i}` (i from 0) in `dir` as `ctx()`, close them and
/// give their references back; their inode numbers, in order.
pub fn empty_files(fs: &dyn Backend, dir: u64, prefix: &str, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let name = format!("{prefix}{i}");
            let (e, h) = fs
                .create(&ctx(), dir, name.as_bytes(), libc::S_IFREG | 0o644, 0)
                .unwrap();
            fs.release(e.ino, h).unwrap();
            fs.forget(e.ino, 1);
            e.ino
        })
        .collect()
}

/// Poll `f` until it holds, for at most `limit`.
pub fn eventually(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `Accounting` saw, per inode.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// References given out minus references given back, by the contract.
    pub refs: HashMap<u64, i64>,
    /// Opens (open, create) minus releases.
    pub opens: HashMap<u64, i64>,
    pub holds: u64,
    pub forgets: u64,
    pub forgotten: HashMap<u64, u64>,
    pub lookups: u64,
    pub releases: u64,
}

impl Ledger {
    /// Inodes with references or handles still out.
    pub fn outstanding(&self) -> Vec<(u64, i64, i64)> {
        let mut inos: Vec<u64> = self.refs.keys().chain(self.opens.keys()).copied().collect();
        inos.sort_unstable();
        inos.dedup();
        inos.into_iter()
            .map(|i| {
                (
                    i,
                    self.refs.get(&i).copied().unwrap_or(0),
                    self.opens.get(&i).copied().unwrap_or(0),
                )
            })
            .filter(|(_, r, o)| *r != 0 || *o != 0)
            .collect()
    }
}

/// A Backend that passes everything on and keeps the ledger of references and handles
/// the contract defines: a caller that keeps the contract leaves nothing outstanding.
pub struct Accounting {
    pub inner: Arc<dyn Backend>,
    pub ledger: Mutex<Ledger>,
}

impl Accounting {
    pub fn new(inner: Arc<dyn Backend>) -> Arc<Accounting> {
        Arc::new(Accounting {
            inner,
            ledger: Mutex::new(Ledger::default()),
        })
    }

    pub fn ledger(&self) -> Ledger {
        self.ledger.lock().unwrap().clone()
    }

    /// A call that gives a reference to the inode it returns.
    fn gave(&self, r: &Result<Attr>) {
        if let Ok(a) = r {
            *self.ledger.lock().unwrap().refs.entry(a.ino).or_default() += 1;
        }
    }

    fn looked_up(&self, r: &Result<Attr>) {
        self.ledger.lock().unwrap().lookups += 1;
        self.gave(r);
    }

    fn held(&self, r: &Result<Attr>) {
        if r.is_ok() {
            self.ledger.lock().unwrap().holds += 1;
        }
        self.gave(r);
    }

    /// `create` gives a reference and a handle.
    fn created(&self, r: &Result<(Attr, u64)>) {
        if let Ok((a, _)) = r {
            let mut l = self.ledger.lock().unwrap();
            *l.refs.entry(a.ino).or_default() += 1;
            *l.opens.entry(a.ino).or_default() += 1;
        }
    }
}

/// What `readdir` passes each entry to.
type EachEntry<'a> = dyn FnMut(DirEntry) -> bool + 'a;

/// Backend methods that pass the call on to `self.inner`; those with `=> hook` then
/// show the result to `self.hook` before returning it.
macro_rules! pass_on {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty $(=> $hook:ident)?;)*) => {$(
        fn $name(&self, $($arg: $ty),*) -> $ret {
            let r = self.inner.$name($($arg),*);
            $(self.$hook(&r);)?
            r
        }
    )*};
}

/// In a Backend wrapper with an `inner` backend: pass every method on except lookup,
/// statfs and write_with (the ones the test wrappers change), which the wrapper writes
/// or passes on itself.
macro_rules! pass_on_the_rest {
    () => {
        pass_on_all_but_mkdir!();
        pass_on! {
            mkdir(ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr>;
        }
    };
}

/// `pass_on_the_rest!` without mkdir, for a wrapper that changes mkdir too.
#[allow(unused_macros)]
macro_rules! pass_on_all_but_mkdir {
    () => {
        pass_on_all_but_mkdir_and_write!();
        pass_on! {
            write(ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32>;
        }
    };
}

/// `pass_on_the_rest!` without write, for a wrapper that changes write too.
#[allow(unused_macros)]
macro_rules! pass_on_all_but_write {
    () => {
        pass_on_all_but_mkdir_and_write!();
        pass_on! {
            mkdir(ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr>;
        }
    };
}

/// With `pass_on_all_but_mkdir!` or `pass_on_all_but_write!`: the methods the other
/// test wrappers change (lookup, write_with, statfs, flush), passed on.
#[allow(unused_macros)]
macro_rules! pass_on_lookup_and_io {
    () => {
        pass_on! {
            lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
            statfs() -> Result<StatFs>;
            flush(ino: u64, fh: u64) -> Result<()>;
        }
    };
}

/// What `pass_on_all_but_mkdir!` and `pass_on_all_but_write!` share.
#[allow(unused_macros)]
macro_rules! pass_on_all_but_mkdir_and_write {
    () => {
        pass_on! {
            getattr(ino: u64) -> Result<Attr>;
            setattr(ctx: &Ctx, ino: u64, set: &SetAttr, fh: u64) -> Result<Attr>;
            access(ctx: &Ctx, ino: u64, mask: u32) -> Result<()>;
            opendir(ctx: &Ctx, ino: u64) -> Result<u64>;
            readlink(ino: u64) -> Result<Vec<u8>>;
            mknod(ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr>;
            unlink(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            rmdir(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
            symlink(ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr>;
            rename(ctx: &Ctx, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<Option<u64>>;
            link(ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr>;
            open(ctx: &Ctx, ino: u64, flags: i32) -> Result<u64>;
            create(ctx: &Ctx, parent: u64, name: &[u8], mode: u32, flags: i32) -> Result<(Attr, u64)>;
            tmpfile(ctx: &Ctx, parent: u64, mode: u32, flags: i32) -> Result<(Attr, u64)>;
            read(ino: u64, fh: u64, offset: u64, size: u32, reply: &mut dyn ReadReply) -> Result<()>;
            release(ino: u64, fh: u64) -> Result<()>;
            fsync(ino: u64, fh: u64, datasync: bool) -> Result<()>;
            readdir(ino: u64, offset: u64, plus: bool, f: &mut dyn FnMut(DirEntry) -> bool) -> Result<()>;
            setxattr(ctx: &Ctx, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
            getxattr(ctx: &Ctx, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
            listxattr(ctx: &Ctx, ino: u64) -> Result<Vec<Vec<u8>>>;
            removexattr(ctx: &Ctx, ino: u64, name: &[u8]) -> Result<()>;
            forget(ino: u64, n: u64) -> ();
            hold(ino: u64, generation: u64) -> Result<Attr>;
            releasedir(ino: u64, fh: u64) -> Result<()>;
            lseek(ino: u64, fh: u64, offset: u64, whence: i32) -> Result<u64>;
        }
    };
}

impl Backend for Accounting {
    pass_on! {
        lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr> => looked_up;
        hold(ino: u64, generation: u64) -> Result<Attr> => held;
        mknod(ctx: &Ctx, parent: u64, name: &[u8], mode: u32, rdev: u32) -> Result<Attr> => gave;
        mkdir(ctx: &Ctx, parent: u64, name: &[u8], mode: u32) -> Result<Attr> => gave;
        symlink(ctx: &Ctx, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> => gave;
        link(ctx: &Ctx, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> => gave;
        create(ctx: &Ctx, parent: u64, name: &[u8], mode: u32, flags: i32) -> Result<(Attr, u64)> => created;
        tmpfile(ctx: &Ctx, parent: u64, mode: u32, flags: i32) -> Result<(Attr, u64)> => created;
        getattr(ino: u64) -> Result<Attr>;
        setattr(ctx: &Ctx, ino: u64, set: &SetAttr, fh: u64) -> Result<Attr>;
        access(ctx: &Ctx, ino: u64, mask: u32) -> Result<()>;
        opendir(ctx: &Ctx, ino: u64) -> Result<u64>;
        readlink(ino: u64) -> Result<Vec<u8>>;
        unlink(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
        rmdir(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
        rename(ctx: &Ctx, parent: u64, name: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<Option<u64>>;
        read(ino: u64, fh: u64, offset: u64, size: u32, reply: &mut dyn ReadReply) -> Result<()>;
        write(ctx: &Ctx, ino: u64, fh: u64, offset: u64, data: &[u8]) -> Result<u32>;
        write_with(ctx: &Ctx, ino: u64, fh: u64, offset: u64, payload: &mut dyn WritePayload) -> Result<u32>;
        flush(ino: u64, fh: u64) -> Result<()>;
        fsync(ino: u64, fh: u64, datasync: bool) -> Result<()>;
        statfs() -> Result<StatFs>;
        setxattr(ctx: &Ctx, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Result<()>;
        getxattr(ctx: &Ctx, ino: u64, name: &[u8]) -> Result<Vec<u8>>;
        listxattr(ctx: &Ctx, ino: u64) -> Result<Vec<Vec<u8>>>;
        removexattr(ctx: &Ctx, ino: u64, name: &[u8]) -> Result<()>;
        fallocate(ctx: &Ctx, ino: u64, fh: u64, offset: u64, len: u64, mode: i32) -> Result<()>;
        releasedir(ino: u64, fh: u64) -> Result<()>;
        lseek(ino: u64, fh: u64, offset: u64, whence: i32) -> Result<u64>;
        copy_stats() -> CopyStats;
        sync_all() -> Result<()>;
    }
    fn forget(&self, ino: u64, n: u64) {
        {
            let mut l = self.ledger.lock().unwrap();
            *l.refs.entry(ino).or_default() -= n as i64;
            l.forgets += 1;
            *l.forgotten.entry(ino).or_default() += n;
        }
        self.inner.forget(ino, n)
    }
    fn open(&self, ctx: &Ctx, ino: u64, flags: i32) -> Result<u64> {
        let r = self.inner.open(ctx, ino, flags);
        if r.is_ok() {
            *self.ledger.lock().unwrap().opens.entry(ino).or_default() += 1;
        }
        r
    }
    fn release(&self, ino: u64, fh: u64) -> Result<()> {
        {
            let mut l = self.ledger.lock().unwrap();
            *l.opens.entry(ino).or_default() -= 1;
            l.releases += 1;
        }
        self.inner.release(ino, fh)
    }
    fn readdir(&self, ino: u64, offset: u64, plus: bool, f: &mut EachEntry) -> Result<()> {
        self.inner.readdir(ino, offset, plus, &mut |e| {
            if plus {
                *self.ledger.lock().unwrap().refs.entry(e.ino).or_default() += 1;
            }
            f(e)
        })
    }
}

/// Run `f` on a thread of its own that acts as `uid`, `gid` with `groups` (the raw
/// setres[ug]id and setgroups system calls change the calling thread only, unlike the
/// libc wrappers, which change every thread of the process). Sockets it connects carry
/// that identity (SO_PEERCRED, SO_PEERGROUPS). Needs root.
pub fn as_user<T: Send + 'static>(
    uid: u32,
    gid: u32,
    groups: &[u32],
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let groups = groups.to_vec();
    std::thread::spawn(move || {
        // SAFETY: plain system calls on the calling thread's credentials; the group
        // list pointer and length describe `groups`.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()),
                0,
                "setgroups: {}",
                std::io::Error::last_os_error()
            );
            assert_eq!(libc::syscall(libc::SYS_setresgid, gid, gid, gid), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, uid, uid, uid), 0);
        }
        f()
    })
    .join()
    .unwrap()
}

/// Whether the tests run as root (the identity tests need to become other users).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A fresh path for a server's Unix socket.
pub fn socket_path(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("zcfs-sock-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    dir.join("s.sock")
}

/// Whether the layer-2 tests can run here (root, XDP program built); with
/// ZCFS_REQUIRE_L2=1 they must.
pub fn l2_ready() -> bool {
    let require = std::env::var("ZCFS_REQUIRE_L2").is_ok_and(|v| v == "1");
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && zcfs_xsk::xdp_object_available();
    assert!(
        ok || !require,
        "ZCFS_REQUIRE_L2=1 but not root or no XDP program"
    );
    if !ok {
        eprintln!("skipped: needs root and an XDP program");
    }
    ok
}

/// A fresh volume of `size` bytes (a log of `log_bytes`, its root `root`) on a
/// /dev/shm file, and that file opened again for a lane whose memory it is (writes land
/// in place). The file's name is gone from /dev/shm before this returns.
pub fn shm_volume(
    label: &str,
    size: u64,
    log_bytes: u64,
    root: zcfs_volume::RootDir,
) -> (Arc<Volume>, std::fs::File) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let path = format!(
        "/dev/shm/zcfs-srvtest-{}-{}-{label}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let path = std::path::Path::new(&path);
    let opts = MkfsOptions {
        inodes: Some(256),
        log_bytes: Some(log_bytes),
        root,
    };
    let made = Volume::mkfs(path, size, &opts)
        .and_then(|()| Volume::open(path, VolumeConfig::synchronous()));
    let image = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path);
    // Gone from the directory whatever failed above.
    let _ = std::fs::remove_file(path);
    (made.unwrap(), image.unwrap())
}
