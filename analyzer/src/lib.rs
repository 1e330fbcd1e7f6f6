//! The commscope analyzer: findings in the contract's shape ([`finding`]) and the detectors.
//!
//! - [`batch`]: `hang` (root culprits along the wait chain), `dead-rank` and `mismatch` over a
//!   job's trace — what `commscope analyze` runs.
//!
//! Still to come (the live-diagnosis issue): `slow-rank`, `comm-error`, `degraded-collective`, the
//! streaming engine in the collector, sampling and the simulator.
#![forbid(unsafe_code)]

pub mod batch;
pub mod finding;

pub use batch::{Thresholds, analyze};
pub use finding::{Finding, Kind};
pub mod stream;
