//! The detectors on small simulated jobs (64 ranks: 8 nodes, 4 pipeline stages, 2 replicas,
//! and other shapes): each fault token gives exactly its expected findings and nothing else, a
//! healthy job none — the accuracy benchmark's check, at a size a debug test build runs in
//! moments.

use commscope_sim::{Fault, Spec, Topology, expected_all, judge, run_virtual, simulate};

/// Runs `tokens` in a job of this shape and asserts the verdict is exact, every fault having
/// struck.
fn exact(tokens: &[&str], spec: Spec) {
    assert_eq!(
        exact_as_struck(tokens, spec),
        tokens.len(),
        "{tokens:?}: every fault struck"
    );
}

/// Runs `tokens` and asserts the verdict is exact for the faults that struck (a rank blocked
/// behind another fault before its own strikes does nothing); returns how many struck.
fn exact_as_struck(tokens: &[&str], spec: Spec) -> usize {
    let faults: Vec<Fault> = tokens
        .iter()
        .map(|t| Fault::parse(t).expect("token"))
        .collect();
    let spec = Spec { faults, ..spec };
    let topo = Topology::new(spec.ranks, spec.per_node, spec.tp, spec.pp).expect("shape");
    let (traces, effective) = simulate(spec.clone()).expect("simulate");
    let want = effective.expected(&topo).expect("expected");
    let got = commscope_analyzer::analyze("t", &traces, &Default::default());
    let found: Vec<_> = got.iter().map(|f| (f.kind, f.ranks.clone())).collect();
    let v = judge(&want, &found);
    let shown: Vec<String> = got
        .iter()
        .map(|f| format!("{} {:?}: {}", f.kind.name(), f.ranks, f.summary))
        .collect();
    assert!(v.exact(), "{tokens:?}: {v:?}\n{shown:#?}");
    effective.effective.len()
}

fn job(ranks: usize, tp: usize, pp: usize, seed: u64) -> Spec {
    Spec {
        job: "t".into(),
        ranks,
        tp,
        pp,
        steps: 30,
        seed,
        ..Default::default()
    }
}

fn findings(faults: Vec<Fault>, seed: u64) -> Vec<commscope_analyzer::Finding> {
    run(faults, seed, 30, 1)
}

/// A 64-rank job of `steps` steps, every communicator sampled at `modulus`, analyzed.
fn run(
    faults: Vec<Fault>,
    seed: u64,
    steps: u64,
    modulus: u32,
) -> Vec<commscope_analyzer::Finding> {
    let spec = Spec {
        job: "t".into(),
        ranks: 64,
        steps,
        seed,
        faults,
        sample_modulus: modulus,
        ..Default::default()
    };
    let traces = run_virtual(spec).expect("simulate");
    if modulus > 1 {
        // Sampling really left calls out, and said so in skip records.
        let skipped: u64 = traces
            .iter()
            .flat_map(|t| &t.records)
            .filter_map(|r| match r {
                commscope_wire::record::Record::Skip(k) => Some(k.calls),
                _ => None,
            })
            .sum();
        assert!(skipped > 0, "nothing was sampled out");
    }
    commscope_analyzer::analyze("t", &traces, &Default::default())
}

#[test]
fn every_fault_token_is_localized_exactly() {
    for (i, token) in [
        "straggler:13",
        "slow-node:node-002",
        "hang:21:12",
        "mismatch:40:9",
        "dead:7:15",
        "degraded",
        "stall:11",
        "teardown:30:10",
        "freeze:45:12",
        // Slow every other step: a rank slow one step in three at 1.5x costs the others
        // about 6 % of the time, too close to the 5 % threshold for evidence that uneven.
        "flaky:9:2",
    ]
    .into_iter()
    .enumerate()
    {
        let spec = job(64, 0, 0, 100 + i as u64);
        let spec = if token == "degraded" {
            long_steps(spec)
        } else {
            spec
        };
        exact(&[token], spec);
    }
}

/// The job with training-sized steps (200 ms of compute per micro-batch) for 12 s after the
/// onset: a degraded collective is reported once it lasted 5 s (a burst of contention is no
/// slow transport).
fn long_steps(spec: Spec) -> Spec {
    Spec {
        compute_ms: 200.0,
        steps: spec.onset_step + 30,
        ..spec
    }
}

