//! Accuracy benchmark of the detectors: randomized simulated jobs (1,024–4,096 ranks) with every
//! fault token, run in virtual time through `commscope analyze`'s batch driver. A scenario is
//! *exactly localized* when the findings are exactly one finding of the expected kind naming
//! exactly the expected ranks; a healthy scenario must give no finding at all.
//!
//! `bench-accuracy [--scenarios N] [--healthy N] [--seed S] [--threads T] [--min-ranks R]
//! [--max-ranks R] [--sample-modulus K]` — with K, every communicator is consistently sampled
//! (1 instance in K kept, the rest in skip records), as agents do at scale.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use commscope_sim::{Fault, Rng, Spec, Topology, expected, run_virtual};

/// Every fault token, in turn.
const KINDS: [&str; 6] = [
    "straggler",
    "slow-node",
    "hang",
    "mismatch",
    "dead",
    "degraded",
];

#[derive(Clone, Debug)]
struct Scenario {
    spec: Spec,
    fault: Option<Fault>,
}

#[derive(Debug)]
struct Outcome {
    token: String,
    ranks: usize,
    ok: bool,
    detail: String,
    secs: f64,
    records: usize,
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
        })
        .unwrap_or(default)
}

fn scenarios(
    n_fault: usize,
    n_healthy: usize,
    seed: u64,
    min: u64,
    max: u64,
    modulus: u32,
) -> Vec<Scenario> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for i in 0..n_fault + n_healthy {
        // Multiples of 32 ranks: 4 pipeline stages of 8-rank nodes.
        let ranks = (min + rng.below(max - min + 1)) / 32 * 32;
        let ranks = ranks.max(64) as usize;
        let topo = Topology::of(ranks, 8);
        // Sampled jobs run longer, so that as many instances are kept as without sampling (a
        // live job keeps at least one instance per second on every communicator).
        let steps = 24 * u64::from(modulus.div_ceil(2).max(1));
        let onset = 6 + rng.below(5);
        let last_seq = steps - 4;
        let rank = rng.below(ranks as u64) as i32;
        let seq = onset + rng.below(last_seq - onset);
        let fault = (i < n_fault).then(|| match KINDS[i % KINDS.len()] {
            "straggler" => Fault::Straggler { rank },
            "slow-node" => Fault::SlowNode {
                node: topo.node_name(rng.below(topo.nodes as u64) as usize),
            },
            "hang" => Fault::Hang {
                rank,
                seq: Some(seq),
            },
            "mismatch" => Fault::Mismatch {
                rank,
                seq: Some(seq),
            },
            "dead" => Fault::Dead {
                rank,
                seq: Some(seq),
            },
            _ => Fault::Degraded,
        });
        let spec = Spec {
            job: format!("bench-{i}"),
            ranks,
            steps,
            seed: rng.next_u64(),
            faults: fault.iter().cloned().collect(),
            onset_step: onset,
            // Effects from the documented minimum up.
            slow_factor: 1.3 + 0.7 * rng.unit(),
            degrade_factor: 2.5 + 2.5 * rng.unit(),
            jitter: 0.01 + 0.03 * rng.unit(),
            compute_ms: 5.0 + 15.0 * rng.unit(),
            sample_modulus: modulus,
            ..Default::default()
        };
        out.push(Scenario { spec, fault });
    }
    out
}

