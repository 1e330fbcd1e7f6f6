//! The multi-node testbed ([`Testbed`]): three network-namespace nodes on a bridge, an agent per
//! node with its own `/run/commscope`, a collector, and an Open MPI job across the nodes over
//! TCP. Faults are made on the nodes' links.

use std::time::{Duration, Instant};

use commscope_tests::testbed::Testbed;
use commscope_tests::{Flavour, build, wait};

/// Starts `job` (`program`, one rank on each of the three nodes), waits for its ranks, lets it
/// run healthy for `secs` and checks it has no finding yet.
fn healthy_for_a_while(
    bed: &Testbed,
    job: &str,
    program: &[&str],
    secs: u64,
) -> std::process::Child {
    let runner = bed
        .job_command(job, 1, 3, program)
        .spawn()
        .expect("run the job");
    wait("the job's three ranks", Duration::from_secs(60), || {
        bed.job(job)
            .filter(|j| j["ranks"].as_u64() == Some(3))
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(secs));
    assert!(
        bed.findings(job, "").is_empty(),
        "a finding before the fault: {:#?}",
        bed.findings(job, "")
    );
    runner
}

/// Node 1's link goes down in the middle of the job's all-reduces: its agent is cut off from
/// the collector together with its ranks. Exactly one finding: a `communication-hang` with no
/// rank, its link naming node 1.
#[test]
fn a_node_link_down_during_an_allreduce_is_one_communication_hang_naming_the_node() {
    let bed = Testbed::new(3, &["--no-ebpf"]);
    let prog = std::fs::canonicalize(build(Flavour::OpenMpi, "steady")).expect("program");
    let job = "testbed-link-down";
    let p = prog.to_str().expect("utf-8");
    let mut runner = healthy_for_a_while(&bed, job, &[p, "600", "20000"], 3);
    let nodes = bed.job(job).expect("job")["nodes"].clone();
    assert_eq!(nodes.as_array().map(Vec::len), Some(3), "{nodes}");

    bed.link(1, false);
    let down = Instant::now();
    let f = wait("a live hang finding", Duration::from_secs(60), || {
        bed.findings(job, "open")
            .into_iter()
            .find(|f| f["kind"] == "hang")
    });
    eprintln!(
        "link down: named {:.1} s after node 1's link went down: {}",
        down.elapsed().as_secs_f64(),
        f["summary"]
    );
    std::thread::sleep(Duration::from_secs(4));
    let all = bed.findings(job, "");

    bed.kill_jobs();
    let _ = runner.kill();
    let _ = runner.wait();

    assert_eq!(all.len(), 1, "open or resolved: {all:#?}");
    let g = &all[0];
    assert_eq!(g["kind"], "hang", "{g:#}");
    assert_eq!(g["class"], "communication-hang", "{g:#}");
    assert_eq!(g["ranks"], serde_json::json!([]), "{g:#}");
    assert_eq!(g["link"]["src"], bed.nodes.names[1].as_str(), "{g:#}");
    assert_eq!(
        g["evidence"]["out_of_sight"],
        serde_json::json!([1]),
        "{g:#}"
    );
}

/// Node 1's data path dies silently in the middle of the job's all-reduces, while every agent
/// stays in contact with the collector: every member is inside and alive (a stall), and the
/// transport view shows TCP to or from node 1 retransmitting with nothing acknowledged.
/// Exactly one finding: a `communication-hang` with no rank whose link names node 1.
#[test]
fn a_dead_data_path_under_a_stall_is_one_communication_hang_naming_the_node() {
    let bed = Testbed::new(3, &[]);
    let prog = std::fs::canonicalize(build(Flavour::OpenMpi, "bench_allreduce")).expect("program");
    let job = "testbed-blackhole";
    let p = prog.to_str().expect("utf-8");
    let mut runner = healthy_for_a_while(&bed, job, &[p, "65536", "100000000"], 4);

    bed.blackhole(1, true);
    let cut = Instant::now();
    let f = wait("a live hang naming a link", Duration::from_secs(60), || {
        bed.findings(job, "open")
            .into_iter()
            .find(|f| f["kind"] == "hang" && !f["link"].is_null())
    });
    eprintln!(
        "blackhole: link named {:.1} s after node 1's data path died: {}",
        cut.elapsed().as_secs_f64(),
        f["summary"]
    );
    std::thread::sleep(Duration::from_secs(4));
    let all = bed.findings(job, "");

    // The job ends while the path is still dead (the trace's last word on the link is that
    // it was dead); only then is the path restored. Restored first, a retransmission can get
    // through before the kill, and the trace then ends with the link alive.
    bed.kill_jobs();
    let _ = runner.kill();
    let _ = runner.wait();
    bed.blackhole(1, false);

    assert_eq!(all.len(), 1, "open or resolved: {all:#?}");
    let g = &all[0];
    // The collector's trace of the job says the same: the stall and its dead link.
    let dir = bed.dir.path().join("traces").join(job);
    wait("the job's trace", Duration::from_secs(60), || {
        std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "parquet"))
            .then_some(())
    });
    let v = commscope_tests::analyze_json(&dir);
    let found = v["findings"].as_array().cloned().unwrap_or_default();
    assert_eq!(found.len(), 1, "analyze: {found:#?}\n{}", v["explain"]);
    assert_eq!(found[0]["class"], "communication-hang", "{:#}", found[0]);
    assert_eq!(found[0]["ranks"], serde_json::json!([]), "{:#}", found[0]);
    assert_eq!(
        found[0]["link"],
        g["link"],
        "{:#}\nthe trace's flow records:\n{}",
        found[0],
        flow_lines(&dir)
    );
    assert_eq!(g["kind"], "hang", "{g:#}");
    assert_eq!(g["class"], "communication-hang", "{g:#}");
    assert_eq!(g["ranks"], serde_json::json!([]), "{g:#}");
    // Node 1 is one end of the named link (only its own links can be dead; when one link
    // alone had data in flight, the transport cannot tell which of its ends failed).
    let node1 = bed.nodes.names[1].as_str();
    assert!(
        g["link"]["src"] == node1 || g["link"]["dst"] == node1,
        "{g:#}"
    );
    assert!(
        g["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|x| x == node1) && n.len() <= 2),
        "{g:#}"
    );
    assert!(g["evidence"]["out_of_sight"].is_null(), "{g:#}");
    // The named source's interface, when one of its own sends was dead: its only one.
    assert!(
        g["link"].get("src_nic").is_none_or(|n| n == "eth0"),
        "{g:#}"
    );
    let dead = g["evidence"]["transport"]["dead_links"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !dead.is_empty()
            && dead.iter().all(|d| d["src"] == bed.nodes.names[1].as_str()
                || d["dst"] == bed.nodes.names[1].as_str()),
        "{g:#}"
    );
}

