//! The Grafana dashboards and the Prometheus alert rules under `dashboards/`, checked against
//! the registries and against real data: a real Prometheus scrapes a real collector and a real
//! agent while `commscope simulate` feeds the collector a healthy job, a job with a straggler
//! and a job with a hang, and a real MPI job runs through the agent. Every panel query must
//! return data, every series an alert uses must exist, and the hang and straggler alerts must
//! fire on their jobs and stay quiet on the healthy one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use commscope_tests::prometheus::Prometheus;
use commscope_tests::services::{Service, Services, run_with_agent};
use commscope_tests::{Flavour, build, launch, wait};

fn dashboards_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dashboards")
}

/// Every dashboard: (file name, JSON).
fn dashboards() -> Vec<(String, serde_json::Value)> {
    let mut v: Vec<(String, serde_json::Value)> = std::fs::read_dir(dashboards_dir())
        .expect("dashboards/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read");
            let json =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (
                p.file_name().expect("name").to_string_lossy().into_owned(),
                json,
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Every panel query: (dashboard, panel title, expression).
fn panel_queries() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (file, d) in dashboards() {
        for p in d["panels"].as_array().expect("panels") {
            for t in p["targets"].as_array().expect("targets") {
                out.push((
                    file.clone(),
                    p["title"].as_str().expect("title").to_owned(),
                    t["expr"].as_str().expect("expr").to_owned(),
                ));
            }
        }
    }
    out
}

/// The alert rules: (name, expression), read from `alerts.yaml`'s `- alert:` / `expr:` lines.
fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(dashboards_dir().join("alerts.yaml")).expect("alerts.yaml");
    let mut out = Vec::new();
    let mut name = None;
    for l in text.lines().map(str::trim) {
        if let Some(n) = l.strip_prefix("- alert:") {
            name = Some(n.trim().to_owned());
        } else if let (Some(e), Some(n)) = (l.strip_prefix("expr:"), name.take()) {
            out.push((n, e.trim().to_owned()));
        }
    }
    out
}

/// The metric names an expression uses (`commscope_*`, `process_*`, `up`).
fn metrics_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &expr[start..i];
            // Not a label name (followed by = or !=, or inside by (...)), not in a string.
            let quoted = expr[..start].matches('"').count() % 2 == 1;
            if !quoted
                && (word.starts_with("commscope_") || word.starts_with("process_") || word == "up")
            {
                out.insert(word.to_owned());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// A series name's family in the registry (histograms: without `_bucket`, `_sum`, `_count`).
fn family(name: &str) -> &str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix)
            && (base.ends_with("_seconds") || base.ends_with("_bytes"))
        {
            return base;
        }
    }
    name
}

const PROCESS: &[&str] = &[
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_threads",
    "process_start_time_seconds",
];

#[test]
fn dashboards_use_only_registered_metrics_and_carry_their_variables() {
    let known: BTreeSet<&str> = commscope_collector::metrics::CATALOG
        .iter()
        .chain(commscope_agent::metrics::CATALOG)
        .map(|d| d.name)
        .chain(PROCESS.iter().copied())
        .chain(["up"])
        .collect();
    let boards = dashboards();
    let uids: Vec<&str> = boards
        .iter()
        .map(|(_, d)| d["uid"].as_str().expect("uid"))
        .collect();
    assert_eq!(
        uids,
        [
            "commscope-overview",
            "commscope-fabric",
            "commscope-job",
            "commscope-self"
        ],
        "stable uids, one per dashboard"
    );
    for (file, d) in &boards {
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .expect("templating")
            .iter()
            .map(|v| v["name"].as_str().expect("name"))
            .collect();
        assert_eq!(
            vars,
            ["datasource", "job_id", "comm", "node", "rank"],
            "{file}"
        );
        for p in d["panels"].as_array().expect("panels") {
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{file}: {}",
                p["title"]
            );
            assert!(
                p["description"].as_str().is_some_and(|s| !s.is_empty()),
                "{file}: {} has no description",
                p["title"]
            );
        }
    }
    let mut used = 0;
    for (file, title, expr) in panel_queries() {
        let names = metrics_in(&expr);
        assert!(!names.is_empty(), "{file}: {title}: no metric in {expr}");
        for n in names {
            used += 1;
            assert!(
                known.contains(family(&n)),
                "{file}: {title}: {n} is not in the registries"
            );
        }
    }
    assert!(used > 40, "{used}");
    let rules = alert_rules();
    assert_eq!(rules.len(), 6, "{rules:?}");
    for (name, expr) in rules {
        for n in metrics_in(&expr) {
            assert!(
                known.contains(family(&n)),
                "{name}: {n} is not in the registries"
            );
        }
    }
}

