//! The post-mortem of one job's trace: what `commscope report` draws. Its findings with the
//! calls around each, a rank × time lateness map, per-communicator progress and the hang front,
//! duration distributions and bus bandwidth by message size, node pairs, and what each late
//! rank cost the others.
//!
//! Times are seconds from the trace's first record. Every series is bounded (ranks grouped,
//! time binned, points sampled), so a report of a thousand-rank job stays a few megabytes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use commscope_wire::hash::format_comm_id;
use commscope_wire::parquet::ProcessTrace;
use serde::Serialize;

use crate::aggregate::{self, Calls};
use crate::batch::Analysis;
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

/// What polars computes of a job's calls for its report ([`aggregate`]): it needs nothing
/// from the analysis, so it may run while the detectors stream.
#[derive(Debug)]
pub struct Aggregates {
    shape: aggregate::Shape,
    progress: Vec<aggregate::ProgressRow>,
}

/// The aggregations of one job's calls: two passes over its rows.
pub fn aggregate(calls: &Calls) -> Result<Aggregates, aggregate::Error> {
    let t0 = std::time::Instant::now();
    let shape = calls.shape()?;
    tracing::debug!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "rows, extent and histograms"
    );
    let bin = (shape.end - shape.start)
        .max(1)
        .div_ceil(PROGRESS_POINTS as u64)
        .max(1);
    let progress = calls.progress(shape.start, bin)?;
    tracing::debug!(elapsed_ms = t0.elapsed().as_millis() as u64, "progress");
    Ok(Aggregates { shape, progress })
}

/// Builds the report of one job: its processes (headers; records are not read here), its
/// calls (for the timelines around findings), its aggregations and its analysis.
pub fn report(
    job: &str,
    processes: &[ProcessTrace],
    calls: &Calls,
    agg: Aggregates,
    analysis: &Analysis,
) -> Result<JobReport, aggregate::Error> {
    let (records, start, t) = (agg.shape.rows, agg.shape.start, agg.shape);
    let end = analysis.view.now_ns.max(start);
    let s = |t: u64| t.saturating_sub(start) as f64 / 1e9;
    let ranks: BTreeSet<i32> = processes
        .iter()
        .filter(|p| !p.header.is_transport())
        .map(|p| p.header.rank)
        .collect();
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
    let mut findings = Vec::with_capacity(analysis.findings.len());
    for f in &analysis.findings {
        findings.push(FindingView {
            finding: f.clone(),
            opened_s: s(f.opened_at),
            timeline: timeline(&ranks, calls, analysis, f, start, end)?,
        });
    }
    let rank_list: Vec<i32> = ranks.iter().copied().collect();
    Ok(JobReport {
        job: job.to_owned(),
        ranks: ranks.len(),
        nodes: nodes.len(),
        records: records as usize,
        start_ns: start,
        duration_s: s(end),
        libraries: libraries.into_iter().collect(),
        step_s: analysis.step.as_ref().map(|x| x.0),
        findings,
        heatmap: heatmap(analysis, &rank_list, start, end),
        progress: progress(&agg.progress, analysis, start),
        durations: durations(t.durations),
        busbw: busbw(&t.bandwidth),
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
    })
}

fn heatmap(analysis: &Analysis, ranks: &[i32], start: u64, end: u64) -> Heatmap {
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
    // The lateness map's bins (a second or more) into the chart's columns.
    let bin_ns = (end - start).div_ceil(HEAT_COLS as u64).max(1);
    let m = &analysis.lateness;
    let mut sum: BTreeMap<(usize, usize), (u64, u64)> = BTreeMap::new();
    for (b, rank, late, n) in &m.cells {
        let Some(row) = row_of.get(rank) else {
            continue;
        };
        let at = b.saturating_mul(m.bin_ns).saturating_add(m.bin_ns / 2);
        let col = ((at.saturating_sub(start) / bin_ns) as usize).min(HEAT_COLS - 1);
        let e = sum.entry((col, *row)).or_default();
        e.0 += late;
        e.1 += n;
    }
    let cells: Vec<(usize, usize, f64)> = sum
        .into_iter()
        .filter(|(_, (_, n))| *n > 0)
        .map(|((c, r), (late, n))| (c, r, late as f64 / n as f64 / 1e6))
        .collect();
    let max_ms = cells.iter().map(|c| c.2).fold(0.0, f64::max);
    Heatmap {
        rows,
        bin_s: bin_ns as f64 / 1e9,
        cells,
        max_ms,
    }
}

