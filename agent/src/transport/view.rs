//! The node's transport as the probes see it: TCP flows with their rates, RTT and
//! retransmissions; queue pairs and their peers; NCCL network connections joined to their
//! queue pairs; memory registrations; asynchronous events; link errors.
//!
//! Fed by ring-buffer events ([`TransportView::apply`]) and by periodic reads of the programs'
//! maps ([`TransportView::update_flows`], [`TransportView::update_conns`]). Nothing here
//! touches the kernel: tests drive it with the same values the programs produce.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use commscope_ebpf_common::{NetKey, NetStats, QpEvent, TcpFlow, ibv, kind, net, tcp_state};

use super::events::{Event, name};

/// A TCP flow, by the kernel's socket.
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The process that owns the socket, once found.
    pub pid: Option<u32>,
    pub totals: TcpFlow,
    /// Bytes per second sent (acknowledged) and received over the last interval.
    pub tx_rate: f64,
    pub rx_rate: f64,
    /// Retransmissions in the last interval.
    pub retransmits_recent: u32,
    /// The socket was closed; its entry goes after its last totals are read.
    pub closed: bool,
    /// The connection left ESTABLISHED (the application or its peer closed it): what follows
    /// is teardown, and the totals were synced from the socket at that moment, so bytes they
    /// add may have been acknowledged before it (the last ACK `tcp_probe` had not counted).
    pub closing: bool,
    /// Its totals, and the time (monotonic ns), at its last `flow` record.
    pub emitted: TcpFlow,
    pub emitted_at: u64,
}

/// A queue pair and what is known of its peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Qp {
    pub pid: u32,
    pub tid: u32,
    pub device: String,
    pub qp_num: u32,
    /// `enum ibv_qp_state` after the last successful modify (-1: never moved).
    pub state: i32,
    pub peer: Option<Peer>,
    /// The NCCL connection (send or receive comm) it carries, once joined.
    pub comm: Option<(u32, u64)>,
}

/// A queue pair's remote end, from `ibv_modify_qp` to RTR.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peer {
    pub qp_num: u32,
    pub lid: u16,
    pub port: u8,
    /// The destination GID when the address is global (RoCE, routed IB).
    pub gid: Option<[u8; 16]>,
    /// The local GID index it is reached from (with a global address).
    pub sgid_index: u8,
}

impl Peer {
    /// The peer as text: its GID (an IPv4 address for RoCE v2's IPv4-mapped GIDs) or LID, and
    /// its QP number.
    pub fn describe(&self) -> String {
        let at = match self.gid {
            Some(g) => {
                let v6 = Ipv6Addr::from(g);
                match v6.to_ipv4_mapped() {
                    Some(v4) => v4.to_string(),
                    None => v6.to_string(),
                }
            }
            None => format!("LID {}", self.lid),
        };
        format!("{at} QP 0x{:x}", self.qp_num)
    }
}

/// An NCCL network connection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conn {
    pub pid: u32,
    pub side: u32,
    pub transport: u32,
    /// Its queue pairs (InfiniBand/RoCE), by number.
    pub qps: Vec<u32>,
    pub totals: NetStats,
    /// Bytes per second posted over the last interval.
    pub rate: f64,
    /// Its bytes, and the time (monotonic ns), at its last `flow` record.
    pub emitted: u64,
    pub emitted_at: u64,
}

/// Memory registrations of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrTotals {
    pub registered: u64,
    pub failed: u64,
    pub deregistered: u64,
    pub bytes: u64,
    pub latency_ns_sum: u64,
    pub latency_ns_max: u64,
}

/// A link-level failure the probes saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinkError {
    pub ts_ns: u64,
    pub pid: u32,
    /// [`commscope_wire::record::link_event`]: QP_ERROR, FATAL or PORT_ERROR.
    pub event: u8,
    /// The port (0: unknown).
    pub port: u32,
    /// The asynchronous event's name, or empty for a QP state change.
    pub name: &'static str,
    pub device: String,
    /// `QP 0x1a2 → ERROR (peer 10.0.0.2 QP 0x3b4)`, `IBV_EVENT_PORT_ERR on port 1`.
    pub what: String,
    pub qp_num: Option<u32>,
    pub peer: Option<Peer>,
}

