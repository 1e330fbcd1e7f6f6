//! `commscope trace summary`: what a trace holds, per job — communicators with their call
//! counts, point-to-point traffic and how it pairs up, calls still in flight, drops and damage.

use std::collections::{BTreeMap, HashMap, HashSet};

use commscope_analyzer::aggregate::{Calls, CommOpRow};
use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Op, busbw_factor, flags};
use commscope_wire::record::{CommEvent, Record};
use serde::Serialize;

use crate::traces::JobTrace;

/// One communicator's line.
#[derive(Debug, Serialize)]
pub struct CommSummary {
    pub comm_id: String,
    pub size: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Global ranks that recorded calls on it.
    pub ranks: Vec<i32>,
    /// `call` records per op (one per rank per call).
    pub ops: BTreeMap<String, u64>,
    /// Bytes per op, summed over records.
    pub bytes: BTreeMap<String, u64>,
    /// Mean bus bandwidth per op in GB/s (10^9 bytes/s): Σ bytes × nccl-tests factor over
    /// Σ duration (GPU interval for NCCL calls timed on the GPU, else time inside the call).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub busbw_gbps: BTreeMap<String, f64>,
    /// Mean algorithm bandwidth per op in GB/s: Σ bytes over Σ duration.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub algbw_gbps: BTreeMap<String, f64>,
    /// Calls per op that carry a GPU interval (NCCL calls timed with CUDA events).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_timed: BTreeMap<String, u64>,
    /// Calls per op captured into a CUDA graph (their capture: no GPU interval), and records of
    /// graph launches that ran them again (GPU interval of the whole graph).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub graph_captured: BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub graph_launches: BTreeMap<String, u64>,
    /// Mean duration per op in µs (GPU interval where there is one, else time inside the call).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mean_duration_us: BTreeMap<String, f64>,
    /// Per op: (Σ bytes, Σ bus bytes, Σ seconds) of calls with a duration.
    #[serde(skip)]
    bw: BTreeMap<String, (f64, f64, f64)>,
    /// Per op: (calls, Σ seconds) of calls not captured into a graph.
    #[serde(skip)]
    dur: BTreeMap<String, (u64, f64)>,
    /// Whether the id is local to one process (not agreed across members).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub local_id: bool,
}

/// Point-to-point totals.
#[derive(Debug, Default, Serialize)]
pub struct P2pSummary {
    /// Messages sent (`send` records plus the send half of `sendrecv`).
    pub send: u64,
    /// Messages received (`recv` records plus the receive half of `sendrecv`).
    pub recv: u64,
    /// Sends whose receive was found (same comm, ranks, tag and sequence).
    pub matched: u64,
    /// Sends without a receive plus receives without a send.
    pub unmatched: u64,
}

/// A call entered and never completed.
#[derive(Debug, Serialize, PartialEq)]
pub struct InFlight {
    pub rank: i32,
    pub comm_id: String,
    pub op: String,
    pub seq: u64,
    /// For point-to-point: the peer (rank in the communicator).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<i32>,
    /// How long it had been in flight at the process's last heartbeat, in seconds.
    pub for_s: f64,
}

/// Drop counters, from each process's last heartbeat.
#[derive(Debug, Default, Serialize)]
pub struct Dropped {
    pub ring_full: u64,
    pub in_flight_table: u64,
    pub other: u64,
}

/// The summary of one job (the contract's `trace summary --format json`).
#[derive(Debug, Serialize)]
pub struct Summary {
    pub job: String,
    pub records: u64,
    pub ranks: u64,
    pub processes: u64,
    pub comms: Vec<CommSummary>,
    pub p2p: P2pSummary,
    pub in_flight: Vec<InFlight>,
    /// Per link (communicator, rank, peer, direction): what NCCL's proxy moved over it, from
    /// `link` records (the profiler plugin); heaviest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkSummary>,
    pub dropped: Dropped,
    /// Processes without a clean shutdown (no final heartbeat), by global rank.
    pub unfinished_ranks: Vec<i32>,
    /// Calls consistent sampling left out (counted in `ops`, `bytes` and `p2p` send/recv
    /// through their `skip` records; `matched`/`unmatched` pair the recorded messages only).
    #[serde(skip_serializing_if = "is_zero")]
    pub sampled_out: u64,
    pub warnings: Vec<String>,
}

/// (comm, rank, peer, send) of a link.
type LinkKey = (u64, i32, i32, bool);