#[test]
fn promtool_checks_and_unit_tests_the_alert_rules() {
    for args in [
        vec!["check", "rules", "alerts.yaml"],
        vec!["test", "rules", "alerts.test.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(dashboards_dir())
            .output()
            .expect("promtool is installed (scripts/setup.sh)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The alert rules with their `for:` cut to 5 s (the expressions untouched), written to `dir`.
fn quick_rules(dir: &Path) -> PathBuf {
    let rules = std::fs::read_to_string(dashboards_dir().join("alerts.yaml")).expect("rules");
    let rules: String = rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for:") {
            Some(_) => format!("{}for: 5s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::create_dir_all(dir).expect("mkdir");
    let path = dir.join("alerts.yaml");
    std::fs::write(&path, rules).expect("rules");
    path
}

fn simulate(svc: &Services, job: &str, faults: &[&str]) -> Service {
    let mut c = commscope_tests::commscope();
    c.args(["simulate", "--collector"])
        .arg(format!("http://{}", svc.grpc))
        .args([
            "--ranks",
            "16",
            "--duration",
            "240",
            "--links",
            "--job-id",
            job,
        ]);
    for f in faults {
        c.args(["--fault", f]);
    }
    Service::spawn(c, "simulate")
}

/// A Grafana expression with its variables set as "All" (and the rate window) would be.
fn instantiate(expr: &str) -> String {
    expr.replace("$__rate_interval", "30s")
        .replace("$job_id", ".*")
        .replace("$comm", ".*")
        .replace("$node", ".*")
        .replace("$rank", ".*")
}

#[test]
fn every_panel_has_data_and_the_alerts_fire_on_the_faulty_jobs_only() {
    let svc = Services::start("node-dash", &[], &[]);
    let _healthy = simulate(&svc, "dash-healthy", &[]);
    let _straggler = simulate(&svc, "dash-straggler", &["straggler:5"]);
    let _hang = simulate(&svc, "dash-hang", &["hang:9:40"]);
    // A real MPI job through the agent, running while Prometheus looks (its per-process series
    // exist only while it runs).
    let steady = build(Flavour::Mpich, "steady");
    let socket = svc.socket.clone();
    let cmd = launch(Flavour::Mpich, 2, &steady, &["60", "2000"]);
    let mpi = std::thread::spawn(move || run_with_agent(&socket, "dash-mpi", &cmd, &[]));

    let dir = svc.dir.path().join("prometheus");
    let prom = Prometheus::start(&dir, svc.http, svc.agent_http, &[quick_rules(&dir)]);

    let firing = |alert: &str, job: &str| {
        prom.query(&format!(
            "ALERTS{{alertname=\"{alert}\",alertstate=\"firing\",job_id=\"{job}\"}}"
        ))
        .is_some_and(|r| !r.is_empty())
    };
    wait(
        "the hang alert on dash-hang",
        Duration::from_secs(120),
        || firing("CommscopeHang", "dash-hang").then_some(()),
    );
    wait(
        "the straggler alert on dash-straggler",
        Duration::from_secs(120),
        || firing("CommscopePersistentStraggler", "dash-straggler").then_some(()),
    );
    // The MPI job's clock alignment and ring series are in.
    wait("the MPI job's series", Duration::from_secs(60), || {
        let ring = prom.query("commscope_agent_ring_fill_ratio{job_id=\"dash-mpi\"}")?;
        let clock = prom.query("commscope_node_clock_offset_seconds{node=\"node-dash\"}")?;
        (!ring.is_empty() && !clock.is_empty()).then_some(())
    });

    // Every panel query returns data.
    let mut empty = Vec::new();
    for (file, title, expr) in panel_queries() {
        let q = instantiate(&expr);
        match prom.query(&q) {
            Some(r) if !r.is_empty() => {}
            Some(_) => empty.push(format!("{file}: {title}: no data for {q}")),
            None => empty.push(format!("{file}: {title}: the query failed: {q}")),
        }
    }
    assert!(empty.is_empty(), "{}", empty.join("\n"));

    // Every series an alert uses exists.
    for (name, expr) in alert_rules() {
        for m in metrics_in(&expr) {
            let r = prom
                .query(&format!("count({{__name__=\"{m}\"}})"))
                .unwrap_or_default();
            assert!(!r.is_empty(), "{name}: no series {m}");
        }
    }

    // The healthy job and the MPI job raised nothing; the faulty jobs only what they should.
    let alerts = prom.query("ALERTS").expect("ALERTS");
    let by_job = |job: &str| -> Vec<String> {
        alerts
            .iter()
            .filter(|a| a["metric"]["job_id"] == job)
            .map(|a| a["metric"]["alertname"].as_str().unwrap_or("?").to_owned())
            .collect()
    };
    assert_eq!(by_job("dash-healthy"), Vec::<String>::new(), "{alerts:#?}");
    assert_eq!(by_job("dash-mpi"), Vec::<String>::new(), "{alerts:#?}");
    assert_eq!(by_job("dash-hang"), ["CommscopeHang"], "{alerts:#?}");
    assert_eq!(
        by_job("dash-straggler"),
        ["CommscopePersistentStraggler"],
        "{alerts:#?}"
    );

    let _ = Command::new("pkill")
        .args(["-9", "-f", steady.to_str().expect("utf-8")])
        .status();
    let _ = mpi.join();
}
