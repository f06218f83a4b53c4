//! Review 33g of the gate in front of /dev/fuse (`zcfs_fuse::read_gate`) as first
//! written (690f794): a worker that read a FUSE_READ kept its turn (still counted as
//! reading) while it dispatched the read, on the promise that `Backend::read_then`
//! returns at once. When it did not (it waited for an in-flight slot, or for the
//! connection's writer), the turn holders sat in the file system, no worker was in
//! read(2) of the device, and the gate let none of the idle workers in (it does so
//! only when the count of readers drops to zero): every other request of the mount
//! waited, though fourteen workers were idle. Fixed: a worker leaves the gate as soon
//! as its read of the device returns, whatever the request. Root required (network
//! namespaces, mounts), as in CI.
mod common;
use common::remote::*;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The pid of the `zcfs serve` of `srv`'s image.
fn server_pid(srv: &Served) -> i32 {
    let image = srv.image.to_str().unwrap();
    for e in std::fs::read_dir("/proc").unwrap() {
        let e = e.unwrap();
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
        if args.contains(&&b"serve"[..]) && args.contains(&image.as_bytes()) {
            return pid;
        }
    }
    panic!("no server of {image}");
}

/// Returns once every thread of the server stopped (SIGSTOP is delivered
/// asynchronously: a thread on the other CPU may answer a request meanwhile).
fn until_stopped(srv: &Served) {
    let pid = server_pid(srv);
    let t = Instant::now();
    loop {
        let stopped = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T'))
            });
        if stopped {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// fgetxattr(2) of `name` on `f` (no lookup of a path, which may go to the server):
/// its size, or the errno.
fn xattr_of(f: &std::fs::File, name: &str) -> Result<usize, i32> {
    use std::os::fd::AsRawFd;
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: an open descriptor, a NUL-terminated string that lives across the call,
    // and no buffer (size 0 asks for the value's size only).
    let r = unsafe { libc::fgetxattr(f.as_raw_fd(), n.as_ptr(), std::ptr::null_mut(), 0) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        Ok(r as usize)
    }
}

/// A request the mount answers itself (the security label it does not carry), asked
/// on a thread of its own: how long it took, or None if it had not come back within
/// `patience` (it is left to finish later).
fn local_answer_within(
    f: &std::sync::Arc<std::fs::File>,
    patience: Duration,
) -> Option<(Result<usize, i32>, Duration)> {
    let (tx, rx) = mpsc::channel();
    let f = f.clone();
    std::thread::spawn(move || {
        let t = Instant::now();
        let r = xattr_of(&f, "security.selinux");
        let _ = tx.send((r, t.elapsed()));
    });
    rx.recv_timeout(patience).ok()
}

/// `n` O_DIRECT reads of 4 KiB of `files` (one each, at offsets of their own), each on
/// a thread of its own.
fn reads_on_threads(files: Vec<std::fs::File>) -> Vec<std::thread::JoinHandle<()>> {
    files
        .into_iter()
        .enumerate()
        .map(|(i, f)| {
            std::thread::spawn(move || {
                let mut buf = AlignedPage::new();
                let t = Instant::now();
                let r = std::os::unix::fs::FileExt::read_at(&f, buf.bytes(), i as u64 * 4096);
                if std::env::var_os("R33G_DEBUG").is_some() {
                    eprintln!("read {i}: {r:?} in {:?}", t.elapsed());
                }
            })
        })
        .collect()
}

fn open_direct(p: &str, n: usize) -> Vec<std::fs::File> {
    (0..n)
        .map(|_| {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(p)
                .unwrap()
        })
        .collect()
}

/// The server stalls with every in-flight slot of the mount's connections taken
/// (`--max-inflight 2`, two connections: four reads). The next two reads wait in
/// `Conn::take_inflight_slot` (`Client::call_then`) on the threads that took them. On
/// 690f794 those threads kept their turns at the device, so both turns of
/// `-o readers=2` were held by threads that did not read it, the gate let no one in,
/// and a request the mount answers itself waited for the server with fourteen workers
/// idle. Now the two reads hold two workers and the others answer at once.
#[test]
fn reads_waiting_for_an_inflight_slot_leave_workers_at_the_device() {
    reads_waiting_for_an_inflight_slot("r33g-slots", "timeout=6,attr_timeout=60,readers=2");
}

fn reads_waiting_for_an_inflight_slot(tag: &str, opts: &str) {
    let net = Net::new();
    let srv = Served::new(&net, tag, &["--max-inflight", "2"]);
    let m = RemoteMount::new(&net, &srv, tag, &["-o", opts]);
    let (f, g) = (m.path("f"), m.path("g"));
    std::fs::write(&f, b"answered here").unwrap();
    let f = std::sync::Arc::new(std::fs::File::open(&f).unwrap());
    std::fs::write(&g, vec![1u8; 64 << 10]).unwrap();
    let pid = m.pid().unwrap();
    // Opened, and their attributes fresh, while the server runs.
    let readers = open_direct(&g, 6);
    let _ = std::fs::metadata(&g).unwrap();
    let (r, took) = local_answer_within(&f, Duration::from_secs(5)).unwrap();
    assert_eq!(
        r,
        Err(libc::EOPNOTSUPP),
        "labels are not carried by default"
    );
    assert!(
        took < Duration::from_millis(500),
        "{took:?} with the server up"
    );
    srv.signal(libc::SIGSTOP);
    until_stopped(&srv);
    // Four reads in flight (every slot), two waiting for a slot.
    let waiting = reads_on_threads(readers);
    std::thread::sleep(Duration::from_millis(400));
    let threads = fuse_threads(pid);
    if std::env::var_os("R33G_DEBUG").is_some() {
        for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let t = t.unwrap().path();
            let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
            let wchan = std::fs::read_to_string(t.join("wchan")).unwrap_or_default();
            eprintln!("{} {wchan}", comm.trim_end());
        }
    }
    let answered = local_answer_within(&f, Duration::from_millis(1500));
    srv.signal(libc::SIGCONT);
    for t in waiting {
        t.join().unwrap();
    }
    match answered {
        Some((r, took)) => {
            assert_eq!(r, Err(libc::EOPNOTSUPP));
            assert!(
                took < Duration::from_millis(500),
                "a request the mount answers itself waited {took:?} (workers, in read(2): {threads:?})"
            );
        }
        None => panic!(
            "a request the mount answers itself was not answered within 1.5 s while two \
             reads waited for an in-flight slot (workers, in read(2): {threads:?})"
        ),
    }
}

