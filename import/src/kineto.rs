//! Kineto / PyTorch profiler Chrome traces (`reference/traces.md` §2), one rank per file,
//! gzipped or not, read into commscope records.
//!
//! - Each NCCL kernel (`ncclKernel_*`, `ncclDevKernel_*`) is one completed call: its GPU interval
//!   from the kernel, its host interval from the `record_param_comms` op that launched it
//!   (joined by `External id`), and the collective's name, sizes, dtype and process group from
//!   whichever of the two carries them. Older traces carry no metadata: the op then comes from
//!   the kernel's name.
//! - A `record_param_comms` op with collective metadata and no kernel (a CPU backend such as
//!   gloo) is a call with its host interval only; `wait` ops are not calls.
//! - The process group is the communicator, with the same id as in a Flight Recorder dump of the
//!   same job (`Process Group Name` and ranks). Without one, the default group of the job's
//!   world. A call's `seq` is the group's `Seq` when the trace has it, else its order on the
//!   group in this file (what tools align old traces by).
//! - The profiler covers a window, not the process's life: the last event is a clean end, so
//!   a window that stops early is not taken for a death.
//!
//! The file is walked value by value, so a truncated trace keeps every event before the cut.

use std::collections::{BTreeMap, HashMap};

use commscope_wire::cst::Header;
use commscope_wire::op::{Op, flags, lib};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{Call, Heartbeat, Record};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::flight_recorder::{Group, dtype_of};

/// Whether a JSON text's head is a Chrome trace with profiler events.
pub fn sniff(head: &str) -> bool {
    head.starts_with('{')
        && (head.contains("\"traceEvents\"")
            || head.contains("\"schemaVersion\"") && head.contains("\"deviceProperties\""))
}

/// One trace event (only the fields the importer reads).
#[derive(Debug, Default, Deserialize)]
struct Event {
    #[serde(default)]
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    pid: Value,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<Map<String, Value>>,
}

/// What was read of the file.
#[derive(Debug, Default)]
struct Raw {
    distributed: Option<Value>,
    base_ns: Option<f64>,
    events: Vec<Event>,
    damage: Option<String>,
}

/// Walks the top-level object key by key and the events one by one: a cut anywhere keeps
/// what came before it.
fn walk(bytes: &[u8]) -> Result<Raw, String> {
    let mut raw = Raw::default();
    let mut pos = skip_ws(bytes, 0);
    if bytes.get(pos) != Some(&b'{') {
        return Err("not a JSON object".into());
    }
    pos += 1;
    loop {
        pos = skip_ws(bytes, pos);
        match bytes.get(pos) {
            Some(b'}') => return Ok(raw),
            Some(b',') => {
                pos += 1;
                continue;
            }
            None => {
                raw.damage = Some("the file ends early; kept the events before the cut".into());
                return Ok(raw);
            }
            _ => {}
        }
        let (key, next) = match one::<String>(bytes, pos) {
            Ok(x) => x,
            Err(e) => return damaged(raw, e, pos),
        };
        pos = skip_ws(bytes, next);
        if bytes.get(pos) != Some(&b':') {
            return damaged(raw, "a key without a value".into(), pos);
        }
        pos = skip_ws(bytes, pos + 1);
        if key == "traceEvents" {
            if bytes.get(pos) != Some(&b'[') {
                return damaged(raw, "traceEvents is not a list".into(), pos);
            }
            pos += 1;
            loop {
                pos = skip_ws(bytes, pos);
                match bytes.get(pos) {
                    Some(b']') => {
                        pos += 1;
                        break;
                    }
                    Some(b',') => {
                        pos += 1;
                        continue;
                    }
                    None => {
                        raw.damage =
                            Some("the file ends early; kept the events before the cut".into());
                        return Ok(raw);
                    }
                    _ => {}
                }
                match one::<Event>(bytes, pos) {
                    Ok((e, next)) => {
                        raw.events.push(e);
                        pos = next;
                    }
                    Err(e) => return damaged(raw, e, pos),
                }
            }
        } else {
            match one::<Value>(bytes, pos) {
                Ok((v, next)) => {
                    match key.as_str() {
                        "distributedInfo" => raw.distributed = Some(v),
                        "baseTimeNanoseconds" => raw.base_ns = v.as_f64(),
                        _ => {}
                    }
                    pos = next;
                }
                Err(e) => return damaged(raw, e, pos),
            }
        }
    }
}

