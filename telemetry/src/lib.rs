//! commscope's own telemetry, shared by the collector, the agent and the command line:
//!
//! - [`metrics`]: one Prometheus registry per process (the `prometheus` crate), with a catalog of
//!   families filled at scrape time from the process's state, and the check that keeps
//!   `docs/metrics.md` true to it;
//! - [`logging`]: logs through `tracing`, filtered by `COMMSCOPE_LOG`, as text or JSON.
#![forbid(unsafe_code)]

pub mod logging;
pub mod metrics;
