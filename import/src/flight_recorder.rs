//! PyTorch Flight Recorder dumps (`reference/traces.md` §1): one pickled dict per rank, format
//! versions 2.x up to 2.10, read into commscope records.
//!
//! - Each process group becomes a communicator: its id hashes the group's name and sorted
//!   ranks (names repeat across splits, so the pair is the key), its name is the group's
//!   description (`TENSOR_MODEL_PARALLEL_GROUP`), and each rank gets a `comm` record for every
//!   group in its `pg_config`.
//! - An entry not completed (`scheduled`, `started`) is an `enter` record: enqueued on the GPU
//!   stream and never seen done. A completed one is a `call` record (enqueue to completion, and
//!   its GPU interval when timing was on).
//! - What a rank had completed before its ring's window is a `skip` record that counts no call,
//!   from `pg_status` (`last_completed_collective`, by the group's numeric id) and from the
//!   first entry still pending: collectives complete in order on a group.
//! - A dump carries no time of its own. The watchdog writes it once a collective exceeds its
//!   timeout, so every rank is heard from at the dump time: the earliest pending entry of the
//!   job plus its `timeout_ms` (or the last entry, when nothing was pending).

use std::collections::{BTreeMap, BTreeSet};

use commscope_wire::cst::Header;
use commscope_wire::hash::Hasher;
use commscope_wire::op::{Op, dtype, flags, lib};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{Call, Comm, CommEvent, Heartbeat, Record, Skip};

use crate::pickle::{self, Value};

/// Whether `bytes` look like a pickle whose first dict key is a Flight Recorder one.
pub fn sniff(head: &[u8]) -> bool {
    head.starts_with(b"\x80")
        && [
            &b"version"[..],
            b"pg_config",
            b"entries",
            b"comm_lib_version",
        ]
        .iter()
        .any(|k| head.windows(k.len()).any(|w| w == *k))
}

/// One process group as a rank's `pg_config` lists it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Group {
    pub name: String,
    pub desc: String,
    /// Global ranks, sorted.
    pub ranks: Vec<i32>,
}

impl Group {
    /// The communicator id: the group's name and member set (names repeat across splits).
    pub fn comm_id(&self) -> u64 {
        let mut h = Hasher::new().word(0x46_52).str(&self.name);
        for r in &self.ranks {
            h = h.word(*r as u32 as u64);
        }
        h.finish()
    }

    /// How PyTorch prints a group: `<name>:<desc>`, or the name alone when it has no description.
    pub fn label(&self) -> String {
        match self.desc.as_str() {
            "" | "undefined" => self.name.clone(),
            d => format!("{}:{d}", self.name),
        }
    }

    fn local_to_global(&self, local: i64) -> Option<i32> {
        usize::try_from(local)
            .ok()
            .and_then(|i| self.ranks.get(i))
            .copied()
    }

    /// The `comm` record of `rank` joining the group at `t`, named by its label.
    pub fn created(&self, rank: i32, t: u64) -> Record {
        let mut c = Comm::new(
            CommEvent::Created,
            self.comm_id(),
            0,
            t,
            rank,
            self.comm_rank(rank),
            self.ranks.len() as i32,
            0,
        );
        c.set_name(self.label().as_bytes());
        Record::Comm(c)
    }

    /// `rank`'s place in the group (-1: not a member).
    pub fn comm_rank(&self, rank: i32) -> i32 {
        self.ranks
            .iter()
            .position(|r| *r == rank)
            .map_or(-1, |i| i as i32)
    }
}

/// One ring entry.
#[derive(Clone, Debug)]
pub struct Entry {
    pub record_id: i64,
    pub pg_id: i64,
    /// The group's name (the cross-rank key, with its ranks).
    pub pg_name: String,
    pub pg_desc: String,
    pub collective_seq_id: i64,
    pub p2p_seq_id: i64,
    pub profiling_name: String,
    pub time_created_ns: i64,
    pub duration_ms: Option<f64>,
    pub input_sizes: Vec<Vec<i64>>,
    pub output_sizes: Vec<Vec<i64>>,
    pub input_dtypes: Vec<String>,
    pub state: String,
    pub started_ns: Option<i64>,
    pub completed_ns: Option<i64>,
    pub timeout_ms: Option<i64>,
    pub is_p2p: bool,
}