/// Everything the probes saw on this node.
#[derive(Debug, Default)]
pub struct TransportView {
    pub flows: BTreeMap<u64, Flow>,
    /// Totals of owned flows already gone, by remote address (so counters never go backwards).
    pub gone: HashMap<IpAddr, TcpFlow>,
    pub qps: HashMap<(u32, u32), Qp>,
    pub conns: HashMap<NetKey, Conn>,
    pub mr: HashMap<u32, MrTotals>,
    /// Asynchronous events by (device, event name).
    pub async_events: BTreeMap<(String, &'static str), u64>,
    pub link_errors: VecDeque<LinkError>,
    /// Link errors not yet handed on as records ([`TransportView::take_link_errors`]), and
    /// those dropped because too many waited.
    pending_link_errors: Vec<LinkError>,
    pub link_errors_dropped: u64,
    /// Events by kind name, and events that could not be decoded.
    pub events: BTreeMap<&'static str, u64>,
    pub undecodable: u64,
    /// Per-thread queue pairs created since that thread's last connection (for the join).
    unclaimed: HashMap<(u32, u32), Vec<u32>>,
    /// Last read of the flows map (monotonic ns).
    last_flow_read: Option<u64>,
    last_conn_read: Option<u64>,
}

/// Link errors kept for inspection.
const KEEP_LINK_ERRORS: usize = 256;

/// `enum ibv_event_type` names.
pub fn async_event_name(t: u32) -> &'static str {
    const NAMES: [&str; 20] = [
        "IBV_EVENT_CQ_ERR",
        "IBV_EVENT_QP_FATAL",
        "IBV_EVENT_QP_REQ_ERR",
        "IBV_EVENT_QP_ACCESS_ERR",
        "IBV_EVENT_COMM_EST",
        "IBV_EVENT_SQ_DRAINED",
        "IBV_EVENT_PATH_MIG",
        "IBV_EVENT_PATH_MIG_ERR",
        "IBV_EVENT_DEVICE_FATAL",
        "IBV_EVENT_PORT_ACTIVE",
        "IBV_EVENT_PORT_ERR",
        "IBV_EVENT_LID_CHANGE",
        "IBV_EVENT_PKEY_CHANGE",
        "IBV_EVENT_SM_CHANGE",
        "IBV_EVENT_SRQ_ERR",
        "IBV_EVENT_SRQ_LIMIT_REACHED",
        "IBV_EVENT_QP_LAST_WQE_REACHED",
        "IBV_EVENT_CLIENT_REREGISTER",
        "IBV_EVENT_GID_CHANGE",
        "IBV_EVENT_WQ_FATAL",
    ];
    NAMES
        .get(t as usize)
        .copied()
        .unwrap_or("IBV_EVENT_UNKNOWN")
}

/// `IBV_EVENT_PORT_ERR`: the port left the active state.
const IBV_EVENT_PORT_ERR: u32 = 10;

/// Asynchronous events that mean a link, a queue pair or the device failed.
fn async_is_error(t: u32) -> bool {
    matches!(t, 0 | 1 | 2 | 3 | 7 | 8 | 10 | 14 | 19)
}

fn kind_name(k: u32) -> &'static str {
    match k {
        kind::TCP_STATE => "tcp_state",
        kind::QP_CREATE => "qp_create",
        kind::QP_MODIFY => "qp_modify",
        kind::QP_DESTROY => "qp_destroy",
        kind::MR_REG => "mr_reg",
        kind::MR_DEREG => "mr_dereg",
        kind::ASYNC_EVENT => "async_event",
        kind::NET_CONN => "net_conn",
        kind::NCCL_INIT => "nccl_init",
        kind::NCCL_CALL => "nccl_call",
        _ => "unknown",
    }
}

/// A socket address from the programs' 16-byte address and host-order port.
pub fn sockaddr(family: u16, addr: &[u8; 16], port: u16) -> SocketAddr {
    let ip = if family == libc::AF_INET6 as u16 {
        IpAddr::V6(Ipv6Addr::from(*addr))
    } else {
        IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
    };
    SocketAddr::new(ip, port)
}

fn qp_state_name(s: i32) -> &'static str {
    match s {
        0 => "RESET",
        1 => "INIT",
        2 => "RTR",
        3 => "RTS",
        4 => "SQD",
        5 => "SQE",
        6 => "ERROR",
        _ => "?",
    }
}

