//! A node cut off together with its ranks: its agent's stream dies and its ranks stop, while
//! the ranks on the other node wait in the collective for them. From the collector this is
//! lost contact with that node — never a rank computing or frozen. (Here the cut is made with
//! signals, on one machine: both of node B's agents and ranks stop at once, as a downed link
//! stops them for the collector.)

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use commscope_tests::services::{Service, Services, run_with_agent};
use commscope_tests::{Flavour, build, commscope, wait};

/// Pids of `prog`'s processes whose environment names `socket` as their agent.
fn ranks_using(prog: &Path, socket: &Path) -> Vec<i32> {
    let want = format!("COMMSCOPE_AGENT_SOCKET={}", socket.display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let exe = std::fs::read_link(e.path().join("exe")).ok();
        if exe.as_deref() != Some(prog) {
            continue;
        }
        let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            out.push(pid);
        }
    }
    out
}

fn signal(pids: &[i32], sig: i32) {
    for p in pids {
        // SAFETY: signals to processes this test started.
        unsafe { libc::kill(*p, sig) };
    }
}

#[test]
fn a_node_cut_off_with_its_ranks_is_one_lost_contact_hang_naming_it() {
    let mut svc = Services::start("node-a", &[], &["--no-ebpf"]);
    // Node B's agent, on the same collector.
    let b_socket = svc.dir.path().join("agent-b.sock");
    let mut c = commscope();
    c.arg("agent")
        .arg("--collector")
        .arg(format!("http://{}", svc.grpc))
        .arg("--socket")
        .arg(&b_socket)
        .arg("--node")
        .arg("node-b")
        .arg("--http")
        .arg("127.0.0.1:0")
        .arg("--spool-dir")
        .arg(svc.dir.path().join("spool-b"))
        .arg("--no-ebpf");
    let mut agent_b = Service::spawn(c, "agent on node-b");
    agent_b.wait_log("registrations on", Duration::from_secs(30));

    // Ranks 0–1 register with node A's agent, ranks 2–3 with node B's.
    let prog = std::fs::canonicalize(build(Flavour::OpenMpi, "steady")).expect("program");
    let job = "lost-contact";
    let p = prog.to_str().expect("utf-8").to_owned();
    let b_env = format!("COMMSCOPE_AGENT_SOCKET={}", b_socket.display());
    let cmd: Vec<std::ffi::OsString> = [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        "lo",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        "-np",
        "2",
        &p,
        "600",
        "20000",
        ":",
        "-np",
        "2",
        "env",
        &b_env,
        &p,
        "600",
        "20000",
    ]
    .iter()
    .map(Into::into)
    .collect();
    let socket = svc.socket.clone();
    let runner = std::thread::spawn(move || run_with_agent(&socket, job, &cmd, &[]));
    wait("the job's four ranks", Duration::from_secs(60), || {
        svc.job(job)
            .filter(|j| j["ranks"].as_u64() == Some(4))
            .map(|_| ())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        svc.findings(job, "open").is_empty(),
        "a finding before the cut: {:#?}",
        svc.findings(job, "open")
    );

    // The cut: node B's ranks and agent stop together.
    let b_ranks = ranks_using(&prog, &b_socket);
    assert_eq!(b_ranks.len(), 2, "node B's ranks: {b_ranks:?}");
    signal(&b_ranks, libc::SIGSTOP);
    signal(&[agent_b.child.id() as i32], libc::SIGSTOP);
    let f = wait("a live hang finding", Duration::from_secs(60), || {
        svc.findings(job, "open")
            .into_iter()
            .find(|f| f["kind"] == "hang")
    });
    eprintln!("lost contact: {}", f["summary"]);
    // Let every detector have its say for a few evaluations.
    std::thread::sleep(Duration::from_secs(4));
    let open = svc.findings(job, "open");
    let all = svc.findings(job, "");

    // Take everything down.
    signal(&[agent_b.child.id() as i32], libc::SIGCONT);
    signal(&b_ranks, libc::SIGKILL);
    let _ = Command::new("pkill").args(["-9", "-f", &p]).status();
    let _ = runner.join();
    agent_b.stop();

    assert_eq!(open.len(), 1, "open: {open:#?}");
    assert_eq!(all.len(), 1, "open or resolved: {all:#?}");
    let g = &open[0];
    assert_eq!(g["id"], f["id"]);
    assert_eq!(g["class"], "communication-hang", "{g:#}");
    assert_eq!(g["ranks"], serde_json::json!([]), "{g:#}");
    assert_eq!(g["link"]["src"], "node-b", "{g:#}");
    assert_eq!(g["link"]["dst"], "node-a", "{g:#}");
    assert_eq!(
        g["evidence"]["out_of_sight"],
        serde_json::json!([2, 3]),
        "{g:#}"
    );
    assert_eq!(g["evidence"]["waiting"], serde_json::json!([0, 1]), "{g:#}");
    let summary = g["summary"].as_str().unwrap_or_default();
    assert!(
        summary.starts_with("Contact with node node-b was lost"),
        "{summary}"
    );
    assert!(
        svc.collector()
            .log()
            .contains("no stream from node node-b's agent any more"),
        "{}",
        svc.collector().log()
    );
}
