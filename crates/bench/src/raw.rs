//! The raw TCP limit of the link, measured with the request shapes zcfs uses: a server
//! answering 16-byte requests ([`server`]), round trips of each size at QD1 and
//! pipelined ([`bench`]), and one-way streaming bandwidth ([`stream`], what iperf3
//! measures).

use crate::cpu::{cpu_now, with_cpu};
use crate::rows::{max_ops, op_name, row, Row};
use anyhow::Result;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Raw server: 16-byte requests (kind, n). kind 1: reply n bytes; kind 2: receive n
/// bytes, reply 8.
pub fn server(l: TcpListener) {
    static DATA: [u8; 1 << 20] = [0x5a; 1 << 20];
    for s in l.incoming() {
        let Ok(mut s) = s else { return };
        let _ = s.set_nodelay(true);
        std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 20];
            loop {
                let mut req = [0u8; 16];
                if s.read_exact(&mut req).is_err() {
                    return;
                }
                let kind = u64::from_le_bytes(req[..8].try_into().unwrap());
                let mut n = u64::from_le_bytes(req[8..].try_into().unwrap()) as usize;
                let r = match kind {
                    1 => (|| {
                        while n > 0 {
                            let k = n.min(DATA.len());
                            s.write_all(&DATA[..k])?;
                            n -= k;
                        }
                        Ok::<_, std::io::Error>(())
                    })(),
                    2 => (|| {
                        while n > 0 {
                            let k = n.min(sink.len());
                            s.read_exact(&mut sink[..k])?;
                            n -= k;
                        }
                        s.write_all(&[0u8; 8])
                    })(),
                    // Streams, for the bandwidth limit: send until the peer closes,
                    // or receive until it does.
                    3 => loop {
                        if s.write_all(&DATA).is_err() {
                            return;
                        }
                    },
                    4 => loop {
                        match s.read(&mut sink) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    },
                    _ => return,
                };
                if r.is_err() {
                    return;
                }
            }
        });
    }
}

/// One request: header and payload in one writev, as zcfs sends them.
fn request(s: &mut TcpStream, kind: u64, n: usize, payload: &[u8]) -> std::io::Result<()> {
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&kind.to_le_bytes());
    req[8..].copy_from_slice(&(n as u64).to_le_bytes());
    let mut iov = vec![std::io::IoSlice::new(&req)];
    if kind == 2 {
        let mut left = n;
        while left > 0 {
            let k = left.min(payload.len());
            iov.push(std::io::IoSlice::new(&payload[..k]));
            left -= k;
        }
    }
    let mut bufs = &mut iov[..];
    while !bufs.is_empty() {
        let w = s.write_vectored(bufs)?;
        std::io::IoSlice::advance_slices(&mut bufs, w);
    }
    Ok(())
}

fn reply(s: &mut TcpStream, kind: u64, n: usize, buf: &mut [u8]) -> std::io::Result<()> {
    let mut left = if kind == 1 { n } else { 8 };
    while left > 0 {
        let k = left.min(buf.len());
        s.read_exact(&mut buf[..k])?;
        left -= k;
    }
    Ok(())
}

pub fn bench(addr: &str, size: usize, write: bool, qd: usize, secs: f64) -> Result<Row> {
    let cpu0 = cpu_now();
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let kind = if write { 2 } else { 1 };
    let payload = vec![0xa5u8; size.min(1 << 20)];
    let mut buf = vec![0u8; size.min(1 << 20)];
    let limit = max_ops(size);
    let deadline = Duration::from_secs_f64(secs);
    // Warm the connection up (window growth) as zcfs's was by preparing its file.
    let warm = Instant::now();
    let mut moved = 0usize;
    while moved < 64 << 20 && warm.elapsed() < Duration::from_millis(300) {
        request(&mut s, kind, size, &payload)?;
        reply(&mut s, kind, size, &mut buf)?;
        moved += size;
    }
    let mut lat = Vec::new();
    let t = Instant::now();
    let mut done = 0u64;
    if qd == 1 {
        while done < limit && t.elapsed() < deadline {
            let t0 = Instant::now();
            request(&mut s, kind, size, &payload)?;
            reply(&mut s, kind, size, &mut buf)?;
            lat.push(t0.elapsed().as_nanos() as u64);
            done += 1;
        }
    } else {
        // A writer thread keeps `qd` requests ahead of the replies; send times come
        // back in order, for the latency of each.
        let mut w = s.try_clone()?;
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(qd);
        let (ttx, trx) = std::sync::mpsc::channel::<Instant>();
        let sent = std::thread::spawn(move || -> std::io::Result<u64> {
            let mut n = 0;
            while rx.recv().is_ok() {
                ttx.send(Instant::now()).ok();
                request(&mut w, kind, size, &payload)?;
                n += 1;
            }
            Ok(n)
        });
        for _ in 0..qd {
            tx.send(()).ok();
        }
        while done < limit * 4 && t.elapsed() < deadline {
            reply(&mut s, kind, size, &mut buf)?;
            if let Ok(t0) = trx.recv() {
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            done += 1;
            tx.send(()).ok();
        }
        drop(tx);
        let issued = sent
            .join()
            .map_err(|_| anyhow::anyhow!("raw writer panicked"))??;
        for _ in done..issued {
            reply(&mut s, kind, size, &mut buf)?;
        }
    }
    let el = t.elapsed();
    let r = row("raw-tcp", op_name(write), "-", size, qd, &mut lat, el, done);
    Ok(with_cpu(r, cpu0))
}

/// One-way TCP streaming bandwidth on the link (what iperf3 measures): the ceiling
/// for bulk transfers.
pub fn stream(addr: &str, write: bool, secs: f64) -> Result<Row> {
    let mut s = TcpStream::connect(addr)?;
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&(if write { 4u64 } else { 3 }).to_le_bytes());
    s.write_all(&req)?;
    let mut buf = vec![0x77u8; 1 << 20];
    let warm = Duration::from_millis(300);
    let t = Instant::now();
    let mut bytes = 0u64;
    let mut t0 = None;
    while t.elapsed() < warm + Duration::from_secs_f64(secs) {
        let n = if write {
            s.write(&buf)?
        } else {
            s.read(&mut buf)?
        };
        if t.elapsed() >= warm {
            t0.get_or_insert_with(Instant::now);
            bytes += n as u64;
        }
    }
    let el = t0.map_or(Duration::from_millis(1), |t0| t0.elapsed());
    let mut r = row(
        "raw-tcp-stream",
        op_name(write),
        "-",
        1 << 20,
        0,
        &mut [],
        el,
        0,
    );
    r.mb_s = bytes as f64 / el.as_secs_f64() / 1e6;
    Ok(r)
}
