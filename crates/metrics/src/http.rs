//! A minimal HTTP/1.1 listener for Prometheus scrapers: one request per connection,
//! each connection answered on a thread of its own. `GET /metrics` gets the exposition,
//! any other path 404, any other method 405. A request is bounded in size
//! (`HTTP_MAX_REQUEST`) and in time (`HTTP_REQUEST_DEADLINE`, for the whole request and
//! for the answer), and at most `HTTP_MAX_CONNECTIONS` are open at once: a new one
//! ends the oldest when they are all taken. So silent or stalled clients never hold a
//! scrape back (a fresh scrape always gets a thread), nor touch the file system.

use crate::prometheus::CONTENT_TYPE;
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The path answered with the metrics.
pub const METRICS_PATH: &str = "/metrics";
/// The most bytes a request (line and headers) may have.
pub const HTTP_MAX_REQUEST: usize = 8 * 1024;
/// How long a scraper may take to send its request, and to take the answer.
pub const HTTP_REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// The most connections answered at once; the oldest is ended for a new one.
pub const HTTP_MAX_CONNECTIONS: usize = 8;

/// How long the listener waits after a failed accept.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The listener's bounds (the defaults are the constants above; tests shorten them).
#[derive(Debug, Clone, Copy)]
pub struct HttpConfig {
    pub max_request: usize,
    pub deadline: Duration,
    pub max_connections: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_request: HTTP_MAX_REQUEST,
            deadline: HTTP_REQUEST_DEADLINE,
            max_connections: HTTP_MAX_CONNECTIONS,
        }
    }
}

/// The connections being answered, oldest first: (number, a handle to end it).
type Open = Arc<Mutex<VecDeque<(u64, TcpStream)>>>;

fn lock_open(open: &Open) -> std::sync::MutexGuard<'_, VecDeque<(u64, TcpStream)>> {
    // A panic while holding it leaves a plain list: still usable.
    open.lock().unwrap_or_else(|e| e.into_inner())
}

