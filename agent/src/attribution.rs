//! Where a recorded process runs in the cluster's terms: its Kubernetes namespace, pod,
//! container and owning workload, its Slurm job, its torchrun run.
//!
//! What the node itself says comes first: the process's cgroup path names its pod (by UID) and
//! container (by ID) under the kubelet's cgroup drivers, and its Slurm job under slurmstepd's;
//! its environment carries `SLURM_JOB_ID` and `TORCHELASTIC_RUN_ID`. The pod's name, namespace
//! and owner come from the node's pod list — the API server's (pods on this node, with the
//! agent's service-account token) or the kubelet's `/pods` — fetched when a pod UID is not
//! known yet, at most once per [`REFRESH_EVERY`], and cached.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use commscope_wire::grpc::Attribution;

/// The node's pod list is fetched again for an unknown pod at most this often.
pub const REFRESH_EVERY: Duration = Duration::from_secs(10);

/// What a process's cgroup path says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupFacts {
    /// The pod's UID, with dashes (`kubepods…pod<uid>…`).
    pub pod_uid: Option<String>,
    /// The container's ID (`cri-containerd-<id>.scope`, `crio-<id>`, `docker-<id>`, or the
    /// last component under the pod with the cgroupfs driver).
    pub container_id: Option<String>,
    /// slurmstepd's `job_<id>`.
    pub slurm_job_id: Option<String>,
}

/// Reads one `/proc/<pid>/cgroup` file's paths (cgroup v2's `0::` line first, then v1's).
pub fn parse_cgroup(text: &str) -> CgroupFacts {
    // (a v1 controller's line, its path): the unified hierarchy's first.
    let mut paths: Vec<(bool, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let id = it.next()?;
            let _controllers = it.next()?;
            Some((id != "0", it.next()?))
        })
        .collect();
    paths.sort_by_key(|(v1, _)| *v1);
    let mut facts = CgroupFacts::default();
    for (_, path) in paths {
        let f = parse_cgroup_path(path);
        facts.pod_uid = facts.pod_uid.or(f.pod_uid);
        facts.container_id = facts.container_id.or(f.container_id);
        facts.slurm_job_id = facts.slurm_job_id.or(f.slurm_job_id);
    }
    facts
}

/// One cgroup path. The kubelet's systemd driver writes
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope`,
/// its cgroupfs driver `/kubepods/burstable/pod<uid>/<id>`; slurmstepd
/// `/system.slice/slurmstepd.scope/job_<id>/step_<step>/…` (v2) or `/slurm/uid_<u>/job_<id>/…`.
pub fn parse_cgroup_path(path: &str) -> CgroupFacts {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut facts = CgroupFacts::default();
    let in_kubepods = parts.iter().any(|p| p.starts_with("kubepods"));
    for (i, part) in parts.iter().enumerate() {
        if let Some(id) = part.strip_prefix("job_")
            && !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_digit())
        {
            facts.slurm_job_id = Some(id.to_owned());
        }
        if !in_kubepods {
            continue;
        }
        let name = part.strip_suffix(".slice").unwrap_or(part);
        if let Some(at) = name.rfind("pod") {
            let uid = &name[at + 3..];
            if is_uid(uid) {
                facts.pod_uid = Some(uid.replace('_', "-"));
                if let Some(next) = parts.get(i + 1) {
                    facts.container_id = container_id(next);
                }
            }
        }
    }
    facts
}

/// A pod UID as cgroup paths write it (36 characters, dashes or underscores).
fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_')
}

/// The container ID in the cgroup component under a pod's.
fn container_id(part: &str) -> Option<String> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    let id = ["cri-containerd-", "crio-", "docker-", "cri-o-"]
        .iter()
        .find_map(|p| name.strip_prefix(p))
        .unwrap_or(name);
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
}

/// What the node knows of a process: its cgroup and its environment.
pub fn local(proc_root: &Path, pid: u32) -> (CgroupFacts, Attribution) {
    let dir = proc_root.join(pid.to_string());
    let facts = std::fs::read_to_string(dir.join("cgroup"))
        .map(|t| parse_cgroup(&t))
        .unwrap_or_default();
    let env = std::fs::read(dir.join("environ"))
        .map(|b| commscope_wire::launcher::parse_environ(&b))
        .unwrap_or_default();
    let var = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned();
    let a = Attribution {
        slurm_job_id: var("SLURM_JOB_ID")
            .or_else(|| facts.slurm_job_id.clone())
            .unwrap_or_default(),
        torchrun_run_id: var("TORCHELASTIC_RUN_ID").unwrap_or_default(),
        ..Attribution::default()
    };
    (facts, a)
}

/// One pod of the node's pod list, as attribution needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodMeta {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub owner: String,
    /// Container ID (without its runtime's `containerd://` prefix) → container name.
    pub containers: HashMap<String, String>,
}

