//! Review 30: spliced writes (the vendored fuser's `write_spliced`, the client's
//! `submit_piped`). Root required (network namespaces, FUSE mounts), as in CI. Every
//! test raises `fs.pipe-max-size` to 2 MiB for its run (the splice pipe needs it where
//! root lacks CAP_SYS_RESOURCE) and the tests of this binary run one at a time.

mod common;
use common::remote::*;
use common::splicing::*;
use std::fs;
use std::io::Write;
use std::time::Duration;

/// Run `f` on a thread; its result, or None when it did not return within `limit`
/// (the thread is left behind: the mount's drop kills the mount process, which fails
/// whatever it blocks in).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

/// `-o max_write=` accepts up to 16 MiB, and the kernel then wants every read of
/// /dev/fuse to have room for a whole write of max_write: a splice of the 2 MiB pipe
/// fails (EINVAL) when max_write is 2 MiB or more, and a mount that splices must still
/// serve (reading as usual, or splicing with room enough).
#[test]
fn a_mount_with_max_write_of_2_mib_still_serves_writes() {
    let _s = splicing();
    let net = Net::new();
    let srv = Served::sized(&net, "r30-maxw", "1G", &[]);
    let m = RemoteMount::new(&net, &srv, "r30-maxw", &["-o", "max_write=2097152"]);
    let p = m.path("f");
    let data = seeded_bytes(7, 3 << 20);
    let d = data.clone();
    let r = within(Duration::from_secs(20), move || -> std::io::Result<()> {
        let mut f = fs::File::create(&p)?;
        f.write_all(&d)?;
        f.sync_all()
    });
    match r {
        None => panic!("a 3 MiB write through a mount with max_write=2M hung"),
        Some(Err(e)) => panic!("a 3 MiB write through a mount with max_write=2M failed: {e}"),
        Some(Ok(())) => {}
    }
    assert_reads_back(&m.path("f"), &data);
}

/// A server that insists on full integrity (data tags) and a mount that asked for
/// nothing (its config says headers): the channel is full, so `send_piped_message`
/// reads every spliced write into memory to tag it. The bytes arrive, but `zcfs stat`
/// must not call them "moved by splice(2), never copied": they were copied in user
/// space and are counted as such nowhere.
#[test]
fn piped_writes_read_into_memory_are_not_counted_as_spliced() {
    let _s = splicing();
    let net = Net::new();
    let srv = Served::sized(&net, "r30-full", "1G", &["--integrity", "full"]);
    let m = RemoteMount::new(&net, &srv, "r30-full", &[]);
    let data = seeded_bytes(3, 4 << 20);
    let p = m.path("f");
    let d = data.clone();
    let r = within(Duration::from_secs(30), move || -> std::io::Result<()> {
        let mut f = fs::File::create(&p)?;
        f.write_all(&d)?;
        f.sync_all()
    });
    assert!(matches!(r, Some(Ok(()))), "{r:?}");
    // Asked before reading back: reads count as copied too.
    let st = stat_json(&net, &srv, m.mp.to_str().unwrap());
    let spliced = st["spliced_write_bytes"].as_u64().unwrap();
    let copied = st["fuse_user_copy_bytes"].as_u64().unwrap();
    assert!(
        spliced == 0 || copied >= data.len() as u64,
        "{spliced} bytes reported spliced (never copied), {copied} copied, though every \
         one was read into memory for its data tag"
    );
    assert_reads_back(&m.path("f"), &data);
}
