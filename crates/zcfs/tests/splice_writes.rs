//! Large buffered writes through a remote mount go from /dev/fuse into the socket by
//! splice(2) (the vendored fuser's `write_spliced`, `Client::submit_piped`): their bytes
//! must arrive exactly as written, at every size and alignment around the splice
//! threshold, from several writers at once, with a secret (tags over the headers) and
//! with full integrity (data tags: the piped bytes are read into memory then), and a
//! write lost with its connection must leave the mount serving. Root required (network
//! namespaces), as in CI.
//!
//! One test function: the mount needs a 2 MiB pipe per FUSE thread, which takes
//! CAP_SYS_RESOURCE (not every root has it: containers and this CI's sandbox drop it)
//! or `fs.pipe-max-size` of 2 MiB; the test raises the sysctl for its run and puts the
//! old value back, and nothing else in this binary runs beside it.

mod common;
use common::remote::*;
use common::splicing::*;
use rand::{Rng, SeedableRng};
use std::fs;
use std::io::{Seek, SeekFrom, Write};

/// The writes of one round: (offset, length), sizes around the splice threshold (32 KiB
/// of data) and the largest request (1 MiB), at page-aligned and unaligned offsets,
/// some overlapping earlier ones.
fn shapes() -> Vec<(u64, usize)> {
    let min = zcfs_fuse::SPLICE_WRITE_MIN;
    vec![
        (0, min - 1),
        (0, min),
        (4096, min + 1),
        (1 << 20, 1 << 20),
        ((3 << 20) + 4097, 1 << 20),
        ((6 << 20) + 513, (3 << 20) + 17),
        (100, 2 << 20),
        ((12 << 20) - 7, 128 << 10),
    ]
}

/// The writes of round `seed`: each shape's random bytes.
fn shape_data(seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    shapes()
        .into_iter()
        .map(|(off, len)| (off, (0..len).map(|_| rng.gen()).collect()))
        .collect()
}

/// What the file holds after the writes of round `seed`.
fn shapes_model(seed: u64) -> Vec<u8> {
    let mut model = Vec::new();
    for (off, data) in shape_data(seed) {
        let end = off as usize + data.len();
        if model.len() < end {
            model.resize(end, 0);
        }
        model[off as usize..end].copy_from_slice(&data);
    }
    model
}

/// Write round `seed` into `path` through the mount (one buffered `write(2)` per shape),
/// fsync and close it; what it now holds.
fn write_shapes(path: &str, seed: u64) -> Vec<u8> {
    let mut f = fs::File::create(path).unwrap();
    for (off, data) in shape_data(seed) {
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&data).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    shapes_model(seed)
}

fn spliced_bytes(net: &Net, srv: &Served, m: &RemoteMount) -> u64 {
    stat_json(net, srv, m.mp.to_str().unwrap())["spliced_write_bytes"]
        .as_u64()
        .unwrap()
}

#[test]
fn spliced_writes_arrive_whole_and_a_lost_one_leaves_the_mount_serving() {
    let _pipes = splicing();
    let net = Net::new();
    let mut srv = Served::sized(&net, "splice", "2G", &[]);

    // 1. A secret (tags over headers and bodies, not the data): the default mount
    //    splices every write of at least the threshold, one writer and four at once.
    let m = RemoteMount::new(&net, &srv, "splice", &[]);
    let model = write_shapes(&m.path("one"), 1);
    assert_reads_back(&m.path("one"), &model);
    // A worker splices while large writes come to it and reads as usual otherwise
    // (the vendored fuser's `event_loop_spliced`): a stream of 1 MiB writes is mostly
    // spliced, each worker copying the first one it meets.
    let before = spliced_bytes(&net, &srv, &m);
    let stream: Vec<u8> = (0..64u32 << 20).map(|i| (i % 251) as u8).collect();
    {
        let mut f = fs::File::create(m.path("stream")).unwrap();
        for chunk in stream.chunks(1 << 20) {
            f.write_all(chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    let spliced = spliced_bytes(&net, &srv, &m);
    assert!(
        spliced - before >= stream.len() as u64 / 2,
        "spliced {} of a {} byte stream",
        spliced - before,
        stream.len()
    );
    assert_reads_back(&m.path("stream"), &stream);
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u64)
            .map(|i| {
                let p = m.path(&format!("many-{i}"));
                s.spawn(move || write_shapes(&p, 10 + i))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, model) in models.iter().enumerate() {
        assert_reads_back(&m.path(&format!("many-{i}")), model);
    }

    // 2. The same bytes through `-o nosplice` and through full integrity (data tags
    //    need the bytes: read out of the pipe): nothing spliced, the same content.
    {
        let other = RemoteMount::new(&net, &srv, "nosplice", &["-o", "nosplice"]);
        let model = write_shapes(&other.path("nosplice"), 2);
        assert_reads_back(&other.path("nosplice"), &model);
        assert_reads_back(&other.path("one"), &shapes_model(1));
        assert_eq!(spliced_bytes(&net, &srv, &other), 0);
    }
    {
        // Over the bound of `SPLICE_MAX_WRITE` (1 MiB): no room in the pipe for a whole
        // write, so the mount copies (and still serves).
        let over = (zcfs_fuse::SPLICE_MAX_WRITE + 4096).to_string();
        let opt = format!("max_write={over}");
        let other = RemoteMount::new(&net, &srv, "over", &["-o", &opt]);
        let model = write_shapes(&other.path("over"), 4);
        assert_reads_back(&other.path("over"), &model);
        assert_eq!(spliced_bytes(&net, &srv, &other), 0);
    }
    {
        // A server of its own (its own pair of namespaces: the address is per pair).
        let net = Net::new();
        let full = Served::sized(&net, "splice-full", "1G", &["--integrity", "full"]);
        let m = RemoteMount::new(&net, &full, "full", &["-o", "integrity=full"]);
        let model = write_shapes(&m.path("full"), 2);
        assert_reads_back(&m.path("full"), &model);
    }

    // 3. A write lost with its connection (the server killed while large writes are
    //    being spliced): the writer hears of it at close (write-behind's rule), the
    //    pipe the lost write left data in is emptied, and the mount goes on serving
    //    spliced writes once the server is back.
    let writer = {
        let p = m.path("lost");
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut f = fs::File::create(&p)?;
            let chunk = vec![5u8; 1 << 20];
            let t = std::time::Instant::now();
            // Bounded: at most 20 s or 4 GiB of writes.
            for _ in 0..4096 {
                if t.elapsed() > std::time::Duration::from_secs(20) {
                    break;
                }
                f.write_all(&chunk)?;
            }
            f.sync_all()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    srv.kill(libc::SIGKILL);
    let r = writer.join().unwrap();
    assert!(r.is_err(), "writes through a killed server all succeeded");
    srv.start(&net, &[]);
    let model = write_shapes(&m.path("after"), 3);
    assert_reads_back(&m.path("after"), &model);
    assert_reads_back(&m.path("one"), &shapes_model(1));
    drop(m);
    srv.kill(libc::SIGTERM);
    srv.fsck();
}