fn damaged(mut raw: Raw, why: String, at: usize) -> Result<Raw, String> {
    if raw.events.is_empty() && raw.distributed.is_none() {
        return Err(format!("{why} at byte {at}"));
    }
    raw.damage = Some(format!(
        "{why} at byte {at}; kept the {} events before it",
        raw.events.len()
    ));
    Ok(raw)
}

fn skip_ws(b: &[u8], mut pos: usize) -> usize {
    while b.get(pos).is_some_and(u8::is_ascii_whitespace) {
        pos += 1;
    }
    pos
}

/// One JSON value at `pos`, and where it ends.
fn one<T: for<'de> Deserialize<'de>>(bytes: &[u8], pos: usize) -> Result<(T, usize), String> {
    let mut it = serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<T>();
    match it.next() {
        Some(Ok(v)) => Ok((v, pos + it.byte_offset())),
        Some(Err(e)) if e.is_eof() => Err("the file ends early".into()),
        Some(Err(e)) => Err(format!("malformed JSON ({e})")),
        None => Err("the file ends early".into()),
    }
}

/// Collective metadata, from a kernel's or a `record_param_comms` op's arguments.
#[derive(Clone, Debug, Default)]
struct Meta {
    name: Option<String>,
    in_nelems: Option<u64>,
    out_nelems: Option<u64>,
    dtype: Option<String>,
    pg_name: Option<String>,
    pg_desc: Option<String>,
    pg_ranks: Option<Vec<i32>>,
    group_size: Option<i32>,
    seq: Option<u64>,
    peer: Option<i32>,
}

fn meta(args: &Map<String, Value>) -> Meta {
    let s = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_owned);
    let n = |k: &str| args.get(k).and_then(Value::as_u64);
    Meta {
        name: s("Collective name"),
        in_nelems: n("In msg nelems"),
        out_nelems: n("Out msg nelems"),
        dtype: s("dtype"),
        pg_name: s("Process Group Name").or_else(|| {
            args.get("Process Group ID")
                .and_then(Value::as_i64)
                .map(|i| i.to_string())
        }),
        pg_desc: s("Process Group Description"),
        pg_ranks: match args.get("Process Group Ranks") {
            Some(Value::String(t)) => rank_list(t),
            Some(Value::Array(a)) => a.iter().map(|r| r.as_i64().map(|r| r as i32)).collect(),
            _ => None,
        },
        group_size: n("Group size").map(|g| g as i32),
        seq: n("Seq"),
        peer: args
            .get("Dst Rank")
            .or_else(|| args.get("Src Rank"))
            .and_then(Value::as_i64)
            .map(|r| r as i32),
    }
}

impl Meta {
    /// Fills what `self` lacks from `other`.
    fn or(mut self, other: &Meta) -> Meta {
        macro_rules! fill {
            ($($f:ident),*) => { $( if self.$f.is_none() { self.$f = other.$f.clone(); } )* };
        }
        fill!(
            name, in_nelems, out_nelems, dtype, pg_name, pg_desc, pg_ranks, group_size, seq, peer
        );
        self
    }
}

/// `"[0, 1]"` → ranks; a list cut short with `...` is not a complete member list.
fn rank_list(t: &str) -> Option<Vec<i32>> {
    let inner = t.trim().strip_prefix('[')?.strip_suffix(']')?;
    if inner.contains("...") {
        return None;
    }
    if inner.trim().is_empty() {
        return Some(vec![]);
    }
    inner.split(',').map(|x| x.trim().parse().ok()).collect()
}