impl TransportView {
    /// Applies one decoded event.
    pub fn apply(&mut self, ev: &Event) {
        match ev {
            Event::TcpState(e) => {
                *self.events.entry(kind_name(e.head.kind)).or_default() += 1;
                if let Some(f) = self.flows.get_mut(&e.skaddr) {
                    if e.newstate == tcp_state::CLOSE {
                        f.closed = true;
                    }
                    if e.oldstate == tcp_state::ESTABLISHED && e.newstate != tcp_state::ESTABLISHED
                    {
                        f.closing = true;
                    }
                }
            }
            Event::Qp(e) => {
                *self.events.entry(kind_name(e.head.kind)).or_default() += 1;
                self.apply_qp(e);
            }
            Event::Mr(e) => {
                *self.events.entry(kind_name(e.head.kind)).or_default() += 1;
                let t = self.mr.entry(e.head.pid).or_default();
                if e.head.kind == kind::MR_DEREG {
                    t.deregistered += 1;
                } else if e.mr == 0 {
                    t.failed += 1;
                } else {
                    t.registered += 1;
                    t.bytes += e.length;
                }
                t.latency_ns_sum += e.latency_ns;
                t.latency_ns_max = t.latency_ns_max.max(e.latency_ns);
            }
            Event::Async(e) => {
                *self.events.entry(kind_name(e.head.kind)).or_default() += 1;
                // A queue pair's event names its device when the context could not be read.
                let device = match name(&e.device) {
                    d if d.is_empty() && e.qp_num != 0 => self
                        .qps
                        .get(&(e.head.pid, e.qp_num))
                        .map(|q| q.device.clone())
                        .unwrap_or_default(),
                    d => d,
                };
                let what = async_event_name(e.event_type);
                *self.async_events.entry((device.clone(), what)).or_default() += 1;
                if async_is_error(e.event_type) {
                    let peer = (e.qp_num != 0)
                        .then(|| self.qps.get(&(e.head.pid, e.qp_num)))
                        .flatten()
                        .and_then(|q| q.peer);
                    let what = match (e.qp_num, e.port_num) {
                        (0, 0) => what.to_owned(),
                        (0, p) => format!("{what} on port {p}"),
                        (q, _) => format!("{what} on QP 0x{q:x}"),
                    };
                    self.link_error(LinkError {
                        ts_ns: e.head.ts_ns,
                        pid: e.head.pid,
                        event: if e.event_type == IBV_EVENT_PORT_ERR {
                            commscope_wire::record::link_event::PORT_ERROR
                        } else {
                            commscope_wire::record::link_event::FATAL
                        },
                        port: e.port_num,
                        name: async_event_name(e.event_type),
                        device,
                        what,
                        qp_num: (e.qp_num != 0).then_some(e.qp_num),
                        peer,
                    });
                }
            }
            Event::Conn(e) => {
                *self.events.entry(kind_name(e.head.kind)).or_default() += 1;
                let key = NetKey {
                    pid: e.head.pid,
                    side: e.side,
                    comm: e.comm,
                };
                let qps = self
                    .unclaimed
                    .remove(&(e.head.pid, e.head.tid))
                    .unwrap_or_default();
                for q in &qps {
                    if let Some(qp) = self.qps.get_mut(&(e.head.pid, *q)) {
                        qp.comm = Some((e.side, e.comm));
                    }
                }
                let c = self.conns.entry(key).or_insert_with(|| Conn {
                    pid: e.head.pid,
                    side: e.side,
                    transport: e.transport,
                    ..Conn::default()
                });
                c.qps.extend(qps);
            }
            // Counted here; recorded by the zero-touch recorder.
            Event::NcclInit(e) => *self.events.entry(kind_name(e.head.kind)).or_default() += 1,
            Event::NcclCall(e) => *self.events.entry(kind_name(e.head.kind)).or_default() += 1,
        }
    }

    fn apply_qp(&mut self, e: &QpEvent) {
        let key = (e.head.pid, e.qp_num);
        match e.head.kind {
            kind::QP_CREATE => {
                if e.qp == 0 {
                    return;
                }
                self.qps.insert(
                    key,
                    Qp {
                        pid: e.head.pid,
                        tid: e.head.tid,
                        device: name(&e.device),
                        qp_num: e.qp_num,
                        state: 0,
                        peer: None,
                        comm: None,
                    },
                );
                self.unclaimed
                    .entry((e.head.pid, e.head.tid))
                    .or_default()
                    .push(e.qp_num);
            }
            kind::QP_MODIFY => {
                if e.ret != 0 {
                    return;
                }
                let qp = self.qps.entry(key).or_insert_with(|| Qp {
                    pid: e.head.pid,
                    tid: e.head.tid,
                    device: name(&e.device),
                    qp_num: e.qp_num,
                    state: 0,
                    ..Qp::default()
                });
                if e.attr_mask & ibv::MASK_DEST_QPN != 0 {
                    let global = e.attr_mask & ibv::MASK_AV != 0 && e.is_global != 0;
                    qp.peer = Some(Peer {
                        qp_num: e.dest_qp_num,
                        lid: e.dlid,
                        port: e.port_num,
                        gid: global.then_some(e.dgid),
                        sgid_index: e.sgid_index,
                    });
                }
                if e.state >= 0 {
                    let was = qp.state;
                    qp.state = e.state;
                    if e.state == ibv::QPS_ERR && was != ibv::QPS_ERR {
                        let peer = qp.peer;
                        let what = format!(
                            "QP 0x{:x} moved from {} to ERROR{}",
                            e.qp_num,
                            qp_state_name(was),
                            peer.map(|p| format!(" (peer {})", p.describe()))
                                .unwrap_or_default()
                        );
                        let device = qp.device.clone();
                        self.link_error(LinkError {
                            ts_ns: e.head.ts_ns,
                            pid: e.head.pid,
                            event: commscope_wire::record::link_event::QP_ERROR,
                            port: peer.map_or(0, |p| u32::from(p.port)),
                            name: "",
                            device,
                            what,
                            qp_num: Some(e.qp_num),
                            peer,
                        });
                    }
                }
            }
            _ => {
                self.qps.remove(&key);
                if let Some(v) = self.unclaimed.get_mut(&(e.head.pid, e.head.tid)) {
                    v.retain(|q| *q != e.qp_num);
                }
            }
        }
    }

    fn link_error(&mut self, e: LinkError) {
        if self.link_errors.len() == KEEP_LINK_ERRORS {
            self.link_errors.pop_front();
        }
        if self.pending_link_errors.len() < KEEP_LINK_ERRORS {
            self.pending_link_errors.push(e.clone());
        } else {
            self.link_errors_dropped += 1;
        }
        self.link_errors.push_back(e);
    }

