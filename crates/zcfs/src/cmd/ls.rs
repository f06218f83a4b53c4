//! `zcfs ls [-l] [-a] OPERAND...`: a directory's names on a server (`HOST:PORT:/path`;
//! local paths too), or with -l mode, links, owner, group, size, mtime and name as
//! `ls -ln` shows them; a file operand lists itself.

use crate::cmd::cp::{parse_and_connect, resolve};
use crate::files::Node;
use anyhow::Result;
use std::ffi::OsString;
use std::path::PathBuf;
use zcfs_backend::Attr;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
An operand is HOST:PORT:/path ([::1]:PORT:/path for IPv6) or a local path. Names are \
sorted bytewise; owners and groups are shown as numbers (ids on a server need not be \
this machine's users). Exit status: 0 all listed, 1 some operand failed, 8 a bad operand \
or a server that cannot be reached.")]
pub struct LsArgs {
    /// Long listing: mode, links, owner, group, size, modification time, name.
    #[arg(short = 'l')]
    long: bool,
    /// Also names that begin with a dot.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Shared secret for servers that require one.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    #[arg(required = true, value_name = "HOST:PORT:/path")]
    operands: Vec<String>,
}

/// One line of a listing: the name shown, its attributes, a symlink's target.
struct Row {
    name: String,
    attr: Attr,
    link: Option<String>,
}

pub fn run(a: &LsArgs) -> Result<i32> {
    let (locs, remotes) = parse_and_connect(&a.operands, a.secret_file.as_deref())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let mut failed = 0;
    for (i, l) in locs.iter().enumerate() {
        let r = (|| -> zcfs_backend::Result<String> {
            // A symlink operand lists itself with -l, its target (a directory's
            // entries) without, as ls does.
            let (node, attr) = resolve(&remotes, l, !a.long)?;
            let mut out = String::new();
            if attr.is_dir() {
                if locs.len() > 1 {
                    out += &format!("{}{l}:\n", if i > 0 { "\n" } else { "" });
                }
                let rows = entries(&node, a.all, a.long)?;
                if a.long {
                    let total: u64 = rows.iter().map(|r| r.attr.blocks).sum::<u64>() / 2;
                    out += &format!("total {total}\n");
                }
                out += &format_rows(&rows, a.long, now);
            } else {
                let link = if a.long && attr.kind() == libc::S_IFLNK {
                    Some(String::from_utf8_lossy(&node.readlink()?).into_owned())
                } else {
                    None
                };
                let row = Row {
                    name: l.to_string(),
                    attr,
                    link,
                };
                out += &format_rows(&[row], a.long, now);
            }
            Ok(out)
        })();
        match r {
            Ok(s) => print!("{s}"),
            Err(e) => {
                eprintln!("zcfs ls: {l}: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

fn entries(dir: &Node<'_>, all: bool, long: bool) -> zcfs_backend::Result<Vec<Row>> {
    let names: Vec<OsString> = dir.list()?;
    let mut rows = Vec::new();
    for n in names {
        let name = n.to_string_lossy().into_owned();
        if !all && name.starts_with('.') {
            continue;
        }
        if !long {
            rows.push(Row {
                name,
                attr: Attr::default(),
                link: None,
            });
            continue;
        }
        let (node, attr) = match dir.child(&n) {
            Ok(x) => x,
            // Gone since it was listed.
            Err(e) if e.errno == libc::ENOENT => continue,
            Err(e) => return Err(e),
        };
        let link = if attr.kind() == libc::S_IFLNK {
            Some(String::from_utf8_lossy(&node.readlink()?).into_owned())
        } else {
            None
        };
        rows.push(Row { name, attr, link });
    }
    Ok(rows)
}

fn format_rows(rows: &[Row], long: bool, now: i64) -> String {
    if !long {
        return rows.iter().map(|r| format!("{}\n", r.name)).collect();
    }
    let width =
        |f: &dyn Fn(&Attr) -> String| rows.iter().map(|r| f(&r.attr).len()).max().unwrap_or(0);
    let (wl, wu, wg, ws) = (
        width(&|a| a.nlink.to_string()),
        width(&|a| a.uid.to_string()),
        width(&|a| a.gid.to_string()),
        width(&|a| a.size.to_string()),
    );
    let mut out = String::new();
    for r in rows {
        let a = &r.attr;
        out += &format!(
            "{} {:>wl$} {:>wu$} {:>wg$} {:>ws$} {} {}",
            mode_string(a.mode),
            a.nlink,
            a.uid,
            a.gid,
            a.size,
            time_string(a.mtime.sec, now),
            r.name
        );
        if let Some(t) = &r.link {
            out += &format!(" -> {t}");
        }
        out.push('\n');
    }
    out
}

/// `-rwxr-sr-t` and the like, as ls shows a mode.
pub fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        _ => '-',
    };
    let bit = |b: u32, c: char| if mode & b != 0 { c } else { '-' };
    let exec = |x: u32, special: u32, set: char| match (mode & x != 0, mode & special != 0) {
        (true, true) => set,
        (false, true) => set.to_ascii_uppercase(),
        (true, false) => 'x',
        (false, false) => '-',
    };
    [
        kind,
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        exec(0o100, 0o4000, 's'),
        bit(0o040, 'r'),
        bit(0o020, 'w'),
        exec(0o010, 0o2000, 's'),
        bit(0o004, 'r'),
        bit(0o002, 'w'),
        exec(0o001, 0o1000, 't'),
    ]
    .iter()
    .collect()
}

/// Half a year, as ls counts it: older (or future) times show the year, not the time.
const RECENT_SECS: i64 = 365 * 24 * 3600 / 2;

/// `Jan  2 15:04` for a time in the last half year, `Jan  2  2024` otherwise, in the
/// local time zone.
pub fn time_string(sec: i64, now: i64) -> String {
    let recent = sec <= now && now - sec < RECENT_SECS;
    let fmt: &[u8] = if recent {
        b"%b %e %H:%M\0"
    } else {
        b"%b %e  %Y\0"
    };
    let t = sec as libc::time_t;
    // SAFETY: an all-zero tm is a valid value for localtime_r to overwrite.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals of the right types.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return sec.to_string();
    }
    let mut buf = [0u8; 64];
    // SAFETY: the buffer's length is passed; the format is NUL-terminated; tm was
    // filled by localtime_r.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr().cast(), &tm) };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_as_ls_shows_them() {
        for (m, s) in [
            (libc::S_IFREG | 0o644, "-rw-r--r--"),
            (libc::S_IFDIR | 0o755, "drwxr-xr-x"),
            (libc::S_IFLNK | 0o777, "lrwxrwxrwx"),
            (libc::S_IFREG | 0o4755, "-rwsr-xr-x"),
            (libc::S_IFREG | 0o2644, "-rw-r-Sr--"),
            (libc::S_IFDIR | 0o1777, "drwxrwxrwt"),
            (libc::S_IFDIR | 0o1776, "drwxrwxrwT"),
            (libc::S_IFIFO, "p---------"),
        ] {
            assert_eq!(mode_string(m), s, "{m:o}");
        }
    }

    #[test]
    fn times_within_half_a_year_show_the_clock_older_the_year() {
        let now = 1_700_000_000;
        let recent = time_string(now - 3600, now);
        assert!(recent.contains(':'), "{recent}");
        let old = time_string(now - RECENT_SECS - 1, now);
        assert!(!old.contains(':') && old.ends_with("2023"), "{old}");
        let future = time_string(now + 86400 * 400, now);
        assert!(
            future.ends_with("2024") || future.ends_with("2025"),
            "{future}"
        );
    }
}