fn run(s: &Scenario) -> Outcome {
    let t = Instant::now();
    let ranks = s.spec.ranks;
    let token = s.fault.as_ref().map_or("healthy".into(), Fault::token);
    let traces = match run_virtual(s.spec.clone()) {
        Ok(t) => t,
        Err(e) => {
            return Outcome {
                token,
                ranks,
                ok: false,
                detail: e,
                secs: 0.0,
                records: 0,
            };
        }
    };
    let records = traces.iter().map(|t| t.records.len()).sum();
    let findings = commscope_analyzer::analyze(&s.spec.job, &traces, &Default::default());
    let got: Vec<String> = findings
        .iter()
        .map(|f| format!("{} {:?}", f.kind.name(), f.ranks))
        .collect();
    let ok = match &s.fault {
        None => findings.is_empty(),
        Some(f) => {
            let e = expected(f, ranks, 8).expect("valid fault");
            findings.len() == 1 && findings[0].kind == e.kind && findings[0].ranks == e.ranks
        }
    };
    Outcome {
        token,
        ranks,
        ok,
        detail: format!(
            "seed {} onset {} factor {:.2}/{:.2} jitter {:.3}: got [{}]",
            s.spec.seed,
            s.spec.onset_step,
            s.spec.slow_factor,
            s.spec.degrade_factor,
            s.spec.jitter,
            got.join("; ")
        ),
        secs: t.elapsed().as_secs_f64(),
        records,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n_fault = arg(&args, "--scenarios", 504) as usize;
    let n_healthy = arg(&args, "--healthy", 100) as usize;
    let seed = arg(&args, "--seed", 42);
    let threads = arg(&args, "--threads", 2).max(1) as usize;
    let min = arg(&args, "--min-ranks", 1024);
    let max = arg(&args, "--max-ranks", 4096).max(min);
    let modulus = arg(&args, "--sample-modulus", 1).clamp(1, 1 << 16) as u32;
    let modulus = commscope_wire::sampling::modulus_floor(modulus);
    let mut all = scenarios(n_fault, n_healthy, seed, min, max, modulus);
    if args.iter().any(|a| a == "--only") {
        // One scenario, with its findings in full (for looking into a miss).
        let i = arg(&args, "--only", 0) as usize;
        let s = all.swap_remove(i.min(all.len() - 1));
        println!("{s:?}");
        let traces = run_virtual(s.spec.clone()).expect("sim");
        // The detectors' view of the top ranks at the end.
        let view = commscope_analyzer::batch::slow_rank_view(&traces, &Default::default());
        for x in view.iter().take(12) {
            println!(
                "rank {} share {:.4} late {:.1} ratio {:.2} blame {:.3} s",
                x.0, x.1, x.2, x.3, x.4
            );
        }
        for f in commscope_analyzer::analyze(&s.spec.job, &traces, &Default::default()) {
            println!("{}", serde_json::to_string_pretty(&f).unwrap_or_default());
        }
        return;
    }
    println!(
        "accuracy benchmark: {n_fault} fault scenarios + {n_healthy} healthy, {min}–{max} ranks, seed {seed}, {threads} threads{}",
        if modulus > 1 {
            format!(", consistent sampling 1 in {modulus}")
        } else {
            String::new()
        }
    );
    let t = Instant::now();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(s) = all.get(i) else { break };
                    let o = run(s);
                    if !o.ok {
                        eprintln!("MISS #{i} {} at {} ranks: {}", o.token, o.ranks, o.detail);
                    }
                    results.lock().unwrap_or_else(|p| p.into_inner()).push(o);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let wall = t.elapsed().as_secs_f64();
    println!(
        "{:<12} {:>9} {:>9} {:>9}",
        "fault", "scenarios", "exact", "share"
    );
    let mut total = (0, 0);
    for kind in KINDS.into_iter().chain(["healthy"]) {
        let of: Vec<&Outcome> = results
            .iter()
            .filter(|o| o.token.split(':').next() == Some(kind))
            .collect();
        let ok = of.iter().filter(|o| o.ok).count();
        if kind != "healthy" {
            total.0 += of.len();
            total.1 += ok;
        }
        println!(
            "{kind:<12} {:>9} {:>9} {:>8.1}%",
            of.len(),
            ok,
            100.0 * ok as f64 / of.len().max(1) as f64
        );
    }
    let healthy_findings = results
        .iter()
        .filter(|o| o.token == "healthy" && !o.ok)
        .count();
    let records: usize = results.iter().map(|o| o.records).sum();
    let cpu: f64 = results.iter().map(|o| o.secs).sum();
    println!(
        "faults exactly localized: {}/{} = {:.2}%; healthy scenarios with any finding: {healthy_findings}/{}",
        total.1,
        total.0,
        100.0 * total.1 as f64 / total.0.max(1) as f64,
        results.iter().filter(|o| o.token == "healthy").count()
    );
    println!(
        "{} records simulated and analyzed in {wall:.1} s wall ({cpu:.1} s summed over scenarios, {:.0} ns per record)",
        records,
        cpu * 1e9 / records.max(1) as f64
    );
}
