//! `libcommscope.so`: the preload library that records every MPI call of a process.
//!
//! Loaded with `LD_PRELOAD` (by `commscope run`), it exports the MPI entry points and forwards
//! each to its `PMPI_*` twin. It stays dormant until `MPI_Init`; then ([`state::activate`]) it
//! detects the MPI flavour at run time ([`abi`]), agrees on a job id, creates a memfd holding the
//! record ring and the in-flight table ([`commscope_wire::shm`]), and starts one background thread
//! ([`writer`]) that writes heartbeats, `enter` records for calls that stay in flight, the local
//! trace file, and registers the memfd with the node agent ([`agent`]).
//!
//! Per call ([`mpi`]): two clock reads, a communicator lookup ([`tables`]), an in-flight slot, one
//! 128-byte record pushed into the ring. No allocation, no lock, no system call; a re-entrancy
//! guard lets the MPI library call its own entry points untouched. Anything unexpected turns the
//! library into a pure pass-through and is counted. `COMMSCOPE_DISABLE=1` makes it a pure
//! pass-through from the start.

pub mod abi;
pub mod agent;
pub mod clock;
pub mod cuda;
pub mod ending;
pub mod graphs;
pub mod mpi;
pub mod nccl;
pub mod profiler;
pub mod resolve;
pub mod state;
pub mod tables;
pub mod util;
pub mod writer;
