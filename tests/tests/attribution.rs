//! Pod and job attribution with real processes: an MPI job runs inside a real cgroup laid out
//! as the kubelet's systemd driver lays out a pod's container, and a fake pod-list endpoint
//! (the shape of the kubelet's `/pods` and the API server's pod list) names that pod. The
//! agent finds the pod from each rank's cgroup, the collector puts namespace, owner and pod on
//! the job in the API, on its metric series, on its findings' evidence and in its stored
//! history.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use commscope_tests::services::Services;
use commscope_tests::{Flavour, build, launch, wait};

const UID: &str = "6b1f0c9e-2d4a-4e7b-8c3f-5a9d0e1b2c3d";
const CID: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid
/// host).
fn cgroup2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mount = pre.split_whitespace().nth(4)?;
        (post.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount))
    })
}

/// A pod's container cgroup as the kubelet's systemd driver names it, removed on drop.
struct PodCgroup {
    dirs: Vec<PathBuf>,
}

impl PodCgroup {
    fn new(root: &Path) -> PodCgroup {
        let pod = format!("kubepods-besteffort-pod{}.slice", UID.replace('-', "_"));
        let mut dirs = Vec::new();
        let mut at = root.to_path_buf();
        for part in [
            "kubepods.slice",
            "kubepods-besteffort.slice",
            pod.as_str(),
            &format!("cri-containerd-{CID}.scope"),
        ] {
            at = at.join(part);
            std::fs::create_dir_all(&at).expect("a cgroup");
            dirs.push(at.clone());
        }
        PodCgroup { dirs }
    }

    fn procs(&self) -> PathBuf {
        self.dirs.last().expect("dirs").join("cgroup.procs")
    }
}

