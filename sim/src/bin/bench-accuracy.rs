//! Accuracy benchmark of the detectors: scenarios drawn from a seed given at run time —
//! randomized job shapes (small jobs of 16–64 ranks with or without pipeline and data
//! parallelism, tensor-parallel-only jobs, large jobs), every fault token, two-fault
//! combinations and healthy jobs with noise — run in virtual time through `commscope analyze`'s
//! driver. A scenario is *exact* when every expected finding is there and nothing else: extra
//! findings count as errors.
//!
//! `bench-accuracy [--seed S] [--scenarios N] [--healthy N] [--threads T] [--max-ranks R]
//! [--sample-modulus K] [--step-ms LO-HI] [--only I]`. `--step-ms` draws each job's compute per
//! step from LO–HI ms (default 5–20; training steps are 100 ms to seconds). Tune on one seed range; report on another (docs/diagnosis.md
//! gives both).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use commscope_sim::{Fault, Rng, Spec, Topology, judge, run_virtual, simulate};

/// The classes of scenario, drawn in turn.
const CLASSES: [&str; 17] = [
    "straggler",
    "slow-node",
    "hang",
    "mismatch",
    "dead",
    "degraded",
    "degraded-from-start",
    "stall",
    "teardown",
    "freeze",
    "flaky",
    "straggler+hang",
    "dead+hang",
    "hang+hang",
    "mismatch+straggler",
    "part-node",
    "half-slow",
];

#[derive(Clone, Debug)]
struct Scenario {
    class: String,
    spec: Spec,
}

#[derive(Debug)]
struct Outcome {
    class: String,
    ranks: usize,
    ok: bool,
    detail: String,
    secs: f64,
    records: usize,
    /// A slow fault's: how long after its onset (the records' own time, s) its finding opened.
    named_after_s: Option<f64>,
}

/// The classes whose fault acts from its onset step on and is named from accumulated evidence:
/// their time to a verdict is the detectors' latency.
const TIMED: [&str; 6] = [
    "straggler",
    "slow-node",
    "flaky",
    "degraded",
    "part-node",
    "half-slow",
];

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

/// A job shape: (ranks, ranks per node, tp, pp).
fn shape(rng: &mut Rng, max_ranks: u64) -> (usize, usize, usize, usize) {
    match rng.below(4) {
        // Small, no pipeline, tensor parallelism over a node, data parallelism across.
        0 => (8 * (2 + rng.below(7) as usize), 8, 8, 1),
        // Small, tensor-parallel pairs and data parallelism (and sometimes 2 stages).
        1 => {
            let ranks = 8 * (2 + rng.below(7) as usize);
            let pp = if rng.below(2) == 0 && (ranks / 2).is_multiple_of(2) {
                2
            } else {
                1
            };
            (ranks, 8, 2, pp)
        }
        // Tensor-parallel only: one group over the whole job.
        2 => {
            let ranks = 8 * (2 + rng.below(3) as usize);
            (ranks, 8, ranks, 1)
        }
        // Large, the default shape (pipeline of 4 when it fits).
        _ => {
            let nodes = 32 + rng.below(max_ranks.max(256) / 8 - 31);
            ((nodes * 8) as usize, 8, 0, 0)
        }
    }
}

