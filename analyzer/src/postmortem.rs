//! The post-mortem of one job's trace: what `commscope report` draws. Its findings with the
//! calls around each, a rank × time lateness map, per-communicator progress and the hang front,
//! duration distributions and bus bandwidth by message size, node pairs, and what each late
//! rank cost the others.
//!
//! Times are seconds from the trace's first record. Every series is bounded (ranks grouped,
//! time binned, points sampled), so a report of a thousand-rank job stays a few megabytes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Clock, Op};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::Record;
use serde::Serialize;

use crate::batch::{Analysis, real_time};
use crate::finding::Finding;

/// Heatmap rows at most (ranks are grouped beyond).
const HEAT_ROWS: usize = 128;
/// Heatmap columns (time bins).
const HEAT_COLS: usize = 120;
/// Progress points per communicator, at most.
const PROGRESS_POINTS: usize = 240;
/// Communicators drawn in the progress chart, at most (those with the most calls).
const PROGRESS_COMMS: usize = 12;
/// Calls drawn per rank in a finding's timeline, at most.
const TIMELINE_CALLS: usize = 300;
/// Ranks drawn in a finding's timeline, at most.
const TIMELINE_RANKS: usize = 12;

/// One job's report.
#[derive(Debug, Serialize)]
pub struct JobReport {
    pub job: String,
    pub ranks: usize,
    /// Nodes named in the trace (0: the format names none).
    pub nodes: usize,
    pub records: usize,
    /// The trace's first record (ns since the epoch); every `*_s` below is from here.
    pub start_ns: u64,
    pub duration_s: f64,
    pub libraries: Vec<String>,
    pub step_s: Option<f64>,
    pub findings: Vec<FindingView>,
    pub heatmap: Heatmap,
    pub progress: Vec<Progress>,
    pub durations: Vec<Durations>,
    pub busbw: Vec<BusBw>,
    pub links: Vec<LinkRow>,
    pub whatif: WhatIf,
}

/// A finding with the calls around it.
#[derive(Debug, Serialize)]
pub struct FindingView {
    pub finding: Finding,
    pub opened_s: f64,
    pub timeline: Timeline,
}

/// Calls of a few ranks in a window: `[row, start_s, end_s, label, in_flight]`.
#[derive(Debug, Default, Serialize)]
pub struct Timeline {
    pub rows: Vec<String>,
    pub from_s: f64,
    pub to_s: f64,
    pub calls: Vec<(usize, f64, f64, String, bool)>,
}

/// Mean lateness (ms) per rank group and time bin: `[col, row, ms]`.
#[derive(Debug, Default, Serialize)]
pub struct Heatmap {
    pub rows: Vec<String>,
    pub bin_s: f64,
    pub cells: Vec<(usize, usize, f64)>,
    pub max_ms: f64,
}

/// Completed collectives on one communicator over time: `[t_s, least, most]` over its ranks.
#[derive(Debug, Serialize)]
pub struct Progress {
    pub comm: String,
    pub name: String,
    pub size: usize,
    pub points: Vec<(f64, u64, u64)>,
}

/// A duration histogram of one op: `[from_us, to_us, calls]` on a log scale.
#[derive(Debug, Serialize)]
pub struct Durations {
    pub op: String,
    pub bins: Vec<(f64, f64, u64)>,
}

/// Median bus bandwidth (GB/s) by message size (bytes) of one op: `[bytes, GB/s, calls]`.
#[derive(Debug, Serialize)]
pub struct BusBw {
    pub op: String,
    pub points: Vec<(u64, f64, u64)>,
}

/// One node pair's traffic.
#[derive(Debug, Serialize)]
pub struct LinkRow {
    pub src: String,
    pub dst: String,
    pub bytes: u64,
    /// Bytes per second of network time per channel.
    pub rate_gbs: f64,
}

/// What the job would save without each rank's delay.
#[derive(Debug, Default, Serialize)]
pub struct WhatIf {
    /// `(rank, node, share of wall time the others waited for it)`, largest first; ranks under
    /// 1 % are left out.
    pub ranks: Vec<(i32, String, f64)>,
}

