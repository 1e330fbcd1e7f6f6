//! commscope's eBPF programs.
//!
//! - **TCP** (tracepoints): `tcp:tcp_probe` keeps each established socket's bytes sent (the
//!   advance of `snd_una`), bytes received and smoothed RTT in `TCP_FLOWS`;
//!   `tcp:tcp_retransmit_skb` counts its retransmissions there; `sock:inet_sock_set_state`
//!   reports connections opening and closing on the ring buffer. Field offsets come from
//!   tracefs through `LAYOUT`, so no kernel headers are compiled in.
//! - **RDMA verbs control path** (uprobes on libibverbs' exported functions): queue pairs
//!   created, moved between states (with their peer) and destroyed; memory registrations with
//!   their latency; asynchronous events. Never the data path (post/poll are inline and busy).
//! - **NCCL's network layer** (uprobes on `ncclIbIsend`/`ncclIbIrecv` and the socket
//!   transport's, resolved from the library's symbol table): bytes and requests per connection
//!   in `NET_CONNS`; the connections themselves from connect/accept. Never the `test` pollers.
//! - **NCCL's API** (uprobes on its exported functions, for processes without the preload):
//!   communicators created (with their unique id) and destroyed; every collective and
//!   point-to-point call, entry and return (host timing: the GPU work runs later). Processes the
//!   agent knows to carry the preload are skipped (`NCCL_SKIP`). x86-64 argument registers and
//!   stack.
//! - **Who ends a process** (tracepoint `signal:signal_generate`): the sender of each signal
//!   that ends a process from outside (SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM), the first of
//!   each per target, kept in `KILLS` for the agent to read once the process has ended — what
//!   tells the rank the OOM killer or an operator killed from the ranks its launcher then took
//!   down.
//!
//! Every program returns 0 whatever happens: a failed read or a full map is counted in
//! `STATS`, never retried, and nothing here can block or fail the probed call.

#![no_std]
#![no_main]

use aya_ebpf::EbpfContext;
use aya_ebpf::helpers::{
    bpf_get_attach_cookie, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
    bpf_probe_read_kernel, bpf_probe_read_user, bpf_probe_read_user_buf,
};
use aya_ebpf::macros::{map, tracepoint, uprobe, uretprobe};
use aya_ebpf::maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf};
use aya_ebpf::programs::{ProbeContext, RetProbeContext, TracePointContext};
use commscope_ebpf_common::{
    AsyncEvent, ConnEvent, Head, KILL_SIGNALS, Kill, MrEvent, NcclCallEvent, NcclInitEvent, NetKey,
    NetStats, QpEvent, SigLayout, TcpFlow, TcpStateEvent, TpLayout, ibv, kill_key, kind, nccl_api,
    net, stat, tcp_state, verbs_fn,
};

#[map]
static LAYOUT: Array<TpLayout> = Array::with_max_entries(1, 0);
#[map]
static SIG_LAYOUT: Array<SigLayout> = Array::with_max_entries(1, 0);
/// The first sender of each signal of [`KILL_SIGNALS`] per target (key [`kill_key`]).
#[map]
static KILLS: LruHashMap<u64, Kill> = LruHashMap::with_max_entries(8192, 0);
#[map]
static TCP_FLOWS: LruHashMap<u64, TcpFlow> = LruHashMap::with_max_entries(16384, 0);
#[map]
static NET_CONNS: LruHashMap<NetKey, NetStats> = LruHashMap::with_max_entries(16384, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// Entry state carried to the return probe, per thread (`pid_tgid`).
#[map]
static QP_PENDING: HashMap<u64, QpEvent> = HashMap::with_max_entries(4096, 0);
#[map]
static MR_PENDING: HashMap<u64, MrPending> = HashMap::with_max_entries(4096, 0);
#[map]
static ASYNC_PENDING: HashMap<u64, [u64; 2]> = HashMap::with_max_entries(4096, 0);
#[map]
static CONN_PENDING: HashMap<u64, [u64; 2]> = HashMap::with_max_entries(4096, 0);
#[map]
static NCCL_INIT_PENDING: HashMap<u64, NcclInitEvent> = HashMap::with_max_entries(4096, 0);
#[map]
static NCCL_CALL_PENDING: HashMap<u64, NcclCallEvent> = HashMap::with_max_entries(4096, 0);
/// Processes whose NCCL calls the preload records (the agent keeps this): not probed twice.
#[map]
static NCCL_SKIP: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

#[repr(C)]
#[derive(Clone, Copy)]
struct MrPending {
    ts_ns: u64,
    addr: u64,
    length: u64,
    mr: u64,
    func: u32,
    /// Nested registrations on one thread (one exported function calling another): only the
    /// outermost reports.
    depth: u32,
}

const IPPROTO_TCP: u16 = 6;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

#[inline(always)]
fn count(which: u32) {
    if let Some(v) = STATS.get_ptr_mut(which) {
        // SAFETY: a per-CPU slot, written only from this CPU with preemption off.
        unsafe { *v += 1 };
    }
}

#[inline(always)]
fn head(kind: u32) -> Head {
    let id = bpf_get_current_pid_tgid();
    Head {
        kind,
        pid: (id >> 32) as u32,
        tid: id as u32,
        _pad: 0,
        // SAFETY: a helper without arguments.
        ts_ns: unsafe { bpf_ktime_get_ns() },
    }
}

#[inline(always)]
fn emit<T: 'static>(ev: &T) {
    if EVENTS.output::<T>(ev, 0).is_err() {
        count(stat::RINGBUF_FULL);
    }
}

