//! Connection handshake: version and feature negotiation, then (when the server has a
//! secret) mutual challenge-response with HMAC-SHA256. The secret never crosses the
//! wire; each side proves it knows it over both nonces.
//!
//! ```text
//! client -> Hello    { magic "ZCFSHELO", version, lane, features, client nonce,
//!                      session id }                                               64 B
//! server -> Welcome  { magic "ZCFSWELC", version, features, auth, resumed,
//!                      server nonce, server proof, max in-flight, max data,
//!                      server instance, session serial }                         112 B
//! client -> Proof    { client proof }                                             32 B  (auth only)
//! server -> Verdict  { status: 0 ok, else errno; resumed; session serial }       16 B  (auth only)
//!           + tag    (accepted only: the first server-to-client message MAC)        16 B
//!
//! server proof = HMAC(secret, "zcfs-server" | Hello | Welcome with a zero proof)
//! client proof = HMAC(secret, "zcfs-client" | Hello | Welcome)
//! ```
//!
//! The proofs cover the whole transcript (both nonces, versions, features, the auth
//! flag, the limits): a peer on the path that changes any of it (say, clears the
//! full-integrity feature bit) makes the proofs fail. After the Verdict, every message
//! carries a MAC under keys derived from the secret and the same transcript
//! (`channel`). A client that has a secret refuses a Welcome without auth: a server
//! that does not prove it knows the secret is never sent a request.
//!
//! With a secret, nothing about sessions is said before the peer has proved itself:
//! the Welcome's `resumed` and session serial are 0 and the Verdict carries them.
//!
//! The session serial names the server's session object (a new one each time the
//! session is started in this server process, never 0): `resumed` alone cannot tell a
//! client that the session it knew ended and was started again by a connection attempt
//! whose answer the client never heard (it gave up on it), since the next connection
//! finds that new session and is told `resumed`.

use crate::{ProtoError, Result, VERSION};
use hmac::{Hmac, Mac};
use sha2::Sha256;

pub const HELLO_LEN: usize = 64;
pub const WELCOME_LEN: usize = 112;
pub const PROOF_LEN: usize = 32;
pub const VERDICT_LEN: usize = 16;
const HELLO_MAGIC: &[u8; 8] = b"ZCFSHELO";
const WELCOME_MAGIC: &[u8; 8] = b"ZCFSWELC";

/// Feature bit: MAC the bulk data too (`--integrity full`). In a Hello: the client
/// requires it; in a Welcome: the connection uses it (only with auth).
pub const FEATURE_INTEGRITY_FULL: u64 = 1;
/// Every feature bit this version knows (others are ignored in a Hello and refused in
/// a Welcome).
pub const FEATURES: u64 = FEATURE_INTEGRITY_FULL;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
    pub features: u64,
    pub nonce: [u8; 32],
    /// Random per client (never 0): the connections of one client share a session on
    /// the server (its handles and references), which outlives a lost connection by
    /// the server's grace period.
    pub session: u64,
    /// Which of the client's connections this is, and its incarnation.
    pub lane: Lane,
}

/// One of a client's connections (its index) and how many times the client has dialled
/// it (its generation, from 1). A connection that takes over a lane fences the
/// session's older connection on it: the server closes that one and waits for the
/// request it is executing, before answering the new Hello. So a request the client
/// gave up on (its reply timed out; the bytes still in a kernel queue on a cut link) is
/// never executed after a request the client sends on the new connection. Generation 0:
/// no lane, nothing fenced (a client that keeps one connection, or a test).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Lane {
    pub index: u16,
    pub generation: u32,
}