/// The pods of a `PodList` (the API server's or the kubelet's `/pods`, which are the same
/// shape). Items without a UID are left out.
pub fn parse_pod_list(json: &[u8]) -> Result<Vec<PodMeta>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| format!("not a pod list: {e}"))?;
    let items = v["items"]
        .as_array()
        .ok_or_else(|| "not a pod list: no \"items\"".to_owned())?;
    Ok(items
        .iter()
        .filter_map(|p| {
            let m = &p["metadata"];
            let uid = m["uid"].as_str().filter(|u| !u.is_empty())?;
            let statuses = ["containerStatuses", "initContainerStatuses"];
            let containers = statuses
                .iter()
                .flat_map(|k| p["status"][k].as_array().into_iter().flatten())
                .filter_map(|c| {
                    let id = c["containerID"].as_str()?;
                    let id = id.split_once("://").map_or(id, |(_, x)| x);
                    // A container not started yet has no ID.
                    (!id.is_empty())
                        .then(|| (id.to_owned(), c["name"].as_str().unwrap_or("").to_owned()))
                })
                .collect();
            Some(PodMeta {
                uid: uid.to_owned(),
                namespace: m["namespace"].as_str().unwrap_or("").to_owned(),
                name: m["name"].as_str().unwrap_or("").to_owned(),
                owner: owner_of(m),
                containers,
            })
        })
        .collect())
}

/// The workload behind a pod, "Kind/name": the job-level labels of the common training
/// operators first (a JobSet's pods belong to a Job of the JobSet), else the controller in its
/// owner references (a ReplicaSet named for its Deployment), else the pod itself.
fn owner_of(m: &serde_json::Value) -> String {
    let labels = &m["labels"];
    let label = |k: &str| labels[k].as_str().filter(|s| !s.is_empty());
    if let Some(n) = label("jobset.sigs.k8s.io/jobset-name") {
        return format!("JobSet/{n}");
    }
    let refs = m["ownerReferences"].as_array();
    let controller = refs.and_then(|r| {
        r.iter()
            .find(|o| o["controller"] == true)
            .or_else(|| r.first())
    });
    match controller {
        Some(o) => {
            let kind = o["kind"].as_str().unwrap_or("?");
            let name = o["name"].as_str().unwrap_or("?");
            match (kind, label("pod-template-hash")) {
                ("ReplicaSet", Some(h)) => match name.strip_suffix(&format!("-{h}")) {
                    Some(d) => format!("Deployment/{d}"),
                    None => format!("ReplicaSet/{name}"),
                },
                _ => format!("{kind}/{name}"),
            }
        }
        None => format!("Pod/{}", m["name"].as_str().unwrap_or("?")),
    }
}

/// Where the node's pod list comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSource {
    /// A URL answering a `PodList`: the API server's
    /// `/api/v1/pods?fieldSelector=spec.nodeName=<node>`, or the kubelet's `/pods`.
    pub url: String,
    /// A bearer token to send (read at each fetch: service-account tokens rotate).
    pub token_file: Option<PathBuf>,
    /// The CA that signs the server's certificate (else the system's roots).
    pub ca_file: Option<PathBuf>,
}