/// One rank's dump.
#[derive(Clone, Debug)]
pub struct Dump {
    pub rank: i32,
    pub version: String,
    pub library_version: String,
    /// By name.
    pub groups: BTreeMap<String, Group>,
    /// pg_id → (last enqueued, last completed) collective seq.
    pub pg_status: BTreeMap<i64, (i64, i64)>,
    pub entries: Vec<Entry>,
    /// Damage found while reading, one sentence each.
    pub warnings: Vec<String>,
}

/// Reads one dump. `rank` comes from the file name (`<prefix><rank>`); the dump itself does not
/// say which rank wrote it.
pub fn read(bytes: &[u8], rank: i32) -> Result<Dump, String> {
    let parsed = pickle::parse(bytes)?;
    let mut warnings: Vec<String> = parsed.damage.into_iter().collect();
    let v = &parsed.value;
    if v.pairs().is_none() {
        return Err("not a Flight Recorder dump (the pickle holds no dict)".into());
    }
    if v.get("pg_config").is_none() && v.get("entries").is_none() {
        return Err(match warnings.pop() {
            Some(damage) => format!("nothing of the dump could be read: {damage}"),
            None => "a pickle without Flight Recorder keys (pg_config, entries)".into(),
        });
    }
    let version = v.get("version").and_then(Value::as_str).unwrap_or("");
    if version.is_empty() {
        warnings.push("the dump has no format version".into());
    } else if !version.starts_with("2.") {
        warnings.push(format!(
            "format version {version} is newer than the 2.x this reader knows; read as 2.10"
        ));
    }
    let library_version = v
        .get("comm_lib_version")
        .or_else(|| v.get("nccl_version"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let mut groups = BTreeMap::new();
    for (k, g) in v
        .get("pg_config")
        .and_then(Value::pairs)
        .unwrap_or_default()
    {
        let name = g
            .get("name")
            .and_then(Value::as_str)
            .or(k.as_str())
            .unwrap_or("")
            .to_owned();
        let desc = g
            .get("desc")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let ranks = match g.get("ranks") {
            Some(Value::Str(s)) => parse_rank_list(s),
            Some(x) => x.items().map(|i| {
                i.iter()
                    .filter_map(|r| r.as_i64())
                    .map(|r| r as i32)
                    .collect()
            }),
            None => None,
        };
        let Some(mut ranks) = ranks else {
            warnings.push(format!(
                "process group {name} has no readable rank list; skipped"
            ));
            continue;
        };
        ranks.sort_unstable();
        ranks.dedup();
        groups.insert(name.clone(), Group { name, desc, ranks });
    }
    let mut pg_status = BTreeMap::new();
    for (k, s) in v
        .get("pg_status")
        .and_then(Value::pairs)
        .unwrap_or_default()
    {
        let id = k
            .as_str()
            .and_then(|s| s.parse::<i64>().ok())
            .or(k.as_i64());
        let get = |key| s.get(key).and_then(Value::as_i64);
        if let (Some(id), Some(enq), Some(done)) = (
            id,
            get("last_enqueued_collective"),
            get("last_completed_collective"),
        ) {
            pg_status.insert(id, (enq, done));
        }
    }
    let mut entries = Vec::new();
    let mut bad = 0usize;
    for e in v.get("entries").and_then(Value::items).unwrap_or_default() {
        match entry(e) {
            Some(x) => entries.push(x),
            None => bad += 1,
        }
    }
    if bad > 0 {
        warnings.push(format!(
            "{bad} entries lack the fields a collective needs (process group, sequence, name, time); skipped"
        ));
    }
    Ok(Dump {
        rank,
        version: version.to_owned(),
        library_version,
        groups,
        pg_status,
        entries,
        warnings,
    })
}

/// `"[0, 1, 2]"` → the ranks.
fn parse_rank_list(s: &str) -> Option<Vec<i32>> {
    let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    if inner.trim().is_empty() {
        return Some(vec![]);
    }
    inner
        .split(',')
        .map(|x| x.trim().parse::<i32>().ok())
        .collect()
}

fn sizes(v: Option<&Value>) -> Vec<Vec<i64>> {
    v.and_then(Value::items)
        .unwrap_or_default()
        .iter()
        .map(|s| {
            s.items()
                .unwrap_or_default()
                .iter()
                .filter_map(Value::as_i64)
                .collect()
        })
        .collect()
}

fn entry(e: &Value) -> Option<Entry> {
    let (pg_name, pg_desc) = match e.get("process_group")? {
        Value::Tuple(t) | Value::List(t) => (
            t.first()?.as_str()?.to_owned(),
            t.get(1).and_then(Value::as_str).unwrap_or("").to_owned(),
        ),
        Value::Str(s) => (s.clone(), String::new()),
        _ => return None,
    };
    let opt_ns = |k| {
        e.get(k)
            .and_then(Value::as_i64)
            .filter(|t| *t > 0)
            .map(|t| t.min(crate::MAX_TIME_NS as i64))
    };
    Some(Entry {
        record_id: e.get("record_id").and_then(Value::as_i64).unwrap_or(-1),
        pg_id: e.get("pg_id").and_then(Value::as_i64).unwrap_or(-1),
        pg_name,
        pg_desc,
        collective_seq_id: e.get("collective_seq_id")?.as_i64()?,
        p2p_seq_id: e.get("p2p_seq_id").and_then(Value::as_i64).unwrap_or(0),
        profiling_name: e.get("profiling_name")?.as_str()?.to_owned(),
        time_created_ns: e
            .get("time_created_ns")?
            .as_i64()?
            .clamp(0, crate::MAX_TIME_NS as i64),
        duration_ms: e
            .get("duration_ms")
            .and_then(Value::as_f64)
            .filter(|d| d.is_finite() && *d >= 0.0)
            .map(|d| d.min(1e9)),
        input_sizes: sizes(e.get("input_sizes")),
        output_sizes: sizes(e.get("output_sizes")),
        input_dtypes: e
            .get("input_dtypes")
            .and_then(Value::items)
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.as_str().map(str::to_owned))
            .collect(),
        state: e
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("scheduled")
            .to_owned(),
        started_ns: opt_ns("time_discovered_started_ns"),
        completed_ns: opt_ns("time_discovered_completed_ns"),
        timeout_ms: e
            .get("timeout_ms")
            .and_then(Value::as_i64)
            .map(|t| t.clamp(0, 30 * 24 * 3_600_000)),
        is_p2p: e.get("is_p2p").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// What an entry's `profiling_name` says: the op, and for send/recv the group-local peer.
/// `None` for markers (`coalesced`) and ops with no commscope counterpart.
pub fn op_of(profiling_name: &str) -> Option<(Op, Option<i64>)> {
    let body = profiling_name
        .split_once(':')
        .map_or(profiling_name, |(_, b)| b);
    let (kind, rest) = body.split_once(' ').unwrap_or((body, ""));
    let op = match kind {
        "all_reduce" | "allreduce_coalesced" => Op::Allreduce,
        "all_reduce_barrier" | "barrier" => Op::Barrier,
        "broadcast" | "_broadcast_oop" => Op::Broadcast,
        "reduce" | "_reduce_oop" => Op::Reduce,
        "all_gather"
        | "all_gather_single"
        | "_all_gather_base"
        | "all_gather_into_tensor_coalesced"
        | "ALLGATHER_coalesced" => Op::Allgather,
        "all_gather_v" => Op::Allgatherv,
        "reduce_scatter"
        | "reduce_scatter_single"
        | "_reduce_scatter_base"
        | "reduce_scatter_tensor_coalesced"
        | "REDUCE_SCATTER_coalesced"
        | "reduce_scatter_v" => Op::Reducescatter,
        // Per-rank sizes differ (splits): the v form.
        "all_to_all" | "all_to_all_single" | "all_to_all_v_single" => Op::Alltoallv,
        "gather" => Op::Gather,
        "scatter" => Op::Scatter,
        "send" => Op::Send,
        "recv" => Op::Recv,
        _ => return None,
    };
    // "send 0->3" (to 3), "recv 0<-3" (from 3).
    let peer = match op {
        Op::Send => rest
            .rsplit_once("->")
            .and_then(|(_, p)| p.trim().parse().ok()),
        Op::Recv => rest
            .rsplit_once("<-")
            .and_then(|(_, p)| p.trim().parse().ok()),
        _ => None,
    };
    Some((op, peer))
}

/// A PyTorch dtype name → (commscope dtype, bytes per element).
pub fn dtype_of(name: &str) -> (u16, u64) {
    match name {
        "Float" | "float32" => (dtype::FLOAT, 4),
        "Double" | "float64" => (dtype::DOUBLE, 8),
        "Half" | "float16" => (dtype::FLOAT16, 2),
        "BFloat16" | "bfloat16" => (dtype::BFLOAT16, 2),
        "Long" | "int64" => (dtype::INT64, 8),
        "Int" | "int32" => (dtype::INT32, 4),
        "Short" | "int16" => (dtype::INT16, 2),
        "Char" | "int8" => (dtype::INT8, 1),
        "Byte" | "uint8" => (dtype::UINT8, 1),
        "Bool" | "bool" => (dtype::C_BOOL, 1),
        "Float8_e4m3fn" | "Float8_e4m3fnuz" => (dtype::FLOAT8_E4M3, 1),
        "Float8_e5m2" | "Float8_e5m2fnuz" => (dtype::FLOAT8_E5M2, 1),
        _ => (dtype::NONE, 1),
    }
}

fn numel(shapes: &[Vec<i64>]) -> u64 {
    shapes
        .iter()
        .map(|s| {
            s.iter()
                .fold(1u64, |n, d| n.saturating_mul((*d).max(0) as u64))
        })
        .fold(0u64, u64::saturating_add)
}

/// The dump time: the earliest pending entry of the job plus its timeout (the watchdog dumps
/// once a collective times out), else the last entry.
fn dump_time(dumps: &[Dump]) -> u64 {
    let pending = dumps
        .iter()
        .flat_map(|d| &d.entries)
        .filter(|e| e.state != "completed")
        .min_by_key(|e| e.time_created_ns);
    if let Some(e) = pending {
        let timeout = e.timeout_ms.filter(|t| *t > 0).unwrap_or(600_000);
        return (e.time_created_ns.max(0) as u64)
            .saturating_add((timeout as u64).saturating_mul(1_000_000));
    }
    dumps
        .iter()
        .flat_map(|d| &d.entries)
        .map(|e| e.completed_ns.unwrap_or(e.time_created_ns).max(0) as u64)
        .max()
        .unwrap_or(0)
}

/// pg_id → group name, per rank from its own entries; a rank whose entries do not name a group
/// takes the id its fellow members agree on (ranks create their groups in the same order).
fn pg_names(dumps: &[Dump]) -> BTreeMap<i32, BTreeMap<i64, String>> {
    let mut own: BTreeMap<i32, BTreeMap<i64, String>> = BTreeMap::new();
    let mut by_group: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for d in dumps {
        for e in &d.entries {
            if e.pg_id >= 0 {
                own.entry(d.rank)
                    .or_default()
                    .insert(e.pg_id, e.pg_name.clone());
                by_group
                    .entry(e.pg_name.clone())
                    .or_default()
                    .insert(e.pg_id);
            }
        }
    }
    let mut out = BTreeMap::new();
    for d in dumps {
        let mut m = own.get(&d.rank).cloned().unwrap_or_default();
        for name in d.groups.keys() {
            if m.values().any(|n| n == name) {
                continue;
            }
            if let Some(ids) = by_group.get(name).filter(|ids| ids.len() == 1) {
                let id = *ids.iter().next().expect("one id");
                if d.pg_status.contains_key(&id) && !m.contains_key(&id) {
                    m.insert(id, name.clone());
                }
            }
        }
        out.insert(d.rank, m);
    }
    out
}

/// The dumps of one job as commscope process traces, one per rank.
pub fn to_traces(job: &str, dumps: &[Dump]) -> Vec<ProcessTrace> {
    let now = crate::time_ns(dump_time(dumps));
    let names = pg_names(dumps);
    let world = dumps
        .iter()
        .flat_map(|d| d.groups.values().flat_map(|g| g.ranks.iter().copied()))
        .chain(dumps.iter().map(|d| d.rank))
        .max()
        .map_or(0, |m| m.saturating_add(1));
    // Every rank's collective entries by (group, seq): a dump whose tail was lost (a cut file)
    // takes what it had enqueued from a fellow member's entry for the same instance.
    let mut by_instance: BTreeMap<(&str, i64), &Entry> = BTreeMap::new();
    for e in dumps.iter().flat_map(|d| &d.entries) {
        if !e.is_p2p && e.collective_seq_id > 0 {
            by_instance
                .entry((e.pg_name.as_str(), e.collective_seq_id))
                .or_insert(e);
        }
    }
    dumps
        .iter()
        .map(|d| {
            let lost = lost_tail(d, dumps, names.get(&d.rank), &by_instance);
            if lost.is_empty() {
                return rank_trace(job, d, now, world, names.get(&d.rank));
            }
            let mut d = d.clone();
            d.entries.extend(lost);
            rank_trace(job, &d, now, world, names.get(&d.rank))
        })
        .collect()
}

/// Most entries taken from fellow members for one group of one dump.
const MAX_LOST_TAIL: i64 = 64;

/// The work a dump says its rank had enqueued (`pg_status.last_enqueued_collective`, the
/// group's work sequence) past the last entry it still holds: a dump cut short loses the tail of
/// its ring, and without it the rank would read as never having entered what its peers wait in.
/// - A collective comes from a fellow member's entry for the same (group, seq).
/// - Point-to-point sequence numbers are the rank's own, so a lost send or receive is taken as
///   the counterpart of what a peer still waits in with this rank (a pending `send p->me` is a
///   pending `recv me<-p`), no more of them than the dump says were lost.
///
/// Each is pending: what had completed is in `last_completed_collective`.
fn lost_tail(
    d: &Dump,
    dumps: &[Dump],
    names: Option<&BTreeMap<i64, String>>,
    by_instance: &BTreeMap<(&str, i64), &Entry>,
) -> Vec<Entry> {
    let mut out = Vec::new();
    for (id, (enqueued, completed)) in &d.pg_status {
        let Some(name) = names.and_then(|m| m.get(id)) else {
            continue;
        };
        let Some(g) = d.groups.get(name) else {
            continue;
        };
        let mine: Vec<&Entry> = d.entries.iter().filter(|e| &e.pg_name == name).collect();
        let held = mine
            .iter()
            .map(|e| {
                if e.is_p2p {
                    e.p2p_seq_id
                } else {
                    e.collective_seq_id
                }
            })
            .max()
            .unwrap_or(0)
            .max(*completed);
        let lost = enqueued.saturating_sub(held).clamp(0, MAX_LOST_TAIL);
        if lost == 0 {
            continue;
        }
        let pending = |e: &Entry| e.state != "completed";
        let held_coll = mine
            .iter()
            .filter(|e| !e.is_p2p)
            .map(|e| e.collective_seq_id)
            .max()
            .unwrap_or(0)
            .max(*completed);
        for seq in held_coll.saturating_add(1)..=held_coll.saturating_add(lost) {
            if let Some(peer) = by_instance.get(&(name.as_str(), seq)) {
                out.push(Entry {
                    record_id: -1,
                    pg_id: *id,
                    state: "scheduled".into(),
                    started_ns: None,
                    completed_ns: None,
                    duration_ms: None,
                    ..(*peer).clone()
                });
            }
        }
        // Point-to-point: what peers wait in with this rank, less what it still holds.
        let me = i64::from(g.comm_rank(d.rank));
        let mut owed: BTreeMap<(Op, i64), Vec<&Entry>> = BTreeMap::new();
        for other in dumps.iter().filter(|o| o.rank != d.rank) {
            let them = i64::from(g.comm_rank(other.rank));
            for e in other
                .entries
                .iter()
                .filter(|e| &e.pg_name == name && pending(e))
            {
                match op_of(&e.profiling_name) {
                    Some((Op::Send, Some(to))) if to == me => {
                        owed.entry((Op::Recv, them)).or_default().push(e)
                    }
                    Some((Op::Recv, Some(from))) if from == me => {
                        owed.entry((Op::Send, them)).or_default().push(e)
                    }
                    _ => {}
                }
            }
        }
        let mut budget = lost;
        let mut next_seq = mine
            .iter()
            .filter(|e| e.is_p2p)
            .map(|e| e.p2p_seq_id)
            .max()
            .unwrap_or(*completed);
        for ((op, them), theirs) in owed {
            let have = mine
                .iter()
                .filter(|e| pending(e) && op_of(&e.profiling_name) == Some((op, Some(them))))
                .count();
            for e in theirs.into_iter().skip(have) {
                if budget == 0 {
                    break;
                }
                budget -= 1;
                next_seq += 1;
                let arrow = if op == Op::Send { "->" } else { "<-" };
                out.push(Entry {
                    record_id: -1,
                    pg_id: *id,
                    profiling_name: format!("nccl:{} {me}{arrow}{them}", op.name()),
                    p2p_seq_id: next_seq,
                    state: "scheduled".into(),
                    started_ns: None,
                    completed_ns: None,
                    duration_ms: None,
                    is_p2p: true,
                    ..e.clone()
                });
            }
        }
    }
    out
}

fn rank_trace(
    job: &str,
    d: &Dump,
    now: u64,
    world: i32,
    names: Option<&BTreeMap<i64, String>>,
) -> ProcessTrace {
    let mut records = Vec::new();
    let t0 = d
        .entries
        .iter()
        .map(|e| e.time_created_ns.max(0) as u64)
        .min()
        .unwrap_or(now);
    for g in d.groups.values() {
        records.push(g.created(d.rank, t0));
    }
    // Completed through: pg_status by the group's numeric id, and the first pending entry.
    let mut done: BTreeMap<String, i64> = BTreeMap::new();
    for (id, (_, completed)) in &d.pg_status {
        if let Some(name) = names.and_then(|m| m.get(id)) {
            done.insert(name.clone(), *completed);
        }
    }
    let mut seen: BTreeSet<(String, bool, i64)> = BTreeSet::new();
    let mut calls = Vec::new();
    for e in &d.entries {
        let Some(g) = d.groups.get(&e.pg_name) else {
            continue;
        };
        let Some((op, peer)) = op_of(&e.profiling_name) else {
            continue;
        };
        let p2p = op.is_p2p() || e.is_p2p;
        // One instance per sequence number (the ops of a coalesced group share it).
        let key = (
            e.pg_name.clone(),
            p2p,
            if p2p {
                e.p2p_seq_id
            } else {
                e.collective_seq_id
            },
        );
        if !seen.insert(key) {
            continue;
        }
        let completed = e.state == "completed";
        if !completed && !p2p {
            let d = done.entry(e.pg_name.clone()).or_insert(i64::MAX);
            *d = (*d).min(e.collective_seq_id.saturating_sub(1));
        }
        if completed && !p2p {
            let d = done.entry(e.pg_name.clone()).or_insert(-1);
            if *d != i64::MAX {
                *d = (*d).max(e.collective_seq_id);
            }
        }
        calls.push((e, g, op, peer, completed));
    }
    for (name, through) in &done {
        let Some(g) = d.groups.get(name) else {
            continue;
        };
        if *through < 0 || *through == i64::MAX {
            continue;
        }
        records.push(Record::Skip(Skip {
            comm_id: g.comm_id(),
            first_seq: 0,
            last_seq: *through as u64,
            t_first: t0,
            t_last: t0,
            rank: d.rank,
            comm_rank: g.comm_rank(d.rank),
            comm_size: g.ranks.len() as i32,
            ..Default::default()
        }));
    }
    let mut pending = 0u32;
    for (e, g, op, peer, completed) in calls {
        let (dt, size) = dtype_of(e.input_dtypes.first().map_or("", String::as_str));
        let count = numel(&e.input_sizes).max(numel(&e.output_sizes));
        let created = e.time_created_ns.max(0) as u64;
        let mut c = Call {
            op: op as u8,
            flags: flags::NONBLOCKING,
            comm_id: g.comm_id(),
            seq: e.collective_seq_id.max(0) as u64,
            op_seq: e.p2p_seq_id.max(0) as u64,
            bytes: numel(&e.input_sizes).saturating_mul(size),
            count,
            peer: peer.map_or(-1, |p| p as i32),
            tag: -1,
            t_enter: created,
            rank: d.rank,
            comm_rank: g.comm_rank(d.rank),
            comm_size: g.ranks.len() as i32,
            dtype: dt,
            lib: lib::NCCL,
            peer2: -1,
            tag2: -1,
            ..Default::default()
        };
        if op.is_p2p() {
            // The peer stays group-local (the replay maps it through the members).
            c.peer = peer
                .and_then(|p| g.local_to_global(p).map(|_| p as i32))
                .unwrap_or(-1);
        }
        if completed {
            let gpu = e.started_ns.zip(e.duration_ms).map(|(s, ms)| {
                let s = s.max(0) as u64;
                (s, s.saturating_add((ms * 1e6) as u64))
            });
            c.t_exit = e
                .completed_ns
                .map(|t| t.max(0) as u64)
                .or(gpu.map(|g| g.1))
                .unwrap_or(created)
                .max(created);
            if let Some((a, b)) = gpu {
                c.gpu_start = a;
                c.gpu_end = b;
            }
            records.push(Record::Call(c));
        } else {
            pending += 1;
            records.push(Record::Enter(c));
        }
    }
    records.push(Record::Heartbeat(Heartbeat {
        t_mono: now,
        t_real: now,
        in_flight: pending,
        rank: d.rank,
        ..Default::default()
    }));
    crate::imported(
        Header {
            job: job.to_owned(),
            rank: d.rank,
            world_size: world,
            library: format!(
                "NCCL {} (PyTorch Flight Recorder {})",
                if d.library_version.is_empty() {
                    "?"
                } else {
                    &d.library_version
                },
                if d.version.is_empty() {
                    "?"
                } else {
                    &d.version
                }
            ),
            flavour: "nccl".into(),
            ..Default::default()
        },
        records,
    )
}

/// The rank a dump's file name gives: its trailing digits (`_dump_12`, `nccl_trace_rank_3`).
pub fn rank_from_name(name: &str) -> Option<i32> {
    let digits: String = name
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiling_names_map_to_ops_and_local_peers() {
        assert_eq!(op_of("nccl:all_to_all"), Some((Op::Alltoallv, None)));
        assert_eq!(op_of("nccl:_all_gather_base"), Some((Op::Allgather, None)));
        assert_eq!(op_of("nccl:send 0->3"), Some((Op::Send, Some(3))));
        assert_eq!(op_of("nccl:recv 2<-1"), Some((Op::Recv, Some(1))));
        assert_eq!(op_of("xccl:all_reduce"), Some((Op::Allreduce, None)));
        assert_eq!(op_of("nccl:coalesced"), None);
        assert_eq!(op_of("nccl:split"), None);
    }

    #[test]
    fn absurd_sizes_saturate_instead_of_overflowing() {
        // Found by the fuzzer: shapes whose product overflows 64 bits.
        assert_eq!(numel(&[vec![i64::MAX, i64::MAX], vec![3]]), u64::MAX);
        assert_eq!(numel(&[vec![-4, 5]]), 0);
    }

    #[test]
    fn rank_lists_and_file_names() {
        assert_eq!(
            parse_rank_list("[12, 13, 14, 15]"),
            Some(vec![12, 13, 14, 15])
        );
        assert_eq!(parse_rank_list("[]"), Some(vec![]));
        assert_eq!(parse_rank_list("[1, x]"), None);
        assert_eq!(rank_from_name("_dump_12"), Some(12));
        assert_eq!(rank_from_name("nccl_trace_rank_3"), Some(3));
        assert_eq!(rank_from_name("dump"), None);
    }
}