/// A tracepoint field at `off`, or the default when the layout says it is absent.
#[inline(always)]
fn field<T: Default>(ctx: &TracePointContext, off: u16) -> T {
    if off == TpLayout::ABSENT {
        return T::default();
    }
    // SAFETY: `off` comes from the event's own format file, within its record.
    match unsafe { ctx.read_at::<T>(off as usize) } {
        Ok(v) => v,
        Err(_) => {
            count(stat::READ_FAILED);
            T::default()
        }
    }
}

/// A user-space value at `addr`, or `None` (counted).
#[inline(always)]
fn user<T>(addr: u64) -> Option<T> {
    // SAFETY: `bpf_probe_read_user` checks the address; a bad one returns an error.
    match unsafe { bpf_probe_read_user(addr as *const T) } {
        Ok(v) => Some(v),
        Err(_) => {
            count(stat::READ_FAILED);
            None
        }
    }
}

#[tracepoint]
pub fn tcp_probe(ctx: TracePointContext) -> u32 {
    let Some(l) = LAYOUT.get(0) else { return 0 };
    let sk: u64 = field(&ctx, l.probe_skaddr);
    let snd_una: u32 = field(&ctx, l.probe_snd_una);
    let snd_nxt: u32 = field(&ctx, l.probe_snd_nxt);
    let data_len: u16 = field(&ctx, l.probe_data_len);
    let srtt: u32 = field(&ctx, l.probe_srtt);
    let cwnd: u32 = field(&ctx, l.probe_snd_cwnd);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let exact = l.sock_bytes_received != TpLayout::ABSENT && l.sock_bytes_acked != TpLayout::ABSENT;
    let (received, acked) = if exact {
        (
            sock_u64(sk, l.sock_bytes_received),
            sock_u64(sk, l.sock_bytes_acked),
        )
    } else {
        (0, 0)
    };
    let sport: u16 = field(&ctx, l.probe_sport);
    let dport: u16 = field(&ctx, l.probe_dport);
    // SAFETY: the socket's events are serialised by its lock; a racing eviction can at worst
    // lose one sample.
    let existing = TCP_FLOWS
        .get_ptr_mut(&sk)
        .map(|f| unsafe { &mut *f })
        // A freed socket's memory is soon another socket: an entry whose ports differ is a
        // connection that is gone, and this one starts afresh.
        .filter(|f| f.sport == sport && f.dport == dport);
    if let Some(f) = existing {
        if exact {
            f.bytes_received = received;
            f.bytes_acked = acked;
        } else {
            let advance = snd_una.wrapping_sub(f.last_snd_una);
            // A stale `snd_una` (a reordered sample) reads as a huge advance: skip it.
            if advance < 1 << 30 {
                f.bytes_acked += advance as u64;
            }
            f.bytes_received += data_len as u64;
        }
        // Busy time: data outstanding now (before this segment's acknowledgement is taken).
        if (snd_nxt.wrapping_sub(snd_una) as i32) > 0 {
            let dt = now.saturating_sub(f.last_ns);
            // Outstanding right after the last sample too (what was sent by then is not all
            // acknowledged yet): busy throughout. Else the sending began in between: at most
            // one round trip of it.
            if (f.last_snd_nxt.wrapping_sub(snd_una) as i32) > 0 {
                f.busy_ns += dt;
            } else {
                f.busy_ns += dt.min(srtt as u64 * 1000);
            }
        }
        f.last_snd_una = snd_una;
        f.last_snd_nxt = snd_nxt;
        f.segs_in += 1;
        f.srtt_us = srtt;
        f.srtt_sum_us += srtt as u64;
        f.srtt_samples += 1;
        f.snd_cwnd = cwnd;
        f.last_ns = now;
        return 0;
    }
    let family: u16 = field(&ctx, l.probe_family);
    let mut f = TcpFlow {
        family,
        sport,
        dport,
        first_ns: now,
        last_ns: now,
        bytes_received: if exact { received } else { data_len as u64 },
        bytes_acked: acked,
        segs_in: 1,
        srtt_us: srtt,
        srtt_sum_us: srtt as u64,
        srtt_samples: 1,
        snd_cwnd: cwnd,
        last_snd_una: snd_una,
        last_snd_nxt: snd_nxt,
        ..TcpFlow::default()
    };
    // `saddr`/`daddr` are a `struct sockaddr_in` or `sockaddr_in6` (28 bytes).
    let src: [u8; 28] = field(&ctx, l.probe_saddr);
    let dst: [u8; 28] = field(&ctx, l.probe_daddr);
    if family == AF_INET {
        f.saddr[..4].copy_from_slice(&src[4..8]);
        f.daddr[..4].copy_from_slice(&dst[4..8]);
    } else if family == AF_INET6 {
        f.saddr.copy_from_slice(&src[8..24]);
        f.daddr.copy_from_slice(&dst[8..24]);
    }
    if TCP_FLOWS.insert(&sk, &f, 0).is_err() {
        count(stat::MAP_FULL);
    }
    0
}

