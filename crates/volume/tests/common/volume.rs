//! The same path-level steps applied to a real volume, and its canonical dump.

use super::*;
use std::collections::{BTreeMap, HashMap};
use zcfs_volume::Attr;

/// Dump the volume the same way.
pub fn dump_volume(vol: &Volume) -> Result<Vec<String>, FsError> {
    let mut out = Vec::new();
    let mut first: HashMap<u64, String> = HashMap::new();
    dump_vdir(vol, ROOT_INO, "", &mut out, &mut first)?;
    Ok(out)
}

fn dump_vdir(
    vol: &Volume,
    d: u64,
    prefix: &str,
    out: &mut Vec<String>,
    first: &mut HashMap<u64, String>,
) -> Result<(), FsError> {
    let a = vol.getattr(d)?;
    let x = xattrs_of(vol, d)?;
    out.push(line(prefix, "dir", mode_owner(&a), &[], &x, None));
    let mut entries = Vec::new();
    vol.readdir(d, 0, |e| {
        entries.push(e);
        true
    })?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let path = format!("{prefix}/{}", String::from_utf8_lossy(&e.name));
        if let Some(p) = first.get(&e.ino) {
            out.push(format!("{path} -> link of {p}"));
            continue;
        }
        first.insert(e.ino, path.clone());
        let a = vol.getattr(e.ino)?;
        let x = xattrs_of(vol, e.ino)?;
        match a.mode & S_IFMT {
            S_IFDIR => dump_vdir(vol, e.ino, &path, out, first)?,
            S_IFLNK => {
                let t = vol.readlink(e.ino)?;
                out.push(line(&path, "symlink", mode_owner(&a), &[], &x, Some(&t)));
            }
            _ => {
                let mut data = vec![0u8; a.size as usize];
                let n = vol.read(e.ino, 0, &mut data)?;
                assert_eq!(n, data.len(), "short read of {path}");
                out.push(line(&path, "file", mode_owner(&a), &data, &x, None));
            }
        }
    }
    Ok(())
}

fn mode_owner(a: &Attr) -> [u32; 4] {
    [a.mode, a.uid, a.gid, a.nlink]
}

fn xattrs_of(vol: &Volume, ino: u64) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, FsError> {
    let mut m = BTreeMap::new();
    for k in vol.listxattr(&Cred::ROOT, ino)? {
        let v = vol.getxattr(&Cred::ROOT, ino, &k)?;
        m.insert(k, v);
    }
    Ok(m)
}

fn vresolve_dir(vol: &Volume, parts: &[&str]) -> Result<u64, i32> {
    let mut cur = ROOT_INO;
    for p in parts {
        cur = vol
            .lookup(&Cred::ROOT, cur, p.as_bytes())
            .map_err(|e| e.errno())?
            .ino;
    }
    vol.dir_len(cur).map_err(|e| e.errno())?;
    Ok(cur)
}

fn vresolve(vol: &Volume, path: &str) -> Result<u64, i32> {
    let (dirs, name) = split(path);
    let d = vresolve_dir(vol, &dirs)?;
    Ok(vol
        .lookup(&Cred::ROOT, d, name.as_bytes())
        .map_err(|e| e.errno())?
        .ino)
}

/// A setattr as root on the inode at `path`, as `apply_volume` reports it.
fn root_setattr(vol: &Volume, path: &str, set: SetAttr) -> Result<(), i32> {
    vol.setattr(
        &Cred::ROOT,
        vresolve(vol, path)?,
        &set,
        SizeRight::Permission,
    )
    .map(|_| ())
    .map_err(|e| e.errno())
}

