//! A same-host service on a fresh /dev/shm volume image, run in this process: the
//! harness of crates/samehost's tests, shared rather than copied.
#![allow(unused_imports)]

#[path = "../../../samehost/tests/common/mod.rs"]
mod samehost_common;

pub use samehost_common::*;