#[test]
fn small_and_odd_shapes_are_localized_exactly() {
    // Tensor-parallel pairs with data parallelism; tensor parallelism only; 24 and 40 ranks.
    exact(&["hang:5:10"], job(24, 2, 1, 1));
    exact(&["mismatch:3:12"], job(16, 2, 1, 2));
    exact(&["straggler:17"], job(40, 40, 1, 3));
    exact(&["stall:9"], job(24, 24, 1, 4));
    exact(&["freeze:6:9"], job(16, 2, 2, 5));
    exact(&["teardown:11:8"], job(24, 8, 1, 6));
    // A slow node in a 2-node job: half the ranks are slow.
    exact(&["slow-node:node-001"], job(16, 8, 1, 7));
}

#[test]
fn two_faults_give_one_finding_each() {
    // Where in its step each fault strikes is drawn from the seed: over several seeds both
    // strike in some jobs, and the verdict is exact in all.
    for pair in [
        ["dead:3:12", "hang:40:12"],
        ["straggler:9", "hang:50:26"],
        ["hang:5:12", "hang:6:12"],
    ] {
        let both = (1..=6)
            .filter(|seed| {
                exact_as_struck(
                    &pair,
                    Spec {
                        steps: 34,
                        ..job(64, 0, 0, *seed)
                    },
                ) == 2
            })
            .count();
        assert!(
            both >= 2,
            "{pair:?}: both faults struck in {both} of 6 jobs"
        );
    }
}

#[test]
fn a_straggler_cut_short_by_a_hang_is_judged_by_how_long_it_acted() {
    // The hang comes 0 to 8 steps after the straggler began: too soon to see it (not
    // expected), borderline (either way), or long enough (expected) — never a wrong finding.
    for (ranks, tp) in [(16, 8), (24, 8), (64, 8), (40, 2)] {
        for after in 0..=8u64 {
            let hang = format!("hang:3:{}", 10 + after);
            exact_as_struck(&["straggler:5", &hang], job(ranks, tp, 0, 7 + after));
        }
    }
}

#[test]
fn a_transport_slow_everywhere_from_the_first_step_is_found() {
    // Every cross-node transfer 4x slower from step 0: no healthy start, no healthy peer; the
    // nodes' line rate is the reference. Also tensor parallelism across nodes only.
    for (ranks, tp, pp) in [(64, 0, 0), (16, 16, 1), (40, 2, 1), (256, 8, 4)] {
        exact(&["degraded:0"], long_steps(job(ranks, tp, pp, 3)));
    }
}

#[test]
fn healthy_jobs_give_no_finding() {
    for seed in 1..=5 {
        let got = findings(vec![], seed);
        assert!(got.is_empty(), "seed {seed}: {got:#?}");
    }
}

#[test]
fn a_straggler_is_told_apart_from_the_ranks_that_wait_for_it() {
    // Rank 13 (node 1, pipeline stage 1) computes slowly: its tensor-parallel peers wait for it
    // in every all-reduce, the next stages wait in their receives, and its whole replica arrives
    // late at the data-parallel all-reduce — yet only rank 13 is named, with the wait it causes.
    let got = findings(vec![Fault::Straggler { rank: 13 }], 7);
    assert_eq!(got.len(), 1, "{got:#?}");
    let f = &got[0];
    assert_eq!(f.ranks, [13]);
    assert_eq!(f.nodes, ["node-001"]);
    assert!(f.summary.contains("per step"), "{}", f.summary);
    assert!(
        f.evidence["share_of_time"].as_f64().unwrap_or(0.0) > 0.03,
        "{f:#?}"
    );
}

#[test]
fn detectors_stay_exact_under_consistent_sampling() {
    // One instance in four kept on every communicator (skips for the rest), a longer job so
    // that as many instances are seen: the same verdicts as without sampling.
    for (i, token) in [
        "straggler:13",
        "slow-node:node-002",
        "hang:21:40",
        "dead:7:50",
    ]
    .into_iter()
    .enumerate()
    {
        let fault = Fault::parse(token).expect("token");
        let want =
            expected_all(std::slice::from_ref(&fault), &Topology::of(64, 8)).expect("expected");
        let got = run(vec![fault], 300 + i as u64, 90, 4);
        let found: Vec<_> = got.iter().map(|f| (f.kind, f.ranks.clone())).collect();
        let shown: Vec<String> = got
            .iter()
            .map(|f| format!("{} {:?}: {}", f.kind.name(), f.ranks, f.summary))
            .collect();
        assert!(judge(&want, &found).exact(), "{token}: {shown:#?}");
    }
    for seed in 1..=3 {
        let got = run(vec![], seed, 90, 4);
        assert!(got.is_empty(), "healthy, seed {seed}: {got:#?}");
    }
}