/// A `u64` member of the kernel's `struct tcp_sock` at `sk + off`, or 0 (counted).
#[inline(always)]
fn sock_u64(sk: u64, off: u16) -> u64 {
    // SAFETY: `bpf_probe_read_kernel` checks the address; `off` comes from the kernel's BTF.
    match unsafe { bpf_probe_read_kernel((sk + off as u64) as *const u64) } {
        Ok(v) => v,
        Err(_) => {
            count(stat::READ_FAILED);
            0
        }
    }
}

#[tracepoint]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    let Some(l) = LAYOUT.get(0) else { return 0 };
    let sk: u64 = field(&ctx, l.retrans_skaddr);
    if let Some(f) = TCP_FLOWS.get_ptr_mut(&sk) {
        // SAFETY: as in `tcp_probe`.
        unsafe { (*f).retransmits += 1 };
    }
    0
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    let Some(l) = LAYOUT.get(0) else { return 0 };
    let protocol: u16 = field(&ctx, l.state_protocol);
    if protocol != IPPROTO_TCP {
        return 0;
    }
    let oldstate: i32 = field(&ctx, l.state_oldstate);
    let newstate: i32 = field(&ctx, l.state_newstate);
    let (old, new) = (oldstate as u8, newstate as u8);
    let reported = new == tcp_state::ESTABLISHED
        || old == tcp_state::ESTABLISHED
        || new == tcp_state::CLOSE
        || new == tcp_state::SYN_SENT;
    if !reported {
        return 0;
    }
    let skaddr: u64 = field(&ctx, l.state_skaddr);
    // `tcp_probe` runs before a segment is counted: bring the flow's totals up to date at the
    // state change, so that a closed flow's last totals are exact.
    if l.sock_bytes_received != TpLayout::ABSENT
        && l.sock_bytes_acked != TpLayout::ABSENT
        && let Some(f) = TCP_FLOWS.get_ptr_mut(&skaddr)
    {
        let received = sock_u64(skaddr, l.sock_bytes_received);
        let acked = sock_u64(skaddr, l.sock_bytes_acked);
        // SAFETY: as in `tcp_probe`.
        unsafe {
            (*f).bytes_received = received;
            (*f).bytes_acked = acked;
        }
    }
    let family: u16 = field(&ctx, l.state_family);
    let mut ev = TcpStateEvent {
        head: head(kind::TCP_STATE),
        skaddr,
        family,
        sport: field(&ctx, l.state_sport),
        dport: field(&ctx, l.state_dport),
        oldstate: old,
        newstate: new,
        comm: bpf_get_current_comm().unwrap_or_default(),
        ..TcpStateEvent::default()
    };
    if family == AF_INET {
        let s: [u8; 4] = field(&ctx, l.state_saddr);
        let d: [u8; 4] = field(&ctx, l.state_daddr);
        ev.saddr[..4].copy_from_slice(&s);
        ev.daddr[..4].copy_from_slice(&d);
    } else {
        ev.saddr = field(&ctx, l.state_saddr_v6);
        ev.daddr = field(&ctx, l.state_daddr_v6);
    }
    emit(&ev);
    0
}

