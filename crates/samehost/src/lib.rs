//! zcfs same-host interface: applications on the server's host reach the volume
//! without FUSE or sockets on the data path (issue 13; docs/samehost.md).
//!
//! An application connects to the server's same-host Unix socket ([`server::Service`];
//! its identity comes from SO_PEERCRED), sets up a submission and a completion ring in
//! a shared memfd with an eventfd doorbell each way (ring.rs), registers memfd buffers
//! and opens files (proto.rs), then submits requests on the ring. Two modes:
//!
//! - **shared buffer** (any user): READ and WRITE name a place in a registered buffer;
//!   the server copies between PM and the buffer (one copy per byte).
//! - **direct map** (trusted: root, the image's owner, a configured group): the image
//!   is mapped read-only in the application; READ_EXTENTS returns where a file's bytes
//!   are, leased until released (zero copies); RESERVE hands out fresh blocks the
//!   application fills through a writable window, and COMMIT places them into files
//!   atomically (FLAC's pflush).
//!
//! The application side is [`client::Client`].

pub mod client;
pub mod proto;
pub mod ring;
pub mod server;

pub use server::{Service, ServiceConfig, ServiceError, StatsSnapshot};
