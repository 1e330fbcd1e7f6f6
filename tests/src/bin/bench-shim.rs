//! Benchmarks of the shim's cost (a separate command, never part of the test suite):
//!
//! 1. Added cost per intercepted call: `MPI_Allreduce` of one int on `MPI_COMM_SELF`, millions of
//!    times, with and without the shim, in interleaved runs; reports the median per-call time of
//!    each and the median of the paired differences.
//!    (No trace directory and no agent: the "counters only" mode.)
//! 2. A real `MPI_Allreduce` loop over several ranks (8 B and 1 MiB), with and without the shim
//!    (writing its trace file), in interleaved pairs; reports the mean ratio with its 95 %
//!    confidence interval.
//!
//! 3. Nanoseconds added per iteration of rank 0's timed loop, end to end: the job runs under
//!    `commscope run --trace-dir` (the shim preloaded by the launcher, writing its trace) or
//!    plainly, in interleaved pairs; the per-pair differences give a mean and its 95 % interval.
//!    Two programs: `tests/c/bench_allreduce.c` (2 ranks, 8 B, one rank per core; `added`) and
//!    the Intel MPI Benchmarks' `IMB-MPI1 Allreduce` at 8 B on 2 and 4 ranks (`imb`; built by
//!    `scripts/bench.sh` into `$COMMSCOPE_IMB_DIR/<flavour>/IMB-MPI1`).
//!
//! Run: `scripts/bench.sh [--ranks N] [--pairs P] [--scale K] [--only PARTS] [--flavours F]`
//! (defaults: 8 ranks, 20 pairs; `--scale` multiplies the loop lengths; `--only` takes a
//! comma-separated subset of `self` (per-call cost), `two` (one rank per core), `many` (`--ranks`
//! ranks, Open MPI), `added`, `imb`; `--flavours` a subset of `openmpi,mpich`;
//! `--only-many-ranks` is `--only many --flavours openmpi`). Nothing else should run on the
//! machine meanwhile.

use std::path::{Path, PathBuf};
use std::process::Command;

use commscope_tests::{Flavour, Mpi};

fn release_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("exe");
    let dir = exe.parent().expect("dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.parent().expect("up").to_path_buf()
    } else {
        dir
    }
}

fn compile(mpi: &Mpi, name: &str, out: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("c")
        .join(format!("{name}.c"));
    let exe = out.join(name);
    mpi.compile(&src, &exe).unwrap_or_else(|e| panic!("{e:#}"));
    exe
}

/// The launcher's arguments for `ranks` ranks: one rank per core polls; more ranks than cores
/// must yield or they starve each other.
fn launcher_args(mpi: &Mpi, ranks: u32) -> Vec<String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1);
    let mut args = mpi.launcher_args.clone();
    if ranks <= cores
        && let Some(i) = args.iter().position(|a| a == "mpi_yield_when_idle")
    {
        args[i + 1] = "0".into();
    }
    args
}

