//! The detectors on small simulated jobs (64 ranks: 8 nodes, 4 pipeline stages, 2 replicas):
//! each fault token gives exactly its expected finding, a healthy job none — the accuracy
//! benchmark's check, at a size a debug test build runs in moments.

use commscope_sim::{Fault, Spec, expected, run_virtual};

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
    ]
    .into_iter()
    .enumerate()
    {
        let fault = Fault::parse(token).expect("token");
        let want = expected(&fault, 64, 8).expect("expected");
        let got = findings(vec![fault], 100 + i as u64);
        let shown: Vec<String> = got
            .iter()
            .map(|f| format!("{} {:?}: {}", f.kind.name(), f.ranks, f.summary))
            .collect();
        assert_eq!(got.len(), 1, "{token}: {shown:#?}");
        assert_eq!(got[0].kind, want.kind, "{token}: {shown:#?}");
        assert_eq!(got[0].ranks, want.ranks, "{token}: {shown:#?}");
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
        let want = expected(&fault, 64, 8).expect("expected");
        let got = run(vec![fault], 300 + i as u64, 90, 4);
        let shown: Vec<String> = got
            .iter()
            .map(|f| format!("{} {:?}: {}", f.kind.name(), f.ranks, f.summary))
            .collect();
        assert_eq!(got.len(), 1, "{token}: {shown:#?}");
        assert_eq!(got[0].kind, want.kind, "{token}: {shown:#?}");
        assert_eq!(got[0].ranks, want.ranks, "{token}: {shown:#?}");
    }
    for seed in 1..=3 {
        let got = run(vec![], seed, 90, 4);
        assert!(got.is_empty(), "healthy, seed {seed}: {got:#?}");
    }
}