fn scenarios(
    n_fault: usize,
    n_healthy: usize,
    seed: u64,
    max_ranks: u64,
    modulus: u32,
    step_ms: (f64, f64),
) -> Vec<Scenario> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    for i in 0..n_fault + n_healthy {
        let (ranks, per_node, tp, pp) = shape(&mut rng, max_ranks);
        let topo = Topology::new(ranks, per_node, tp, pp).expect("a valid shape");
        let class = if i < n_fault {
            CLASSES[i % CLASSES.len()]
        } else {
            "healthy"
        };
        let steps = 24 * u64::from(modulus.div_ceil(2).max(1));
        let onset = 6 + rng.below(5);
        let last_seq = steps - 4;
        let pick = |rng: &mut Rng| rng.below(ranks as u64) as i32;
        let seq = onset + rng.below(last_seq - onset);
        // With a straggler, the other fault comes once it has been slow for a while.
        let steps = if class.starts_with("straggler") || class.ends_with("straggler") {
            steps.max(onset + 30)
        } else {
            steps
        };
        let seq = if steps > 24 * u64::from(modulus.div_ceil(2).max(1)) {
            onset + 16 + rng.below(8)
        } else {
            seq
        };
        let a = pick(&mut rng);
        let mut b = pick(&mut rng);
        while b == a {
            b = pick(&mut rng);
        }
        let one = |c: &str, r: i32, rng: &mut Rng| -> Fault {
            match c {
                "straggler" => Fault::Straggler { rank: r },
                "slow-node" => Fault::SlowNode {
                    node: topo.node_name(rng.below(topo.nodes as u64) as usize),
                },
                "hang" => Fault::Hang {
                    rank: r,
                    seq: Some(seq),
                },
                "mismatch" => Fault::Mismatch {
                    rank: r,
                    seq: Some(seq),
                },
                "dead" => Fault::Dead {
                    rank: r,
                    seq: Some(seq),
                },
                "degraded" => Fault::Degraded { from: None },
                // Every cross-node transfer slow from the first step: nothing healthy in the
                // job to compare with.
                "degraded-from-start" => Fault::Degraded { from: Some(0) },
                "stall" => Fault::Stall { seq: Some(seq) },
                "teardown" => Fault::Teardown {
                    rank: r,
                    seq: Some(seq),
                },
                "freeze" => Fault::Freeze {
                    rank: r,
                    seq: Some(seq),
                },
                _ => Fault::Flaky {
                    rank: r,
                    every: 2 + rng.below(3),
                },
            }
        };
        let faults: Vec<Fault> = match class {
            "healthy" => vec![],
            // Half the ranks of one node (the first, last or every other).
            "part-node" => {
                let n = rng.below(topo.nodes as u64) as usize;
                let ranks: Vec<usize> = topo.node_ranks(n).collect();
                let half = ranks.len() / 2;
                let pick: Vec<usize> = match rng.below(3) {
                    0 => ranks[..half].to_vec(),
                    1 => ranks[half..].to_vec(),
                    _ => ranks.iter().copied().step_by(2).collect(),
                };
                pick.into_iter()
                    .map(|r| Fault::Straggler { rank: r as i32 })
                    .collect()
            }
            // Half the job's nodes (at least one).
            "half-slow" => (0..topo.nodes.div_ceil(2))
                .map(|n| Fault::SlowNode {
                    node: topo.node_name(n),
                })
                .collect(),
            c => {
                let parts: Vec<&str> = c.split('+').collect();
                let mut v = vec![one(parts[0], a, &mut rng)];
                if let Some(p) = parts.get(1) {
                    v.push(one(p, b, &mut rng));
                }
                v
            }
        };
        let spec = Spec {
            job: format!("bench-{i}"),
            ranks,
            per_node,
            tp,
            pp,
            steps,
            seed: rng.next_u64(),
            faults,
            onset_step: onset,
            // Effects from the documented minimum up: 1.3 for a rank slow at every step, the
            // token's default 1.5 for one slow one step in several.
            slow_factor: if class == "flaky" {
                1.5 + 0.5 * rng.unit()
            } else {
                1.3 + 0.7 * rng.unit()
            },
            // From the first step only the line rate is a reference: what it can tell (below a
            // quarter of a rank's share; the simulated transport reaches 80 % of it) is a
            // slowdown beyond 3.2, here 4-8.
            degrade_factor: if class == "degraded-from-start" {
                4.0 + 4.0 * rng.unit()
            } else {
                2.5 + 2.5 * rng.unit()
            },
            jitter: 0.01 + 0.03 * rng.unit(),
            skew: 0.01 * rng.unit(),
            exit_spread_ns: 5_000 + rng.below(55_000),
            compute_ms: step_ms.0 + (step_ms.1 - step_ms.0) * rng.unit(),
            sample_modulus: modulus,
            ..Default::default()
        };
        let mut spec = spec;
        if class.starts_with("degraded") {
            // A slow transport is reported once it held for the detector's sustain time (a
            // burst of contention is not one): these jobs run training-sized steps, at least
            // 100–300 ms of compute, for at least 10 s after the onset.
            let (lo, hi) = (step_ms.0.max(100.0), step_ms.1.max(300.0));
            let u = (spec.compute_ms - step_ms.0) / (step_ms.1 - step_ms.0).max(1e-9);
            spec.compute_ms = lo + (hi - lo) * u;
            spec.steps = spec
                .steps
                .max(spec.onset_step + (10_000.0 / spec.compute_ms).ceil() as u64);
        }
        out.push(Scenario {
            class: class.to_owned(),
            spec,
        });
    }
    out
}

