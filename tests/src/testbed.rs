//! A multi-node testbed on one machine: network-namespace nodes on a bridge ([`Nodes`]), a
//! collector on the bridge's host side, and one agent per node in the node's network namespace
//! with its own `/run/commscope` (a private mount namespace), so that the ranks Open MPI starts
//! on a node (through an rsh agent that enters the node's namespaces) register with their own
//! node's agent. Everything is torn down on drop, also when a test fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::services::{Service, addr_after, findings_at, job_at};
use crate::{Nodes, commscope_bin};

/// The socket every node's agent listens on, inside that node's mount namespace.
pub const NODE_SOCKET: &str = "/run/commscope/agent.sock";

/// One testbed at a time per test process: node names, the bridge and the subnet derive from
/// the process id, and two 3-node jobs at once would swamp two cores anyway.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[derive(Debug)]
pub struct Testbed {
    pub nodes: Nodes,
    pub dir: tempfile::TempDir,
    pub collector: Service,
    /// The collector's HTTP API (on loopback) and gRPC listener (on the bridge).
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    /// One agent per node, in `nodes.names` order.
    pub agents: Vec<Service>,
    /// The rsh agent that starts processes inside a node's network, UTS and mount namespaces.
    pub rsh: PathBuf,
    _one: std::sync::MutexGuard<'static, ()>,
}

impl Testbed {
    /// `n` nodes, each with its agent; `agent_args` go to every agent.
    pub fn new(n: usize, agent_args: &[&str]) -> Testbed {
        Testbed::new_with(n, agent_args, false)
    }

