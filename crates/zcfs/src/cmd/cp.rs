//! `zcfs cp [-r] [-p] SRC... DST`: copy files between local paths and servers
//! (`HOST:PORT:/path`), either way or between servers, through the client library
//! without a mount, as `cp` and `scp` do.

use crate::files::{local_stat, process_umask, Finish, Node, Remote};
use crate::location::Location;
use crate::pipeline::{copy_data, CHUNK_MAX, WINDOW};
use anyhow::{bail, Result};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io::IsTerminal;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use zcfs_backend::{Attr, Error};

#[derive(Debug, clap::Args)]
#[command(
    override_usage = "zcfs cp [-r] [-p] [--secret-file FILE] SRC... DST",
    after_help = "\
An operand is a local path or a file on a server as HOST:PORT:/path ([::1]:PORT:/path \
for IPv6); an operand with a colon before its first slash names a server (write ./a:b for \
a local file named a:b). Any side may be a server: local to server, server to local, \
server to server (the same or another).

As cp: with several SRCs, DST must be an existing directory; a DST that is a directory \
receives each SRC under its own name. Without -r a directory is not copied and a symlink \
is followed; with -r directories are copied with their contents, symlinks are made again \
as symlinks, and other kinds (fifos, sockets, devices) are skipped with a warning. \
Without -p a new file gets the source's permission bits less the umask, an existing file \
keeps its own; -p sets mode and access and modification times as the source's. An \
existing local device or fifo where a file goes is written into, its mode and times kept \
(also with -p); a socket there is an error, not replaced.

Files are moved in chunks of the server's largest I/O (at most 1 MiB), 16 in flight. A \
file written on a server is made durable (fsync) before cp counts it copied. Sparse files \
are not kept sparse: holes are written out as zeros. A progress bar is shown when stderr \
is a terminal.

Exit status: 0 everything copied, 1 something failed (each failure is reported, the rest \
is copied), 8 cp could not start (a bad operand, a server it cannot reach)."
)]
pub struct CpArgs {
    /// Copy directories recursively (symlinks as symlinks).
    #[arg(short = 'r', short_alias = 'R', long = "recursive")]
    recursive: bool,
    /// Keep mode and access/modification times.
    #[arg(short = 'p', long = "preserve")]
    preserve: bool,
    /// Shared secret for servers that require one.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// The sources, then the destination.
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    operands: Vec<String>,
}

/// Operands parsed, and the servers they name connected once each (`cat`, `ls`).
pub fn parse_and_connect(
    operands: &[String],
    secret_file: Option<&std::path::Path>,
) -> Result<(Vec<Location>, HashMap<String, Remote>)> {
    let locs = operands
        .iter()
        .map(|s| Location::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let remotes = connect_all(
        &locs.iter().collect::<Vec<_>>(),
        secret_file,
        process_umask(),
    )?;
    Ok((locs, remotes))
}

/// The servers the operands name, connected once each.
pub fn connect_all(
    locs: &[&Location],
    secret_file: Option<&std::path::Path>,
    umask: u32,
) -> Result<HashMap<String, Remote>> {
    let mut remotes = HashMap::new();
    for l in locs {
        if let Location::Remote { addr, .. } = l {
            if !remotes.contains_key(addr) {
                remotes.insert(addr.clone(), Remote::connect(addr, secret_file, umask)?);
            }
        }
    }
    Ok(remotes)
}

/// Resolve an operand: its node and attributes (`follow`: a symlink at the end is
/// followed).
pub fn resolve<'a>(
    remotes: &'a HashMap<String, Remote>,
    loc: &Location,
    follow: bool,
) -> zcfs_backend::Result<(Node<'a>, Attr)> {
    match loc {
        Location::Local(p) => {
            let a = local_stat(p, follow)?;
            Ok((Node::Local(p.clone()), a))
        }
        Location::Remote { addr, path } => remotes[addr].resolve(path, follow),
    }
}

/// The last name of an operand's path (None for `/`, `.` and `..`, which name no new
/// file).
fn last_name(loc: &Location) -> Option<OsString> {
    let path: &[u8] = match loc {
        Location::Local(p) => p.as_os_str().as_bytes(),
        Location::Remote { path, .. } => path.as_bytes(),
    };
    let name = path.split(|&b| b == b'/').rev().find(|c| !c.is_empty())?;
    (name != b"." && name != b"..").then(|| OsStr::from_bytes(name).to_os_string())
}