    /// The link errors seen since the last call, as `link_event` records with their owner's
    /// pid (`rank_of` gives an owner's global rank).
    pub fn take_link_errors(
        &mut self,
        rank_of: impl Fn(u32) -> Option<i32>,
    ) -> Vec<(u32, commscope_wire::record::LinkEvent)> {
        use commscope_wire::record::LinkEvent;
        std::mem::take(&mut self.pending_link_errors)
            .into_iter()
            .map(|e| {
                let rec = LinkEvent {
                    event: e.event,
                    t: e.ts_ns,
                    count: 1,
                    port: e.port,
                    qp_num: e.qp_num.unwrap_or(0),
                    peer_qp: e.peer.map_or(0, |p| p.qp_num),
                    pid: e.pid,
                    rank: rank_of(e.pid).unwrap_or(-1),
                    peer: e.peer.and_then(|p| p.gid).unwrap_or([0; 16]),
                    device: LinkEvent::name_bytes(&e.device),
                    what: LinkEvent::name_bytes(if e.name.is_empty() { &e.what } else { e.name }),
                    ..LinkEvent::default()
                };
                (e.pid, rec)
            })
            .collect()
    }

    /// The queue pairs that know their peer: (pid, device, QP number, peer).
    pub fn qp_peers(&self) -> Vec<(u32, String, u32, Peer)> {
        let mut v: Vec<_> = self
            .qps
            .values()
            .filter_map(|q| q.peer.map(|p| (q.pid, q.device.clone(), q.qp_num, p)))
            .collect();
        v.sort_by(|a, b| (a.0, &a.1, a.2).cmp(&(b.0, &b.1, b.2)));
        v
    }

    /// Takes a read of the flows map at `now_ns` (monotonic).
    pub fn update_flows(&mut self, now_ns: u64, read: &[(u64, TcpFlow)]) {
        let dt = self
            .last_flow_read
            .map(|t| now_ns.saturating_sub(t) as f64 / 1e9)
            .filter(|d| *d > 0.0);
        self.last_flow_read = Some(now_ns);
        for (sk, t) in read {
            let f = self.flows.entry(*sk).or_insert_with(|| Flow {
                local: sockaddr(t.family, &t.saddr, t.sport),
                remote: sockaddr(t.family, &t.daddr, t.dport),
                pid: None,
                totals: TcpFlow::default(),
                tx_rate: 0.0,
                rx_rate: 0.0,
                retransmits_recent: 0,
                closed: false,
                closing: false,
                emitted: TcpFlow::default(),
                emitted_at: 0,
            });
            // A reused socket address is a new flow.
            if t.first_ns != f.totals.first_ns && f.totals.first_ns != 0 {
                let old = std::mem::take(&mut f.totals);
                if f.pid.is_some() {
                    add(self.gone.entry(f.remote.ip()).or_default(), &old);
                }
                f.local = sockaddr(t.family, &t.saddr, t.sport);
                f.remote = sockaddr(t.family, &t.daddr, t.dport);
                f.pid = None;
                f.closed = false;
                f.closing = false;
                f.emitted = TcpFlow::default();
                f.emitted_at = 0;
            }
            let prev = f.totals;
            if let Some(dt) = dt {
                f.tx_rate = t.bytes_acked.saturating_sub(prev.bytes_acked) as f64 / dt;
                f.rx_rate = t.bytes_received.saturating_sub(prev.bytes_received) as f64 / dt;
            }
            f.retransmits_recent = t.retransmits.saturating_sub(prev.retransmits);
            f.totals = *t;
        }
    }

    /// The `flow` records of owned flows that moved since their last one (or closed): what
    /// changed since then. `rank_of` gives an owner's global rank. Returns (owner pid, record).
    pub fn flow_records(
        &mut self,
        now_ns: u64,
        rank_of: impl Fn(u32) -> Option<i32>,
        iface_of: impl Fn(&std::net::IpAddr) -> Option<String>,
    ) -> Vec<(u32, commscope_wire::record::Flow)> {
        use commscope_wire::record::{Flow as Rec, flow_transport};
        let mut out = Vec::new();
        for f in self.flows.values_mut() {
            let Some(pid) = f.pid else { continue };
            // Within the node (loopback, or to its own address): no network link.
            if f.remote.ip().is_loopback() || f.remote.ip() == f.local.ip() {
                continue;
            }
            let (t, e) = (&f.totals, &f.emitted);
            let sent = t.bytes_acked.saturating_sub(e.bytes_acked);
            let received = t.bytes_received.saturating_sub(e.bytes_received);
            let busy = t.busy_ns.saturating_sub(e.busy_ns);
            let retrans = t.retransmits.saturating_sub(e.retransmits);
            if sent == 0 && received == 0 && retrans == 0 && !f.closed {
                continue;
            }
            let samples = t.srtt_samples.saturating_sub(e.srtt_samples);
            let srtt = if samples > 0 {
                (t.srtt_sum_us.saturating_sub(e.srtt_sum_us) / u64::from(samples)) as u32
            } else {
                t.srtt_us
            };
            out.push((
                pid,
                Rec {
                    rec_seq: 0,
                    transport: flow_transport::TCP,
                    flags: if f.closed || f.closing {
                        commscope_wire::op::flags::FLOW_CLOSED
                    } else {
                        0
                    },
                    bytes_sent: sent,
                    bytes_received: received,
                    busy_ns: busy,
                    retransmits: retrans,
                    srtt_us: srtt,
                    cwnd: t.snd_cwnd,
                    local: Rec::addr_bytes(f.local.ip()),
                    remote: Rec::addr_bytes(f.remote.ip()),
                    local_port: f.local.port(),
                    remote_port: f.remote.port(),
                    t_start: if f.emitted_at > 0 {
                        f.emitted_at
                    } else {
                        t.first_ns
                    },
                    t_end: now_ns,
                    rank: rank_of(pid).unwrap_or(-1),
                    pid,
                    iface: iface_of(&f.local.ip()).map_or([0; 16], |n| Rec::iface_bytes(&n)),
                },
            ));
            f.emitted = *t;
            f.emitted_at = now_ns;
        }
        out
    }

