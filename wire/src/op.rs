//! Operation names, datatype codes and record flags: the vocabulary every record uses.
//!
//! The numeric codes are part of the on-disk and shared-memory formats: never renumber a code,
//! only add new ones.

/// A communication operation, by its contract name (lower case).
///
/// Nonblocking and persistent variants keep the blocking name and set a flag
/// ([`flags::NONBLOCKING`], [`flags::PERSISTENT`]); `Ssend/Bsend/Rsend/Issend` are [`Op::Send`];
/// MPI-4 large-count `_c` variants map to the same names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Op {
    /// Not an operation (comm, heartbeat and process records), or a code this version does not know.
    None = 0,
    Allreduce = 1,
    Broadcast = 2,
    Reduce = 3,
    Allgather = 4,
    Allgatherv = 5,
    Reducescatter = 6,
    Alltoall = 7,
    Alltoallv = 8,
    Alltoallw = 9,
    Gather = 10,
    Gatherv = 11,
    Scatter = 12,
    Scatterv = 13,
    Barrier = 14,
    Scan = 15,
    Exscan = 16,
    Send = 17,
    Recv = 18,
    Sendrecv = 19,
    /// Neighbourhood collectives (MPI-3, on a topology communicator): every member exchanges with
    /// its neighbours only, so members' sizes differ and nobody waits for the whole communicator.
    NeighborAllgather = 20,
    NeighborAllgatherv = 21,
    NeighborAlltoall = 22,
    NeighborAlltoallv = 23,
    NeighborAlltoallw = 24,
}

/// Number of op codes (the size of per-op counter arrays).
pub const OP_COUNT: usize = 25;

impl Op {
    /// Every operation, in code order (without [`Op::None`]).
    pub const ALL: [Op; OP_COUNT - 1] = [
        Op::Allreduce,
        Op::Broadcast,
        Op::Reduce,
        Op::Allgather,
        Op::Allgatherv,
        Op::Reducescatter,
        Op::Alltoall,
        Op::Alltoallv,
        Op::Alltoallw,
        Op::Gather,
        Op::Gatherv,
        Op::Scatter,
        Op::Scatterv,
        Op::Barrier,
        Op::Scan,
        Op::Exscan,
        Op::Send,
        Op::Recv,
        Op::Sendrecv,
        Op::NeighborAllgather,
        Op::NeighborAllgatherv,
        Op::NeighborAlltoall,
        Op::NeighborAlltoallv,
        Op::NeighborAlltoallw,
    ];

    /// Decodes a code; unknown codes become [`Op::None`].
    pub fn from_code(code: u8) -> Op {
        Op::ALL
            .get(usize::from(code).wrapping_sub(1))
            .copied()
            .unwrap_or(Op::None)
    }