/// A link's totals.
#[derive(Debug, Default)]
struct LinkTotals {
    ops: u64,
    bytes: u64,
    busy_ns: u64,
    xfer_bytes: u64,
    net_ns: u64,
    gpu_wait_ns: u64,
    peer_wait_ns: u64,
}

/// One link's traffic.
#[derive(Debug, Serialize)]
pub struct LinkSummary {
    pub comm_id: String,
    /// Global rank of the recording process.
    pub rank: i32,
    /// The peer's rank in the communicator.
    pub peer: i32,
    /// `send` or `recv`.
    pub direction: &'static str,
    pub ops: u64,
    pub bytes: u64,
    /// Time the proxy worked on them (summed intervals), seconds.
    pub busy_s: f64,
    /// bytes / busy time, GB/s.
    pub gbps: f64,
    /// From the proxy's steps (0 without them): bytes moved, channel-seconds on the network,
    /// waiting for the GPU and (sends) waiting for the receiver.
    pub xfer_bytes: u64,
    pub net_s: f64,
    pub gpu_wait_s: f64,
    pub peer_wait_s: f64,
    /// xfer_bytes / network time: the rate a channel moved data while it had data on the
    /// network, GB/s (0 without step timing).
    pub net_gbps: f64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn comm_entry(comms: &mut BTreeMap<u64, CommSummary>, id: u64) -> &mut CommSummary {
    comms.entry(id).or_insert_with(|| CommSummary {
        comm_id: format_comm_id(id),
        size: 0,
        name: None,
        ranks: Vec::new(),
        ops: BTreeMap::new(),
        bytes: BTreeMap::new(),
        busbw_gbps: BTreeMap::new(),
        algbw_gbps: BTreeMap::new(),
        gpu_timed: BTreeMap::new(),
        graph_captured: BTreeMap::new(),
        graph_launches: BTreeMap::new(),
        mean_duration_us: BTreeMap::new(),
        dur: BTreeMap::new(),
        bw: BTreeMap::new(),
        local_id: false,
    })
}

/// Adds one communicator's calls of an op, size and rank ([`Calls::per_comm_op`]).
fn fold_calls(cs: &mut CommSummary, row: &CommOpRow) {
    let op = row.op.as_str();
    let add = |m: &mut BTreeMap<String, u64>, n: u64| {
        if n > 0 {
            *m.entry(op.to_owned()).or_default() += n;
        }
    };
    *cs.ops.entry(op.to_owned()).or_default() += row.calls;
    *cs.bytes.entry(op.to_owned()).or_default() += row.bytes;
    add(&mut cs.gpu_timed, row.gpu_timed);
    add(&mut cs.graph_launches, row.graph_launches);
    add(&mut cs.graph_captured, row.graph_captured);
    if row.timed > 0 {
        let d = cs.dur.entry(op.to_owned()).or_default();
        d.0 += row.timed;
        d.1 += row.timed_ns as f64 / 1e9;
    }
    if let Some(f) = Op::from_name(op).and_then(|o| busbw_factor(o, row.size))
        && row.bw_ns > 0
    {
        let e = cs.bw.entry(op.to_owned()).or_default();
        e.0 += row.bw_bytes as f64;
        e.1 += row.bw_bytes as f64 * f;
        e.2 += row.bw_ns as f64 / 1e9;
    }
    if !cs.ranks.contains(&row.rank) {
        cs.ranks.push(row.rank);
    }
    if cs.size == 0 {
        cs.size = row.size;
    }
    cs.local_id |= row.local_id;
}

/// Summarises one job: polars aggregates its calls per communicator, op and rank (over the
/// trace written as Parquet); drops, in-flight calls, point-to-point pairing and links are
/// read record by record.
pub fn summarize(job: &JobTrace) -> anyhow::Result<Summary> {
    let calls = Calls::of(&job.processes).map_err(anyhow::Error::msg)?;
    let mut comms: BTreeMap<u64, CommSummary> = BTreeMap::new();
    let mut ranks = HashSet::new();
    let mut p2p = P2pSummary::default();
    // (comm, src, dst, tag, p2p_seq) of each direction
    let mut sends: HashMap<(u64, i32, i32, i32, u64), u64> = HashMap::new();
    let mut recvs: HashMap<(u64, i32, i32, i32, u64), u64> = HashMap::new();
    let mut in_flight = Vec::new();
    let mut links: BTreeMap<LinkKey, LinkTotals> = BTreeMap::new();
    let mut dropped = Dropped::default();
    let mut unfinished = Vec::new();
    let mut sampled_out = 0;

    // The agents' transport records are not a rank's.
    for proc in job.processes.iter().filter(|p| !p.header.is_transport()) {
        ranks.insert(proc.header.rank);
        let mut completed: HashSet<(u64, u64)> = HashSet::new();
        let mut listed: HashSet<(u64, u8, u64)> = HashSet::new();
        let mut last_beat = 0u64;
        let mut clean = false;
        for r in &proc.records {
            match r {
                Record::Call(c) => {
                    completed.insert((c.comm_id, c.t_enter));
                }
                Record::Heartbeat(h) => {
                    last_beat = last_beat.max(h.t_mono);
                    clean |= h.flags & flags::FINAL != 0;
                }
                _ => {}
            }
        }
        if let Some(h) = proc.records.iter().rev().find_map(|r| {
            if let Record::Heartbeat(h) = r {
                Some(h)
            } else {
                None
            }
        }) {
            dropped.ring_full += h.dropped_ring_full;
            dropped.in_flight_table += h.dropped_in_flight;
            dropped.other += h.dropped_other;
        }
        if !clean {
            unfinished.push(proc.header.rank);
        }
        for r in &proc.records {
            match r {
                Record::Comm(c) => {
                    let cs = comm_entry(&mut comms, c.comm_id);
                    if c.size > 0 {
                        cs.size = c.size;
                    }
                    if !c.name().is_empty() && (c.event == CommEvent::Named || cs.name.is_none()) {
                        cs.name = Some(c.name().to_owned());
                    }
                    cs.local_id |= c.flags & flags::LOCAL_COMM_ID != 0;
                }
                Record::Call(c) => {
                    // (Counts, bytes, durations and bandwidth per communicator and op come
                    // from polars below; point-to-point pairing is here.)
                    let me = c.comm_rank;
                    match c.op() {
                        // A send that returned an error sent nothing: no message to pair. (A
                        // receive that failed may still have consumed one, e.g. truncated.)
                        Op::Send if c.status != 0 => {}
                        Op::Send if c.peer >= 0 => {
                            p2p.send += 1;
                            *sends
                                .entry((c.comm_id, me, c.peer, c.tag, c.op_seq))
                                .or_default() += 1;
                        }
                        Op::Recv if c.peer >= 0 => {
                            p2p.recv += 1;
                            *recvs
                                .entry((c.comm_id, c.peer, me, c.tag, c.op_seq))
                                .or_default() += 1;
                        }
                        Op::Sendrecv => {
                            if c.peer >= 0 {
                                p2p.send += 1;
                                *sends
                                    .entry((c.comm_id, me, c.peer, c.tag, c.op_seq))
                                    .or_default() += 1;
                            }
                            if c.peer2 >= 0 {
                                p2p.recv += 1;
                                *recvs
                                    .entry((c.comm_id, c.peer2, me, c.tag2, c.op_seq2))
                                    .or_default() += 1;
                            }
                        }
                        _ => {}
                    }
                }
                Record::Skip(k) if !k.progress_only() => {
                    sampled_out += k.calls;
                    let cs = comm_entry(&mut comms, k.comm_id);
                    let op = k.op();
                    *cs.ops.entry(op.name().to_owned()).or_default() += k.calls;
                    *cs.bytes.entry(op.name().to_owned()).or_default() += k.bytes;
                    if !cs.ranks.contains(&k.rank) {
                        cs.ranks.push(k.rank);
                    }
                    if cs.size == 0 {
                        cs.size = k.comm_size;
                    }
                    match op {
                        Op::Send => p2p.send += k.calls,
                        Op::Recv => p2p.recv += k.calls,
                        Op::Sendrecv => {
                            p2p.send += k.calls;
                            p2p.recv += k.calls;
                        }
                        _ => {}
                    }
                }
                Record::Link(l) => {
                    let e = links
                        .entry((l.comm_id, l.rank, l.peer, l.flags & flags::LINK_SEND != 0))
                        .or_default();
                    e.ops += 1;
                    e.bytes += l.bytes;
                    e.busy_ns += l.t_end.saturating_sub(l.t_start);
                    e.xfer_bytes += l.xfer_bytes;
                    e.net_ns += l.net_ns;
                    e.gpu_wait_ns += l.gpu_wait_ns;
                    e.peer_wait_ns += l.peer_wait_ns;
                }
                // One call in flight is one entry, however many `enter` records name it (the
                // background thread's, then the one written as the process ended, then its
                // observer's).
                Record::Enter(c)
                    if !completed.contains(&(c.comm_id, c.t_enter))
                        && listed.insert((c.comm_id, c.op, c.t_enter)) =>
                {
                    let op = c.op();
                    in_flight.push(InFlight {
                        rank: c.rank,
                        comm_id: format_comm_id(c.comm_id),
                        op: op.name().to_owned(),
                        seq: if op.is_p2p() { c.op_seq } else { c.seq },
                        peer: op.is_p2p().then_some(c.peer),
                        for_s: last_beat.saturating_sub(c.t_enter) as f64 / 1e9,
                    });
                }
                _ => {}
            }
        }
    }
    for row in calls.per_comm_op()? {
        fold_calls(comm_entry(&mut comms, row.comm), &row);
    }
    for (k, n) in &sends {
        let m = recvs.get(k).copied().unwrap_or(0);
        p2p.matched += (*n).min(m);
        p2p.unmatched += n.abs_diff(m);
    }
    for (k, m) in &recvs {
        if !sends.contains_key(k) {
            p2p.unmatched += m;
        }
    }
    in_flight.sort_by(|a, b| (a.rank, &a.comm_id, a.seq).cmp(&(b.rank, &b.comm_id, b.seq)));
    let mut links: Vec<LinkSummary> = links
        .into_iter()
        .map(|((comm, rank, peer, send), t)| LinkSummary {
            comm_id: format_comm_id(comm),
            rank,
            peer,
            direction: if send { "send" } else { "recv" },
            ops: t.ops,
            bytes: t.bytes,
            busy_s: t.busy_ns as f64 / 1e9,
            gbps: if t.busy_ns > 0 {
                t.bytes as f64 / t.busy_ns as f64
            } else {
                0.0
            },
            xfer_bytes: t.xfer_bytes,
            net_s: t.net_ns as f64 / 1e9,
            gpu_wait_s: t.gpu_wait_ns as f64 / 1e9,
            peer_wait_s: t.peer_wait_ns as f64 / 1e9,
            net_gbps: if t.net_ns > 0 {
                t.xfer_bytes as f64 / t.net_ns as f64
            } else {
                0.0
            },
        })
        .collect();
    links.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.rank.cmp(&b.rank))
            .then(a.peer.cmp(&b.peer))
    });
    unfinished.sort_unstable();
    let mut comms: Vec<CommSummary> = comms
        .into_values()
        .filter(|c| !c.ops.is_empty() || c.size > 0)
        .collect();
    for c in &mut comms {
        c.ranks.sort_unstable();
        for (op, (n, secs)) in &c.dur {
            if *n > 0 {
                c.mean_duration_us
                    .insert(op.clone(), secs / *n as f64 * 1e6);
            }
        }
        for (op, (b, bus, secs)) in &c.bw {
            if *secs > 0.0 && *b > 0.0 {
                c.algbw_gbps.insert(op.clone(), b / secs / 1e9);
                c.busbw_gbps.insert(op.clone(), bus / secs / 1e9);
            }
        }
    }
    // World first, then by size (largest first), then id.
    comms.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| a.comm_id.cmp(&b.comm_id)));
    Ok(Summary {
        job: job.job.clone(),
        records: job.records() as u64,
        ranks: ranks.len() as u64,
        processes: job
            .processes
            .iter()
            .filter(|p| !p.header.is_transport())
            .count() as u64,
        comms,
        p2p,
        in_flight,
        links,
        dropped,
        unfinished_ranks: unfinished,
        sampled_out,
        warnings: job.warnings.clone(),
    })
}

