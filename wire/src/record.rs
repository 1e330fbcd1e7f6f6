//! Records: the fixed 128-byte raw layout shared by the ring and the `.cst` trace files, and the
//! decoded types the rest of commscope works with.
//!
//! All integers are little-endian. Byte 0..8 is `rec_seq` (1-based; 0 marks an empty ring slot),
//! byte 8 the kind, byte 9 the op (or event), 10..12 flags, 12..16 status; the rest depends on
//! the kind and is documented in `docs/trace-format.md`.

use crate::op::{Clock, Op};

/// Size of every raw record in bytes.
pub const RECORD_SIZE: usize = 128;
/// The record layout version agents and collectors agree on in their hello (the shared
/// memory's layout has its own, [`crate::shm::LAYOUT_VERSION`]). Fields added in bytes an
/// older version left unused (a call's reduction) keep the version: older readers ignore them.
pub const RECORD_LAYOUT_VERSION: u32 = 1;

/// A raw record.
pub type RawRecord = [u8; RECORD_SIZE];

/// Record kinds (byte 8).
pub mod kind {
    pub const CALL: u8 = 1;
    pub const ENTER: u8 = 2;
    pub const COMM: u8 = 3;
    pub const HEARTBEAT: u8 = 4;
    pub const PROCESS: u8 = 5;
    pub const SKIP: u8 = 6;
    pub const LINK: u8 = 7;
    pub const FLOW: u8 = 8;
    pub const LINK_EVENT: u8 = 9;
}

/// `comm` record events (byte 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CommEvent {
    /// The communicator was created (or, for world/self, became known at init).
    Created = 1,
    /// The communicator was freed or disconnected.
    Freed = 2,
    /// The communicator was named (`MPI_Comm_set_name`, `ncclConfig_t.commName`).
    Named = 3,
    /// Creating the communicator failed (`status` holds the library's error code), or it
    /// reported an asynchronous error (`ncclCommGetAsyncError`) and is broken from then on.
    Failed = 4,
}

/// `process` record events (byte 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ProcessEvent {
    /// The library became active in this process (`MPI_Init` or the first NCCL call).
    Start = 1,
    /// The process finalized or exited.
    Exit = 2,
    /// The application marked the start of a training step (`commscope_step(n)`); `step` is n.
    Step = 3,
    /// The network the process's node offers, written once at start when known: `step` is the
    /// summed line rate of the node's active network ports (Ethernet and InfiniBand), Mbit/s.
    Network = 4,
}

/// Exit status value meaning "not known".
pub const EXIT_STATUS_UNKNOWN: i32 = i32::MIN;

/// Why a raw record could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The slot is empty (`rec_seq` is 0).
    Empty,
    /// The kind byte is not one this version knows.
    UnknownKind(u8),
    /// A field holds a value that cannot occur (e.g. an event code).
    BadField(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Empty => write!(f, "empty record slot"),
            DecodeError::UnknownKind(k) => write!(f, "unknown record kind {k}"),
            DecodeError::BadField(name) => write!(f, "invalid value in field `{name}`"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A collective or point-to-point call (kind `call`), or one seen entering and not yet done
/// (kind `enter`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Call {
    pub rec_seq: u64,
    pub op: u8,
    pub flags: u16,
    /// 0 for success, else the library's error code.
    pub status: i32,
    pub comm_id: u64,
    /// Per-communicator count of every collective call on this rank (the instance key); for
    /// p2p the number of collectives issued on the communicator before it.
    pub seq: u64,
    /// Collectives: per-communicator, per-op count. P2p: the sequence per (comm, peer, tag,
    /// direction); for `sendrecv` the send direction's.
    pub op_seq: u64,
    /// Data volume (see `docs/trace-format.md` for each op's rule).
    pub bytes: u64,
    /// Element count matching `bytes`.
    pub count: u64,
    /// Root (rooted ops), destination (send), source (recv; the matched one for wildcards), or -1.
    pub peer: i32,
    /// Tag (p2p), or -1.
    pub tag: i32,
    pub t_enter: u64,
    pub t_exit: u64,
    pub gpu_start: u64,
    pub gpu_end: u64,
    /// Global rank.
    pub rank: i32,
    pub comm_rank: i32,
    pub comm_size: i32,
    pub dtype: u16,
    /// Clock of `t_enter`/`t_exit` (see [`Clock`]).
    pub clock: u8,
    /// The library the call went to ([`lib`]): MPI, NCCL or RCCL. Shares byte 110 with `clock`
    /// (its high four bits).
    pub lib: u8,
    /// `sendrecv`: the source.
    pub peer2: i32,
    /// `sendrecv`: the receive tag.
    pub tag2: i32,
    /// Reducing collectives: the reduction operation ([`crate::op::red_op`]; 0 not known).
    /// Shares bytes 116..120 with `tag2`, which only `sendrecv` carries.
    pub red_op: u8,
    /// `sendrecv`: the receive direction's p2p sequence.
    pub op_seq2: u64,
    /// Consistent sampling: the record stands for 2^`sample_shift` calls (the modulus in force
    /// for its communicator when the agent kept it); 0 when nothing was left out.
    pub sample_shift: u8,
}

impl Call {
    /// The operation.
    pub fn op(&self) -> Op {
        Op::from_code(self.op)
    }

    /// The clock of the host timestamps.
    pub fn clock(&self) -> Clock {
        Clock::from_code(self.clock)
    }

    /// Host-side duration in nanoseconds (0 for `enter` records).
    pub fn duration_ns(&self) -> u64 {
        self.t_exit.saturating_sub(self.t_enter)
    }

    /// An NCCL call issued while its stream was captured into a CUDA graph (it only recorded
    /// work into the graph).
    /// True for an NCCL call replayed by a CUDA graph launch ([`crate::op::flags::GRAPH_REPLAY`]).
    pub fn graph_replay(&self) -> bool {
        self.graph_captured() && self.flags & crate::op::flags::GRAPH_REPLAY != 0
    }

    pub fn graph_captured(&self) -> bool {
        self.lib != crate::op::lib::MPI && self.flags & crate::op::flags::GRAPH_CAPTURED != 0
    }

    /// An MPI call that posted a nonblocking request ([`crate::op::flags::NONBLOCKING`]): the
    /// caller went on after posting it.
    pub fn nonblocking(&self) -> bool {
        self.lib == crate::op::lib::MPI && self.flags & crate::op::flags::NONBLOCKING != 0
    }

    /// An NCCL call the node agent recorded from uprobes ([`crate::op::flags::HOST_ONLY`]):
    /// host timing of the enqueue only.
    pub fn host_only(&self) -> bool {
        self.lib != crate::op::lib::MPI && self.flags & crate::op::flags::HOST_ONLY != 0
    }

    /// Whether the call's span times the operation (not a call captured into a CUDA graph, nor
    /// one seen only from the host by uprobes).
    pub fn timed(&self) -> bool {
        !self.graph_captured() && !self.host_only()
    }

    /// True when the call carries a GPU interval (`gpu_start`/`gpu_end`, on the host-mono clock
    /// of `t_enter`).
    pub fn has_gpu_time(&self) -> bool {
        self.gpu_end != 0 && self.gpu_end >= self.gpu_start && self.gpu_start != 0
    }

    /// When the operation ran: its GPU interval when it has one (an NCCL kernel: from when the
    /// stream reached it, through waiting for its peers, to the end of the transfer), else the
    /// time the host spent inside the call.
    pub fn span(&self) -> (u64, u64) {
        if self.has_gpu_time() {
            (self.gpu_start, self.gpu_end)
        } else {
            (self.t_enter, self.t_exit)
        }
    }

    /// The length of [`Call::span`] in nanoseconds.
    pub fn span_ns(&self) -> u64 {
        let (a, b) = self.span();
        b.saturating_sub(a)
    }

    /// Algorithm bandwidth in bytes per second: `bytes` over [`Call::span`] (nccl-tests'
    /// `algbw`, with its size rule: `docs/trace-format.md`). `None` without a duration.
    pub fn algbw(&self) -> Option<f64> {
        let ns = self.span_ns();
        (ns > 0 && self.bytes > 0).then(|| self.bytes as f64 / (ns as f64 / 1e9))
    }

    /// Bus bandwidth in bytes per second: [`Call::algbw`] × nccl-tests' factor for the op and
    /// communicator size ([`crate::op::busbw_factor`]); 0 for one rank.
    pub fn busbw(&self) -> Option<f64> {
        let f = crate::op::busbw_factor(self.op(), self.comm_size)?;
        Some(self.algbw()? * f)
    }

    /// The sampling modulus the record was kept under (1: nothing left out).
    pub fn sample_modulus(&self) -> u64 {
        1u64 << self.sample_shift.min(32)
    }
}

/// A communicator event (kind `comm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Comm {
    pub rec_seq: u64,
    pub event: CommEvent,
    pub flags: u16,
    /// [`CommEvent::Failed`]: the library's error code; else 0.
    pub status: i32,
    /// The GPU (CUDA device ordinal) of an NCCL communicator's rank in this process, or -1.
    pub device: i32,
    pub comm_id: u64,
    /// The parent communicator's id, 0 when none.
    pub parent: u64,
    /// Host monotonic time of the event.
    pub t: u64,
    /// Global rank of the recording process.
    pub rank: i32,
    pub comm_rank: i32,
    pub size: i32,
    /// Size of the remote group for intercommunicators, else 0.
    pub remote_size: i32,
    name_len: u8,
    name: [u8; COMM_NAME_MAX],
}