impl Lane {
    pub const NONE: Lane = Lane {
        index: 0,
        generation: 0,
    };
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Welcome {
    pub version: u16,
    pub features: u64,
    pub auth: bool,
    /// The server still had the Hello's session: its handles and references are intact.
    /// Always false when `auth` is set (the Verdict says it, after the proof).
    pub resumed: bool,
    pub nonce: [u8; 32],
    pub proof: [u8; 32],
    pub max_inflight: u32,
    pub max_data: u32,
    /// Random per server process: a change tells a client the server restarted.
    pub instance: u64,
    /// The session's serial (see the module's comment); 0 when `auth` is set (the
    /// Verdict says it, after the proof).
    pub session_serial: u64,
}

/// Write a Hello's or Welcome's start: its magic and version.
fn put_start(b: &mut [u8], magic: &[u8], version: u16) {
    b[0..8].copy_from_slice(magic);
    b[8..10].copy_from_slice(&version.to_le_bytes());
}

/// Check a Hello's or Welcome's magic (`what` names it) and version; the version.
fn check_start(b: &[u8], magic: &[u8], what: &'static str) -> Result<u16> {
    if &b[0..8] != magic {
        return Err(ProtoError::Invalid(what));
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != VERSION as u16 {
        return Err(ProtoError::BadVersion(version));
    }
    Ok(version)
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        put_start(&mut b, HELLO_MAGIC, self.version);
        b[10..12].copy_from_slice(&self.lane.index.to_le_bytes());
        b[12..16].copy_from_slice(&self.lane.generation.to_le_bytes());
        b[16..24].copy_from_slice(&self.features.to_le_bytes());
        b[24..56].copy_from_slice(&self.nonce);
        b[56..64].copy_from_slice(&self.session.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello> {
        let version = check_start(b, HELLO_MAGIC, "hello magic")?;
        let session = u64::from_le_bytes(b[56..64].try_into().unwrap());
        if session == 0 {
            return Err(ProtoError::Invalid("session id 0"));
        }
        Ok(Hello {
            version,
            features: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            nonce: b[24..56].try_into().unwrap(),
            session,
            lane: Lane {
                index: u16::from_le_bytes([b[10], b[11]]),
                generation: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            },
        })
    }
}

impl Welcome {
    pub fn encode(&self) -> [u8; WELCOME_LEN] {
        let mut b = [0u8; WELCOME_LEN];
        put_start(&mut b, WELCOME_MAGIC, self.version);
        b[10] = self.auth as u8;
        b[11] = self.resumed as u8;
        b[16..24].copy_from_slice(&self.features.to_le_bytes());
        b[24..56].copy_from_slice(&self.nonce);
        b[56..88].copy_from_slice(&self.proof);
        b[88..92].copy_from_slice(&self.max_inflight.to_le_bytes());
        b[92..96].copy_from_slice(&self.max_data.to_le_bytes());
        b[96..104].copy_from_slice(&self.instance.to_le_bytes());
        b[104..112].copy_from_slice(&self.session_serial.to_le_bytes());
        b
    }
    pub fn decode(b: &[u8; WELCOME_LEN]) -> Result<Welcome> {
        let version = check_start(b, WELCOME_MAGIC, "welcome magic")?;
        if b[10] > 1 || b[11] > 1 {
            return Err(ProtoError::Invalid("auth or resumed flag"));
        }
        if b[12..16] != [0; 4] {
            // One encoding per Welcome (review 32b): without a secret nothing else
            // would notice bytes changed here on the way.
            return Err(ProtoError::Invalid("welcome reserved bytes"));
        }
        if b[10] == 1 && b[11] == 1 {
            // Told only after the peer's proof, in the Verdict.
            return Err(ProtoError::Invalid("resumed before authentication"));
        }
        let w = Welcome {
            version,
            features: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            auth: b[10] == 1,
            resumed: b[11] == 1,
            nonce: b[24..56].try_into().unwrap(),
            proof: b[56..88].try_into().unwrap(),
            max_inflight: u32::from_le_bytes(b[88..92].try_into().unwrap()),
            max_data: u32::from_le_bytes(b[92..96].try_into().unwrap()),
            instance: u64::from_le_bytes(b[96..104].try_into().unwrap()),
            session_serial: u64::from_le_bytes(b[104..112].try_into().unwrap()),
        };
        if w.auth != (w.session_serial == 0) {
            return Err(ProtoError::Invalid(
                "session serial (0 exactly when authentication follows)",
            ));
        }
        if w.max_inflight == 0 || w.max_data < 4096 {
            return Err(ProtoError::Invalid("welcome limits"));
        }
        if w.features & !FEATURES != 0 {
            return Err(ProtoError::Invalid("welcome feature bits"));
        }
        if w.features & FEATURE_INTEGRITY_FULL != 0 && !w.auth {
            return Err(ProtoError::Invalid("full integrity without authentication"));
        }
        Ok(w)
    }
}

/// The server's answer to the client's proof: accepted (status 0, whether the session
/// was resumed, and its serial) or refused (an errno).
///
/// ```text
/// status u32 @0 (0, or an errno 1..=4095), resumed u8 @4 (0 or 1; 0 when refused),
/// reserved @5..8 (0), session serial u64 @8 (not 0 when accepted; 0 when refused)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub status: i32,
    pub resumed: bool,
    pub session_serial: u64,
}

impl Verdict {
    pub fn accepted(resumed: bool, session_serial: u64) -> Verdict {
        Verdict {
            status: 0,
            resumed,
            session_serial,
        }
    }

    pub fn refused(errno: i32) -> Verdict {
        Verdict {
            status: errno,
            resumed: false,
            session_serial: 0,
        }
    }

    pub fn encode(&self) -> [u8; VERDICT_LEN] {
        let mut b = [0u8; VERDICT_LEN];
        b[0..4].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[4] = self.resumed as u8;
        b[8..16].copy_from_slice(&self.session_serial.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; VERDICT_LEN]) -> Result<Verdict> {
        let status = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if status > crate::MAX_ERRNO as u32 {
            return Err(ProtoError::Invalid("verdict status"));
        }
        if b[4] > 1 || (status != 0 && b[4] != 0) || b[5..8].iter().any(|&x| x != 0) {
            return Err(ProtoError::Invalid("verdict flags"));
        }
        let session_serial = u64::from_le_bytes(b[8..16].try_into().unwrap());
        if (status == 0) != (session_serial != 0) {
            return Err(ProtoError::Invalid(
                "verdict session serial (set exactly when accepted)",
            ));
        }
        Ok(Verdict {
            status: status as i32,
            resumed: b[4] == 1,
            session_serial,
        })
    }
}

type HmacSha256 = Hmac<Sha256>;

fn mac(
    secret: &[u8],
    role: &[u8],
    hello: &[u8; HELLO_LEN],
    welcome: &[u8; WELCOME_LEN],
) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(secret).expect("HMAC accepts any key length");
    m.update(role);
    m.update(hello);
    m.update(welcome);
    m
}

/// A Welcome's bytes as the server proof covers them: the proof field zeroed.
fn unproved(welcome: &[u8; WELCOME_LEN]) -> [u8; WELCOME_LEN] {
    let mut w = *welcome;
    w[56..88].fill(0);
    w
}

/// What the proofs cover: the shared secret and the transcript, the Hello and the
/// Welcome (as sent or received; the server's proof ignores the Welcome's proof field).
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    pub secret: &'a [u8],
    pub hello: &'a [u8; HELLO_LEN],
    pub welcome: &'a [u8; WELCOME_LEN],
}