/// When a call ran, on the trace's common clock.
fn span(p: &ProcessTrace, c: &commscope_wire::record::Call) -> (u64, u64) {
    let (a, b) = c.span();
    let clock = if c.has_gpu_time() {
        Clock::HostMono
    } else {
        c.clock()
    };
    (real_time(p, a, clock), real_time(p, b, clock))
}

/// Builds the report of one job from its trace and analysis.
pub fn report(job: &str, processes: &[ProcessTrace], analysis: &Analysis) -> JobReport {
    let start = processes
        .iter()
        .flat_map(|p| {
            p.records.iter().filter_map(move |r| match r {
                Record::Call(c) | Record::Enter(c) => Some(span(p, c).0),
                Record::Heartbeat(h) => Some(real_time(p, h.t_mono, Clock::HostMono)),
                _ => None,
            })
        })
        .filter(|t| *t > 0)
        .min()
        .unwrap_or(0);
    let end = analysis.view.now_ns.max(start);
    let s = |t: u64| t.saturating_sub(start) as f64 / 1e9;
    let ranks: BTreeSet<i32> = processes.iter().map(|p| p.header.rank).collect();
    let nodes: BTreeSet<&str> = processes
        .iter()
        .map(|p| p.header.node.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    let libraries: BTreeSet<String> = processes
        .iter()
        .map(|p| p.header.library.clone())
        .filter(|l| !l.is_empty())
        .collect();
    let instances = instances(processes);
    JobReport {
        job: job.to_owned(),
        ranks: ranks.len(),
        nodes: nodes.len(),
        records: processes.iter().map(|p| p.records.len()).sum(),
        start_ns: start,
        duration_s: s(end),
        libraries: libraries.into_iter().collect(),
        step_s: analysis.step.as_ref().map(|x| x.0),
        findings: analysis
            .findings
            .iter()
            .map(|f| FindingView {
                finding: f.clone(),
                opened_s: s(f.opened_at),
                timeline: timeline(processes, analysis, f, start, end),
            })
            .collect(),
        heatmap: heatmap(&instances, &ranks, start, end),
        progress: progress(processes, analysis, start),
        durations: durations(processes),
        busbw: busbw(processes),
        links: analysis
            .links
            .iter()
            .map(|l| LinkRow {
                src: l.src.clone(),
                dst: l.dst.clone(),
                bytes: l.bytes,
                rate_gbs: if l.net_ns > 0 {
                    l.bytes as f64 / l.net_ns as f64
                } else {
                    0.0
                },
            })
            .collect(),
        whatif: what_if(analysis, processes),
    }
}

/// One collective instance: each member's arrival (ns), by global rank.
type Instances = Vec<Vec<(i32, u64)>>;

fn instances(processes: &[ProcessTrace]) -> Instances {
    let mut by_key: HashMap<(u64, u64), Vec<(i32, u64)>> = HashMap::new();
    for p in processes {
        for r in &p.records {
            if let Record::Call(c) = r {
                if c.op().is_p2p() || c.op() == Op::None || c.comm_size < 2 {
                    continue;
                }
                by_key
                    .entry((c.comm_id, c.seq))
                    .or_default()
                    .push((c.rank, span(p, c).0));
            }
        }
    }
    by_key.into_values().filter(|v| v.len() >= 2).collect()
}

fn heatmap(instances: &Instances, ranks: &BTreeSet<i32>, start: u64, end: u64) -> Heatmap {
    let ranks: Vec<i32> = ranks.iter().copied().collect();
    if ranks.is_empty() || end <= start {
        return Heatmap::default();
    }
    let per_row = ranks.len().div_ceil(HEAT_ROWS).max(1);
    let row_of: HashMap<i32, usize> = ranks
        .iter()
        .enumerate()
        .map(|(i, r)| (*r, i / per_row))
        .collect();
    let rows: Vec<String> = ranks
        .chunks(per_row)
        .map(|c| match c {
            [r] => format!("rank {r}"),
            _ => format!("ranks {}–{}", c[0], c[c.len() - 1]),
        })
        .collect();
    let bin_ns = (end - start).div_ceil(HEAT_COLS as u64).max(1);
    let mut sum: HashMap<(usize, usize), (f64, u32)> = HashMap::new();
    for inst in instances {
        let first = inst.iter().map(|x| x.1).min().unwrap_or(0);
        for (rank, t) in inst {
            let (Some(row), Some(off)) = (row_of.get(rank), t.checked_sub(start)) else {
                continue;
            };
            let col = ((off / bin_ns) as usize).min(HEAT_COLS - 1);
            let e = sum.entry((col, *row)).or_default();
            e.0 += (t - first) as f64 / 1e6;
            e.1 += 1;
        }
    }
    let mut cells: Vec<(usize, usize, f64)> = sum
        .into_iter()
        .map(|((c, r), (ms, n))| (c, r, ms / f64::from(n)))
        .collect();
    cells.sort_by_key(|c| (c.0, c.1));
    let max_ms = cells.iter().map(|c| c.2).fold(0.0, f64::max);
    Heatmap {
        rows,
        bin_s: bin_ns as f64 / 1e9,
        cells,
        max_ms,
    }
}

fn progress(processes: &[ProcessTrace], analysis: &Analysis, start: u64) -> Vec<Progress> {
    // (time, comm, rank, completed through)
    let mut events: Vec<(u64, u64, i32, u64)> = Vec::new();
    let mut calls: HashMap<u64, u64> = HashMap::new();
    for p in processes {
        for r in &p.records {
            if let Record::Call(c) = r {
                if c.op().is_p2p() {
                    continue;
                }
                events.push((span(p, c).1, c.comm_id, c.rank, c.seq + 1));
                *calls.entry(c.comm_id).or_default() += 1;
            }
        }
    }
    let mut busiest: Vec<(u64, u64)> = calls.into_iter().collect();
    busiest.sort_by_key(|(c, n)| (std::cmp::Reverse(*n), *c));
    busiest.truncate(PROGRESS_COMMS);
    let keep: BTreeSet<u64> = busiest.iter().map(|x| x.0).collect();
    events.retain(|e| keep.contains(&e.1));
    events.sort_unstable();
    let span_ns = events
        .last()
        .map_or(1, |e| e.0.saturating_sub(start))
        .max(1);
    let bin = span_ns.div_ceil(PROGRESS_POINTS as u64).max(1);
    let mut out = Vec::new();
    for (comm, _) in &busiest {
        let members = analysis.view.members(*comm);
        let mut done: BTreeMap<i32, u64> = members.iter().map(|m| (*m, 0)).collect();
        let mut points: Vec<(f64, u64, u64)> = Vec::new();
        let mut last_bin = u64::MAX;
        for (t, _, rank, through) in events.iter().filter(|e| e.1 == *comm) {
            let d = done.entry(*rank).or_insert(0);
            *d = (*d).max(*through);
            let b = t.saturating_sub(start) / bin;
            let least = done.values().copied().min().unwrap_or(0);
            let most = done.values().copied().max().unwrap_or(0);
            let point = (t.saturating_sub(start) as f64 / 1e9, least, most);
            if b == last_bin {
                if let Some(x) = points.last_mut() {
                    *x = point;
                }
            } else {
                points.push(point);
                last_bin = b;
            }
        }
        out.push(Progress {
            comm: format_comm_id(*comm),
            name: analysis
                .view
                .comms
                .get(comm)
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            size: done.len(),
            points,
        });
    }
    out
}

fn durations(processes: &[ProcessTrace]) -> Vec<Durations> {
    // Bins of a quarter decade from 1 µs.
    let mut hist: BTreeMap<&'static str, BTreeMap<i32, u64>> = BTreeMap::new();
    for p in processes {
        for r in &p.records {
            if let Record::Call(c) = r {
                let us = (c.span_ns() as f64 / 1e3).max(1.0);
                let b = (us.log10() * 4.0).floor() as i32;
                *hist.entry(c.op().name()).or_default().entry(b).or_default() += 1;
            }
        }
    }
    hist.into_iter()
        .map(|(op, bins)| Durations {
            op: op.to_owned(),
            bins: bins
                .into_iter()
                .map(|(b, n)| {
                    (
                        10f64.powf(f64::from(b) / 4.0),
                        10f64.powf(f64::from(b + 1) / 4.0),
                        n,
                    )
                })
                .collect(),
        })
        .collect()
}

fn busbw(processes: &[ProcessTrace]) -> Vec<BusBw> {
    let mut by: BTreeMap<&'static str, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for p in processes {
        for r in &p.records {
            if let Record::Call(c) = r {
                if c.op().is_p2p() && c.op() != Op::Sendrecv {
                    continue;
                }
                if let Some(bw) = c.busbw().filter(|b| b.is_finite() && *b > 0.0) {
                    by.entry(c.op().name())
                        .or_default()
                        .entry(c.bytes)
                        .or_default()
                        .push(bw / 1e9);
                }
            }
        }
    }
    by.into_iter()
        .map(|(op, sizes)| BusBw {
            op: op.to_owned(),
            points: sizes
                .into_iter()
                .map(|(bytes, mut v)| {
                    v.sort_by(f64::total_cmp);
                    (bytes, v[v.len() / 2], v.len() as u64)
                })
                .collect(),
        })
        .collect()
}