    /// The contract name, e.g. `"allreduce"`.
    pub fn name(self) -> &'static str {
        match self {
            Op::None => "none",
            Op::Allreduce => "allreduce",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::Allgather => "allgather",
            Op::Allgatherv => "allgatherv",
            Op::Reducescatter => "reducescatter",
            Op::Alltoall => "alltoall",
            Op::Alltoallv => "alltoallv",
            Op::Alltoallw => "alltoallw",
            Op::Gather => "gather",
            Op::Gatherv => "gatherv",
            Op::Scatter => "scatter",
            Op::Scatterv => "scatterv",
            Op::Barrier => "barrier",
            Op::Scan => "scan",
            Op::Exscan => "exscan",
            Op::Send => "send",
            Op::Recv => "recv",
            Op::Sendrecv => "sendrecv",
            Op::NeighborAllgather => "neighbor_allgather",
            Op::NeighborAllgatherv => "neighbor_allgatherv",
            Op::NeighborAlltoall => "neighbor_alltoall",
            Op::NeighborAlltoallv => "neighbor_alltoallv",
            Op::NeighborAlltoallw => "neighbor_alltoallw",
        }
    }

    /// Parses a contract name.
    pub fn from_name(name: &str) -> Option<Op> {
        Op::ALL.iter().copied().find(|op| op.name() == name)
    }

    /// How a point-to-point call names its peer in a sentence ("recv from rank 1", "send to
    /// rank 3", "sendrecv with rank 2"); None for a collective.
    pub fn peer_word(self) -> Option<&'static str> {
        match self {
            Op::Recv => Some("from"),
            Op::Send => Some("to"),
            Op::Sendrecv => Some("with"),
            _ => None,
        }
    }

    /// Point-to-point operations (`send`, `recv`, `sendrecv`): they do not advance a
    /// communicator's collective `seq`.
    pub fn is_p2p(self) -> bool {
        matches!(self, Op::Send | Op::Recv | Op::Sendrecv)
    }

    /// Collectives after which every member has waited for every other member, so the member
    /// with the shortest duration arrived last (the clock-free slow-rank signal).
    pub fn is_synchronizing(self) -> bool {
        matches!(
            self,
            Op::Allreduce
                | Op::Allgather
                | Op::Allgatherv
                | Op::Reducescatter
                | Op::Alltoall
                | Op::Alltoallv
                | Op::Alltoallw
                | Op::Barrier
        )
    }

    /// Neighbourhood collectives (`neighbor_*`).
    pub fn is_neighborhood(self) -> bool {
        matches!(
            self,
            Op::NeighborAllgather
                | Op::NeighborAllgatherv
                | Op::NeighborAlltoall
                | Op::NeighborAlltoallv
                | Op::NeighborAlltoallw
        )
    }

    /// Collectives with a root rank.
    pub fn is_rooted(self) -> bool {
        matches!(
            self,
            Op::Broadcast | Op::Reduce | Op::Gather | Op::Gatherv | Op::Scatter | Op::Scatterv
        )
    }

    /// Collectives that combine their members' data with a reduction operation ([`red_op`]).
    pub fn is_reducing(self) -> bool {
        matches!(
            self,
            Op::Allreduce | Op::Reduce | Op::Reducescatter | Op::Scan | Op::Exscan
        )
    }
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Element datatype codes. MPI handles and NCCL enums both map onto these.
pub mod dtype {
    /// No datatype (barrier, comm records).
    pub const NONE: u16 = 0;
    pub const BYTE: u16 = 1;
    pub const CHAR: u16 = 2;
    pub const SIGNED_CHAR: u16 = 3;
    pub const UNSIGNED_CHAR: u16 = 4;
    pub const SHORT: u16 = 5;
    pub const UNSIGNED_SHORT: u16 = 6;
    pub const INT: u16 = 7;
    pub const UNSIGNED: u16 = 8;
    pub const LONG: u16 = 9;
    pub const UNSIGNED_LONG: u16 = 10;
    pub const LONG_LONG: u16 = 11;
    pub const UNSIGNED_LONG_LONG: u16 = 12;
    pub const FLOAT: u16 = 13;
    pub const DOUBLE: u16 = 14;
    pub const LONG_DOUBLE: u16 = 15;
    pub const INT8: u16 = 16;
    pub const INT16: u16 = 17;
    pub const INT32: u16 = 18;
    pub const INT64: u16 = 19;
    pub const UINT8: u16 = 20;
    pub const UINT16: u16 = 21;
    pub const UINT32: u16 = 22;
    pub const UINT64: u16 = 23;
    pub const C_BOOL: u16 = 24;
    pub const PACKED: u16 = 25;
    pub const FLOAT_INT: u16 = 26;
    pub const DOUBLE_INT: u16 = 27;
    pub const LONG_INT: u16 = 28;
    pub const TWO_INT: u16 = 29;
    pub const FLOAT16: u16 = 40;
    pub const BFLOAT16: u16 = 41;
    pub const FLOAT8_E4M3: u16 = 42;
    pub const FLOAT8_E5M2: u16 = 43;
    /// A derived (user-constructed) datatype; its size is still recorded in `bytes`.
    pub const DERIVED: u16 = 0xfffe;
    /// Several datatypes in one call (`alltoallw`).
    pub const MIXED: u16 = 0xffff;

    /// The name used in summaries and Parquet, e.g. `"double"`.
    pub fn name(code: u16) -> &'static str {
        match code {
            NONE => "none",
            BYTE => "byte",
            CHAR => "char",
            SIGNED_CHAR => "signed_char",
            UNSIGNED_CHAR => "unsigned_char",
            SHORT => "short",
            UNSIGNED_SHORT => "unsigned_short",
            INT => "int",
            UNSIGNED => "unsigned",
            LONG => "long",
            UNSIGNED_LONG => "unsigned_long",
            LONG_LONG => "long_long",
            UNSIGNED_LONG_LONG => "unsigned_long_long",
            FLOAT => "float",
            DOUBLE => "double",
            LONG_DOUBLE => "long_double",
            INT8 => "int8",
            INT16 => "int16",
            INT32 => "int32",
            INT64 => "int64",
            UINT8 => "uint8",
            UINT16 => "uint16",
            UINT32 => "uint32",
            UINT64 => "uint64",
            C_BOOL => "bool",
            PACKED => "packed",
            FLOAT_INT => "float_int",
            DOUBLE_INT => "double_int",
            LONG_INT => "long_int",
            TWO_INT => "2int",
            FLOAT16 => "float16",
            BFLOAT16 => "bfloat16",
            FLOAT8_E4M3 => "float8_e4m3",
            FLOAT8_E5M2 => "float8_e5m2",
            DERIVED => "derived",
            MIXED => "mixed",
            _ => "unknown",
        }
    }
}