/// The records of a simulated job as agents deliver them: every `ship_ms`, each process's
/// records of that interval in one burst, node by node.
fn in_delivery_order(
    traces: &[commscope_wire::parquet::ProcessTrace],
    ship_ms: u64,
) -> Vec<(u64, usize, usize)> {
    use commscope_wire::record::Record;
    let time = |p: &commscope_wire::parquet::ProcessTrace, t: u64| {
        (i128::from(t) - i128::from(p.header.mono_anchor) + i128::from(p.header.real_anchor)) as u64
    };
    let mut timed: Vec<Vec<u64>> = Vec::new();
    let mut start = u64::MAX;
    for p in traces {
        let v: Vec<u64> = p
            .records
            .iter()
            .map(|r| match r {
                Record::Call(c) => time(p, c.t_exit),
                Record::Skip(k) => time(p, k.t_last),
                Record::Heartbeat(h) => time(p, h.t_mono),
                Record::Process(x) => time(p, x.t_mono),
                _ => 0,
            })
            .collect();
        start = start.min(
            v.iter()
                .copied()
                .filter(|t| *t > 0)
                .min()
                .unwrap_or(u64::MAX),
        );
        timed.push(v);
    }
    let end = timed.iter().flatten().copied().max().unwrap_or(0);
    let mut out = Vec::new();
    let mut cursor = vec![0usize; traces.len()];
    let mut upto = start;
    while upto <= end {
        upto += ship_ms * 1_000_000;
        for (pi, v) in timed.iter().enumerate() {
            while cursor[pi] < v.len() && v[cursor[pi]] <= upto {
                out.push((v[cursor[pi]], pi, cursor[pi]));
                cursor[pi] += 1;
            }
        }
    }
    out
}

#[test]
fn records_delivered_in_bursts_give_the_verdict_of_the_trace() {
    // Agents ship each process's records in bursts; the collector puts them back in time order
    // (`Reorder`) before the detectors see them. Fed that way, the straggler's share of wait
    // time is what the trace gives (fed in arrival order it would be about half).
    use commscope_analyzer::reorder::Reorder;
    use commscope_analyzer::stream::{Detectors, Tuning};
    use commscope_wire::record::Record;
    let spec = Spec {
        job: "t".into(),
        ranks: 256,
        steps: 50,
        seed: 11,
        faults: vec![Fault::Straggler { rank: 100 }],
        ..Default::default()
    };
    let traces = run_virtual(spec).expect("simulate");
    let order = in_delivery_order(&traces, 500);
    let end = order.iter().map(|o| o.0).max().expect("records");

    // From the trace: every record in time order.
    let mut sorted = order.clone();
    sorted.sort_unstable();
    let mut batch = Detectors::new("t", Tuning::default());
    for &(t, pi, ri) in &sorted {
        let p = &traces[pi];
        batch.rank_node(p.header.rank, &p.header.node);
        match &p.records[ri] {
            Record::Call(c) => batch.call(c, t),
            Record::Skip(k) => batch.skip(k, t),
            _ => {}
        }
    }
    batch.advance(end);

    // Live: the bursts through the reorder buffer, released as each node's burst lands.
    let mut live = Detectors::new("t", Tuning::default());
    let mut reorder = Reorder::default();
    reorder.expect_ranks(traces.len());
    let mut released = 0;
    for (i, &(t, pi, ri)) in order.iter().enumerate() {
        let p = &traces[pi];
        live.rank_node(p.header.rank, &p.header.node);
        match &p.records[ri] {
            Record::Call(c) => reorder.call(c, t, &mut live),
            Record::Skip(k) => reorder.skip(k, t, &mut live),
            Record::Heartbeat(_) => reorder.reached(p.header.rank, t),
            _ => {}
        }
        if i % 4096 == 0 {
            released = released.max(reorder.release(t, &mut live));
        }
    }
    assert!(released > 0, "the watermark moved while records arrived");
    reorder.release_all(&mut live);
    live.advance(end);
    assert_eq!(reorder.late, 0, "no record arrived behind the watermark");

    let want = batch.shares()[&100];
    let got = live.shares()[&100];
    assert!(want > 0.05, "the straggler's share from the trace: {want}");
    assert!(
        (got - want).abs() < 0.05 * want,
        "live share {got} against {want} from the trace"
    );
    let verdict = |d: &mut Detectors| -> Vec<Vec<i32>> {
        d.findings().into_iter().map(|f| f.ranks).collect()
    };
    assert_eq!(verdict(&mut live), verdict(&mut batch));
    assert_eq!(verdict(&mut live), vec![vec![100]]);
}