    /// The `flow` records (transport RDMA) of NCCL InfiniBand/RoCE send connections that
    /// posted bytes since their last one, each joined to its queue pairs' peer: a link from
    /// this node's port to the peer's. `local` gives a port's address: (device, port, the GID
    /// index for a global address, else None for its LID address). Returns (owner pid, record).
    pub fn rdma_records(
        &mut self,
        now_ns: u64,
        rank_of: impl Fn(u32) -> Option<i32>,
        local: impl Fn(&str, u8, Option<u8>) -> Option<[u8; 16]>,
    ) -> Vec<(u32, commscope_wire::record::Flow)> {
        use commscope_wire::record::{Flow as Rec, flow_transport};
        let mut out = Vec::new();
        for c in self.conns.values_mut() {
            if c.transport != net::IB || c.side != net::SEND {
                continue;
            }
            let sent = c.totals.bytes.saturating_sub(c.emitted);
            if sent == 0 {
                continue;
            }
            // NCCL spreads a connection over several queue pairs, all to the same peer.
            let Some((device, peer)) = c
                .qps
                .iter()
                .filter_map(|q| self.qps.get(&(c.pid, *q)))
                .find_map(|q| q.peer.map(|p| (q.device.clone(), p)))
            else {
                continue;
            };
            let (local_addr, remote) = match peer.gid {
                Some(g) => (local(&device, peer.port, Some(peer.sgid_index)), g),
                None => (local(&device, peer.port, None), Rec::lid_address(peer.lid)),
            };
            out.push((
                c.pid,
                Rec {
                    transport: flow_transport::RDMA,
                    bytes_sent: sent,
                    local: local_addr.unwrap_or([0; 16]),
                    remote,
                    t_start: if c.emitted_at > 0 {
                        c.emitted_at
                    } else {
                        c.totals.first_ns
                    },
                    t_end: now_ns,
                    rank: rank_of(c.pid).unwrap_or(-1),
                    pid: c.pid,
                    iface: Rec::iface_bytes(&format!("{device}:{}", peer.port)),
                    ..Rec::default()
                },
            ));
            c.emitted = c.totals.bytes;
            c.emitted_at = now_ns;
        }
        out
    }

    /// Drops closed flows (after their last record): returns the sockets whose entries can be
    /// deleted from the map.
    pub fn sweep(&mut self) -> Vec<u64> {
        let mut done = Vec::new();
        self.flows.retain(|sk, f| {
            if f.closed {
                if f.pid.is_some() {
                    add(self.gone.entry(f.remote.ip()).or_default(), &f.totals);
                }
                done.push(*sk);
                false
            } else {
                true
            }
        });
        done
    }

    /// Takes a read of the NCCL connections map at `now_ns`.
    pub fn update_conns(&mut self, now_ns: u64, read: &[(NetKey, NetStats)]) {
        let dt = self
            .last_conn_read
            .map(|t| now_ns.saturating_sub(t) as f64 / 1e9)
            .filter(|d| *d > 0.0);
        self.last_conn_read = Some(now_ns);
        for (k, s) in read {
            let c = self.conns.entry(*k).or_insert_with(|| Conn {
                pid: k.pid,
                side: k.side,
                transport: s.transport,
                ..Conn::default()
            });
            if let Some(dt) = dt {
                c.rate = s.bytes.saturating_sub(c.totals.bytes) as f64 / dt;
            }
            c.totals = *s;
        }
    }

    /// Sets each flow's owner from a socket table: (local, remote) → pid.
    pub fn attribute(&mut self, owners: &HashMap<(SocketAddr, SocketAddr), u32>) {
        for f in self.flows.values_mut() {
            if let Some(pid) = owners.get(&(f.local, f.remote)) {
                f.pid = Some(*pid);
            }
        }
    }

    /// Flows without an owner yet.
    pub fn unowned(&self) -> usize {
        self.flows.values().filter(|f| f.pid.is_none()).count()
    }

