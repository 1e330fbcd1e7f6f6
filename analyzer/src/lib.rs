//! The commscope analyzer: findings in the contract's shape ([`finding`]) and the detectors.
//!
//! - [`stream`]: the instance detectors (slow-rank, degraded-collective, mismatch, comm-error),
//!   fed one completed call at a time in time order — live in the collector, and from a trace.
//! - [`links`]: slow-link, from the per-link step timing of NCCL's profiler plugin.
//! - [`reorder`]: puts live records, delivered in per-process bursts, back into time order.
//! - [`batch`]: what `commscope analyze` runs over a job's trace: the instance detectors plus
//!   `hang` (root culprits along the wait chain) and `dead-rank`.
#![forbid(unsafe_code)]

pub mod batch;
pub mod finding;
pub mod links;

pub use batch::{Thresholds, analyze};
pub use finding::{Finding, Kind};
pub mod reorder;
pub mod stream;
