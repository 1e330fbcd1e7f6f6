//! The `commscope` command: everything behind `main.rs`, so it can be tested.
//!
//! - [`cli`]: flags and dispatch.
//! - [`run`]: `commscope run`, the launcher wrapper that preloads the shim into every rank.
//! - [`traces`]: loading trace files of every supported format, grouped by job.
//! - [`summary`]: `commscope trace summary`.
//! - [`demo`]: `commscope demo`.
#![deny(unsafe_code)] // one exception: forwarding signals to the child in `run`

pub mod cli;
pub mod demo;
pub mod run;
pub mod summary;
pub mod traces;
