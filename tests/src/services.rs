//! A collector and an agent as real processes (`commscope collector`, `commscope agent`) on
//! loopback, for end-to-end tests: start, kill -9, restart, query.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::commscope;

/// A free loopback port (bound and released; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The socket address printed right after `label` in a service's log (the last such line).
pub fn addr_after(log: &str, label: &str) -> Option<SocketAddr> {
    let rest = &log[log.rfind(label)? + label.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A child process whose stderr is collected.
#[derive(Debug)]
pub struct Service {
    pub child: Child,
    pub log: Arc<Mutex<String>>,
    pub what: &'static str,
    /// Set when its stderr reached its end: everything it wrote is in `log`.
    log_done: Arc<std::sync::atomic::AtomicBool>,
}

impl Service {
    /// Starts `cmd` with its stderr collected.
    pub fn spawn(mut cmd: Command, what: &'static str) -> Service {
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {what}: {e}"));
        let log = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let l = log.clone();
        let log_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = log_done.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut g = l.lock().unwrap_or_else(|p| p.into_inner());
                g.push_str(&line);
                g.push('\n');
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        Service {
            child,
            log,
            what,
            log_done,
        }
    }

    /// After it ended: waits (2 s at most: a child it left behind may hold its stderr open)
    /// until its last lines are in the log, so that what it said on its way out is read.
    fn drain_log(&self) {
        let t = Instant::now();
        while !self.log_done.load(std::sync::atomic::Ordering::Acquire)
            && t.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// What it printed on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until its log contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let t = Instant::now();
        while !self.log().contains(needle) {
            if self.exited() {
                panic!("the {} exited:\n{}", self.what, self.log());
            }
            assert!(
                t.elapsed() < timeout,
                "the {} did not log {needle:?} within {timeout:?}:\n{}",
                self.what,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has ended (a zombie, or gone), without reaping it.
    fn exited(&self) -> bool {
        let pid = self.child.id();
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(st) => st
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('Z')),
            Err(_) => true,
        }
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.drain_log();
    }

    /// SIGTERM and wait (graceful stop).
    pub fn stop(&mut self) {
        let pid = self.child.id() as i32;
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t = Instant::now();
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                self.drain_log();
                return;
            }
            if t.elapsed() > Duration::from_secs(20) {
                self.kill9();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// A collector and an agent in a temporary directory.
#[derive(Debug)]
pub struct Services {
    pub dir: tempfile::TempDir,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub agent_http: SocketAddr,
    pub socket: PathBuf,
    pub node: String,
    pub collector: Option<Service>,
    pub agent: Option<Service>,
    pub collector_args: Vec<String>,
    pub agent_args: Vec<String>,
    /// Environment the agent starts with (e.g. `COMMSCOPE_SYSFS_ROOT`).
    pub agent_env: Vec<(String, String)>,
    /// How the agent reaches the collector: `http`, or `https` when the collector has TLS.
    pub scheme: &'static str,
}

impl Services {
    /// Starts both, the agent named `node`; extra flags for each.
    pub fn start(node: &str, collector_args: &[&str], agent_args: &[&str]) -> Services {
        Services::start_with_agent_env(node, collector_args, agent_args, &[])
    }

    /// [`Services::start`], the agent with `agent_env` in its environment.
    pub fn start_with_agent_env(
        node: &str,
        collector_args: &[&str],
        agent_args: &[&str],
        agent_env: &[(&str, &str)],
    ) -> Services {
        let dir = tempfile::tempdir().expect("tempdir");
        // Port 0 on the first start: the services bind and print what they got (a port picked
        // here and released could be taken by anyone, e.g. an MPI job's connections, meanwhile).
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut s = Services {
            grpc: any,
            http: any,
            agent_http: any,
            socket: dir.path().join("agent.sock"),
            node: node.to_owned(),
            dir,
            collector: None,
            agent: None,
            collector_args: collector_args.iter().map(|s| s.to_string()).collect(),
            agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
            agent_env: agent_env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            scheme: if collector_args.contains(&"--tls-cert") {
                "https"
            } else {
                "http"
            },
        };
        s.start_collector();
        s.start_agent();
        s
    }

    /// The collector's trace directory.
    pub fn trace_dir(&self) -> PathBuf {
        self.dir.path().join("traces")
    }

    /// The agent's spool directory.
    pub fn spool_dir(&self) -> PathBuf {
        self.dir.path().join("spool")
    }

    /// (Re)starts the collector on the same addresses and directory.
    pub fn start_collector(&mut self) {
        let mut c = commscope();
        c.arg("collector")
            .arg("--listen")
            .arg(self.grpc.to_string())
            .arg("--http")
            .arg(self.http.to_string())
            .arg("--trace-dir")
            .arg(self.trace_dir())
            .args(&self.collector_args);
        let svc = Service::spawn(c, "collector");
        svc.wait_log("listening:", Duration::from_secs(30));
        let log = svc.log();
        // "listening: gRPC on A, HTTP on B": restarts reuse the same addresses.
        self.grpc = addr_after(&log, "gRPC on ").expect("the collector's gRPC address");
        self.http = addr_after(&log, "HTTP on ").expect("the collector's HTTP address");
        self.collector = Some(svc);
    }

    /// (Re)starts the agent.
    pub fn start_agent(&mut self) {
        let mut c = commscope();
        c.arg("agent")
            .arg("--collector")
            .arg(format!("{}://{}", self.scheme, self.grpc))
            .arg("--socket")
            .arg(&self.socket)
            .arg("--node")
            .arg(&self.node)
            .arg("--http")
            .arg(self.agent_http.to_string())
            .arg("--spool-dir")
            .arg(self.spool_dir())
            .args(&self.agent_args)
            .envs(self.agent_env.iter().map(|(k, v)| (k, v)));
        let svc = Service::spawn(c, "agent");
        svc.wait_log("registrations on", Duration::from_secs(30));
        self.agent_http = addr_after(&svc.log(), "metrics on ").expect("the agent's HTTP address");
        self.agent = Some(svc);
    }

    /// The collector's process.
    pub fn collector(&mut self) -> &mut Service {
        self.collector.as_mut().expect("collector running")
    }

    /// Whether the agent can learn exit statuses (the kernel's process-events connector needs
    /// CAP_NET_ADMIN; without it exits are still seen, their status is unknown).
    pub fn exit_statuses_known(&self) -> bool {
        self.agent
            .as_ref()
            .is_some_and(|a| !a.log().contains("exit statuses are unavailable"))
    }

    /// The agent's process.
    pub fn agent(&mut self) -> &mut Service {
        self.agent.as_mut().expect("agent running")
    }

    /// `GET` on the collector's HTTP side: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http, path)
    }

    /// `GET /api/v1/jobs/{job}` as JSON, once it answers 200.
    pub fn job(&self, job: &str) -> Option<serde_json::Value> {
        job_at(self.http, job)
    }

    /// The findings of `job` ([`findings_at`]).
    pub fn findings(&self, job: &str, state: &str) -> Vec<serde_json::Value> {
        findings_at(self.http, job, state)
    }

    /// Every finding the collector holds for `job`, open and resolved.
    pub fn every_finding(&self, job: &str) -> Vec<serde_json::Value> {
        self.findings(job, "open")
            .into_iter()
            .chain(self.findings(job, "resolved"))
            .collect()
    }

    /// Waits until the collector says the job ended; returns its detail.
    pub fn wait_job_ended(&self, job: &str, timeout: Duration) -> serde_json::Value {
        let t = Instant::now();
        loop {
            if let Some(j) = self.job(job)
                && j["state"] == "ended"
            {
                return j;
            }
            assert!(
                t.elapsed() < timeout,
                "job {job} did not end within {timeout:?}: {:?}\n--- collector\n{}\n--- agent\n{}",
                self.job(job),
                self.collector
                    .as_ref()
                    .map(Service::log)
                    .unwrap_or_default(),
                self.agent.as_ref().map(Service::log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the job's trace is fully in Parquet segments (no write-ahead log left).
    pub fn wait_segments(&self, job: &str, timeout: Duration) {
        let dir = self.trace_dir().join(job);
        let t = Instant::now();
        loop {
            let logs = std::fs::read_dir(&dir)
                .map(|it| {
                    it.flatten()
                        .filter(|e| e.path().extension().is_some_and(|x| x == "cswal"))
                        .count()
                })
                .unwrap_or(1);
            if logs == 0 {
                return;
            }
            assert!(
                t.elapsed() < timeout,
                "job {job}: write-ahead logs still present after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A minimal HTTP/1.1 GET: (status, body).
/// The sum of a metric's samples (every label set) on a `/metrics` page at `addr`.
pub fn metric(addr: SocketAddr, name: &str) -> f64 {
    let (_, body) = http_get(addr, "/metrics");
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get_with(addr, path, &[])
}

/// [`http_get`] with extra request headers (e.g. `Authorization`).
pub fn http_get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A collector's `GET /api/v1/jobs/{job}` at `http` as JSON, once it answers 200.
pub fn job_at(http: SocketAddr, job: &str) -> Option<serde_json::Value> {
    let (st, body) = http_get(http, &format!("/api/v1/jobs/{job}"));
    (st == 200).then(|| serde_json::from_str(&body).expect("job JSON"))
}

/// A collector's findings of `job` at `http` (`state`: `open`, `resolved`, or "" for both).
pub fn findings_at(http: SocketAddr, job: &str, state: &str) -> Vec<serde_json::Value> {
    let q = if state.is_empty() {
        format!("/api/v1/findings?job={job}")
    } else {
        format!("/api/v1/findings?job={job}&state={state}")
    };
    let (_, body) = http_get(http, &q);
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["findings"].as_array().cloned())
        .unwrap_or_default()
}

/// Runs `commscope run --agent-socket SOCK --job-id JOB -- CMD…` (no trace directory).
pub fn run_with_agent(
    socket: &Path,
    job: &str,
    cmd: &[std::ffi::OsString],
    extra_env: &[(&str, &str)],
) -> std::process::Output {
    run_with_agent_traced(socket, None, job, cmd, extra_env)
}

/// [`run_with_agent`], with `--trace-dir DIR` too when given (the shim's own trace files, and
/// `run`'s trace keeper that completes those of ranks killed before writing them out).
pub fn run_with_agent_traced(
    socket: &Path,
    trace_dir: Option<&Path>,
    job: &str,
    cmd: &[std::ffi::OsString],
    extra_env: &[(&str, &str)],
) -> std::process::Output {
    let mut c = commscope();
    c.arg("run").arg("--agent-socket").arg(socket);
    if let Some(d) = trace_dir {
        c.arg("--trace-dir").arg(d);
    }
    c.arg("--job-id").arg(job).arg("--").args(cmd);
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.output().expect("run commscope")
}

/// Per process `(node, pid, start)`: how often each `rec_seq` occurs, and the records.
pub type RawRecords = std::collections::BTreeMap<
    (String, u32, u64),
    (
        std::collections::BTreeMap<u64, u32>,
        Vec<commscope_wire::record::Record>,
    ),
>;

/// Every record in a collector's job directory, read without any dedup.
pub fn raw_records(job_dir: &Path) -> RawRecords {
    use commscope_wire::record::Record;
    let mut out: std::collections::BTreeMap<
        _,
        (std::collections::BTreeMap<u64, u32>, Vec<Record>),
    > = Default::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(job_dir)
        .expect("job directory")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    for f in files {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or_default();
        let procs: Vec<(String, u32, u64, Vec<Record>)> = match ext {
            "parquet" => commscope_wire::parquet::read(&f)
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
                .0
                .into_iter()
                .map(|p| (p.header.node, p.header.pid, p.header.start_time, p.records))
                .collect(),
            "cswal" => {
                let bytes = std::fs::read(&f).expect("read log");
                commscope_wire::wal::parse(&bytes)
                    .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
                    .entries
                    .into_iter()
                    .map(|e| {
                        (
                            e.header.node,
                            e.header.pid,
                            e.header.start_time,
                            e.records
                                .iter()
                                .filter_map(|r| Record::decode(r).ok())
                                .collect(),
                        )
                    })
                    .collect()
            }
            _ => continue,
        };
        for (node, pid, start, recs) in procs {
            let e = out.entry((node, pid, start)).or_default();
            for r in recs {
                *e.0.entry(r.rec_seq()).or_insert(0) += 1;
                e.1.push(r);
            }
        }
    }
    out
}

/// Sends `msgs` on one ingest stream to the collector's gRPC address, as an agent would (plain
/// HTTP/2, no token), and reads every answer until the collector ends the stream.
pub async fn ingest_stream(
    grpc: SocketAddr,
    msgs: Vec<commscope_wire::grpc::IngestRequest>,
) -> Vec<commscope_wire::grpc::IngestAck> {
    use commscope_wire::grpc::ingest_client::IngestClient;
    let mut c = IngestClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let mut acks = c
        .stream(tokio_stream::iter(msgs))
        .await
        .expect("stream")
        .into_inner();
    let mut out = Vec::new();
    while let Ok(Some(a)) = acks.message().await {
        out.push(a);
    }
    out
}

/// Findings as lines for assertion messages: kind, class, state, ranks and sentence.
pub fn show_findings(v: &[serde_json::Value]) -> String {
    v.iter()
        .map(|f| {
            format!(
                "{} {} {} {} {}",
                f["kind"], f["class"], f["state"], f["ranks"], f["summary"]
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
