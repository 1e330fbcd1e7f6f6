//! `ncclras -f json` reports (`reference/nccl.md` §5.4): every communicator's ranks, where each
//! process is, how many collectives of each kind it has launched, and the ranks RAS could not
//! reach.
//!
//! - Each rank of a communicator is a process (host, pid) with a `comm` record, and what it had
//!   launched is a `skip` record that counts no call: progress without timing.
//! - A rank RAS considers dead is a process that ended, seen by RAS at the report's time.
//! - Every reachable process is heard from at the report's time (its `collection_time_sec`
//!   before the timestamp).

use std::collections::BTreeMap;

use commscope_wire::cst::Header;
use commscope_wire::hash::parse_comm_id;
use commscope_wire::op::flags;
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{
    Comm, CommEvent, EXIT_STATUS_UNKNOWN, Heartbeat, Process, ProcessEvent, Record, Skip,
};
use serde_json::Value;

/// Whether a JSON text is a RAS report.
pub fn sniff(head: &str) -> bool {
    head.starts_with('{') && head.contains("\"communicators\"") && head.contains("\"nccl_version\"")
}

#[derive(Default)]
struct Proc {
    host: String,
    pid: u32,
    rank: i32,
    world: i32,
    records: Vec<Record>,
    dead: bool,
}

/// When the report was taken (ns since the epoch): its `timestamp`, an RFC 3339-like text or
/// seconds since the epoch.
fn report_time(v: &Value) -> u64 {
    crate::time_ns(match v.get("timestamp") {
        Some(Value::Number(n)) => (n.as_f64().unwrap_or(0.0) * 1e9) as u64,
        Some(Value::String(s)) => s
            .trim()
            .parse::<f64>()
            .map(|x| (x * 1e9) as u64)
            .unwrap_or(0),
        _ => 0,
    })
}

/// Adds a rank of a communicator to its process; returns the process's key and the rank.
fn add_rank(
    procs: &mut BTreeMap<(String, u32), Proc>,
    r: &Value,
    dead: bool,
    id: u64,
    size: i32,
    now: u64,
) -> Option<(String, u32, i32)> {
    let rank = r.get("rank").and_then(Value::as_i64)? as i32;
    let host = r
        .get("host")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let pid = r.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32;
    let p = procs.entry((host.clone(), pid)).or_insert_with(|| Proc {
        host: host.clone(),
        pid,
        rank,
        ..Default::default()
    });
    // The process's rank is its rank in its largest communicator.
    if size > p.world {
        p.world = size;
        p.rank = rank;
    }
    p.dead |= dead;
    p.records.push(Record::Comm(Comm::new(
        CommEvent::Created,
        id,
        0,
        now,
        rank,
        rank,
        size,
        0,
    )));
    Some((host, pid, rank))
}

/// Reads one report.
pub fn read(bytes: &[u8], job: &str) -> Result<Vec<ProcessTrace>, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("malformed JSON ({e})"))?;
    let comms = v
        .get("communicators")
        .and_then(Value::as_array)
        .ok_or("a RAS report without a communicators list")?;
    let now = report_time(&v);
    let mut procs: BTreeMap<(String, u32), Proc> = BTreeMap::new();
    for c in comms {
        let id = c
            .get("hash")
            .and_then(Value::as_str)
            .and_then(parse_comm_id)
            .unwrap_or(0);
        let size = c.get("size").and_then(Value::as_i64).unwrap_or(0) as i32;
        for r in c
            .get("ranks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some((host, pid, rank)) = add_rank(&mut procs, r, false, id, size, now) else {
                continue;
            };
            let launched: u64 = r
                .get("collective_counts")
                .and_then(Value::as_object)
                .map_or(0, |m| {
                    m.values()
                        .filter_map(Value::as_u64)
                        .fold(0u64, u64::saturating_add)
                });
            if launched > 0 {
                let p = procs.get_mut(&(host, pid)).expect("just added");
                p.records.push(Record::Skip(Skip {
                    comm_id: id,
                    last_seq: launched - 1,
                    t_first: now,
                    t_last: now,
                    rank,
                    comm_rank: rank,
                    comm_size: size,
                    ..Default::default()
                }));
            }
        }
        for r in c
            .get("missing_ranks")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let dead = r
                .get("status")
                .and_then(|s| s.get("considered_dead"))
                .and_then(Value::as_bool)
                .unwrap_or(false);
            add_rank(&mut procs, r, dead, id, size, now);
        }
    }
    Ok(procs
        .into_values()
        .map(|mut p| {
            p.records.push(if p.dead {
                Record::Process(Process {
                    rec_seq: 0,
                    event: ProcessEvent::Exit,
                    flags: flags::OBSERVED,
                    t_mono: now,
                    t_real: now,
                    pid: p.pid,
                    exit_status: EXIT_STATUS_UNKNOWN,
                    start_time: 0,
                    rank: p.rank,
                    world_size: p.world,
                    signal: 0,
                    step: 0,
                })
            } else {
                Record::Heartbeat(Heartbeat {
                    t_mono: now,
                    t_real: now,
                    rank: p.rank,
                    ..Default::default()
                })
            });
            crate::imported(
                Header {
                    job: job.to_owned(),
                    node: p.host,
                    pid: p.pid,
                    rank: p.rank,
                    world_size: p.world,
                    library: format!(
                        "NCCL {} (RAS report)",
                        v.get("nccl_version").and_then(Value::as_str).unwrap_or("?")
                    ),
                    flavour: "nccl".into(),
                    ..Default::default()
                },
                p.records,
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_reads_and_absurd_times_are_held_in_range() {
        // Found by the fuzzer: a timestamp of 120 digits overflowed the analyzer's time sums.
        let text = br#"{"nccl_version":"2.28.7","timestamp":"17480303766666666666666666666666666666666666666666666666666666666666666666666666666666666666666666666666667.5",
            "communicators":[{"hash":"0x1234","size":2,"ranks":[{"rank":0,"host":"a","pid":10,"collective_counts":{"AllReduce":640,"Broadcast":2}}],
            "missing_ranks":[{"rank":1,"host":"b","pid":11,"status":{"unresponsive":true,"considered_dead":true}}]}]}"#;
        let procs = read(text, "j").expect("a report");
        assert_eq!(procs.len(), 2);
        let a = procs.iter().find(|p| p.header.node == "a").expect("host a");
        assert!(
            a.records
                .iter()
                .any(|r| matches!(r, Record::Skip(k) if k.last_seq == 641 && k.progress_only()))
        );
        let b = procs.iter().find(|p| p.header.node == "b").expect("host b");
        assert!(b.records.iter().any(|r| matches!(r, Record::Process(x) if x.event == ProcessEvent::Exit && x.t_real == crate::MAX_TIME_NS)));
    }
}
