//! The authenticated channel (version 5): once a handshake with a secret is done, every
//! message in each direction carries a MAC, so a peer on the path can neither inject,
//! change, replay, drop nor reorder a message without the receiver noticing.
//!
//! - **Keys**: one per direction, derived with BLAKE3 `derive_key` from the secret and
//!   the handshake transcript (the Hello and Welcome bytes, which hold both nonces, the
//!   version, the features and the auth flag). A changed transcript (a downgrade) gives
//!   other keys, and the proofs already cover it (`handshake`).
//! - **Tag**: keyed BLAKE3 over (sequence number, header, body), truncated to
//!   [`TAG_LEN`] bytes, sent right after the body. The sequence number is implicit: it
//!   counts the messages of one direction of one connection from 0, so a replayed,
//!   dropped or reordered message fails the check of the next one.
//! - **Payload** (`Integrity::Full` only): a second tag after the bulk data, the same
//!   hash continued over the data (so it covers header, body and data). In the default
//!   mode (`Integrity::Headers`) the bulk data is not MACed: it moves between PM and the
//!   socket without being touched.
//!
//! ```text
//! header (32) | body | tag (16) | data | data tag (16, Full mode and data only)
//! ```
//!
//! Without a secret there are no keys and no tags (the channel is `None`).

use crate::handshake::{HELLO_LEN, WELCOME_LEN};

/// Bytes of a message tag (and of a data tag).
pub const TAG_LEN: usize = 16;

const C2S_CONTEXT: &str = "zcfs 2025 protocol v5 client-to-server message MAC key";
const S2C_CONTEXT: &str = "zcfs 2025 protocol v5 server-to-client message MAC key";

/// What the MACs cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Integrity {
    /// Headers and bodies (the default): bulk data is not MACed (zero-copy kept).
    #[default]
    Headers,
    /// Headers, bodies and bulk data (a keyed BLAKE3 pass over every payload).
    Full,
}

impl std::str::FromStr for Integrity {
    type Err = String;
    fn from_str(s: &str) -> Result<Integrity, String> {
        match s {
            "headers" => Ok(Integrity::Headers),
            "full" => Ok(Integrity::Full),
            other => Err(format!("integrity mode {other:?}: use headers or full")),
        }
    }
}

impl std::fmt::Display for Integrity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Integrity::Headers => "headers",
            Integrity::Full => "full",
        })
    }
}

/// A connection's keys, one per direction.
#[derive(Clone)]
pub struct Keys {
    pub client_to_server: [u8; 32],
    pub server_to_client: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(..)")
    }
}

/// Derive a connection's keys from the secret and the handshake transcript (the Hello
/// and the Welcome exactly as they were on the wire).
pub fn derive_keys(secret: &[u8], hello: &[u8; HELLO_LEN], welcome: &[u8; WELCOME_LEN]) -> Keys {
    let mut material = Vec::with_capacity(8 + secret.len() + HELLO_LEN + WELCOME_LEN);
    material.extend_from_slice(&(secret.len() as u64).to_le_bytes());
    material.extend_from_slice(secret);
    material.extend_from_slice(hello);
    material.extend_from_slice(welcome);
    let keys = Keys {
        client_to_server: blake3::derive_key(C2S_CONTEXT, &material),
        server_to_client: blake3::derive_key(S2C_CONTEXT, &material),
    };
    // The secret was copied in: do not leave it in freed memory.
    material.iter_mut().for_each(|b| *b = 0);
    std::hint::black_box(&material);
    keys
}

/// The MAC of one direction of a connection: its key, the integrity mode, and the
/// sequence number of the next message.
#[derive(Clone)]
pub struct Mac {
    key: [u8; 32],
    integrity: Integrity,
    seq: u64,
}

impl std::fmt::Debug for Mac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mac")
            .field("integrity", &self.integrity)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// The MAC of one message in progress: `tag` after header and body, then (Full mode)
/// `data` over the bulk data and `data_tag`.
pub struct MessageMac {
    hasher: blake3::Hasher,
    full: bool,
}

