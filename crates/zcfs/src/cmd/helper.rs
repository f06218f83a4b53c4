//! mount(8)'s helper: `zcfs install-helper` links /sbin/mount.fuse.zcfs to this binary,
//! and run under that name the binary takes mount(8)'s arguments, which
//! [`as_mount_command`] turns into the `zcfs mount --daemon` command they stand for.

use anyhow::{anyhow, Context, Result};
use std::ffi::OsString;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct InstallHelperArgs {
    #[arg(long, default_value = "/sbin/mount.fuse.zcfs")]
    path: PathBuf,
}

pub fn install(a: &InstallHelperArgs) -> Result<i32> {
    let path = &a.path;
    let exe = std::env::current_exe()?;
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink(&exe, path)
        .with_context(|| format!("linking {} to {}", path.display(), exe.display()))?;
    println!(
        "{} -> {}: `mount -t fuse.zcfs SOURCE MOUNTPOINT -o OPTIONS` and fstab lines now work",
        path.display(),
        exe.display()
    );
    Ok(0)
}

/// `mount.fuse.zcfs SOURCE MOUNTPOINT [-o OPTS]... [-n -s -v -f -i]`, as mount(8) calls it
/// for `-t fuse.zcfs` and fstab lines, to `zcfs mount --daemon -o=OPTS... -- SOURCE
/// MOUNTPOINT`. `-o=` and `--` keep a value that starts with `-` from being read as an
/// option; `argv[0]` stays.
pub fn as_mount_command(argv: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut argv = argv.into_iter();
    let argv0 = argv.next().unwrap_or_default();
    let mut positional = Vec::new();
    let mut options = Vec::new();
    while let Some(x) = argv.next() {
        let x = x
            .into_string()
            .map_err(|x| anyhow!("{}: not UTF-8", x.to_string_lossy()))?;
        match x.as_str() {
            "-o" => options.push(
                argv.next()
                    .and_then(|o| o.into_string().ok())
                    .ok_or_else(|| anyhow!("-o needs a value"))?,
            ),
            // mount(8)'s -n (no mtab), -s (sloppy), -v (verbose), -f (fake), -i (no helper).
            "-n" | "-s" | "-v" | "-f" | "-i" => {}
            _ if x.starts_with("-o") => options.push(x[2..].to_string()),
            _ => positional.push(x),
        }
    }
    let [source, mountpoint] = <[String; 2]>::try_from(positional)
        .map_err(|_| anyhow!("usage: mount.fuse.zcfs SOURCE MOUNTPOINT [-o OPTIONS]"))?;
    let mut command = vec![argv0, "mount".into(), "--daemon".into()];
    command.extend(options.into_iter().map(|o| format!("-o={o}").into()));
    command.extend(["--".into(), source.into(), mountpoint.into()]);
    Ok(command)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(args: &[&str]) -> Result<Vec<String>> {
        let argv = std::iter::once("/sbin/mount.fuse.zcfs")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        Ok(as_mount_command(argv)?
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect())
    }

    #[test]
    fn mount_helper_arguments_become_a_daemon_mount() {
        assert_eq!(
            call(&[
                "/dev/shm/v.img",
                "/mnt/z",
                "-o",
                "rw,_netdev",
                "-n",
                "-oallow_other"
            ])
            .unwrap(),
            [
                "/sbin/mount.fuse.zcfs",
                "mount",
                "--daemon",
                "-o=rw,_netdev",
                "-o=allow_other",
                "--",
                "/dev/shm/v.img",
                "/mnt/z"
            ]
        );
        assert!(call(&["a", "b", "-o"])
            .unwrap_err()
            .to_string()
            .contains("-o needs a value"));
        for wrong in [&[][..], &["a"], &["a", "b", "c"]] {
            assert!(call(wrong).unwrap_err().to_string().starts_with("usage:"));
        }
    }
}
