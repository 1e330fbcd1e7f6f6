//! The trace driver behind `commscope analyze`: the liveness detectors over the trace's replayed
//! view ([`crate::replay`]), and the instance detectors fed every call in time order.

use commscope_wire::op::Clock;
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{CommEvent, ProcessEvent, Record};

use crate::detectors::Liveness;
use crate::detectors::slow_rank::RankHealth;
use crate::finding::{Finding, Kind, Tracker};
use crate::lateness::{Lateness, LatenessMap};
use crate::stream::{Detectors, Shape, Tuning};
use crate::view::JobView;

/// Thresholds (documented in docs/diagnosis.md).
#[derive(Clone, Debug, Default)]
pub struct Thresholds {
    /// The liveness detectors' (hang, dead-rank).
    pub liveness: Liveness,
    /// The instance detectors'.
    pub tuning: Tuning,
}

/// How often the instance detectors are evaluated over a trace (data time).
const EVAL_EVERY_NS: u64 = 1_000_000_000;
/// After the last record, evaluations go on every second for this long (then once at the end).
const TAIL_EVALS_NS: u64 = 60_000_000_000;
/// Evaluations in one silent stretch between records, at most (ten minutes of trace time).
const GAP_EVALS: u32 = 600;

/// A record's host time on the common (real-time) base.
pub fn real_time(p: &ProcessTrace, t: u64, clock: Clock) -> u64 {
    let h = &p.header;
    let t = match clock {
        Clock::HostReal => t,
        _ if h.real_anchor == 0 => t,
        _ => (t as i128 - h.mono_anchor as i128 + h.real_anchor as i128).max(0) as u64,
    };
    match p.clock {
        Some(c) => (t as i128 + c.offset_ns as i128).max(0) as u64,
        None => t,
    }
}

/// The slow-rank detector's view of each rank at the end of the trace, highest share first:
/// (rank, share of time others waited for it, decayed late instances, highest per-communicator
/// late ratio, blame in seconds).
pub fn slow_rank_view(
    processes: &[ProcessTrace],
    tuning: &Tuning,
) -> Vec<(i32, f64, f64, f64, f64)> {
    let mut det = Detectors::new("", tuning.clone());
    feed_in_time_order(processes, &mut det, |_, _, _, _| {});
    if std::env::var_os("COMMSCOPE_EXPLAIN_CADENCE").is_some() {
        for (c, o, n, a, b) in det.debug_cadence() {
            eprintln!(
                "cadence: comm {c:#x} op {o}: {n} instances from {a:.3} to {b:.3} s (period {:.3} s)",
                (b - a) / (n.max(2) - 1) as f64
            );
        }
    }
    det.debug_ranks()
}

/// When a call started, on the trace's common base: its GPU interval's start when it has one
/// (host-mono clock), else when it was entered.
pub fn call_start(p: &ProcessTrace, c: &commscope_wire::record::Call) -> u64 {
    let clock = if c.has_gpu_time() {
        Clock::HostMono
    } else {
        c.clock()
    };
    real_time(p, c.span().0, clock)
}

/// When a record reaches the instance detectors (its time on the trace's common base), or
/// `None` for records they do not take.
pub(crate) fn feed_time(p: &ProcessTrace, r: &Record) -> Option<u64> {
    Some(match r {
        Record::Call(c) => real_time(p, c.span().1, c.clock()),
        Record::Skip(k) => real_time(p, k.t_last, Clock::HostMono),
        Record::Process(x) if matches!(x.event, ProcessEvent::Step | ProcessEvent::Network) => {
            real_time(p, x.t_mono, Clock::HostMono)
        }
        Record::Comm(c) if matches!(c.event, CommEvent::Failed | CommEvent::Created) => {
            real_time(p, c.t, Clock::HostMono)
        }
        Record::Link(l) => real_time(p, l.t_end, Clock::HostMono),
        Record::Flow(f) => real_time(p, f.t_end, Clock::HostMono),
        Record::LinkEvent(e) => real_time(p, e.t, Clock::HostMono),
        _ => return None,
    })
}

