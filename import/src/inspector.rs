//! NCCL Inspector output (`reference/nccl.md` §4): newline-delimited JSON, one file per process,
//! one record per operation. Both layouts are read: v4.0, where every record carries its
//! `header` and `metadata`, and v4.3, where they come once per communicator dump and the
//! records after them belong to it (`coll_perf`, `p2p_perf`, `dump_stats`, `proxy_trace`).
//!
//! - The communicator is NCCL's `commHash` (`header.id`), named by `comm_name`.
//! - The process's rank is its rank in its largest communicator (the world, in a usual job).
//! - A record has an execution time and no start: it ends at its verbose trace's stop time
//!   when there is one, else at the dump time, and starts `exec_time_us` before that.
//! - `coll_sn` counts calls of one collective function (from 0); a communicator's `seq` counts
//!   every collective on it, so it is the sum of the functions' counts at that point of the file.
//! - Dropped records (`dump_stats`) are reported.

use std::collections::BTreeMap;

use commscope_wire::cst::Header;
use commscope_wire::hash::parse_comm_id;
use commscope_wire::op::{Op, flags, lib};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{Call, Comm, CommEvent, Heartbeat, Record};
use serde_json::Value;

/// Whether a text's first line is an Inspector record.
pub fn sniff(head: &str) -> bool {
    let first = head.lines().next().unwrap_or("");
    first.starts_with('{')
        && (first.contains("\"coll_perf\"")
            || first.contains("\"p2p_perf\"")
            || first.contains("\"inspector_output_format_version\"")
            || first.contains("\"dump_stats\""))
}

/// NCCL's function names → ops.
fn op_of(name: &str) -> Option<Op> {
    Some(match name {
        "AllReduce" => Op::Allreduce,
        "Broadcast" => Op::Broadcast,
        "Reduce" => Op::Reduce,
        "AllGather" | "AllGatherV" => Op::Allgather,
        "ReduceScatter" => Op::Reducescatter,
        "AlltoAll" | "AllToAll" => Op::Alltoall,
        "Send" => Op::Send,
        "Recv" => Op::Recv,
        _ => return None,
    })
}

/// One communicator as a header describes it.
#[derive(Clone, Debug, Default)]
struct CommInfo {
    id: u64,
    name: String,
    rank: i32,
    n_ranks: i32,
}

/// Per process (host, pid): what its records say.
#[derive(Default)]
struct Proc {
    host: String,
    pid: u32,
    comms: BTreeMap<u64, CommInfo>,
    /// (comm, op, sn, exec µs, end µs, bytes, peer)
    ops: Vec<(u64, Op, u64, f64, u64, u64, i32)>,
    last_dump_us: u64,
}