/// Flag bits of `call` and `enter` records.
pub mod flags {
    /// Posted by a nonblocking call (`MPI_I*`); `t_exit` is when completion was observed.
    pub const NONBLOCKING: u16 = 1 << 0;
    /// A persistent request.
    pub const PERSISTENT: u16 = 1 << 1;
    /// `MPI_IN_PLACE` was passed.
    pub const IN_PLACE: u16 = 1 << 2;
    /// A receive posted with `MPI_ANY_SOURCE`; `peer` is the source from the completion status.
    pub const ANY_SOURCE: u16 = 1 << 3;
    /// A receive posted with `MPI_ANY_TAG`; `tag` is the tag from the completion status.
    pub const ANY_TAG: u16 = 1 << 4;
    /// The communicator id is local to this process (not agreed across members).
    pub const LOCAL_COMM_ID: u16 = 1 << 5;
    /// The completion of this nonblocking call could not be tracked (request table full):
    /// `t_exit` is the time it was posted.
    pub const UNTRACKED: u16 = 1 << 6;
    /// `op_seq` (the p2p sequence) is unknown: the p2p counter table was full.
    pub const P2P_SEQ_UNKNOWN: u16 = 1 << 7;
    /// Synchronous send (`MPI_Ssend`, `MPI_Issend`).
    pub const SYNCHRONOUS: u16 = 1 << 8;
    /// Buffered send (`MPI_Bsend`).
    pub const BUFFERED: u16 = 1 << 9;
    /// Ready send (`MPI_Rsend`).
    pub const READY: u16 = 1 << 10;
    /// The operation ran on an intercommunicator.
    pub const INTERCOMM: u16 = 1 << 11;
    /// The request was cancelled.
    pub const CANCELLED: u16 = 1 << 12;
    /// The request was released with `MPI_Request_free` before completion was observed.
    pub const REQUEST_FREED: u16 = 1 << 13;
    /// `MPI_Reduce_scatter_block` (as opposed to `MPI_Reduce_scatter` with counts).
    pub const BLOCK_VARIANT: u16 = 1 << 14;
    /// Set by the node agent on a collective it kept while sampling: `op_seq2` holds the rank's
    /// own compute time (ns) since its previous call on the communicator (wall time between the
    /// two minus its time inside every blocking call in between, kept or left out).
    pub const COMPUTE_KNOWN: u16 = 1 << 15;

    /// NCCL calls: issued while its stream was being captured into a CUDA graph. The call only
    /// recorded work into the graph (it runs at each graph launch), so it has no GPU interval and
    /// its host time is not the operation's. Shares bit 1 with [`PERSISTENT`], which only MPI
    /// calls carry.
    pub const GRAPH_CAPTURED: u16 = 1 << 1;
    /// NCCL calls, with [`GRAPH_CAPTURED`]: one launch of a CUDA graph that holds the call
    /// (written by the shim at each `cudaGraphLaunch`/`cuGraphLaunch`). Its GPU interval is the
    /// whole graph's, compute included, so it orders and localizes but does not time the
    /// operation. Shares bit 8 with [`SYNCHRONOUS`], which only MPI sends carry.
    pub const GRAPH_REPLAY: u16 = 1 << 8;
    /// NCCL calls: recorded by the node agent from uprobes on the NCCL API, for a process
    /// without the preload (zero-touch). Host timing of the call alone (enqueuing the work), no
    /// GPU interval: counted and ordered, never timed; such calls also carry [`NONBLOCKING`].
    /// Shares bit 9 with [`BUFFERED`], which only MPI sends carry.
    pub const HOST_ONLY: u16 = 1 << 9;

    /// Comm: an NCCL (or RCCL) communicator.
    pub const NCCL_COMM: u16 = 1 << 0;
    /// Comm, event `failed`: the library reported the error asynchronously on a communicator
    /// that was working (`ncclCommGetAsyncError`), rather than failing to create it.
    pub const COMM_ASYNC_ERROR: u16 = 1 << 1;

