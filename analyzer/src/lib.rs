//! The commscope analyzer: findings in the contract's shape ([`finding`]) and the detectors.
//!
//! - [`stream`]: the instance detectors (slow-rank, degraded-collective, mismatch, comm-error),
//!   fed one completed call at a time in time order — live in the collector, and from a trace.
//! - [`links`]: slow-link, from the per-link step timing of NCCL's profiler plugin.
//! - [`flows`]: slow-link, from the TCP flows of the node agents' transport view (eBPF).
//! - [`reorder`]: puts live records, delivered in per-process bursts, back into time order.
//! - [`view`]: one view of a job (members, progress, calls in flight, how processes stand),
//!   built live by the collector and from a trace by [`replay`].
//! - [`detectors`]: `hang` and `dead-rank` over that view, one finding per root cause.
//! - [`batch`]: what `commscope analyze` runs over a job's trace.
//! - [`postmortem`]: what `commscope report` draws from a trace and its analysis.
#![forbid(unsafe_code)]

/// A hash map for the detectors' hot paths: foldhash, seeded per process (std's SipHash was
/// a twentieth of a large trace's analysis).
pub(crate) type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

pub mod aggregate;
pub mod batch;
pub mod detectors;
pub mod finding;
pub mod flows;
pub mod large;
pub mod lateness;
pub mod link_errors;
pub mod links;
pub mod nic;
pub mod postmortem;

pub use batch::{Analysis, Thresholds, analysis, analysis_at, analyze};
pub use finding::{Finding, Kind};
pub mod reorder;
pub mod replay;
pub mod stream;
pub mod view;
