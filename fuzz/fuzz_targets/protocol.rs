#![no_main]
//! The wire decoder on arbitrary bytes: request and reply headers and bodies, and the
//! handshake messages. Every input must give a value or an error, never a panic; an
//! error in a body (under a valid header) must never be a framing error, and a
//! decoded request must encode back to the same bytes.
use zcfs_protocol::handshake::{Hello, Welcome, HELLO_LEN, WELCOME_LEN};
use zcfs_protocol::*;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() >= REQ_HDR {
        let h: [u8; REQ_HDR] = data[..REQ_HDR].try_into().unwrap();
        if let Ok(h) = ReqHeader::decode(&h) {
            let body = &data[REQ_HDR..];
            let body = &body[..body.len().min(h.body_len as usize)];
            let mut h = h;
            h.body_len = body.len() as u32;
            match Request::decode(&h, body) {
                Ok(r) => {
                    let (_, again) = r.encode(h.id, h.cred());
                    assert_eq!(again, body, "re-encoding changed the body");
                }
                Err(e) => assert!(!e.is_framing(), "body error reported as framing: {e}"),
            }
        }
    }
    if data.len() >= RESP_HDR {
        let h: [u8; RESP_HDR] = data[..RESP_HDR].try_into().unwrap();
        if let Ok(h) = RespHeader::decode(&h) {
            let body = &data[RESP_HDR..];
            let body = &body[..body.len().min(h.body_len as usize)];
            if let Err(e) = Reply::decode(h.op, body) {
                assert!(!e.is_framing(), "body error reported as framing: {e}");
            }
        }
        for &op in ALL_OPS {
            let _ = Reply::decode(op, &data[RESP_HDR..]);
        }
    }
    if data.len() >= WELCOME_LEN {
        let _ = Welcome::decode(data[..WELCOME_LEN].try_into().unwrap());
    }
    if data.len() >= HELLO_LEN {
        let _ = Hello::decode(data[..HELLO_LEN].try_into().unwrap());
    }
});
