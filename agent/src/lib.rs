//! The commscope node agent (`commscope agent`).
//!
//! - [`region`]: maps a traced process's shared-memory region (ring + in-flight table), either
//!   from the memfd it handed over at registration or straight out of `/proc/<pid>/fd` (the
//!   privileged path, for processes that never registered).
//! - [`registration`]: the agent's side of the registration handshake: receives the request and
//!   the memfd over the Unix socket, checks the peer's credentials, answers.
//! - [`daemon`]: the agent itself — draining rings, streaming to the collector, spooling,
//!   in-flight snapshots, process exits.
//! - [`spool`], [`exits`], [`closing`], [`clock`], [`metrics`]: its parts.
//! - [`keeper`]: the trace keeper `commscope run --trace-dir` runs on its node, which completes
//!   the trace file of a rank that ended without writing it out (SIGKILL).

pub mod attribution;
pub mod clock;
pub mod closing;
pub mod daemon;
pub mod exits;
pub mod keeper;
pub mod kills;
pub mod metrics;
pub mod nic;
pub mod procstate;
pub mod region;
pub mod registration;
pub mod spool;
pub mod transport;
pub mod uplink;
pub mod zerotouch;

pub use daemon::{Config, Running, start};
