//! zcfs's XDP program (bpf/zcfs_xdp.c, built by build.rs): loaded and attached with aya,
//! its XSKMAP filled with the sockets of the queues it steers to.

use std::os::fd::AsRawFd;

use aya::maps::{MapData, XskMap};
use aya::programs::{ProgramError, Xdp, XdpMode};
use aya::Ebpf;

use crate::{XskError, XskSocket};

/// Entries of the program's XSKMAP, one per RX queue (`XSKMAP_ENTRIES` in zcfs_xdp.c).
pub const XSKMAP_ENTRIES: u32 = 64;
/// The program's name in the object (its function).
const PROGRAM: &str = "zcfs_xdp";
/// The XSKMAP's name in the object.
const MAP: &str = "zcfs_xsks";

/// The object build.rs compiled (empty when clang was missing).
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/zcfs_xdp.o"));

/// Whether this build carries the XDP program (false: built without clang).
pub fn xdp_object_available() -> bool {
    !OBJECT.is_empty()
}

/// Where the program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver, before an skb exists (native XDP).
    Driver,
    /// In the stack, after the skb is built (generic XDP: every driver, slower).
    Skb,
}

/// zcfs's XDP program attached to one interface. Detached (and unloaded) on drop.
pub struct XdpProgram {
    map: XskMap<MapData>,
    mode: AttachMode,
    ifname: String,
    // Last: holds the program and its link; dropping it detaches.
    _ebpf: Ebpf,
}

impl std::fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpProgram")
            .field("ifname", &self.ifname)
            .field("mode", &self.mode)
            .finish()
    }
}

/// Whether an attach failure says that a program is there already.
fn busy(e: &ProgramError) -> bool {
    match e {
        ProgramError::SyscallError(s) => {
            matches!(s.io_error.raw_os_error(), Some(libc::EBUSY | libc::EEXIST))
        }
        other => {
            let msg = other.to_string();
            msg.contains("Device or resource busy") || msg.contains("File exists")
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

impl XdpProgram {
    /// Load zcfs's program and attach it to `ifname` (in the calling thread's network
    /// namespace), in driver mode if the driver has native XDP, else in generic mode.
    /// An interface that already has an XDP program (zcfs's or another) is an error.
    pub fn attach(ifname: &str) -> Result<XdpProgram, XskError> {
        if !xdp_object_available() {
            return Err(XskError::NoXdpObject);
        }
        crate::socket::ifindex(ifname)?;
        let mut ebpf = Ebpf::load(OBJECT).map_err(|e| XskError::Load(chain(&e)))?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| XskError::Load(format!("the object has no program {PROGRAM}")))?
            .try_into()
            .map_err(|e: ProgramError| XskError::Load(chain(&e)))?;
        prog.load().map_err(|e| XskError::Load(chain(&e)))?;
        let mode = match prog.attach(ifname, XdpMode::Driver) {
            Ok(_) => AttachMode::Driver,
            Err(e) if busy(&e) => {
                return Err(XskError::AlreadyAttached {
                    name: ifname.to_string(),
                    mode: "driver mode",
                })
            }
            Err(ProgramError::UnknownInterface { name }) => {
                return Err(XskError::NoInterface { name })
            }
            Err(driver) => match prog.attach(ifname, XdpMode::Skb) {
                Ok(_) => AttachMode::Skb,
                Err(e) if busy(&e) => {
                    return Err(XskError::AlreadyAttached {
                        name: ifname.to_string(),
                        mode: "generic mode",
                    })
                }
                Err(skb) => {
                    return Err(XskError::Attach {
                        name: ifname.to_string(),
                        driver: chain(&driver),
                        skb: chain(&skb),
                    })
                }
            },
        };
        let map = ebpf
            .take_map(MAP)
            .ok_or_else(|| XskError::Load(format!("the object has no map {MAP}")))?;
        let map = XskMap::try_from(map).map_err(|e| XskError::Load(chain(&e)))?;
        Ok(XdpProgram {
            map,
            mode,
            ifname: ifname.to_string(),
            _ebpf: ebpf,
        })
    }

    /// Steer zcfs's frames arriving on `queue` to `socket` (which must be bound to that
    /// queue of this interface, else the kernel drops them).
    pub fn register(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XskError> {
        if queue >= XSKMAP_ENTRIES {
            return Err(XskError::QueueOutOfRange {
                queue,
                max: XSKMAP_ENTRIES,
            });
        }
        self.map
            .set(queue, socket.as_raw_fd(), 0)
            .map_err(|e| XskError::Register {
                queue,
                reason: chain(&e),
            })
    }

    /// Stop steering `queue`'s frames to a socket (they are dropped from then on).
    pub fn unregister(&mut self, queue: u32) -> Result<(), XskError> {
        if queue >= XSKMAP_ENTRIES {
            return Err(XskError::QueueOutOfRange {
                queue,
                max: XSKMAP_ENTRIES,
            });
        }
        self.map.unset(queue).map_err(|e| XskError::Register {
            queue,
            reason: chain(&e),
        })
    }

    /// Whether the program runs in the driver or in the stack.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// The interface it is attached to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }
}