/// Constant-time comparison of two tags.
pub fn tags_equal(a: &[u8; TAG_LEN], b: &[u8; TAG_LEN]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn truncate(h: blake3::Hash) -> [u8; TAG_LEN] {
    h.as_bytes()[..TAG_LEN].try_into().expect("TAG_LEN <= 32")
}

impl Mac {
    pub fn new(key: [u8; 32], integrity: Integrity) -> Mac {
        Mac {
            key,
            integrity,
            seq: 0,
        }
    }

    /// The sender's and the receiver's MAC of a connection: (client's, server's) view.
    pub fn pair(keys: &Keys, integrity: Integrity, client: bool) -> (Mac, Mac) {
        let (tx, rx) = if client {
            (keys.client_to_server, keys.server_to_client)
        } else {
            (keys.server_to_client, keys.client_to_server)
        };
        (Mac::new(tx, integrity), Mac::new(rx, integrity))
    }

    pub fn integrity(&self) -> Integrity {
        self.integrity
    }

    /// Whether a message with `data_len` bytes of bulk data carries a data tag.
    pub fn data_tagged(&self, data_len: usize) -> bool {
        self.integrity == Integrity::Full && data_len > 0
    }

    /// Start the MAC of the next message (taking its sequence number) over its header
    /// and body.
    pub fn begin(&mut self, header: &[u8], body: &[u8]) -> MessageMac {
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        hasher.update(&self.seq.to_le_bytes());
        hasher.update(header);
        hasher.update(body);
        self.seq = self.seq.wrapping_add(1);
        MessageMac {
            hasher,
            full: self.integrity == Integrity::Full,
        }
    }

    /// The sequence number the next message will get.
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl MessageMac {
    /// The tag over sequence number, header and body.
    pub fn tag(&self) -> [u8; TAG_LEN] {
        truncate(self.hasher.finalize())
    }

    pub fn verify(&self, tag: &[u8; TAG_LEN]) -> Result<(), MacError> {
        self.check(tag, MacError::Message)
    }

    /// Hash a piece of bulk data (Full mode; a no-op otherwise).
    pub fn data(&mut self, d: &[u8]) {
        if self.full {
            self.hasher.update(d);
        }
    }

    /// The tag over header, body and the data hashed so far.
    pub fn data_tag(&self) -> [u8; TAG_LEN] {
        self.tag()
    }

    pub fn verify_data(&self, tag: &[u8; TAG_LEN]) -> Result<(), MacError> {
        self.check(tag, MacError::Data)
    }

    /// `tag` is the one computed here, or the error `mismatch`.
    fn check(&self, tag: &[u8; TAG_LEN], mismatch: MacError) -> Result<(), MacError> {
        if tags_equal(&self.tag(), tag) {
            Ok(())
        } else {
            Err(mismatch)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("message MAC mismatch (changed, injected, replayed, dropped or reordered message)")]
    Message,
    #[error("payload MAC mismatch (bulk data changed on the way)")]
    Data,
}

/// Decode and verify one authenticated request from bytes, as a server does (used by
/// the fuzz target and its smoke test): a request comes out only with a good tag.
pub fn open_request(
    mac: &mut Mac,
    bytes: &[u8],
) -> Result<(crate::ReqHeader, crate::Request), OpenError> {
    use crate::{ReqHeader, Request, REQ_HDR};
    let hb: &[u8; REQ_HDR] = bytes
        .get(..REQ_HDR)
        .and_then(|b| b.try_into().ok())
        .ok_or(OpenError::Short)?;
    let h = ReqHeader::decode(hb)?;
    let rest = &bytes[REQ_HDR..];
    let body = rest.get(..h.body_len as usize).ok_or(OpenError::Short)?;
    let tag: &[u8; TAG_LEN] = rest
        .get(h.body_len as usize..h.body_len as usize + TAG_LEN)
        .and_then(|t| t.try_into().ok())
        .ok_or(OpenError::Short)?;
    let mut m = mac.begin(hb, body);
    m.verify(tag)?;
    let data_at = h.body_len as usize + TAG_LEN;
    let data = rest
        .get(data_at..data_at + h.data_len as usize)
        .ok_or(OpenError::Short)?;
    if mac.data_tagged(data.len()) {
        m.data(data);
        let dt: &[u8; TAG_LEN] = rest
            .get(data_at + data.len()..data_at + data.len() + TAG_LEN)
            .and_then(|t| t.try_into().ok())
            .ok_or(OpenError::Short)?;
        m.verify_data(dt)?;
    }
    let req = Request::decode(&h, body)?;
    Ok((h, req))
}

/// Encode one authenticated request (the inverse of [`open_request`]).
pub fn seal_request(
    mac: &mut Mac,
    req: &crate::Request,
    id: u64,
    cred: crate::Cred,
    data: &[u8],
) -> Vec<u8> {
    let (h, body) = req.encode(id, cred);
    let mut m = mac.begin(&h, &body);
    let mut out = Vec::with_capacity(h.len() + body.len() + 2 * TAG_LEN + data.len());
    out.extend_from_slice(&h);
    out.extend_from_slice(&body);
    out.extend_from_slice(&m.tag());
    out.extend_from_slice(data);
    if mac.data_tagged(data.len()) {
        m.data(data);
        out.extend_from_slice(&m.data_tag());
    }
    out
}

/// The fuzzing entry point (cargo-fuzz target `channel` and the stable smoke test):
/// arbitrary bytes through the handshake decoders, the proof checks and the
/// authenticated framing. Never panics; a forged message never opens; a sealed one
/// always does.
pub fn exercise(data: &[u8]) {
    use crate::handshake::{Hello, Transcript, Verdict, Welcome};
    let (hello, welcome) = (
        data.get(..HELLO_LEN)
            .map(|b| <[u8; HELLO_LEN]>::try_from(b).unwrap()),
        data.get(..WELCOME_LEN)
            .map(|b| <[u8; WELCOME_LEN]>::try_from(b).unwrap()),
    );
    if let Some(h) = &hello {
        let _ = Hello::decode(h);
    }
    if let Some(w) = &welcome {
        let _ = Welcome::decode(w);
    }
    if let Some(v) = data.get(..crate::handshake::VERDICT_LEN) {
        let _ = Verdict::decode(v.try_into().unwrap());
    }
    let hb = hello.unwrap_or([0; HELLO_LEN]);
    let wb = welcome.unwrap_or([0; WELCOME_LEN]);
    let transcript = Transcript::new(b"k", &hb, &wb);
    let _ = transcript.verify_server();
    let _ = transcript.verify_client(&[0; 32]);
    let keys = derive_keys(b"k", &hb, &wb);
    for integrity in [Integrity::Headers, Integrity::Full] {
        // Arbitrary bytes as an authenticated request: never opens (a tag cannot be
        // guessed), never panics.
        let (_, mut rx) = Mac::pair(&keys, integrity, false);
        assert!(
            open_request(&mut rx, data).is_err(),
            "forged message opened"
        );
        // A sealed request opens, and opens once.
        if let Ok((h, req)) = crate::ReqHeader::decode(&{
            let mut b = [0u8; crate::REQ_HDR];
            let n = data.len().min(crate::REQ_HDR);
            b[..n].copy_from_slice(&data[..n]);
            b
        })
        .map_err(|_| ())
        .and_then(|h| {
            let body = data.get(crate::REQ_HDR..).unwrap_or(&[]);
            let body = &body[..body.len().min(h.body_len as usize)];
            let mut h = h;
            h.body_len = body.len() as u32;
            crate::Request::decode(&h, body)
                .map(|r| (h, r))
                .map_err(|_| ())
        }) {
            let payload = vec![0x5a; h.data_len.min(1 << 16) as usize];
            if payload.len() == h.data_len as usize {
                let (mut tx, _) = Mac::pair(&keys, integrity, true);
                let (_, mut rx) = Mac::pair(&keys, integrity, false);
                let m = seal_request(&mut tx, &req, h.id, h.cred(), &payload);
                let (h2, r2) = open_request(&mut rx, &m).expect("a sealed request opens");
                assert_eq!((h2.id, r2), (h.id, req));
                assert!(open_request(&mut rx, &m).is_err(), "opened twice");
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("message shorter than its header says")]
    Short,
    #[error("{0}")]
    Proto(#[from] crate::ProtoError),
    #[error("{0}")]
    Mac(#[from] MacError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cred, NodeRef, PingReq, Request, WriteReq};

    fn keys() -> Keys {
        derive_keys(b"secret", &[1; HELLO_LEN], &[2; WELCOME_LEN])
    }

    fn write(data_len: u32) -> Request {
        WriteReq {
            node: NodeRef::ino(5),
            fh: 0,
            offset: 0,
            size: data_len,
            commit: false,
        }
        .into()
    }

    #[test]
    fn keys_depend_on_secret_transcript_and_direction() {
        let k = keys();
        assert_ne!(k.client_to_server, k.server_to_client);
        let other = derive_keys(b"secret", &[1; HELLO_LEN], &{
            let mut w = [2; WELCOME_LEN];
            w[16] ^= 1; // a changed feature bit: a downgrade
            w
        });
        assert_ne!(k.client_to_server, other.client_to_server);
        let other = derive_keys(b"secreT", &[1; HELLO_LEN], &[2; WELCOME_LEN]);
        assert_ne!(k.client_to_server, other.client_to_server);
    }

    #[test]
    fn sealed_messages_open_in_order_only() {
        let k = keys();
        for integrity in [Integrity::Headers, Integrity::Full] {
            let (mut tx, _) = Mac::pair(&k, integrity, true);
            let (_, mut rx) = Mac::pair(&k, integrity, false);
            let a = seal_request(&mut tx, &PingReq {}.into(), 1, Cred::default(), &[]);
            let b = seal_request(&mut tx, &write(4), 2, Cred::default(), b"abcd");
            // Replayed, reordered, dropped: each fails at the receiver's sequence number.
            let mut r = rx.clone();
            assert!(open_request(&mut r, &b).is_err(), "reordered / dropped");
            let mut r = rx.clone();
            assert!(open_request(&mut r, &a).is_ok());
            assert!(open_request(&mut r, &a).is_err(), "replayed");
            assert_eq!(open_request(&mut rx, &a).unwrap().0.id, 1);
            assert_eq!(open_request(&mut rx, &b).unwrap().0.id, 2);
            // Any flipped bit of header, body or tag is caught.
            let (mut tx, _) = Mac::pair(&k, integrity, true);
            let b = seal_request(&mut tx, &write(4), 2, Cred::default(), b"abcd");
            let body_len = write(4).encode(2, Cred::default()).1.len();
            let data_at = 32 + body_len + TAG_LEN;
            for i in 0..b.len() {
                let (_, mut rx) = Mac::pair(&k, integrity, false);
                let mut bad = b.clone();
                bad[i] ^= 0x10;
                let in_data = (data_at..data_at + 4).contains(&i);
                let r = open_request(&mut rx, &bad);
                if in_data && integrity == Integrity::Headers {
                    assert!(r.is_ok(), "headers mode leaves the payload alone");
                } else {
                    assert!(r.is_err(), "byte {i} flipped was accepted ({integrity})");
                }
            }
            // A server's message does not open as a client's (direction keys).
            let (mut stx, _) = Mac::pair(&k, integrity, false);
            let (_, mut srx) = Mac::pair(&k, integrity, false);
            let m = seal_request(&mut stx, &PingReq {}.into(), 1, Cred::default(), &[]);
            assert_eq!(
                open_request(&mut srx, &m).unwrap_err(),
                OpenError::Mac(MacError::Message)
            );
        }
    }

    #[test]
    fn tags_compare_in_full() {
        let a = [7u8; TAG_LEN];
        let mut b = a;
        assert!(tags_equal(&a, &b));
        b[TAG_LEN - 1] ^= 1;
        assert!(!tags_equal(&a, &b));
    }

    /// The fuzz target's entry point on random and mutated inputs (a stable-toolchain
    /// smoke run; `cargo fuzz run channel` runs it for longer).
    #[test]
    fn fuzz_smoke_handshake_and_authenticated_framing() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(10);
        let k = keys();
        let (mut tx, _) = Mac::pair(&k, Integrity::Full, true);
        let seeds: Vec<Vec<u8>> = vec![
            seal_request(&mut tx, &PingReq {}.into(), 1, Cred::default(), &[]),
            seal_request(&mut tx, &write(4), 2, Cred::default(), b"abcd"),
            {
                let (h, b) = Request::from(PingReq {}).encode(3, Cred::default());
                [&h[..], &b[..]].concat()
            },
            vec![0; 200],
        ];
        for i in 0..20_000 {
            let mut d = seeds[i % seeds.len()].clone();
            for _ in 0..rng.gen_range(0..4) {
                if d.is_empty() {
                    break;
                }
                let at = rng.gen_range(0..d.len());
                d[at] = rng.gen();
            }
            if rng.gen_bool(0.2) {
                d.truncate(rng.gen_range(0..=d.len()));
            }
            exercise(&d);
        }
    }

    #[test]
    fn integrity_parses() {
        assert_eq!("full".parse::<Integrity>().unwrap(), Integrity::Full);
        assert_eq!("headers".parse::<Integrity>().unwrap(), Integrity::Headers);
        assert!("none".parse::<Integrity>().is_err());
    }
}