impl Drop for PodCgroup {
    /// Kills whatever still runs in it (a test that failed midway leaves the job running),
    /// then removes it.
    fn drop(&mut self) {
        let pids = || -> Vec<i32> {
            std::fs::read_to_string(self.procs())
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        };
        for _ in 0..100 {
            let left = pids();
            if left.is_empty() {
                break;
            }
            for pid in left {
                // SAFETY: signalling a process of this test's own cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A pod-list endpoint: answers every GET with `body`, remembering each request's
/// `Authorization` header.
struct PodList {
    url: String,
    auth: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl PodList {
    fn serve(body: String) -> PodList {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/pods", l.local_addr().expect("addr"));
        l.set_nonblocking(true).expect("nonblocking");
        let auth = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (auth.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((conn, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                };
                let _ = conn.set_nonblocking(false);
                let mut r = BufReader::new(&conn);
                let mut header = String::new();
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    if line.to_ascii_lowercase().starts_with("authorization:") {
                        header = line["authorization:".len()..].trim().to_owned();
                    }
                    line.clear();
                }
                a.lock().expect("lock").push(header);
                let _ = (&conn).write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        PodList { url, auth, stop }
    }
}

impl Drop for PodList {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[test]
fn a_job_in_a_pods_cgroup_is_attributed_to_its_pod_namespace_and_owner() {
    if !commscope_tests::root() {
        return;
    }
    let Some(cg_root) = cgroup2_root() else {
        eprintln!("skipped: no cgroup v2 hierarchy mounted");
        return;
    };
    let list = serde_json::json!({"kind": "PodList", "apiVersion": "v1", "items": [
        {"metadata": {"uid": "0f0f0f0f-0000-4000-8000-000000000000", "name": "other", "namespace": "kube-system"}},
        {
            "metadata": {
                "uid": UID, "name": "trainer-0", "namespace": "ml-team",
                "labels": {"jobset.sigs.k8s.io/jobset-name": "llama"},
                "ownerReferences": [{"kind": "Job", "name": "llama-workers-0", "controller": true}]
            },
            "status": {"containerStatuses": [
                {"name": "train", "containerID": format!("containerd://{CID}")}
            ]}
        }
    ]});
    let pods = PodList::serve(list.to_string());
    let tmp = tempfile::tempdir().expect("tempdir");
    let token = tmp.path().join("token");
    std::fs::write(&token, "secret-token\n").expect("token");
    let svc = Services::start(
        "node-k8s",
        &[],
        &[
            "--pods-url",
            &pods.url,
            "--pods-token-file",
            token.to_str().expect("utf-8"),
        ],
    );
    let cgroup = PodCgroup::new(&cg_root);

    // Three ranks in the pod's container; rank 1 stops calling (a hang naming it).
    let job = "attributed";
    let hang = build(Flavour::Mpich, "hang");
    let mut run = Command::new("sh");
    run.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(cgroup.procs())
        .arg(commscope_tests::commscope_bin())
        .arg("run")
        .arg("--agent-socket")
        .arg(&svc.socket)
        .arg("--job-id")
        .arg(job)
        .arg("--")
        .args(launch(Flavour::Mpich, 3, &hang, &["1"]))
        .env("TORCHELASTIC_RUN_ID", "run-7")
        .env_remove("COMMSCOPE_TRACE_DIR")
        .env_remove("COMMSCOPE_AGENT_SOCKET")
        .env_remove("COMMSCOPE_JOB_ID");
    let mut child = run.spawn().expect("the job");

    let finding = wait("the hang finding", Duration::from_secs(60), || {
        svc.findings(job, "open")
            .into_iter()
            .find(|f| f["kind"] == "hang")
    });
    assert_eq!(finding["ranks"], serde_json::json!([1]), "{finding:#}");
    assert_eq!(
        finding["evidence"]["attribution"],
        serde_json::json!({
            "namespace": "ml-team",
            "owner": "JobSet/llama",
            "torchrun_run_id": "run-7",
            "pods": {"1": "trainer-0"}
        }),
        "{finding:#}"
    );

    let api = svc.job(job).expect("the job in the API");
    assert_eq!(
        api["attribution"],
        serde_json::json!({"namespace": "ml-team", "owner": "JobSet/llama", "torchrun_run_id": "run-7"}),
        "{api:#}"
    );
    let processes = api["processes"].as_array().expect("processes");
    assert_eq!(processes.len(), 3);
    for p in processes {
        assert_eq!(
            (p["pod"].as_str(), p["container"].as_str()),
            (Some("trainer-0"), Some("train")),
            "{p}"
        );
    }

    // The Query service (the TUI's rank view) names each rank's pod too.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let detail = rt.block_on(async {
        let mut q = commscope_wire::grpc::query_client::QueryClient::connect(format!(
            "http://{}",
            svc.grpc
        ))
        .await
        .expect("connect");
        q.get_job(commscope_wire::grpc::GetJobRequest { job: job.into() })
            .await
            .expect("GetJob")
            .into_inner()
    });
    let named: Vec<&str> = detail.ranks.iter().map(|r| r.pod.as_str()).collect();
    assert_eq!(named, ["trainer-0"; 3], "{detail:?}");

    let (_, m) = svc.get("/metrics");
    let labels = "job_id=\"attributed\",namespace=\"ml-team\",owner=\"JobSet/llama\"";
    assert!(
        m.contains(&format!(
            "commscope_findings_open{{{labels},kind=\"hang\"}} 1"
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "commscope_rank_in_flight{{{labels},rank=\"0\",node=\"node-k8s\",pod=\"trainer-0\"}} 1"
        )),
        "{m}"
    );
    assert!(
        m.contains(&format!("commscope_job_ranks{{{labels}}} 3")),
        "{m}"
    );

    // One list for the three ranks (cached), with the token.
    assert_eq!(
        *pods.auth.lock().expect("lock"),
        ["Bearer secret-token"],
        "{}",
        svc.agent.as_ref().map(|a| a.log()).unwrap_or_default()
    );

    let _ = Command::new("pkill")
        .args(["-9", "-f", hang.to_str().expect("utf-8")])
        .status();
    let _ = child.wait();
    svc.wait_job_ended(job, Duration::from_secs(60));
    // The stored history keeps it for the job once it left memory.
    let stored = wait("the job's history", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(svc.trace_dir().join(job).join("job.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        (v["state"] == "ended").then_some(v)
    });
    assert_eq!(stored["attribution"]["namespace"], "ml-team", "{stored:#}");
    assert_eq!(stored["attribution"]["owner"], "JobSet/llama", "{stored:#}");
    drop(cgroup);
}
