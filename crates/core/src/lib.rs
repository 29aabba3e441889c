//! scalevfs: a multicore-scalable virtual filesystem engine.
#![warn(missing_debug_implementations)]

pub mod errno;

pub use errno::{Errno, VfsResult};
