//! `zcfs fsck IMAGE [--repair] [--json]`. Exit status: 0 clean, 1 problems all repaired,
//! 4 problems left (8, the check could not run, comes from `main`).

use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct FsckArgs {
    image: PathBuf,
    /// Repair what is safe to repair (link counts, block counts, orphan inodes).
    #[arg(long)]
    repair: bool,
    #[arg(long)]
    json: bool,
}

pub fn run(a: &FsckArgs) -> Result<i32> {
    let image = a.image.as_path();
    let report = zcfs_volume::fsck::fsck_path(image, a.repair)
        .with_context(|| format!("checking {}", image.display()))?;
    let code = if report.is_clean() {
        if report.repaired.is_empty() {
            0
        } else {
            1
        }
    } else {
        4
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(code);
    }
    println!(
        "{}: {} inodes ({} directories, {} files, {} symlinks), {} blocks in use, {} log entries replayed",
        image.display(),
        report.inodes,
        report.directories,
        report.files,
        report.symlinks,
        report.blocks_used,
        report.entries_replayed
    );
    for n in &report.notes {
        println!("note: {n}");
    }
    for r in &report.repaired {
        println!("repaired: {r}");
    }
    for p in &report.problems {
        println!("PROBLEM: {p}");
    }
    if report.is_clean() {
        println!("clean");
    } else {
        println!(
            "{} problem(s){}",
            report.problems.len(),
            if a.repair {
                " left after repair"
            } else {
                "; run with --repair to fix what is safe to fix"
            }
        );
    }
    Ok(code)
}
