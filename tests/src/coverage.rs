//! The exactness check shared by the shim's and the collector's tests: a trace of
//! `tests/c/coverage.c` holds exactly the calls each rank wrote down.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use commscope_cli::traces::JobTrace;
use commscope_wire::op::{Op, flags};
use commscope_wire::record::{CommEvent, Record};

use crate::{Flavour, assert_ok, summary_json};

/// What the program wrote down: (rank, comm name, op) → (calls, bytes); (rank, comm name) →
/// members.
#[derive(Debug, Default)]
pub struct Expected {
    pub calls: BTreeMap<(i32, String, String), (u64, u64)>,
    pub members: BTreeMap<(i32, String), Vec<i32>>,
}

pub fn read_expected(dir: &Path, ranks: i32) -> Expected {
    let mut e = Expected::default();
    for r in 0..ranks {
        let p = dir.join(format!("rank-{r}.txt"));
        let text =
            std::fs::read_to_string(&p).unwrap_or_else(|err| panic!("{}: {err}", p.display()));
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                ["call", comm, op, bytes] => {
                    let v = e
                        .calls
                        .entry((r, comm.to_string(), op.to_string()))
                        .or_default();
                    v.0 += 1;
                    v.1 += bytes.parse::<u64>().expect("bytes");
                }
                ["members", comm, rest @ ..] => {
                    let mut m: Vec<i32> = rest.iter().map(|x| x.parse().expect("rank")).collect();
                    m.sort_unstable();
                    e.members.insert((r, comm.to_string()), m);
                }
                _ => panic!("bad line in {}: {line}", p.display()),
            }
        }
    }
    e
}

/// (rank, communicator name, op) → (calls, bytes) of a trace; a communicator is named by its
/// `comm` records (`MPI_COMM_WORLD`, or what `MPI_Comm_set_name` gave it), else
/// `unnamed-<id>`.
pub fn calls_by_name(trace: &JobTrace) -> BTreeMap<(i32, String, String), (u64, u64)> {
    let mut actual: BTreeMap<(i32, String, String), (u64, u64)> = BTreeMap::new();
    for p in &trace.processes {
        let mut names: HashMap<u64, String> = HashMap::new();
        for r in &p.records {
            match r {
                Record::Comm(c) if c.event != CommEvent::Freed && !c.name().is_empty() => {
                    names.insert(c.comm_id, c.name().to_owned());
                }
                Record::Call(c) => {
                    let name = names
                        .get(&c.comm_id)
                        .cloned()
                        .unwrap_or_else(|| format!("unnamed-{:#x}", c.comm_id));
                    let v = actual
                        .entry((p.header.rank, name, c.op().name().to_owned()))
                        .or_default();
                    v.0 += 1;
                    v.1 += c.bytes;
                }
                _ => {}
            }
        }
    }
    actual
}

/// One member's record of an instance: (rank, op, bytes, root, flags).
type Member = (i32, u8, u64, i32, u16);

