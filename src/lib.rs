//! The `commscope` command: everything behind `main.rs`, so it can be tested.
//!
//! - [`cli`]: flags and dispatch.
//! - [`run`]: `commscope run`, the launcher wrapper that preloads the shim into every rank.
//! - [`traces`]: loading trace files of every supported format, grouped by job.
//! - [`summary`]: `commscope trace summary`.
//! - [`postmortem`]: `commscope report` and `commscope export perfetto`.
//! - [`demo`]: `commscope demo`.
//! - [`daemons`], [`config`]: `commscope agent`, `collector`, `up` and their settings.
//! - [`simulate`]: `commscope simulate`, a synthetic job with injected faults.
//! - [`tui`]: `commscope tui`, live on a collector or replaying traces.
#![deny(unsafe_code)] // one exception: forwarding signals to the child in `run`

pub mod cli;
pub mod config;
pub mod daemons;
pub mod demo;
pub mod postmortem;
pub mod run;
pub mod simulate;
pub mod summary;
pub mod traces;
pub mod tui;
