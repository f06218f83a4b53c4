//! What the spliced-write tests share: `fs.pipe-max-size` raised for a test's run (the
//! mount's 2 MiB splice pipes need it where root lacks CAP_SYS_RESOURCE), and a read
//! back from the server.

use super::sh;
use std::fs;
use std::sync::{Mutex, MutexGuard};

const PIPE_MAX_SIZE: &str = "/proc/sys/fs/pipe-max-size";
const SPLICE_PIPE: u64 = 2 << 20;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the tests of a binary apart and `fs.pipe-max-size` at 2 MiB (at least) while
/// alive; the old value is put back on drop.
pub struct Splicing {
    old: Option<String>,
    _one: MutexGuard<'static, ()>,
}

pub fn splicing() -> Splicing {
    let one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let old = fs::read_to_string(PIPE_MAX_SIZE).unwrap();
    let old = if old.trim().parse::<u64>().unwrap() >= SPLICE_PIPE {
        None
    } else {
        fs::write(PIPE_MAX_SIZE, SPLICE_PIPE.to_string()).unwrap();
        Some(old)
    };
    Splicing { old, _one: one }
}

impl Drop for Splicing {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = fs::write(PIPE_MAX_SIZE, old.trim());
        }
    }
}

/// Every byte read back with the page cache dropped (so from the server) is `model`'s.
pub fn assert_reads_back(path: &str, model: &[u8]) {
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    let got = fs::read(path).unwrap();
    assert_eq!(got.len(), model.len(), "{path}: size");
    if let Some(i) = got.iter().zip(model).position(|(a, b)| a != b) {
        panic!("{path}: first wrong byte at {i}");
    }
}
