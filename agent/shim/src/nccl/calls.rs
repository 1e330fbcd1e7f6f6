//! Wrappers: collectives and point-to-point calls.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_int;

use commscope_wire::op::Op;

use crate::tables::Dir;

use super::record::{begin, end};
use super::*;

macro_rules! record {
    ($begin:expr, $call:expr) => {
        match $begin {
            // SAFETY: pass-through of the application's arguments.
            Some(r) => end(r, unsafe { $call }),
            // SAFETY: as above.
            None => unsafe { $call },
        }
    };
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAllReduce(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Allreduce, n, dt, -1, st, None),
        real::all_reduce(s, r, n, dt, op, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclBroadcast(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Broadcast, n, dt, root, st, None),
        real::broadcast(s, r, n, dt, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclBcast(
    b: P,
    n: usize,
    dt: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Broadcast, n, dt, root, st, None),
        real::bcast(b, n, dt, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclReduce(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    root: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Reduce, n, dt, root, st, None),
        real::reduce(s, r, n, dt, op, root, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclAllGather(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Allgather, n, dt, -1, st, None),
        real::all_gather(s, r, n, dt, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclReduceScatter(
    s: CP,
    r: P,
    n: usize,
    dt: c_int,
    op: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Reducescatter, n, dt, -1, st, None),
        real::reduce_scatter(s, r, n, dt, op, comm, st)
    )
}

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclAlltoAll {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        comm: NComm,
        st: Stream,
    ) -> c_int {
        record!(
            begin(comm, Op::Alltoall, n, dt, -1, st, None),
            real::all_to_all(s, r, n, dt, comm, st)
        )
    }
}
crate::resolve::optional_export!(
    ncclAlltoAll,
    ncclAlltoAll::wrapper,
    [c"pncclAlltoAll", c"ncclAlltoAll"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclGather {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        root: c_int,
        comm: NComm,
        st: Stream,
    ) -> c_int {
        record!(
            begin(comm, Op::Gather, n, dt, root, st, None),
            real::gather(s, r, n, dt, root, comm, st)
        )
    }
}
crate::resolve::optional_export!(
    ncclGather,
    ncclGather::wrapper,
    [c"pncclGather", c"ncclGather"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclScatter {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        root: c_int,
        comm: NComm,
        st: Stream,
    ) -> c_int {
        record!(
            begin(comm, Op::Scatter, n, dt, root, st, None),
            real::scatter(s, r, n, dt, root, comm, st)
        )
    }
}
crate::resolve::optional_export!(
    ncclScatter,
    ncclScatter::wrapper,
    [c"pncclScatter", c"ncclScatter"]
);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclSend(
    s: CP,
    n: usize,
    dt: c_int,
    peer: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Send, n, dt, peer, st, Some(Dir::Send)),
        real::send(s, n, dt, peer, comm, st)
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclRecv(
    r: P,
    n: usize,
    dt: c_int,
    peer: c_int,
    comm: NComm,
    st: Stream,
) -> c_int {
    record!(
        begin(comm, Op::Recv, n, dt, peer, st, Some(Dir::Recv)),
        real::recv(r, n, dt, peer, comm, st)
    )
}

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclAllReduceConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        op: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Allreduce, n, dt, -1, st, None),
            real::all_reduce_config(s, r, n, dt, op, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclAllReduceConfig,
    ncclAllReduceConfig::wrapper,
    [c"pncclAllReduceConfig", c"ncclAllReduceConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclBroadcastConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        root: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Broadcast, n, dt, root, st, None),
            real::broadcast_config(s, r, n, dt, root, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclBroadcastConfig,
    ncclBroadcastConfig::wrapper,
    [c"pncclBroadcastConfig", c"ncclBroadcastConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclReduceConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        op: c_int,
        root: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Reduce, n, dt, root, st, None),
            real::reduce_config(s, r, n, dt, op, root, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclReduceConfig,
    ncclReduceConfig::wrapper,
    [c"pncclReduceConfig", c"ncclReduceConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclAllGatherConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Allgather, n, dt, -1, st, None),
            real::all_gather_config(s, r, n, dt, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclAllGatherConfig,
    ncclAllGatherConfig::wrapper,
    [c"pncclAllGatherConfig", c"ncclAllGatherConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclReduceScatterConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        op: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Reducescatter, n, dt, -1, st, None),
            real::reduce_scatter_config(s, r, n, dt, op, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclReduceScatterConfig,
    ncclReduceScatterConfig::wrapper,
    [c"pncclReduceScatterConfig", c"ncclReduceScatterConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclAlltoAllConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Alltoall, n, dt, -1, st, None),
            real::all_to_all_config(s, r, n, dt, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclAlltoAllConfig,
    ncclAlltoAllConfig::wrapper,
    [c"pncclAlltoAllConfig", c"ncclAlltoAllConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclGatherConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        root: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Gather, n, dt, root, st, None),
            real::gather_config(s, r, n, dt, root, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclGatherConfig,
    ncclGatherConfig::wrapper,
    [c"pncclGatherConfig", c"ncclGatherConfig"]
);

/// Exported only where the loaded NCCL has it ([`crate::resolve::optional_export`]).
pub mod ncclScatterConfig {
    use super::*;

    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        root: c_int,
        comm: NComm,
        st: Stream,
        cfg: CP,
    ) -> c_int {
        record!(
            begin(comm, Op::Scatter, n, dt, root, st, None),
            real::scatter_config(s, r, n, dt, root, comm, st, cfg)
        )
    }
}
crate::resolve::optional_export!(
    ncclScatterConfig,
    ncclScatterConfig::wrapper,
    [c"pncclScatterConfig", c"ncclScatterConfig"]
);
