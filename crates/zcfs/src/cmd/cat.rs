//! `zcfs cat OPERAND...`: files on servers (`HOST:PORT:/path`; local paths too) to
//! standard output, in order, through the client library with several reads in flight.

use crate::cmd::cp::{parse_and_connect, resolve};
use crate::files::StreamSink;
use crate::pipeline::{copy_data, CHUNK_MAX, WINDOW};
use anyhow::Result;
use std::path::PathBuf;
use zcfs_backend::Error;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
An operand is HOST:PORT:/path ([::1]:PORT:/path for IPv6) or a local path. Symlinks are \
followed. Exit status: 0 all written, 1 some operand failed (reported, the others are \
written), 8 a bad operand or a server that cannot be reached.")]
pub struct CatArgs {
    /// Shared secret for servers that require one.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    #[arg(required = true, value_name = "HOST:PORT:/path")]
    operands: Vec<String>,
}

pub fn run(a: &CatArgs) -> Result<i32> {
    let (locs, remotes) = parse_and_connect(&a.operands, a.secret_file.as_deref())?;
    let mut out = StreamSink(std::io::stdout().lock());
    let mut failed = 0;
    for l in &locs {
        let r = (|| -> zcfs_backend::Result<()> {
            let (node, attr) = resolve(&remotes, l, true)?;
            if attr.is_dir() {
                return Err(Error::errno(libc::EISDIR));
            }
            let mut reader = node.open_read()?;
            let chunk = CHUNK_MAX.min(node.max_io()?);
            copy_data(&mut reader, &mut out, attr.size, chunk, WINDOW, &mut |_| ())?;
            Ok(())
        })();
        match r {
            Ok(()) => {}
            // The reader went away (`zcfs cat ... | head`): nothing more to say.
            Err(e) if e.errno == libc::EPIPE => return Ok(1),
            Err(e) => {
                eprintln!("zcfs cat: {l}: {e}");
                failed += 1;
            }
        }
    }
    use std::io::Write;
    if let Err(e) = out.0.flush() {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("zcfs cat: standard output: {e}");
        }
        return Ok(1);
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
