//! Who sent a FUSE request. The kernel sends uid, gid and the thread id, not the
//! supplementary groups; they are read from /proc/<tid>/status (as libfuse's
//! `fuse_req_getgroups` does) and kept for a moment, since one process makes many
//! requests in a row and its groups rarely change.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zcfs_backend::{Cred, Ctx};

/// How long the groups of a (thread, uid, gid) are reused before being read again.
pub const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Most callers remembered; past this the memory starts over.
pub const GROUPS_CACHE_MAX: usize = 4096;
/// Most supplementary groups taken from a caller (Linux allows 65536; NFS sends 16).
pub const MAX_GROUPS: usize = 1024;

/// A caller as the request header names it: thread id, uid, gid.
type CallerKey = (u32, u32, u32);

pub struct Callers {
    /// The kernel checked permissions already (mounted with default_permissions).
    kernel_checked: bool,
    /// Groups of recent callers, with when they were read.
    cache: Mutex<HashMap<CallerKey, (Vec<u32>, Instant)>>,
}

impl Callers {
    pub fn new(kernel_checked: bool) -> Callers {
        Callers {
            kernel_checked,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The caller of a request with these header fields.
    pub fn ctx(&self, uid: u32, gid: u32, pid: u32) -> Ctx {
        let groups = if pid == 0 {
            Vec::new() // the kernel's own request (writeback): no process to ask
        } else {
            self.groups(uid, gid, pid)
        };
        Ctx {
            cred: Cred {
                uid,
                gid,
                groups,
                checked: self.kernel_checked,
                umask: 0,
            },
            pid,
        }
    }

    fn groups(&self, uid: u32, gid: u32, pid: u32) -> Vec<u32> {
        let key = (pid, uid, gid);
        let now = Instant::now();
        {
            let c = self.cache.lock().expect("groups cache poisoned");
            if let Some((g, at)) = c.get(&key) {
                if now.duration_since(*at) < GROUPS_TTL {
                    return g.clone();
                }
            }
        }
        // A process that is gone, or whose status cannot be read, has no groups we
        // could vouch for: it acts with uid and gid alone.
        let g = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map(|s| parse_groups(&s))
            .unwrap_or_default();
        let mut c = self.cache.lock().expect("groups cache poisoned");
        if c.len() >= GROUPS_CACHE_MAX {
            c.clear();
        }
        c.insert(key, (g.clone(), now));
        g
    }
}

/// The `Groups:` line of /proc/<pid>/status.
pub fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .take(MAX_GROUPS)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_from_status() {
        let s = "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 1000 \nVmPeak:\t1\n";
        assert_eq!(parse_groups(s), vec![4, 24, 27, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
        let many = format!("Groups:\t{}\n", "7 ".repeat(MAX_GROUPS + 5));
        assert_eq!(parse_groups(&many).len(), MAX_GROUPS);
    }

    #[test]
    fn our_own_groups_are_found_and_remembered() {
        let me = std::process::id();
        let want = parse_groups(&std::fs::read_to_string("/proc/self/status").unwrap());
        let c = Callers::new(false);
        let ctx = c.ctx(5, 6, me);
        assert_eq!((ctx.cred.uid, ctx.cred.gid, ctx.cred.groups), (5, 6, want));
        assert!(!ctx.cred.checked);
        assert_eq!(c.cache.lock().unwrap().len(), 1);
        assert!(Callers::new(true).ctx(5, 6, 0).cred.checked);
        assert!(Callers::new(true).ctx(5, 6, 0).cred.groups.is_empty());
    }

    #[test]
    fn the_cache_is_bounded() {
        let c = Callers::new(false);
        for i in 0..GROUPS_CACHE_MAX as u32 + 10 {
            c.groups(i, 0, u32::MAX - 1); // no such process: no groups
        }
        assert!(c.cache.lock().unwrap().len() <= GROUPS_CACHE_MAX);
    }
}
