//! Several threads issue random operations on one volume (overlapping partial writes,
//! truncates, renames over targets, links, unlinks, references held across unlinks,
//! forced checkpoints), checked against a model: the volume reports every committed
//! operation in commit order (its trace hook runs under the write lock), the model
//! replays that order, and then
//! - every byte of every file equals the last committed write that covered it,
//! - every lookup a thread made matches the namespace at some point between the trace
//!   positions seen just before and just after it,
//! - every read matches the file at some point of its window, and
//! - fsck is clean, also after a remount.
//!
//! Write data is self-describing (each 8-byte word names the inode, the writer, the
//! write and its own offset), so the model can regenerate any write from the first
//! word the trace reports for it.

mod common;
use common::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zcfs_volume::trace::Traced;
use zcfs_volume::*;

const THREADS: u64 = 4;
const OPS_PER_THREAD: u64 = 25_000;
const TIME_LIMIT: Duration = Duration::from_secs(60);
const NAMES: u64 = 6;
const MAX_FILE: u64 = 48 << 10;

/// The word at file offset `off` of write `(tid, seq)` to inode `ino`.
fn word(ino: u64, tid: u64, seq: u64, off: u64) -> u64 {
    (ino & 0xfffff) << 44 | (tid & 0xf) << 40 | (seq & 0xff_ffff) << 16 | ((off / 8) & 0xffff)
}

fn decode(w: u64) -> (u64, u64) {
    ((w >> 40) & 0xf, (w >> 16) & 0xff_ffff)
}

/// Bytes of write `(tid, seq)` to `ino` over `[off, off+len)` (word-aligned pattern).
fn bytes(ino: u64, tid: u64, seq: u64, off: u64, len: u64) -> Vec<u8> {
    (off..off + len)
        .map(|o| word(ino, tid, seq, o & !7).to_le_bytes()[(o % 8) as usize])
        .collect()
}

fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[derive(Debug, Clone)]
enum Seen {
    Lookup {
        parent: u64,
        name: Vec<u8>,
        found: Option<u64>,
    },
    Read {
        ino: u64,
        off: u64,
        len: u64,
        hash: u64,
    },
}

#[derive(Default, Clone)]
struct ModelFs {
    dirs: HashMap<u64, BTreeMap<Vec<u8>, u64>>,
    files: HashMap<u64, Vec<u8>>,
    nlink: HashMap<u64, u32>,
}

impl ModelFs {
    fn apply(&mut self, t: &Traced) {
        match t {
            Traced::Create {
                parent,
                name,
                ino,
                mode,
            } => {
                self.dirs
                    .get_mut(parent)
                    .unwrap()
                    .insert(name.clone(), *ino);
                if mode & libc::S_IFMT == libc::S_IFDIR {
                    self.dirs.insert(*ino, BTreeMap::new());
                } else {
                    self.files.insert(*ino, Vec::new());
                }
                self.nlink.insert(*ino, 1);
            }
            Traced::TmpFile { ino, .. } => {
                self.files.insert(*ino, Vec::new());
                self.nlink.insert(*ino, 0);
            }
            Traced::Link { ino, parent, name } => {
                self.dirs
                    .get_mut(parent)
                    .unwrap()
                    .insert(name.clone(), *ino);
                *self.nlink.get_mut(ino).unwrap() += 1;
            }
            Traced::Unlink { parent, name } | Traced::Rmdir { parent, name } => {
                let ino = self.dirs.get_mut(parent).unwrap().remove(name).unwrap();
                self.drop_link(ino);
            }
            Traced::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                let src = self.dirs[parent][name];
                let dst = self.dirs[new_parent].get(new_name).copied();
                if flags.exchange {
                    let dst = dst.unwrap();
                    self.dirs.get_mut(parent).unwrap().insert(name.clone(), dst);
                    self.dirs
                        .get_mut(new_parent)
                        .unwrap()
                        .insert(new_name.clone(), src);
                    return;
                }
                if dst == Some(src) {
                    return;
                }
                self.dirs.get_mut(parent).unwrap().remove(name);
                self.dirs
                    .get_mut(new_parent)
                    .unwrap()
                    .insert(new_name.clone(), src);
                if let Some(d) = dst {
                    self.drop_link(d);
                }
            }
            Traced::Write {
                ino,
                offset,
                len,
                first_word,
            } => {
                let (tid, seq) = decode(*first_word);
                let data = bytes(*ino, tid, seq, *offset, *len);
                let f = self.files.get_mut(ino).unwrap();
                let end = (offset + len) as usize;
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[*offset as usize..end].copy_from_slice(&data);
            }
            Traced::Truncate { ino, size } => {
                self.files.get_mut(ino).unwrap().resize(*size as usize, 0);
            }
            Traced::Freed { ino } => {
                assert_eq!(self.nlink[ino], 0, "freed inode {ino} still linked");
                self.files.remove(ino);
                self.nlink.remove(ino);
            }
            Traced::Attr { .. } | Traced::Pages { .. } => {}
        }
    }

    /// Unreferenced inodes are freed by the volume in the same transaction (no Freed
    /// event); referenced ones stay until the Freed event. The model keeps the data
    /// until then either way: nobody can name an unlinked inode but its holder.
    fn drop_link(&mut self, ino: u64) {
        let n = self.nlink.get_mut(&ino).unwrap();
        *n -= 1;
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.dirs.get(&parent).and_then(|d| d.get(name).copied())
    }

    fn read_hash(&self, ino: u64, off: u64, len: u64) -> Option<u64> {
        let f = self.files.get(&ino)?;
        let s = (off as usize).min(f.len());
        let e = ((off + len) as usize).min(f.len());
        Some(fnv(&f[s..e]))
    }
}

