//! The deployment files (`deploy/`, docs/deploy.md), checked offline with the tools their
//! formats have: `kubectl kustomize` and `kubernetes-validate` for the manifests, `hadolint`
//! for the Containerfile, `systemd-analyze verify` for the units, `shellcheck` for the Slurm
//! scripts; and the agent's privileges against the ones the docs name, no more.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// Runs a tool that scripts/setup.sh installs; its absence fails the test with its name.
fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (scripts/setup.sh installs it)"))
}

fn ok(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: {}\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every document of a YAML stream, as JSON (PyYAML: the test crate has no YAML parser).
fn yaml_docs(yaml: &str) -> Vec<Value> {
    let tmp = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(tmp.path(), yaml).expect("write");
    let o = run(
        "python3",
        &[
            "-c",
            "import json, sys, yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None], sys.stdout)",
            tmp.path().to_str().expect("utf-8"),
        ],
    );
    serde_json::from_str(&ok(&o, "yaml to json")).expect("json")
}

fn kustomize(dir: &str) -> String {
    ok(&run("kubectl", &["kustomize", dir]), dir)
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_manifests_build_and_validate_against_the_kubernetes_schemas() {
    let operator: BTreeSet<&str> = ["PodMonitor", "ServiceMonitor", "PrometheusRule"].into();
    for dir in [
        "deploy/kubernetes",
        "deploy/kubernetes/examples",
        "deploy/replicas",
    ] {
        let yaml = kustomize(dir);
        let tmp = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(tmp.path(), &yaml).expect("write");
        let file = tmp.path().to_str().expect("utf-8");
        // The oldest Kubernetes it is written for, and the validator's latest.
        for version in [&["-k", "1.29.0"][..], &[]] {
            let mut args = vec!["--strict"];
            args.extend_from_slice(version);
            args.push(file);
            let o = run("kubernetes-validate", &args);
            let out = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(o.status.success(), "{dir} {version:?}:\n{out}");
            let objects = yaml_docs(&yaml).len();
            let passed = out.lines().filter(|l| l.contains(" passed for ")).count();
            // Only the Prometheus Operator's kinds lack a schema; everything else passed.
            let unknown: Vec<&str> = out
                .lines()
                .filter_map(|l| l.split("Couldn't find schema for kind ").nth(1))
                .filter_map(|r| r.split_whitespace().next())
                .collect();
            assert!(unknown.iter().all(|k| operator.contains(k)), "{dir}: {out}");
            assert_eq!(passed + unknown.len(), objects, "{dir}: {out}");
        }
    }

    let objects = yaml_docs(&kustomize("deploy/kubernetes"));
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole/commscope-agent",
            "ClusterRoleBinding/commscope-agent",
            "DaemonSet/commscope-agent",
            "Namespace/commscope",
            "PodMonitor/commscope-agent",
            "PrometheusRule/commscope",
            "Service/commscope-collector",
            "Service/commscope-collector-peers",
            "ServiceAccount/commscope-agent",
            "ServiceMonitor/commscope-collector",
            "StatefulSet/commscope-collector",
        ]
    );
    // Everything namespaced lands in commscope.
    for o in &objects {
        let cluster_wide = ["Namespace", "ClusterRole", "ClusterRoleBinding"];
        if !cluster_wide.contains(&o["kind"].as_str().unwrap_or("")) {
            assert_eq!(o["metadata"]["namespace"], "commscope", "{o}");
        }
    }
    // The alert rules are dashboards/alerts.yaml's, which promtool checks and tests.
    let rules = yaml_docs(
        &std::fs::read_to_string(repo().join("dashboards/alerts.yaml")).expect("alerts.yaml"),
    );
    assert_eq!(
        find(&objects, "PrometheusRule", "commscope")["spec"],
        rules[0],
        "deploy/kubernetes/prometheusrule.yaml is stale: run scripts/gen-prometheusrule.py"
    );
    // The scrape jobs are the ones the dashboards and rules name.
    let agent = find(&objects, "DaemonSet", "commscope-agent");
    let pod_labels = &agent["spec"]["template"]["metadata"]["labels"];
    let pm = find(&objects, "PodMonitor", "commscope-agent");
    assert_eq!(
        pod_labels[pm["spec"]["jobLabel"].as_str().expect("jobLabel")],
        "commscope-agent"
    );
    let svc = find(&objects, "Service", "commscope-collector");
    let sm = find(&objects, "ServiceMonitor", "commscope-collector");
    assert_eq!(
        svc["metadata"]["labels"][sm["spec"]["jobLabel"].as_str().expect("jobLabel")],
        "commscope-collector"
    );
    // Scraped once: the ServiceMonitor selects the ClusterIP Service, not the headless one.
    let selects = |s: &Value| {
        sm["spec"]["selector"]["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .iter()
            .all(|(k, v)| s["metadata"]["labels"][k] == *v)
    };
    assert!(selects(svc));
    assert!(!selects(find(
        &objects,
        "Service",
        "commscope-collector-peers"
    )));
}

/// `deploy/replicas`: the agents route over exactly the replicas the StatefulSet runs, by their
/// stable names, and every replica lists the same peers.
#[test]
fn the_replicas_overlay_lists_every_replica_to_agents_and_peers_alike() {
    let objects = yaml_docs(&kustomize("deploy/replicas"));
    let sts = find(&objects, "StatefulSet", "commscope-collector");
    let n = sts["spec"]["replicas"].as_u64().expect("replicas");
    assert!(n >= 2, "{n} replicas");
    let list_of = |args: &Value, flag: &str| -> Vec<String> {
        let all: Vec<String> = strings(args)
            .iter()
            .filter_map(|a| a.strip_prefix(flag).map(str::to_owned))
            .collect();
        assert_eq!(all.len(), 1, "{flag} given {} times", all.len());
        all[0].split(',').map(str::to_owned).collect()
    };
    let peers = list_of(
        &sts["spec"]["template"]["spec"]["containers"][0]["args"],
        "--peers=",
    );
    let agent = find(&objects, "DaemonSet", "commscope-agent");
    let routes = list_of(
        &agent["spec"]["template"]["spec"]["containers"][0]["args"],
        "--collector=",
    );
    let service = sts["spec"]["serviceName"].as_str().expect("serviceName");
    let want: Vec<String> = (0..n)
        .map(|i| format!("http://commscope-collector-{i}.{service}.commscope.svc:4650"))
        .collect();
    assert_eq!(peers, want);
    assert_eq!(routes, want);
}

/// The capabilities docs/deploy.md grants the agent: the first column of the table in "The
/// agent's privileges".
fn documented_capabilities() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo().join("docs/deploy.md")).expect("docs/deploy.md");
    let section = doc
        .split("\n## The agent's privileges")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the section");
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_agent_has_the_documented_privileges_and_no_more() {
    let caps = documented_capabilities();
    assert_eq!(
        caps,
        ["BPF", "PERFMON", "SYS_PTRACE", "NET_ADMIN", "SYS_RESOURCE"]
            .map(str::to_owned)
            .into()
    );
    let objects = yaml_docs(&kustomize("deploy/kubernetes"));
    let pod = &find(&objects, "DaemonSet", "commscope-agent")["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert!(pod["hostIPC"].is_null(), "{pod}");
    let containers: Vec<&Value> = pod["containers"]
        .as_array()
        .into_iter()
        .chain(pod["initContainers"].as_array())
        .flatten()
        .collect();
    assert_eq!(containers.len(), 2);
    for c in containers {
        let sc = &c["securityContext"];
        assert_eq!(sc["privileged"], false, "{c}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{c}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{c}");
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{c}");
        let added: Vec<String> = strings(&sc["capabilities"]["add"]);
        let unique: BTreeSet<String> = added.iter().cloned().collect();
        assert_eq!(unique.len(), added.len(), "{c}");
        if c["name"] == "agent" {
            assert_eq!(unique, caps, "the agent container");
        } else {
            assert!(added.is_empty(), "{c}");
        }
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            // Host paths it only reads are mounted read-only.
            if m["mountPath"] == "/sys/kernel/tracing" {
                assert_eq!(m["readOnly"], true, "{m}");
            }
        }
    }
    let host_paths: BTreeSet<String> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        host_paths,
        [
            "/opt/commscope/lib",
            "/run/commscope",
            "/sys/kernel/tracing",
            "/var/lib/commscope/spool"
        ]
        .map(str::to_owned)
        .into()
    );

    // The collector: unprivileged, nothing added, no API token.
    let pod = &find(&objects, "StatefulSet", "commscope-collector")["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["automountServiceAccountToken"], false);
    for c in pod["containers"].as_array().expect("containers") {
        let sc = &c["securityContext"];
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{c}");
        assert!(sc["capabilities"]["add"].is_null(), "{c}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{c}");
    }

    // The systemd unit bounds the agent to the same capabilities.
    let unit = std::fs::read_to_string(repo().join("deploy/systemd/commscope-agent.service"))
        .expect("unit");
    let bounding: BTreeSet<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_owned())
        .collect();
    assert_eq!(bounding, caps);
}