/// Reads one Inspector file (several processes' records may share one). Returns their traces
/// and the damage found, one sentence per kind.
pub fn read(bytes: &[u8], job: &str) -> (Vec<ProcessTrace>, Vec<String>) {
    let text = String::from_utf8_lossy(bytes);
    let mut procs: BTreeMap<(String, u32), Proc> = BTreeMap::new();
    let mut header: Option<(CommInfo, String, u32, u64)> = None;
    let mut bad_lines = Vec::new();
    let mut unknown_ops = 0usize;
    let mut dropped = 0u64;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => {
                bad_lines.push(i + 1);
                continue;
            }
        };
        if let Some(h) = v.get("header") {
            let m = v.get("metadata").cloned().unwrap_or(Value::Null);
            let id = h
                .get("id")
                .and_then(Value::as_str)
                .and_then(parse_comm_id)
                .unwrap_or(0);
            header = Some((
                CommInfo {
                    id,
                    name: h
                        .get("comm_name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    rank: h.get("rank").and_then(Value::as_i64).unwrap_or(-1) as i32,
                    n_ranks: h.get("n_ranks").and_then(Value::as_i64).unwrap_or(0) as i32,
                },
                m.get("hostname")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                m.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32,
                m.get("dump_timestamp_us")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
            ));
        }
        let Some((comm, host, pid, dump_us)) = header.clone() else {
            bad_lines.push(i + 1);
            continue;
        };
        let p = procs.entry((host.clone(), pid)).or_insert_with(|| Proc {
            host,
            pid,
            ..Default::default()
        });
        p.last_dump_us = p.last_dump_us.max(dump_us.min(crate::MAX_TIME_NS / 1000));
        p.comms.entry(comm.id).or_insert_with(|| comm.clone());
        if let Some(s) = v.get("dump_stats") {
            for k in [
                "coll_dropped_since_last_dump",
                "p2p_dropped_since_last_dump",
            ] {
                dropped += s.get(k).and_then(Value::as_u64).unwrap_or(0);
            }
        }
        let (perf, prefix) = match (v.get("coll_perf"), v.get("p2p_perf")) {
            (Some(c), _) => (c, "coll"),
            (None, Some(p)) => (p, "p2p"),
            _ => continue,
        };
        let f = |k: &str| perf.get(format!("{prefix}_{k}").as_str());
        let name = perf.get(prefix).and_then(Value::as_str).unwrap_or_default();
        let Some(op) = op_of(name) else {
            unknown_ops += 1;
            continue;
        };
        let sn = f("sn").and_then(Value::as_u64).unwrap_or(0);
        let exec = f("exec_time_us").and_then(Value::as_f64).unwrap_or(0.0);
        let bytes = f("msg_size_bytes").and_then(Value::as_u64).unwrap_or(0);
        let peer = f("peer").and_then(Value::as_i64).unwrap_or(-1) as i32;
        // Verbose records carry the stop time of the operation.
        let end = v
            .get("event_trace_ts")
            .and_then(|t| {
                t.get("coll_stop_ts")
                    .or_else(|| t.get("p2p_stop_ts"))
                    .or_else(|| t.get("stop_ts"))
            })
            .and_then(Value::as_f64)
            .map_or(dump_us, |t| t as u64);
        let end = end.min(crate::MAX_TIME_NS / 1000);
        let exec = if exec.is_finite() {
            exec.clamp(0.0, 1e12)
        } else {
            0.0
        };
        p.ops.push((comm.id, op, sn, exec, end, bytes, peer));
    }
    let mut warnings = Vec::new();
    if !bad_lines.is_empty() {
        warnings.push(format!(
            "{} lines are not Inspector records (line {}{}); skipped",
            bad_lines.len(),
            bad_lines[0],
            if bad_lines.len() > 1 {
                " and others"
            } else {
                ""
            }
        ));
    }
    if unknown_ops > 0 {
        warnings.push(format!(
            "{unknown_ops} records of operations commscope does not know; skipped"
        ));
    }
    if dropped > 0 {
        warnings.push(format!(
            "the Inspector dropped {dropped} records before writing them (its ring was full)"
        ));
    }
    let traces = procs.into_values().map(|p| trace(job, p)).collect();
    (traces, warnings)
}

fn trace(job: &str, p: Proc) -> ProcessTrace {
    let main = p
        .comms
        .values()
        .max_by_key(|c| (c.n_ranks, std::cmp::Reverse(c.id)))
        .cloned()
        .unwrap_or_default();
    let rank = main.rank.max(0);
    let mut records = Vec::new();
    let t0 = p
        .ops
        .iter()
        .map(|o| o.4.saturating_sub(o.3 as u64))
        .min()
        .unwrap_or(p.last_dump_us)
        .saturating_mul(1000);
    for c in p.comms.values() {
        let mut r = Comm::new(CommEvent::Created, c.id, 0, t0, rank, c.rank, c.n_ranks, 0);
        if c.name != "unknown" {
            r.set_name(c.name.as_bytes());
        }
        records.push(Record::Comm(r));
    }
    // Per communicator, the latest count of each function seen so far in the file.
    let mut counts: BTreeMap<u64, BTreeMap<u8, u64>> = BTreeMap::new();
    let mut last = t0;
    for (comm, op, sn, exec, end_us, bytes, peer) in &p.ops {
        let c = &p.comms[comm];
        let end = end_us.saturating_mul(1000);
        let start = end.saturating_sub((exec * 1000.0) as u64);
        last = last.max(end);
        let seq = if op.is_p2p() {
            *sn
        } else {
            let m = counts.entry(*comm).or_default();
            m.insert(*op as u8, *sn);
            m.values()
                .fold(0u64, |a, n| a.saturating_add(n.saturating_add(1)))
                .saturating_sub(1)
        };
        records.push(Record::Call(Call {
            op: *op as u8,
            comm_id: *comm,
            seq,
            op_seq: *sn,
            bytes: *bytes,
            peer: *peer,
            tag: -1,
            t_enter: start,
            t_exit: end,
            gpu_start: start,
            gpu_end: end,
            rank,
            comm_rank: c.rank,
            comm_size: c.n_ranks,
            lib: lib::NCCL,
            peer2: -1,
            tag2: -1,
            ..Default::default()
        }));
    }
    let end = last.max(p.last_dump_us.saturating_mul(1000));
    records.push(Record::Heartbeat(Heartbeat {
        flags: flags::FINAL,
        t_mono: end,
        t_real: end,
        rank,
        ..Default::default()
    }));
    crate::imported(
        Header {
            job: job.to_owned(),
            node: p.host,
            pid: p.pid,
            rank,
            world_size: main.n_ranks.max(rank.saturating_add(1)),
            library: "NCCL (Inspector)".into(),
            flavour: "nccl".into(),
            ..Default::default()
        },
        records,
    )
}
