//! Review 26c: `Client::prefault_window` (8877000): refused without trust, idempotent
//! and content-preserving, and on a truncated image an error rather than SIGBUS.

mod common;
use common::*;
use zcfs_samehost::client::Client;

/// Wait (bounded: 10 s) until this process has no `zcfs-window-prefault` thread.
fn no_window_prefault_thread() {
    eventually("the window prefault thread ended", || {
        std::fs::read_dir("/proc/self/task").unwrap().all(|t| {
            let p = t.unwrap().path().join("comm");
            std::fs::read_to_string(p).map_or(true, |c| c.trim() != "zcfs-window-prefault")
        })
    });
}

fn run_child(name: &str, arg: &str) {
    let out = spawn_child(name, arg).wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("CHILD-OK"),
        "child {name}: {:?} {text}",
        out.status
    );
}

/// Child: an untrusted user's prefault is EPERM (the direct map's refusal), no panic.
#[test]
fn child_untrusted_prefault() {
    let Some(sock) = child_arg() else { return };
    become_nobody();
    let mut c = Client::connect(&sock).unwrap();
    assert_eq!(c.prefault_window().unwrap_err().errno(), libc::EPERM);
    assert_eq!(c.prefault_window().unwrap_err().errno(), libc::EPERM);
    assert!(c.mapped().is_none());
    println!("CHILD-OK");
}

#[test]
fn prefault_window_without_trust_is_eperm() {
    let s = serve("pfuntrusted");
    run_child("child_untrusted_prefault", s.sock.to_str().unwrap());
}

/// Twice, between fills of a live reservation's window: true both times, and what the
/// window held before and after is what the file gets.
#[test]
fn prefault_window_twice_between_fills_keeps_the_bytes() {
    let s = serve("pftwice");
    allocate_whole(&s.image);
    let mut c = Client::connect(&s.sock).unwrap();
    let f = c.open("/t", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    c.direct_map().unwrap();
    let mut r = c.reserve(4).unwrap();
    let data = pattern(4 * 4096, 3);
    assert!(r.window().write_at(0, &data[..8192]));
    assert!(c.prefault_window().unwrap());
    assert!(r.window().write_at(8192, &data[8192..]));
    assert!(c.prefault_window().unwrap());
    c.commit(vec![zcfs_samehost::client::Place {
        handle: f.handle,
        file_offset: 0,
        reservation: r,
        new_size: zcfs_samehost::client::NO_NEW_SIZE,
    }])
    .unwrap();
    let buf = c.register_buffer(data.len()).unwrap();
    assert_eq!(
        c.read(f.handle, 0, buf, 0, data.len() as u64).unwrap(),
        data.len()
    );
    assert!(c.buffer(buf).unwrap()[..data.len()] == data[..]);
}

/// Child: the server gone and its image truncated under the client's direct map:
/// `prefault_window` returns an error (MADV_POPULATE_WRITE's EFAULT), no SIGBUS.
#[test]
fn child_prefault_after_truncate() {
    let Some(_) = child_arg() else { return };
    let mut s = serve("pftrunc");
    allocate_whole(&s.image);
    let mut c = Client::connect(&s.sock).unwrap();
    c.direct_map().unwrap();
    no_window_prefault_thread();
    s.stop();
    let image = std::fs::OpenOptions::new()
        .write(true)
        .open(&s.image)
        .unwrap();
    // The server's volume closed first, and its own prefault thread (which touches
    // pages ahead of the allocator) gone: truncated under it, that thread took this
    // process down with SIGBUS now and then (a loaded machine runs it late). The
    // client's map is what this test is about.
    drop(s);
    eventually("the volume's prefault thread ended", || {
        std::fs::read_dir("/proc/self/task").unwrap().all(|t| {
            let p = t.unwrap().path().join("comm");
            std::fs::read_to_string(p).map_or(true, |c| c.trim() != "zcfs-prefault")
        })
    });
    image.set_len(IMAGE_SIZE / 2).unwrap();
    let e = c.prefault_window().unwrap_err();
    assert_eq!(e.errno(), libc::EFAULT, "{e}");
    println!("CHILD-OK");
    std::process::exit(0);
}

#[test]
fn prefault_window_on_a_truncated_image_is_an_error() {
    run_child("child_prefault_after_truncate", "x");
}

/// Child: the image truncated (to half, fully allocated) before the client asks for
/// the direct map: the server reports the file's size as `image_size`, so the data
/// area passes the mapping and both prefaults refuse the range (EINVAL), no SIGBUS.
#[test]
fn child_prefault_on_short_image() {
    let Some(_) = child_arg() else { return };
    let s = serve("pfshort");
    allocate_whole(&s.image);
    let image = s.image.clone();
    let mut c = Client::connect(&s.sock).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .set_len(IMAGE_SIZE / 2)
        .unwrap();
    assert_eq!(c.prefault_window().unwrap_err().errno(), libc::EINVAL);
    no_window_prefault_thread();
    let _ = std::fs::remove_file(&image);
    println!("CHILD-OK");
    std::process::exit(0);
}

#[test]
fn prefault_window_on_a_short_image_does_not_kill_the_client() {
    run_child("child_prefault_on_short_image", "x");
}
