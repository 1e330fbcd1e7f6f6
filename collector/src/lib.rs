//! The commscope collector: ingests record batches from node agents, keeps per-job state, runs
//! the analyzer continuously and serves findings, metrics and the query API.
//!
//! Nothing is implemented yet; the `commscope collector` command does not exist until it is.
#![forbid(unsafe_code)]