/// Hands one record of a process on `node`, at its [`feed_time`] `t`, to the instance
/// detectors.
pub(crate) fn dispatch(det: &mut Detectors, r: &Record, t: u64, node: &str) {
    match r {
        Record::Call(c) => det.call(c, t),
        Record::Skip(k) => det.skip(k, t),
        Record::Process(x) if x.event == ProcessEvent::Network => det.network(x.rank, x.step),
        Record::Process(x) => det.step_marker(x.rank, x.step, t),
        Record::Comm(c) if c.event == CommEvent::Created => {
            det.comm_created(c.comm_id, c.parent, c.size)
        }
        Record::Comm(c) => det.comm_failed(c, t),
        Record::Link(l) => det.link(l, t),
        Record::Flow(f) => det.flow(f, t),
        Record::LinkEvent(e) => det.link_event(node, e, t),
        _ => {}
    }
}

/// Feeds a job's completed calls and step markers to `det` in time order (records of one
/// process keep their order); `tick(det, t)` runs before each record, with its time.
fn feed_in_time_order(
    processes: &[ProcessTrace],
    det: &mut Detectors,
    mut tick: impl FnMut(&mut Detectors, u64, &ProcessTrace, &Record),
) {
    let mut order: Vec<(u64, u32, u32)> = Vec::new();
    for (pi, p) in processes.iter().enumerate() {
        if !p.header.is_transport() {
            det.rank_node(p.header.rank, &p.header.node);
        }
        for (ri, r) in p.records.iter().enumerate() {
            if let Some(t) = feed_time(p, r) {
                order.push((t, pi as u32, ri as u32));
            }
        }
    }
    order.sort_unstable();
    for (t, pi, ri) in order {
        let p = &processes[pi as usize];
        let r = &p.records[ri as usize];
        tick(det, t, p, r);
        dispatch(det, r, t, &p.header.node);
    }
}

/// Evaluates the instance detectors every second of trace time as records are fed to them in
/// time order, keeping every finding (open and resolved).
#[derive(Default)]
pub(crate) struct Evaluator {
    tracker: Tracker,
    next: Option<u64>,
}

impl Evaluator {
    /// Before the record at `t` is fed.
    pub(crate) fn tick(&mut self, det: &mut Detectors, t: u64) {
        let n = self.next.get_or_insert(t.saturating_add(EVAL_EVERY_NS));
        // A silent stretch is evaluated for a while as the live collector would; past that
        // nothing changes until the next record (a damaged timestamp far in the future must
        // not cost a billion evaluations).
        let mut evals = 0;
        while t >= *n {
            if evals == GAP_EVALS {
                *n = t.saturating_add(EVAL_EVERY_NS);
                break;
            }
            det.advance(*n);
            self.tracker.update(det.findings(), *n);
            *n = n.saturating_add(EVAL_EVERY_NS);
            evals += 1;
        }
    }

    /// Once every record is fed: calls never completed join the mismatch check, and the
    /// findings as they stand at `end_ns`.
    pub(crate) fn finish(
        mut self,
        det: &mut Detectors,
        unfinished: Vec<(i32, u64, u64, Shape, usize)>,
        end_ns: u64,
    ) -> Vec<Finding> {
        // After the last record (a hung job's trace goes on with heartbeats only), evaluate
        // every second as the live collector does, for up to a minute: what was open when the
        // job stopped is seen before it decays.
        if let Some(mut n) = self.next {
            let until = end_ns.min(n.saturating_add(TAIL_EVALS_NS));
            while n < until {
                det.advance(n);
                self.tracker.update(det.findings(), n);
                n = n.saturating_add(EVAL_EVERY_NS);
            }
        }
        det.advance(end_ns.max(self.next.map_or(0, |n| n.saturating_sub(EVAL_EVERY_NS))));
        det.in_flight_shapes(unfinished);
        self.tracker.update(det.findings(), end_ns);
        self.tracker.all()
    }
}

/// A job's trace analyzed: its replayed view, every finding (open and resolved, as they stood
/// at the trace's end), and the instance detectors' measures at the end.
#[derive(Debug)]
pub struct Analysis {
    pub view: JobView,
    pub findings: Vec<Finding>,
    /// Each rank's health (slow-rank measures), in rank order.
    pub health: Vec<RankHealth>,
    /// The step period and where it came from.
    pub step: Option<(f64, String)>,
    /// Link totals per node pair (NCCL's profiler plugin), most bytes first.
    pub links: Vec<crate::links::NodePair>,
    /// How late each rank arrived at its collectives, over time.
    pub lateness: LatenessMap,
}