fn progress(rows: &[aggregate::ProgressRow], analysis: &Analysis, start: u64) -> Vec<Progress> {
    // The communicators with the most collective calls.
    let mut calls: BTreeMap<u64, u64> = BTreeMap::new();
    for r in rows {
        *calls.entry(r.0).or_default() += r.5;
    }
    let mut busiest: Vec<(u64, u64)> = calls.into_iter().collect();
    busiest.sort_by_key(|(c, n)| (std::cmp::Reverse(*n), *c));
    busiest.truncate(PROGRESS_COMMS);
    let mut out = Vec::new();
    for (comm, _) in &busiest {
        let members = analysis.view.members(*comm);
        let mut done: BTreeMap<i32, u64> = members.iter().map(|m| (*m, 0)).collect();
        let mut points: Vec<(f64, u64, u64)> = Vec::new();
        let mine: Vec<&aggregate::ProgressRow> = rows.iter().filter(|x| x.0 == *comm).collect();
        let mut i = 0;
        while i < mine.len() {
            let b = mine[i].2;
            let mut last = 0;
            while i < mine.len() && mine[i].2 == b {
                let d = done.entry(mine[i].1).or_insert(0);
                *d = (*d).max(mine[i].3);
                last = last.max(mine[i].4);
                i += 1;
            }
            let least = done.values().copied().min().unwrap_or(0);
            let most = done.values().copied().max().unwrap_or(0);
            points.push((last.saturating_sub(start) as f64 / 1e9, least, most));
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

fn durations(rows: Vec<(String, i32, u64)>) -> Vec<Durations> {
    let mut hist: BTreeMap<String, Vec<(f64, f64, u64)>> = BTreeMap::new();
    for (op, b, n) in rows {
        hist.entry(op).or_default().push((
            10f64.powf(f64::from(b) / 4.0),
            10f64.powf(f64::from(b + 1) / 4.0),
            n,
        ));
    }
    hist.into_iter()
        .map(|(op, bins)| Durations { op, bins })
        .collect()
}

fn busbw(bandwidth: &[aggregate::BandwidthRow]) -> Vec<BusBw> {
    let mut by: BTreeMap<String, Vec<(u64, f64, u64)>> = BTreeMap::new();
    for (op, bytes, gbs, n) in aggregate::busbw_medians(bandwidth) {
        by.entry(op).or_default().push((bytes, gbs, n));
    }
    by.into_iter()
        .map(|(op, points)| BusBw { op, points })
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
    all: &BTreeSet<i32>,
    calls: &Calls,
    analysis: &Analysis,
    f: &Finding,
    start: u64,
    end: u64,
) -> Result<Timeline, aggregate::Error> {
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
    for r in all {
        if rows.len() >= 4 {
            break;
        }
        if !rows.contains(r) {
            rows.push(*r);
        }
    }
    rows.truncate(TIMELINE_RANKS);
    let at = f.opened_at.clamp(start, end.max(start));
    let from = at.saturating_sub(5_000_000_000).max(start);
    let to = end.min(at.saturating_add(10_000_000_000)).max(at);
    let s = |t: u64| t.saturating_sub(start) as f64 / 1e9;
    let mut out = Vec::new();
    for (rank, a, b, op, seq) in calls.window(&rows, from, to, TIMELINE_CALLS)? {
        let Some(i) = rows.iter().position(|r| *r == rank) else {
            continue;
        };
        out.push((i, s(a), s(b.max(a)), format!("{op} #{seq}"), false));
    }
    for (i, r) in rows.iter().enumerate() {
        if let Some(v) = analysis.view.ranks.get(r) {
            for c in &v.in_flight {
                out.push((
                    i,
                    s(c.entered_ns.max(start)),
                    s(end),
                    format!("{} #{} (never completed)", c.op.name(), c.seq),
                    true,
                ));
            }
        }
    }
    Ok(Timeline {
        rows: rows.iter().map(|r| format!("rank {r}")).collect(),
        from_s: s(from),
        to_s: s(end.max(to)),
        calls: out,
    })
}