    /// TCP totals of the flows of known processes, by remote address: live flows plus those
    /// gone. (Tracepoints see every socket on the host; flows no traced process owns are left
    /// out, which also keeps other network namespaces' traffic out of a node's view.)
    pub fn tcp_by_peer(&self) -> BTreeMap<IpAddr, PeerTotals> {
        let mut out: BTreeMap<IpAddr, PeerTotals> = BTreeMap::new();
        for (ip, t) in &self.gone {
            out.entry(*ip).or_default().add(t, 0.0, 0.0, false);
        }
        for f in self.flows.values().filter(|f| f.pid.is_some()) {
            out.entry(f.remote.ip())
                .or_default()
                .add(&f.totals, f.tx_rate, f.rx_rate, true);
        }
        out
    }

    /// How the side of a connection reads.
    pub fn side_name(side: u32) -> &'static str {
        if side == net::SEND { "send" } else { "recv" }
    }
}

/// TCP totals toward one remote address.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeerTotals {
    pub flows: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub retransmits: u64,
    pub tx_rate: f64,
    pub rx_rate: f64,
    /// The mean smoothed RTT over the live flows' samples (µs).
    pub srtt_us: Option<f64>,
    srtt_sum: f64,
    srtt_n: f64,
}

impl PeerTotals {
    fn add(&mut self, t: &TcpFlow, tx: f64, rx: f64, live: bool) {
        self.bytes_sent += t.bytes_acked;
        self.bytes_received += t.bytes_received;
        self.retransmits += u64::from(t.retransmits);
        if live {
            self.flows += 1;
            self.tx_rate += tx;
            self.rx_rate += rx;
            if t.srtt_samples > 0 {
                self.srtt_sum += t.srtt_sum_us as f64;
                self.srtt_n += f64::from(t.srtt_samples);
                self.srtt_us = Some(self.srtt_sum / self.srtt_n);
            }
        }
    }
}