/// Runs a benchmark program, with the shim preloaded when `shim` is given, writing its trace to
/// `trace` (deleted afterwards) when given.
fn run(
    mpi: &Mpi,
    ranks: u32,
    exe: &Path,
    args: &[String],
    shim: Option<&Path>,
    trace: Option<&Path>,
) -> String {
    let mut cmd = Command::new(&mpi.launcher);
    cmd.args(launcher_args(mpi, ranks));
    let flavour_flag = if mpi.name == "Open MPI" {
        "-x"
    } else {
        "-genv"
    };
    if let Some(s) = shim {
        if flavour_flag == "-x" {
            cmd.arg("-x").arg(format!("LD_PRELOAD={}", s.display()));
            cmd.arg("-x").arg("COMMSCOPE_JOB_ID=bench");
        } else {
            cmd.arg("-genv").arg("LD_PRELOAD").arg(s);
            cmd.arg("-genv").arg("COMMSCOPE_JOB_ID").arg("bench");
        }
    }
    if let (Some(_), Some(t)) = (shim, trace) {
        if flavour_flag == "-x" {
            cmd.arg("-x")
                .arg(format!("COMMSCOPE_TRACE_DIR={}", t.display()));
        } else {
            cmd.arg("-genv").arg("COMMSCOPE_TRACE_DIR").arg(t);
        }
    }
    cmd.arg("-np").arg(ranks.to_string()).arg(exe).args(args);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    cmd.env_remove("COMMSCOPE_TRACE_DIR")
        .env_remove("LD_PRELOAD");
    let o = cmd.output().expect("run benchmark");
    if let Some(t) = trace {
        let _ = std::fs::remove_dir_all(t);
    }
    assert!(
        o.status.success(),
        "benchmark failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// What a traced job's files hold: (records written, records dropped because the ring was full).
type Kept = (u64, u64);

/// Runs a job under `commscope run --trace-dir` (the shim preloaded, writing its trace, as a
/// user runs it) or, without `commscope`, plainly; returns its standard output and, traced,
/// what its trace kept.
fn run_job(
    mpi: &Mpi,
    ranks: u32,
    exe: &Path,
    args: &[&str],
    commscope: Option<&Path>,
    trace: &Path,
) -> (String, Option<Kept>) {
    let mut cmd = match commscope {
        Some(cs) => {
            let mut c = Command::new(cs);
            c.arg("run")
                .arg("--trace-dir")
                .arg(trace)
                .arg("--job-id")
                .arg("bench")
                .arg("--")
                .arg(&mpi.launcher);
            c
        }
        None => Command::new(&mpi.launcher),
    };
    cmd.args(launcher_args(mpi, ranks))
        .arg("-np")
        .arg(ranks.to_string())
        .arg(exe)
        .args(args)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("COMMSCOPE_TRACE_DIR")
        .env_remove("COMMSCOPE_AGENT_SOCKET")
        .env_remove("LD_PRELOAD");
    let o = cmd.output().expect("run benchmark job");
    assert!(
        o.status.success(),
        "benchmark job failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let kept = commscope.and_then(|cs| {
        let s = Command::new(cs)
            .args(["trace", "summary", "--format", "json"])
            .arg(trace)
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&s.stdout).ok()?;
        Some((v["records"].as_u64()?, v["dropped"]["ring_full"].as_u64()?))
    });
    let _ = std::fs::remove_dir_all(trace);
    (String::from_utf8_lossy(&o.stdout).into_owned(), kept)
}

/// Mean and 95 % half-interval (Student's t) of a sample.
fn mean_ci(v: &[f64]) -> (f64, f64) {
    let n = v.len();
    let mean = v.iter().sum::<f64>() / n as f64;
    let sd = (v.iter().map(|r| (r - mean).powi(2)).sum::<f64>()
        / (n.saturating_sub(1)).max(1) as f64)
        .sqrt();
    (mean, t975(n.saturating_sub(1)) * sd / (n as f64).sqrt())
}

/// Interleaved pairs of plain and `commscope run` jobs; `per_iter` turns a job's output into ns
/// per iteration. Prints one line: the means, and the added ns per iteration with its interval.
fn added_per_iteration(
    label: &str,
    pairs: u32,
    job: impl Fn(Option<&Path>) -> (String, Option<Kept>),
    per_iter: impl Fn(&str) -> Option<f64>,
    commscope: &Path,
) {
    let (mut plain, mut with, mut added) = (Vec::new(), Vec::new(), Vec::new());
    let (mut written, mut dropped) = (0u64, 0u64);
    let mut traced = || {
        let (out, kept) = job(Some(commscope));
        if let Some((w, d)) = kept {
            written += w;
            dropped += d;
        }
        per_iter(&out)
    };
    for i in 0..pairs {
        // Alternate which goes first, so drift affects both equally.
        let (w, p) = if i % 2 == 0 {
            let p = per_iter(&job(None).0);
            (traced(), p)
        } else {
            let w = traced();
            (w, per_iter(&job(None).0))
        };
        if let (Some(w), Some(p)) = (w, p) {
            plain.push(p);
            with.push(w);
            added.push(w - p);
        }
    }
    let (mp, _) = mean_ci(&plain);
    let (mw, _) = mean_ci(&with);
    let (ma, h) = mean_ci(&added);
    println!(
        "{label}: {mp:.1} ns/iteration without, {mw:.1} with commscope run --trace-dir: {ma:+.1} ns added per iteration (95% CI {:+.1} .. {:+.1}, {} interleaved pairs); the traces kept {:.1} % of the records ({written} written, {dropped} dropped: ring full)",
        ma - h,
        ma + h,
        added.len(),
        100.0 * written as f64 / (written + dropped).max(1) as f64
    );
}

