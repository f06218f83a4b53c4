//! Replies that carry a file's attributes (link, a lookup by handle) while a write of
//! it, answered already, is still on its way on another connection: the size they give
//! the caller must include that write (the kernel takes it as the file's).

#[macro_use]
mod common;
use common::*;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use zcfs_backend::*;

const MIB: usize = 1 << 20;

/// Passes everything on; writes wait while the gate is closed.
struct HeldWrites {
    inner: Arc<dyn Backend>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Backend for HeldWrites {
    pass_on_the_rest!();
    pass_on! {
        lookup(ctx: &Ctx, parent: u64, name: &[u8]) -> Result<Attr>;
        statfs() -> Result<StatFs>;
    }
    fn write_with(
        &self,
        c: &Ctx,
        i: u64,
        fh: u64,
        o: u64,
        payload: &mut dyn WritePayload,
    ) -> Result<u32> {
        let (m, cv) = &*self.gate;
        let mut open = m.lock().unwrap();
        // Bounded: a test that fails before opening the gate must not hang the server.
        let t = std::time::Instant::now();
        while !*open && t.elapsed() < Duration::from_secs(30) {
            open = cv.wait_timeout(open, Duration::from_millis(50)).unwrap().0;
        }
        drop(open);
        self.inner.write_with(c, i, fh, o, payload)
    }
}

fn set(gate: &(Mutex<bool>, Condvar), open: bool) {
    *gate.0.lock().unwrap() = open;
    gate.1.notify_all();
}

#[test]
fn a_link_or_hold_after_a_write_in_flight_gives_the_size_with_it() {
    let gate = Arc::new((Mutex::new(true), Condvar::new()));
    let srv = Running::start(
        Arc::new(HeldWrites {
            inner: memory_fs(16 * MIB),
            gate: gate.clone(),
        }),
        config(),
    );
    let fs = srv.client();
    let (f, fh) = file(&fs, b"f");
    for (round, name) in [(0u8, "link"), (1, "hold")] {
        set(&gate, false);
        let data = vec![round + 1; 10 + round as usize];
        assert_eq!(
            fs.write_behind(&ctx(), f.ino, fh, 0, &data).unwrap() as usize,
            data.len()
        );
        let opener = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                set(&gate, true);
            })
        };
        let a = if round == 0 {
            fs.link(&ctx(), f.ino, ROOT, b"g").unwrap()
        } else {
            fs.hold(f.ino, f.generation).unwrap()
        };
        opener.join().unwrap();
        assert_eq!(
            a.size,
            data.len() as u64,
            "{name}: the size before the write"
        );
        fs.forget(f.ino, 1);
    }
    fs.flush(f.ino, fh).unwrap();
    fs.release(f.ino, fh).unwrap();
}