/// Runs every detector over one job's trace: the liveness detectors over its replayed view,
/// and the instance detectors fed in time order.
pub fn analysis(job: &str, processes: &[ProcessTrace], th: &Thresholds) -> Analysis {
    analysis_of(job, processes, crate::replay::view(job, processes), th)
}

/// The analysis of traces cut at `t_ns` ([`crate::replay::until`]) as a collector would have
/// made it then: the processes that had not ended were still running, so a silent one is not
/// taken for dead, and "now" is `t_ns`.
pub fn analysis_at(job: &str, cut: &[ProcessTrace], th: &Thresholds, t_ns: u64) -> Analysis {
    let mut view = crate::replay::view(job, cut);
    view.live = true;
    view.now_ns = view.now_ns.max(t_ns);
    analysis_of(job, cut, view, th)
}

fn analysis_of(job: &str, processes: &[ProcessTrace], view: JobView, th: &Thresholds) -> Analysis {
    let mut det = Detectors::new(job, th.tuning.clone());
    let mut ev = Evaluator::default();
    let mut late = Lateness::default();
    feed_in_time_order(processes, &mut det, |det, t, p, r| {
        ev.tick(det, t);
        if let Record::Call(c) = r {
            late.call(c, call_start(p, c), t);
        }
    });
    conclude(view, det, ev, late, th)
}

/// The analysis once every record has been fed to `det` through `ev`, and `view` replayed.
pub(crate) fn conclude(
    view: JobView,
    mut det: Detectors,
    ev: Evaluator,
    late: Lateness,
    th: &Thresholds,
) -> Analysis {
    // Collectives never completed join the mismatch check at the end.
    let comms = &view.comms;
    let unfinished: Vec<(i32, u64, u64, Shape, usize)> = view
        .ranks
        .values()
        .flat_map(|r| {
            r.in_flight.iter().filter(|x| !x.op.is_p2p()).map(move |x| {
                let size = comms.get(&x.comm).map_or(0, |c| c.members.len());
                (r.rank, x.comm, x.seq, x.shape, size)
            })
        })
        .collect();
    let instance = ev.finish(&mut det, unfinished, view.now_ns);
    let (mut mismatches, mut findings): (Vec<Finding>, Vec<Finding>) =
        instance.into_iter().partition(|f| f.kind == Kind::Mismatch);
    let mut view = view;
    view.dead_links = det.dead_links(view.now_ns);
    findings.extend(crate::detectors::liveness(
        &view,
        &th.liveness,
        &mut mismatches,
    ));
    findings.extend(mismatches);
    crate::link_errors::fold_into_hangs(&mut findings);
    findings.sort_by(|a, b| (a.kind, &a.ranks, &a.comm).cmp(&(b.kind, &b.ranks, &b.comm)));
    Analysis {
        view,
        findings,
        health: det.health(),
        step: det.step(),
        links: det.node_pairs(),
        lateness: late.finish(),
    }
}

