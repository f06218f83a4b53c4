//! `zcfs-bench netns`: the namespace helper (crate zcfs-netns) for shell scripts, so
//! `scripts/bench.sh` uses the same code as this harness and the integration tests.

use anyhow::{bail, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use zcfs_netns::{owned_name, teardown, Netns, Pair, LANE_CLI_IF, LANE_SRV_IF};

#[derive(clap::Subcommand)]
pub enum NetnsCmd {
    /// Create two namespaces joined by a veth pair (or one with --alone) and print shell
    /// assignments for `eval`: SRV, CLI, SRV_IP, CLI_IP (NS with --alone; with
    /// --lane-pair also SRV_LANE_IF, CLI_LANE_IF). They stay until `down`, or until a
    /// `sweep` (or the next namespace made) after OWNER has exited.
    Up {
        /// The pid of the process responsible for them (a script passes `$$`).
        #[arg(long)]
        owner: u32,
        /// What they are for; part of their names, zcfs-OWNER-LABEL[-srv|-cli].
        #[arg(long)]
        label: String,
        /// Addresses 198.18.SUBNET.1 (server side) and .2 (client side).
        #[arg(long, default_value_t = 200)]
        subnet: u8,
        /// Shape both directions with tc tbf, e.g. 1gbit.
        #[arg(long)]
        tbf: Option<String>,
        /// One namespace with only its loopback.
        #[arg(long, conflicts_with_all = ["tbf", "queues"])]
        alone: bool,
        /// RX and TX queues of each veth end (2 for the layer-2 lane: `--l2`).
        #[arg(long, default_value_t = 1)]
        queues: u32,
        /// Also a second veth pair between the two, two queues per end and no addresses,
        /// for a layer-2 lane on an interface of its own (`--l2 veth-lane-srv` and
        /// `--l2 veth-lane-cli`); TCP keeps to the first pair.
        #[arg(long, conflicts_with = "alone")]
        lane_pair: bool,
    },
    /// Run a program inside a namespace: this process enters the network namespace only
    /// (as `nsenter --net` does, so mounts stay visible) and becomes the program.
    Exec {
        name: String,
        /// The program and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<OsString>,
    },
    /// Remove namespaces by name: the processes still inside are stopped first.
    Down { names: Vec<String> },
    /// Remove the namespaces whose owner has exited (left by a crash); prints their names.
    Sweep,
}

pub fn run(cmd: NetnsCmd) -> Result<()> {
    match cmd {
        NetnsCmd::Up {
            owner,
            label,
            subnet,
            tbf,
            alone,
            queues,
            lane_pair,
        } => {
            let base = owned_name(owner, &label);
            if alone {
                let ns = Netns::create(&base)?;
                println!("NS={}", ns.keep());
                return Ok(());
            }
            let pair = Pair::create_with_queues(&base, subnet, queues)?;
            if let Some(rate) = &tbf {
                pair.shape(rate)?;
            }
            let lane = if lane_pair {
                pair.add_lane_link()?;
                format!(" SRV_LANE_IF={LANE_SRV_IF} CLI_LANE_IF={LANE_CLI_IF}")
            } else {
                String::new()
            };
            let (srv_ip, cli_ip) = (pair.srv_ip, pair.cli_ip);
            let (srv, cli) = pair.keep();
            println!("SRV={srv} CLI={cli} SRV_IP={srv_ip} CLI_IP={cli_ip}{lane}");
            Ok(())
        }
        NetnsCmd::Exec { name, command } => {
            let ns = Netns::open(&name)?;
            let err = ns.command(&command[0]).args(&command[1..]).exec();
            bail!("{}: {err}", command[0].to_string_lossy())
        }
        NetnsCmd::Down { names } => {
            let mut failed = Vec::new();
            for n in &names {
                if let Err(e) = teardown(n) {
                    eprintln!("{n}: {e}");
                    failed.push(n.as_str());
                }
            }
            if !failed.is_empty() {
                bail!("not removed: {}", failed.join(" "));
            }
            Ok(())
        }
        NetnsCmd::Sweep => {
            for n in zcfs_netns::sweep() {
                println!("{n}");
            }
            Ok(())
        }
    }
}