/// The directory an operand's path is in, as an operand of the same side.
fn parent(loc: &Location) -> Location {
    let dir = |p: &[u8]| -> Vec<u8> {
        let trimmed = p.strip_suffix(b"/").unwrap_or(p);
        if trimmed.is_empty() && !p.is_empty() {
            return b"/".to_vec();
        }
        match trimmed.iter().rposition(|&b| b == b'/') {
            Some(0) => b"/".to_vec(),
            Some(i) => trimmed[..i].to_vec(),
            None => b".".to_vec(),
        }
    };
    match loc {
        Location::Local(p) => Location::Local(PathBuf::from(OsStr::from_bytes(&dir(p
            .as_os_str()
            .as_bytes())))),
        Location::Remote { addr, path } => Location::Remote {
            addr: addr.clone(),
            path: String::from_utf8_lossy(&dir(path.as_bytes())).into_owned(),
        },
    }
}

struct Copier<'a> {
    recursive: bool,
    preserve: bool,
    umask: u32,
    failed: usize,
    progress: bool,
    /// Directories this copy made, by side and inode: met again in a source (a copy
    /// into itself), they are not descended into.
    made: HashSet<(Option<&'a str>, u64)>,
}

/// Which side a node is on: None for local, else the server's address.
fn side<'a>(n: &Node<'a>, remotes: &'a HashMap<String, Remote>) -> Option<&'a str> {
    match n {
        Node::Local(_) => None,
        Node::Remote(_) => remotes
            .iter()
            .find(|(_, r)| n.is_on(r))
            .map(|(a, _)| a.as_str()),
    }
}

impl<'a> Copier<'a> {
    fn fail(&mut self, what: &str, e: impl std::fmt::Display) {
        eprintln!("zcfs cp: {what}: {e}");
        self.failed += 1;
    }

