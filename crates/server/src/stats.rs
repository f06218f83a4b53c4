//! Counters of a running server (atomics: never a lock on the request path) and the
//! report `zcfs stat HOST:PORT` and `zcfs serve` print; each operation's latencies in a
//! histogram (zcfs-metrics), also shown in the Prometheus text format.

use crate::session::{SessionCounts, Sessions};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;
use zcfs_backend::Backend;
pub use zcfs_metrics::{BucketCount, OpReport};
use zcfs_metrics::{Exposition, OpSnapshot, OpTable};
use zcfs_protocol::{Op, ALL_OPS, OP_SLOTS};

/// Counters of a running server.
#[derive(Debug)]
pub struct ServerStats {
    /// Per operation: latency histogram (its count is the operation's), errors, bytes.
    ops: OpTable,
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
    /// Unlinked inodes whose references the server gave back for a session past its
    /// bound on orphans held by reference alone (`Session::orphaned`).
    pub orphans_given_back: AtomicU64,
    /// Replies waiting off their connection's thread now (for the lane's fence, or a
    /// resend for its first attempt; at most `MAX_WAITING_REPLIES` per connection).
    pub replies_waiting: AtomicUsize,
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
    /// Write payload bytes that came in with their request's header (one recv takes a
    /// header, its body and what follows, up to `RECV_BUF_SIZE`) and were copied out of
    /// the receive buffer, instead of received straight into place.
    pub recv_buffer_payload_bytes: AtomicU64,
    /// Replies held back while the next request was already here, and the sends that
    /// carried them (`conn::Out::reply_as`): replies per send is their ratio.
    pub replies_held: AtomicU64,
    pub held_reply_sends: AtomicU64,
    /// Requests that arrived on a TCP connection, per operation code (the lane's are
    /// counted by the lane).
    pub tcp_requests: [AtomicU64; OP_SLOTS],
}

