//! Quick figures for the same-host interface, from another process: 4 KiB random read
//! p50 in shared-buffer and direct-map mode, and 1 MiB write + commit throughput.
//!
//! `cargo run --release -p zcfs-samehost --example figures [SPIN_US]` makes a 1 GiB
//! volume on /dev/shm, serves it in this process (the server spins SPIN_US after each
//! request, default the service's), and runs the client in a child process.

use std::sync::Arc;
use std::time::{Duration, Instant};
use zcfs_samehost::client::{Client, Place, NO_NEW_SIZE};
use zcfs_samehost::{Service, ServiceConfig};
use zcfs_volume::{Cred, MkfsOptions, Volume, VolumeConfig};

const FILE: u64 = 256 << 20;
const READS: usize = 20_000;
const COMMITS: usize = 200;

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

fn rand(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn client(sock: &str) {
    let mut c = Client::connect(sock).unwrap();
    let buf = c.register_buffer(1 << 20).unwrap();
    let f = c.open("/data", libc::O_RDWR, 0).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let blocks = FILE / 4096;
    // Shared buffer: READ into the buffer (one copy by the server).
    let mut t = Vec::with_capacity(READS);
    for _ in 0..READS {
        let off = rand(&mut x) % blocks * 4096;
        let s = Instant::now();
        assert_eq!(c.read(f.handle, off, buf, 0, 4096).unwrap(), 4096);
        t.push(s.elapsed());
    }
    println!("shared 4KiB read p50 {:.2} us", p50(t));
    // Direct map: READ_EXTENTS (lease), touch the bytes in place, LEASE_RELEASE.
    c.direct_map().unwrap();
    let mut t = Vec::with_capacity(READS);
    let mut t_ext = Vec::with_capacity(READS);
    let mut sum = 0u64;
    for _ in 0..READS {
        let off = rand(&mut x) % blocks * 4096;
        let s = Instant::now();
        let l = c.read_extents(f.handle, off, 4096).unwrap();
        let b = c.mapped().unwrap().bytes(&l.extents[0]).unwrap();
        sum += b[0] as u64 + b[4095] as u64;
        t_ext.push(s.elapsed());
        c.release(l.id).unwrap();
        t.push(s.elapsed());
    }
    println!(
        "direct 4KiB read p50 {:.2} us (extents+touch), {:.2} us with release (sum {sum})",
        p50(t_ext),
        p50(t)
    );
    // 1 MiB write + commit, direct: reserve, fill the window, commit.
    let src: Vec<u8> = (0..1 << 20).map(|i| (i * 7) as u8).collect();
    let out = c.open("/out", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let s = Instant::now();
    let mut parts = [Duration::ZERO; 4];
    for i in 0..COMMITS {
        let t0 = Instant::now();
        let mut r = c.reserve(256).unwrap();
        let t1 = Instant::now();
        let mut w = r.window();
        let t2 = Instant::now();
        w.fill(&src);
        let t3 = Instant::now();
        parts[0] += t1 - t0;
        parts[1] += t2 - t1;
        parts[2] += t3 - t2;
        c.commit(vec![Place {
            handle: out.handle,
            file_offset: (i as u64 % 64) << 20,
            reservation: r,
            new_size: NO_NEW_SIZE,
        }])
        .unwrap();
        parts[3] += t3.elapsed();
    }
    let e = s.elapsed().as_secs_f64();
    let us = |d: Duration| d.as_secs_f64() * 1e6 / COMMITS as f64;
    println!(
        "  per 1MiB: reserve {:.0} us, window {:.0} us, fill {:.0} us, commit {:.0} us",
        us(parts[0]),
        us(parts[1]),
        us(parts[2]),
        us(parts[3])
    );
    println!(
        "direct 1MiB write+commit {:.0} MB/s ({:.0} us each)",
        COMMITS as f64 * 1.048576 / e,
        e / COMMITS as f64 * 1e6
    );
    // 1 MiB write, shared buffer (one copy, by the server).
    c.buffer_mut(buf).unwrap().copy_from_slice(&src);
    let s = Instant::now();
    for i in 0..COMMITS {
        c.write(out.handle, (i as u64 % 64) << 20, buf, 0, 1 << 20)
            .unwrap();
    }
    let e = s.elapsed().as_secs_f64();
    println!(
        "shared 1MiB write {:.0} MB/s ({:.0} us each)",
        COMMITS as f64 * 1.048576 / e,
        e / COMMITS as f64 * 1e6
    );
    let st = c.stats().unwrap();
    println!(
        "copies per byte: shared {} direct {}",
        st.shared_copies_per_byte, st.direct_copies_per_byte
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--client") {
        client(&args[2]);
        return;
    }
    let spin = args
        .get(1)
        .map(|s| Duration::from_micros(s.parse().expect("SPIN_US")));
    let tag = format!("zcfs-sh-figures-{}", std::process::id());
    let image = format!("/dev/shm/{tag}.img");
    let sock = std::env::temp_dir().join(format!("{tag}.sock"));
    Volume::mkfs(image.as_ref(), 1 << 30, &MkfsOptions::default()).unwrap();
    let vol = Volume::open(image.as_ref(), VolumeConfig::default()).unwrap();
    // As `zcfs serve` does: fresh blocks come already faulted in.
    vol.prefault_in_background();
    let ino = vol.create(&Cred::ROOT, 1, b"data", 0o644, 0).unwrap().ino;
    let chunk = vec![0x5au8; 16 << 20];
    for i in 0..FILE / chunk.len() as u64 {
        vol.write(&Cred::ROOT, ino, i * chunk.len() as u64, &chunk)
            .unwrap();
    }
    let mut cfg = ServiceConfig::new(&sock);
    cfg.identity.squash = zcfs_types::identity::Squash::None;
    if let Some(s) = spin {
        cfg.spin = s;
    }
    println!("server spin {:?}", cfg.spin);
    let svc = Arc::new(Service::bind(vol.clone(), cfg).unwrap());
    let run = svc.clone();
    let t = std::thread::spawn(move || run.run());
    let st = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--client", sock.to_str().unwrap()])
        .status()
        .unwrap();
    svc.shutdown();
    t.join().unwrap();
    drop(svc);
    drop(vol);
    let _ = std::fs::remove_file(&image);
    assert!(st.success());
}