/// The service account's files, mounted in every pod that has one.
pub const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl PodSource {
    /// Inside a Kubernetes pod with a service account: the API server's list of this node's
    /// pods. None elsewhere.
    pub fn in_cluster(node: &str) -> Option<PodSource> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let sa = Path::new(SERVICE_ACCOUNT);
        if !sa.join("token").is_file() {
            return None;
        }
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Some(PodSource {
            url: format!("https://{host}:{port}/api/v1/pods?fieldSelector=spec.nodeName%3D{node}"),
            token_file: Some(sa.join("token")),
            ca_file: Some(sa.join("ca.crt")),
        })
    }

    fn client(&self) -> Result<reqwest::Client, String> {
        let mut b = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(2));
        if let Some(ca) = &self.ca_file {
            let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
            let cert = reqwest::Certificate::from_pem(&pem)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            b = b.add_root_certificate(cert);
        }
        b.build().map_err(|e| e.to_string())
    }

    /// Fetches the pod list once.
    pub async fn fetch(&self) -> Result<Vec<PodMeta>, String> {
        let client = self.client()?;
        let mut req = client.get(&self.url);
        if let Some(f) = &self.token_file {
            let token = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            req = req.bearer_auth(token.trim());
        }
        let resp = req.send().await.map_err(|e| format!("{}: {e}", self.url))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(format!("{}: HTTP {status}", self.url));
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| format!("{}: {e}", self.url))?;
        parse_pod_list(&body).map_err(|e| format!("{}: {e}", self.url))
    }
}

/// The node's pods by UID, fetched on demand and cached.
#[derive(Debug)]
pub struct Pods {
    source: Option<PodSource>,
    by_uid: HashMap<String, PodMeta>,
    fetched: Option<Instant>,
    /// The last fetch's error, logged once per distinct message.
    last_error: Option<String>,
}

impl Pods {
    pub fn new(source: Option<PodSource>) -> Pods {
        Pods {
            source,
            by_uid: HashMap::new(),
            fetched: None,
            last_error: None,
        }
    }

    /// The pod with `uid`: from the cache, else from a fresh list when the last one is older
    /// than [`REFRESH_EVERY`].
    pub async fn get(&mut self, uid: &str) -> Option<PodMeta> {
        if let Some(p) = self.by_uid.get(uid) {
            return Some(p.clone());
        }
        let source = self.source.clone()?;
        if self.fetched.is_some_and(|t| t.elapsed() < REFRESH_EVERY) {
            return None;
        }
        self.fetched = Some(Instant::now());
        match source.fetch().await {
            Ok(pods) => {
                self.last_error = None;
                self.by_uid = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
            }
            Err(e) => {
                if self.last_error.as_ref() != Some(&e) {
                    tracing::warn!("pod attribution: cannot list this node's pods: {e}");
                    self.last_error = Some(e);
                }
            }
        }
        self.by_uid.get(uid).cloned()
    }
}