/// `result` of a signal that was queued for its target (`TRACE_SIGNAL_DELIVERED`).
const SIGNAL_DELIVERED: i32 = 0;
/// `bpf_map_update_elem`'s flag: only when the key is absent (the first sender stays).
const BPF_NOEXIST: u64 = 1;

#[tracepoint]
pub fn signal_generate(ctx: TracePointContext) -> u32 {
    let Some(l) = SIG_LAYOUT.get(0) else { return 0 };
    let sig: i32 = field(&ctx, l.sig);
    if !KILL_SIGNALS.contains(&sig) {
        return 0;
    }
    let result: i32 = field(&ctx, l.result);
    if result != SIGNAL_DELIVERED {
        return 0;
    }
    let pid: i32 = field(&ctx, l.pid);
    let kill = Kill {
        // SAFETY: a helper without arguments.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        sender: (bpf_get_current_pid_tgid() >> 32) as u32,
        code: field(&ctx, l.code),
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    // A later signal of the same kind (a launcher's second SIGKILL) leaves the first sender.
    let _ = KILLS.insert(&kill_key(pid as u32, sig), &kill, BPF_NOEXIST);
    0
}

/// The name of the device behind a `struct ibv_context *`.
#[inline(always)]
fn device_name(context: u64) -> [u8; 16] {
    let mut name = [0u8; 16];
    if context == 0 {
        return name;
    }
    if let Some(dev) = user::<u64>(context + ibv::CONTEXT_DEVICE as u64) {
        // SAFETY: checked by the helper; a bad address leaves the name empty.
        if unsafe {
            bpf_probe_read_user_buf((dev + ibv::DEVICE_NAME as u64) as *const u8, &mut name)
        }
        .is_err()
        {
            count(stat::READ_FAILED);
        }
    }
    name
}

/// Fills a QP event's identity from the `struct ibv_qp *`.
#[inline(always)]
fn qp_identity(ev: &mut QpEvent, qp: u64) {
    ev.qp = qp;
    if qp == 0 {
        return;
    }
    ev.qp_num = user::<u32>(qp + ibv::QP_QP_NUM as u64).unwrap_or(0);
    if let Some(context) = user::<u64>(qp + ibv::QP_CONTEXT as u64) {
        ev.device = device_name(context);
    }
}

#[uretprobe]
pub fn ibv_create_qp_ret(ctx: RetProbeContext) -> u32 {
    let qp: u64 = ctx.ret();
    let mut ev = QpEvent {
        head: head(kind::QP_CREATE),
        state: -1,
        ..QpEvent::default()
    };
    qp_identity(&mut ev, qp);
    if qp != 0 {
        ev.state = user::<i32>(qp + ibv::QP_QP_TYPE as u64).unwrap_or(-1);
    } else {
        ev.ret = -1;
    }
    emit(&ev);
    0
}

#[uprobe]
pub fn ibv_modify_qp(ctx: ProbeContext) -> u32 {
    let (Some(qp), Some(attr), Some(mask)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(1), ctx.arg::<i32>(2))
    else {
        return 0;
    };
    let mut ev = QpEvent {
        head: head(kind::QP_MODIFY),
        state: -1,
        attr_mask: mask,
        ..QpEvent::default()
    };
    qp_identity(&mut ev, qp);
    if mask & ibv::MASK_STATE != 0 {
        ev.state = user::<i32>(attr + ibv::ATTR_QP_STATE as u64).unwrap_or(-1);
    }
    if mask & ibv::MASK_DEST_QPN != 0 {
        ev.dest_qp_num = user::<u32>(attr + ibv::ATTR_DEST_QP_NUM as u64).unwrap_or(0);
    }
    if mask & ibv::MASK_AV != 0 {
        ev.dgid = user::<[u8; 16]>(attr + ibv::ATTR_AH_DGID as u64).unwrap_or_default();
        ev.dlid = user::<u16>(attr + ibv::ATTR_AH_DLID as u64).unwrap_or(0);
        ev.is_global = user::<u8>(attr + ibv::ATTR_AH_IS_GLOBAL as u64).unwrap_or(0);
        ev.port_num = user::<u8>(attr + ibv::ATTR_AH_PORT_NUM as u64).unwrap_or(0);
        ev.sgid_index = user::<u8>(attr + ibv::ATTR_AH_SGID_INDEX as u64).unwrap_or(0);
    }
    if QP_PENDING
        .insert(&bpf_get_current_pid_tgid(), &ev, 0)
        .is_err()
    {
        count(stat::MAP_FULL);
    }
    0
}

#[uretprobe]
pub fn ibv_modify_qp_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: this thread's own entry; nothing else writes it while the call is in flight.
    let Some(pending) = (unsafe { QP_PENDING.get(&id) }) else {
        return 0;
    };
    let mut ev = *pending;
    let _ = QP_PENDING.remove(&id);
    ev.ret = ctx.ret::<i32>();
    emit(&ev);
    0
}