#[test]
fn the_containerfile_units_and_slurm_scripts_pass_their_checkers() {
    ok(&run("hadolint", &["deploy/Containerfile"]), "hadolint");

    // The units name the installed binary; verify them against the one built here.
    let bin = commscope_tests::commscope_bin();
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut units = Vec::new();
    for name in ["commscope-agent.service", "commscope-collector.service"] {
        let text = std::fs::read_to_string(repo().join("deploy/systemd").join(name)).expect("unit");
        let path = tmp.path().join(name);
        std::fs::write(
            &path,
            text.replace("/usr/bin/commscope", bin.to_str().expect("utf-8")),
        )
        .expect("write");
        units.push(path.to_str().expect("utf-8").to_owned());
    }
    let mut args = vec!["verify"];
    args.extend(units.iter().map(String::as_str));
    let o = run("systemd-analyze", &args);
    ok(&o, "systemd-analyze verify");
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "",
        "systemd-analyze verify warns"
    );

    let scripts: Vec<String> = ["prolog.sh", "task-prolog.sh", "epilog.sh"]
        .iter()
        .map(|s| format!("deploy/slurm/{s}"))
        .collect();
    let mut args = vec!["--shell=bash"];
    args.extend(scripts.iter().map(String::as_str));
    ok(&run("shellcheck", &args), "shellcheck");
}