impl<'a> Transcript<'a> {
    pub fn new(
        secret: &'a [u8],
        hello: &'a [u8; HELLO_LEN],
        welcome: &'a [u8; WELCOME_LEN],
    ) -> Transcript<'a> {
        Transcript {
            secret,
            hello,
            welcome,
        }
    }

    fn server_mac(&self) -> HmacSha256 {
        mac(
            self.secret,
            b"zcfs-server",
            self.hello,
            &unproved(self.welcome),
        )
    }

    fn client_mac(&self) -> HmacSha256 {
        mac(self.secret, b"zcfs-client", self.hello, self.welcome)
    }

    /// The server's proof, which the Welcome carries.
    pub fn server_proof(&self) -> [u8; 32] {
        self.server_mac().finalize().into_bytes().into()
    }

    /// The client's proof, sent after the Welcome.
    pub fn client_proof(&self) -> [u8; 32] {
        self.client_mac().finalize().into_bytes().into()
    }

    /// Constant-time check of the server's proof (in the Welcome).
    pub fn verify_server(&self) -> Result<()> {
        self.server_mac()
            .verify_slice(&self.welcome[56..88])
            .map_err(|_| ProtoError::AuthFailed)
    }

    /// Constant-time check of the client's proof.
    pub fn verify_client(&self, proof: &[u8; 32]) -> Result<()> {
        self.client_mac()
            .verify_slice(proof)
            .map_err(|_| ProtoError::AuthFailed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_only_with_the_same_secret_roles_and_transcript() {
        let hello = [1u8; HELLO_LEN];
        let mut welcome = [2u8; WELCOME_LEN];
        let sp = Transcript::new(b"secret", &hello, &welcome).server_proof();
        welcome[56..88].copy_from_slice(&sp);
        let t = Transcript::new(b"secret", &hello, &welcome);
        assert!(t.verify_server().is_ok());
        assert!(Transcript::new(b"other", &hello, &welcome)
            .verify_server()
            .is_err());
        // A server proof replayed as a client proof fails (roles differ).
        assert!(t.verify_client(&sp).is_err());
        let cp = t.client_proof();
        assert!(t.verify_client(&cp).is_ok());
        // Any byte of the transcript changed (a nonce, a feature bit, the auth flag):
        // both proofs fail.
        for i in
            (0..HELLO_LEN + WELCOME_LEN).filter(|i| !(HELLO_LEN + 56..HELLO_LEN + 88).contains(i))
        {
            let (mut h, mut w) = (hello, welcome);
            if i < HELLO_LEN {
                h[i] ^= 1;
            } else {
                w[i - HELLO_LEN] ^= 1;
            }
            let t = Transcript::new(b"secret", &h, &w);
            assert!(t.verify_server().is_err(), "byte {i}");
            assert!(t.verify_client(&cp).is_err(), "byte {i}");
        }
    }

    #[test]
    fn hello_and_welcome_round_trip() {
        let h = Hello {
            version: VERSION as u16,
            features: 5,
            nonce: [9; 32],
            session: u64::MAX - 3,
            lane: Lane {
                index: u16::MAX,
                generation: u32::MAX - 1,
            },
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let no_session = Hello { session: 0, ..h };
        assert!(Hello::decode(&no_session.encode()).is_err());
        let w = Welcome {
            version: VERSION as u16,
            features: 0,
            auth: false,
            resumed: true,
            nonce: [1; 32],
            proof: [2; 32],
            max_inflight: 64,
            max_data: 1 << 24,
            instance: 7,
            session_serial: u64::MAX,
        };
        assert_eq!(Welcome::decode(&w.encode()).unwrap(), w);
        let authenticating = Welcome {
            auth: true,
            resumed: false,
            session_serial: 0,
            ..w.clone()
        };
        assert_eq!(
            Welcome::decode(&authenticating.encode()).unwrap(),
            authenticating
        );
        let mut bad = w.encode();
        bad[8] = 99;
        assert!(Welcome::decode(&bad).is_err());
        let mut bad = w.encode();
        bad[11] = 2;
        assert!(Welcome::decode(&bad).is_err());
        // The serial: set exactly when no authentication follows.
        let no_serial = Welcome {
            session_serial: 0,
            ..w.clone()
        };
        assert!(Welcome::decode(&no_serial.encode()).is_err());
        let early_serial = Welcome {
            session_serial: 1,
            ..authenticating.clone()
        };
        assert!(Welcome::decode(&early_serial.encode()).is_err());
        // (why, features, auth, resumed): each refused.
        let refused = [
            ("unknown feature", 1 << 40, false, true),
            (
                "full integrity needs auth",
                FEATURE_INTEGRITY_FULL,
                false,
                true,
            ),
            ("with auth, resumed waits for the verdict", 0, true, true),
        ];
        for (why, features, auth, resumed) in refused {
            let bad = Welcome {
                features,
                auth,
                resumed,
                session_serial: if auth { 0 } else { w.session_serial },
                ..w.clone()
            };
            assert!(Welcome::decode(&bad.encode()).is_err(), "{why}");
        }
    }

    #[test]
    fn verdicts_round_trip_and_have_one_encoding() {
        for v in [
            Verdict::accepted(false, 1),
            Verdict::accepted(true, u64::MAX),
            Verdict::refused(libc::EACCES),
            Verdict::refused(crate::MAX_ERRNO),
        ] {
            assert_eq!(Verdict::decode(&v.encode()).unwrap(), v);
        }
        // A refusal reads as the errno in a u64, as version 2 sent it.
        let refusal = Verdict::refused(libc::EACCES).encode();
        assert_eq!(
            u64::from_le_bytes(refusal[..8].try_into().unwrap()),
            libc::EACCES as u64
        );
        assert_eq!(refusal[8..], [0; 8]);
        let mut b = Verdict::refused(libc::EACCES).encode();
        b[4] = 1;
        assert!(Verdict::decode(&b).is_err(), "refused and resumed");
        let mut b = Verdict::accepted(true, 3).encode();
        b[7] = 1;
        assert!(Verdict::decode(&b).is_err(), "reserved bytes");
        let mut b = Verdict::accepted(true, 3).encode();
        b[8..16].fill(0);
        assert!(Verdict::decode(&b).is_err(), "accepted without a serial");
        let mut b = Verdict::refused(libc::EACCES).encode();
        b[8] = 1;
        assert!(Verdict::decode(&b).is_err(), "refused with a serial");
        let mut b = Verdict::accepted(false, 1).encode();
        b[4] = 2;
        assert!(Verdict::decode(&b).is_err());
        b = [0xff; VERDICT_LEN];
        b[4..].fill(0);
        assert!(Verdict::decode(&b).is_err(), "status over MAX_ERRNO");
    }
}