#[uprobe]
pub fn ibv_destroy_qp(ctx: ProbeContext) -> u32 {
    let Some(qp) = ctx.arg::<u64>(0) else {
        return 0;
    };
    let mut ev = QpEvent {
        head: head(kind::QP_DESTROY),
        state: -1,
        ..QpEvent::default()
    };
    qp_identity(&mut ev, qp);
    emit(&ev);
    0
}

/// Entry of every registration function (the cookie says which): `addr` is argument 1 and
/// `length` argument 2 in all of them (for `ibv_reg_dmabuf_mr`, the offset in the buffer).
#[uprobe]
pub fn ibv_reg_mr(ctx: ProbeContext) -> u32 {
    // SAFETY: the program's own context.
    let func = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    mr_enter(
        func,
        ctx.arg::<u64>(1).unwrap_or(0),
        ctx.arg::<u64>(2).unwrap_or(0),
        0,
    );
    0
}

#[uprobe]
pub fn ibv_dereg_mr(ctx: ProbeContext) -> u32 {
    let mr = ctx.arg::<u64>(0).unwrap_or(0);
    let addr = user::<u64>(mr + ibv::MR_ADDR as u64).unwrap_or(0);
    let length = user::<u64>(mr + ibv::MR_LENGTH as u64).unwrap_or(0);
    mr_enter(verbs_fn::DEREG_MR, addr, length, mr);
    0
}

#[inline(always)]
fn mr_enter(func: u32, addr: u64, length: u64, mr: u64) {
    let id = bpf_get_current_pid_tgid();
    if let Some(p) = MR_PENDING.get_ptr_mut(&id) {
        // SAFETY: this thread's own entry.
        unsafe { (*p).depth += 1 };
        return;
    }
    let p = MrPending {
        // SAFETY: a helper without arguments.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        addr,
        length,
        mr,
        func,
        depth: 1,
    };
    if MR_PENDING.insert(&id, &p, 0).is_err() {
        count(stat::MAP_FULL);
    }
}

/// Return of every registration and deregistration function.
#[uretprobe]
pub fn ibv_mr_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(p) = MR_PENDING.get_ptr_mut(&id) else {
        return 0;
    };
    // SAFETY: this thread's own entry.
    let p = unsafe { &mut *p };
    if p.depth > 1 {
        p.depth -= 1;
        return 0;
    }
    let ret: u64 = ctx.ret();
    let dereg = p.func == verbs_fn::DEREG_MR;
    let mut ev = MrEvent {
        head: head(if dereg { kind::MR_DEREG } else { kind::MR_REG }),
        mr: if dereg { p.mr } else { ret },
        addr: p.addr,
        length: p.length,
        func: p.func,
        ret: if dereg { ret as i32 } else { 0 },
        ..MrEvent::default()
    };
    ev.latency_ns = ev.head.ts_ns.saturating_sub(p.ts_ns);
    let _ = MR_PENDING.remove(&id);
    emit(&ev);
    0
}

