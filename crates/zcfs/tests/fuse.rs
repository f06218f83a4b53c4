//! Real FUSE mounts (root and /dev/fuse required, as in CI): POSIX semantics, unmodified
//! programs, signals, a killed mount process, the null backend, the mount helper.

mod common;
use common::mount::*;
use common::*;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn posix_semantics() {
    let mut m = Mount::volume("posix", "8G", &["--inodes", "200000", "--sparse"]);
    // O_APPEND, read back.
    for i in 0..3 {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(m.path("log"))
            .unwrap();
        writeln!(f, "line {i}").unwrap();
    }
    assert_eq!(
        fs::read_to_string(m.path("log")).unwrap(),
        "line 0\nline 1\nline 2\n"
    );
    // Truncate down and up.
    let f = OpenOptions::new().write(true).open(m.path("log")).unwrap();
    f.set_len(4).unwrap();
    f.set_len(10).unwrap();
    assert_eq!(fs::read(m.path("log")).unwrap(), b"line\0\0\0\0\0\0");
    // Sparse file and a file past 4 GiB.
    let mut f = File::create(m.path("sparse")).unwrap();
    f.seek(SeekFrom::Start(5 << 30)).unwrap();
    f.write_all(b"beyond 4 GiB").unwrap();
    f.sync_all().unwrap();
    let md = fs::metadata(m.path("sparse")).unwrap();
    assert_eq!(md.len(), (5 << 30) + 12);
    assert!(
        md.blocks() < 64,
        "sparse file allocates {} blocks",
        md.blocks()
    );
    let mut f = File::open(m.path("sparse")).unwrap();
    let mut buf = [1u8; 16];
    f.seek(SeekFrom::Start((5 << 30) - 4)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"\0\0\0\0beyond 4 GiB");
    // Rename over an existing file is atomic: the target has the new content, the
    // source name is gone.
    fs::write(m.path("a"), "new").unwrap();
    fs::write(m.path("b"), "old").unwrap();
    fs::rename(m.path("a"), m.path("b")).unwrap();
    assert_eq!(fs::read_to_string(m.path("b")).unwrap(), "new");
    assert!(!m.path("a").exists());
    // Hard links and symlinks.
    fs::hard_link(m.path("b"), m.path("b2")).unwrap();
    assert_eq!(fs::metadata(m.path("b")).unwrap().nlink(), 2);
    assert_eq!(
        fs::metadata(m.path("b")).unwrap().ino(),
        fs::metadata(m.path("b2")).unwrap().ino()
    );
    std::os::unix::fs::symlink("b", m.path("sym")).unwrap();
    assert_eq!(fs::read_link(m.path("sym")).unwrap(), Path::new("b"));
    assert_eq!(fs::read_to_string(m.path("sym")).unwrap(), "new");
    // chmod, chown.
    fs::set_permissions(m.path("b"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.path("b")).unwrap().mode() & 0o7777, 0o600);
    std::os::unix::fs::chown(m.path("b"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(m.path("b")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    // Directories and their errors.
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("d/x"), "x").unwrap();
    assert_eq!(
        fs::remove_dir(m.path("d")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    assert_eq!(
        fs::create_dir(m.path("d")).unwrap_err().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(
        File::open(m.path("nope")).unwrap_err().raw_os_error(),
        Some(libc::ENOENT)
    );
    // An unlinked file stays readable through an open handle.
    let mut h = File::open(m.path("d/x")).unwrap();
    fs::remove_file(m.path("d/x")).unwrap();
    let mut s = String::new();
    h.read_to_string(&mut s).unwrap();
    assert_eq!(s, "x");
    drop(h);
    fs::remove_dir(m.path("d")).unwrap();
    // Shared writable mmap.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("mm"))
        .unwrap();
    f.set_len(8192).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: mapping 8192 bytes of a file we just sized; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: `p` maps 8192 writable bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(b"mapped!".as_ptr(), (p as *mut u8).add(4096), 7);
        assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0);
        libc::munmap(p, 8192);
    }
    drop(f);
    assert_eq!(&fs::read(m.path("mm")).unwrap()[4096..4103], b"mapped!");
    // xattrs.
    let c = |s: &str| std::ffi::CString::new(s).unwrap();
    let path = c(m.path("b").to_str().unwrap());
    // SAFETY: valid C strings and buffers.
    unsafe {
        assert_eq!(
            libc::setxattr(
                path.as_ptr(),
                c("user.k").as_ptr(),
                b"v".as_ptr() as *const _,
                1,
                0
            ),
            0
        );
        let mut v = [0u8; 8];
        assert_eq!(
            libc::getxattr(
                path.as_ptr(),
                c("user.k").as_ptr(),
                v.as_mut_ptr() as *mut _,
                8
            ),
            1
        );
        assert_eq!(v[0], b'v');
    }
    // readdir of 100,000 entries.
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..100_000 {
        File::create(m.path(&format!("many/f{i:06}"))).unwrap();
    }
    let n = fs::read_dir(m.path("many")).unwrap().count();
    assert_eq!(n, 100_000);
    m.stop();
    m.fsck();
}

#[test]
fn unmodified_programs() {
    let mut m = Mount::volume("progs", "2G", &[]);
    let mp = m.mp.to_str().unwrap().to_string();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    // cp -a of a source tree, then diff.
    sh(&format!("cp -a {src} {mp}/copy && diff -r {src} {mp}/copy"));
    // tar create from the mount and extract into it.
    sh(&format!("tar -C {mp} -cf {mp}/t.tar copy && mkdir {mp}/untar && tar -C {mp}/untar -xf {mp}/t.tar && diff -r {src} {mp}/untar/copy"));
    // grep -r finds what it should.
    let g = sh(&format!("grep -rl 'fn main' {mp}/copy | wc -l"));
    assert!(g.trim().parse::<u32>().unwrap() >= 1);
    // rsync -a.
    sh(&format!(
        "rsync -a {src}/ {mp}/rsync/ && diff -r {src} {mp}/rsync"
    ));
    // git clone of a local repository, then fsck it on the mount.
    let repo = std::env::temp_dir().join(unique("repo"));
    let _ = fs::remove_dir_all(&repo);
    sh(&format!(
        "git init -q {r} && cd {r} && for i in 1 2 3; do echo $i > f$i; git add f$i; \
         git -c user.name=t -c user.email=t@e commit -qm c$i; done",
        r = repo.display()
    ));
    sh(&format!("git clone -q {} {mp}/clone && git -C {mp}/clone fsck --full && test $(git -C {mp}/clone rev-list --count HEAD) = 3", repo.display()));
    fs::remove_dir_all(&repo).unwrap();
    // sqlite3: create, insert, query, integrity check.
    let out = sh(&format!(
        "sqlite3 {mp}/db.sqlite 'create table t(a integer primary key, b text); \
         with recursive c(x) as (select 1 union all select x+1 from c where x<5000) insert into t(b) select hex(randomblob(64)) from c; \
         select count(*) from t; pragma integrity_check;'"
    ));
    assert_eq!(out.trim(), "5000\nok");
    // fio with verification.
    let out = sh(&format!(
        "fio --name=verify --filename={mp}/fio.dat --size=32M --rw=randwrite --bs=4k --ioengine=psync \
         --verify=crc32c --do_verify=1 --verify_state_save=0 --output-format=terse"
    ));
    let fields: Vec<&str> = out.trim().lines().last().unwrap().split(';').collect();
    assert_eq!(fields[4], "0", "fio reported errors: {out}");
    m.stop();
    m.fsck();
}

#[test]
fn sigkill_of_the_mount_process_leaves_a_recoverable_volume() {
    let mut m = Mount::volume("kill", "512M", &[]);
    for i in 0..50 {
        let mut f = File::create(m.path(&format!("f{i}"))).unwrap();
        f.write_all(&vec![i as u8; 10_000 + i * 100]).unwrap();
        f.sync_all().unwrap();
    }
    let child = m.child.take().unwrap();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let mut child = child;
    child.wait().unwrap();
    run_ok(zcfs().arg("umount").arg("--lazy").arg(&m.mp));
    m.fsck();
    let image = m.image.clone().unwrap();
    m.start(image.to_str().unwrap(), &[]);
    for i in 0..50 {
        assert_eq!(
            fs::read(m.path(&format!("f{i}"))).unwrap(),
            vec![i as u8; 10_000 + i * 100]
        );
    }
    m.stop();
    m.fsck();
    let stat = zcfs()
        .arg("stat")
        .arg(&image)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&stat.stdout).unwrap();
    assert_eq!(
        v["recovery"]["was_clean"], true,
        "SIGTERM must leave the volume clean"
    );
}

#[test]
fn null_backend_answers_reads_and_writes() {
    let mut m = Mount {
        image: None,
        mp: PathBuf::new(),
        child: None,
    };
    m.start("null", &[]);
    let mut f = File::open(m.path("anything")).unwrap();
    let mut buf = vec![1u8; 1 << 20];
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    let mut w = OpenOptions::new().write(true).open(m.path("sink")).unwrap();
    w.write_all(&buf).unwrap();
    assert_eq!(fs::metadata(m.path("x")).unwrap().len(), 1 << 40);
    drop((f, w));
    m.stop();
}

#[test]
fn mount_errors_say_what_to_do() {
    let m = Mount::volume("errs", "64M", &[]);
    let image = m.image.clone().unwrap();
    let out = zcfs()
        .arg("mount")
        .arg(&image)
        .arg("/nonexistent/zcfs-mp")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("mkdir -p"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = zcfs().arg("mount").arg("null").arg(&m.mp).output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("busy"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tmp = std::env::temp_dir().join(unique("mp-opt"));
    fs::create_dir_all(&tmp).unwrap();
    let out = zcfs()
        .arg("mount")
        .arg("null")
        .arg(&tmp)
        .args(["-o", "frobnicate"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mount option"));
    fs::remove_dir(&tmp).unwrap();
}

#[test]
fn daemon_mode_and_mount_helper_with_fstab_options() {
    let image = PathBuf::from(format!("/dev/shm/{}.img", unique("helper")));
    mkfs(&image, "64M", &[]);
    let mp = std::env::temp_dir().join(unique("helper-mp"));
    fs::create_dir_all(&mp).unwrap();
    // --daemon returns once the mount is live.
    run_ok(zcfs().arg("mount").arg("--daemon").arg(&image).arg(&mp));
    assert!(mounted(&mp));
    fs::write(mp.join("f"), "daemon").unwrap();
    assert!(zcfs().arg("umount").arg(&mp).status().unwrap().success());
    // The volume is closed cleanly once the daemon sees the unmount.
    wait_until_closed_cleanly(&image);
    // mount -t fuse.zcfs through the helper, with fstab-only options ignored.
    let helper = PathBuf::from("/sbin/mount.fuse.zcfs");
    let had_helper = helper.exists();
    assert!(zcfs().arg("install-helper").status().unwrap().success());
    let out = Command::new("mount")
        .args([
            "-t",
            "fuse.zcfs",
            "-o",
            "_netdev,nofail,x-systemd.automount,default_permissions",
        ])
        .arg(&image)
        .arg(&mp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -t fuse.zcfs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read_to_string(mp.join("f")).unwrap(), "daemon");
    assert!(zcfs().arg("umount").arg(&mp).status().unwrap().success());
    if !had_helper {
        let _ = fs::remove_file(&helper);
    }
    std::thread::sleep(Duration::from_millis(300));
    let _ = fs::remove_dir(&mp);
    let _ = fs::remove_file(&image);
}

#[test]
fn several_users_share_a_mount_and_display_options_apply() {
    // allow_other + default_permissions: another user creates files as itself, and the
    // kernel enforces permissions.
    let mut m = Mount::volume_with(
        "users",
        "64M",
        &[],
        &["-o", "allow_other,default_permissions"],
    );
    let image = m.image.clone().unwrap();
    fs::create_dir(m.path("shared")).unwrap();
    fs::set_permissions(m.path("shared"), fs::Permissions::from_mode(0o1777)).unwrap();
    fs::create_dir(m.path("private")).unwrap();
    fs::set_permissions(m.path("private"), fs::Permissions::from_mode(0o700)).unwrap();
    let as_nobody = |cmd: &str| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "sh",
                "-c",
                cmd,
            ])
            .output()
            .unwrap()
    };
    let out = as_nobody(&format!("echo hi > {}", m.path("shared/mine").display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = fs::metadata(m.path("shared/mine")).unwrap();
    assert_eq!(
        (md.uid(), md.gid()),
        (65534, 65534),
        "new files belong to the caller"
    );
    let out = as_nobody(&format!("touch {}", m.path("private/x").display()));
    assert!(
        !out.status.success(),
        "default_permissions must refuse writes to a 0700 directory"
    );
    m.stop();
    // uid=, gid=, umask= change what is shown.
    m.start(
        image.to_str().unwrap(),
        &["-o", "uid=1234,gid=4321,umask=077"],
    );
    let md = fs::metadata(m.path("shared/mine")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o777), (1234, 4321, 0o600));
    m.stop();
    m.fsck();
}

#[test]
fn rename_over_a_target_is_atomic_to_a_reader() {
    let m = Mount::volume("atomic-save", "256M", &[]);
    assert_atomic_saves(&m.mp, 2000, 100);
    m.fsck_after_stop();
}

#[test]
fn a_second_opener_of_a_mounted_image_is_refused_naming_the_holder() {
    let mut m = Mount::volume("second-opener", "64M", &[]);
    fs::write(m.path("f"), "data").unwrap();
    let pid = m.child.as_ref().unwrap().id().to_string();
    let image = m.image.clone().unwrap();
    let mp2 = std::env::temp_dir().join(unique("second-mp"));
    fs::create_dir_all(&mp2).unwrap();
    let out = zcfs().arg("mount").arg(&image).arg(&mp2).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && !mounted(&mp2),
        "second mount succeeded"
    );
    assert!(err.contains("in use") && err.contains(&pid), "{err}");
    let _ = fs::remove_dir(&mp2);
    for args in [
        &["fsck"][..],
        &["fsck", "--repair"],
        &["serve", "--listen", "127.0.0.1:0", "--insecure"],
    ] {
        let out = zcfs()
            .args(&args[..1])
            .arg(&image)
            .args(&args[1..])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(8), "{args:?}: {err}");
        assert!(err.contains(&pid), "{args:?}: {err}");
    }
    // An open file whose name is removed shows link count 0, and stays readable.
    let f = File::open(m.path("f")).unwrap();
    fs::remove_file(m.path("f")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    let mut s = String::new();
    (&f).read_to_string(&mut s).unwrap();
    assert_eq!(s, "data");
    drop(f);
    m.stop();
    m.fsck();
}

/// `-o remount,ro` and back to `rw` change the live mount in place (as mount(8) does for
/// other file systems), keeping the flags it does not name (nosuid, nodev); the generic
/// options fstab lines and tools pass (relatime, strictatime, lazytime, noacl, ...) are
/// accepted.
#[test]
fn remount_read_only_and_back_and_generic_options_are_accepted() {
    let m = Mount::volume_with(
        "remount",
        "64M",
        &[],
        &[
            "-o",
            "relatime,strictatime,lazytime,noacl,nodiratime,iversion",
        ],
    );
    fs::write(m.path("f"), "before").unwrap();
    let flags = |p: &Path| {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs writes into the zeroed struct; `c` is a valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_flag
    };
    let before = flags(&m.mp);
    let image = m.image.clone().unwrap();
    let remount = |o: &str| {
        run_ok(zcfs().arg("mount").arg(&image).arg(&m.mp).args(["-o", o]));
    };
    remount("remount,ro");
    let ro = flags(&m.mp);
    assert!(ro & libc::ST_RDONLY != 0);
    assert_eq!(
        ro & (libc::ST_NOSUID | libc::ST_NODEV),
        before & (libc::ST_NOSUID | libc::ST_NODEV),
        "flags the remount did not name are kept"
    );
    let e = fs::write(m.path("f"), "during").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert_eq!(fs::read_to_string(m.path("f")).unwrap(), "before");
    remount("remount,rw");
    assert_eq!(flags(&m.mp) & libc::ST_RDONLY, 0);
    fs::write(m.path("f"), "after").unwrap();
    assert_eq!(fs::read_to_string(m.path("f")).unwrap(), "after");
    m.fsck_after_stop();
}

/// `umount MNT` then a new mount of the same image on MNT at once: the new mount waits
/// (a bounded time) for the old process to close the volume, and the old process, on its
/// way out, leaves the new mount alone (it unmounted whatever was on its old mount point).
#[test]
fn unmount_then_mount_again_at_once_keeps_the_new_mount() {
    let mut m = Mount::volume("remount-race", "64M", &[]);
    fs::write(m.path("f"), "kept").unwrap();
    let image = m.image.clone().unwrap();
    let mut old = m.child.take().unwrap();
    umount_retrying(&m.mp);
    run_ok(zcfs().arg("mount").arg("--daemon").arg(&image).arg(&m.mp));
    // The old process has finished by now or finishes soon; the new mount outlives it.
    let t = Instant::now();
    while old.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the old mount process hangs"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(mounted(&m.mp), "the new mount is gone");
    assert_eq!(fs::read_to_string(m.path("f")).unwrap(), "kept");
    run_ok(zcfs().arg("umount").arg(&m.mp));
    // The daemon closes the volume cleanly once it sees the unmount.
    wait_until_closed_cleanly(&image);
}

/// A regular file shows the mount's largest write (1 MiB by default, `-o max_write=`
/// rounded down to a power of two) as its preferred I/O size, as NFS shows its wsize, so
/// that tools which size their buffers by `st_blksize` (cp, stdio) write in large calls;
/// directories keep the volume's block size. `cp` then writes in 1 MiB calls.
#[test]
fn regular_files_show_the_largest_write_as_their_io_size() {
    let mut m = Mount::volume("blksize", "1G", &[]);
    fs::write(m.path("f"), b"x").unwrap();
    fs::create_dir(m.path("d")).unwrap();
    assert_eq!(fs::metadata(m.path("f")).unwrap().blksize(), 1 << 20);
    assert_eq!(fs::metadata(m.path("d")).unwrap().blksize(), 4096);
    // cp sizes its buffer by the destination's st_blksize: the mount counts its writes.
    let writes = || -> u64 {
        let out = run_ok(zcfs().arg("stat").arg(&m.mp).arg("--json"));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        r["ops"]["write"]["count"].as_u64().unwrap_or(0)
    };
    let before = writes();
    let src = std::env::temp_dir().join(unique("blksize-src"));
    fs::write(&src, vec![7u8; 4 << 20]).unwrap();
    sh(&format!(
        "cp {} {}",
        src.display(),
        m.path("copy").display()
    ));
    fs::remove_file(&src).unwrap();
    assert_eq!(writes() - before, 4, "FUSE writes of cp's 4 MiB");
    assert_eq!(fs::read(m.path("copy")).unwrap(), vec![7u8; 4 << 20]);
    m.stop();
    let mut m = Mount::volume_with("blksize-mw", "1G", &[], &["-o", "max_write=200000"]);
    fs::write(m.path("f"), b"x").unwrap();
    assert_eq!(fs::metadata(m.path("f")).unwrap().blksize(), 131072);
    m.stop();
}