/// A collective's name (`allreduce`, `_allgather_base`, …) → op.
fn op_of_name(name: &str) -> Option<Op> {
    let n = name.trim_start_matches('_').to_ascii_lowercase();
    Some(match n.as_str() {
        "allreduce" | "all_reduce" | "allreduce_coalesced" => Op::Allreduce,
        "broadcast" => Op::Broadcast,
        "reduce" => Op::Reduce,
        "allgather"
        | "allgather_base"
        | "all_gather"
        | "allgather_into_tensor_coalesced"
        | "allgather_coalesced" => Op::Allgather,
        "reduce_scatter"
        | "reduce_scatter_base"
        | "reducescatter"
        | "reduce_scatter_tensor_coalesced" => Op::Reducescatter,
        // Per-rank sizes differ (splits): the v form.
        "all_to_all" | "alltoall" | "alltoall_base" | "all_to_allv" | "alltoallv" => Op::Alltoallv,
        "gather" => Op::Gather,
        "scatter" => Op::Scatter,
        "barrier" => Op::Barrier,
        "send" => Op::Send,
        "recv" | "recvanysource" => Op::Recv,
        _ => return None,
    })
}

/// An NCCL kernel's name → op (`ncclKernel_AllReduce_RING_LL_Sum_float(...)`).
fn op_of_kernel(name: &str) -> Option<Op> {
    let rest = name
        .strip_prefix("ncclKernel_")
        .or_else(|| name.strip_prefix("ncclDevKernel_"))?;
    let kind = rest.split(['_', '(']).next().unwrap_or("");
    Some(match kind {
        "AllReduce" => Op::Allreduce,
        "Broadcast" => Op::Broadcast,
        "Reduce" => Op::Reduce,
        "AllGather" => Op::Allgather,
        "ReduceScatter" => Op::Reducescatter,
        "SendRecv" => Op::Sendrecv,
        "Send" => Op::Send,
        "Recv" => Op::Recv,
        _ => return None,
    })
}

fn external_id(args: Option<&Map<String, Value>>) -> Option<i64> {
    args?.get("External id").and_then(Value::as_i64)
}

