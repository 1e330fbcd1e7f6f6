//! What commscope's eBPF programs (`ebpf/programs`) and the agent share: the layout of every
//! event on the ring buffer and of every map value, the attach cookies, and the libibverbs ABI
//! offsets the verbs probes read.
//!
//! Every struct is `#[repr(C)]` with its padding spelled out, so that the bytes the kernel side
//! writes are the bytes user space reads, whatever the compiler.

#![no_std]

/// Event kinds: the first field (`Head::kind`) of every ring-buffer event.
pub mod kind {
    /// A TCP socket changed state (`sock:inet_sock_set_state`): [`super::TcpStateEvent`].
    pub const TCP_STATE: u32 = 1;
    /// `ibv_create_qp` returned: [`super::QpEvent`].
    pub const QP_CREATE: u32 = 10;
    /// `ibv_modify_qp` returned: [`super::QpEvent`].
    pub const QP_MODIFY: u32 = 11;
    /// `ibv_destroy_qp` was called: [`super::QpEvent`].
    pub const QP_DESTROY: u32 = 12;
    /// A memory registration (`ibv_reg_mr`, `ibv_reg_mr_iova2`, `ibv_reg_dmabuf_mr`) returned:
    /// [`super::MrEvent`].
    pub const MR_REG: u32 = 13;
    /// `ibv_dereg_mr` returned: [`super::MrEvent`].
    pub const MR_DEREG: u32 = 14;
    /// `ibv_get_async_event` returned an event: [`super::AsyncEvent`].
    pub const ASYNC_EVENT: u32 = 15;
    /// NCCL's network layer returned a new connection (`ncclIbConnect`/`ncclIbAccept` and the
    /// socket transport's): [`super::ConnEvent`].
    pub const NET_CONN: u32 = 20;
    /// `ncclCommInitRank`/`ncclCommInitRankConfig` returned: [`super::NcclInitEvent`].
    pub const NCCL_INIT: u32 = 30;
    /// An NCCL API call returned (a collective, a point-to-point operation), or a communicator
    /// was destroyed, aborted or finalized: [`super::NcclCallEvent`].
    pub const NCCL_CALL: u32 = 31;
}