fn name(i: u64) -> Vec<u8> {
    format!("n{i}").into_bytes()
}

#[test]
fn threads_against_a_model_in_commit_order() {
    let trace: Arc<Mutex<Vec<Traced>>> = Arc::default();
    let t2 = trace.clone();
    let hook: TraceHook = Arc::new(move |t: &Traced| t2.lock().unwrap().push(t.clone()));
    let cfg = VolumeConfig {
        trace: Some(hook),
        batch_ops: 16,
        ..VolumeConfig::default()
    };
    let mkfs = mkfs_with(256, 64 << 10);
    let vol = memory_volume_with(64 << 20, &mkfs, cfg);
    let dirs = [
        vol.mkdir(&Cred::ROOT, ROOT_INO, b"d0", 0o755).unwrap().ino,
        vol.mkdir(&Cred::ROOT, ROOT_INO, b"d1", 0o755).unwrap().ino,
    ];
    let start = trace.lock().unwrap().len();
    let mut model0 = ModelFs::default();
    model0.dirs.insert(ROOT_INO, BTreeMap::new());
    for t in trace.lock().unwrap().iter() {
        model0.apply(t);
    }
    let seen: Arc<Mutex<Vec<(usize, usize, Seen)>>> = Arc::default();
    let began = Instant::now();
    let mut handles = Vec::new();
    for tid in 0..THREADS {
        let (vol, trace, seen) = (vol.clone(), trace.clone(), seen.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = zcfs_pmem::crash::Rng::new(0xc0c0 + tid);
            let mut done = 0u64;
            let pos = |t: &Mutex<Vec<Traced>>| t.lock().unwrap().len();
            for seq in 1..=OPS_PER_THREAD {
                if began.elapsed() > TIME_LIMIT {
                    break;
                }
                let d = dirs[rng.below(2)];
                let n = name(rng.below(NAMES as usize) as u64);
                let ino = vol.lookup(&Cred::ROOT, d, &n).ok().map(|a| a.ino);
                match rng.below(20) {
                    0..=2 => {
                        let _ = vol.create(&Cred::ROOT, d, &n, 0o644, 0);
                    }
                    3..=8 => {
                        if let Some(ino) = ino {
                            let off = rng.below(MAX_FILE as usize) as u64 & !7;
                            let len = (1 + rng.below(12000) as u64).min(MAX_FILE - off);
                            let _ =
                                vol.write(&Cred::ROOT, ino, off, &bytes(ino, tid, seq, off, len));
                        }
                    }
                    9 => {
                        if let Some(ino) = ino {
                            let _ =
                                vol.truncate(&Cred::ROOT, ino, rng.below(MAX_FILE as usize) as u64);
                        }
                    }
                    10..=11 => {
                        let d2 = dirs[rng.below(2)];
                        let n2 = name(rng.below(NAMES as usize) as u64);
                        let flags = match rng.below(6) {
                            0 => RenameFlags {
                                noreplace: true,
                                exchange: false,
                            },
                            1 => RenameFlags {
                                noreplace: false,
                                exchange: true,
                            },
                            _ => RenameFlags::default(),
                        };
                        let _ = vol.rename(&Cred::ROOT, d, &n, d2, &n2, flags);
                    }
                    12 => {
                        if let Some(ino) = ino {
                            let d2 = dirs[rng.below(2)];
                            let _ = vol.link(
                                &Cred::ROOT,
                                ino,
                                d2,
                                &name(rng.below(NAMES as usize) as u64),
                            );
                        }
                    }
                    13 => {
                        let _ = vol.unlink(&Cred::ROOT, d, &n);
                    }
                    14 => {
                        // Hold a reference across the unlink of the last name.
                        if let Some(ino) = ino {
                            if vol.open_handle(ino).is_ok() {
                                let _ = vol.unlink(&Cred::ROOT, d, &n);
                                let mut buf = vec![0u8; 64];
                                let _ = vol.read(ino, 0, &mut buf);
                                vol.release_handle(ino).unwrap();
                            }
                        }
                    }
                    15..=16 => {
                        let a = pos(&trace);
                        let found = vol.lookup(&Cred::ROOT, d, &n).ok().map(|a| a.ino);
                        let b = pos(&trace);
                        seen.lock().unwrap().push((
                            a,
                            b,
                            Seen::Lookup {
                                parent: d,
                                name: n.clone(),
                                found,
                            },
                        ));
                    }
                    17..=18 => {
                        if let Some(ino) = ino {
                            let off = rng.below(MAX_FILE as usize) as u64;
                            let len = 1 + rng.below(8192) as u64;
                            let mut buf = vec![0u8; len as usize];
                            let a = pos(&trace);
                            if let Ok(k) = vol.read(ino, off, &mut buf) {
                                let b = pos(&trace);
                                seen.lock().unwrap().push((
                                    a,
                                    b,
                                    Seen::Read {
                                        ino,
                                        off,
                                        len,
                                        hash: fnv(&buf[..k]),
                                    },
                                ));
                            }
                        }
                    }
                    _ => {
                        let _ = vol.checkpoint_now();
                    }
                }
                done += 1;
            }
            done
        }));
    }
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    vol.sync().unwrap();
    let trace = trace.lock().unwrap().clone();
    let seen = seen.lock().unwrap().clone();

    // Replay in commit order, checking each observation at the states it may have seen.
    let mut model = model0;
    let mut pending: Vec<(usize, usize, Seen, bool)> =
        seen.into_iter().map(|(a, b, s)| (a, b, s, false)).collect();
    let check = |model: &ModelFs, k: usize, pending: &mut Vec<(usize, usize, Seen, bool)>| {
        for (a, b, s, ok) in pending.iter_mut() {
            if *ok || k < *a || k > *b {
                continue;
            }
            *ok = match s {
                Seen::Lookup {
                    parent,
                    name,
                    found,
                } => model.lookup(*parent, name) == *found,
                Seen::Read {
                    ino,
                    off,
                    len,
                    hash,
                } => model.read_hash(*ino, *off, *len) == Some(*hash),
            };
        }
    };
    check(&model, start, &mut pending);
    for (k, t) in trace.iter().enumerate().skip(start) {
        model.apply(t);
        check(&model, k + 1, &mut pending);
    }
    let unmatched: Vec<_> = pending.iter().filter(|p| !p.3).collect();
    assert!(
        unmatched.is_empty(),
        "{} of {} observations match no state in their window, first: {:?}",
        unmatched.len(),
        pending.len(),
        unmatched.first()
    );

    // Final state: every name, every byte.
    let check_final = |v: &Volume| {
        for &d in &dirs {
            let mut names = BTreeMap::new();
            v.readdir(d, 0, |e| {
                names.insert(e.name, e.ino);
                true
            })
            .unwrap();
            assert_eq!(names, model.dirs[&d], "directory {d}");
            for &ino in names.values() {
                let want = &model.files[&ino];
                let a = v.getattr(ino).unwrap();
                assert_eq!(a.size, want.len() as u64, "size of {ino}");
                assert_eq!(a.nlink, model.nlink[&ino], "links of {ino}");
                let mut got = vec![0u8; want.len()];
                v.read(ino, 0, &mut got).unwrap();
                assert!(got == *want, "content of inode {ino}");
            }
        }
        assert_fsck_clean(v);
    };
    check_final(&vol);
    let img = image_of(&vol);
    vol.abandon();
    let again = Volume::open_region(Region::from_image(&img), VolumeConfig::default()).unwrap();
    check_final(&again);
    println!(
        "concurrency: {THREADS} threads, {total} operations, {} committed in the trace, {} observations checked, in {:?}",
        trace.len() - start,
        pending.len(),
        began.elapsed()
    );
    assert!(trace.len() - start > 1000, "too little happened");
}