/// `task-prolog.sh` as slurmstepd runs it: its `export` lines for a task's environment.
fn task_prolog(env: &[(&str, &str)]) -> Vec<String> {
    let mut c = Command::new("bash");
    c.arg(repo().join("deploy/slurm/task-prolog.sh"))
        .env_clear();
    c.env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("task-prolog.sh");
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_slurm_task_prolog_preloads_the_library_only_where_an_agent_listens() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let lib = tmp.path().join("libcommscope.so");
    std::fs::write(&lib, b"").expect("lib");
    let sock = tmp.path().join("agent.sock");
    let lib_s = lib.to_str().expect("utf-8");
    let sock_s = sock.to_str().expect("utf-8");
    let base = [("COMMSCOPE_LIB", lib_s), ("COMMSCOPE_AGENT_SOCKET", sock_s)];

    // No agent on the node: the task is left alone.
    assert_eq!(task_prolog(&base), Vec::<String>::new());

    let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("socket");
    let socket_line = format!("export COMMSCOPE_AGENT_SOCKET={sock_s}");
    assert_eq!(
        task_prolog(&base),
        [format!("export LD_PRELOAD={lib_s}"), socket_line.clone()]
    );
    // The task's own preloads stay, after the library.
    let mut with = base.to_vec();
    with.push(("LD_PRELOAD", "/opt/x/libfoo.so"));
    assert_eq!(
        task_prolog(&with),
        [
            format!("export LD_PRELOAD={lib_s}:/opt/x/libfoo.so"),
            socket_line.clone()
        ]
    );
    // Already preloaded (a step inside a step): not twice.
    let preloaded = format!("/opt/x/libfoo.so:{lib_s}");
    let mut again = base.to_vec();
    again.push(("LD_PRELOAD", &preloaded));
    assert_eq!(task_prolog(&again), [socket_line]);
    // Opted out.
    let mut out = base.to_vec();
    out.push(("COMMSCOPE_DISABLE", "1"));
    assert_eq!(task_prolog(&out), Vec::<String>::new());
    // Not a library it can read: nothing.
    let missing = tmp.path().join("absent.so");
    assert_eq!(
        task_prolog(&[
            ("COMMSCOPE_LIB", missing.to_str().expect("utf-8")),
            ("COMMSCOPE_AGENT_SOCKET", sock_s)
        ]),
        Vec::<String>::new()
    );
}
