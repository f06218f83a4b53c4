//! The references of a readdirplus listing, held until each entry is handed out.

use super::RemoteFs;
use crate::lock;
use zcfs_backend::DirEntry;
use zcfs_protocol::ForgetItem;

/// The server references of the entries of one readdirplus reply that have not been
/// passed to the caller yet. Whatever is left when it is dropped (the caller stopped
/// early, or its callback panicked) goes back to the server.
pub(super) struct Listing<'a> {
    pub(super) fs: &'a RemoteFs,
    /// The session epoch they were counted in (None: not counted, the session was
    /// already gone when the reply was taken in).
    pub(super) epoch: Option<u64>,
    pub(super) inos: Vec<u64>,
    pub(super) next: usize,
    /// The invalidations when the readdir went out (its attributes are judged by it).
    pub(super) token: u64,
}

impl Listing<'_> {
    /// Entry `ino` (the next one) goes to the caller: its server reference is the
    /// caller's now, in the same step as the caller's own.
    pub(super) fn hand_out(&mut self, e: &DirEntry) {
        debug_assert_eq!(self.inos.get(self.next), Some(&e.ino));
        self.next += 1;
        let mut m = lock(&self.fs.meta);
        if self.epoch != Some(m.epoch) {
            // The session is gone (and its references with it): the caller's only.
            if let Some(a) = &e.attr {
                self.fs.remember_locked_since(&mut m, a, self.token);
            }
            m.nodes.entry(e.ino).or_default().caller_refs += 1;
            return;
        }
        let node = m.nodes.entry(e.ino).or_default();
        node.listing = node.listing.saturating_sub(1);
        node.caller_refs += 1;
    }
}

impl Drop for Listing<'_> {
    fn drop(&mut self) {
        let mut give: Vec<ForgetItem> = Vec::new();
        let epoch = {
            let mut m = lock(&self.fs.meta);
            if self.epoch != Some(m.epoch) {
                return;
            }
            for &ino in &self.inos[self.next..] {
                let Some(node) = m.nodes.get_mut(&ino) else {
                    continue;
                };
                node.listing = node.listing.saturating_sub(1);
                let n = if node.caller_refs == 0 {
                    m.settle(ino)
                } else if node.server_refs - node.listing > 1 {
                    // The caller's references keep one of the server's; this one
                    // is not needed for them.
                    node.server_refs -= 1;
                    1
                } else {
                    0
                };
                match give.iter_mut().find(|i| i.ino == ino) {
                    Some(i) => i.count += n,
                    None if n > 0 => give.push(ForgetItem { ino, count: n }),
                    None => {}
                }
            }
            m.epoch
        };
        self.fs.send_forgets(give, epoch);
    }
}
