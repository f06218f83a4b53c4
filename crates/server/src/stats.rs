//! Counters of a running server (atomics: never a lock on the request path) and the
//! report `zcfs stat HOST:PORT` and `zcfs serve` print.

use crate::session::{SessionCounts, Sessions};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;
use zcfs_backend::Backend;
use zcfs_protocol::{Op, ALL_OPS, OP_SLOTS};

#[derive(Debug, Default)]
struct OpStats {
    count: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
    max_nanos: AtomicU64,
}

/// Counters of a running server.
#[derive(Debug)]
pub struct ServerStats {
    ops: [OpStats; OP_SLOTS],
    pub connections: AtomicU64,
    pub active: AtomicUsize,
    /// Connections dropped because a header broke framing.
    pub rejected_malformed: AtomicU64,
    /// Well-framed requests whose body was invalid: answered with an errno.
    pub rejected_invalid: AtomicU64,
    /// Requests naming an identity their peer may not act as (answered EPERM).
    pub rejected_identity: AtomicU64,
    pub rejected_auth: AtomicU64,
    pub rejected_limit: AtomicU64,
    /// Connections refused because too many (from everywhere, or from the peer's
    /// address) were still in the handshake.
    pub rejected_handshake_limit: AtomicU64,
    /// Connections in the handshake now (part of `active`).
    pub handshaking: AtomicUsize,
    /// Connections dropped because the peer stalled past the peer timeout (or did not
    /// finish the handshake within its deadline).
    pub dropped_stalled: AtomicU64,
    /// Connections dropped because a message's MAC did not check out (changed,
    /// injected, replayed, dropped or reordered on the way).
    pub rejected_forged: AtomicU64,
    /// Connections closed after the idle timeout.
    pub dropped_idle: AtomicU64,
    /// Resent requests answered from a session's reply cache (not executed again).
    pub replies_replayed: AtomicU64,
    /// Requests that panicked (answered with EIO; their connection dropped).
    pub panics: AtomicU64,
    /// Connections that joined a session the server still had.
    pub sessions_resumed: AtomicU64,
    /// Sessions released after their grace period (or at shutdown).
    pub sessions_expired: AtomicU64,
    /// Handles and references given back to the backend for expired sessions.
    pub expired_handles: AtomicU64,
    pub expired_references: AtomicU64,
    /// Payload bytes copied in user space by the server itself (one-copy mode).
    pub user_copy_bytes: AtomicU64,
}