#[uprobe]
pub fn ibv_get_async_event(ctx: ProbeContext) -> u32 {
    let (Some(context), Some(event)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) else {
        return 0;
    };
    if ASYNC_PENDING
        .insert(&bpf_get_current_pid_tgid(), &[context, event], 0)
        .is_err()
    {
        count(stat::MAP_FULL);
    }
    0
}

/// `enum ibv_event_type` values whose element is a QP, and those whose element is a port.
const QP_EVENTS: u32 = 1 << 1 | 1 << 2 | 1 << 3 | 1 << 4 | 1 << 5 | 1 << 6 | 1 << 7 | 1 << 16;
const PORT_EVENTS: u32 = 1 << 9 | 1 << 10 | 1 << 11 | 1 << 12 | 1 << 13 | 1 << 17 | 1 << 18;

#[uretprobe]
pub fn ibv_get_async_event_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: this thread's own entry.
    let Some(&[context, event]) = (unsafe { ASYNC_PENDING.get(&id) }) else {
        return 0;
    };
    let _ = ASYNC_PENDING.remove(&id);
    let ret: i32 = ctx.ret();
    if ret != 0 {
        return 0;
    }
    let event_type = user::<u32>(event + ibv::ASYNC_EVENT_TYPE as u64).unwrap_or(u32::MAX);
    let element = user::<u64>(event + ibv::ASYNC_ELEMENT as u64).unwrap_or(0);
    let mut ev = AsyncEvent {
        head: head(kind::ASYNC_EVENT),
        event_type,
        ret,
        device: device_name(context),
        ..AsyncEvent::default()
    };
    if event_type < 32 && QP_EVENTS & (1 << event_type) != 0 {
        ev.element = element;
        ev.qp_num = user::<u32>(element + ibv::QP_QP_NUM as u64).unwrap_or(0);
    } else if event_type < 32 && PORT_EVENTS & (1 << event_type) != 0 {
        ev.port_num = element as u32;
    } else {
        ev.element = element;
    }
    emit(&ev);
    0
}

#[inline(always)]
fn net_add(cookie: u64, comm: u64, bytes: u64) {
    let key = NetKey {
        pid: (bpf_get_current_pid_tgid() >> 32) as u32,
        side: net::side(cookie),
        comm,
    };
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    if let Some(s) = NET_CONNS.get_ptr_mut(&key) {
        // SAFETY: one proxy thread drives a connection; a race loses at most one sample.
        let s = unsafe { &mut *s };
        s.bytes += bytes;
        s.requests += 1;
        s.last_ns = now;
        return;
    }
    let s = NetStats {
        first_ns: now,
        last_ns: now,
        bytes,
        requests: 1,
        transport: net::transport(cookie),
        _pad: 0,
    };
    if NET_CONNS.insert(&key, &s, 0).is_err() {
        count(stat::MAP_FULL);
    }
}

/// `isend(void *sendComm, void *data, size_t size, int tag, void *mhandle, …)`.
#[uprobe]
pub fn net_isend(ctx: ProbeContext) -> u32 {
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let (Some(comm), Some(size)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(2)) else {
        return 0;
    };
    net_add(cookie, comm, size);
    0
}

/// `irecv(void *recvComm, int n, void **data, size_t *sizes, …)`: up to 8 receives.
#[uprobe]
pub fn net_irecv(ctx: ProbeContext) -> u32 {
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let (Some(comm), Some(n), Some(sizes)) =
        (ctx.arg::<u64>(0), ctx.arg::<i32>(1), ctx.arg::<u64>(3))
    else {
        return 0;
    };
    let all: [u64; 8] = user(sizes).unwrap_or_default();
    let mut bytes = 0u64;
    let mut i = 0;
    while i < 8 {
        if (i as i32) < n {
            bytes += all[i];
        }
        i += 1;
    }
    net_add(cookie, comm, bytes);
    0
}

