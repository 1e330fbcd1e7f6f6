//! Wrappers: collectives and point-to-point calls.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_int;

use commscope_wire::op::Op;

use crate::tables::Dir;

use super::record::{Role, begin, end};
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
        begin(comm, Op::Allreduce, n, dt, -1, st, Role::Reduced(op)),
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
        begin(comm, Op::Broadcast, n, dt, root, st, Role::Coll),
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
        begin(comm, Op::Broadcast, n, dt, root, st, Role::Coll),
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
        begin(comm, Op::Reduce, n, dt, root, st, Role::Reduced(op)),
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
        begin(comm, Op::Allgather, n, dt, -1, st, Role::Coll),
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
        begin(comm, Op::Reducescatter, n, dt, -1, st, Role::Reduced(op)),
        real::reduce_scatter(s, r, n, dt, op, comm, st)
    )
}

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclAlltoAll, [c"pncclAlltoAll", c"ncclAlltoAll"]:
    pub unsafe extern "C" fn wrapper(
        s: CP,
        r: P,
        n: usize,
        dt: c_int,
        comm: NComm,
        st: Stream,
    ) -> c_int {
        record!(
            begin(comm, Op::Alltoall, n, dt, -1, st, Role::Coll),
            real::all_to_all(s, r, n, dt, comm, st)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclGather, [c"pncclGather", c"ncclGather"]:
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
            begin(comm, Op::Gather, n, dt, root, st, Role::Coll),
            real::gather(s, r, n, dt, root, comm, st)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclScatter, [c"pncclScatter", c"ncclScatter"]:
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
            begin(comm, Op::Scatter, n, dt, root, st, Role::Coll),
            real::scatter(s, r, n, dt, root, comm, st)
        )
    }
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
        begin(comm, Op::Send, n, dt, peer, st, Role::P2p(Dir::Send)),
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
        begin(comm, Op::Recv, n, dt, peer, st, Role::P2p(Dir::Recv)),
        real::recv(r, n, dt, peer, comm, st)
    )
}

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclAllReduceConfig, [c"pncclAllReduceConfig", c"ncclAllReduceConfig"]:
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
            begin(comm, Op::Allreduce, n, dt, -1, st, Role::Reduced(op)),
            real::all_reduce_config(s, r, n, dt, op, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclBroadcastConfig, [c"pncclBroadcastConfig", c"ncclBroadcastConfig"]:
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
            begin(comm, Op::Broadcast, n, dt, root, st, Role::Coll),
            real::broadcast_config(s, r, n, dt, root, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclReduceConfig, [c"pncclReduceConfig", c"ncclReduceConfig"]:
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
            begin(comm, Op::Reduce, n, dt, root, st, Role::Reduced(op)),
            real::reduce_config(s, r, n, dt, op, root, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclAllGatherConfig, [c"pncclAllGatherConfig", c"ncclAllGatherConfig"]:
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
            begin(comm, Op::Allgather, n, dt, -1, st, Role::Coll),
            real::all_gather_config(s, r, n, dt, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclReduceScatterConfig, [c"pncclReduceScatterConfig", c"ncclReduceScatterConfig"]:
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
            begin(comm, Op::Reducescatter, n, dt, -1, st, Role::Reduced(op)),
            real::reduce_scatter_config(s, r, n, dt, op, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclAlltoAllConfig, [c"pncclAlltoAllConfig", c"ncclAlltoAllConfig"]:
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
            begin(comm, Op::Alltoall, n, dt, -1, st, Role::Coll),
            real::all_to_all_config(s, r, n, dt, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclGatherConfig, [c"pncclGatherConfig", c"ncclGatherConfig"]:
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
            begin(comm, Op::Gather, n, dt, root, st, Role::Coll),
            real::gather_config(s, r, n, dt, root, comm, st, cfg)
        )
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclScatterConfig, [c"pncclScatterConfig", c"ncclScatterConfig"]:
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
            begin(comm, Op::Scatter, n, dt, root, st, Role::Coll),
            real::scatter_config(s, r, n, dt, root, comm, st, cfg)
        )
    }
);
