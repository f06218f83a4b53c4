//! A TCP relay between a client and a server that can hold back or cut what the server
//! sends on a connection, counted in the server's chunks (each read from its socket:
//! with the handshake and small replies, one message each). For tests of what a client
//! does when a message comes late or never.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

/// What the relay does to one connection, at the server's chunk `at` (from 0).
#[derive(Clone, Copy, Debug)]
pub enum Plan {
    /// Forward it after this long, then go on.
    Delay { at: u64, by: Duration },
    /// Forward it, then cut the connection both ways.
    CutAfter { at: u64 },
    /// Never forward it (it ran on the server; its answer is lost), and cut.
    Swallow { at: u64 },
    /// Forward each of them this long after it came (a long link).
    DelayEach { by: Duration },
    /// Close the connection as soon as it is accepted (before the Welcome).
    Close,
}

impl Plan {
    /// Whether the plan acts on the server's chunk `chunk`.
    fn acts_at(&self, chunk: u64) -> bool {
        match *self {
            Plan::Delay { at, .. } | Plan::CutAfter { at } | Plan::Swallow { at } => at == chunk,
            Plan::DelayEach { .. } => true,
            Plan::Close => false,
        }
    }
}

/// A relay listening on `bind` (an address of the namespace it runs in, port 0) to
/// `upstream`; each connection accepted asks `plan` what to do to it (None: relay as
/// is). Returns the address to dial. Runs until the test process ends.
pub fn relay(
    bind: &str,
    upstream: String,
    mut plan: impl FnMut() -> Option<Plan> + Send + 'static,
) -> String {
    let l = TcpListener::bind(bind).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(u) = TcpStream::connect(&upstream) else {
                continue;
            };
            let _ = c.set_nodelay(true);
            let _ = u.set_nodelay(true);
            let plan = plan();
            if let Some(Plan::Close) = plan {
                let _ = c.shutdown(Shutdown::Both);
                continue;
            }
            let ends = [c.try_clone().unwrap(), u.try_clone().unwrap()];
            let pumps = [
                (c.try_clone().unwrap(), u.try_clone().unwrap(), None),
                (u, c, plan),
            ];
            for (mut from, mut to, plan) in pumps {
                let ends = [ends[0].try_clone().unwrap(), ends[1].try_clone().unwrap()];
                let cut = move || ends.iter().for_each(|e| drop(e.shutdown(Shutdown::Both)));
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 16];
                    for chunk in 0u64.. {
                        let n = match from.read(&mut buf) {
                            Ok(0) | Err(_) => {
                                let _ = to.shutdown(Shutdown::Write);
                                return;
                            }
                            Ok(n) => n,
                        };
                        let now = plan.filter(|p| p.acts_at(chunk));
                        match now {
                            Some(Plan::Swallow { .. }) => {
                                std::thread::sleep(Duration::from_millis(50));
                                return cut();
                            }
                            Some(Plan::Delay { by, .. } | Plan::DelayEach { by }) => {
                                std::thread::sleep(by)
                            }
                            _ => {}
                        }
                        if to.write_all(&buf[..n]).is_err() {
                            let _ = from.shutdown(Shutdown::Both);
                            return;
                        }
                        if let Some(Plan::CutAfter { .. }) = now {
                            return cut();
                        }
                    }
                });
            }
        }
    });
    addr
}