/// The transport view's TCP flows across the testbed: an all-reduce job over TCP, first on
/// healthy links (no finding at all), then with node 1's link throttled to 40 Mbit/s: one
/// `slow-link` naming node 1, and no rank blamed — live, and from the collector's trace.
#[test]
fn a_throttled_node_link_is_one_slow_link_live_and_in_the_trace() {
    // Node 1's agent reads an mlx5-shaped fixture whose ECN-mark counter climbs while its link
    // is throttled (a congested port marks packets): the finding says the counters agree.
    let bed = Testbed::new_with(3, &[], true);
    let ecn = bed
        .sysfs(1)
        .join("class/infiniband/mlx5_0/ports/1/hw_counters/np_ecn_marked_roce_packets");
    std::fs::create_dir_all(ecn.parent().expect("dir")).expect("mkdir");
    std::fs::write(
        bed.sysfs(1).join("class/infiniband/mlx5_0/ports/1/state"),
        "4: ACTIVE\n",
    )
    .expect("state");
    std::fs::write(&ecn, "0\n").expect("counter");
    let prog = std::fs::canonicalize(build(Flavour::OpenMpi, "bench_allreduce")).expect("program");
    let p = prog.to_str().expect("utf-8");

    // Healthy: 4 MiB all-reduces for a while.
    let healthy = "testbed-healthy";
    assert!(bed.run_job(healthy, 1, 3, &[p, "4194304", "300"]).success());
    let f = bed.findings(healthy, "");
    assert!(f.is_empty(), "findings on healthy links: {f:#?}");

    bed.throttle(1, Some("40mbit"));
    let slow = "testbed-throttled";
    let marking = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let marker = {
        let (marking, ecn) = (marking.clone(), ecn.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while marking.load(std::sync::atomic::Ordering::Relaxed) {
                n += 100;
                std::fs::write(&ecn, format!("{n}\n")).expect("counter");
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    let status = bed.run_job(slow, 1, 3, &[p, "4194304", "25"]);
    marking.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = marker.join();
    bed.throttle(1, None);
    assert!(status.success());
    let all = bed.findings(slow, "");
    let node1 = bed.nodes.names[1].as_str();
    let is_link = |f: &serde_json::Value| {
        f["kind"] == "slow-link"
            && (f["link"]["src"] == node1 || f["link"]["dst"] == node1)
            && f["ranks"] == serde_json::json!([])
    };
    eprintln!(
        "throttled: {}",
        all.iter()
            .map(|f| f["summary"].as_str().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(all.len(), 1, "live: {all:#?}");
    assert!(is_link(&all[0]), "live: {:#}", all[0]);
    let agree = |f: &serde_json::Value| {
        f["summary"]
            .as_str()
            .is_some_and(|s| s.contains("the NIC counters agree"))
            && f["evidence"]["nic_counters"][node1]["congestion"]
                ["mlx5_0 port 1 np_ecn_marked_roce_packets"]
                .as_u64()
                .is_some_and(|n| n > 0)
    };
    assert!(agree(&all[0]), "live: {:#}", all[0]);
    // The sending node's interface: each node's only one, inside its namespace.
    assert_eq!(all[0]["link"]["src_nic"], "eth0", "live: {:#}", all[0]);

    // The collector's trace of the job says the same.
    let dir = bed.dir.path().join("traces").join(slow);
    wait("the job's trace", Duration::from_secs(60), || {
        std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "parquet"))
            .then_some(())
    });
    let v = commscope_tests::analyze_json(&dir);
    let found = v["findings"].as_array().cloned().unwrap_or_default();
    assert_eq!(found.len(), 1, "analyze: {found:#?}");
    assert!(is_link(&found[0]), "analyze: {:#}", found[0]);
    assert!(agree(&found[0]), "analyze: {:#}", found[0]);
    assert_eq!(found[0]["link"], all[0]["link"]);
    // The agents' flow records are in the trace, and not taken for ranks.
    let (sum, _) = commscope_tests::summary_json(&[dir.as_path()]);
    assert_eq!(
        (sum["ranks"].as_u64(), sum["processes"].as_u64()),
        (Some(3), Some(3)),
        "{sum:#}"
    );
    assert!(
        sum["unfinished_ranks"]
            .as_array()
            .is_some_and(|u| u.iter().all(|r| r.as_i64() >= Some(0))),
        "{sum:#}"
    );
}

/// The `flow` records of a job's trace, one line each in time order: what a post-mortem
/// conclusion about its links rests on (printed when one differs from the live finding).
fn flow_lines(dir: &std::path::Path) -> String {
    use commscope_wire::record::Record;
    let trace = commscope_tests::load_job(dir);
    let mut lines: Vec<(u64, String)> = trace
        .processes
        .iter()
        .filter(|p| p.header.is_transport())
        .flat_map(|p| {
            p.records.iter().filter_map(move |r| match r {
                Record::Flow(f) => Some((
                    f.t_end,
                    format!(
                        "{} t_end={} rank={} -> {} sent={} retransmits={} flags={}",
                        p.header.node,
                        f.t_end,
                        f.rank,
                        f.remote_addr(),
                        f.bytes_sent,
                        f.retransmits,
                        f.flags
                    ),
                )),
                _ => None,
            })
        })
        .collect();
    lines.sort();
    lines
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}