/// Renders a summary for people.
pub fn render_text(s: &Summary) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "job {}: {} ranks, {} records from {} processes",
        s.job, s.ranks, s.records, s.processes
    );
    let idle = s.comms.iter().filter(|c| c.ops.is_empty()).count();
    for c in s.comms.iter().filter(|c| !c.ops.is_empty()) {
        let name = c
            .name
            .as_deref()
            .map(|n| format!(" \"{n}\""))
            .unwrap_or_default();
        let ops: Vec<String> = c
            .ops
            .iter()
            .map(|(op, n)| {
                let mut notes: Vec<String> = Vec::new();
                if let Some(bw) = c.busbw_gbps.get(op).filter(|_| c.size > 1) {
                    notes.push(format!("busbw {}", gbps(*bw)));
                }
                if let Some(k) = c.graph_captured.get(op) {
                    notes.push(format!("{k} captured into CUDA graphs"));
                }
                if let Some(k) = c.graph_launches.get(op) {
                    notes.push(format!("{k} run by graph launches"));
                }
                if notes.is_empty() {
                    format!("{op} {n}")
                } else {
                    format!("{op} {n} ({})", notes.join(", "))
                }
            })
            .collect();
        let local = if c.local_id {
            " (process-local id)"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "  comm {}{name}, size {}{local}: {}",
            c.comm_id,
            c.size,
            ops.join(", ")
        );
    }
    if idle > 0 {
        let _ = writeln!(
            o,
            "  ({idle} more communicators without calls, e.g. each rank's MPI_COMM_SELF)"
        );
    }
    if s.p2p.send + s.p2p.recv > 0 {
        let _ = writeln!(
            o,
            "  point-to-point: {} sends, {} receives; {} matched, {} unmatched",
            s.p2p.send, s.p2p.recv, s.p2p.matched, s.p2p.unmatched
        );
    }
    if !s.links.is_empty() {
        let _ = writeln!(
            o,
            "  links ({}; NCCL proxy, heaviest first):",
            s.links.len()
        );
        for l in s.links.iter().take(8) {
            let arrow = if l.direction == "send" { "→" } else { "←" };
            let steps = if l.net_s > 0.0 {
                format!(
                    "; on the network {} ({:.1} ms), waiting for the GPU {:.1} ms{}",
                    gbps(l.net_gbps),
                    l.net_s * 1e3,
                    l.gpu_wait_s * 1e3,
                    if l.direction == "send" {
                        format!(", for the receiver {:.1} ms", l.peer_wait_s * 1e3)
                    } else {
                        String::new()
                    }
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                o,
                "    rank {} {arrow} peer {} on {}: {} ops, {}, {}{steps}",
                l.rank,
                l.peer,
                l.comm_id,
                l.ops,
                commscope_analyzer::stream::fmt_bytes(l.bytes),
                gbps(l.gbps)
            );
        }
        if s.links.len() > 8 {
            let _ = writeln!(o, "    … {} more", s.links.len() - 8);
        }
    }
    if s.in_flight.is_empty() {
        let _ = writeln!(o, "  in flight: nothing");
    } else {
        let _ = writeln!(
            o,
            "  in flight ({} calls never completed):",
            s.in_flight.len()
        );
        for f in &s.in_flight {
            let peer = f
                .peer
                .map(|p| format!(" with peer {p}"))
                .unwrap_or_default();
            let _ = writeln!(
                o,
                "    rank {} in {}{peer} on comm {} seq {} for {:.1} s",
                f.rank, f.op, f.comm_id, f.seq, f.for_s
            );
        }
    }
    let d = &s.dropped;
    if d.ring_full + d.in_flight_table + d.other > 0 {
        let _ = writeln!(
            o,
            "  dropped: {} records (ring full), {} in-flight entries, {} other",
            d.ring_full, d.in_flight_table, d.other
        );
    }
    if s.sampled_out > 0 {
        let _ = writeln!(
            o,
            "  consistent sampling: {} calls left out (counted above through their skip records)",
            s.sampled_out
        );
    }
    if !s.unfinished_ranks.is_empty() {
        let _ = writeln!(
            o,
            "  no clean shutdown recorded for ranks {:?}",
            s.unfinished_ranks
        );
    }
    for w in &s.warnings {
        let _ = writeln!(o, "  warning: {w}");
    }
    o
}