/// Entry of connect/accept: remembers where the new comm will be written.
#[uprobe]
pub fn net_connect(ctx: ProbeContext) -> u32 {
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    // The argument the cookie names. The six are read at constant offsets and picked from a
    // stack copy (volatile, so the compiler cannot fold the choice back into a context access
    // at a computed offset, which the verifier refuses).
    let n = net::out_arg(cookie) as usize;
    let mut args = [0u64; 6];
    let read = [
        ctx.arg::<u64>(0),
        ctx.arg::<u64>(1),
        ctx.arg::<u64>(2),
        ctx.arg::<u64>(3),
        ctx.arg::<u64>(4),
        ctx.arg::<u64>(5),
    ];
    let mut i = 0;
    while i < 6 {
        // SAFETY: `i` < 6, within the array.
        unsafe { core::ptr::write_volatile(args.as_mut_ptr().add(i), read[i].unwrap_or(0)) };
        i += 1;
    }
    if n >= 6 {
        return 0;
    }
    // SAFETY: `n` < 6, within the array.
    let out = unsafe { core::ptr::read_volatile(args.as_ptr().add(n)) };
    if out == 0 {
        return 0;
    }
    if CONN_PENDING
        .insert(&bpf_get_current_pid_tgid(), &[out, cookie], 0)
        .is_err()
    {
        count(stat::MAP_FULL);
    }
    0
}

/// Return of connect/accept: reports the comm once the call has produced one (NCCL calls them
/// repeatedly until it has).
#[uretprobe]
pub fn net_connect_ret(_ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    // SAFETY: this thread's own entry.
    let Some(&[out, cookie]) = (unsafe { CONN_PENDING.get(&id) }) else {
        return 0;
    };
    let _ = CONN_PENDING.remove(&id);
    let comm = user::<u64>(out).unwrap_or(0);
    if comm != 0 {
        emit(&ConnEvent {
            head: head(kind::NET_CONN),
            comm,
            side: net::side(cookie),
            transport: net::transport(cookie),
        });
    }
    0
}

/// Whether this process's NCCL calls are recorded by the preload.
#[inline(always)]
fn nccl_skipped() -> bool {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: a plain lookup of a value that is never written in place.
    unsafe { NCCL_SKIP.get(&pid) }.is_some()
}

/// The probed function's arguments 0–7 (x86-64: six registers, then the stack above the return
/// address), in a stack copy that a computed index can read.
#[inline(always)]
fn call_args(ctx: &ProbeContext) -> [u64; 8] {
    // SAFETY: the probe's saved registers of the current task.
    let sp = unsafe { (*ctx.regs).rsp };
    let read = [
        ctx.arg::<u64>(0).unwrap_or(0),
        ctx.arg::<u64>(1).unwrap_or(0),
        ctx.arg::<u64>(2).unwrap_or(0),
        ctx.arg::<u64>(3).unwrap_or(0),
        ctx.arg::<u64>(4).unwrap_or(0),
        ctx.arg::<u64>(5).unwrap_or(0),
        user::<u64>(sp + 8).unwrap_or(0),
        user::<u64>(sp + 16).unwrap_or(0),
    ];
    let mut args = [0u64; 8];
    let mut i = 0;
    while i < 8 {
        // SAFETY: `i` < 8, within the array (volatile: see `net_connect`).
        unsafe { core::ptr::write_volatile(args.as_mut_ptr().add(i), read[i]) };
        i += 1;
    }
    args
}

/// Argument `n` of [`call_args`], or `none` when the cookie says there is none.
#[inline(always)]
fn pick(args: &[u64; 8], n: u32, none: u64) -> u64 {
    if n >= 8 {
        return none;
    }
    // SAFETY: `n` < 8, within the array.
    unsafe { core::ptr::read_volatile(args.as_ptr().add(n as usize)) }
}

/// Entry of an NCCL collective or point-to-point call: the cookie says which, and where its
/// arguments are.
#[uprobe]
pub fn nccl_call(ctx: ProbeContext) -> u32 {
    if nccl_skipped() {
        return 0;
    }
    let id = bpf_get_current_pid_tgid();
    if let Some(p) = NCCL_CALL_PENDING.get_ptr_mut(&id) {
        // SAFETY: this thread's own entry.
        unsafe { (*p).depth += 1 };
        return 0;
    }
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let args = call_args(&ctx);
    let none = u64::MAX;
    let ev = NcclCallEvent {
        head: head(kind::NCCL_CALL),
        // SAFETY: a helper without arguments.
        t_enter: unsafe { bpf_ktime_get_ns() },
        comm: pick(&args, nccl_api::arg(cookie, 16), 0),
        count: pick(&args, nccl_api::arg(cookie, 8), 0),
        op: nccl_api::op(cookie),
        dtype: pick(&args, nccl_api::arg(cookie, 12), none) as i32,
        red_op: pick(&args, nccl_api::arg(cookie, 24), none) as i32,
        peer: pick(&args, nccl_api::arg(cookie, 20), none) as i32,
        ret: 0,
        depth: 0,
    };
    if NCCL_CALL_PENDING.insert(&id, &ev, 0).is_err() {
        count(stat::MAP_FULL);
    }
    0
}