/// Every finding of one job's trace ([`analysis`]).
pub fn analyze(job: &str, processes: &[ProcessTrace], th: &Thresholds) -> Vec<Finding> {
    analysis(job, processes, th).findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::cst::Header;
    use commscope_wire::op::Op;
    use commscope_wire::record::{Call, Comm, Heartbeat};

    const WORLD: u64 = 0xabc;
    const S: u64 = 1_000_000_000;

    fn proc(rank: i32, records: Vec<Record>) -> ProcessTrace {
        let mut all = vec![Record::Comm(Comm::new(
            CommEvent::Created,
            WORLD,
            0,
            0,
            rank,
            rank,
            4,
            0,
        ))];
        all.extend(records);
        ProcessTrace {
            header: Header {
                job: "j".into(),
                node: format!("n{}", rank / 2),
                pid: 100 + rank as u32,
                rank,
                world_size: 4,
                ..Default::default()
            },
            records: all,
            clock: None,
            cut_short: false,
        }
    }

    fn call(rank: i32, seq: u64, op: Op) -> Record {
        Record::Call(Call {
            op: op as u8,
            comm_id: WORLD,
            seq,
            bytes: 8,
            peer: if op.is_rooted() { 0 } else { -1 },
            rank,
            comm_rank: rank,
            comm_size: 4,
            t_enter: seq * S,
            t_exit: seq * S + 1000,
            ..Default::default()
        })
    }

    fn enter(rank: i32, seq: u64, at: u64) -> Record {
        Record::Enter(Call {
            op: Op::Allreduce as u8,
            comm_id: WORLD,
            seq,
            bytes: 8,
            peer: -1,
            rank,
            comm_rank: rank,
            t_enter: at,
            ..Default::default()
        })
    }

    fn beat(at: u64) -> Record {
        Record::Heartbeat(Heartbeat {
            t_mono: at,
            t_real: at,
            ..Default::default()
        })
    }

    /// Every rank completed instances 0..3 and is blocked in instance 3, entered as `signature`
    /// says for it (the whole signature, as `enter` records carry it now).
    fn blocked_in(signature: impl Fn(i32) -> Call) -> Vec<ProcessTrace> {
        (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..3).map(|s| call(r, s, Op::Allreduce)).collect();
                recs.push(Record::Enter(Call {
                    comm_id: WORLD,
                    seq: 3,
                    rank: r,
                    comm_rank: r,
                    comm_size: 4,
                    t_enter: 3 * S,
                    ..signature(r)
                }));
                recs.push(beat(20 * S));
                proc(r, recs)
            })
            .collect()
    }

    #[test]
    fn a_reduction_or_a_root_that_differs_is_a_mismatch_while_every_rank_blocks() {
        use commscope_wire::op::{dtype, red_op};
        let reduce = |r: i32| Call {
            op: Op::Allreduce as u8,
            bytes: 2048,
            count: 256,
            dtype: dtype::DOUBLE,
            red_op: if r == 2 { red_op::MAX } else { red_op::SUM },
            peer: -1,
            ..Default::default()
        };
        let f = analyze("j", &blocked_in(reduce), &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].ranks.as_slice()),
            (Kind::Mismatch, &[2][..])
        );
        assert!(
            f[0].summary
                .contains("rank 2 called allreduce of 2048 B (double, max)"),
            "{}",
            f[0].summary
        );
        let bcast = |r: i32| Call {
            op: Op::Broadcast as u8,
            bytes: 256,
            count: 64,
            dtype: dtype::INT,
            peer: if r == 3 { 1 } else { 0 },
            ..Default::default()
        };
        let f = analyze("j", &blocked_in(bcast), &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].ranks.as_slice()),
            (Kind::Mismatch, &[3][..])
        );
        assert!(f[0].summary.contains("rooted at 1"), "{}", f[0].summary);
    }

    #[test]
    fn an_enter_record_without_the_signature_is_compared_on_what_it_says() {
        use commscope_wire::op::{dtype, red_op};
        // Ranks 0, 1 and 3 completed instance 3 (double, sum); rank 2's `enter` record was
        // written before calls in flight carried datatype and reduction: it is slow, not
        // mismatched. (Its peers completed: nobody waits for it, no finding at all.)
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..3).map(|s| call(r, s, Op::Allreduce)).collect();
                let full = Call {
                    dtype: dtype::DOUBLE,
                    red_op: red_op::SUM,
                    ..match call(r, 3, Op::Allreduce) {
                        Record::Call(c) => c,
                        _ => unreachable!("a call"),
                    }
                };
                if r == 2 {
                    recs.push(enter(r, 3, 3 * S));
                } else {
                    recs.push(Record::Call(full));
                }
                recs.push(beat(4 * S));
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert!(f.iter().all(|f| f.kind != Kind::Mismatch), "{f:#?}");
    }

    #[test]
    fn a_rank_calling_another_collective_is_a_mismatch_not_a_hang() {
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..3).map(|s| call(r, s, Op::Allreduce)).collect();
                if r == 1 {
                    recs.push(call(r, 3, Op::Broadcast));
                } else {
                    recs.push(enter(r, 3, 3 * S));
                }
                recs.push(beat(20 * S));
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::Mismatch);
        assert_eq!(f[0].ranks, [1]);
        assert_eq!(f[0].seq, Some(3));
        assert!(
            f[0].summary.contains("rank 1 called broadcast"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn a_receive_in_flight_is_in_flight_though_its_enter_record_has_no_sequence() {
        // A blocked receive's `enter` record carries no message sequence (which message it
        // gets is known only when it completes): earlier receives that completed, numbered
        // from 0, must not be taken for it.
        let p2p = |op: Op, op_seq: u64, tag: i32, at: u64| Call {
            op: op as u8,
            comm_id: WORLD,
            op_seq,
            bytes: 64,
            peer: 1,
            tag,
            rank: 0,
            comm_rank: 0,
            comm_size: 4,
            t_enter: at,
            t_exit: at + 1000,
            ..Default::default()
        };
        let mut recs: Vec<Record> = (0..3)
            .flat_map(|k| {
                [
                    Record::Call(p2p(Op::Send, k, 7, k * S)),
                    Record::Call(p2p(Op::Recv, k, 7, k * S + 10)),
                ]
            })
            .collect();
        recs.push(Record::Enter(p2p(Op::Send, 3, 7, 10 * S)));
        recs.push(Record::Enter(p2p(Op::Recv, 0, 8, 10 * S + 10)));
        recs.push(beat(20 * S));
        let v = crate::replay::view("j", &[proc(0, recs)]);
        let mut inside: Vec<(i32, Op)> = v.ranks[&0]
            .in_flight
            .iter()
            .map(|c| (c.tag, c.op))
            .collect();
        inside.sort_by_key(|x| x.0);
        assert_eq!(inside, [(7, Op::Send), (8, Op::Recv)]);
    }

    #[test]
    fn an_enter_record_written_after_its_call_returned_is_not_in_flight() {
        // The shim's heartbeat thread saw rank 1 in all-reduce #2 but, descheduled (a CPU
        // quota), wrote that `enter` only after the call's own record.
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..6).map(|s| call(r, s, Op::Allreduce)).collect();
                if r == 1 {
                    recs.insert(3, enter(r, 2, 2 * S));
                }
                recs.push(beat(20 * S));
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert!(f.is_empty(), "{f:#?}");
    }

    fn killed(at: u64) -> Record {
        Record::Process(commscope_wire::record::Process {
            event: ProcessEvent::Exit,
            flags: commscope_wire::op::flags::OBSERVED,
            t_mono: at,
            t_real: at,
            signal: 9,
            exit_status: commscope_wire::record::EXIT_STATUS_UNKNOWN,
            rec_seq: 0,
            pid: 0,
            start_time: 0,
            rank: 0,
            world_size: 4,
            step: 0,
        })
    }

    #[test]
    fn records_written_for_a_rank_after_its_exit_do_not_make_an_earlier_one_look_frozen() {
        // Rank 1 never entered all-reduce #5; the job was killed as a whole at 10 s. Rank 0's
        // last heartbeat was at 8 s; ranks 1–3 got two more after their exits, written on their
        // behalf by an agent that had not yet seen them go. Rank 1 is the one finding.
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..5).map(|s| call(r, s, Op::Allreduce)).collect();
                if r != 1 {
                    recs.push(enter(r, 5, 5 * S));
                }
                recs.extend([beat(6 * S), beat(8 * S)]);
                if r != 0 {
                    recs.push(beat(9 * S + S / 2));
                }
                recs.push(killed(10 * S));
                if r != 0 {
                    recs.extend([beat(11 * S), beat(12 * S)]);
                }
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(
            (f[0].kind, f[0].ranks.as_slice()),
            (Kind::Hang, &[1][..]),
            "{f:#?}"
        );
    }

    #[test]
    fn peers_waiting_for_a_silent_rank_give_one_dead_rank_finding() {
        let procs: Vec<ProcessTrace> = (0..4)
            .map(|r| {
                let mut recs: Vec<Record> = (0..5).map(|s| call(r, s, Op::Allreduce)).collect();
                if r == 2 {
                    recs.push(beat(5 * S)); // then nothing
                } else {
                    recs.push(enter(r, 5, 5 * S));
                    recs.push(beat(20 * S));
                }
                proc(r, recs)
            })
            .collect();
        let f = analyze("j", &procs, &Thresholds::default());
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, Kind::DeadRank);
        assert_eq!(f[0].ranks, [2]);
        assert_eq!(f[0].nodes, ["n1"]);
        assert_eq!(f[0].evidence["victims"], serde_json::json!([0, 1, 3]));
        // Below the floor nothing is stuck yet, and a rank that merely lags (heard from as
        // long as its peers) is not dead.
        let procs: Vec<ProcessTrace> = procs
            .into_iter()
            .map(|mut p| {
                if p.header.rank == 2 {
                    p.records.push(beat(20 * S));
                }
                p
            })
            .collect();
        let quiet = Thresholds {
            liveness: Liveness {
                hang_floor_ns: 60 * S,
                dead_after_ns: 60 * S,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(analyze("j", &procs, &quiet).is_empty());
    }
}
