//! Writes a large synthetic job trace as one Parquet file, process by process, for the
//! post-mortem benchmark (`scripts/bench.sh postmortem`): a data- and tensor-parallel training
//! loop in which one rank computes slower than the others.
//!
//! Each step, every rank runs four tensor-parallel collectives with the ranks of its node (two
//! all-gathers, two reduce-scatters), then four data-parallel all-reduce buckets across the
//! world; it marks its steps and beats once a second. A collective ends when its last member
//! has arrived, plus the transfer. The slow rank's compute takes `--slowdown` times as long, so
//! every other rank waits for it in each world all-reduce.
//!
//! Usage: gen-trace --records N [--ranks R] [--per-node P] [--slow-rank S] [--slowdown F] OUT.parquet

use std::path::PathBuf;
use std::process::ExitCode;

use commscope_sim::Rng;
use commscope_wire::cst::Header;
use commscope_wire::op::{Clock, Op, dtype, flags, lib};
use commscope_wire::parquet::Writer;
use commscope_wire::record::{Call, Comm, CommEvent, Heartbeat, Process, ProcessEvent, Record};

const MS: f64 = 1e6;
const TP_OPS: usize = 4;
const DP_OPS: usize = 4;
const WORLD: u64 = 0x5eed_0000_0000_0001;
/// When the job starts (ns since the epoch).
const T0: u64 = 1_780_000_000_000_000_000;

struct Args {
    records: u64,
    ranks: usize,
    per_node: usize,
    slow: usize,
    slowdown: f64,
    out: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        records: 100_000_000,
        ranks: 256,
        per_node: 8,
        slow: 37,
        slowdown: 1.3,
        out: PathBuf::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().ok_or(format!("{x} needs a value"));
        match x.as_str() {
            "--records" => a.records = val()?.parse().map_err(|e| format!("--records: {e}"))?,
            "--ranks" => a.ranks = val()?.parse().map_err(|e| format!("--ranks: {e}"))?,
            "--per-node" => a.per_node = val()?.parse().map_err(|e| format!("--per-node: {e}"))?,
            "--slow-rank" => a.slow = val()?.parse().map_err(|e| format!("--slow-rank: {e}"))?,
            "--slowdown" => a.slowdown = val()?.parse().map_err(|e| format!("--slowdown: {e}"))?,
            _ if !x.starts_with('-') => a.out = PathBuf::from(x),
            _ => return Err(format!("unknown option {x}")),
        }
    }
    if a.out.as_os_str().is_empty() {
        return Err("usage: gen-trace --records N [--ranks R] [--per-node P] [--slow-rank S] [--slowdown F] OUT.parquet".into());
    }
    if a.per_node == 0 || a.ranks == 0 || !a.ranks.is_multiple_of(a.per_node) {
        return Err("--ranks must be a multiple of --per-node".into());
    }
    Ok(a)
}

/// The job's timing, shared by every rank: when each step starts and each collective ends.
struct Timing {
    steps: usize,
    nodes: usize,
    step_start: Vec<f64>,
    /// [step][node][op]
    tp_end: Vec<f64>,
    /// [step][op]
    dp_end: Vec<f64>,
}

/// Rank `r`'s compute before op `k` of step `s` (ns): about `base`, slower on the slow rank.
fn compute(a: &Args, r: usize, s: usize, k: usize, base: f64) -> f64 {
    let mut rng = Rng::new(((s as u64) << 24) ^ ((r as u64) << 6) ^ k as u64);
    let f = if r == a.slow { a.slowdown } else { 1.0 };
    base * f * (1.0 + 0.05 * rng.unit())
}

impl Timing {
    fn of(a: &Args) -> Timing {
        let per_step = (a.ranks * (TP_OPS + DP_OPS + 1)) as u64;
        let steps = (a.records / per_step).max(1) as usize;
        let nodes = a.ranks / a.per_node;
        let mut t = Timing {
            steps,
            nodes,
            step_start: Vec::with_capacity(steps + 1),
            tp_end: vec![0.0; steps * nodes * TP_OPS],
            dp_end: vec![0.0; steps * DP_OPS],
        };
        let mut start = 0.0;
        let mut at = vec![0.0f64; a.ranks];
        for s in 0..steps {
            t.step_start.push(start);
            at.iter_mut().for_each(|x| *x = start);
            for k in 0..TP_OPS {
                for n in 0..nodes {
                    let mut last: f64 = 0.0;
                    let first = n * a.per_node;
                    for (i, x) in at[first..first + a.per_node].iter_mut().enumerate() {
                        *x += compute(a, first + i, s, k, 8.0 * MS);
                        last = last.max(*x);
                    }
                    let end = last + 0.3 * MS;
                    t.tp_end[(s * nodes + n) * TP_OPS + k] = end;
                    at[n * a.per_node..(n + 1) * a.per_node].fill(end);
                }
            }
            for k in 0..DP_OPS {
                let mut last: f64 = 0.0;
                for (r, x) in at.iter_mut().enumerate() {
                    *x += compute(a, r, s, TP_OPS + k, 2.0 * MS);
                    last = last.max(*x);
                }
                let end = last + 2.5 * MS;
                t.dp_end[s * DP_OPS + k] = end;
                at.fill(end);
            }
            start = at[0] + 0.5 * MS;
        }
        t.step_start.push(start);
        t
    }
}