/// The header of every event.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub kind: u32,
    /// Thread group id (the process id user space sees) and thread id, of the thread the probe
    /// ran in (for tracepoints that run in softirq context, whichever task was current).
    pub pid: u32,
    pub tid: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns`: CLOCK_MONOTONIC.
    pub ts_ns: u64,
}

/// A TCP socket's state change.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpStateEvent {
    pub head: Head,
    /// The kernel's `struct sock *`: the key of [`TcpFlow`] in the flows map.
    pub skaddr: u64,
    /// `AF_INET` (2) or `AF_INET6` (10).
    pub family: u16,
    /// Ports in host order.
    pub sport: u16,
    pub dport: u16,
    pub oldstate: u8,
    pub newstate: u8,
    /// IPv4 addresses in the first 4 bytes; IPv6 in all 16.
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// The current task's name.
    pub comm: [u8; 16],
}

/// Linux TCP states (`include/net/tcp_states.h`).
pub mod tcp_state {
    pub const ESTABLISHED: u8 = 1;
    pub const SYN_SENT: u8 = 2;
    pub const FIN_WAIT1: u8 = 4;
    pub const CLOSE: u8 = 7;
}

/// One TCP flow's running totals, kept in the kernel per socket (`struct sock *`) by the
/// `tcp:tcp_probe` and `tcp:tcp_retransmit_skb` tracepoints, and read by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpFlow {
    pub family: u16,
    pub sport: u16,
    pub dport: u16,
    pub _pad: u16,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub first_ns: u64,
    pub last_ns: u64,
    /// Bytes sent and acknowledged, and bytes received: `tcp_sock`'s own counters where the
    /// kernel has BTF (since the connection began); else the advance of `snd_una` and the sum
    /// of the segments' `data_len` since the flow was first seen (a 16-bit field, which a
    /// coalesced segment of 64 KiB or more overflows).
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// Segments seen by `tcp_probe` (received on an established socket).
    pub segs_in: u64,
    /// Sum and count of the smoothed RTT samples (µs), and the latest.
    pub srtt_sum_us: u64,
    pub srtt_samples: u32,
    pub srtt_us: u32,
    pub snd_cwnd: u32,
    pub last_snd_una: u32,
    pub retransmits: u32,
    /// `snd_nxt` at the last sample.
    pub last_snd_nxt: u32,
    /// Time with sent data not yet acknowledged: an interval between two samples counts when
    /// data was outstanding at both ends (no acknowledgement came in between, so it stayed
    /// outstanding); when only at its end, at most one smoothed RTT of it.
    pub busy_ns: u64,
}

/// Where the TCP tracepoints keep their fields on this kernel: byte offsets into the raw
/// tracepoint record, read by the agent from each event's `format` file in tracefs and handed to
/// the programs in a one-entry array before they are attached. `u16::MAX` is a field that is
/// absent (the program leaves it zero).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TpLayout {
    // tcp:tcp_probe
    pub probe_saddr: u16,
    pub probe_daddr: u16,
    pub probe_sport: u16,
    pub probe_dport: u16,
    pub probe_family: u16,
    pub probe_data_len: u16,
    pub probe_snd_una: u16,
    pub probe_snd_nxt: u16,
    pub probe_snd_cwnd: u16,
    pub probe_srtt: u16,
    pub probe_skaddr: u16,
    // tcp:tcp_retransmit_skb
    pub retrans_skaddr: u16,
    // sock:inet_sock_set_state
    pub state_skaddr: u16,
    pub state_oldstate: u16,
    pub state_newstate: u16,
    pub state_sport: u16,
    pub state_dport: u16,
    pub state_family: u16,
    pub state_protocol: u16,
    pub state_saddr: u16,
    pub state_daddr: u16,
    pub state_saddr_v6: u16,
    pub state_daddr_v6: u16,
    // `struct tcp_sock`'s exact counters, from the kernel's BTF (absent without BTF: the
    // program then sums `data_len` and the advance of `snd_una` instead).
    pub sock_bytes_received: u16,
    pub sock_bytes_acked: u16,
}

impl TpLayout {
    pub const ABSENT: u16 = u16::MAX;
}

/// Where `signal:signal_generate` keeps its fields on this kernel (byte offsets into the raw
/// tracepoint record, from its `format` file), handed to the program in a one-entry array
/// before it is attached.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SigLayout {
    pub sig: u16,
    pub code: u16,
    pub pid: u16,
    pub result: u16,
}

/// Who sent a process a signal that ends it from outside (SIGHUP, SIGINT, SIGQUIT, SIGKILL,
/// SIGTERM): kept by `signal:signal_generate` in `KILLS` under [`kill_key`], the first such
/// signal of each kind per target, for the agent to read when the process has ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kill {
    /// `bpf_ktime_get_ns` when it was sent.
    pub ts_ns: u64,
    /// The sending process (thread group id) — whichever task was current: for a signal the
    /// kernel sent (`code` [`SI_KERNEL`]: the OOM killer, a terminal's Ctrl-C), not a sender.
    pub sender: u32,
    /// `siginfo`'s `si_code`.
    pub code: i32,
    /// The sending task's name.
    pub comm: [u8; 16],
}

/// `si_code` of a signal the kernel sent on its own behalf.
pub const SI_KERNEL: i32 = 0x80;

/// The signals whose senders `KILLS` keeps.
pub const KILL_SIGNALS: [i32; 5] = [1, 2, 3, 9, 15];

/// The `KILLS` key of signal `sig` sent to process `pid`.
pub const fn kill_key(pid: u32, sig: i32) -> u64 {
    (pid as u64) << 32 | (sig as u32 as u64)
}

/// A queue pair's creation, state change or destruction.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpEvent {
    pub head: Head,
    /// The `struct ibv_qp *` (0 when creation failed).
    pub qp: u64,
    pub qp_num: u32,
    /// `ibv_modify_qp`: the new state when the mask has `IBV_QP_STATE`, else -1. Creation:
    /// the QP type. Destruction: -1.
    pub state: i32,
    pub attr_mask: i32,
    /// The function's return value (`ibv_modify_qp`, `ibv_destroy_qp` on entry: 0).
    pub ret: i32,
    /// The peer, when the mask carries it (`IBV_QP_DEST_QPN`, `IBV_QP_AV`).
    pub dest_qp_num: u32,
    pub dlid: u16,
    pub port_num: u8,
    pub is_global: u8,
    pub dgid: [u8; 16],
    /// The device's name (`ibv_device::name`), as far as it fits.
    pub device: [u8; 16],
    /// With the address vector: the local GID table index the queue pair sends from.
    pub sgid_index: u8,
    pub _pad: [u8; 7],
}

/// A memory registration or deregistration, with its latency.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrEvent {
    pub head: Head,
    /// The `struct ibv_mr *` returned (0: registration failed) or deregistered.
    pub mr: u64,
    pub addr: u64,
    pub length: u64,
    pub latency_ns: u64,
    /// Which function ([`verbs_fn`]).
    pub func: u32,
    /// `ibv_dereg_mr`'s return value; 0 for registrations.
    pub ret: i32,
}

/// The verbs functions the MR probes tell apart (cookies and [`MrEvent::func`]).
pub mod verbs_fn {
    pub const REG_MR: u32 = 1;
    pub const REG_MR_IOVA2: u32 = 2;
    pub const REG_DMABUF_MR: u32 = 3;
    pub const DEREG_MR: u32 = 4;
}

/// An asynchronous event from `ibv_get_async_event`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsyncEvent {
    pub head: Head,
    /// `enum ibv_event_type`.
    pub event_type: u32,
    /// For QP events the QP's number; for port events the port; else 0.
    pub qp_num: u32,
    pub port_num: u32,
    pub ret: i32,
    /// The element (`struct ibv_qp *`, `struct ibv_cq *`, …) for object events.
    pub element: u64,
    pub device: [u8; 16],
}

/// A connection NCCL's network layer returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnEvent {
    pub head: Head,
    /// The send or receive comm (`void *`): the key of its [`NetStats`].
    pub comm: u64,
    /// [`net::SEND`] or [`net::RECV`].
    pub side: u32,
    /// [`net::IB`] or [`net::SOCKET`].
    pub transport: u32,
}

/// NCCL network-layer attach cookies: `transport | side << 8 | out_arg << 16`, where `out_arg`
/// is the index of a connect/accept function's `void **comm` argument.
pub mod net {
    pub const IB: u32 = 1;
    pub const SOCKET: u32 = 2;
    pub const SEND: u32 = 1;
    pub const RECV: u32 = 2;

    pub const fn cookie(transport: u32, side: u32, out_arg: u32) -> u64 {
        (transport | side << 8 | out_arg << 16) as u64
    }
    pub const fn transport(cookie: u64) -> u32 {
        (cookie & 0xff) as u32
    }
    pub const fn side(cookie: u64) -> u32 {
        ((cookie >> 8) & 0xff) as u32
    }
    pub const fn out_arg(cookie: u64) -> u32 {
        ((cookie >> 16) & 0xff) as u32
    }
}

/// The key of a network connection's totals.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NetKey {
    pub pid: u32,
    pub side: u32,
    pub comm: u64,
}

/// A network connection's totals, from `isend`/`irecv` entries (never the `test` pollers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub first_ns: u64,
    pub last_ns: u64,
    /// Bytes posted (isend: `size`; irecv: the sum of `sizes[0..n]`).
    pub bytes: u64,
    pub requests: u64,
    pub transport: u32,
    pub _pad: u32,
}

/// Counters the programs keep about themselves (indexes of the `STATS` per-CPU array).
pub mod stat {
    /// Events lost because the ring buffer was full.
    pub const RINGBUF_FULL: u32 = 0;
    /// Flow-map updates that failed (map full of live entries).
    pub const MAP_FULL: u32 = 1;
    /// Reads of user or kernel memory that failed.
    pub const READ_FAILED: u32 = 2;
    pub const COUNT: u32 = 3;
}

/// The parts of libibverbs' ABI (`infiniband/verbs.h`, stable since IBVERBS_1.1) the probes
/// read: byte offsets on x86-64. A test compiles them against the installed header.
pub mod ibv {
    /// `struct ibv_qp`: `context`, `qp_num`, `qp_type`.
    pub const QP_CONTEXT: usize = 0;
    pub const QP_QP_NUM: usize = 52;
    pub const QP_QP_TYPE: usize = 60;
    /// `struct ibv_context::device`, and `struct ibv_device::name`.
    pub const CONTEXT_DEVICE: usize = 0;
    pub const DEVICE_NAME: usize = 24;
    /// `struct ibv_qp_attr`.
    pub const ATTR_QP_STATE: usize = 0;
    pub const ATTR_DEST_QP_NUM: usize = 28;
    pub const ATTR_AH_DGID: usize = 56;
    pub const ATTR_AH_DLID: usize = 80;
    pub const ATTR_AH_IS_GLOBAL: usize = 85;
    pub const ATTR_AH_PORT_NUM: usize = 86;
    pub const ATTR_AH_SGID_INDEX: usize = 76;
    /// `enum ibv_qp_attr_mask`.
    pub const MASK_STATE: i32 = 1;
    pub const MASK_AV: i32 = 1 << 7;
    pub const MASK_DEST_QPN: i32 = 1 << 20;
    /// `struct ibv_mr`: `addr`, `length`.
    pub const MR_ADDR: usize = 16;
    pub const MR_LENGTH: usize = 24;
    /// `struct ibv_async_event`: `element` (a union of pointers and `int port_num`),
    /// `event_type`.
    pub const ASYNC_ELEMENT: usize = 0;
    pub const ASYNC_EVENT_TYPE: usize = 8;
    /// `enum ibv_qp_state`.
    pub const QPS_ERR: i32 = 6;
}

/// A communicator created by `ncclCommInitRank[Config]`, seen at its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclInitEvent {
    pub head: Head,
    /// When the call was entered (CLOCK_MONOTONIC); `head.ts_ns` is its return.
    pub t_enter: u64,
    /// The new `ncclComm_t` (0 when the call failed); while pending, where it will be written.
    pub comm: u64,
    pub nranks: i32,
    pub rank: i32,
    /// `ncclResult_t`.
    pub ret: i32,
    /// Nested inits on one thread while pending (one exported function calling another):
    /// only the outermost reports.
    pub depth: u32,
    /// The `ncclUniqueId` passed by value: NCCL's `commHash` is computed from it.
    pub id: [u8; 128],
}

impl Default for NcclInitEvent {
    fn default() -> Self {
        NcclInitEvent {
            head: Head::default(),
            t_enter: 0,
            comm: 0,
            nranks: 0,
            rank: 0,
            ret: 0,
            depth: 0,
            id: [0; 128],
        }
    }
}

/// One NCCL API call, seen at its return: host timing of the call itself (for a collective,
/// how long enqueuing it took; the GPU work runs later).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NcclCallEvent {
    pub head: Head,
    pub t_enter: u64,
    pub comm: u64,
    /// Elements, as passed (`sendcount`/`recvcount` for all-gather and reduce-scatter).
    pub count: u64,
    /// [`nccl_api`] operation.
    pub op: u32,
    /// `ncclDataType_t`, `ncclRedOp_t`.
    pub dtype: i32,
    pub red_op: i32,
    /// Root (rooted collectives) or peer (send, recv), else -1.
    pub peer: i32,
    /// `ncclResult_t` (0 while pending).
    pub ret: i32,
    /// Nested calls on one thread while pending (`ncclBcast` calling `ncclBroadcast`): only the
    /// outermost reports.
    pub depth: u32,
}

/// NCCL API probes: the operations, and the attach cookie saying where each function keeps
/// its arguments: `op | count << 8 | dtype << 12 | comm << 16 | peer << 20 | red_op << 24`
/// (argument indexes, [`nccl_api::NONE`] for none; 6 and 7 are on the stack).
pub mod nccl_api {
    pub const ALL_REDUCE: u32 = 1;
    pub const BROADCAST: u32 = 2;
    pub const REDUCE: u32 = 3;
    pub const ALL_GATHER: u32 = 4;
    pub const REDUCE_SCATTER: u32 = 5;
    pub const ALL_TO_ALL: u32 = 6;
    pub const GATHER: u32 = 7;
    pub const SCATTER: u32 = 8;
    pub const SEND: u32 = 9;
    pub const RECV: u32 = 10;
    /// `ncclCommDestroy`, `ncclCommAbort`, `ncclCommFinalize` (the communicator is argument 0).
    pub const DESTROY: u32 = 20;
    pub const ABORT: u32 = 21;
    pub const FINALIZE: u32 = 22;

    pub const NONE: u32 = 0xf;

    pub const fn cookie(op: u32, count: u32, dtype: u32, comm: u32, peer: u32, red_op: u32) -> u64 {
        (op | count << 8 | dtype << 12 | comm << 16 | peer << 20 | red_op << 24) as u64
    }
    pub const fn op(cookie: u64) -> u32 {
        (cookie & 0xff) as u32
    }
    /// The argument index in the cookie at `shift` (8: count, 12: dtype, 16: comm, 20: peer,
    /// 24: reduction).
    pub const fn arg(cookie: u64, shift: u32) -> u32 {
        ((cookie >> shift) & 0xf) as u32
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: each is `#[repr(C)]`, `Copy`, made of integers and byte arrays with its padding
    // spelled out as fields, so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::TcpFlow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TpLayout {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NetKey {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::NetStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Kill {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SigLayout {}
}
