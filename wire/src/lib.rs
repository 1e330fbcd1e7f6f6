//! commscope's wire model: what every component agrees on.
//!
//! - [`op`]: operation names, datatype codes, flags and clocks.
//! - [`record`]: the record kinds of the contract (`call`, `enter`, `comm`, `heartbeat`,
//!   `process`, and the agent's `skip`) and their fixed 128-byte raw layout.
//! - [`hash`]: the identity hash behind communicator ids; [`sampling`]: consistent sampling;
//!   [`route`]: which collector replica and which shard a job goes to.
//! - [`shm`]: the shared-memory region (ring + in-flight table) a traced process shares with
//!   its node agent; [`registration`]: the handshake that hands it over.
//! - [`cst`]: the shim's append-only trace files; [`wal`]: the collector's write-ahead log.
//! - `parquet` (feature `parquet`): the job trace as Parquet.
//! - `grpc` (feature `grpc`): the agent ⇄ collector protocol.
//!
//! Without features the crate has no dependencies, so the preload shim can use it.
//! Data flows: the shim encodes [`record::Record`]s into the ring of a [`shm::Shm`] and, when
//! asked, into [`cst`] files; the agent reads the ring and in-flight table, and ships records
//! to the collector over `grpc`; traces are merged into Parquet.

pub mod crc;
pub mod cst;
pub mod hash;
pub mod launcher;
pub mod nccl_hash;
pub mod netinfo;
pub mod op;
pub mod record;
pub mod registration;
pub mod route;
pub mod sampling;
pub mod shm;
pub mod wal;

#[cfg(feature = "parquet")]
pub mod parquet;

#[cfg(feature = "grpc")]
pub mod auth;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "grpc")]
pub mod tls;