/// A bandwidth in GB/s with sensible precision.
fn gbps(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} GB/s")
    } else if v >= 1.0 {
        format!("{v:.1} GB/s")
    } else {
        format!("{v:.3} GB/s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summarize_ok(job: &JobTrace) -> Summary {
        summarize(job).expect("summary")
    }
    use commscope_wire::cst::Header;
    use commscope_wire::parquet::ProcessTrace;
    use commscope_wire::record::{Call, Comm, Heartbeat};

    fn call(rank: i32, op: Op, seq: u64, t: u64) -> Call {
        Call {
            rec_seq: t,
            op: op as u8,
            comm_id: 0xc0,
            seq,
            rank,
            comm_rank: rank,
            comm_size: 2,
            peer: -1,
            tag: -1,
            peer2: -1,
            tag2: -1,
            t_enter: t,
            t_exit: t + 5,
            ..Default::default()
        }
    }

    fn process(rank: i32, records: Vec<Record>) -> ProcessTrace {
        ProcessTrace {
            header: Header {
                rank,
                job: "j".into(),
                pid: rank as u32 + 100,
                ..Default::default()
            },
            records,
            clock: None,
            cut_short: false,
        }
    }

    fn job(processes: Vec<ProcessTrace>) -> JobTrace {
        JobTrace {
            job: "j".into(),
            processes,
            ..Default::default()
        }
    }

    #[test]
    fn a_send_pairs_with_its_receive_and_a_sendrecv_with_both() {
        // rank 0 sends to 1 (tag 7, first message); rank 1 receives it; both sendrecv with each other.
        let send = Call {
            peer: 1,
            tag: 7,
            op_seq: 0,
            ..call(0, Op::Send, 0, 10)
        };
        let recv = Call {
            peer: 0,
            tag: 7,
            op_seq: 0,
            ..call(1, Op::Recv, 0, 10)
        };
        let sr0 = Call {
            peer: 1,
            tag: 9,
            op_seq: 0,
            peer2: 1,
            tag2: 9,
            op_seq2: 0,
            ..call(0, Op::Sendrecv, 0, 20)
        };
        let sr1 = Call {
            peer: 0,
            tag: 9,
            op_seq: 0,
            peer2: 0,
            tag2: 9,
            op_seq2: 0,
            ..call(1, Op::Sendrecv, 0, 20)
        };
        let s = summarize_ok(&job(vec![
            process(0, vec![Record::Call(send), Record::Call(sr0)]),
            process(1, vec![Record::Call(recv), Record::Call(sr1)]),
        ]));
        assert_eq!(
            (s.p2p.send, s.p2p.recv, s.p2p.matched, s.p2p.unmatched),
            (3, 3, 3, 0)
        );
    }

    #[test]
    fn an_unmatched_send_is_counted() {
        let send = Call {
            peer: 1,
            tag: 7,
            ..call(0, Op::Send, 0, 10)
        };
        let s = summarize_ok(&job(vec![process(0, vec![Record::Call(send)])]));
        assert_eq!((s.p2p.matched, s.p2p.unmatched), (0, 1));
    }

    #[test]
    fn a_send_that_returned_an_error_is_not_a_message() {
        let failed = Call {
            peer: 4,
            tag: 0,
            status: 6,
            ..call(0, Op::Send, 0, 10)
        };
        let s = summarize_ok(&job(vec![process(0, vec![Record::Call(failed)])]));
        assert_eq!((s.p2p.send, s.p2p.matched, s.p2p.unmatched), (0, 0, 0));
    }

    #[test]
    fn in_flight_lists_entered_calls_that_never_completed() {
        let done = call(0, Op::Allreduce, 4, 100);
        let entered_done = Call { t_exit: 0, ..done };
        let stuck = Call {
            t_exit: 0,
            ..call(1, Op::Allreduce, 5, 200)
        };
        let beat = Heartbeat {
            rec_seq: 9,
            t_mono: 2_000_000_200,
            rank: 1,
            ..Default::default()
        };
        let s = summarize_ok(&job(vec![
            process(0, vec![Record::Enter(entered_done), Record::Call(done)]),
            process(1, vec![Record::Enter(stuck), Record::Heartbeat(beat)]),
        ]));
        assert_eq!(s.in_flight.len(), 1);
        assert_eq!(
            (
                s.in_flight[0].rank,
                s.in_flight[0].seq,
                s.in_flight[0].op.as_str()
            ),
            (1, 5, "allreduce")
        );
        assert!((s.in_flight[0].for_s - 2.0).abs() < 1e-9);
        assert_eq!(
            s.unfinished_ranks,
            vec![0, 1],
            "no final heartbeat from either"
        );
    }

    #[test]
    fn communicators_take_their_names_and_sizes_from_comm_records() {
        let mut c = Comm::new(
            commscope_wire::record::CommEvent::Created,
            0xc0,
            0,
            1,
            0,
            0,
            2,
            0,
        );
        c.set_name(b"tp");
        let s = summarize_ok(&job(vec![process(
            0,
            vec![Record::Comm(c), Record::Call(call(0, Op::Barrier, 0, 5))],
        )]));
        assert_eq!(s.comms.len(), 1);
        assert_eq!(
            (
                s.comms[0].name.as_deref(),
                s.comms[0].size,
                s.comms[0].ops.get("barrier")
            ),
            (Some("tp"), 2, Some(&1))
        );
        let text = render_text(&s);
        assert!(
            text.contains("comm 0xc0 \"tp\", size 2: barrier 1"),
            "{text}"
        );
    }
}