/// Asserts that `trace` (loaded from `trace_dir`) holds exactly what the 8 ranks of the coverage
/// program wrote to `expect_dir`.
pub fn verify(flavour: Flavour, trace: &JobTrace, trace_dir: &Path, expect_dir: &Path) {
    let expected = read_expected(expect_dir, 8);
    assert_eq!(trace.processes.len(), 8, "one process per rank");
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    let actual = calls_by_name(trace);

    // comm id -> name as each rank saw it, and the ranks that know each id.
    let mut id_of: HashMap<(i32, String), u64> = HashMap::new();
    let mut knowers: HashMap<u64, BTreeSet<i32>> = HashMap::new();
    let mut sizes: HashMap<u64, i32> = HashMap::new();
    // (comm, seq) -> [(rank, op, bytes, root)]
    let mut instances: BTreeMap<(u64, u64), Vec<Member>> = BTreeMap::new();
    for p in &trace.processes {
        let rank = p.header.rank;
        let persistent = p
            .records
            .iter()
            .filter(|r| matches!(r, Record::Call(c) if c.flags & flags::PERSISTENT != 0))
            .count();
        assert_eq!(
            persistent, 6,
            "rank {rank}: three starts of a persistent send and receive"
        );
        let mut names: HashMap<u64, String> = HashMap::new();
        let mut last_seq: HashMap<u64, u64> = HashMap::new();
        for r in &p.records {
            match r {
                Record::Comm(c) if c.event != CommEvent::Freed => {
                    if !c.name().is_empty() {
                        names.insert(c.comm_id, c.name().to_owned());
                    }
                    knowers.entry(c.comm_id).or_default().insert(rank);
                    if c.event == CommEvent::Created {
                        sizes.insert(c.comm_id, c.size + c.remote_size);
                    }
                }
                Record::Call(c) => {
                    let name = names
                        .get(&c.comm_id)
                        .cloned()
                        .unwrap_or_else(|| format!("unnamed-{:#x}", c.comm_id));
                    id_of.insert((rank, name), c.comm_id);
                    assert_eq!(c.status, 0, "call failed: {c:?}");
                    assert_eq!(c.rank, rank);
                    assert!(c.t_exit >= c.t_enter, "time runs backwards: {c:?}");
                    assert_eq!(
                        c.flags & flags::LOCAL_COMM_ID,
                        0,
                        "every communicator was created through a wrapped constructor: {c:?}"
                    );
                    if !c.op().is_p2p() {
                        // seq counts every collective on a communicator, in call order.
                        let next = last_seq.entry(c.comm_id).or_insert(0);
                        if c.flags & flags::NONBLOCKING == 0 {
                            assert!(c.seq >= *next, "seq went backwards on rank {rank}: {c:?}");
                        }
                        *next = (*next).max(c.seq + 1);
                        instances
                            .entry((c.comm_id, c.seq))
                            .or_default()
                            .push((rank, c.op, c.bytes, c.peer, c.flags));
                    }
                }
                _ => {}
            }
        }
    }

    // 1. Exactly the calls the program made, per rank, communicator and op, with bytes.
    if actual != expected.calls {
        let mut diff = String::new();
        for (k, v) in &expected.calls {
            if actual.get(k) != Some(v) {
                diff += &format!("  {k:?}: expected {v:?}, traced {:?}\n", actual.get(k));
            }
        }
        for (k, v) in &actual {
            if !expected.calls.contains_key(k) {
                diff += &format!("  {k:?}: not made by the program, traced {v:?}\n");
            }
        }
        panic!(
            "{}: trace differs from what the program did:\n{diff}",
            flavour.name()
        );
    }
    let total: u64 = expected.calls.values().map(|v| v.0).sum();
    assert!(total > 1000, "the program makes many calls ({total})");

    // 2. Communicator ids: members agree, and the id's members are exactly the communicator's.
    let mut names_of_id: HashMap<u64, BTreeSet<String>> = HashMap::new();
    for ((rank, name), members) in &expected.members {
        let id = *id_of
            .get(&(*rank, name.clone()))
            .unwrap_or_else(|| panic!("no calls traced on {name} by rank {rank}"));
        names_of_id.entry(id).or_default().insert(name.clone());
        for m in members {
            assert_eq!(
                id_of.get(&(*m, name.clone())),
                Some(&id),
                "{}: rank {m} has a different id for {name} than rank {rank}",
                flavour.name()
            );
        }
        let knew: Vec<i32> = knowers
            .get(&id)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        assert_eq!(
            &knew,
            members,
            "{}: members of {name} ({id:#x})",
            flavour.name()
        );
        assert_eq!(
            sizes.get(&id).copied(),
            Some(members.len() as i32),
            "{name}: recorded size"
        );
    }
    for (id, names) in &names_of_id {
        assert_eq!(
            names.len(),
            1,
            "{}: one id {id:#x} for different communicators {names:?}",
            flavour.name()
        );
    }

    // 3. Every instance (comm, seq) is the same op on every member, with one record each; non-v
    // ops agree on bytes, rooted ops on the root.
    for ((comm, seq), recs) in &instances {
        let size = sizes.get(comm).copied().unwrap_or(0) as usize;
        assert_eq!(recs.len(), size, "instance {comm:#x}/{seq}: {recs:?}");
        let op = Op::from_code(recs[0].1);
        assert!(
            recs.iter().all(|r| r.1 == recs[0].1),
            "mismatched ops at {comm:#x}/{seq}: {recs:?}"
        );
        if matches!(
            op,
            Op::Allreduce
                | Op::Allgather
                | Op::Alltoall
                | Op::Broadcast
                | Op::Reduce
                | Op::Scan
                | Op::Exscan
                | Op::Reducescatter
        ) {
            assert!(
                recs.iter().all(|r| r.2 == recs[0].2),
                "bytes differ at {comm:#x}/{seq} ({op}): {recs:?}"
            );
        }
        if op.is_rooted() && !recs.iter().any(|r| r.4 & flags::INTERCOMM != 0) {
            assert!(
                recs.iter().all(|r| r.3 == recs[0].3 && r.3 >= 0),
                "roots differ at {comm:#x}/{seq}: {recs:?}"
            );
        }
    }
    // The first three broadcasts on the world communicator went from roots 0, 1, 2.
    let world = id_of[&(0, "MPI_COMM_WORLD".to_owned())];
    let mut roots: Vec<i32> = Vec::new();
    for p in trace.processes.iter().filter(|p| p.header.rank == 5) {
        for r in &p.records {
            if let Record::Call(c) = r
                && c.comm_id == world
                && c.op() == Op::Broadcast
                && c.op_seq < 3
            {
                roots.push(c.peer);
            }
        }
    }
    assert_eq!(roots, [0, 1, 2]);

    // 4. Point-to-point pairs up, wildcards resolved; names and counts in the summary.
    let (s, o) = summary_json(&[trace_dir]);
    assert_ok(&o, "trace summary");
    assert_eq!(s["ranks"], 8);
    assert_eq!(s["p2p"]["unmatched"], 0, "{}", s["p2p"]);
    assert_eq!(s["p2p"]["matched"], s["p2p"]["send"]);
    let sends = expected
        .calls
        .iter()
        .filter(|(k, _)| k.2 == "send" || k.2 == "sendrecv")
        .map(|(_, v)| v.0)
        .sum::<u64>()
        - 8; // minus MPI_PROC_NULL
    assert_eq!(s["p2p"]["send"], sends);
    assert_eq!(s["in_flight"].as_array().map(Vec::len), Some(0));
    for p in &trace.processes {
        for r in &p.records {
            if let Record::Call(c) = r
                && c.op() == Op::Recv
            {
                assert!(c.peer >= 0, "unresolved receive source: {c:?}");
                assert!(c.tag >= 0, "unresolved receive tag: {c:?}");
            }
        }
    }
    let comms = s["comms"].as_array().expect("comms");
    let named = |n: &str| {
        comms
            .iter()
            .find(|c| c["name"] == n)
            .unwrap_or_else(|| panic!("no comm named {n} in {s}"))
    };
    assert_eq!(named("MPI_COMM_WORLD")["size"], 8);
    assert_eq!(named("half-odd")["size"], 4);
    assert_eq!(named("cart-row1")["ops"]["allreduce"], 4);
    assert_eq!(named("MPI_COMM_WORLD")["ops"]["allreduce"], 8 * 5);
}