/// A process's attribution: what the node says, completed from the pod list.
pub async fn attribute(proc_root: &Path, pid: u32, pods: &tokio::sync::Mutex<Pods>) -> Attribution {
    let (facts, mut a) = local(proc_root, pid);
    let Some(uid) = &facts.pod_uid else {
        return a;
    };
    let Some(p) = pods.lock().await.get(uid).await else {
        return a;
    };
    a.namespace = p.namespace;
    a.pod = p.name;
    a.owner = p.owner;
    // Runtimes report the full ID; a cgroup may carry a prefix of it.
    if let Some(id) = &facts.container_id
        && let Some((_, name)) = p
            .containers
            .iter()
            .find(|(cid, _)| cid.starts_with(id.as_str()) || id.starts_with(cid.as_str()))
    {
        a.container = name.clone();
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "5f0c2a7e-3b1d-4c8e-9a6f-0d2b4e6f8a1c";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn cgroup_paths_of_the_kubelet_drivers_and_slurm_name_pod_container_and_job() {
        // systemd driver, cgroup v2, containerd.
        let v2 = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n",
            UID.replace('-', "_")
        );
        let f = parse_cgroup(&v2);
        assert_eq!(f.pod_uid.as_deref(), Some(UID));
        assert_eq!(f.container_id.as_deref(), Some(CID));
        assert_eq!(f.slurm_job_id, None);
        // Guaranteed QoS has no class level; CRI-O's scope.
        let g = parse_cgroup_path(&format!(
            "/kubepods.slice/kubepods-pod{}.slice/crio-{CID}.scope",
            UID.replace('-', "_")
        ));
        assert_eq!(
            (g.pod_uid.as_deref(), g.container_id.as_deref()),
            (Some(UID), Some(CID))
        );
        // cgroupfs driver, cgroup v1: the unified line is empty, the controllers name the pod.
        let v1 = format!(
            "12:pids:/kubepods/besteffort/pod{UID}/{CID}\n4:memory:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n"
        );
        let f = parse_cgroup(&v1);
        assert_eq!(
            (f.pod_uid.as_deref(), f.container_id.as_deref()),
            (Some(UID), Some(CID))
        );
        // The pod's own cgroup (a process of the pause container's level): no container.
        let p = parse_cgroup_path(&format!("/kubepods/pod{UID}"));
        assert_eq!((p.pod_uid.as_deref(), p.container_id), (Some(UID), None));
        // Slurm, v2 and v1.
        let s = parse_cgroup("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1\n");
        assert_eq!(s.slurm_job_id.as_deref(), Some("4242"));
        assert_eq!(s.pod_uid, None);
        let s = parse_cgroup_path("/slurm/uid_1000/job_77/step_batch/task_0");
        assert_eq!(s.slurm_job_id.as_deref(), Some("77"));
        // Neither: a login shell, a systemd service, a "pod" that is not a UID.
        for path in [
            "/user.slice/user-1000.slice/session-3.scope",
            "/system.slice/podman.service",
            "/kubepods.slice/podcast.slice",
            "/system.slice/job_x.scope",
        ] {
            assert_eq!(parse_cgroup_path(path), CgroupFacts::default(), "{path}");
        }
        assert_eq!(parse_cgroup("garbage\n\n::\n"), CgroupFacts::default());
    }

    fn pod(
        uid: &str,
        name: &str,
        labels: serde_json::Value,
        owners: serde_json::Value,
    ) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"uid": uid, "name": name, "namespace": "ml", "labels": labels, "ownerReferences": owners},
            "status": {"containerStatuses": [
                {"name": "train", "containerID": format!("containerd://{CID}")},
                {"name": "sidecar"},
                {"name": "waiting", "containerID": ""}
            ]}
        })
    }

    #[test]
    fn a_pod_list_gives_namespace_name_containers_and_the_workload_behind_each_pod() {
        let list = serde_json::json!({"kind": "PodList", "items": [
            pod(UID, "llama-0-abc", serde_json::json!({"jobset.sigs.k8s.io/jobset-name": "llama"}),
                serde_json::json!([{"kind": "Job", "name": "llama-workers-0", "controller": true}])),
            pod("u2", "web-7d9f8-x2", serde_json::json!({"pod-template-hash": "7d9f8"}),
                serde_json::json!([{"kind": "ReplicaSet", "name": "web-7d9f8", "controller": true}])),
            pod("u3", "bert-worker-1", serde_json::json!({}),
                serde_json::json!([{"kind": "PyTorchJob", "name": "bert", "controller": true}])),
            pod("u4", "debug", serde_json::json!(null), serde_json::json!(null)),
            {"metadata": {"name": "no-uid"}},
        ]});
        let pods = parse_pod_list(list.to_string().as_bytes()).expect("a list");
        let owners: Vec<(&str, &str)> = pods
            .iter()
            .map(|p| (p.uid.as_str(), p.owner.as_str()))
            .collect();
        assert_eq!(
            owners,
            [
                (UID, "JobSet/llama"),
                ("u2", "Deployment/web"),
                ("u3", "PyTorchJob/bert"),
                ("u4", "Pod/debug")
            ]
        );
        assert_eq!(pods[0].namespace, "ml");
        assert_eq!(pods[0].name, "llama-0-abc");
        assert_eq!(
            pods[0].containers.get(CID).map(String::as_str),
            Some("train")
        );
        assert_eq!(pods[0].containers.len(), 1);
        for bad in [&b"{\"items\": 3}"[..], b"<html>", b""] {
            assert!(parse_pod_list(bad).is_err());
        }
    }

    #[tokio::test]
    async fn a_process_in_a_pods_cgroup_is_attributed_from_a_fixture_proc_tree() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("4321");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(
            dir.join("cgroup"),
            format!(
                "0::/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{CID}.scope\n",
                UID.replace('-', "_")
            ),
        )
        .expect("cgroup");
        std::fs::write(
            dir.join("environ"),
            b"TORCHELASTIC_RUN_ID=run-9\0SLURM_JOB_ID=\0HOME=/\0",
        )
        .expect("environ");
        // No pod source: what the node says alone.
        let none = tokio::sync::Mutex::new(Pods::new(None));
        let a = attribute(tmp.path(), 4321, &none).await;
        assert_eq!(
            a,
            Attribution {
                torchrun_run_id: "run-9".into(),
                ..Default::default()
            }
        );
        // A process that is gone: nothing, no error.
        assert_eq!(
            attribute(tmp.path(), 999, &none).await,
            Attribution::default()
        );
    }
}