/// The slow-rank detector's blame ([`crate::detectors::slow_rank::RankHealth`]): the share of
/// wall time the others waited for each rank's own compute, which is what the job would save
/// without that rank's delay (waiting inside an earlier collective is not blamed on the waiter).
fn what_if(analysis: &Analysis, processes: &[ProcessTrace]) -> WhatIf {
    let node: HashMap<i32, &str> = processes
        .iter()
        .map(|p| (p.header.rank, p.header.node.as_str()))
        .collect();
    let mut ranks: Vec<(i32, String, f64)> = analysis
        .health
        .iter()
        .filter(|h| h.share >= 0.01)
        .map(|h| {
            (
                h.rank,
                node.get(&h.rank).copied().unwrap_or("").to_owned(),
                h.share,
            )
        })
        .collect();
    ranks.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    ranks.truncate(10);
    WhatIf { ranks }
}

/// The ranks a finding is about (its own, then who waited for it), and a window around it.
fn timeline(
    processes: &[ProcessTrace],
    analysis: &Analysis,
    f: &Finding,
    start: u64,
    end: u64,
) -> Timeline {
    let mut rows: Vec<i32> = f.ranks.clone();
    for key in ["victims", "members"] {
        for r in f.evidence[key].as_array().into_iter().flatten() {
            if let Some(r) = r.as_i64() {
                let r = r as i32;
                if !rows.contains(&r) {
                    rows.push(r);
                }
            }
        }
    }
    // Others beside the ranks it names, to compare with.
    let mut all: Vec<i32> = processes.iter().map(|p| p.header.rank).collect();
    all.sort_unstable();
    all.dedup();
    for r in all {
        if rows.len() >= 4 {
            break;
        }
        if !rows.contains(&r) {
            rows.push(r);
        }
    }
    rows.truncate(TIMELINE_RANKS);
    let at = f.opened_at.clamp(start, end.max(start));
    let from = at.saturating_sub(5_000_000_000).max(start);
    let to = end.min(at.saturating_add(10_000_000_000)).max(at);
    let s = |t: u64| t.saturating_sub(start) as f64 / 1e9;
    let mut calls = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let mut n = 0;
        for p in processes.iter().filter(|p| p.header.rank == *r) {
            for rec in &p.records {
                let Record::Call(c) = rec else { continue };
                let (a, b) = span(p, c);
                if b < from || a > to || n >= TIMELINE_CALLS {
                    continue;
                }
                n += 1;
                calls.push((
                    i,
                    s(a),
                    s(b.max(a)),
                    format!("{} #{}", c.op().name(), c.seq),
                    false,
                ));
            }
        }
        if let Some(v) = analysis.view.ranks.get(r) {
            for c in &v.in_flight {
                calls.push((
                    i,
                    s(c.entered_ns.max(start)),
                    s(end),
                    format!("{} #{} (never completed)", c.op.name(), c.seq),
                    true,
                ));
            }
        }
    }
    Timeline {
        rows: rows.iter().map(|r| format!("rank {r}")).collect(),
        from_s: s(from),
        to_s: s(end.max(to)),
        calls,
    }
}