fn run(s: &Scenario) -> Outcome {
    let t = Instant::now();
    let ranks = s.spec.ranks;
    let tokens: Vec<String> = s.spec.faults.iter().map(Fault::token).collect();
    let fail = |detail: String| Outcome {
        class: s.class.clone(),
        ranks,
        ok: false,
        detail,
        secs: 0.0,
        records: 0,
        named_after_s: None,
    };
    let topo = match Topology::new(ranks, s.spec.per_node, s.spec.tp, s.spec.pp) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let (traces, effective) = match simulate(s.spec.clone()) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    // A fault hidden behind another (its rank blocked before it struck) is not expected.
    let want = match effective.expected(&topo) {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let records = traces.iter().map(|t| t.records.len()).sum();
    let findings = commscope_analyzer::analyze(&s.spec.job, &traces, &Default::default());
    let found: Vec<_> = findings.iter().map(|f| (f.kind, f.ranks.clone())).collect();
    let v = judge(&want, &found);
    let onset_ns = effective
        .step_began_ns
        .get(s.spec.onset_step as usize)
        .copied();
    let named_after_s = onset_ns
        .filter(|_| TIMED.contains(&s.class.as_str()))
        .and_then(|onset| {
            findings
                .iter()
                .filter(|f| want.iter().any(|e| e.matches(f.kind, &f.ranks)))
                .map(|f| {
                    // A degraded collective's `opened_at` is when it began; it is reported
                    // once it lasted the sustain time.
                    let held = if f.kind == commscope_analyzer::Kind::DegradedCollective {
                        commscope_analyzer::stream::Tuning::default().degraded_sustain_s
                    } else {
                        0.0
                    };
                    f.opened_at.saturating_sub(onset) as f64 / 1e9 + held
                })
                .min_by(f64::total_cmp)
        });
    Outcome {
        class: s.class.clone(),
        ranks,
        ok: v.exact(),
        detail: format!(
            "[{}] tp {} pp {} seed {} onset {} factor {:.2}/{:.2} jitter {:.3} skew {:.3}: missing [{}], extra [{}]",
            tokens.join(" "),
            topo.tp,
            topo.stages,
            s.spec.seed,
            s.spec.onset_step,
            s.spec.slow_factor,
            s.spec.degrade_factor,
            s.spec.jitter,
            s.spec.skew,
            v.missing
                .iter()
                .map(|i| format!("{} {:?}", want[*i].kinds_phrase(), want[*i].ranks))
                .collect::<Vec<_>>()
                .join("; "),
            v.extra
                .iter()
                .map(|(k, r)| format!("{} {r:?}", k.name()))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        secs: t.elapsed().as_secs_f64(),
        records,
        named_after_s,
    }
}

/// The `q` quantile (0–1) of `v` (sorted here), nearest rank.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len().max(1)) - 1;
    v.get(i).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n_fault = arg(&args, "--scenarios", 280) as usize;
    let n_healthy = arg(&args, "--healthy", 200) as usize;
    let seed = arg(&args, "--seed", 1);
    let threads = arg(&args, "--threads", 2).max(1) as usize;
    let max_ranks = arg(&args, "--max-ranks", 1024);
    let modulus = arg(&args, "--sample-modulus", 1).clamp(1, 1 << 16) as u32;
    let modulus = commscope_wire::sampling::modulus_floor(modulus);
    let step_ms = match args.iter().position(|a| a == "--step-ms") {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<f64>().ok()?, b.parse::<f64>().ok()?)))
            .filter(|(a, b)| *a > 0.0 && b >= a)
            .unwrap_or_else(|| panic!("--step-ms takes LO-HI in ms, e.g. 100-300")),
        None => (5.0, 20.0),
    };
    let mut all = scenarios(n_fault, n_healthy, seed, max_ranks, modulus, step_ms);
    if args.iter().any(|a| a == "--only") {
        // One scenario, with its findings in full (for looking into a miss).
        let i = arg(&args, "--only", 0) as usize;
        let s = all.swap_remove(i.min(all.len() - 1));
        println!("{s:?}");
        let traces = run_virtual(s.spec.clone()).expect("sim");
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
        "accuracy benchmark: seed {seed}: {n_fault} fault scenarios + {n_healthy} healthy, 16–{max_ranks} ranks, {}–{} ms of compute per step, {threads} threads{}",
        step_ms.0,
        step_ms.1,
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
                        eprintln!("MISS #{i} {} at {} ranks: {}", o.class, o.ranks, o.detail);
                    }
                    results.lock().unwrap_or_else(|p| p.into_inner()).push(o);
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    let wall = t.elapsed().as_secs_f64();
    println!(
        "{:<20} {:>9} {:>9} {:>9}   named after onset (records' time): median / p90 / max",
        "scenario", "jobs", "exact", "share"
    );
    let mut total = (0, 0);
    for class in CLASSES.into_iter().chain(["healthy"]) {
        let of: Vec<&Outcome> = results.iter().filter(|o| o.class == class).collect();
        let ok = of.iter().filter(|o| o.ok).count();
        if class != "healthy" {
            total.0 += of.len();
            total.1 += ok;
        }
        let mut after: Vec<f64> = of.iter().filter_map(|o| o.named_after_s).collect();
        let timing = if after.is_empty() {
            String::new()
        } else {
            format!(
                "   {:.1} / {:.1} / {:.1} s",
                quantile(&mut after, 0.5),
                quantile(&mut after, 0.9),
                quantile(&mut after, 1.0)
            )
        };
        println!(
            "{class:<20} {:>9} {:>9} {:>8.1}%{timing}",
            of.len(),
            ok,
            100.0 * ok as f64 / of.len().max(1) as f64
        );
    }
    let healthy: Vec<&Outcome> = results.iter().filter(|o| o.class == "healthy").collect();
    let noisy = healthy.iter().filter(|o| !o.ok).count();
    let records: usize = results.iter().map(|o| o.records).sum();
    let cpu: f64 = results.iter().map(|o| o.secs).sum();
    println!(
        "faults exact (every expected finding, nothing else): {}/{} = {:.2}%; healthy jobs with any finding: {noisy}/{}",
        total.1,
        total.0,
        100.0 * total.1 as f64 / total.0.max(1) as f64,
        healthy.len()
    );
    println!(
        "{records} records simulated and analyzed in {wall:.1} s wall ({cpu:.1} s summed over scenarios)"
    );
    if args.iter().any(|a| a == "--check") && (total.1 < total.0 || noisy > 0) {
        std::process::exit(1);
    }
}
