//! The multi-node testbed ([`Testbed`]): three network-namespace nodes on a bridge, an agent per
//! node with its own `/run/commscope`, a collector, and an Open MPI job across the nodes over
//! TCP. Faults are made on the nodes' links.

use std::time::{Duration, Instant};

use commscope_tests::testbed::{NODE_SOCKET, Testbed};
use commscope_tests::{Flavour, build, commscope, wait};

/// Node 1's link goes down in the middle of the job's all-reduces: its agent is cut off from
/// the collector together with its ranks. Exactly one finding: a `communication-hang` with no
/// rank, its link naming node 1.
#[test]
fn a_node_link_down_during_an_allreduce_is_one_communication_hang_naming_the_node() {
    let bed = Testbed::new(3, &["--no-ebpf"]);
    let prog = std::fs::canonicalize(build(Flavour::OpenMpi, "steady")).expect("program");
    let job = "testbed-link-down";
    let mut cmd = commscope();
    cmd.arg("run")
        .arg("--agent-socket")
        .arg(NODE_SOCKET)
        .arg("--job-id")
        .arg(job)
        .arg("--")
        .arg("mpirun")
        .args(bed.openmpi_args(1))
        .args(["-np", "3"])
        .arg(&prog)
        .args(["600", "20000"]);
    // Its output goes nowhere: daemons cut off behind the downed link would hold a pipe open.
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut runner = cmd.spawn().expect("run the job");
    wait("the job's three ranks", Duration::from_secs(60), || {
        bed.job(job)
            .filter(|j| j["ranks"].as_u64() == Some(3))
            .map(|_| ())
    });
    let nodes = bed.job(job).expect("job")["nodes"].clone();
    assert_eq!(nodes.as_array().map(Vec::len), Some(3), "{nodes}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        bed.findings(job, "").is_empty(),
        "a finding before the fault: {:#?}",
        bed.findings(job, "")
    );

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