/// Reads one rank's trace; `job` names the job (its directory). Returns the process and the
/// damage it had.
pub fn read(bytes: &[u8], job: &str) -> Result<(ProcessTrace, Vec<String>), String> {
    let raw = walk(bytes)?;
    let mut warnings: Vec<String> = raw.damage.clone().into_iter().collect();
    let dist = raw.distributed.clone().unwrap_or(Value::Null);
    let rank = dist.get("rank").and_then(Value::as_i64);
    if rank.is_none() {
        warnings.push("the trace has no distributedInfo.rank; read as rank 0".into());
    }
    let rank = rank.unwrap_or(0) as i32;
    let world = dist
        .get("world_size")
        .and_then(Value::as_i64)
        .unwrap_or(1)
        .max(i64::from(rank) + 1) as i32;
    let base = raw.base_ns.unwrap_or(0.0);
    let at = |us: f64| crate::time_ns((base + us * 1000.0).max(0.0) as u64);
    // Process groups the trace lists, by name.
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for g in dist
        .get("pg_config")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = match g.get("pg_name") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => continue,
        };
        let mut ranks: Vec<i32> = g
            .get("ranks")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_i64)
                    .map(|r| r as i32)
                    .collect()
            })
            .unwrap_or_default();
        ranks.sort_unstable();
        ranks.dedup();
        let desc = g
            .get("pg_desc")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        groups.insert(name.clone(), Group { name, desc, ranks });
    }
    let default_group = || Group {
        name: "0".into(),
        desc: "default_pg".into(),
        ranks: (0..world).collect(),
    };
    // record_param_comms ops by External id.
    let mut cpu: HashMap<i64, (&Event, Meta)> = HashMap::new();
    let mut cpu_order: Vec<i64> = Vec::new();
    for e in &raw.events {
        if e.ph == "X" && e.name == "record_param_comms" {
            let m = e.args.as_ref().map(meta).unwrap_or_default();
            let id = external_id(e.args.as_ref()).unwrap_or(-(cpu_order.len() as i64) - 1);
            cpu.insert(id, (e, m));
            cpu_order.push(id);
        }
    }
    // (group, op, host interval, gpu interval, meta)
    struct Found {
        group: Group,
        op: Op,
        host: Option<(u64, u64)>,
        gpu: Option<(u64, u64)>,
        meta: Meta,
        pid: Option<u32>,
    }
    let mut found: Vec<Found> = Vec::new();
    let mut used_cpu: std::collections::HashSet<i64> = std::collections::HashSet::new();
    let mut group_of = |m: &Meta| -> Group {
        match &m.pg_name {
            Some(name) => {
                let g = groups.entry(name.clone()).or_insert_with(|| Group {
                    name: name.clone(),
                    desc: m.pg_desc.clone().unwrap_or_default(),
                    ranks: m.pg_ranks.clone().unwrap_or_default(),
                });
                if g.ranks.is_empty() {
                    if let Some(r) = &m.pg_ranks {
                        g.ranks = r.clone();
                        g.ranks.sort_unstable();
                    } else if name == "0" {
                        g.ranks = (0..world).collect();
                    }
                }
                g.clone()
            }
            None => groups.get("0").cloned().unwrap_or_else(default_group),
        }
    };
    let pid_of = |v: &Value| v.as_u64().map(|p| p as u32);
    for e in &raw.events {
        if e.ph != "X" || e.cat != "kernel" {
            continue;
        }
        let Some(kernel_op) = op_of_kernel(&e.name) else {
            continue;
        };
        let (Some(ts), Some(dur)) = (e.ts, e.dur) else {
            continue;
        };
        let km = e.args.as_ref().map(meta).unwrap_or_default();
        let launched = external_id(e.args.as_ref()).and_then(|id| cpu.get(&id).map(|c| (id, c)));
        let m = match launched {
            Some((id, (_, cm))) => {
                used_cpu.insert(id);
                km.or(cm)
            }
            None => km,
        };
        let op = m.name.as_deref().and_then(op_of_name).unwrap_or(kernel_op);
        found.push(Found {
            group: group_of(&m),
            op,
            host: launched
                .and_then(|(_, (c, _))| Some((at(c.ts?), at(c.ts? + c.dur.unwrap_or(0.0))))),
            gpu: Some((at(ts), at(ts + dur))),
            meta: m,
            pid: launched.and_then(|(_, (c, _))| pid_of(&c.pid)),
        });
    }
    for id in &cpu_order {
        if used_cpu.contains(id) {
            continue;
        }
        let (c, m) = &cpu[id];
        let Some(op) = m.name.as_deref().and_then(op_of_name) else {
            continue;
        };
        let Some(ts) = c.ts else { continue };
        found.push(Found {
            group: group_of(m),
            op,
            host: Some((at(ts), at(ts + c.dur.unwrap_or(0.0)))),
            gpu: None,
            meta: m.clone(),
            pid: pid_of(&c.pid),
        });
    }
    found.sort_by_key(|f| f.gpu.or(f.host).map_or(0, |s| s.0));
    let mut records = Vec::new();
    let t0 = found
        .iter()
        .filter_map(|f| f.host.or(f.gpu).map(|s| s.0))
        .min()
        .unwrap_or(0);
    let mut all_groups: BTreeMap<String, Group> = groups.clone();
    for f in &found {
        all_groups
            .entry(f.group.name.clone())
            .or_insert_with(|| f.group.clone());
    }
    for g in all_groups.values() {
        records.push(g.created(rank, t0));
    }
    let mut order: BTreeMap<(u64, bool), u64> = BTreeMap::new();
    let mut last = t0;
    let mut pid = None;
    for f in &found {
        let (dt, size) = dtype_of(f.meta.dtype.as_deref().unwrap_or(""));
        let nelems = f.meta.in_nelems.or(f.meta.out_nelems).unwrap_or(0);
        let comm_id = f.group.comm_id();
        let p2p = f.op.is_p2p();
        let counter = order.entry((comm_id, p2p)).or_insert(0);
        let seq = f.meta.seq.unwrap_or(*counter);
        *counter += 1;
        let (t_enter, t_exit) = f.host.or(f.gpu).unwrap_or((0, 0));
        let (gpu_start, gpu_end) = f.gpu.unwrap_or((0, 0));
        last = last.max(t_exit).max(gpu_end);
        pid = pid.or(f.pid);
        let comm_rank = f.group.comm_rank(rank);
        let peer = f.meta.peer.map_or(-1, |g| f.group.comm_rank(g));
        records.push(Record::Call(Call {
            op: f.op as u8,
            flags: 0,
            comm_id,
            seq,
            op_seq: seq,
            bytes: nelems.saturating_mul(size),
            count: nelems,
            peer,
            tag: -1,
            t_enter,
            t_exit,
            gpu_start,
            gpu_end,
            rank,
            comm_rank,
            comm_size: f.meta.group_size.unwrap_or(f.group.ranks.len() as i32),
            dtype: dt,
            lib: if f.gpu.is_some() { lib::NCCL } else { lib::MPI },
            peer2: -1,
            tag2: -1,
            ..Default::default()
        }));
    }
    let end = raw
        .events
        .iter()
        .filter_map(|e| Some(at(e.ts? + e.dur.unwrap_or(0.0))))
        .max()
        .unwrap_or(last)
        .max(last);
    records.push(Record::Heartbeat(Heartbeat {
        flags: flags::FINAL,
        t_mono: end,
        t_real: end,
        rank,
        ..Default::default()
    }));
    let backend = dist
        .get("backend")
        .and_then(Value::as_str)
        .unwrap_or("nccl");
    let version = dist
        .get("nccl_version")
        .and_then(Value::as_str)
        .unwrap_or("");
    Ok((
        crate::imported(
            Header {
                job: job.to_owned(),
                pid: pid.unwrap_or(0),
                rank,
                world_size: world,
                library: format!(
                    "{backend}{}{version} (Kineto trace)",
                    if version.is_empty() { "" } else { " " }
                ),
                flavour: if backend == "nccl" { "nccl" } else { backend }.to_owned(),
                ..Default::default()
            },
            records,
        ),
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_and_collective_names() {
        assert_eq!(
            op_of_kernel(
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
            ),
            Some(Op::Allreduce)
        );
        assert_eq!(
            op_of_kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"),
            Some(Op::Sendrecv)
        );
        assert_eq!(op_of_kernel("volta_sgemm_128x64_nn"), None);
        assert_eq!(op_of_name("_allgather_base"), Some(Op::Allgather));
        assert_eq!(op_of_name("wait"), None);
        assert_eq!(rank_list("[0, 1]"), Some(vec![0, 1]));
        assert_eq!(rank_list("[0, 1, ...]"), None);
    }

    #[test]
    fn a_cut_trace_keeps_the_events_before_the_cut() {
        let text = br#"{"distributedInfo":{"rank":1,"world_size":2},"traceEvents":[
            {"ph":"X","cat":"cpu_op","name":"record_param_comms","ts":10,"dur":5,"args":{"Collective name":"allreduce","In msg nelems":4,"dtype":"Float"}},
            {"ph":"X","cat":"cpu_op","name":"record_param_comms","ts":30,"dur":5,"args":{"Collective name":"allreduce","In msg nelems":4,"dtype":"Float"}},
            {"ph":"X","cat":"cpu_op","name":"record_param"#;
        let (p, w) = read(text, "j").expect("salvaged");
        let calls = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(_)))
            .count();
        assert_eq!(calls, 2);
        assert_eq!(p.header.rank, 1);
        assert!(w.iter().any(|w| w.contains("kept the 2 events")), "{w:?}");
        assert!(read(b"{\"traceEv", "j").is_err());
        assert!(read(b"[1,2]", "j").is_err());
    }
}