/// IMB's average time per call at 8 bytes, in ns (its `t_avg[usec]` column).
fn imb_ns(out: &str) -> Option<f64> {
    out.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.len() >= 5 && w[0] == "8").then(|| w[4].parse::<f64>().ok().map(|us| us * 1000.0))?
    })
}

fn values(out: &str, key: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.strip_prefix(key))
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Two-sided 97.5 % quantile of Student's t for `df` degrees of freedom.
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    if df == 0 {
        f64::INFINITY
    } else {
        T.get(df - 1).copied().unwrap_or(1.96)
    }
}

fn arg(name: &str, default: u32) -> u32 {
    u32::try_from(commscope_tests::bench::arg(name, u64::from(default))).unwrap_or(default)
}

fn list_arg(name: &str, default: &str) -> Vec<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, String::as_str)
        .split(',')
        .map(str::to_owned)
        .collect()
}

fn main() {
    let shim = release_dir().join("libcommscope.so");
    assert!(
        shim.is_file(),
        "{} missing: run `cargo build --release` first",
        shim.display()
    );
    let ranks = arg("--ranks", 8);
    let pairs = arg("--pairs", 20);
    let work = tempfile::tempdir().expect("tempdir");
    println!(
        "commscope shim benchmark ({}; {} cores)",
        shim.display(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );

    let scale = u64::from(arg("--scale", 1).max(1));
    let only_many = std::env::args().any(|a| a == "--only-many-ranks");
    let parts = list_arg(
        "--only",
        if only_many {
            "many"
        } else {
            "self,two,many,added,imb"
        },
    );
    let commscope = release_dir().join("commscope");
    let part = |p: &str| parts.iter().any(|x| x == p);
    let flavours: Vec<Flavour> = list_arg(
        "--flavours",
        if only_many {
            "openmpi"
        } else {
            "openmpi,mpich"
        },
    )
    .iter()
    .map(|f| match f.as_str() {
        "openmpi" => Flavour::OpenMpi,
        "mpich" => Flavour::Mpich,
        other => panic!("unknown MPI flavour {other:?} (openmpi, mpich)"),
    })
    .collect();
    for flavour in flavours {
        let mpi = flavour.mpi();
        let dir = work.path().join(flavour.name());
        std::fs::create_dir_all(&dir).expect("mkdir");
        let bench_self = compile(&mpi, "bench_self", &dir);
        let bench_ar = compile(&mpi, "bench_allreduce", &dir);
        // Real loops run as in production: the shim writes its trace file.
        let trace = dir.join("trace");

        // 1. Per-call overhead, interleaved runs of 10 windows x 1M calls.
        if part("self") {
            let (mut with, mut without, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..6 {
                let args = ["1000000".to_owned(), "10".to_owned()];
                let mut b = values(&run(&mpi, 1, &bench_self, &args, None, None), "ns_per_call");
                let mut a = values(
                    &run(&mpi, 1, &bench_self, &args, Some(&shim), None),
                    "ns_per_call",
                );
                diffs.push(median(&mut a.clone()) - median(&mut b.clone()));
                with.append(&mut a);
                without.append(&mut b);
            }
            let (mw, mwo, md) = (median(&mut with), median(&mut without), median(&mut diffs));
            println!(
                "{}: MPI_Allreduce(1 int, MPI_COMM_SELF): {:.1} ns/call without, {:.1} ns/call with the shim: {:.1} ns added per call (median of {} paired runs of 10M calls)",
                mpi.name,
                mwo,
                mw,
                md,
                diffs.len()
            );
        }

        // 3. Nanoseconds added per iteration, end to end, under `commscope run --trace-dir`.
        let trace_dir = dir.join("added-trace");
        if part("added") {
            let iters = 400_000 * scale;
            let args = ["8".to_owned(), iters.to_string()];
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            added_per_iteration(
                &format!("{}: bench_allreduce, 2 ranks, 8 B x {iters}", mpi.name),
                pairs,
                |cs| run_job(&mpi, 2, &bench_ar, &args, cs, &trace_dir),
                |out| {
                    values(out, "seconds")
                        .first()
                        .map(|s| s * 1e9 / iters as f64)
                },
                &commscope,
            );
        }
        if part("imb") {
            let imb_dir = std::env::var_os("COMMSCOPE_IMB_DIR")
                .map_or_else(|| PathBuf::from("/var/cache/commscope/imb"), PathBuf::from);
            let imb = imb_dir.join(flavour.name()).join("IMB-MPI1");
            assert!(
                imb.is_file(),
                "{} missing: scripts/bench.sh builds it",
                imb.display()
            );
            for ranks in [2u32, 4] {
                // Four ranks share two cores: Open MPI's yield while idle, MPICH's busy polling
                // (milliseconds per call), so fewer iterations.
                let base = match (ranks, flavour) {
                    (2, _) => 200_000,
                    (_, Flavour::OpenMpi) => 50_000,
                    _ => 2_000,
                };
                let iters = (base * scale).to_string();
                let args = [
                    "Allreduce",
                    "-msglog",
                    "3:3",
                    "-iter",
                    &iters,
                    "-time",
                    "60",
                    "-npmin",
                    &ranks.to_string(),
                ]
                .map(str::to_owned);
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                added_per_iteration(
                    &format!(
                        "{}: IMB-MPI1 Allreduce, {ranks} ranks, 8 B x {iters}",
                        mpi.name
                    ),
                    pairs,
                    |cs| run_job(&mpi, ranks, &imb, &args, cs, &trace_dir),
                    imb_ns,
                    &commscope,
                );
            }
        }

        // 2. Real all-reduce loops, interleaved pairs: one rank per core (stable timings), and
        // eight ranks on the cores (Open MPI, yielding while idle; MPICH's busy-polling ranks
        // cannot share cores usefully).
        let mut configs = if part("two") {
            vec![(2u32, 8u64, 500_000u64), (2u32, 1 << 20, 1_000)]
        } else {
            vec![]
        };
        if flavour == Flavour::OpenMpi && part("many") {
            configs.push((ranks, 8, 20_000));
            configs.push((ranks, 1 << 20, 300));
        }
        for (ranks, bytes, iters) in configs {
            let iters = iters * scale;
            let args = [bytes.to_string(), iters.to_string()];
            let mut ratios = Vec::new();
            for i in 0..pairs {
                // Alternate which goes first, so drift affects both equally.
                let (a, b) = if i % 2 == 0 {
                    let b = values(&run(&mpi, ranks, &bench_ar, &args, None, None), "seconds");
                    let a = values(
                        &run(&mpi, ranks, &bench_ar, &args, Some(&shim), Some(&trace)),
                        "seconds",
                    );
                    (a, b)
                } else {
                    let a = values(
                        &run(&mpi, ranks, &bench_ar, &args, Some(&shim), Some(&trace)),
                        "seconds",
                    );
                    let b = values(&run(&mpi, ranks, &bench_ar, &args, None, None), "seconds");
                    (a, b)
                };
                if let (Some(a), Some(b)) = (a.first(), b.first()) {
                    ratios.push(a / b);
                }
            }
            let n = ratios.len();
            let mean = ratios.iter().sum::<f64>() / n as f64;
            let sd = (ratios.iter().map(|r| (r - mean).powi(2)).sum::<f64>()
                / (n.saturating_sub(1)).max(1) as f64)
                .sqrt();
            let half = t975(n - 1) * sd / (n as f64).sqrt();
            println!(
                "{}: {ranks}-rank MPI_Allreduce {bytes} B x {iters}: time ratio with/without shim = {mean:.4} (95% CI {:.4} .. {:.4}, {n} interleaved pairs)",
                mpi.name,
                mean - half,
                mean + half
            );
        }
    }
}
