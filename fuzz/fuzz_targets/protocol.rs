#![no_main]
//! The wire decoder on arbitrary bytes: request and response headers and bodies, and
//! the handshake messages. Every input must give a value or an error, never a panic.
use zcfs_protocol::handshake::{Hello, Welcome, HELLO_LEN, WELCOME_LEN};
use zcfs_protocol::*;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if data.len() >= REQ_HDR {
        let h: [u8; REQ_HDR] = data[..REQ_HDR].try_into().unwrap();
        if let Ok(h) = ReqHeader::decode(&h) {
            let body = &data[REQ_HDR..];
            let _ = Request::decode(&h, &body[..body.len().min(h.body_len as usize)]);
        }
    }
    if data.len() >= RESP_HDR {
        let h: [u8; RESP_HDR] = data[..RESP_HDR].try_into().unwrap();
        if let Ok(h) = RespHeader::decode(&h) {
            let body = &data[RESP_HDR..];
            for op in ALL_OPS {
                let _ = Reply::decode(op, &h, &body[..body.len().min(h.body_len as usize)]);
            }
        }
    }
    if data.len() >= WELCOME_LEN {
        let _ = Welcome::decode(data[..WELCOME_LEN].try_into().unwrap());
    }
    if data.len() >= HELLO_LEN {
        let _ = Hello::decode(data[..HELLO_LEN].try_into().unwrap());
    }
});
