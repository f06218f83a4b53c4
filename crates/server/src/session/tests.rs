//! Sessions, handles, references and the reply cache, without a network.
use super::*;
use zcfs_backend::null::NullFs;

fn handle(ino: u64) -> Handle {
    handle_with(ino, libc::O_RDWR)
}

fn handle_with(ino: u64, flags: i32) -> Handle {
    Handle {
        ino,
        gen: 1,
        backend_fh: 0,
        flags,
    }
}

fn attach(t: &Sessions, id: u64) -> (Arc<Session>, bool) {
    let a = t.attach(id);
    let r = (a.session.clone(), a.resumed);
    // The connection stays counted (as while it is served).
    std::mem::forget(a);
    r
}

#[test]
fn references_never_go_below_zero() {
    let t = Sessions::new(Duration::from_secs(60), 8);
    let (s, resumed) = attach(&t, 7);
    assert!(!resumed);
    s.add_ref(5);
    s.add_ref(5);
    assert_eq!(s.take_refs(5, 3), 2);
    assert_eq!(s.take_refs(5, 1), 0);
    assert_eq!(s.take_refs(6, 1), 0);
    assert_eq!(s.refs_of(5), 0);
}

/// `Session::orphaned` for an inode with no link: the references given back, if any.
fn orphan(s: &Session, ino: u64) -> Option<u64> {
    let mut got = None;
    let gave = s.orphaned(ino, || true, |n| got = Some(n));
    assert_eq!(gave, got.is_some());
    got
}

/// A session holds at most `max_handles` orphans by reference alone: at the bound
/// they stay, one past it gives back its references (the count to give the backend);
/// what holds an orphan otherwise (a handle, a name again) or frees it (a FORGET) takes
/// it off the count.
#[test]
fn orphans_held_by_reference_alone_are_bounded_by_the_handle_limit() {
    const MAX: usize = 3;
    let t = Sessions::new(Duration::from_secs(60), MAX);
    let (s, _) = attach(&t, 9);
    for ino in 10..10 + MAX as u64 {
        s.add_ref(ino);
        s.add_ref(ino);
        assert_eq!(orphan(&s, ino), None, "within the bound");
    }
    assert_eq!(s.orphans(), MAX);
    // Noted twice: still one.
    assert_eq!(orphan(&s, 10), None);
    assert_eq!(s.orphans(), MAX);
    // One past the bound: its two references come back, and the session holds it no more.
    s.add_ref(20);
    s.add_ref(20);
    assert_eq!(orphan(&s, 20), Some(2));
    assert!(!s.holds(20));
    assert_eq!(s.take_refs(20, 2), 0, "the client's FORGET takes nothing");
    assert_eq!(s.orphans(), MAX);
    // Not held by reference alone: not counted (no reference; or an open handle).
    assert_eq!(orphan(&s, 21), None);
    s.add_ref(22);
    s.add_handle(handle(22)).unwrap();
    assert_eq!(orphan(&s, 22), None);
    assert_eq!(s.orphans(), MAX);
    // A FORGET of all references, a handle opened, a new name: off the count.
    assert_eq!(s.take_refs(10, 2), 2);
    assert_eq!(s.orphans(), MAX - 1);
    s.add_handle(handle(11)).unwrap();
    assert_eq!(s.orphans(), MAX - 2);
    s.linked(12);
    assert_eq!(s.orphans(), MAX - 3);
    // Room again: held.
    s.add_ref(23);
    assert_eq!(orphan(&s, 23), None);
    assert_eq!(s.orphans(), 1);
    // One linked again by the time the session's lock is held: not an orphan (and off
    // the count if it was one); one being opened: left alone.
    assert!(!s.orphaned(23, || false, |_| panic!("nothing given back")));
    assert_eq!(s.orphans(), 0);
    s.add_ref(24);
    let opening = s.opening(24);
    assert_eq!(orphan(&s, 24), None);
    assert_eq!(s.orphans(), 0);
    drop(opening);
    assert_eq!(orphan(&s, 24), None);
    assert_eq!(s.orphans(), 1);
}

#[test]
fn handles_are_per_session_and_bounded() {
    let t = Sessions::new(Duration::from_secs(60), 2);
    let (a, _) = attach(&t, 1);
    let (b, _) = attach(&t, 2);
    let fa = a.add_handle(handle(10)).unwrap();
    assert_eq!(b.take_handle(fa, 10).unwrap_err().errno, libc::EBADF);
    assert_eq!(
        a.handle(fa, 11, Access::Any).unwrap_err().errno,
        libc::EBADF
    );
    assert_eq!(a.take_handle(fa, 11).unwrap_err().errno, libc::EBADF);
    assert_eq!(a.handle(fa, 10, Access::Any).unwrap().ino, 10);
    // The bound: exactly `max_handles` fit.
    a.add_handle(handle(11)).unwrap();
    assert!(a.has_room().is_err());
    assert_eq!(a.add_handle(handle(12)).unwrap_err().errno, libc::EMFILE);
    a.take_handle(fa, 10).unwrap();
    assert!(a.has_room().is_ok());
    assert_ne!(
        a.add_handle(handle(12)).unwrap(),
        fa,
        "numbers are not reused"
    );
}