type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running `/metrics` listener; `shutdown` (or dropping it) stops its thread.
pub struct MetricsHttp {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsHttp {
    /// Listen on `addr` (HOST:PORT; port 0 picks one) and answer scrapes with what
    /// `render` returns at that moment.
    pub fn bind(
        addr: &str,
        cfg: HttpConfig,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> io::Result<MetricsHttp> {
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
        let listener = TcpListener::bind(&addrs[..])?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let render: Render = Arc::new(render);
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("zcfs-metrics".into())
            .spawn(move || {
                let open: Open = Arc::new(Mutex::new(VecDeque::new()));
                let mut next = 0u64;
                for conn in listener.incoming() {
                    if stopping.load(Ordering::SeqCst) {
                        break;
                    }
                    // A failed exchange concerns that scraper alone. A failed accept
                    // (no descriptors left, say) is waited out a little rather than
                    // retried at once.
                    let c = match conn {
                        Ok(c) => c,
                        Err(_) => {
                            std::thread::sleep(ACCEPT_BACKOFF);
                            continue;
                        }
                    };
                    let Ok(handle) = c.try_clone() else { continue };
                    let id = next;
                    next += 1;
                    {
                        let mut o = lock_open(&open);
                        // Make room: end the oldest (its thread then fails its read or
                        // write at once and goes).
                        while o.len() >= cfg.max_connections.max(1) {
                            if let Some((_, old)) = o.pop_front() {
                                let _ = old.shutdown(std::net::Shutdown::Both);
                            }
                        }
                        o.push_back((id, handle));
                    }
                    let (render, held) = (render.clone(), open.clone());
                    let spawned = std::thread::Builder::new()
                        .name("zcfs-metrics-conn".into())
                        .spawn(move || {
                            let _ = answer(c, cfg, &*render);
                            lock_open(&held).retain(|(i, _)| *i != id);
                        });
                    if spawned.is_err() {
                        lock_open(&open).retain(|(i, _)| *i != id);
                    }
                }
            })?;
        Ok(MetricsHttp {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens (with the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop listening and wait for the thread (it ends after the scrape in progress,
    /// within the deadline).
    pub fn shutdown(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            // Wake the accept.
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
            let _ = t.join();
        }
    }
}

impl Drop for MetricsHttp {
    fn drop(&mut self) {
        self.shutdown()
    }
}

/// What a request asked for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics,
    NotFound,
    BadMethod,
    Malformed,
    TooLarge,
}

/// The request line of a complete request head.
fn parse(head: &[u8]) -> Asked {
    let Ok(text) = std::str::from_utf8(head) else {
        return Asked::Malformed;
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Asked::Malformed;
    };
    if !version.starts_with("HTTP/1.") {
        return Asked::Malformed;
    }
    if method != "GET" {
        return Asked::BadMethod;
    }
    let path = target.split('?').next().unwrap_or("");
    if path == METRICS_PATH {
        Asked::Metrics
    } else {
        Asked::NotFound
    }
}

/// The end of the request head (after the blank line), if it is all there.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|p| p + 4)
        .or_else(|| buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2))
}

/// Read one request within the deadline and size bound, and answer it.
fn answer(
    mut c: TcpStream,
    cfg: HttpConfig,
    render: &(dyn Fn() -> String + Send + Sync),
) -> io::Result<()> {
    let deadline = Instant::now() + cfg.deadline;
    let mut buf = vec![0u8; cfg.max_request];
    let mut len = 0;
    let asked = loop {
        if let Some(end) = head_end(&buf[..len]) {
            break parse(&buf[..end]);
        }
        if len == buf.len() {
            break Asked::TooLarge;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        c.set_read_timeout(Some(left))?;
        match c.read(&mut buf[len..])? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => len += n,
        }
    };
    let (status, body) = match asked {
        Asked::Metrics => ("200 OK", render()),
        Asked::NotFound => ("404 Not Found", format!("not found: try {METRICS_PATH}\n")),
        Asked::BadMethod => ("405 Method Not Allowed", "only GET\n".to_string()),
        Asked::Malformed => ("400 Bad Request", "malformed request\n".to_string()),
        Asked::TooLarge => (
            "431 Request Header Fields Too Large",
            format!("a request may have {} bytes at most\n", cfg.max_request),
        ),
    };
    let content_type = if asked == Asked::Metrics {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let allow = if asked == Asked::BadMethod {
        "Allow: GET\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let left = deadline.saturating_duration_since(Instant::now());
    c.set_write_timeout(Some(left.max(Duration::from_millis(1))))?;
    c.write_all(head.as_bytes())?;
    c.write_all(body.as_bytes())?;
    c.flush()?;
    // Closing with unread input (a request over the bound) would reset the connection
    // and could destroy the answer on its way: end our side, then read what is left
    // until the scraper closes, within the deadline and a bound.
    c.shutdown(std::net::Shutdown::Write)?;
    let mut drained = 0;
    while drained < DRAIN_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        c.set_read_timeout(Some(left))?;
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
    Ok(())
}

/// The most input read and dropped after an answer (see `answer`).
const DRAIN_MAX: usize = 8 * HTTP_MAX_REQUEST;

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(request).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    fn listener(cfg: HttpConfig) -> MetricsHttp {
        MetricsHttp::bind("127.0.0.1:0", cfg, || "x_total 1\n".to_string()).unwrap()
    }

    #[test]
    fn get_metrics_answers_the_exposition_and_other_paths_404() {
        let m = listener(HttpConfig::default());
        let ok = exchange(m.local_addr(), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{ok}"
        );
        assert!(ok.contains("Content-Length: 10\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nx_total 1\n"), "{ok}");
        let q = exchange(m.local_addr(), b"GET /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(q.starts_with("HTTP/1.1 200 OK\r\n"), "{q}");
        let nf = exchange(m.local_addr(), b"GET / HTTP/1.1\r\n\r\n");
        assert!(nf.starts_with("HTTP/1.1 404 Not Found\r\n"), "{nf}");
        let post = exchange(m.local_addr(), b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        let bad = exchange(m.local_addr(), b"hello\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
    }

    #[test]
    fn a_request_at_the_size_bound_is_answered_one_byte_more_is_refused() {
        let max = 256;
        let m = listener(HttpConfig {
            max_request: max,
            ..Default::default()
        });
        let make = |total: usize| {
            let start = b"GET /metrics HTTP/1.1\r\nX: ";
            let end = b"\r\n\r\n";
            let mut r = start.to_vec();
            r.resize(total - end.len(), b'a');
            r.extend_from_slice(end);
            r
        };
        let at = exchange(m.local_addr(), &make(max));
        assert!(at.starts_with("HTTP/1.1 200 OK\r\n"), "{at}");
        let over = exchange(m.local_addr(), &make(max + 1));
        assert!(over.starts_with("HTTP/1.1 431 "), "{over}");
    }

    #[test]
    fn a_stalled_scraper_is_dropped_and_the_next_one_answered() {
        let m = listener(HttpConfig {
            deadline: Duration::from_millis(200),
            ..Default::default()
        });
        // Half a request, then nothing: the listener gives up on it and closes.
        let mut stalled = TcpStream::connect(m.local_addr()).unwrap();
        stalled.write_all(b"GET /metr").unwrap();
        let mut rest = Vec::new();
        stalled.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "no answer to half a request");
        let ok = exchange(m.local_addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    }

    #[test]
    fn shutdown_stops_listening() {
        let mut m = listener(HttpConfig::default());
        let addr = m.local_addr();
        m.shutdown();
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn silent_connections_do_not_hold_back_a_scrape_beyond_one_deadline() {
        let deadline = Duration::from_millis(500);
        let m = listener(HttpConfig {
            deadline,
            ..Default::default()
        });
        // Eight connections that send nothing (each is only dropped at its deadline).
        let silent: Vec<TcpStream> = (0..8)
            .map(|_| TcpStream::connect(m.local_addr()).unwrap())
            .collect();
        let mut c = TcpStream::connect(m.local_addr()).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        // A fair listener answers within a deadline or two, not after eight.
        c.set_read_timeout(Some(3 * deadline)).unwrap();
        let mut out = String::new();
        let r = c.read_to_string(&mut out);
        drop(silent);
        assert!(r.is_ok(), "no answer within 3 deadlines: {r:?}");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    }
}

#[cfg(test)]
mod bound_tests {
    use super::*;

    /// Connections beyond the bound end the oldest; a scrape among many silent
    /// connections (far more than the bound) is still answered, and the number of
    /// connections held never exceeds the bound.
    #[test]
    fn a_scrape_is_answered_with_many_more_silent_connections_than_the_bound() {
        let deadline = Duration::from_secs(30);
        let m = MetricsHttp::bind(
            "127.0.0.1:0",
            HttpConfig {
                deadline,
                max_connections: 4,
                ..Default::default()
            },
            || "x_total 1\n".to_string(),
        )
        .unwrap();
        let mut silent: Vec<TcpStream> = (0..40)
            .map(|_| TcpStream::connect(m.local_addr()).unwrap())
            .collect();
        let mut c = TcpStream::connect(m.local_addr()).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        // Far below the 30 s deadline a silent connection would otherwise hold.
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = String::new();
        let r = c.read_to_string(&mut out);
        assert!(r.is_ok(), "no answer: {r:?}");
        assert!(out.ends_with("x_total 1\n"), "{out}");
        // The oldest silent connections were ended: at most 4 of the 40 are still held
        // (an ended one reads end of file at once).
        let mut held = 0;
        for s in &mut silent {
            s.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let mut b = [0u8; 1];
            if matches!(s.read(&mut b), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut)
            {
                held += 1;
            }
        }
        assert!(held <= 4, "{held} silent connections still held, bound 4");
    }
}