impl Default for ServerStats {
    fn default() -> Self {
        ServerStats {
            ops: OpTable::new(OP_SLOTS),
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
            orphans_given_back: AtomicU64::new(0),
            replies_waiting: AtomicUsize::new(0),
            panics: AtomicU64::new(0),
            sessions_resumed: AtomicU64::new(0),
            sessions_expired: AtomicU64::new(0),
            expired_handles: AtomicU64::new(0),
            expired_references: AtomicU64::new(0),
            user_copy_bytes: AtomicU64::new(0),
            recv_buffer_payload_bytes: AtomicU64::new(0),
            replies_held: AtomicU64::new(0),
            held_reply_sends: AtomicU64::new(0),
            tcp_requests: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
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
    /// Unlinked inodes given back for a session past its orphan bound.
    #[serde(default)]
    pub orphans_given_back: u64,
    /// Replies waiting off their connection's thread now.
    #[serde(default)]
    pub replies_waiting: usize,
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
    /// Write payload bytes copied out of the receive buffer (counted in the copies per
    /// payload byte above).
    #[serde(default)]
    pub recv_buffer_payload_bytes: u64,
    /// Replies held back while the next request was already here, and the sends that
    /// carried them.
    #[serde(default)]
    pub replies_held: u64,
    #[serde(default)]
    pub held_reply_sends: u64,
    /// The layer-2 lane (a server started with one): state and requests per path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub l2: Option<zcfs_metrics::LaneReport>,
}

impl ServerStats {
    pub(crate) fn record(&self, op: Op, ok: bool, bytes: u64, t: Instant) {
        let ns = t.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.ops.op(op as usize).record(ns, ok, bytes);
    }

    /// The operations that ran, by name.
    fn ran(&self) -> Vec<(&'static str, OpSnapshot)> {
        self.ops
            .ran(ALL_OPS.iter().map(|&op| (op as usize, op.name())))
    }

    pub(crate) fn report(&self, backend: &dyn Backend, sessions: &Sessions) -> StatsReport {
        let ran = self.ran();
        let ops = ran
            .iter()
            .map(|(name, s)| (name.to_string(), OpReport::from(s)))
            .collect();
        let bytes = |op: Op| self.ops.op(op as usize).snapshot().bytes;
        let (r, w) = (bytes(Op::Read), bytes(Op::Write));
        let cs = backend.copy_stats();
        let server_copies = self.user_copy_bytes.load(Ordering::Relaxed);
        // In one-copy mode the backend's own copy is the server's buffer-to-PM copy; a
        // payload's bytes that came with its header are copied once more, out of the
        // receive buffer.
        let buffered = self.recv_buffer_payload_bytes.load(Ordering::Relaxed);
        let total = cs.user_copy_bytes.max(server_copies) + buffered;
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
            orphans_given_back: load(&self.orphans_given_back),
            replies_waiting: self.replies_waiting.load(Ordering::Relaxed),
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
            recv_buffer_payload_bytes: buffered,
            replies_held: load(&self.replies_held),
            held_reply_sends: load(&self.held_reply_sends),
            l2: None,
        }
    }
}

impl ServerStats {
    /// The counters and per-operation histograms in the Prometheus text format
    /// (`zcfs_server_*`).
    pub(crate) fn prometheus(&self, backend: &dyn Backend, sessions: &Sessions) -> String {
        let r = self.report(backend, sessions);
        let mut e = Exposition::new();
        let counters: [(&str, &str, u64); 20] = [
            (
                "connections_total",
                "Connections accepted.",
                r.connections_total,
            ),
            (
                "rejected_malformed_total",
                "Connections dropped because a header broke framing.",
                r.rejected_malformed,
            ),
            (
                "rejected_invalid_total",
                "Well-framed requests with an invalid body (answered with an errno).",
                r.rejected_invalid,
            ),
            (
                "rejected_identity_total",
                "Requests naming an identity their peer may not act as (EPERM).",
                r.rejected_identity,
            ),
            (
                "rejected_auth_total",
                "Connections that failed authentication.",
                r.rejected_auth,
            ),
            (
                "rejected_limit_total",
                "Connections refused over the connection limits.",
                r.rejected_limit,
            ),
            (
                "rejected_handshake_limit_total",
                "Connections refused over the handshake limits.",
                r.rejected_handshake_limit,
            ),
            (
                "rejected_forged_total",
                "Connections dropped because a message's MAC did not check out.",
                r.rejected_forged,
            ),
            (
                "dropped_stalled_total",
                "Connections dropped because the peer stalled.",
                r.dropped_stalled,
            ),
            (
                "dropped_idle_total",
                "Connections closed after the idle timeout.",
                r.dropped_idle,
            ),
            (
                "replies_replayed_total",
                "Resent requests answered from a reply cache.",
                r.replies_replayed,
            ),
            (
                "orphans_given_back_total",
                "Unlinked inodes given back for a session past its bound on orphans held by reference.",
                r.orphans_given_back,
            ),
            (
                "requests_panicked_total",
                "Requests that panicked (answered EIO).",
                r.requests_panicked,
            ),
            (
                "sessions_resumed_total",
                "Connections that joined a session the server still had.",
                r.sessions_resumed,
            ),
            (
                "sessions_expired_total",
                "Sessions released after their grace period.",
                r.sessions_expired,
            ),
            (
                "payload_read_bytes_total",
                "Payload bytes read by clients.",
                r.payload_bytes_read,
            ),
            (
                "payload_written_bytes_total",
                "Payload bytes written by clients.",
                r.payload_bytes_written,
            ),
            (
                "user_copy_bytes_total",
                "Bytes copied in user space by the backend and the server.",
                r.backend_user_copy_bytes.max(r.server_user_copy_bytes)
                    + r.recv_buffer_payload_bytes,
            ),
            (
                "replies_held_total",
                "Replies held back while the next request was already here.",
                r.replies_held,
            ),
            (
                "held_reply_sends_total",
                "Sends that carried held-back replies.",
                r.held_reply_sends,
            ),
        ];
        for (name, help, v) in counters {
            e.counter(&format!("zcfs_server_{name}"), help, v);
        }
        let gauges: [(&str, &str, u64); 8] = [
            (
                "connections_active",
                "Connections open now (handshaking ones included).",
                r.connections_active as u64,
            ),
            (
                "replies_waiting",
                "Replies waiting off their connection's thread now (the lane's fence, resends).",
                r.replies_waiting as u64,
            ),
            (
                "connections_handshaking",
                "Connections in the handshake now.",
                r.connections_handshaking as u64,
            ),
            (
                "sessions_active",
                "Sessions with a connection now.",
                r.sessions_active as u64,
            ),
            (
                "sessions_in_grace",
                "Sessions without a connection, kept for their grace period.",
                r.sessions_in_grace as u64,
            ),
            (
                "handles_open",
                "Handles open in all sessions now.",
                r.handles_open,
            ),
            (
                "references_held",
                "Inode references held for all sessions now.",
                r.references_held,
            ),
            (
                "reply_cache_bytes",
                "Bytes of the replies kept in the reply caches now.",
                r.reply_cache_bytes,
            ),
        ];
        for (name, help, v) in gauges {
            e.gauge(&format!("zcfs_server_{name}"), help, v);
        }
        e.ops("zcfs_server", &self.ran(), true);
        e.finish()
    }
}