    /// [`Testbed::new`]; with `nic_fixtures`, each node's agent reads NIC counters from its own
    /// sysfs fixture tree, [`Testbed::sysfs`] (a node's netns has only a veth, no NIC).
    pub fn new_with(n: usize, agent_args: &[&str], nic_fixtures: bool) -> Testbed {
        let one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let nodes = Nodes::new(n);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all("/run/commscope").expect("mkdir /run/commscope");
        let mut c = Command::new(commscope_bin());
        c.arg("collector")
            .arg("--listen")
            .arg(format!("{}:0", nodes.gateway))
            .arg("--http")
            .arg("127.0.0.1:0")
            .arg("--trace-dir")
            .arg(dir.path().join("traces"));
        let collector = Service::spawn(c, "collector");
        collector.wait_log("listening:", Duration::from_secs(30));
        let log = collector.log();
        let grpc = addr_after(&log, "gRPC on ").expect("the collector's gRPC address");
        let http = addr_after(&log, "HTTP on ").expect("the collector's HTTP address");
        let mut agents = Vec::new();
        for name in &nodes.names {
            let sysfs = dir.path().join("sysfs").join(name);
            let env = if nic_fixtures {
                std::fs::create_dir_all(&sysfs).expect("mkdir sysfs fixture");
                format!("COMMSCOPE_SYSFS_ROOT={} ", sysfs.display())
            } else {
                String::new()
            };
            let script = format!(
                "mount -t tmpfs commscope /run/commscope && {env}exec {} agent --collector http://{grpc} --node {name} --socket {NODE_SOCKET} --http 127.0.0.1:0 --spool-dir {} {}",
                commscope_bin().display(),
                dir.path().join(format!("spool-{name}")).display(),
                agent_args.join(" ")
            );
            let mut c = Command::new("ip");
            c.args(["netns", "exec", name])
                .args([
                    "unshare",
                    "--mount",
                    "--propagation",
                    "private",
                    "/bin/sh",
                    "-c",
                ])
                .arg(script);
            let agent = Service::spawn(c, "agent");
            agent.wait_log("connected to the collector", Duration::from_secs(30));
            agents.push(agent);
        }
        // Processes started on a node join its agent's mount namespace (its /run/commscope).
        let rsh = dir.path().join("nsrsh");
        let pids: Vec<String> = nodes
            .names
            .iter()
            .zip(&agents)
            .map(|(n, a)| format!("  {n}) pid={} ;;", a.child.id()))
            .collect();
        std::fs::write(
            &rsh,
            format!(
                "#!/bin/sh\n[ \"$1\" = -x ] && shift\nhost=$1; shift\ncase $host in\n{}\n  *) echo \"nsrsh: unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$host\" nsenter --mount=/proc/$pid/ns/mnt unshare --uts /bin/sh -c \"hostname $host; $*\"\n",
                pids.join("\n")
            ),
        )
        .expect("write rsh agent");
        std::fs::set_permissions(&rsh, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod");
        Testbed {
            nodes,
            dir,
            collector,
            http,
            grpc,
            agents,
            rsh,
            _one: one,
        }
    }

    /// Open MPI launcher arguments placing `per_node` ranks on each node, over TCP on the
    /// nodes' subnet.
    pub fn openmpi_args(&self, per_node: u32) -> Vec<String> {
        let mut a = self.nodes.openmpi_args(per_node);
        let i = a
            .iter()
            .position(|x| x == "plm_rsh_agent")
            .expect("rsh agent argument");
        a[i + 1] = self.rsh.display().to_string();
        a
    }

    /// Findings of `job` (`state`: `open`, `resolved`, or "" for both).
    pub fn findings(&self, job: &str, state: &str) -> Vec<serde_json::Value> {
        findings_at(self.http, job, state)
    }

    /// The collector's view of `job`, once it knows it.
    pub fn job(&self, job: &str) -> Option<serde_json::Value> {
        job_at(self.http, job)
    }

    /// Throttles what node `i` receives (its veth's egress on the bridge side) to `rate`
    /// (`tc` syntax, e.g. `40mbit`) with a token bucket, or removes the throttle (`None`).
    pub fn throttle(&self, i: usize, rate: Option<&str>) {
        let dev = format!("v{}", self.nodes.names[i]);
        match rate {
            Some(r) => {
                let o = Command::new("tc")
                    .args(["qdisc", "replace", "dev", &dev, "root", "tbf", "rate", r])
                    .args(["burst", "64kb", "latency", "200ms"])
                    .output()
                    .expect("run tc");
                assert!(
                    o.status.success(),
                    "tc: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            None => {
                let _ = Command::new("tc")
                    .args(["qdisc", "del", "dev", &dev, "root"])
                    .output();
            }
        }
    }

    /// Runs [`Testbed::job_command`]; returns the launcher's exit status.
    pub fn run_job(
        &self,
        job: &str,
        per_node: u32,
        ranks: u32,
        program: &[&str],
    ) -> std::process::ExitStatus {
        self.job_command(job, per_node, ranks, program)
            .status()
            .expect("run the job")
    }

    /// An Open MPI job of `ranks` ranks, `per_node` a node, through `commscope run` with every
    /// rank on its node's agent. Its output goes nowhere: daemons cut off behind a downed link
    /// would hold a pipe open.
    pub fn job_command(&self, job: &str, per_node: u32, ranks: u32, program: &[&str]) -> Command {
        let mut cmd = Command::new(commscope_bin());
        cmd.arg("run")
            .arg("--agent-socket")
            .arg(NODE_SOCKET)
            .arg("--job-id")
            .arg(job)
            .arg("--")
            .arg("mpirun")
            .args(self.openmpi_args(per_node))
            .args(["-np", &ranks.to_string()])
            .args(program)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        cmd
    }

    /// Node `i`'s NIC fixture tree (with [`Testbed::new_with`]'s `nic_fixtures`).
    pub fn sysfs(&self, i: usize) -> std::path::PathBuf {
        self.dir.path().join("sysfs").join(&self.nodes.names[i])
    }

    /// Node `i`'s address on the nodes' network.
    pub fn address(&self, i: usize) -> String {
        let prefix = self
            .nodes
            .gateway
            .rsplit_once('.')
            .map_or("", |(p, _)| p)
            .to_owned();
        format!("{prefix}.{}", i + 1)
    }

    /// Kills the data path between node `i` and the other nodes (`cut`), or heals it: node
    /// `i`'s neighbour entries for its peers, and theirs for it, point to a MAC address nobody
    /// has, so frames between them vanish. Everyone's traffic with the bridge's host side (the
    /// collector, the launcher) still flows, so the agents stay in contact. A silent black
    /// hole, as a failed switch port or a bad route makes: no carrier change, no error.
    pub fn blackhole(&self, i: usize, cut: bool) {
        let node = &self.nodes.names[i];
        for (j, peer) in self.nodes.names.iter().enumerate() {
            if j == i {
                continue;
            }
            for (on, to) in [(node, self.address(j)), (peer, self.address(i))] {
                if cut {
                    crate::ip(&[
                        "-n",
                        on,
                        "neigh",
                        "replace",
                        &to,
                        "lladdr",
                        "02:00:00:00:de:ad",
                        "dev",
                        "eth0",
                        "nud",
                        "permanent",
                    ]);
                } else {
                    let _ = Command::new("ip")
                        .args(["-n", on, "neigh", "del", &to, "dev", "eth0"])
                        .output();
                }
            }
        }
    }

    /// Sets node `i`'s link (its veth on the bridge) down or up.
    pub fn link(&self, i: usize, up: bool) {
        crate::ip(&[
            "link",
            "set",
            &format!("v{}", self.nodes.names[i]),
            if up { "up" } else { "down" },
        ]);
    }
}

impl Testbed {
    /// Kills every process in the nodes' network namespaces but their agents: ranks and Open
    /// MPI's daemons, including those behind a downed link that their launcher cannot reach.
    pub fn kill_jobs(&self) {
        let agents: Vec<u32> = self.agents.iter().map(|a| a.child.id()).collect();
        let others = || -> Vec<i32> {
            self.nodes
                .names
                .iter()
                .filter_map(|name| {
                    Command::new("ip")
                        .args(["netns", "pids", name])
                        .output()
                        .ok()
                })
                .flat_map(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok())
                        .collect::<Vec<_>>()
                })
                .filter(|p| !agents.contains(&(*p as u32)))
                .collect()
        };
        let t = std::time::Instant::now();
        loop {
            let left = others();
            if left.is_empty() || t.elapsed() > Duration::from_secs(10) {
                return;
            }
            for pid in left {
                // SAFETY: a signal to a process in a namespace this testbed created.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        self.kill_jobs();
        for a in &mut self.agents {
            a.stop();
        }
        self.collector.stop();
    }
}