fn tp_comm(node: usize) -> u64 {
    0x7e00_0000_0000_0000 | node as u64
}

fn call(op: Op, comm: u64, seq: u64, bytes: u64, r: usize, cr: usize, size: usize) -> Call {
    Call {
        op: op as u8,
        comm_id: comm,
        seq,
        bytes,
        count: bytes / 2,
        peer: -1,
        tag: -1,
        rank: r as i32,
        comm_rank: cr as i32,
        comm_size: size as i32,
        dtype: dtype::BFLOAT16,
        lib: lib::NCCL,
        clock: Clock::HostMono as u8,
        peer2: -1,
        tag2: -1,
        ..Default::default()
    }
}

fn write_rank(a: &Args, t: &Timing, r: usize, w: &mut Writer) -> Result<(), String> {
    let node = r / a.per_node;
    let header = Header {
        job: "bench-postmortem".into(),
        node: format!("node-{node:03}"),
        pid: 10_000 + r as u32,
        rank: r as i32,
        world_size: a.ranks as i32,
        start_time: 1,
        mono_anchor: 0,
        real_anchor: T0,
        flavour: "nccl".into(),
        ..Default::default()
    };
    // Records are numbered from 1 in each process, as the shim numbers them.
    let mut n = 0u64;
    let mut push = |mut rec: Record| {
        n += 1;
        rec.set_rec_seq(n);
        w.push(&header, None, &rec).map_err(|e| e.to_string())
    };
    let ns = |x: f64| 1_000_000_000 + x as u64;
    push(Record::Comm(Comm::new(
        CommEvent::Created,
        WORLD,
        0,
        ns(0.0),
        r as i32,
        r as i32,
        a.ranks as i32,
        0,
    )))?;
    push(Record::Comm(Comm::new(
        CommEvent::Created,
        tp_comm(node),
        WORLD,
        ns(0.0),
        r as i32,
        (r % a.per_node) as i32,
        a.per_node as i32,
        0,
    )))?;
    let mut next_beat = 0.0;
    for s in 0..t.steps {
        let start = t.step_start[s];
        while next_beat <= start {
            push(Record::Heartbeat(Heartbeat {
                t_mono: ns(next_beat),
                t_real: T0 + ns(next_beat),
                rank: r as i32,
                ..Default::default()
            }))?;
            next_beat += 1e9;
        }
        let mut at = start;
        for k in 0..TP_OPS {
            at += compute(a, r, s, k, 8.0 * MS);
            let end = t.tp_end[(s * t.nodes + node) * TP_OPS + k];
            let op = if k % 2 == 0 {
                Op::Allgather
            } else {
                Op::Reducescatter
            };
            let mut c = call(
                op,
                tp_comm(node),
                (s * TP_OPS + k) as u64,
                4 << 20,
                r,
                r % a.per_node,
                a.per_node,
            );
            c.t_enter = ns(at);
            c.t_exit = ns(end) + (r as u64 % 7) * 1_000;
            push(Record::Call(c))?;
            at = end;
        }
        for k in 0..DP_OPS {
            at += compute(a, r, s, TP_OPS + k, 2.0 * MS);
            let end = t.dp_end[s * DP_OPS + k];
            let mut c = call(
                Op::Allreduce,
                WORLD,
                (s * DP_OPS + k) as u64,
                25 << 20,
                r,
                r,
                a.ranks,
            );
            c.t_enter = ns(at);
            c.t_exit = ns(end) + (r as u64 % 7) * 1_000;
            push(Record::Call(c))?;
            at = end;
        }
        push(Record::Process(Process {
            event: ProcessEvent::Step,
            t_mono: ns(at),
            t_real: T0 + ns(at),
            pid: header.pid,
            rank: r as i32,
            world_size: a.ranks as i32,
            step: s as u64 + 1,
            rec_seq: 0,
            flags: 0,
            exit_status: commscope_wire::record::EXIT_STATUS_UNKNOWN,
            start_time: header.start_time,
            signal: 0,
        }))?;
    }
    let end = t.step_start[t.steps];
    push(Record::Heartbeat(Heartbeat {
        flags: flags::FINAL,
        t_mono: ns(end),
        t_real: T0 + ns(end),
        rank: r as i32,
        ..Default::default()
    }))
}

fn main() -> ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gen-trace: {e}");
            return ExitCode::from(2);
        }
    };
    let t = Timing::of(&a);
    let run = || -> Result<u64, String> {
        let mut w = Writer::create(&a.out, &[]).map_err(|e| e.to_string())?;
        for r in 0..a.ranks {
            write_rank(&a, &t, r, &mut w)?;
        }
        w.finish().map_err(|e| e.to_string())
    };
    match run() {
        Ok(rows) => {
            eprintln!(
                "gen-trace: wrote {} ({rows} records, {} ranks on {} nodes, {} steps of {:.1} ms, rank {} {:.0} % slower)",
                a.out.display(),
                a.ranks,
                t.nodes,
                t.steps,
                t.step_start[t.steps] / t.steps as f64 / MS,
                a.slow,
                (a.slowdown - 1.0) * 100.0
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gen-trace: {e}");
            ExitCode::FAILURE
        }
    }
}