impl Default for ServerStats {
    fn default() -> Self {
        ServerStats {
            ops: std::array::from_fn(|_| OpStats::default()),
            connections: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            rejected_malformed: AtomicU64::new(0),
            rejected_invalid: AtomicU64::new(0),
            rejected_identity: AtomicU64::new(0),
            rejected_auth: AtomicU64::new(0),
            rejected_limit: AtomicU64::new(0),
            rejected_handshake_limit: AtomicU64::new(0),
            handshaking: AtomicUsize::new(0),
            dropped_stalled: AtomicU64::new(0),
            rejected_forged: AtomicU64::new(0),
            dropped_idle: AtomicU64::new(0),
            replies_replayed: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            sessions_resumed: AtomicU64::new(0),
            sessions_expired: AtomicU64::new(0),
            expired_handles: AtomicU64::new(0),
            expired_references: AtomicU64::new(0),
            user_copy_bytes: AtomicU64::new(0),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct OpReport {
    pub count: u64,
    pub errors: u64,
    pub bytes: u64,
    pub mean_us: f64,
    pub max_us: f64,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StatsReport {
    pub ops: std::collections::BTreeMap<String, OpReport>,
    pub connections_total: u64,
    pub connections_active: usize,
    pub rejected_malformed: u64,
    #[serde(default)]
    pub rejected_invalid: u64,
    #[serde(default)]
    pub rejected_identity: u64,
    pub rejected_auth: u64,
    pub rejected_limit: u64,
    #[serde(default)]
    pub rejected_handshake_limit: u64,
    /// Connections still in the handshake (counted in `connections_active` too).
    #[serde(default)]
    pub connections_handshaking: usize,
    #[serde(default)]
    pub dropped_stalled: u64,
    #[serde(default)]
    pub rejected_forged: u64,
    #[serde(default)]
    pub dropped_idle: u64,
    #[serde(default)]
    pub replies_replayed: u64,
    #[serde(default)]
    pub requests_panicked: u64,
    #[serde(default)]
    pub sessions_active: usize,
    #[serde(default)]
    pub sessions_in_grace: usize,
    #[serde(default)]
    pub sessions_resumed: u64,
    #[serde(default)]
    pub sessions_expired: u64,
    /// Handles open in all sessions now.
    #[serde(default)]
    pub handles_open: u64,
    /// Inode references held for all sessions now.
    #[serde(default)]
    pub references_held: u64,
    /// Replies kept in the sessions' reply caches now, and their bytes.
    #[serde(default)]
    pub replies_cached: u64,
    #[serde(default)]
    pub reply_cache_bytes: u64,
    #[serde(default)]
    pub expired_handles: u64,
    #[serde(default)]
    pub expired_references: u64,
    pub payload_bytes_read: u64,
    pub payload_bytes_written: u64,
    /// Bytes copied in user space on the server per payload byte (backend + server).
    pub user_copies_per_payload_byte: f64,
    pub backend_user_copy_bytes: u64,
    pub server_user_copy_bytes: u64,
}

impl ServerStats {
    pub(crate) fn record(&self, op: Op, ok: bool, bytes: u64, t: Instant) {
        let s = &self.ops[op as usize];
        let ns = t.elapsed().as_nanos() as u64;
        s.count.fetch_add(1, Ordering::Relaxed);
        if !ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.bytes.fetch_add(bytes, Ordering::Relaxed);
        s.nanos.fetch_add(ns, Ordering::Relaxed);
        s.max_nanos.fetch_max(ns, Ordering::Relaxed);
    }

    pub(crate) fn report(&self, backend: &dyn Backend, sessions: &Sessions) -> StatsReport {
        let mut ops = std::collections::BTreeMap::new();
        for &op in ALL_OPS {
            let s = &self.ops[op as usize];
            let count = s.count.load(Ordering::Relaxed);
            if count == 0 {
                continue;
            }
            ops.insert(
                op.name().to_string(),
                OpReport {
                    count,
                    errors: s.errors.load(Ordering::Relaxed),
                    bytes: s.bytes.load(Ordering::Relaxed),
                    mean_us: s.nanos.load(Ordering::Relaxed) as f64 / count as f64 / 1e3,
                    max_us: s.max_nanos.load(Ordering::Relaxed) as f64 / 1e3,
                },
            );
        }
        let bytes = |op: Op| self.ops[op as usize].bytes.load(Ordering::Relaxed);
        let (r, w) = (bytes(Op::Read), bytes(Op::Write));
        let cs = backend.copy_stats();
        let server_copies = self.user_copy_bytes.load(Ordering::Relaxed);
        // In one-copy mode the backend's own copy is the server's buffer-to-PM copy.
        let total = cs.user_copy_bytes.max(server_copies);
        let SessionCounts {
            active,
            in_grace,
            handles,
            references,
            replies_cached,
            reply_cache_bytes,
        } = sessions.counts();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatsReport {
            ops,
            connections_total: load(&self.connections),
            connections_active: self.active.load(Ordering::Relaxed),
            rejected_malformed: load(&self.rejected_malformed),
            rejected_invalid: load(&self.rejected_invalid),
            rejected_identity: load(&self.rejected_identity),
            rejected_auth: load(&self.rejected_auth),
            rejected_limit: load(&self.rejected_limit),
            rejected_handshake_limit: load(&self.rejected_handshake_limit),
            connections_handshaking: self.handshaking.load(Ordering::Relaxed),
            dropped_stalled: load(&self.dropped_stalled),
            rejected_forged: load(&self.rejected_forged),
            dropped_idle: load(&self.dropped_idle),
            replies_replayed: load(&self.replies_replayed),
            requests_panicked: load(&self.panics),
            sessions_active: active,
            sessions_in_grace: in_grace,
            sessions_resumed: load(&self.sessions_resumed),
            sessions_expired: load(&self.sessions_expired),
            handles_open: handles,
            references_held: references,
            replies_cached,
            reply_cache_bytes,
            expired_handles: load(&self.expired_handles),
            expired_references: load(&self.expired_references),
            payload_bytes_read: r,
            payload_bytes_written: w,
            user_copies_per_payload_byte: if r + w == 0 {
                0.0
            } else {
                total as f64 / (r + w) as f64
            },
            backend_user_copy_bytes: cs.user_copy_bytes,
            server_user_copy_bytes: server_copies,
        }
    }
}
