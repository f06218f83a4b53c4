//! The errors of AF_XDP sockets and the XDP program.

use std::io;

#[derive(Debug, thiserror::Error)]
pub enum XskError {
    #[error("zcfs was built without clang: the layer-2 transport is unavailable (apt-get install clang llvm, then rebuild)")]
    NoXdpObject,
    #[error("no network interface {name:?} in this network namespace")]
    NoInterface { name: String },
    #[error("{name}: another XDP program is already attached ({mode}); detach it first (ip link set dev {name} xdp off)")]
    AlreadyAttached { name: String, mode: &'static str },
    #[error("loading zcfs's XDP program failed: {0}")]
    Load(String),
    #[error("attaching zcfs's XDP program to {name} failed in driver mode ({driver}) and in generic (skb) mode ({skb})")]
    Attach {
        name: String,
        driver: String,
        skb: String,
    },
    #[error("registering the AF_XDP socket for queue {queue} in the XSKMAP failed: {reason}")]
    Register { queue: u32, reason: String },
    #[error("queue {queue} is beyond the XDP program's XSKMAP ({max} entries)")]
    QueueOutOfRange { queue: u32, max: u32 },
    #[error("creating an AF_XDP socket needs CAP_NET_RAW (root): {source}")]
    Permission { source: io::Error },
    #[error("this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS)")]
    NoAfXdp,
    #[error(
        "registering {len} bytes as AF_XDP UMEM failed with ENOBUFS: the pinned pages exceed \
         RLIMIT_MEMLOCK; needs CAP_IPC_LOCK or a higher ulimit -l"
    )]
    MemlockLimit { len: usize },
    #[error(
        "registering {len} bytes as AF_XDP UMEM failed (the kernel cannot pin them for writing: \
         page-cache files such as ext4 or xfs are refused; use tmpfs, hugetlbfs or device-dax): {source}"
    )]
    UmemPin { len: usize, source: io::Error },
    #[error(
        "binding the AF_XDP socket to interface index {ifindex} queue {queue} failed: {source}"
    )]
    Bind {
        ifindex: u32,
        queue: u32,
        source: io::Error,
    },
    #[error("a socket sharing a UMEM needs a queue of its own; queue {queue} is the first socket's (it shares that socket's fill ring)")]
    SameQueue { queue: u32 },
    #[error("TX frame at {addr} is not at a multiple of {align} (its completion would come back with another address)")]
    UnalignedTx { addr: u64, align: u64 },
    #[error("{what}: {source}")]
    Sys {
        what: &'static str,
        source: io::Error,
    },
}

impl XskError {
    pub(crate) fn sys(what: &'static str, source: io::Error) -> XskError {
        XskError::Sys { what, source }
    }
}