    /// Copy `src` (attributes `sa`) to `name` in directory `dir`, where `existing`
    /// already is (if anything is). Errors are reported here, per file.
    #[allow(clippy::too_many_arguments)]
    fn entry(
        &mut self,
        remotes: &'a HashMap<String, Remote>,
        src: &Node<'a>,
        sa: &Attr,
        shown: &str,
        dir: &Node<'a>,
        name: &OsStr,
        existing: Option<(Node<'a>, Attr)>,
        target: &str,
    ) {
        if let Some((n, a)) = &existing {
            if same_file((src, sa), (n, a)) {
                return self.fail(
                    shown,
                    Error::new(
                        libc::EINVAL,
                        format!("{shown} and {target} are the same file"),
                    ),
                );
            }
        }
        let r = match sa.kind() {
            libc::S_IFREG => self.file(src, sa, shown, dir, name, existing),
            libc::S_IFDIR if !self.recursive => Err(Error::new(
                libc::EISDIR,
                "is a directory; not copied without -r",
            )),
            libc::S_IFDIR => {
                return self.directory(remotes, src, sa, shown, dir, name, existing, target)
            }
            libc::S_IFLNK => self.symlink(src, dir, name, existing),
            _ => {
                eprintln!(
                    "zcfs cp: warning: skipping {shown}: a {} is not copied (only files, directories and symlinks are)",
                    kind_name(sa.kind())
                );
                return;
            }
        };
        if let Err(e) = r {
            self.fail(shown, e);
        }
    }

    fn file(
        &mut self,
        src: &Node<'a>,
        sa: &Attr,
        shown: &str,
        dir: &Node<'a>,
        name: &OsStr,
        existing: Option<(Node<'a>, Attr)>,
    ) -> zcfs_backend::Result<()> {
        // The source first, as cp: one that cannot be read leaves the destination as it
        // was (not emptied, not replaced, a fifo with no reader not waited on).
        let mut reader = src.open_read()?;
        let mut writer = match existing {
            Some((_, a)) if a.is_dir() => {
                return Err(Error::new(
                    libc::EISDIR,
                    "cannot overwrite a directory with a file",
                ))
            }
            Some((n, a)) if a.kind() == libc::S_IFREG => n.open_write()?,
            // A local device or fifo (/dev/null, a pipe) is written into, as cp does;
            // replacing it would put a regular file where a device node was.
            Some((n, a))
                if n.is_local()
                    && matches!(a.kind(), libc::S_IFCHR | libc::S_IFBLK | libc::S_IFIFO) =>
            {
                n.open_write_through()?
            }
            // A local socket (/dev/log, a daemon's) cannot be written into and is not
            // replaced by a file: cp fails there too (ENXIO).
            Some((n, a)) if n.is_local() && a.kind() == libc::S_IFSOCK => {
                return Err(Error::new(
                    libc::ENXIO,
                    "a socket is there; it is not replaced by a file",
                ))
            }
            Some(_) => {
                // A symlink or another kind where the file goes: replaced.
                dir.unlink(name)?;
                dir.create(name, sa.mode & 0o777)?
            }
            None => dir.create(name, sa.mode & 0o777)?,
        };
        let chunk = CHUNK_MAX.min(src.max_io()?).min(dir.max_io()?);
        let bar = self.bar(shown, sa.size);
        copy_data(&mut reader, &mut writer, sa.size, chunk, WINDOW, &mut |n| {
            bar.inc(n)
        })?;
        bar.finish();
        writer.finish(&self.finish(sa, false))
    }

    /// What to set on a copy once it is made: with -p the source's mode and times;
    /// a directory this copy made gets its mode (less the umask) in the end, being
    /// made writable for its entries first.
    fn finish(&self, sa: &Attr, made_dir: bool) -> Finish {
        if self.preserve {
            Finish {
                mode: Some(sa.mode & 0o7777),
                times: Some((sa.atime, sa.mtime)),
            }
        } else if made_dir {
            Finish {
                mode: Some(sa.mode & 0o777 & !self.umask),
                times: None,
            }
        } else {
            Finish::default()
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn directory(
        &mut self,
        remotes: &'a HashMap<String, Remote>,
        src: &Node<'a>,
        sa: &Attr,
        shown: &str,
        dir: &Node<'a>,
        name: &OsStr,
        existing: Option<(Node<'a>, Attr)>,
        target: &str,
    ) {
        let (to, made) = match existing {
            Some((n, a)) if a.is_dir() => (n, false),
            Some(_) => {
                return self.fail(
                    shown,
                    Error::new(
                        libc::ENOTDIR,
                        format!("cannot overwrite the non-directory {target} with a directory"),
                    ),
                )
            }
            None => match dir.mkdir(name, (sa.mode & 0o777) | 0o700) {
                Ok((n, a)) => {
                    self.made.insert((side(&n, remotes), a.ino));
                    (n, true)
                }
                Err(e) => return self.fail(target, e),
            },
        };
        let names = match src.list() {
            Ok(n) => n,
            Err(e) => return self.fail(shown, e),
        };
        let src_side = side(src, remotes);
        for n in names {
            let child_shown = format!("{shown}/{}", n.to_string_lossy());
            let child_target = format!("{target}/{}", n.to_string_lossy());
            let (child, ca) = match src.child(&n) {
                Ok(x) => x,
                Err(e) => {
                    self.fail(&child_shown, e);
                    continue;
                }
            };
            if ca.is_dir() && self.made.contains(&(src_side, ca.ino)) {
                eprintln!("zcfs cp: warning: not copying {child_shown} into itself");
                continue;
            }
            let there = match to.child(&n) {
                Ok(x) => Some(x),
                Err(e) if e.errno == libc::ENOENT => None,
                Err(e) => {
                    self.fail(&child_target, e);
                    continue;
                }
            };
            self.entry(
                remotes,
                &child,
                &ca,
                &child_shown,
                &to,
                &n,
                there,
                &child_target,
            );
        }
        if let Err(e) = to.finish(&self.finish(sa, made)) {
            self.fail(target, e);
        }
    }

    fn symlink(
        &mut self,
        src: &Node<'a>,
        dir: &Node<'a>,
        name: &OsStr,
        existing: Option<(Node<'a>, Attr)>,
    ) -> zcfs_backend::Result<()> {
        let target = src.readlink()?;
        match existing {
            Some((_, a)) if a.is_dir() => {
                return Err(Error::new(
                    libc::EISDIR,
                    "cannot overwrite a directory with a symlink",
                ))
            }
            Some(_) => dir.unlink(name)?,
            None => {}
        }
        dir.symlink(name, &target)
    }

    fn bar(&self, shown: &str, size: u64) -> indicatif::ProgressBar {
        if !self.progress {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::with_draw_target(
            Some(size),
            indicatif::ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:30!} {bytes:>10} / {total_bytes:<10} {binary_bytes_per_sec:>12} {eta:>4} {wide_bar}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(shown.to_string());
        bar
    }
}

/// Whether two nodes are one file: the same inode on the same server, or on the same
/// local device.
fn same_file(a: (&Node<'_>, &Attr), b: (&Node<'_>, &Attr)) -> bool {
    use std::os::unix::fs::MetadataExt;
    if a.1.ino != b.1.ino {
        return false;
    }
    match (a.0, b.0) {
        (Node::Local(x), Node::Local(y)) => {
            // The device of what the attributes describe: a symlink's own, or (it was
            // followed) its target's, which may be on another file system.
            let dev = |p: &PathBuf, at: &Attr| {
                if at.kind() == libc::S_IFLNK {
                    std::fs::symlink_metadata(p)
                } else {
                    std::fs::metadata(p)
                }
                .map(|m| m.dev())
                .ok()
            };
            dev(x, a.1).is_some() && dev(x, a.1) == dev(y, b.1)
        }
        (Node::Remote(_), Node::Remote(_)) => a.0.same_server(b.0),
        _ => false,
    }
}

pub fn kind_name(kind: u32) -> &'static str {
    match kind {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        _ => "file of unknown kind",
    }
}

pub fn run(a: &CpArgs) -> Result<i32> {
    let Some((dst, srcs)) = a.operands.split_last() else {
        bail!("cp needs SRC... DST");
    };
    let dst = Location::parse(dst)?;
    let srcs = srcs
        .iter()
        .map(|s| Location::parse(s))
        .collect::<Result<Vec<_>>>()?;
    let umask = process_umask();
    let all: Vec<&Location> = srcs.iter().chain([&dst]).collect();
    let remotes = connect_all(&all, a.secret_file.as_deref(), umask)?;
    // Where the copies go: into DST when it is a directory, else DST itself (one SRC).
    // With one SRC, what is wrong with DST is that file's failure (reported below).
    let into = match resolve(&remotes, &dst, true) {
        Ok((n, at)) if at.is_dir() => Some(n),
        _ if srcs.len() == 1 => None,
        Ok(_) => {
            eprintln!("zcfs cp: {dst} is not a directory (several SRCs need one)");
            return Ok(1);
        }
        Err(e) => {
            eprintln!("zcfs cp: {dst}: {e} (several SRCs need an existing directory)");
            return Ok(1);
        }
    };
    let mut c = Copier {
        recursive: a.recursive,
        preserve: a.preserve,
        umask,
        failed: 0,
        progress: std::io::stderr().is_terminal(),
        made: HashSet::new(),
    };
    for src in &srcs {
        let shown = src.to_string();
        let (node, sa) = match resolve(&remotes, src, !a.recursive) {
            Ok(x) => x,
            Err(e) => {
                c.fail(&shown, e);
                continue;
            }
        };
        let Some(name) = last_name(src) else {
            c.fail(&shown, "names no file to copy to (give DST as a new name)");
            continue;
        };
        let (dir, name, existing, target) = match &into {
            Some(d) => {
                let there = match d.child(&name) {
                    Ok(x) => Some(x),
                    Err(e) if e.errno == libc::ENOENT => None,
                    Err(e) => {
                        c.fail(&format!("{dst}/{}", name.to_string_lossy()), e);
                        continue;
                    }
                };
                let target = format!("{}/{}", dst, name.to_string_lossy());
                (None, name, there, target)
            }
            None => {
                let Some(dname) = last_name(&dst) else {
                    c.fail(&dst.to_string(), "names no file to create");
                    continue;
                };
                let pdir = match resolve(&remotes, &parent(&dst), true) {
                    Ok((n, pa)) if pa.is_dir() => n,
                    Ok(_) => {
                        c.fail(&dst.to_string(), Error::errno(libc::ENOTDIR));
                        continue;
                    }
                    Err(e) => {
                        c.fail(&dst.to_string(), e);
                        continue;
                    }
                };
                let there = match resolve(&remotes, &dst, true) {
                    Ok(x) => Some(x),
                    Err(e) if e.errno == libc::ENOENT => None,
                    Err(e) => {
                        c.fail(&dst.to_string(), e);
                        continue;
                    }
                };
                (Some(pdir), dname, there, dst.to_string())
            }
        };
        let dir = dir
            .as_ref()
            .or(into.as_ref())
            .expect("a directory to copy into");
        c.entry(&remotes, &node, &sa, &shown, dir, &name, existing, &target);
    }
    Ok(if c.failed > 0 { 1 } else { 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(s: &str) -> Location {
        Location::parse(s).unwrap()
    }

    #[test]
    fn last_names_and_parents_of_operands() {
        for (s, name, dir) in [
            ("a/b/c", Some("c"), "a/b"),
            ("a/b/c/", Some("c"), "a/b"),
            ("c", Some("c"), "."),
            ("/c", Some("c"), "/"),
            ("h:1:/x/y", Some("y"), "h:1:/x"),
            ("h:1:/y", Some("y"), "h:1:/"),
            ("h:1:/", None, "h:1:/"),
            ("/", None, "/"),
            ("a/..", None, "a"),
            ("a/.", None, "a"),
        ] {
            let l = loc(s);
            assert_eq!(
                last_name(&l).map(|n| n.to_string_lossy().into_owned()),
                name.map(String::from),
                "{s}"
            );
            assert_eq!(parent(&l).to_string(), dir, "{s}");
        }
    }
}
