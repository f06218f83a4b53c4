//! One module per subcommand. None uses another: what two of them share lives in the
//! modules beside `main.rs`.

pub mod cat;
pub mod cp;
pub mod fsck;
pub mod helper;
pub mod ls;
pub mod mkfs;
pub mod mount;
pub mod selftest;
pub mod serve;
pub mod stat;