/// The longest communicator name a record carries (longer names are cut at a UTF-8 boundary).
pub const COMM_NAME_MAX: usize = 64;

/// `s` cut to at most `max` bytes at a UTF-8 character boundary.
fn utf8_prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` in an `N`-byte NUL-padded field, cut to at most `max` bytes (`max` ≤ `N`) at a
/// character boundary.
pub fn nul_padded<const N: usize>(s: &str, max: usize) -> [u8; N] {
    let p = utf8_prefix(s, max.min(N));
    let mut out = [0u8; N];
    out[..p.len()].copy_from_slice(p.as_bytes());
    out
}

/// The text of a NUL-padded field (up to its first NUL; invalid UTF-8 replaced).
pub fn nul_text(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl Comm {
    /// A new comm record with an empty name.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        event: CommEvent,
        comm_id: u64,
        parent: u64,
        t: u64,
        rank: i32,
        comm_rank: i32,
        size: i32,
        remote_size: i32,
    ) -> Self {
        Comm {
            rec_seq: 0,
            event,
            flags: 0,
            status: 0,
            device: -1,
            comm_id,
            parent,
            t,
            rank,
            comm_rank,
            size,
            remote_size,
            name_len: 0,
            name: [0; COMM_NAME_MAX],
        }
    }

    /// Sets the name from raw bytes (a C string's contents), cut to [`COMM_NAME_MAX`] bytes
    /// at a UTF-8 character boundary; invalid UTF-8 is kept as far as it is valid.
    pub fn set_name(&mut self, name: &[u8]) {
        let valid = match std::str::from_utf8(name) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&name[..e.valid_up_to()]).unwrap_or_default(),
        };
        self.name = nul_padded(valid, COMM_NAME_MAX);
        self.name_len = utf8_prefix(valid, COMM_NAME_MAX).len() as u8;
    }

    /// The name ("" when none).
    pub fn name(&self) -> &str {
        std::str::from_utf8(&self.name[..usize::from(self.name_len).min(COMM_NAME_MAX)])
            .unwrap_or_default()
    }
}

/// A liveness record (kind `heartbeat`), written at least once a second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heartbeat {
    pub rec_seq: u64,
    /// [`crate::op::flags::FINAL`] on the last heartbeat of a clean shutdown.
    pub flags: u16,
    pub t_mono: u64,
    pub t_real: u64,
    /// Calls in flight at this moment.
    pub in_flight: u32,
    pub rank: i32,
    /// Records dropped because the ring was full, since the process started.
    pub dropped_ring_full: u64,
    /// Calls not shown in the in-flight table because it was full.
    pub dropped_in_flight: u64,
    /// Everything else that was not recorded (table overflows, internal errors).
    pub dropped_other: u64,
    /// Records produced so far (the ring's write position).
    pub produced: u64,
}

/// A process lifecycle record (kind `process`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Process {
    pub rec_seq: u64,
    pub event: ProcessEvent,
    /// [`crate::op::flags::OBSERVED`] when the node agent wrote it after seeing the process end.
    pub flags: u16,
    pub t_mono: u64,
    pub t_real: u64,
    pub pid: u32,
    /// Exit status, or [`EXIT_STATUS_UNKNOWN`].
    pub exit_status: i32,
    /// Process start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: u64,
    pub rank: i32,
    pub world_size: i32,
    /// The signal that ended the process, 0 when none or unknown.
    pub signal: i32,
    /// `step` events: the application's step number; `network` events: the node's line rate,
    /// Mbit/s; `exit` events with [`crate::op::flags::SENDER_KNOWN`]: the pid that sent the
    /// fatal signal (0: the kernel); 0 otherwise.
    pub step: u64,
}

/// The totals of consecutive calls of one (communicator, op) that consistent sampling left out
/// (kind `skip`, written by the node agent in their place).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skip {
    /// The `rec_seq` of the last call it stands for.
    pub rec_seq: u64,
    /// Every record of the process from `from_rec_seq` through `through_rec_seq` has been sent
    /// (kept, or counted in this skip or one sent before it): the receiver marks the span
    /// delivered. Empty when `from_rec_seq` > `through_rec_seq`.
    pub from_rec_seq: u64,
    pub through_rec_seq: u64,
    pub op: u8,
    /// [`crate::op::flags::NONBLOCKING`] when any of the calls was not blocking.
    pub flags: u16,
    pub comm_id: u64,
    /// `seq` of the first and last call.
    pub first_seq: u64,
    pub last_seq: u64,
    /// Number of calls, their bytes, and the time spent inside the blocking ones.
    pub calls: u64,
    pub bytes: u64,
    pub inside_ns: u64,
    /// `t_enter` of the first call and `t_exit` of the last (host clock of the calls).
    pub t_first: u64,
    pub t_last: u64,
    pub rank: i32,
    pub comm_rank: i32,
    pub comm_size: i32,
    /// The sampling modulus in force.
    pub modulus: u32,
}

impl Skip {
    /// A skip that counts no call only says that the rank had completed every collective of
    /// the communicator through `last_seq` (an imported trace whose window starts there).
    pub fn progress_only(&self) -> bool {
        self.calls == 0
    }

    /// The operation.
    pub fn op(&self) -> Op {
        Op::from_code(self.op)
    }

    /// The `rec_seq` span the agent has sent whole, if any.
    pub fn sent_span(&self) -> Option<(u64, u64)> {
        (self.from_rec_seq > 0 && self.from_rec_seq <= self.through_rec_seq)
            .then_some((self.from_rec_seq, self.through_rec_seq))
    }
}

/// Any decoded record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    Call(Call),
    Enter(Call),
    Comm(Comm),
    Heartbeat(Heartbeat),
    Process(Process),
    Skip(Skip),
    Link(Link),
    Flow(Flow),
    LinkEvent(LinkEvent),
}

/// One network flow's activity over one interval (kind `flow`), from the node agent's transport
/// view (eBPF), not from a rank: the agent writes these under a process identity of its own per
/// job, whose `rank` is [`TRANSPORT_RANK`]; [`Flow::rank`] names the rank owning the socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub rec_seq: u64,
    /// [`flow_transport`].
    pub transport: u8,
    /// [`crate::op::flags::FLOW_CLOSED`]: the connection closed or began closing (left
    /// ESTABLISHED) during or before the interval. Its totals are then synced from the socket,
    /// so the bytes of such a record may have been acknowledged before the interval.
    pub flags: u16,
    /// Bytes sent and acknowledged, and bytes received, during the interval.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Time during the interval with sent data not yet acknowledged (the network busy with
    /// this flow): `bytes_sent / busy_ns` is its rate while busy.
    pub busy_ns: u64,
    pub retransmits: u32,
    /// Mean smoothed round-trip time over the interval's samples (µs; 0: none).
    pub srtt_us: u32,
    /// The congestion window at the interval's end (segments).
    pub cwnd: u32,
    /// Local and remote addresses (IPv4 as IPv4-mapped IPv6) and ports.
    pub local: [u8; 16],
    pub remote: [u8; 16],
    pub local_port: u16,
    pub remote_port: u16,
    /// Host-mono times the interval began and ended.
    pub t_start: u64,
    pub t_end: u64,
    /// The global rank and pid owning the socket (-1 / 0 when unknown).
    pub rank: i32,
    pub pid: u32,
    /// The network interface holding the local address (`eth0`), NUL-padded; all zero when
    /// unknown.
    pub iface: [u8; 16],
}

/// The `rank` of the process identity under which a node's agent writes its transport records
/// (not -1, which a trace file without a rank reads as).
pub const TRANSPORT_RANK: i32 = -2;

/// Transports of [`Flow`] records.
pub mod flow_transport {
    pub const TCP: u8 = 1;
    /// An NCCL InfiniBand/RoCE connection (its queue pairs' peer): bytes NCCL's network layer
    /// posted, no busy time, RTT or retransmissions.
    pub const RDMA: u8 = 2;

    pub fn name(t: u8) -> &'static str {
        match t {
            TCP => "tcp",
            RDMA => "rdma",
            _ => "other",
        }
    }

    pub fn from_name(s: &str) -> u8 {
        match s {
            "tcp" => TCP,
            "rdma" => RDMA,
            _ => 0,
        }
    }
}

impl Flow {
    /// The local and remote socket addresses (IPv4-mapped addresses shown as IPv4).
    pub fn local_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(
            std::net::Ipv6Addr::from(self.local).to_canonical(),
            self.local_port,
        )
    }

    pub fn remote_addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::new(
            std::net::Ipv6Addr::from(self.remote).to_canonical(),
            self.remote_port,
        )
    }

    /// The interface name, when known.
    pub fn iface_name(&self) -> Option<String> {
        Some(nul_text(&self.iface)).filter(|n| !n.is_empty())
    }

    /// An interface name in the 16-byte form (Linux names have at most 15 bytes).
    pub fn iface_bytes(name: &str) -> [u8; 16] {
        nul_padded(name, 15)
    }

    /// The 16-byte address standing for an InfiniBand port reached by its LID alone (no GID
    /// in the address vector): `fe80::ffff:ffff:0:LID`, which no port GUID makes.
    pub fn lid_address(lid: u16) -> [u8; 16] {
        let mut a = [0u8; 16];
        a[0] = 0xfe;
        a[1] = 0x80;
        a[8..12].copy_from_slice(&[0xff; 4]);
        a[14..].copy_from_slice(&lid.to_be_bytes());
        a
    }

    /// Stores an address in the 16-byte form.
    pub fn addr_bytes(ip: std::net::IpAddr) -> [u8; 16] {
        match ip {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        }
    }
}

/// A link-level failure the node agent saw (kind `link_event`): a queue pair that moved to
/// ERROR, a fatal asynchronous event, NIC error counters that went up, a port that went down
/// or came back. Written under the agent's per-job transport identity ([`TRANSPORT_RANK`]),
/// like [`Flow`]; `rank` and `pid` name the process that owned the queue pair (-1 / 0 for
/// node-wide events).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkEvent {
    pub rec_seq: u64,
    /// [`link_event`].
    pub event: u8,
    pub flags: u16,
    /// Host-mono time it was seen.
    pub t: u64,
    /// Events it stands for (a counter's increase in events; 1 otherwise).
    pub count: u64,
    /// The RDMA port (0: none or unknown).
    pub port: u32,
    /// The queue pair, and its peer's (0: none).
    pub qp_num: u32,
    pub peer_qp: u32,
    pub pid: u32,
    pub rank: i32,
    /// The peer's address (its GID; IPv4 as IPv4-mapped IPv6; all zero: unknown).
    pub peer: [u8; 16],
    /// The device (`mlx5_0`, `eth0`), NUL-padded.
    pub device: [u8; LINK_EVENT_NAME_MAX],
    /// What: the counter (`symbol_error`) or the asynchronous event (`IBV_EVENT_PORT_ERR`),
    /// NUL-padded.
    pub what: [u8; LINK_EVENT_NAME_MAX],
}

/// Bytes of [`LinkEvent`]'s device and what names.
pub const LINK_EVENT_NAME_MAX: usize = 32;

/// Events of [`LinkEvent`] records.
pub mod link_event {
    /// A queue pair moved to the ERROR state.
    pub const QP_ERROR: u8 = 1;
    /// A fatal asynchronous event (device fatal, QP fatal, access error, CQ error, …).
    pub const FATAL: u8 = 2;
    /// An asynchronous port error (`IBV_EVENT_PORT_ERR`).
    pub const PORT_ERROR: u8 = 3;
    /// A NIC counter of class link-error or fatal went up by `count`.
    pub const COUNTER: u8 = 4;
    /// A port left the active state, or a network interface lost its carrier.
    pub const PORT_DOWN: u8 = 5;
    /// It is back.
    pub const PORT_UP: u8 = 6;
    /// A NIC counter of class congestion (ECN marks, CNPs, pauses, transmit waits) went up by
    /// `count`: corroboration for a slow link, no failure.
    pub const CONGESTION: u8 = 7;
    /// A NIC counter of class loss (sequence errors, retransmissions, timeouts) went up.
    pub const LOSS: u8 = 8;

    pub fn name(e: u8) -> &'static str {
        match e {
            QP_ERROR => "qp-error",
            FATAL => "fatal",
            PORT_ERROR => "port-error",
            COUNTER => "counter",
            PORT_DOWN => "port-down",
            PORT_UP => "port-up",
            CONGESTION => "congestion",
            LOSS => "loss",
            _ => "unknown",
        }
    }

    pub fn from_name(s: &str) -> u8 {
        match s {
            "qp-error" => QP_ERROR,
            "fatal" => FATAL,
            "port-error" => PORT_ERROR,
            "counter" => COUNTER,
            "port-down" => PORT_DOWN,
            "port-up" => PORT_UP,
            "congestion" => CONGESTION,
            "loss" => LOSS,
            _ => 0,
        }
    }
}

impl LinkEvent {
    /// A name in the NUL-padded form (truncated at a character boundary).
    pub fn name_bytes(s: &str) -> [u8; LINK_EVENT_NAME_MAX] {
        nul_padded(s, LINK_EVENT_NAME_MAX)
    }

    pub fn device_name(&self) -> String {
        nul_text(&self.device)
    }

    pub fn what_name(&self) -> String {
        nul_text(&self.what)
    }

    /// The peer's address, when known.
    pub fn peer_addr(&self) -> Option<std::net::IpAddr> {
        (self.peer != [0u8; 16]).then(|| std::net::Ipv6Addr::from(self.peer).to_canonical())
    }
}

/// One link's share of an operation (kind `link`), from NCCL's profiler plugin: a proxy
/// operation — one channel's sends to, or receives from, one peer for one collective or
/// point-to-point call — with its bytes and when the proxy thread worked on it. Joined to its
/// call by `(comm_id, op, op_seq)` (NCCL's per-function sequence number).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Link {
    pub rec_seq: u64,
    pub op: u8,
    /// [`crate::op::flags::LINK_SEND`] for sends (else receives).
    pub flags: u16,
    pub comm_id: u64,
    /// The call's `seq` when the recorder knows it (0 otherwise).
    pub seq: u64,
    /// The call's `op_seq`.
    pub op_seq: u64,
    /// Bytes the proxy announced for it (steps × chunk size).
    pub bytes: u64,
    pub steps: u32,
    /// Channels whose proxy operations were folded into this record.
    pub channels: u8,
    /// The peer's rank in the communicator.
    pub peer: i32,
    /// Host-mono times the proxy started and finished the operation.
    pub t_start: u64,
    pub t_end: u64,
    pub rank: i32,
    pub comm_rank: i32,
    /// From the proxy's steps (0 when NCCL sent no `ProxyStep` events). Network time: the union,
    /// per channel, of the intervals a step was on the network — a send from its post to the
    /// network until the network completed it, a receive from its post until its data arrived —
    /// summed over the folded channels (channel-nanoseconds).
    pub net_ns: u64,
    /// Time steps waited for the GPU, the same way: a send for the kernel to fill its buffer, a
    /// receive for the kernel to drain it.
    pub gpu_wait_ns: u64,
    /// Time send steps whose data was ready waited before the network took them (the receiver's
    /// buffer was not yet free).
    pub peer_wait_ns: u64,
    /// Bytes the steps moved (NCCL's `transSize`).
    pub xfer_bytes: u64,
    /// Steps that completed.
    pub steps_done: u32,
}

impl Link {
    /// True when it carries step timing.
    pub fn step_timed(&self) -> bool {
        self.steps_done > 0 && self.net_ns > 0
    }

    /// Bytes per second while on the network, per channel (`xfer_bytes / net_ns`).
    pub fn net_rate(&self) -> Option<f64> {
        (self.step_timed() && self.xfer_bytes > 0)
            .then(|| self.xfer_bytes as f64 * 1e9 / self.net_ns as f64)
    }
}

impl Record {
    /// The per-process record sequence number.
    pub fn rec_seq(&self) -> u64 {
        match self {
            Record::Call(c) | Record::Enter(c) => c.rec_seq,
            Record::Comm(c) => c.rec_seq,
            Record::Heartbeat(h) => h.rec_seq,
            Record::Process(p) => p.rec_seq,
            Record::Skip(k) => k.rec_seq,
            Record::Link(l) => l.rec_seq,
            Record::Flow(f) => f.rec_seq,
            Record::LinkEvent(e) => e.rec_seq,
        }
    }

    /// Sets the per-process record sequence number.
    pub fn set_rec_seq(&mut self, seq: u64) {
        match self {
            Record::Call(c) | Record::Enter(c) => c.rec_seq = seq,
            Record::Comm(c) => c.rec_seq = seq,
            Record::Heartbeat(h) => h.rec_seq = seq,
            Record::Process(p) => p.rec_seq = seq,
            Record::Skip(k) => k.rec_seq = seq,
            Record::Link(l) => l.rec_seq = seq,
            Record::Flow(f) => f.rec_seq = seq,
            Record::LinkEvent(e) => e.rec_seq = seq,
        }
    }

    /// The contract kind name.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Record::Call(_) => "call",
            Record::Enter(_) => "enter",
            Record::Comm(_) => "comm",
            Record::Heartbeat(_) => "heartbeat",
            Record::Process(_) => "process",
            Record::Skip(_) => "skip",
            Record::Link(_) => "link",
            Record::Flow(_) => "flow",
            Record::LinkEvent(_) => "link_event",
        }
    }

    /// Encodes into a raw record (including `rec_seq`).
    pub fn encode(&self) -> RawRecord {
        let mut b = [0u8; RECORD_SIZE];
        self.encode_body(&mut b);
        put_u64(&mut b, 0, self.rec_seq());
        b
    }

    /// Encodes everything but `rec_seq` (bytes 8..128): what a ring writer fills before it
    /// publishes the slot by storing `rec_seq`.
    pub fn encode_body(&self, b: &mut RawRecord) {
        match self {
            Record::Call(c) => encode_call(b, kind::CALL, c),
            Record::Enter(c) => encode_call(b, kind::ENTER, c),
            Record::Comm(c) => {
                header(b, kind::COMM, c.event as u8, c.flags, c.status);
                put_u64(b, 16, c.comm_id);
                put_u64(b, 24, c.parent);
                put_u64(b, 32, c.t);
                put_i32(b, 40, c.rank);
                put_i32(b, 44, c.comm_rank);
                put_i32(b, 48, c.size);
                put_i32(b, 52, c.remote_size);
                b[56] = c.name_len;
                b[57..60].fill(0);
                // The device plus one, so that 0 (what records without it hold) reads as none.
                put_i32(b, 60, c.device.max(-1).saturating_add(1));
                b[64..128].copy_from_slice(&c.name);
            }
            Record::Heartbeat(h) => {
                header(b, kind::HEARTBEAT, 0, h.flags, 0);
                put_u64(b, 16, h.t_mono);
                put_u64(b, 24, h.t_real);
                put_u32(b, 32, h.in_flight);
                put_i32(b, 36, h.rank);
                put_u64(b, 40, h.dropped_ring_full);
                put_u64(b, 48, h.dropped_in_flight);
                put_u64(b, 56, h.dropped_other);
                put_u64(b, 64, h.produced);
                b[72..128].fill(0);
            }
            Record::Process(p) => {
                header(b, kind::PROCESS, p.event as u8, p.flags, 0);
                put_u64(b, 16, p.t_mono);
                put_u64(b, 24, p.t_real);
                put_u32(b, 32, p.pid);
                put_i32(b, 36, p.exit_status);
                put_u64(b, 40, p.start_time);
                put_i32(b, 48, p.rank);
                put_i32(b, 52, p.world_size);
                put_i32(b, 56, p.signal);
                b[60..64].fill(0);
                put_u64(b, 64, p.step);
                b[72..128].fill(0);
            }
            Record::Skip(k) => {
                header(b, kind::SKIP, k.op, k.flags, 0);
                put_u64(b, 16, k.comm_id);
                put_u64(b, 24, k.last_seq);
                put_u64(b, 32, k.first_seq);
                put_u64(b, 40, k.bytes);
                put_u64(b, 48, k.calls);
                put_u32(b, 56, k.modulus);
                b[60..64].fill(0);
                put_u64(b, 64, k.t_first);
                put_u64(b, 72, k.t_last);
                put_u64(b, 80, k.inside_ns);
                put_u64(b, 88, k.through_rec_seq);
                put_i32(b, 96, k.rank);
                put_i32(b, 100, k.comm_rank);
                put_i32(b, 104, k.comm_size);
                b[108..112].fill(0);
                put_u64(b, 112, k.from_rec_seq);
                b[120..128].fill(0);
            }
            Record::Link(l) => {
                header(b, kind::LINK, l.op, l.flags, 0);
                put_u64(b, 16, l.comm_id);
                put_u64(b, 24, l.seq);
                put_u64(b, 32, l.op_seq);
                put_u64(b, 40, l.bytes);
                put_u32(b, 48, l.steps);
                b[52] = l.channels;
                b[53..56].fill(0);
                put_i32(b, 56, l.peer);
                b[60..64].fill(0);
                put_u64(b, 64, l.t_start);
                put_u64(b, 72, l.t_end);
                put_u64(b, 80, l.net_ns);
                put_u64(b, 88, l.gpu_wait_ns);
                put_i32(b, 96, l.rank);
                put_i32(b, 100, l.comm_rank);
                put_u64(b, 104, l.xfer_bytes);
                put_u64(b, 112, l.peer_wait_ns);
                put_u32(b, 120, l.steps_done);
                b[124..128].fill(0);
            }
            Record::Flow(f) => {
                header(b, kind::FLOW, f.transport, f.flags, 0);
                put_u64(b, 16, f.bytes_sent);
                put_u64(b, 24, f.bytes_received);
                put_u64(b, 32, f.busy_ns);
                put_u32(b, 40, f.retransmits);
                put_u32(b, 44, f.srtt_us);
                b[48..64].copy_from_slice(&f.local);
                put_u64(b, 64, f.t_start);
                put_u64(b, 72, f.t_end);
                b[80..96].copy_from_slice(&f.remote);
                put_i32(b, 96, f.rank);
                put_u16(b, 100, f.local_port);
                put_u16(b, 102, f.remote_port);
                put_u32(b, 104, f.pid);
                put_u32(b, 108, f.cwnd);
                b[112..128].copy_from_slice(&f.iface);
            }
            Record::LinkEvent(e) => {
                header(b, kind::LINK_EVENT, e.event, e.flags, e.rank);
                put_u64(b, 16, e.t);
                put_u64(b, 24, e.count);
                put_u32(b, 32, e.port);
                put_u32(b, 36, e.qp_num);
                put_u32(b, 40, e.peer_qp);
                put_u32(b, 44, e.pid);
                b[48..64].copy_from_slice(&e.peer);
                b[64..96].copy_from_slice(&e.device);
                b[96..128].copy_from_slice(&e.what);
            }
        }
    }

    /// Decodes a raw record.
    pub fn decode(b: &RawRecord) -> Result<Record, DecodeError> {
        let rec_seq = get_u64(b, 0);
        if rec_seq == 0 {
            return Err(DecodeError::Empty);
        }
        let flags = get_u16(b, 10);
        match b[8] {
            kind::CALL => Ok(Record::Call(decode_call(b, rec_seq))),
            kind::ENTER => Ok(Record::Enter(decode_call(b, rec_seq))),
            kind::COMM => {
                let event = match b[9] {
                    1 => CommEvent::Created,
                    2 => CommEvent::Freed,
                    3 => CommEvent::Named,
                    4 => CommEvent::Failed,
                    _ => return Err(DecodeError::BadField("comm event")),
                };
                let mut name = [0u8; COMM_NAME_MAX];
                name.copy_from_slice(&b[64..128]);
                let name_len = b[56];
                if usize::from(name_len) > COMM_NAME_MAX {
                    return Err(DecodeError::BadField("comm name length"));
                }
                Ok(Record::Comm(Comm {
                    rec_seq,
                    event,
                    flags,
                    status: get_i32(b, 12),
                    device: get_i32(b, 60).saturating_sub(1),
                    comm_id: get_u64(b, 16),
                    parent: get_u64(b, 24),
                    t: get_u64(b, 32),
                    rank: get_i32(b, 40),
                    comm_rank: get_i32(b, 44),
                    size: get_i32(b, 48),
                    remote_size: get_i32(b, 52),
                    name_len,
                    name,
                }))
            }
            kind::HEARTBEAT => Ok(Record::Heartbeat(Heartbeat {
                rec_seq,
                flags,
                t_mono: get_u64(b, 16),
                t_real: get_u64(b, 24),
                in_flight: get_u32(b, 32),
                rank: get_i32(b, 36),
                dropped_ring_full: get_u64(b, 40),
                dropped_in_flight: get_u64(b, 48),
                dropped_other: get_u64(b, 56),
                produced: get_u64(b, 64),
            })),
            kind::PROCESS => {
                let event = match b[9] {
                    1 => ProcessEvent::Start,
                    2 => ProcessEvent::Exit,
                    3 => ProcessEvent::Step,
                    4 => ProcessEvent::Network,
                    _ => return Err(DecodeError::BadField("process event")),
                };
                Ok(Record::Process(Process {
                    rec_seq,
                    event,
                    flags,
                    t_mono: get_u64(b, 16),
                    t_real: get_u64(b, 24),
                    pid: get_u32(b, 32),
                    exit_status: get_i32(b, 36),
                    start_time: get_u64(b, 40),
                    rank: get_i32(b, 48),
                    world_size: get_i32(b, 52),
                    signal: get_i32(b, 56),
                    step: get_u64(b, 64),
                }))
            }
            kind::SKIP => {
                let calls = get_u64(b, 48);
                if calls == 0 {
                    return Err(DecodeError::BadField("skip calls"));
                }
                Ok(Record::Skip(Skip {
                    rec_seq,
                    from_rec_seq: get_u64(b, 112),
                    through_rec_seq: get_u64(b, 88),
                    op: b[9],
                    flags,
                    comm_id: get_u64(b, 16),
                    last_seq: get_u64(b, 24),
                    first_seq: get_u64(b, 32),
                    bytes: get_u64(b, 40),
                    calls,
                    modulus: get_u32(b, 56),
                    t_first: get_u64(b, 64),
                    t_last: get_u64(b, 72),
                    inside_ns: get_u64(b, 80),
                    rank: get_i32(b, 96),
                    comm_rank: get_i32(b, 100),
                    comm_size: get_i32(b, 104),
                }))
            }
            kind::LINK => Ok(Record::Link(Link {
                rec_seq,
                op: b[9],
                flags,
                comm_id: get_u64(b, 16),
                seq: get_u64(b, 24),
                op_seq: get_u64(b, 32),
                bytes: get_u64(b, 40),
                steps: get_u32(b, 48),
                channels: b[52],
                peer: get_i32(b, 56),
                t_start: get_u64(b, 64),
                t_end: get_u64(b, 72),
                rank: get_i32(b, 96),
                comm_rank: get_i32(b, 100),
                net_ns: get_u64(b, 80),
                gpu_wait_ns: get_u64(b, 88),
                peer_wait_ns: get_u64(b, 112),
                xfer_bytes: get_u64(b, 104),
                steps_done: get_u32(b, 120),
            })),
            kind::FLOW => {
                let mut local = [0u8; 16];
                let mut remote = [0u8; 16];
                let mut iface = [0u8; 16];
                local.copy_from_slice(&b[48..64]);
                remote.copy_from_slice(&b[80..96]);
                iface.copy_from_slice(&b[112..128]);
                Ok(Record::Flow(Flow {
                    rec_seq,
                    transport: b[9],
                    flags,
                    bytes_sent: get_u64(b, 16),
                    bytes_received: get_u64(b, 24),
                    busy_ns: get_u64(b, 32),
                    retransmits: get_u32(b, 40),
                    srtt_us: get_u32(b, 44),
                    local,
                    t_start: get_u64(b, 64),
                    t_end: get_u64(b, 72),
                    remote,
                    rank: get_i32(b, 96),
                    local_port: get_u16(b, 100),
                    remote_port: get_u16(b, 102),
                    pid: get_u32(b, 104),
                    cwnd: get_u32(b, 108),
                    iface,
                }))
            }
            kind::LINK_EVENT => {
                let mut e = LinkEvent {
                    rec_seq,
                    event: b[9],
                    flags,
                    rank: get_i32(b, 12),
                    t: get_u64(b, 16),
                    count: get_u64(b, 24),
                    port: get_u32(b, 32),
                    qp_num: get_u32(b, 36),
                    peer_qp: get_u32(b, 40),
                    pid: get_u32(b, 44),
                    ..LinkEvent::default()
                };
                e.peer.copy_from_slice(&b[48..64]);
                e.device.copy_from_slice(&b[64..96]);
                e.what.copy_from_slice(&b[96..128]);
                if link_event::name(e.event) == "unknown" {
                    return Err(DecodeError::BadField("link event"));
                }
                Ok(Record::LinkEvent(e))
            }
            other => Err(DecodeError::UnknownKind(other)),
        }
    }
}

fn header(b: &mut RawRecord, kind: u8, op: u8, flags: u16, status: i32) {
    b[8] = kind;
    b[9] = op;
    put_u16(b, 10, flags);
    put_i32(b, 12, status);
}

/// Writes a call/enter record's body (bytes 8..128) straight into `b`: the shim's hot path.
#[inline]
pub fn encode_call(b: &mut RawRecord, kind: u8, c: &Call) {
    header(b, kind, c.op, c.flags, c.status);
    put_u64(b, 16, c.comm_id);
    put_u64(b, 24, c.seq);
    put_u64(b, 32, c.op_seq);
    put_u64(b, 40, c.bytes);
    put_u64(b, 48, c.count);
    put_i32(b, 56, c.peer);
    put_i32(b, 60, c.tag);
    put_u64(b, 64, c.t_enter);
    put_u64(b, 72, c.t_exit);
    put_u64(b, 80, c.gpu_start);
    put_u64(b, 88, c.gpu_end);
    put_i32(b, 96, c.rank);
    put_i32(b, 100, c.comm_rank);
    put_i32(b, 104, c.comm_size);
    put_u16(b, 108, c.dtype);
    b[110] = (c.clock & 0x0f) | (c.lib << 4);
    b[111] = c.sample_shift;
    put_i32(b, 112, c.peer2);
    // Bytes 116..120: the receive tag of a send-receive, the reduction of any other call (-1,
    // as before the field existed, when it is not known).
    let word = if c.op == Op::Sendrecv as u8 {
        c.tag2
    } else if c.red_op != crate::op::red_op::UNKNOWN {
        i32::from(c.red_op)
    } else {
        -1
    };
    put_i32(b, 116, word);
    put_u64(b, 120, c.op_seq2);
}

fn decode_call(b: &RawRecord, rec_seq: u64) -> Call {
    Call {
        rec_seq,
        op: b[9],
        flags: get_u16(b, 10),
        status: get_i32(b, 12),
        comm_id: get_u64(b, 16),
        seq: get_u64(b, 24),
        op_seq: get_u64(b, 32),
        bytes: get_u64(b, 40),
        count: get_u64(b, 48),
        peer: get_i32(b, 56),
        tag: get_i32(b, 60),
        t_enter: get_u64(b, 64),
        t_exit: get_u64(b, 72),
        gpu_start: get_u64(b, 80),
        gpu_end: get_u64(b, 88),
        rank: get_i32(b, 96),
        comm_rank: get_i32(b, 100),
        comm_size: get_i32(b, 104),
        dtype: get_u16(b, 108),
        clock: b[110] & 0x0f,
        lib: b[110] >> 4,
        sample_shift: b[111],
        peer2: get_i32(b, 112),
        tag2: if b[9] == Op::Sendrecv as u8 {
            get_i32(b, 116)
        } else {
            -1
        },
        red_op: match get_i32(b, 116) {
            w if b[9] != Op::Sendrecv as u8 && (1..=i32::from(u8::MAX)).contains(&w) => w as u8,
            _ => crate::op::red_op::UNKNOWN,
        },
        op_seq2: get_u64(b, 120),
    }
}

// Fixed-offset little-endian accessors. Offsets are constants inside a 128-byte array, so the
// compiler removes the bounds checks.
#[inline]
fn put_u64(b: &mut RawRecord, at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
#[inline]
fn put_u32(b: &mut RawRecord, at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
fn put_i32(b: &mut RawRecord, at: usize, v: i32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
#[inline]
fn put_u16(b: &mut RawRecord, at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}
#[inline]
fn get_u64(b: &RawRecord, at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
#[inline]
fn get_u32(b: &RawRecord, at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}
#[inline]
fn get_i32(b: &RawRecord, at: usize) -> i32 {
    get_u32(b, at) as i32
}
#[inline]
fn get_u16(b: &RawRecord, at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::flags;

    pub(crate) fn sample_call() -> Call {
        Call {
            rec_seq: 42,
            op: Op::Allreduce as u8,
            flags: flags::NONBLOCKING | flags::IN_PLACE,
            status: 0,
            comm_id: 0x3f00_0000_0000_0001,
            seq: 7,
            op_seq: 3,
            bytes: 8192,
            count: 1024,
            peer: -1,
            tag: -1,
            t_enter: 1_000,
            t_exit: 2_500,
            gpu_start: 0,
            gpu_end: 0,
            rank: 5,
            comm_rank: 2,
            comm_size: 8,
            dtype: crate::op::dtype::DOUBLE,
            clock: Clock::HostMono as u8,
            lib: crate::op::lib::MPI,
            peer2: -1,
            tag2: -1,
            red_op: crate::op::red_op::SUM,
            op_seq2: 0,
            sample_shift: 0,
        }
    }

    #[test]
    fn link_records_round_trip() {
        let l = Link {
            rec_seq: 9,
            op: Op::Allreduce as u8,
            flags: crate::op::flags::LINK_SEND,
            comm_id: 0xfeed,
            seq: 4,
            op_seq: 3,
            bytes: 1 << 20,
            steps: 8,
            channels: 5,
            peer: 2,
            t_start: 100,
            t_end: 900,
            rank: 7,
            comm_rank: 1,
            net_ns: 600,
            gpu_wait_ns: 150,
            peer_wait_ns: 20,
            xfer_bytes: 3 << 18,
            steps_done: 7,
        };
        assert_eq!(l.net_rate(), Some((3u64 << 18) as f64 * 1e9 / 600.0));
        assert_eq!(Link { steps_done: 0, ..l }.net_rate(), None);
        let f = Flow {
            rec_seq: 9,
            transport: flow_transport::TCP,
            flags: crate::op::flags::FLOW_CLOSED,
            bytes_sent: 1 << 30,
            bytes_received: 77,
            busy_ns: 5_000_000,
            retransmits: 3,
            srtt_us: 250,
            cwnd: 10,
            local: Flow::addr_bytes("10.1.2.3".parse().expect("ip")),
            remote: Flow::addr_bytes("fe80::1".parse().expect("ip")),
            local_port: 40000,
            remote_port: 5201,
            t_start: 100,
            t_end: 1_000_000_100,
            rank: 5,
            pid: 4242,
            iface: Flow::iface_bytes("enp65s0f0np0"),
        };
        assert_eq!(
            Record::decode(&Record::Flow(f).encode()),
            Ok(Record::Flow(f))
        );
        assert_eq!(f.iface_name().as_deref(), Some("enp65s0f0np0"));
        assert_eq!(Flow::default().iface_name(), None);
        assert_eq!(
            Flow {
                iface: Flow::iface_bytes("a-name-longer-than-15"),
                ..f
            }
            .iface_name()
            .as_deref(),
            Some("a-name-longer-t")
        );
        assert_eq!(f.local_addr().to_string(), "10.1.2.3:40000");
        assert_eq!(f.remote_addr().to_string(), "[fe80::1]:5201");
        let raw = Record::Link(l).encode();
        assert_eq!(raw[8], kind::LINK);
        assert_eq!(Record::decode(&raw), Ok(Record::Link(l)));
    }

    #[test]
    fn a_link_event_round_trips_and_names_its_parts() {
        let e = LinkEvent {
            rec_seq: 4,
            event: link_event::QP_ERROR,
            flags: 0,
            t: 123_456_789,
            count: 1,
            port: 1,
            qp_num: 0x1a2,
            peer_qp: 0x3b4,
            pid: 4242,
            rank: 7,
            peer: Flow::addr_bytes("10.0.0.2".parse().expect("ip")),
            device: LinkEvent::name_bytes("mlx5_0"),
            what: LinkEvent::name_bytes("port_rcv_remote_physical_errors_and_more"),
        };
        assert_eq!(
            Record::decode(&Record::LinkEvent(e).encode()),
            Ok(Record::LinkEvent(e))
        );
        assert_eq!(e.device_name(), "mlx5_0");
        // Truncated to 32 bytes.
        assert_eq!(e.what_name(), "port_rcv_remote_physical_errors_");
        assert_eq!(e.peer_addr(), Some("10.0.0.2".parse().expect("ip")));
        assert_eq!(LinkEvent::default().peer_addr(), None);
        // An event byte nobody wrote is a decoding error, not a record.
        let mut raw = Record::LinkEvent(e).encode();
        raw[9] = 200;
        assert!(Record::decode(&raw).is_err());
        // A name cut inside a multi-byte character keeps whole characters.
        let n = LinkEvent::name_bytes(&"é".repeat(20));
        assert_eq!(nul_text(&n), "é".repeat(16));
    }

    #[test]
    fn nccl_calls_and_failed_communicators_round_trip() {
        let call = Call {
            lib: crate::op::lib::NCCL,
            flags: flags::GRAPH_CAPTURED,
            gpu_start: 1_200,
            gpu_end: 9_700,
            ..sample_call()
        };
        let raw = Record::Call(call).encode();
        assert_eq!(
            raw[110], 0x10,
            "clock in the low bits, library in the high ones"
        );
        let Ok(Record::Call(back)) = Record::decode(&raw) else {
            panic!("not a call");
        };
        assert_eq!(back, call);
        assert_eq!(
            back.span(),
            (1_200, 9_700),
            "the GPU interval is the call's span"
        );
        assert_eq!(
            sample_call().span(),
            (1_000, 2_500),
            "without one, the host's"
        );

        let mut c = Comm::new(CommEvent::Failed, 0xabc, 0, 5, 1, 1, 4, 0);
        c.rec_seq = 7;
        c.flags = flags::NCCL_COMM | flags::COMM_ASYNC_ERROR;
        c.status = 6;
        c.device = 3;
        c.set_name(b"NET/IB : Got completion with error 12");
        let Ok(Record::Comm(back)) = Record::decode(&Record::Comm(c).encode()) else {
            panic!("not a comm record");
        };
        assert_eq!(
            (back.event, back.status, back.device, back.name()),
            (CommEvent::Failed, 6, 3, c.name())
        );
        // Records written before the device was recorded read as "no device".
        let mut made = Comm::new(CommEvent::Created, 1, 0, 5, 0, 0, 2, 0);
        made.rec_seq = 8;
        let mut old = Record::Comm(made).encode();
        old[60..64].fill(0);
        let Ok(Record::Comm(back)) = Record::decode(&old) else {
            panic!("not a comm record");
        };
        assert_eq!(back.device, -1);
    }

    #[test]
    fn every_kind_round_trips() {
        let mut comm = Comm::new(CommEvent::Created, 9, 1, 77, 3, 1, 4, 0);
        comm.set_name(b"TENSOR_MODEL_PARALLEL_GROUP");
        let records = [
            Record::Call(sample_call()),
            Record::Enter(Call {
                rec_seq: 43,
                ..sample_call()
            }),
            Record::Comm(Comm {
                rec_seq: 44,
                ..comm
            }),
            Record::Heartbeat(Heartbeat {
                rec_seq: 45,
                flags: flags::FINAL,
                t_mono: 1,
                t_real: 2,
                in_flight: 3,
                rank: 4,
                dropped_ring_full: 5,
                dropped_in_flight: 6,
                dropped_other: 7,
                produced: 8,
            }),
            Record::Process(Process {
                rec_seq: 46,
                event: ProcessEvent::Exit,
                t_mono: 1,
                t_real: 2,
                pid: 1234,
                exit_status: 3,
                start_time: 99,
                rank: 0,
                world_size: 8,
                flags: flags::OBSERVED,
                signal: 9,
                step: 0,
            }),
            Record::Process(Process {
                rec_seq: 47,
                event: ProcessEvent::Step,
                t_mono: 5,
                t_real: 6,
                pid: 1234,
                exit_status: EXIT_STATUS_UNKNOWN,
                start_time: 99,
                rank: 0,
                world_size: 8,
                flags: 0,
                signal: 0,
                step: 12_345,
            }),
            Record::Call(Call {
                rec_seq: 48,
                sample_shift: 3,
                ..sample_call()
            }),
            Record::Skip(Skip {
                rec_seq: 60,
                from_rec_seq: 12,
                through_rec_seq: 49,
                op: Op::Allreduce as u8,
                flags: flags::NONBLOCKING,
                comm_id: 0xfeed,
                first_seq: 10,
                last_seq: 16,
                calls: 7,
                bytes: 7 << 20,
                inside_ns: 12_345_678,
                t_first: 100,
                t_last: 200,
                rank: 5,
                comm_rank: 1,
                comm_size: 8,
                modulus: 8,
            }),
        ];
        for r in records {
            assert_eq!(Record::decode(&r.encode()), Ok(r), "{}", r.kind_name());
        }
    }

    #[test]
    fn a_skip_of_no_calls_is_refused() {
        let mut raw = Record::Skip(Skip {
            rec_seq: 10,
            through_rec_seq: 4,
            calls: 2,
            ..Skip::default()
        })
        .encode();
        assert!(matches!(Record::decode(&raw), Ok(Record::Skip(_))));
        raw[48..56].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(
            Record::decode(&raw),
            Err(DecodeError::BadField("skip calls"))
        );
    }

    #[test]
    fn comm_names_are_cut_at_a_char_boundary() {
        let mut c = Comm::new(CommEvent::Named, 1, 0, 0, 0, 0, 1, 0);
        let long = "é".repeat(40); // 80 bytes
        c.set_name(long.as_bytes());
        assert_eq!(c.name(), "é".repeat(32));
        c.set_name(b"ok\xff\xfe");
        assert_eq!(c.name(), "ok");
    }

    #[test]
    fn a_network_record_round_trips() {
        let r = Record::Process(Process {
            rec_seq: 3,
            event: ProcessEvent::Network,
            flags: 0,
            t_mono: 10,
            t_real: 20,
            pid: 42,
            exit_status: EXIT_STATUS_UNKNOWN,
            start_time: 7,
            rank: 5,
            world_size: 8,
            signal: 0,
            step: 400_000,
        });
        assert_eq!(Record::decode(&r.encode()), Ok(r));
    }

    #[test]
    fn empty_and_unknown_slots_are_rejected() {
        assert_eq!(Record::decode(&[0; RECORD_SIZE]), Err(DecodeError::Empty));
        let mut b = Record::Call(sample_call()).encode();
        b[8] = 99;
        assert_eq!(Record::decode(&b), Err(DecodeError::UnknownKind(99)));
        let mut b = Record::Process(Process {
            rec_seq: 1,
            event: ProcessEvent::Start,
            t_mono: 0,
            t_real: 0,
            pid: 1,
            exit_status: 0,
            start_time: 0,
            rank: 0,
            world_size: 1,
            flags: 0,
            signal: 0,
            step: 0,
        })
        .encode();
        b[9] = 7;
        assert_eq!(
            Record::decode(&b),
            Err(DecodeError::BadField("process event"))
        );
    }
}