    /// Link: the proxy operation sent (else it received).
    pub const LINK_SEND: u16 = 1 << 0;
    /// `flow` record: the connection closed or began closing (teardown; see
    /// [`crate::record::Flow::flags`]).
    pub const FLOW_CLOSED: u16 = 1 << 0;

    /// Heartbeat: the last heartbeat of a process that shut down cleanly.
    pub const FINAL: u16 = 1 << 0;
    /// Heartbeat: written by the node agent after the process ended, from the counters in its
    /// shared memory (so drops after the process's own last heartbeat are counted too).
    pub const AGENT_BEAT: u16 = 1 << 1;

    /// Process: written by the node agent, which saw the process end (its `exit_status` and
    /// `signal` come from the kernel).
    pub const OBSERVED: u16 = 1 << 0;
    /// Process, event exit, written by the shim: the process is ending without having shut down
    /// cleanly — `exit` (or a return from `main`) without `MPI_Finalize` (`exit_status` is the
    /// status passed to `exit`), a fatal signal (`signal` is set), or [`ABORTED`]. An exit record
    /// without it (and without [`OBSERVED`]) is a clean shutdown.
    pub const UNFINALIZED: u16 = 1 << 1;
    /// Process, event exit, with [`UNFINALIZED`]: the process called `MPI_Abort`; `exit_status`
    /// is its error code.
    pub const ABORTED: u16 = 1 << 2;
    /// Process, event exit, with [`OBSERVED`] and a `signal`: who sent that signal is known;
    /// `step` holds the sender's pid, 0 for the kernel acting on its own behalf (the OOM
    /// killer, a terminal's Ctrl-C or hangup).
    pub const SENDER_KNOWN: u16 = 1 << 3;
    /// Process, event exit, with [`SENDER_KNOWN`]: the sender was an ancestor of the process —
    /// its launcher (`mpirun`, Hydra's proxy, `torchrun`, `slurmstepd`) taking it down.
    pub const SENT_BY_LAUNCHER: u16 = 1 << 4;
}

/// Reduction operations (`MPI_Op`, NCCL's `ncclRedOp_t`), as carried by the `call` and `enter`
/// records of reducing collectives (bytes 116..120, `docs/trace-format.md`). 0 is "none or not
/// known" (records written before the field existed read so).
pub mod red_op {
    pub const UNKNOWN: u8 = 0;
    pub const SUM: u8 = 1;
    pub const PROD: u8 = 2;
    pub const MAX: u8 = 3;
    pub const MIN: u8 = 4;
    pub const LAND: u8 = 5;
    pub const BAND: u8 = 6;
    pub const LOR: u8 = 7;
    pub const BOR: u8 = 8;
    pub const LXOR: u8 = 9;
    pub const BXOR: u8 = 10;
    pub const MINLOC: u8 = 11;
    pub const MAXLOC: u8 = 12;
    pub const REPLACE: u8 = 13;
    pub const NO_OP: u8 = 14;
    /// NCCL's `ncclAvg`.
    pub const AVG: u8 = 15;
    /// A user-defined operation (`MPI_Op_create`, `ncclRedOpCreatePreMulSum`): members agree
    /// only that it is user-defined.
    pub const USER: u8 = 16;

    /// The name used in findings and summaries (`sum`, `max`, …; `user-defined`).
    pub fn name(code: u8) -> &'static str {
        match code {
            SUM => "sum",
            PROD => "prod",
            MAX => "max",
            MIN => "min",
            LAND => "land",
            BAND => "band",
            LOR => "lor",
            BOR => "bor",
            LXOR => "lxor",
            BXOR => "bxor",
            MINLOC => "minloc",
            MAXLOC => "maxloc",
            REPLACE => "replace",
            NO_OP => "no_op",
            AVG => "avg",
            USER => "user-defined",
            _ => "unknown",
        }
    }

    /// The code of a name [`name`] gives ([`UNKNOWN`] for any other).
    pub fn from_name(s: &str) -> u8 {
        (SUM..=USER).find(|c| name(*c) == s).unwrap_or(UNKNOWN)
    }

    /// NCCL's `ncclRedOp_t` (`ncclSum` 0, `ncclProd`, `ncclMax`, `ncclMin`, `ncclAvg` 4; values
    /// from `ncclNumOps` on are user-defined).
    pub fn from_nccl(op: i32) -> u8 {
        match op {
            0 => SUM,
            1 => PROD,
            2 => MAX,
            3 => MIN,
            4 => AVG,
            o if o >= 5 => USER,
            _ => UNKNOWN,
        }
    }
}