#[test]
fn a_handle_serves_what_it_was_opened_for() {
    let t = Sessions::new(Duration::from_secs(60), 8);
    let (s, _) = attach(&t, 1);
    let ro = s.add_handle(handle_with(5, libc::O_RDONLY)).unwrap();
    let wo = s
        .add_handle(handle_with(5, libc::O_WRONLY | libc::O_APPEND))
        .unwrap();
    let rw = s
        .add_handle(handle_with(5, libc::O_RDWR | libc::O_CREAT))
        .unwrap();
    let none = s.add_handle(handle_with(5, libc::O_ACCMODE)).unwrap();
    let ok = |fh, a| s.handle(fh, 5, a).map(|_| ()).map_err(|e| e.errno);
    assert_eq!(ok(ro, Access::Read), Ok(()));
    assert_eq!(ok(ro, Access::Write), Err(libc::EBADF));
    assert_eq!(ok(wo, Access::Read), Err(libc::EBADF));
    assert_eq!(ok(wo, Access::Write), Ok(()));
    assert_eq!(ok(rw, Access::Read), Ok(()));
    assert_eq!(ok(rw, Access::Write), Ok(()));
    for fh in [ro, wo, rw, none] {
        assert_eq!(ok(fh, Access::Any), Ok(()));
    }
    assert_eq!(ok(none, Access::Read), Err(libc::EBADF));
    assert_eq!(ok(none, Access::Write), Err(libc::EBADF));
}

#[test]
fn a_session_outlives_its_connections_by_the_grace_period() {
    let t = Arc::new(Sessions::new(Duration::from_millis(300), 8));
    let stats = Arc::new(ServerStats::default());
    let reaper = {
        let (t, stats) = (t.clone(), stats.clone());
        std::thread::spawn(move || t.reap(&NullFs::default(), &stats))
    };
    // A failed handshake's new session is forgotten at once.
    let a = t.attach(1);
    t.abandon(a);
    assert_eq!(t.counts().in_grace, 0);
    // An empty session of a client that was connected waits out the grace period.
    let a = t.attach(1);
    assert!(!a.resumed);
    t.detach(a);
    assert_eq!(t.counts().in_grace, 1);
    let a = t.attach(1);
    assert!(a.resumed);
    let s = a.session.clone();
    s.add_ref(9);
    t.detach(a);
    // Resumed within grace...
    std::thread::sleep(Duration::from_millis(100));
    let a = t.attach(1);
    assert!(a.resumed && Arc::ptr_eq(&s, &a.session));
    assert_eq!(a.session.refs_of(9), 1);
    // A resumed session keeps its serial.
    assert_eq!(a.session.serial, s.serial);
    t.detach(a);
    assert_eq!(t.counts().in_grace, 1);
    // ... and released after it.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(t.counts().in_grace, 0);
    assert_eq!(stats.sessions_expired.load(Ordering::Relaxed), 1);
    assert_eq!(stats.expired_references.load(Ordering::Relaxed), 1);
    let again = t.attach(1);
    assert!(!again.resumed, "a new session after expiry");
    // The one started again has another serial (its next connection is told
    // `resumed`, and only the serial says it is not the session the client knew).
    assert_ne!(again.session.serial, s.serial);
    assert_ne!(again.session.serial, 0);
    t.detach(again);
    let next = t.attach(1);
    assert!(next.resumed);
    assert_ne!(next.session.serial, s.serial);
    t.detach(next);
    t.stop(&NullFs::default(), &stats);
    reaper.join().unwrap();
}

/// A handshake that fails after attaching (the peer left before the last message)
/// leaves a session in grace exactly as it was: its deadline is not moved.
#[test]
fn a_failed_handshake_does_not_restart_the_grace_period() {
    let grace = Duration::from_millis(400);
    let t = Arc::new(Sessions::new(grace, 8));
    let stats = Arc::new(ServerStats::default());
    let reaper = {
        let (t, stats) = (t.clone(), stats.clone());
        std::thread::spawn(move || t.reap(&NullFs::default(), &stats))
    };
    let a = t.attach(1);
    a.session.add_ref(9);
    t.detach(a);
    let idle = Instant::now();
    while idle.elapsed() < grace * 3 && t.counts().in_grace == 1 {
        let a = t.attach(1);
        assert!(a.resumed);
        t.abandon(a);
        std::thread::sleep(grace / 8);
    }
    let took = idle.elapsed();
    assert_eq!(t.counts().in_grace, 0, "still held after {took:?}");
    assert!(took < grace * 2, "{took:?}");
    assert_eq!(stats.expired_references.load(Ordering::Relaxed), 1);
    t.stop(&NullFs::default(), &stats);
    reaper.join().unwrap();
}