/// Apply a path-level operation to the volume; errors as errno.
pub fn apply_volume(vol: &Volume, op: &Step) -> Result<(), i32> {
    let e = |e: FsError| e.errno();
    match op {
        Step::Failing(inner, n) => {
            let plan = vol.config().faults.clone().expect("a fault plan");
            plan.fail_nth(Some(*n));
            let r = apply_volume(vol, inner);
            let hit = plan.seen() >= *n;
            plan.fail_nth(None);
            assert!(hit, "{inner:?} has fewer than {n} budget checks");
            assert!(r.is_err(), "{inner:?} with check {n} failing succeeded");
            r
        }
        Step::Create(p) | Step::Mkdir(p) | Step::Symlink(p, _) => {
            let (dirs, name) = split(p);
            let d = vresolve_dir(vol, &dirs)?;
            match op {
                Step::Create(_) => vol.create(&Cred::ROOT, d, name.as_bytes(), S_IFREG | 0o644, 0),
                Step::Mkdir(_) => vol.mkdir(&Cred::ROOT, d, name.as_bytes(), 0o755),
                Step::Symlink(_, t) => vol.symlink(&Cred::ROOT, d, name.as_bytes(), t.as_bytes()),
                _ => unreachable!(),
            }
            .map(|_| ())
            .map_err(e)
        }
        Step::Write(p, off, len, seed) => {
            let ino = vresolve(vol, p)?;
            vol.write(&Cred::ROOT, ino, *off, &pattern(*off, *len, *seed))
                .map(|_| ())
                .map_err(e)
        }
        Step::LandingWrite(p, off, len, seed) => {
            let ino = vresolve(vol, p)?;
            land(vol, ino, *off, &pattern(*off, *len, *seed))
                .map(|_| ())
                .map_err(e)
        }
        Step::LandingAbort(p, off, len, seed) => {
            let ino = vresolve(vol, p)?;
            let free = vol.statfs().bfree;
            let r = land_uncommitted(vol, ino, *off, &pattern(*off, *len, *seed)).map_err(e)?;
            let held: Vec<u64> = r
                .landing_extents()
                .iter()
                .flat_map(|x| {
                    let b = x.offset / zcfs_volume::BLOCK as u64;
                    b - 1..b + x.blocks as u64
                })
                .collect();
            drop(r);
            for b in held {
                assert!(
                    vol.test_door().block_is_free(b),
                    "block {b} kept by an abort"
                );
            }
            assert_eq!(vol.statfs().bfree, free, "an abort changed the free count");
            Ok(())
        }
        Step::Truncate(p, size) => vol
            .truncate(&Cred::ROOT, vresolve(vol, p)?, *size)
            .map_err(e),
        Step::PunchHole(p, off, len) => vol
            .pfree(&Cred::ROOT, vresolve(vol, p)?, *off, *len)
            .map_err(e),
        Step::Link(from, to) => {
            let ino = vresolve(vol, from)?;
            let (dirs, name) = split(to);
            let d = vresolve_dir(vol, &dirs)?;
            vol.link(&Cred::ROOT, ino, d, name.as_bytes())
                .map(|_| ())
                .map_err(e)
        }
        Step::Unlink(p) | Step::Rmdir(p) => {
            let (dirs, name) = split(p);
            let d = vresolve_dir(vol, &dirs)?;
            if matches!(op, Step::Unlink(_)) {
                vol.unlink(&Cred::ROOT, d, name.as_bytes())
                    .map(|_| ())
                    .map_err(e)
            } else {
                vol.rmdir(&Cred::ROOT, d, name.as_bytes())
                    .map(|_| ())
                    .map_err(e)
            }
        }
        Step::Rename(from, to, flags) => {
            let (d1s, n1) = split(from);
            let p1 = vresolve_dir(vol, &d1s)?;
            vol.lookup(&Cred::ROOT, p1, n1.as_bytes()).map_err(e)?;
            let (d2s, n2) = split(to);
            let p2 = vresolve_dir(vol, &d2s)?;
            vol.rename(
                &Cred::ROOT,
                p1,
                n1.as_bytes(),
                p2,
                n2.as_bytes(),
                RenameFlags::from_bits(*flags).map_err(e)?,
            )
            .map_err(e)
        }
        Step::Chmod(p, m) => root_setattr(
            vol,
            p,
            SetAttr {
                mode: Some(*m),
                ..Default::default()
            },
        ),
        Step::Chown(p, u, g) => root_setattr(
            vol,
            p,
            SetAttr {
                uid: Some(*u),
                gid: Some(*g),
                ..Default::default()
            },
        ),
        Step::SetXattr(p, k, v) => vol
            .setxattr(
                &Cred::ROOT,
                vresolve(vol, p)?,
                k.as_bytes(),
                v,
                XattrMode::Any,
            )
            .map_err(e),
        Step::RemoveXattr(p, k) => vol
            .removexattr(&Cred::ROOT, vresolve(vol, p)?, k.as_bytes())
            .map_err(e),
        Step::Fallocate(p, off, len, mode) => {
            let ino = vresolve(vol, p)?;
            let m = zcfs_volume::FallocMode::from_bits(*mode).map_err(e)?;
            vol.fallocate(&Cred::ROOT, ino, *off, *len, m).map_err(e)
        }
        Step::Fsync(p) => vol.fsync(vresolve(vol, p)?).map_err(e),
    }
}