/// nccl-tests' bus-bandwidth factor (`PERFORMANCE.md`, NCCL Inspector's `inspectorComputeOpBw`):
/// bus bandwidth = algorithm bandwidth × factor, for a communicator of `n` ranks. `None` for ops
/// without one (barrier, scans, v/w variants whose volume differs per rank). For one rank the
/// reducing and gathering factors are 0: no data crosses a bus.
pub fn busbw_factor(op: Op, n: i32) -> Option<f64> {
    let n = f64::from(n.max(1));
    match op {
        Op::Allreduce => Some(2.0 * (n - 1.0) / n),
        Op::Allgather
        | Op::Allgatherv
        | Op::Reducescatter
        | Op::Alltoall
        | Op::Alltoallv
        | Op::Gather
        | Op::Scatter => Some((n - 1.0) / n),
        Op::Broadcast | Op::Reduce | Op::Send | Op::Recv | Op::Sendrecv => Some(1.0),
        _ => None,
    }
}

/// The library a call went to (`Call::lib`).
pub mod lib {
    pub const MPI: u8 = 0;
    pub const NCCL: u8 = 1;
    pub const RCCL: u8 = 2;

    /// The contract name: `mpi`, `nccl` or `rccl` (`mpi` for codes this version does not know).
    pub fn name(code: u8) -> &'static str {
        match code {
            NCCL => "nccl",
            RCCL => "rccl",
            _ => "mpi",
        }
    }

    /// The code of a name, if known.
    pub fn from_name(s: &str) -> Option<u8> {
        match s {
            "mpi" => Some(MPI),
            "nccl" => Some(NCCL),
            "rccl" => Some(RCCL),
            _ => None,
        }
    }
}

/// The clock a record's timestamps are on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Clock {
    /// `CLOCK_MONOTONIC` of the recording host, in nanoseconds.
    HostMono = 0,
    /// `CLOCK_REALTIME` of the recording host, in nanoseconds since the Unix epoch.
    HostReal = 1,
    /// A GPU timer, in nanoseconds.
    Gpu = 2,
}

impl Clock {
    /// Decodes a code; unknown codes are reported as host-mono.
    pub fn from_code(code: u8) -> Clock {
        match code {
            1 => Clock::HostReal,
            2 => Clock::Gpu,
            _ => Clock::HostMono,
        }
    }

    /// The contract name: `host-mono`, `host-real` or `gpu`.
    pub fn name(self) -> &'static str {
        match self {
            Clock::HostMono => "host-mono",
            Clock::HostReal => "host-real",
            Clock::Gpu => "gpu",
        }
    }
}

/// (element size, commscope datatype code) of an `ncclDataType_t`.
pub fn nccl_dtype(dt: i32) -> (u64, u16) {
    match dt {
        0 => (1, dtype::INT8),
        1 => (1, dtype::UINT8),
        2 => (4, dtype::INT32),
        3 => (4, dtype::UINT32),
        4 => (8, dtype::INT64),
        5 => (8, dtype::UINT64),
        6 => (2, dtype::FLOAT16),
        7 => (4, dtype::FLOAT),
        8 => (8, dtype::DOUBLE),
        9 => (2, dtype::BFLOAT16),
        10 => (1, dtype::FLOAT8_E4M3),
        11 => (1, dtype::FLOAT8_E5M2),
        _ => (0, dtype::DERIVED),
    }
}

/// Whether NCCL's `count` for `op` is the per-rank part, so that `bytes` is `count × size × n`
/// (nccl-tests' sizes, `docs/trace-format.md`); else `count × size`.
pub fn nccl_count_is_per_rank(op: Op) -> bool {
    matches!(
        op,
        Op::Allgather | Op::Reducescatter | Op::Alltoall | Op::Gather | Op::Scatter
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_codes_round_trip_through_names_and_codes() {
        for op in Op::ALL {
            assert_eq!(Op::from_code(op as u8), op);
            assert_eq!(Op::from_name(op.name()), Some(op));
        }
        assert_eq!(Op::from_code(0), Op::None);
        assert_eq!(Op::from_code(200), Op::None);
        assert_eq!(Op::from_name("all_reduce"), None);
    }

    #[test]
    fn only_p2p_ops_are_p2p() {
        let p2p: Vec<_> = Op::ALL.iter().filter(|o| o.is_p2p()).collect();
        assert_eq!(p2p, [&Op::Send, &Op::Recv, &Op::Sendrecv]);
        assert!(
            Op::ALL
                .iter()
                .all(|o| !(o.is_p2p() && o.is_synchronizing()))
        );
    }
}