/// Return of an NCCL call: the event, with its result.
#[uretprobe]
pub fn nccl_call_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(pending) = NCCL_CALL_PENDING.get_ptr_mut(&id) else {
        return 0;
    };
    // SAFETY: this thread's own entry.
    let pending = unsafe { &mut *pending };
    if pending.depth > 0 {
        pending.depth -= 1;
        return 0;
    }
    let mut ev = *pending;
    let _ = NCCL_CALL_PENDING.remove(&id);
    ev.ret = ctx.ret::<i32>();
    ev.head = head(kind::NCCL_CALL);
    emit(&ev);
    0
}

/// `ncclCommDestroy`/`ncclCommAbort`/`ncclCommFinalize(comm)`: reported at entry (the handle
/// is gone after).
#[uprobe]
pub fn nccl_comm_end(ctx: ProbeContext) -> u32 {
    if nccl_skipped() {
        return 0;
    }
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let h = head(kind::NCCL_CALL);
    emit(&NcclCallEvent {
        head: h,
        t_enter: h.ts_ns,
        comm: ctx.arg::<u64>(0).unwrap_or(0),
        op: nccl_api::op(cookie),
        dtype: -1,
        red_op: -1,
        peer: -1,
        ..NcclCallEvent::default()
    });
    0
}

/// Entry of `ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)` and
/// `ncclCommInitRankConfig` (the same, then a config): the 128-byte id is passed by value, in
/// memory above the return address, so `rank` is the third integer argument.
#[uprobe]
pub fn nccl_init(ctx: ProbeContext) -> u32 {
    if nccl_skipped() {
        return 0;
    }
    let id = bpf_get_current_pid_tgid();
    if let Some(p) = NCCL_INIT_PENDING.get_ptr_mut(&id) {
        // SAFETY: this thread's own entry.
        unsafe { (*p).depth += 1 };
        return 0;
    }
    // The event is built in its map slot: it is too large for the program's stack twice.
    let blank = NcclInitEvent::default();
    if NCCL_INIT_PENDING.insert(&id, &blank, 0).is_err() {
        count(stat::MAP_FULL);
        return 0;
    }
    let Some(p) = NCCL_INIT_PENDING.get_ptr_mut(&id) else {
        return 0;
    };
    // SAFETY: this thread's own entry, just inserted.
    let p = unsafe { &mut *p };
    // SAFETY: a helper without arguments.
    p.t_enter = unsafe { bpf_ktime_get_ns() };
    p.comm = ctx.arg::<u64>(0).unwrap_or(0);
    p.nranks = ctx.arg::<i32>(1).unwrap_or(0);
    p.rank = ctx.arg::<i32>(2).unwrap_or(-1);
    // SAFETY: the probe's saved registers of the current task.
    let sp = unsafe { (*ctx.regs).rsp };
    // SAFETY: `bpf_probe_read_user_buf` checks the address.
    if unsafe { bpf_probe_read_user_buf((sp + 8) as *const u8, &mut p.id) }.is_err() {
        count(stat::READ_FAILED);
    }
    0
}

#[uretprobe]
pub fn nccl_init_ret(ctx: RetProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    let Some(p) = NCCL_INIT_PENDING.get_ptr_mut(&id) else {
        return 0;
    };
    // SAFETY: this thread's own entry.
    let p = unsafe { &mut *p };
    if p.depth > 0 {
        p.depth -= 1;
        return 0;
    }
    p.ret = ctx.ret::<i32>();
    p.head = head(kind::NCCL_INIT);
    p.comm = if p.ret == 0 {
        user::<u64>(p.comm).unwrap_or(0)
    } else {
        0
    };
    if let Some(mut slot) = EVENTS.reserve::<NcclInitEvent>(0) {
        // SAFETY: copying the map's value into the reserved ring-buffer slot of its type.
        unsafe { core::ptr::copy_nonoverlapping(p as *const NcclInitEvent, slot.as_mut_ptr(), 1) };
        slot.submit(0);
    } else {
        count(stat::RINGBUF_FULL);
    }
    let _ = NCCL_INIT_PENDING.remove(&id);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
