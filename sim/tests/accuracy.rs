//! Small runs of the accuracy benchmark (`bench-accuracy`, docs/diagnosis.md).

use std::process::Command;

/// Runs `bench-accuracy` with `args`: its verdict line, "faults exact (…): 116/119 = 97.48%;
/// healthy jobs with any finding: 0/40", with the faults found exactly; stderr names each miss.
fn bench(args: &[&str]) -> (String, u32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_bench-accuracy"))
        .args(args)
        .output()
        .expect("run bench-accuracy");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("faults exact"))
        .unwrap_or_else(|| panic!("no verdict line:\n{stdout}"))
        .to_owned();
    let exact: u32 = line
        .split(": ")
        .nth(1)
        .and_then(|x| x.split('/').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    eprintln!("{line}\n{stderr}");
    (line, exact, stderr)
}

/// 119 scenarios of every class and 40 healthy jobs drawn from a fixed seed. The full runs
/// (850 scenarios per seed) reach 99.6 % exact; this one, with smaller jobs, must stay at 95 %
/// exact or better (a missing or an extra finding is a miss), and healthy jobs must give no
/// finding.
#[test]
fn a_small_accuracy_run_is_exact_nearly_always_and_healthy_jobs_are_quiet() {
    let (line, exact, stderr) = bench(&[
        "--seed",
        "77",
        "--scenarios",
        "119",
        "--healthy",
        "40",
        "--max-ranks",
        "256",
    ]);
    assert!(exact >= 113, "{line}\n{stderr}");
    assert!(
        line.ends_with("healthy jobs with any finding: 0/40"),
        "{line}\n{stderr}"
    );
}

/// 120 healthy jobs of at most 128 ranks from `seed`, run with `extra` arguments: none may give
/// a finding.
fn healthy_jobs_are_quiet(seed: &str, extra: &[&str]) {
    let mut args = vec![
        "--seed",
        seed,
        "--scenarios",
        "0",
        "--healthy",
        "120",
        "--max-ranks",
        "128",
    ];
    args.extend_from_slice(extra);
    let (line, _, stderr) = bench(&args);
    assert!(
        line.ends_with("healthy jobs with any finding: 0/120"),
        "{line}\n{stderr}"
    );
}

/// Healthy jobs whose calls are sampled 1 in 8, as agents and a pressed collector sample: each
/// instance seen weighs for eight, and a rank's share swings with the few it has. Without the
/// sampling error in slow-rank's test, 4 of these 120 jobs got a finding.
#[test]
fn healthy_jobs_sampled_one_in_eight_are_quiet() {
    healthy_jobs_are_quiet("78", &["--sample-modulus", "8"]);
}

/// Healthy jobs with training-sized steps (300–1000 ms of compute per micro-batch, steps of
/// seconds): a 5 s window holds a few instances, and the rank last in two of them by chance
/// had a share over the threshold. Without the blame's own spread in slow-rank's test, 7 of
/// these 120 jobs got a finding.
#[test]
fn healthy_jobs_with_long_steps_are_quiet() {
    healthy_jobs_are_quiet("79", &["--step-ms", "300-1000"]);
}

/// Every class of fault with 100–300 ms of compute per micro-batch: found as exactly as with
/// short steps (118 of 119 measured; 116 before slow-rank weighed the spread of its evidence,
/// with extra findings).
#[test]
fn faults_in_jobs_with_long_steps_are_found_exactly() {
    let (line, exact, stderr) = bench(&[
        "--seed",
        "80",
        "--scenarios",
        "119",
        "--healthy",
        "0",
        "--max-ranks",
        "256",
        "--step-ms",
        "100-300",
    ]);
    assert!(exact >= 113, "{line}\n{stderr}");
}
