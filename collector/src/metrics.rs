//! `/metrics` of the collector, in the Prometheus text format. The catalog, with label
//! bounds, is in `docs/metrics.md`. The job is labelled `job_id` (Prometheus keeps `job` for
//! the scrape job):
//!
//! - collector health and ingest: records by result, batches, commits, refusals by reason, log
//!   and segment I/O, streams, jobs by state;
//! - per job: ranks, records, drops by reason;
//! - per job, communicator and op: calls, bytes and a duration histogram — at most
//!   [`MAX_COMM_SERIES`] communicators per job by call count, the rest summed under
//!   `comm="other"`;
//! - per job and rank: calls, calls in flight, age of the oldest in-flight call, time since
//!   last seen — for at most [`MAX_RANK_SERIES`] ranks per job (the lowest ranks);
//! - per node: clock offset and error.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::Op;

use crate::Shared;
use crate::state::{BUCKETS, JobState, OpStats, now_ns};

/// Communicators with their own series per job.
pub const MAX_COMM_SERIES: usize = 32;
/// Node pairs per job with their own link series; the rest are summed under `other`.
pub const MAX_LINK_SERIES: usize = 64;
/// Ranks with their own series per job.
pub const MAX_RANK_SERIES: usize = 4096;

/// Escapes a label value.
pub fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Renders every series.
pub fn render(s: &Shared) -> String {
    let mut o = String::with_capacity(16 << 10);
    let st = s.store.stats();
    let m = &s.metrics;

    family(
        &mut o,
        "commscope_collector_up",
        "gauge",
        "1 while the collector serves.",
    );
    let _ = writeln!(o, "commscope_collector_up 1");
    family(
        &mut o,
        "commscope_collector_uptime_seconds",
        "gauge",
        "Seconds since the collector started.",
    );
    let _ = writeln!(
        o,
        "commscope_collector_uptime_seconds {:.3}",
        s.started.elapsed().as_secs_f64()
    );
    family(
        &mut o,
        "commscope_collector_records_received_total",
        "counter",
        "Records received in batches (before dedup).",
    );
    let _ = writeln!(
        o,
        "commscope_collector_records_received_total {}",
        m.records_in.load(Ordering::Relaxed)
    );
    family(
        &mut o,
        "commscope_collector_records_total",
        "counter",
        "Records by what became of them: stored, duplicate (resent, skipped), invalid (undecodable).",
    );
    for (k, v) in [
        ("stored", st.records_stored),
        ("duplicate", st.records_duplicate),
        ("invalid", st.records_invalid),
    ] {
        let _ = writeln!(o, "commscope_collector_records_total{{result=\"{k}\"}} {v}");
    }
    for (name, help, v) in [
        (
            "commscope_collector_batches_total",
            "Record batches stored and acknowledged.",
            st.batches,
        ),
        (
            "commscope_collector_commits_total",
            "Group commits (one sync of the write-ahead logs each).",
            st.commits,
        ),
        (
            "commscope_collector_commit_errors_total",
            "Group commits that failed (nothing in them was acknowledged).",
            st.commit_errors,
        ),
        (
            "commscope_collector_log_bytes_total",
            "Bytes appended to write-ahead logs.",
            st.log_bytes,
        ),
        (
            "commscope_collector_segments_written_total",
            "Parquet segments written.",
            st.segments_written,
        ),
        (
            "commscope_collector_segment_rows_total",
            "Rows written to Parquet segments.",
            st.segment_rows,
        ),
        (
            "commscope_collector_segment_errors_total",
            "Segments that failed to write (their logs are kept).",
            st.segment_errors,
        ),
        (
            "commscope_collector_segments_deleted_total",
            "Segments deleted by retention.",
            st.segments_deleted,
        ),
        (
            "commscope_collector_streams_total",
            "Agent streams accepted.",
            m.streams_total.load(Ordering::Relaxed),
        ),
        (
            "commscope_collector_bad_messages_total",
            "Agent streams that ended with an undecodable or oversized message.",
            m.bad_messages.load(Ordering::Relaxed),
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }
    family(
        &mut o,
        "commscope_collector_segment_bytes",
        "gauge",
        "Bytes of Parquet segments on disk.",
    );
    let _ = writeln!(o, "commscope_collector_segment_bytes {}", st.segment_bytes);
    family(
        &mut o,
        "commscope_collector_streams",
        "gauge",
        "Agent streams open now.",
    );
    let _ = writeln!(
        o,
        "commscope_collector_streams {}",
        m.streams_open.load(Ordering::Relaxed)
    );
    family(
        &mut o,
        "commscope_collector_refused_total",
        "counter",
        "Requests refused, by reason.",
    );
    {
        let r = m.refusals.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = r.iter().collect();
        v.sort();
        for (reason, n) in v {
            let _ = writeln!(
                o,
                "commscope_collector_refused_total{{reason=\"{reason}\"}} {n}"
            );
        }
    }
    family(
        &mut o,
        "commscope_node_clock_offset_seconds",
        "gauge",
        "Collector clock minus the node's clock, as the node's agent measured it.",
    );
    let clocks: Vec<(String, i64, u64)> = {
        let c = s.clocks.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<_> = c
            .iter()
            .map(|(n, a)| (n.clone(), a.offset_ns, a.error_ns))
            .collect();
        v.sort();
        v
    };
    for (n, off, _) in &clocks {
        let _ = writeln!(
            o,
            "commscope_node_clock_offset_seconds{{node=\"{}\"}} {:.9}",
            esc(n),
            *off as f64 / 1e9
        );
    }
    family(
        &mut o,
        "commscope_node_clock_error_seconds",
        "gauge",
        "Bound on the error of the node's clock offset.",
    );
    for (n, _, err) in &clocks {
        let _ = writeln!(
            o,
            "commscope_node_clock_error_seconds{{node=\"{}\"}} {:.9}",
            esc(n),
            *err as f64 / 1e9
        );
    }

    family(
        &mut o,
        "commscope_findings_open",
        "gauge",
        "Open findings, by job and kind (see docs/diagnosis.md).",
    );
    {
        let e = s.findings.lock().unwrap_or_else(|p| p.into_inner());
        let mut n: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
        for f in e.tracker.open.values() {
            *n.entry((f.job.as_str(), f.kind.name())).or_default() += 1;
        }
        for ((job, kind), c) in n {
            let _ = writeln!(
                o,
                "commscope_findings_open{{job_id=\"{}\",kind=\"{kind}\"}} {c}",
                esc(job)
            );
        }
    }

    let state = s.lock_state();
    family(
        &mut o,
        "commscope_collector_jobs",
        "gauge",
        "Jobs in memory, by state.",
    );
    let running = state.jobs.values().filter(|j| j.ended.is_none()).count();
    let _ = writeln!(o, "commscope_collector_jobs{{state=\"running\"}} {running}");
    let _ = writeln!(
        o,
        "commscope_collector_jobs{{state=\"ended\"}} {}",
        state.jobs.len() - running
    );
    family(
        &mut o,
        "commscope_collector_jobs_released_total",
        "counter",
        "Jobs whose state was released (ended and lingered, or evicted over the job limit).",
    );
    let _ = writeln!(
        o,
        "commscope_collector_jobs_released_total {}",
        state.released + state.evicted
    );
    {
        let p = s.sampling.lock().unwrap_or_else(|p| p.into_inner());
        family(
            &mut o,
            "commscope_collector_sample_factor",
            "gauge",
            "Consistent sampling: busy communicators keep 1 instance in this many (1: everything kept).",
        );
        let _ = writeln!(o, "commscope_collector_sample_factor {}", p.factor.max(1));
        family(
            &mut o,
            "commscope_collector_calls_offered_per_second",
            "gauge",
            "Consistent sampling: calls per second the running jobs make (kept and left out), at the last policy tick.",
        );
        let _ = writeln!(
            o,
            "commscope_collector_calls_offered_per_second {:.0}",
            p.offered
        );
    }

    let mut jobs: Vec<_> = state.jobs.values().collect();
    jobs.sort_by(|a, b| a.job.cmp(&b.job));
    for (name, kind, help, value) in [
        (
            "commscope_job_ranks",
            "gauge",
            "Ranks seen in the job.",
            JobState::rank_count as fn(&JobState) -> usize,
        ),
        (
            "commscope_job_records_total",
            "counter",
            "Records stored for the job.",
            |j| j.records as usize,
        ),
        (
            "commscope_job_calls_sampled_out_total",
            "counter",
            "Calls of the job that consistent sampling left out (counted through skip records).",
            |j| j.sampled_out as usize,
        ),
        (
            "commscope_job_sampled_comms",
            "gauge",
            "Communicators of the job sampled now (modulus above 1).",
            |j| j.sampled_comms as usize,
        ),
        (
            "commscope_job_records_awaiting_order",
            "gauge",
            "Records of the job held until every live rank's stream has passed their time, before the detectors see them.",
            |j| j.reorder.len(),
        ),
        (
            "commscope_job_records_out_of_order_total",
            "counter",
            "Records of the job the detectors saw out of time order: arrived behind the watermark, or handed over early from a full reorder buffer.",
            |j| (j.reorder.late + j.reorder.forced) as usize,
        ),
    ] {
        family(&mut o, name, kind, help);
        for j in &jobs {
            let _ = writeln!(o, "{name}{{job_id=\"{}\"}} {}", esc(&j.job), value(j));
        }
    }
    family(
        &mut o,
        "commscope_job_dropped_records_total",
        "counter",
        "Records the job's processes or agents could not deliver, by reason.",
    );
    for j in &jobs {
        let (mut a, mut b, mut c, mut d) = (0, 0, 0, 0);
        for r in j.ranks.values() {
            a += r.dropped_ring_full;
            b += r.dropped_in_flight;
            c += r.dropped_other;
            d += r.dropped_overrun;
        }
        for (reason, v) in [
            ("ring_full", a),
            ("in_flight_table", b),
            ("other", c),
            ("overrun", d),
        ] {
            let _ = writeln!(
                o,
                "commscope_job_dropped_records_total{{job_id=\"{}\",reason=\"{reason}\"}} {v}",
                esc(&j.job)
            );
        }
    }

    // Per (job, comm, op).
    family(
        &mut o,
        "commscope_collective_calls_total",
        "counter",
        "Calls completed, one per rank per call.",
    );
    let mut calls = String::new();
    let mut bytes = String::new();
    let mut hist = String::new();
    let mut bw = [String::new(), String::new(), String::new()];
    for j in &jobs {
        let mut comms: Vec<(&u64, u64)> = j
            .comms
            .iter()
            .map(|(id, c)| (id, c.ops.values().map(|s| s.calls).sum()))
            .collect();
        comms.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let mut other: std::collections::BTreeMap<u8, OpStats> = Default::default();
        let job = esc(&j.job);
        for (i, (id, _)) in comms.iter().enumerate() {
            let c = &j.comms[*id];
            let mut ops: Vec<_> = c.ops.iter().collect();
            ops.sort_by_key(|(op, _)| **op);
            for (op, s) in ops {
                if i >= MAX_COMM_SERIES {
                    let e = other.entry(*op).or_default();
                    e.calls += s.calls;
                    e.timed += s.timed;
                    e.bytes += s.bytes;
                    e.duration_sum_s += s.duration_sum_s;
                    e.bus_bytes += s.bus_bytes;
                    e.algbw_avg = e.algbw_avg.max(s.algbw_avg);
                    e.busbw_avg = e.busbw_avg.max(s.busbw_avg);
                    for (k, b) in s.buckets.iter().enumerate() {
                        e.buckets[k] += b;
                    }
                    continue;
                }
                let labels = format!(
                    "job_id=\"{job}\",comm=\"{}\",op=\"{}\"",
                    format_comm_id(**id),
                    Op::from_code(*op).name()
                );
                series(&mut calls, &mut bytes, &mut hist, &mut bw, &labels, s);
            }
        }
        for (op, s) in &other {
            let labels = format!(
                "job_id=\"{job}\",comm=\"other\",op=\"{}\"",
                Op::from_code(*op).name()
            );
            series(&mut calls, &mut bytes, &mut hist, &mut bw, &labels, s);
        }
    }
    o.push_str(&calls);
    family(
        &mut o,
        "commscope_collective_bytes_total",
        "counter",
        "Bytes moved by completed calls (per the op's rule in docs/trace-format.md).",
    );
    o.push_str(&bytes);
    family(
        &mut o,
        "commscope_collective_duration_seconds",
        "histogram",
        "Duration of completed calls: their GPU interval when they have one (NCCL), else the time inside the call (calls captured into or replayed by CUDA graphs are not timed).",
    );
    o.push_str(&hist);
    let [bus, alg, busbw] = bw;
    family(
        &mut o,
        "commscope_collective_bus_bytes_total",
        "counter",
        "Bytes times the op's nccl-tests bus-bandwidth factor; over the duration sum, the mean bus bandwidth.",
    );
    o.push_str(&bus);
    family(
        &mut o,
        "commscope_collective_algbw_bytes_per_second",
        "gauge",
        "Moving average of the calls' algorithm bandwidth (bytes over GPU time for NCCL, host time for MPI).",
    );
    o.push_str(&alg);
    family(
        &mut o,
        "commscope_collective_busbw_bytes_per_second",
        "gauge",
        "Moving average of the calls' bus bandwidth (nccl-tests factors; 0 on one rank).",
    );
    o.push_str(&busbw);

    // Per (job, sending node, receiving node): NCCL's step-timed proxy sends.
    let mut lbytes = String::new();
    let mut lnet = String::new();
    let mut lwait = String::new();
    for j in &jobs {
        if j.links.is_empty() {
            continue;
        }
        let node_of: std::collections::HashMap<i32, &str> = j
            .ranks
            .values()
            .map(|r| (r.rank, r.node.as_str()))
            .collect();
        let mut pairs: std::collections::BTreeMap<(String, String), crate::state::LinkTotals> =
            Default::default();
        for (&(comm, src, peer), t) in &j.links {
            let dst = j.detectors.links.global_rank(comm, peer);
            let name = |r: Option<i32>| {
                r.and_then(|r| node_of.get(&r).copied())
                    .filter(|n| !n.is_empty())
                    .unwrap_or("unknown")
                    .to_owned()
            };
            let e = pairs.entry((name(Some(src)), name(dst))).or_default();
            e.bytes += t.bytes;
            e.net_ns += t.net_ns;
            e.gpu_wait_ns += t.gpu_wait_ns;
            e.peer_wait_ns += t.peer_wait_ns;
        }
        let mut pairs: Vec<_> = pairs.into_iter().collect();
        pairs.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
        let mut rest = crate::state::LinkTotals::default();
        let job = esc(&j.job);
        let mut emit = |src: &str, dst: &str, t: &crate::state::LinkTotals| {
            let l = format!("job_id=\"{job}\",src=\"{}\",dst=\"{}\"", esc(src), esc(dst));
            let _ = writeln!(lbytes, "commscope_link_bytes_total{{{l}}} {}", t.bytes);
            let _ = writeln!(
                lnet,
                "commscope_link_network_seconds_total{{{l}}} {:.6}",
                t.net_ns as f64 / 1e9
            );
            let _ = writeln!(
                lwait,
                "commscope_link_gpu_wait_seconds_total{{{l}}} {:.6}",
                t.gpu_wait_ns as f64 / 1e9
            );
        };
        for (i, ((src, dst), t)) in pairs.iter().enumerate() {
            if i < MAX_LINK_SERIES {
                emit(src, dst, t);
            } else {
                rest.bytes += t.bytes;
                rest.net_ns += t.net_ns;
                rest.gpu_wait_ns += t.gpu_wait_ns;
            }
        }
        if pairs.len() > MAX_LINK_SERIES {
            emit("other", "other", &rest);
        }
    }
    family(
        &mut o,
        "commscope_link_bytes_total",
        "counter",
        "Bytes NCCL's proxy sent from one node to another (profiler plugin, proxy steps).",
    );
    o.push_str(&lbytes);
    family(
        &mut o,
        "commscope_link_network_seconds_total",
        "counter",
        "Channel-seconds those sends were on the network; bytes over it is the link's per-channel rate.",
    );
    o.push_str(&lnet);
    family(
        &mut o,
        "commscope_link_gpu_wait_seconds_total",
        "counter",
        "Channel-seconds those sends waited for the GPU to produce their data.",
    );
    o.push_str(&lwait);

    // Per (job, rank).
    let now = now_ns();
    let mut rcalls = String::new();
    let mut rinfl = String::new();
    let mut rage = String::new();
    let mut rseen = String::new();
    for j in &jobs {
        let job = esc(&j.job);
        for r in j.ranks.values().take(MAX_RANK_SERIES) {
            let l = format!(
                "job_id=\"{job}\",rank=\"{}\",node=\"{}\"",
                r.rank,
                esc(&r.node)
            );
            let _ = writeln!(rcalls, "commscope_rank_calls_total{{{l}}} {}", r.calls);
            let _ = writeln!(
                rinfl,
                "commscope_rank_in_flight{{{l}}} {}",
                r.live_in_flight().len()
            );
            let oldest = r
                .live_in_flight()
                .iter()
                .map(|c| c.for_s)
                .fold(0.0, f64::max);
            let _ = writeln!(
                rage,
                "commscope_rank_in_flight_age_seconds{{{l}}} {oldest:.6}"
            );
            let _ = writeln!(
                rseen,
                "commscope_rank_last_seen_age_seconds{{{l}}} {:.3}",
                now.saturating_sub(r.last_seen_ns) as f64 / 1e9
            );
        }
    }
    family(
        &mut o,
        "commscope_rank_calls_total",
        "counter",
        "Calls completed by the rank.",
    );
    o.push_str(&rcalls);
    family(
        &mut o,
        "commscope_rank_in_flight",
        "gauge",
        "Calls the rank has in flight (latest in-flight snapshot).",
    );
    o.push_str(&rinfl);
    family(
        &mut o,
        "commscope_rank_in_flight_age_seconds",
        "gauge",
        "Age of the rank's oldest call in flight (0 when none).",
    );
    o.push_str(&rage);
    family(
        &mut o,
        "commscope_rank_last_seen_age_seconds",
        "gauge",
        "Seconds since the collector last heard of the rank.",
    );
    o.push_str(&rseen);
    o
}

fn series(
    calls: &mut String,
    bytes: &mut String,
    hist: &mut String,
    bw: &mut [String; 3],
    labels: &str,
    s: &OpStats,
) {
    let _ = writeln!(
        bw[0],
        "commscope_collective_bus_bytes_total{{{labels}}} {:.0}",
        s.bus_bytes
    );
    if s.algbw_avg > 0.0 {
        let _ = writeln!(
            bw[1],
            "commscope_collective_algbw_bytes_per_second{{{labels}}} {:.0}",
            s.algbw_avg
        );
        let _ = writeln!(
            bw[2],
            "commscope_collective_busbw_bytes_per_second{{{labels}}} {:.0}",
            s.busbw_avg
        );
    }
    let _ = writeln!(
        calls,
        "commscope_collective_calls_total{{{labels}}} {}",
        s.calls
    );
    let _ = writeln!(
        bytes,
        "commscope_collective_bytes_total{{{labels}}} {}",
        s.bytes
    );
    for (i, b) in BUCKETS.iter().enumerate() {
        let _ = writeln!(
            hist,
            "commscope_collective_duration_seconds_bucket{{{labels},le=\"{b}\"}} {}",
            s.buckets[i]
        );
    }
    let _ = writeln!(
        hist,
        "commscope_collective_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
        s.timed
    );
    let _ = writeln!(
        hist,
        "commscope_collective_duration_seconds_sum{{{labels}}} {:.9}",
        s.duration_sum_s
    );
    let _ = writeln!(
        hist,
        "commscope_collective_duration_seconds_count{{{labels}}} {}",
        s.timed
    );
}
