//! The commscope node agent's building blocks.
//!
//! - [`region`]: maps a traced process's shared-memory region (ring + in-flight table), either
//!   from the memfd it handed over at registration or straight out of `/proc/<pid>/fd` (the
//!   privileged path, for processes that never registered).
//! - [`registration`]: the agent's side of the registration handshake: receives the request and
//!   the memfd over the Unix socket, checks the peer's credentials, answers.
//!
//! The daemon (`commscope agent`: draining, streaming to the collector, spooling) is built on
//! these.

pub mod region;
pub mod registration;