fn reply(len: usize, fill: u8) -> Arc<[u8]> {
    vec![fill; len].into()
}

fn run(s: &Session, id: u64, op: Op, r: Arc<[u8]>) {
    match s.begin(id, op) {
        Begin::Run(c) => c.finish(r),
        Begin::Replay(_) => panic!("id {id} replayed"),
    }
}

fn replayed(s: &Session, id: u64, op: Op) -> Option<Arc<[u8]>> {
    match s.begin(id, op) {
        Begin::Replay(r) => Some(r),
        Begin::Run(_) => None,
    }
}

/// The reply cache keeps exactly REPLY_CACHE_ENTRIES replies, then evicts the oldest.
#[test]
fn the_reply_cache_holds_its_count_bound() {
    let t = Sessions::new(Duration::from_secs(60), 8);
    let (s, _) = attach(&t, 1);
    for id in 1..=REPLY_CACHE_ENTRIES as u64 {
        run(&s, id, Op::Mkdir, reply(40, id as u8));
    }
    assert_eq!(
        s.cached_replies(),
        (REPLY_CACHE_ENTRIES, REPLY_CACHE_ENTRIES * 40)
    );
    assert_eq!(&*replayed(&s, 1, Op::Mkdir).unwrap(), &[1u8; 40][..]);
    run(&s, REPLY_CACHE_ENTRIES as u64 + 1, Op::Mkdir, reply(40, 0));
    assert_eq!(s.cached_replies().0, REPLY_CACHE_ENTRIES);
    assert!(replayed(&s, 1, Op::Mkdir).is_none(), "the oldest evicted");
    assert!(replayed(&s, 2, Op::Mkdir).is_some());
}

/// ... and at most REPLY_CACHE_BYTES bytes, evicting the oldest to make room.
#[test]
fn the_reply_cache_holds_its_byte_bound() {
    let t = Sessions::new(Duration::from_secs(60), 8);
    let (s, _) = attach(&t, 1);
    let big = REPLY_CACHE_BYTES / 16;
    for id in 1..=16 {
        run(&s, id, Op::Readdir, reply(big, 1));
    }
    assert_eq!(s.cached_replies(), (16, REPLY_CACHE_BYTES));
    assert!(replayed(&s, 1, Op::Readdir).is_some());
    run(&s, 17, Op::Forget, reply(1, 2));
    assert_eq!(s.cached_replies(), (16, REPLY_CACHE_BYTES - big + 1));
    assert!(replayed(&s, 1, Op::Readdir).is_none(), "the oldest evicted");
    assert!(replayed(&s, 2, Op::Readdir).is_some());
    // A reply over the bound is not kept (and evicts nothing).
    run(&s, 18, Op::Readdir, reply(REPLY_CACHE_BYTES + 1, 3));
    assert!(replayed(&s, 18, Op::Readdir).is_none());
    assert_eq!(s.cached_replies(), (16, REPLY_CACHE_BYTES - big + 1));
}

/// A resend that arrives while the first attempt still runs waits for its reply; an
/// id reused for another operation is new; a claim dropped unfinished (a panic)
/// lets a resend execute.
#[test]
fn a_resend_waits_for_the_running_attempt() {
    let t = Sessions::new(Duration::from_secs(60), 8);
    let (s, _) = attach(&t, 1);
    let Begin::Run(first) = s.begin(5, Op::Create) else {
        panic!("new id replayed")
    };
    std::thread::scope(|scope| {
        let resend = scope.spawn(|| replayed(&s, 5, Op::Create));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!resend.is_finished(), "the resend did not wait");
        // Waited for with a deadline: still running then, None (and nothing claimed).
        let t0 = std::time::Instant::now();
        assert!(s
            .begin_until(5, Op::Create, t0 + Duration::from_millis(30))
            .is_none());
        assert!(t0.elapsed() >= Duration::from_millis(30));
        assert!(
            s.begin_until(5, Op::Create, t0).is_none(),
            "a past deadline"
        );
        first.finish(reply(8, 7));
        assert_eq!(&*resend.join().unwrap().unwrap(), &[7u8; 8][..]);
    });
    assert!(replayed(&s, 5, Op::Release).is_none(), "another operation");
    drop(replayed(&s, 6, Op::Lookup));
    assert!(replayed(&s, 6, Op::Lookup).is_none(), "an unfinished claim");
}

#[test]
fn sessions_over_the_grace_limit_expire_idle_longest_first() {
    let t = Sessions::new(Duration::from_secs(60), 8).with_max_in_grace(2);
    for id in 1..=3 {
        let a = t.attach(id);
        std::thread::sleep(Duration::from_millis(2));
        t.detach(a);
    }
    assert_eq!(t.counts().in_grace, 2, "the limit holds");
    assert_eq!(lock(&t.map).evicted.len(), 1, "handed to the reaper");
    assert!(!t.attach(1).resumed, "the one idle longest is gone");
    assert!(t.attach(3).resumed, "the newest waits out its grace");
}