/// The wait channels of the mount's FUSE workers now.
fn worker_wchans(pid: i32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return vec![];
    };
    let mut out = vec![];
    for t in dir {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser-") || comm.starts_with("fuser-bg") {
            continue;
        }
        out.push(std::fs::read_to_string(t.join("wchan")).unwrap_or_default());
    }
    out
}

/// Workers in a send that waits for room in a socket (the server stalled).
fn workers_sending(pid: i32) -> usize {
    worker_wchans(pid)
        .iter()
        .filter(|w| {
            !w.starts_with("futex")
                && !w.starts_with("fuse_dev_do_read")
                && !w.is_empty()
                && *w != "0"
        })
        .count()
}

/// A stalled server and a writer of one file: large writes, answered early (write
/// behind), fill both connections' sockets, and the workers sending them wait for
/// room, each holding its connection's writer. A read of another file waits in
/// `send_on` for that writer. On 690f794 it kept its worker's turn, so no worker read
/// the device and a request the mount answers itself waited for the server. Now the
/// read holds one worker, the writes a few, and the rest answer.
#[test]
fn a_read_behind_a_stalled_write_leaves_workers_at_the_device() {
    read_behind_a_stalled_write("r33g-send", "timeout=8,attr_timeout=60,readers=2");
}

fn read_behind_a_stalled_write(tag: &str, opts: &str) {
    let net = Net::new();
    let srv = Served::new(&net, tag, &[]);
    let m = RemoteMount::new(&net, &srv, tag, &["-o", opts]);
    let (f, a, b) = (m.path("f"), m.path("a"), m.path("b"));
    std::fs::write(&f, b"answered here").unwrap();
    let f = std::sync::Arc::new(std::fs::File::open(&f).unwrap());
    std::fs::write(&b, vec![1u8; 64 << 10]).unwrap();
    let pid = m.pid().unwrap();
    let readers = open_direct(&b, 2);
    let _ = std::fs::metadata(&b).unwrap();
    let (r, _) = local_answer_within(&f, Duration::from_secs(5)).unwrap();
    assert_eq!(
        r,
        Err(libc::EOPNOTSUPP),
        "labels are not carried by default"
    );
    let mut w = std::fs::File::create(&a).unwrap();
    srv.signal(libc::SIGSTOP);
    until_stopped(&srv);
    // Write until two workers wait for room in a socket (one a connection), looking
    // after each write (answered early: the worker sends after the answer).
    let writer = std::thread::spawn(move || {
        let chunk = vec![3u8; 1 << 20];
        for _ in 0..48 {
            if std::io::Write::write_all(&mut w, &chunk).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(30));
            if workers_sending(pid) >= 2 {
                break;
            }
        }
    });
    let t = Instant::now();
    while !writer.is_finished() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    let before = worker_wchans(pid);
    // Two reads of b (the connections are picked in turn).
    let waiting = reads_on_threads(readers);
    std::thread::sleep(Duration::from_millis(300));
    let during = worker_wchans(pid);
    let answered = local_answer_within(&f, Duration::from_millis(1500));
    srv.signal(libc::SIGCONT);
    for t in waiting {
        t.join().unwrap();
    }
    writer.join().unwrap();
    if std::env::var_os("R33G_DEBUG").is_some() {
        eprintln!("before the reads: {before:?}\nduring: {during:?}");
    }
    match answered {
        Some((r, took)) => {
            assert_eq!(r, Err(libc::EOPNOTSUPP));
            assert!(
                took < Duration::from_millis(500),
                "a request the mount answers itself waited {took:?} (workers: {during:?})"
            );
        }
        None => panic!(
            "a request the mount answers itself was not answered within 1.5 s while a read \
             waited for a connection's writer (workers: {during:?})"
        ),
    }
}