fn add(to: &mut TcpFlow, t: &TcpFlow) {
    to.bytes_acked += t.bytes_acked;
    to.bytes_received += t.bytes_received;
    to.retransmits += t.retransmits;
    to.segs_in += t.segs_in;
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_ebpf_common::{AsyncEvent, ConnEvent, Head};

    fn head(kind: u32, pid: u32, tid: u32, ts_ns: u64) -> Head {
        Head {
            kind,
            pid,
            tid,
            _pad: 0,
            ts_ns,
        }
    }

    fn dev(s: &str) -> [u8; 16] {
        let mut d = [0u8; 16];
        d[..s.len()].copy_from_slice(s.as_bytes());
        d
    }

    /// A send connection of pid 10 over QP `qp` toward `peer` (global with `gid`, else LID 9).
    fn connection(v: &mut TransportView, comm: u64, qp: u32, gid: Option<[u8; 16]>) {
        v.apply(&Event::Qp(QpEvent {
            head: head(kind::QP_CREATE, 10, 11, 1),
            qp: 0x5000,
            qp_num: qp,
            device: dev("mlx5_1"),
            ..QpEvent::default()
        }));
        v.apply(&Event::Qp(QpEvent {
            head: head(kind::QP_MODIFY, 10, 11, 2),
            qp_num: qp,
            state: 2,
            attr_mask: ibv::MASK_STATE | ibv::MASK_AV | ibv::MASK_DEST_QPN,
            dest_qp_num: 0x201,
            dlid: 9,
            port_num: 2,
            is_global: u8::from(gid.is_some()),
            dgid: gid.unwrap_or_default(),
            sgid_index: 3,
            device: dev("mlx5_1"),
            ..QpEvent::default()
        }));
        v.apply(&Event::Conn(ConnEvent {
            head: head(kind::NET_CONN, 10, 11, 3),
            comm,
            side: net::SEND,
            transport: net::IB,
        }));
    }

    #[test]
    fn rdma_connections_become_flow_records_of_the_link_to_their_peer() {
        use commscope_wire::record::{Flow, flow_transport};
        let mut v = TransportView::default();
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 2]);
        connection(&mut v, 0xc0, 0x101, Some(gid));
        connection(&mut v, 0xd0, 0x102, None);
        let stats = |bytes| NetStats {
            first_ns: 1,
            last_ns: 2,
            bytes,
            requests: 1,
            transport: net::IB,
            _pad: 0,
        };
        let key = |comm| NetKey {
            pid: 10,
            side: net::SEND,
            comm,
        };
        // The local end: GID index 3 of mlx5_1 port 2, or its LID 5.
        let local = |dev: &str, port: u8, gid: Option<u8>| {
            assert_eq!((dev, port), ("mlx5_1", 2));
            Some(match gid {
                Some(i) => {
                    assert_eq!(i, 3);
                    Flow::addr_bytes("10.0.0.1".parse().expect("ip"))
                }
                None => Flow::lid_address(5),
            })
        };
        v.update_conns(
            1_000,
            &[(key(0xc0), stats(8 << 20)), (key(0xd0), stats(1 << 20))],
        );
        let mut recs = v.rdma_records(2_000, |_| Some(4), local);
        recs.sort_by_key(|r| r.1.bytes_sent);
        assert_eq!(recs.len(), 2);
        let (pid, lid) = recs[0];
        assert_eq!(
            (pid, lid.bytes_sent, lid.transport),
            (10, 1 << 20, flow_transport::RDMA)
        );
        assert_eq!(
            (lid.local, lid.remote),
            (Flow::lid_address(5), Flow::lid_address(9))
        );
        let g = recs[1].1;
        assert_eq!(g.bytes_sent, 8 << 20);
        assert_eq!(g.remote_addr().ip().to_string(), "10.0.0.2");
        assert_eq!(g.local_addr().ip().to_string(), "10.0.0.1");
        assert_eq!((g.rank, g.iface_name().as_deref()), (4, Some("mlx5_1:2")));
        assert_eq!((g.t_start, g.t_end), (1, 2_000));
        // Nothing new posted: no record; more posted: what changed since the last.
        assert!(v.rdma_records(3_000, |_| Some(4), local).is_empty());
        v.update_conns(4_000, &[(key(0xc0), stats(9 << 20))]);
        let recs = v.rdma_records(5_000, |_| Some(4), local);
        assert_eq!(recs.len(), 1);
        assert_eq!((recs[0].1.bytes_sent, recs[0].1.t_start), (1 << 20, 2_000));
    }

    #[test]
    fn queue_pairs_learn_their_peer_join_their_connection_and_report_errors() {
        let mut v = TransportView::default();
        let create = |qp_num| {
            Event::Qp(QpEvent {
                head: head(kind::QP_CREATE, 10, 11, 1),
                qp: 0x5000 + u64::from(qp_num),
                qp_num,
                state: 2,
                device: dev("mlx5_0"),
                ..QpEvent::default()
            })
        };
        v.apply(&create(0x101));
        v.apply(&create(0x102));
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&[10, 0, 0, 2]);
        v.apply(&Event::Qp(QpEvent {
            head: head(kind::QP_MODIFY, 10, 11, 2),
            qp_num: 0x101,
            state: 2,
            attr_mask: ibv::MASK_STATE | ibv::MASK_AV | ibv::MASK_DEST_QPN,
            dest_qp_num: 0x201,
            dlid: 0,
            port_num: 1,
            is_global: 1,
            dgid: gid,
            device: dev("mlx5_0"),
            ..QpEvent::default()
        }));
        v.apply(&Event::Conn(ConnEvent {
            head: head(kind::NET_CONN, 10, 11, 3),
            comm: 0xc0,
            side: net::SEND,
            transport: net::IB,
        }));
        let conn = &v.conns[&NetKey {
            pid: 10,
            side: net::SEND,
            comm: 0xc0,
        }];
        assert_eq!(conn.qps, vec![0x101, 0x102]);
        assert_eq!(v.qps[&(10, 0x101)].comm, Some((net::SEND, 0xc0)));
        let peers = v.qp_peers();
        assert_eq!(peers.len(), 1);
        assert_eq!(peers[0].3.describe(), "10.0.0.2 QP 0x201");

        // A failed modify changes nothing; a move to ERROR is a link error naming the peer.
        v.apply(&Event::Qp(QpEvent {
            head: head(kind::QP_MODIFY, 10, 11, 4),
            qp_num: 0x101,
            state: ibv::QPS_ERR,
            attr_mask: ibv::MASK_STATE,
            ret: 22,
            ..QpEvent::default()
        }));
        assert!(v.link_errors.is_empty());
        v.apply(&Event::Qp(QpEvent {
            head: head(kind::QP_MODIFY, 10, 11, 5),
            qp_num: 0x101,
            state: ibv::QPS_ERR,
            attr_mask: ibv::MASK_STATE,
            ..QpEvent::default()
        }));
        assert_eq!(v.link_errors.len(), 1);
        assert_eq!(
            v.link_errors[0].what,
            "QP 0x101 moved from RTR to ERROR (peer 10.0.0.2 QP 0x201)"
        );

        // A port error is one; a port becoming active is not.
        for t in [9, 10] {
            v.apply(&Event::Async(AsyncEvent {
                head: head(kind::ASYNC_EVENT, 10, 12, 6),
                event_type: t,
                port_num: 1,
                device: dev("mlx5_0"),
                ..AsyncEvent::default()
            }));
        }
        assert_eq!(v.link_errors.len(), 2);
        assert_eq!(v.link_errors[1].what, "IBV_EVENT_PORT_ERR on port 1");
        assert_eq!(
            v.async_events[&("mlx5_0".to_owned(), "IBV_EVENT_PORT_ACTIVE")],
            1
        );

        // Both become link_event records once, owned by pid 10's rank.
        use commscope_wire::record::link_event;
        let recs = v.take_link_errors(|pid| (pid == 10).then_some(5));
        assert_eq!(recs.len(), 2);
        let (pid, qp) = recs[0];
        assert_eq!(
            (pid, qp.event, qp.rank, qp.qp_num),
            (10, link_event::QP_ERROR, 5, 0x101)
        );
        assert_eq!((qp.peer_qp, qp.port), (0x201, 1));
        assert_eq!(qp.peer_addr(), Some("10.0.0.2".parse().expect("ip")));
        assert_eq!(
            qp.what_name(),
            "QP 0x101 moved from RTR to ERROR (p"
                .chars()
                .take(32)
                .collect::<String>()
        );
        let port = recs[1].1;
        assert_eq!(
            (port.event, port.port, port.device_name(), port.what_name()),
            (
                link_event::PORT_ERROR,
                1,
                "mlx5_0".to_owned(),
                "IBV_EVENT_PORT_ERR".to_owned()
            )
        );
        assert!(v.take_link_errors(|_| None).is_empty(), "handed on once");
    }

    fn flow(bytes_acked: u64, bytes_received: u64, retransmits: u32) -> TcpFlow {
        let mut t = TcpFlow {
            family: libc::AF_INET as u16,
            sport: 40000,
            dport: 5000,
            first_ns: 1,
            bytes_acked,
            bytes_received,
            retransmits,
            srtt_sum_us: 300,
            srtt_samples: 3,
            ..TcpFlow::default()
        };
        t.saddr[..4].copy_from_slice(&[10, 9, 0, 1]);
        t.daddr[..4].copy_from_slice(&[10, 9, 0, 2]);
        t
    }

    #[test]
    fn a_flow_that_leaves_established_is_teardown_from_then_on() {
        let mut v = TransportView::default();
        // Closed by the application with data unacknowledged (FIN_WAIT1, an orphan that goes
        // on retransmitting): its records from then on are teardown.
        v.update_flows(5_000_000_000, &[(9, flow(1_000, 0, 0))]);
        v.flows.get_mut(&9).expect("flow").pid = Some(42);
        let own = |pid: u32| (pid == 42).then_some(3);
        let recs = v.flow_records(5_000_000_000, own, |_| None);
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].1.flags, 0);
        v.apply(&Event::TcpState(commscope_ebpf_common::TcpStateEvent {
            head: head(kind::TCP_STATE, 0, 0, 4),
            skaddr: 9,
            oldstate: tcp_state::ESTABLISHED,
            newstate: tcp_state::FIN_WAIT1,
            ..Default::default()
        }));
        v.update_flows(6_000_000_000, &[(9, flow(5_000, 0, 3))]);
        let recs = v.flow_records(6_000_000_000, own, |_| None);
        assert_eq!(recs.len(), 1);
        assert_eq!(
            (recs[0].1.flags, recs[0].1.bytes_sent, recs[0].1.retransmits),
            (commscope_wire::op::flags::FLOW_CLOSED, 4_000, 3)
        );
        assert!(v.sweep().is_empty(), "not closed yet: its entry stays");
    }

    #[test]
    fn flow_rates_come_from_successive_reads_and_closed_flows_keep_their_totals() {
        let mut v = TransportView::default();
        v.update_flows(1_000_000_000, &[(7, flow(0, 0, 0))]);
        assert!(v.sweep().is_empty());
        v.update_flows(3_000_000_000, &[(7, flow(4_000_000, 1_000, 2))]);
        let f = &v.flows[&7];
        assert_eq!(f.tx_rate, 2_000_000.0);
        assert_eq!(f.rx_rate, 500.0);
        assert_eq!(f.retransmits_recent, 2);
        assert_eq!(f.remote, "10.9.0.2:5000".parse().expect("addr"));
        let mut owners = HashMap::new();
        owners.insert((f.local, f.remote), 42);
        v.attribute(&owners);
        assert_eq!(v.flows[&7].pid, Some(42));
        assert_eq!(v.unowned(), 0);

        v.apply(&Event::TcpState(commscope_ebpf_common::TcpStateEvent {
            head: head(kind::TCP_STATE, 0, 0, 4),
            skaddr: 7,
            oldstate: tcp_state::ESTABLISHED,
            newstate: tcp_state::CLOSE,
            ..Default::default()
        }));
        v.update_flows(4_000_000_000, &[(7, flow(5_000_000, 1_000, 2))]);
        // Its records: everything up to the close, in one (it was owned from the first read);
        // a flow within the node gives none.
        let mut own = flow(9, 9, 0);
        own.daddr = own.saddr;
        v.update_flows(4_000_000_000, &[(8, own)]);
        v.flows.get_mut(&8).expect("flow").pid = Some(42);
        let recs = v.flow_records(
            4_000_000_000,
            |pid| (pid == 42).then_some(3),
            |ip| (ip.to_string() == "10.9.0.1").then(|| "eth0".to_owned()),
        );
        assert_eq!(recs.len(), 1);
        let (pid, r) = recs[0];
        assert_eq!(
            (pid, r.rank, r.bytes_sent, r.retransmits),
            (42, 3, 5_000_000, 2)
        );
        assert_eq!(r.flags, commscope_wire::op::flags::FLOW_CLOSED);
        assert_eq!(r.remote_addr(), "10.9.0.2:5000".parse().expect("addr"));
        assert_eq!(r.srtt_us, 100);
        assert_eq!(r.iface_name().as_deref(), Some("eth0"));
        assert_eq!(v.sweep(), vec![7]);
        assert_eq!(v.flows.keys().collect::<Vec<_>>(), [&8]);

        let peers = v.tcp_by_peer();
        let p = peers[&"10.9.0.2".parse::<IpAddr>().expect("ip")];
        assert_eq!((p.bytes_sent, p.retransmits, p.flows), (5_000_000, 2, 0));
    }
}
