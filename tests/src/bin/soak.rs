//! The soak and fault run (`scripts/soak.sh [SECONDS]`; never part of the tests): real MPI jobs
//! and a simulated 4,096-rank job through two agents and two collector replicas, while the
//! collectors, the agents and single ranks are killed and restarted, a spool's disk fills up,
//! and garbage goes to every port. Then it accounts for every record: each rank's records must
//! be in the traces exactly once, or counted as dropped with a reason. Its last line is
//! `soak: PASS …` or `soak: FAIL …`.
//!
//! Run from the repository after `cargo build --release` (the script does it). Root mounts
//! the spool of node 1 on a 4 MiB tmpfs (a full disk, ENOSPC); without root that spool is
//! bounded by `--spool-max-bytes` instead.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use commscope_tests::bench::{cpu_seconds, release_bin, rss_bytes};
use commscope_tests::services::{Service, addr_after, free_port, http_get, raw_records};
use commscope_tests::{Flavour, build, launch};
use commscope_wire::op::flags;
use commscope_wire::record::Record;

/// A component that is killed and restarted: how to start it, and what it did.
struct Part {
    name: String,
    args: Vec<String>,
    svc: Option<Service>,
    restarts: u32,
    /// Peak RSS (bytes) per phase: while the simulated job runs, then the first and the
    /// second half of the MPI phase (jobs of the same kind coming and going: a leak shows as
    /// growth from the one half to the other).
    peak: [u64; 3],
    cpu_s: f64,
    /// Logs of earlier incarnations.
    logs: String,
}

impl Part {
    fn new(name: &str, args: Vec<String>) -> Part {
        Part {
            name: name.to_owned(),
            args,
            svc: None,
            restarts: 0,
            peak: [0; 3],
            cpu_s: 0.0,
            logs: String::new(),
        }
    }

    fn start(&mut self, ready: &str) -> Duration {
        let t = Instant::now();
        let mut c = Command::new(release_bin());
        c.args(&self.args);
        let svc = Service::spawn(c, "soak component");
        svc.wait_log(ready, Duration::from_secs(60));
        self.svc = Some(svc);
        t.elapsed()
    }

    fn pid(&self) -> Option<u32> {
        self.svc.as_ref().map(|s| s.child.id())
    }

    /// kill -9 (its log is kept).
    fn kill(&mut self) {
        if let Some(mut s) = self.svc.take() {
            self.cpu_s += cpu_seconds(s.child.id());
            s.kill9();
            self.logs.push_str(&s.log());
        }
    }

    /// SIGTERM and wait.
    fn stop(&mut self) {
        if let Some(mut s) = self.svc.take() {
            self.cpu_s += cpu_seconds(s.child.id());
            s.stop();
            self.logs.push_str(&s.log());
        }
    }

    /// Whether it died without being told to.
    fn crashed(&mut self) -> Option<String> {
        let s = self.svc.as_mut()?;
        match s.child.try_wait() {
            Ok(Some(st)) => Some(format!("{} exited on its own ({st})", self.name)),
            _ => None,
        }
    }

    fn sample(&mut self, phase: usize) {
        if let Some(pid) = self.pid() {
            self.peak[phase] = self.peak[phase].max(rss_bytes(pid));
        }
    }

    fn log(&self) -> String {
        let mut l = self.logs.clone();
        if let Some(s) = &self.svc {
            l.push_str(&s.log());
        }
        l
    }
}

/// A running MPI job.
struct Job {
    id: String,
    child: Child,
    started: Instant,
    rank_killed: bool,
}

struct Soak {
    root: PathBuf,
    collectors: Vec<Part>,
    grpc: Vec<SocketAddr>,
    http: Vec<SocketAddr>,
    agents: Vec<Part>,
    sockets: Vec<PathBuf>,
    jobs: Vec<Job>,
    done: Vec<String>,
    failures: Vec<String>,
    events: Vec<String>,
    garbage_sent: u64,
    reconnects: Vec<f64>,
    t0: Instant,
}

impl Soak {
    fn say(&mut self, what: String) {
        let line = format!("[{:6.1} s] {what}", self.t0.elapsed().as_secs_f64());
        println!("{line}");
        self.events.push(line);
    }

    fn collector_args(&self, i: usize, http: SocketAddr) -> Vec<String> {
        let peers: Vec<String> = self.grpc.iter().map(|a| format!("http://{a}")).collect();
        vec![
            "collector".into(),
            "--listen".into(),
            self.grpc[i].to_string(),
            "--http".into(),
            http.to_string(),
            "--trace-dir".into(),
            self.root.join(format!("traces-{i}")).display().to_string(),
            "--peers".into(),
            peers.join(","),
            "--segment-age".into(),
            "10s".into(),
        ]
    }

    fn start_collector(&mut self, i: usize) {
        let args = self.collector_args(i, self.http[i]);
        self.collectors[i].args = args;
        let took = self.collectors[i].start("listening:");
        let log = self.collectors[i].log();
        if let Some(h) = addr_after(&log, "HTTP on ") {
            self.http[i] = h;
        }
        self.say(format!(
            "collector {i} ready in {:.2} s",
            took.as_secs_f64()
        ));
    }

    fn start_agent(&mut self, i: usize) {
        let took = self.agents[i].start("registrations on");
        self.say(format!("agent {i} ready in {:.2} s", took.as_secs_f64()));
    }

    fn start_job(&mut self, prog: &Path, n: u32) {
        let id = format!("soak-{}", self.done.len() + self.jobs.len());
        let node = (self.done.len() + self.jobs.len()) % self.agents.len();
        let secs = 6 + (self.jobs.len() as u64 * 3) % 10;
        let mut c = Command::new(release_bin());
        c.arg("run")
            .arg("--agent-socket")
            .arg(&self.sockets[node])
            .arg("--job-id")
            .arg(&id)
            .arg("--")
            .args(launch(Flavour::Mpich, n, prog, &[&secs.to_string(), "300"]))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match c.spawn() {
            Ok(child) => {
                self.say(format!("job {id}: {n} ranks for {secs} s on node {node}"));
                self.jobs.push(Job {
                    id,
                    child,
                    started: Instant::now(),
                    rank_killed: false,
                });
            }
            Err(e) => self.failures.push(format!("cannot start job {id}: {e}")),
        }
    }

    fn reap(&mut self) {
        let mut i = 0;
        while i < self.jobs.len() {
            if let Ok(Some(_)) = self.jobs[i].child.try_wait() {
                let j = self.jobs.remove(i);
                self.done.push(j.id);
            } else {
                i += 1;
            }
        }
    }

    /// kill -9 one rank of the oldest job still running that has not lost one.
    fn kill_rank(&mut self) {
        let Some(j) = self
            .jobs
            .iter_mut()
            .find(|j| !j.rank_killed && j.started.elapsed() > Duration::from_secs(2))
        else {
            return;
        };
        let want = format!("COMMSCOPE_JOB_ID={}", j.id);
        let pid = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                String::from_utf8_lossy(&cmd).contains("steady")
                    && env.split(|b| *b == 0).any(|v| v == want.as_bytes())
            });
        if let Some(pid) = pid {
            j.rank_killed = true;
            let id = j.id.clone();
            // SAFETY: killing a process of our own job.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            self.say(format!("killed a rank of {id} (pid {pid})"));
        }
    }

    /// Garbage on every port and socket: the collectors' gRPC and HTTP, the agents' HTTP and
    /// registration sockets.
    fn garbage(&mut self) {
        let mut junk = vec![0u8; 64 << 10];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ self.garbage_sent;
        for b in junk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let mut tcp: Vec<SocketAddr> = self.grpc.clone();
        tcp.extend(&self.http);
        for a in &self.agents {
            if let Some(h) = addr_after(&a.log(), "metrics on ") {
                tcp.push(h);
            }
        }
        for addr in tcp {
            for prefix in [
                &b""[..],
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                b"GET / HTTP/1.1\r\n",
            ] {
                if let Ok(mut s) =
                    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                {
                    let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                    let _ = s.write_all(prefix);
                    let _ = s.write_all(&junk);
                    self.garbage_sent += 1;
                }
            }
        }
        for sock in &self.sockets {
            if let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) {
                let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = s.write_all(&junk);
                self.garbage_sent += 1;
            }
        }
        self.say(format!(
            "garbage sent ({} connections so far)",
            self.garbage_sent
        ));
    }

    fn check_alive(&mut self) {
        let mut crashed = Vec::new();
        for p in self.collectors.iter_mut().chain(self.agents.iter_mut()) {
            if let Some(c) = p.crashed() {
                crashed.push(format!("{c}:\n{}", tail(&p.log(), 20)));
            }
        }
        self.failures.extend(crashed);
    }
}

/// Everything `from` says, collected on a thread of its own.
type Captured = std::sync::Arc<std::sync::Mutex<String>>;

fn capture(from: Option<impl std::io::Read + Send + 'static>) -> Captured {
    let text = Captured::default();
    if let Some(mut from) = from {
        let t = text.clone();
        std::thread::spawn(move || {
            let mut buf = String::new();
            let _ = from.read_to_string(&mut buf);
            t.lock().unwrap_or_else(|p| p.into_inner()).push_str(&buf);
        });
    }
    text
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What the traces hold of one process, against what it made.
#[derive(Default, Debug)]
struct Account {
    produced: u64,
    dropped: u64,
    stored: u64,
    duplicates: u64,
    missing: u64,
    /// The first missing `rec_seq` values.
    missing_seqs: Vec<u64>,
    final_seen: bool,
    /// Accounted by the shim's own last heartbeat (at `MPI_Finalize`): the agent's final
    /// account is missing (it was killed after the process ended, before sending it).
    by_shim: bool,
}

/// Accounts for every process of `job` over every collector's trace directory.
fn account(roots: &[PathBuf], job: &str) -> BTreeMap<(String, u32, u64), Account> {
    let mut seqs: commscope_tests::services::RawRecords = BTreeMap::new();
    for r in roots {
        let dir = r.join(job);
        if !dir.is_dir() {
            continue;
        }
        for (k, (s, recs)) in raw_records(&dir) {
            let e = seqs.entry(k).or_default();
            for (seq, n) in s {
                *e.0.entry(seq).or_insert(0) += n;
            }
            e.1.extend(recs);
        }
    }
    let mut out = BTreeMap::new();
    for (k, (s, recs)) in seqs {
        let mut a = Account::default();
        // The agent's final account of the process: the ring's write position and its drops.
        for r in &recs {
            if let Record::Heartbeat(h) = r
                && h.flags & flags::AGENT_BEAT != 0
            {
                a.final_seen = true;
                a.produced = a.produced.max(h.produced);
                a.dropped = a.dropped.max(h.dropped_ring_full + h.dropped_other);
            }
        }
        // Else the shim's last heartbeat: everything through it.
        if !a.final_seen {
            for r in &recs {
                if let Record::Heartbeat(h) = r
                    && h.flags & flags::FINAL != 0
                {
                    a.final_seen = true;
                    a.by_shim = true;
                    a.produced = a.produced.max(h.rec_seq);
                    a.dropped = a.dropped.max(h.dropped_ring_full + h.dropped_other);
                }
            }
        }
        // Sampled-out spans are delivered (counted in their skip records).
        let mut sampled = std::collections::BTreeSet::new();
        for r in &recs {
            if let Record::Skip(sk) = r
                && let Some((lo, hi)) = sk.sent_span()
            {
                sampled.extend(lo..=hi);
            }
        }
        for seq in 1..=a.produced {
            match s.get(&seq) {
                Some(1) => a.stored += 1,
                Some(n) => {
                    a.stored += 1;
                    a.duplicates += u64::from(*n - 1);
                }
                None if sampled.contains(&seq) => a.stored += 1,
                None => {
                    a.missing += 1;
                    if a.missing_seqs.len() < 8 {
                        a.missing_seqs.push(seq);
                    }
                }
            }
        }
        a.duplicates += s
            .iter()
            .filter(|(seq, n)| **seq > a.produced && **n > 1)
            .map(|(_, n)| u64::from(*n - 1))
            .sum::<u64>();
        out.insert(k, a);
    }
    out
}

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
        .max(90);
    let root_user = commscope_tests::root();
    let tmp = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let root = tmp.path().to_path_buf();
    let prog = build(Flavour::Mpich, "steady");
    println!(
        "soak: {secs} s, 2 collectors, 2 agents, MPICH jobs and a simulated 4,096-rank job ({} cores){}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        if root_user {
            ""
        } else {
            "; not root: the spool is bounded by --spool-max-bytes, not a full disk"
        }
    );

    // Node 1's spool on a tiny tmpfs: a full disk.
    let small_spool = root.join("spool-1");
    std::fs::create_dir_all(&small_spool).expect("spool dir");
    let mounted = root_user
        && Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
            .arg(&small_spool)
            .status()
            .is_ok_and(|s| s.success());

    let grpc: Vec<SocketAddr> = (0..2)
        .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
        .collect();
    let mut s = Soak {
        root: root.clone(),
        collectors: (0..2)
            .map(|i| Part::new(&format!("collector {i}"), vec![]))
            .collect(),
        grpc: grpc.clone(),
        http: (0..2)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect(),
        agents: Vec::new(),
        sockets: (0..2)
            .map(|i| root.join(format!("agent-{i}.sock")))
            .collect(),
        jobs: Vec::new(),
        done: Vec::new(),
        failures: Vec::new(),
        events: Vec::new(),
        garbage_sent: 0,
        reconnects: Vec::new(),
        t0: Instant::now(),
    };
    let list: Vec<String> = grpc.iter().map(|a| format!("http://{a}")).collect();
    for i in 0..2 {
        let mut args = vec![
            "agent".to_owned(),
            "--collector".into(),
            list.join(","),
            "--socket".into(),
            s.sockets[i].display().to_string(),
            "--node".into(),
            format!("soak-node-{i}"),
            "--http".into(),
            format!("127.0.0.1:{}", free_port()),
            "--spool-dir".into(),
            if i == 1 {
                small_spool.display().to_string()
            } else {
                root.join("spool-0").display().to_string()
            },
            "--spool-after".into(),
            "1s".into(),
        ];
        if i == 1 && !mounted {
            args.extend(["--spool-max-bytes".into(), "4MiB".into()]);
        }
        s.agents.push(Part::new(&format!("agent {i}"), args));
    }
    for i in 0..2 {
        s.start_collector(i);
        s.start_agent(i);
    }

    // The simulated 4,096-rank job, through collector 1, in the first phase. Its nodes stream
    // as agents do, reconnecting and sending again what was not acknowledged: collector 1 is
    // killed under it.
    let sim_secs = (secs / 4).clamp(20, 60);
    let sim = Command::new(release_bin())
        .args(["simulate", "--collector"])
        .arg(format!("http://{}", grpc[1]))
        .args([
            "--ranks",
            "4096",
            "--duration",
            &sim_secs.to_string(),
            "--job-id",
            "soak-sim-4096",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("simulate");
    let sim_started = Instant::now();
    let mut sim = Some(sim);
    // Read as it comes (a full pipe would stop the simulator).
    let sim_text = capture(sim.as_mut().and_then(|c| c.stdout.take()));
    let sim_err = capture(sim.as_mut().and_then(|c| c.stderr.take()));

    let deadline = Instant::now() + Duration::from_secs(secs.saturating_sub(45));
    let mut tick = 0u64;
    let mut spool_fill_until: Option<Instant> = None;
    // When the MPI phase began (the simulated job ended).
    let mut mpi_from: Option<Instant> = None;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_secs(1));
        tick += 1;
        let phase = match mpi_from {
            None => 0,
            Some(t) if Instant::now() < t + (deadline - t) / 2 => 1,
            Some(_) => 2,
        };
        for p in s.collectors.iter_mut().chain(s.agents.iter_mut()) {
            p.sample(phase);
        }
        s.reap();
        s.check_alive();
        if let Some(c) = sim.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            sim = None;
            mpi_from = Some(Instant::now());
            s.say(format!("the simulated job ended ({st})"));
        }
        // MPI jobs once the simulated job is done: MPICH's ranks poll inside their
        // collectives, and on two cores they would starve the simulator (its latencies, not
        // its records, would suffer).
        if sim.is_none() && s.jobs.len() < 3 && tick.is_multiple_of(3) {
            let n = 2 + (tick % 2) as u32;
            s.start_job(&prog, n);
        }
        let sim_running =
            sim.is_some() && sim_started.elapsed() < Duration::from_secs(sim_secs + 30);
        match tick % 24 {
            4 => s.kill_rank(),
            8 => {
                s.agents[0].kill();
                s.say("killed agent 0".into());
                std::thread::sleep(Duration::from_millis(800));
                s.agents[0].restarts += 1;
                s.start_agent(0);
            }
            12 => {
                // The simulated job's replica while it runs.
                let i = usize::from(sim_running);
                s.collectors[i].kill();
                s.say(format!("killed collector {i}"));
                std::thread::sleep(Duration::from_secs(2));
                s.collectors[i].restarts += 1;
                s.start_collector(i);
            }
            16 => s.garbage(),
            20 if spool_fill_until.is_none() => {
                // Both replicas away long enough for node 1's spool to fill its disk.
                for i in 0..2 {
                    s.collectors[i].kill();
                }
                s.say("killed both collectors: node 1's spool fills its disk".into());
                spool_fill_until = Some(Instant::now() + Duration::from_secs(15));
            }
            _ => {}
        }
        if spool_fill_until.is_some_and(|t| Instant::now() >= t) {
            spool_fill_until = None;
            for i in 0..2 {
                s.collectors[i].restarts += 1;
                s.start_collector(i);
            }
        }
    }
    if spool_fill_until.is_some() {
        for i in 0..2 {
            s.start_collector(i);
        }
    }

    // Drain: every job ends, the agents deliver, the collectors end the jobs.
    s.say("no more faults: waiting for every job to end and be delivered".into());
    let t = Instant::now();
    while !s.jobs.is_empty() && t.elapsed() < Duration::from_secs(60) {
        s.reap();
        std::thread::sleep(Duration::from_millis(200));
    }
    for j in &mut s.jobs {
        let _ = j.child.kill();
        s.failures.push(format!("job {} did not end in time", j.id));
    }
    if let Some(mut c) = sim.take() {
        let _ = c.wait();
    }
    std::thread::sleep(Duration::from_millis(200));
    let sim_out = sim_text.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let jobs = s.done.clone();
    let ended = |s: &Soak, job: &str| {
        s.http.iter().any(|h| {
            let (st, body) = http_get(*h, &format!("/api/v1/jobs/{job}"));
            st == 200 && body.contains("\"state\":\"ended\"")
        })
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(60) && !jobs.iter().all(|j| ended(&s, j)) {
        std::thread::sleep(Duration::from_millis(500));
    }
    for j in &jobs {
        if !ended(&s, j) {
            s.failures
                .push(format!("job {j} never ended at a collector"));
        }
    }
    s.check_alive();
    // What the agents counted: the spool's failures (a full disk) among them.
    let mut agent_counts = Vec::new();
    for p in &s.agents {
        let Some(h) = addr_after(&p.log(), "metrics on ") else {
            continue;
        };
        let (_, m) = http_get(h, "/metrics");
        let get = |name: &str| -> f64 {
            m.lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        agent_counts.push(format!(
            "{}: spool write failures {} (this incarnation), records spooled {}",
            p.name,
            get("commscope_agent_spool_errors_total"),
            get("commscope_agent_records_spooled_total")
        ));
    }
    for p in s.agents.iter_mut() {
        p.stop();
    }
    for p in s.collectors.iter_mut() {
        p.stop();
    }

    // Accounting.
    let roots: Vec<PathBuf> = (0..2).map(|i| root.join(format!("traces-{i}"))).collect();
    let (mut made, mut stored, mut dropped, mut dups, mut missing, mut procs) = (0, 0, 0, 0, 0, 0);
    let mut by_shim = 0;
    for j in &jobs {
        let acc = account(&roots, j);
        if acc.is_empty() {
            s.failures.push(format!("job {j}: no records in any trace"));
        }
        for (k, a) in &acc {
            procs += 1;
            made += a.produced + a.dropped;
            stored += a.stored;
            dropped += a.dropped;
            dups += a.duplicates;
            missing += a.missing;
            by_shim += u64::from(a.by_shim);
            if !a.final_seen {
                s.failures.push(format!(
                    "job {j} {k:?}: no final account (the agent's or the shim's last heartbeat): its records cannot be checked"
                ));
            }
            if a.missing > 0 || a.duplicates > 0 {
                s.failures.push(format!(
                    "job {j} {k:?}: {} records missing (rec_seq {:?} of 1..={}), {} stored twice",
                    a.missing, a.missing_seqs, a.produced, a.duplicates
                ));
            }
        }
    }
    // Every record batch acknowledged, through the collector kills.
    let sim_ok = sim_out.contains(", 0 refused)")
        && sim_out.contains(", 0 never acknowledged, 0 dropped unsent;");
    let sim_line = sim_out
        .lines()
        .find(|l| l.starts_with("sent "))
        .unwrap_or("(no summary)")
        .to_owned();
    if !sim_ok {
        let err = sim_err.lock().unwrap_or_else(|p| p.into_inner()).clone();
        s.failures
            .push(format!("the simulated job: {sim_line}\n{}", tail(&err, 10)));
    }
    let sim_stored = roots.iter().any(|r| r.join("soak-sim-4096").is_dir());
    if !sim_stored {
        s.failures.push("the simulated job left no trace".into());
    }
    // Its records as the MPI jobs': every simulated rank's, through its final heartbeat.
    let sim_acc = account(&roots, "soak-sim-4096");
    let mut sim_rec = [0u64; 4];
    for (k, a) in &sim_acc {
        sim_rec[0] += a.produced;
        sim_rec[1] += a.stored;
        sim_rec[2] += a.missing;
        sim_rec[3] += a.duplicates;
        if !a.final_seen {
            s.failures
                .push(format!("the simulated job {k:?}: no final heartbeat"));
        }
    }
    if sim_stored && (sim_acc.len() != 4096 || sim_rec[2] > 0 || sim_rec[3] > 0) {
        s.failures.push(format!(
            "the simulated job: {} processes stored, {} records missing, {} stored twice",
            sim_acc.len(),
            sim_rec[2],
            sim_rec[3]
        ));
    }
    for p in s.collectors.iter().chain(&s.agents) {
        if p.log().contains("panicked") {
            s.failures
                .push(format!("{} panicked:\n{}", p.name, tail(&p.log(), 20)));
        }
    }
    for p in s.agents.iter() {
        for l in p.log().lines() {
            if let Some(v) = l
                .split("(after ")
                .nth(1)
                .and_then(|r| r.split(" s without").next())
                .and_then(|v| v.parse::<f64>().ok())
            {
                s.reconnects.push(v);
            }
        }
    }
    // Memory: flat when the MPI phase's second half peaks within 25 % (plus 16 MiB) of its
    // first half (the simulated job's phase is a different load: reported, not compared).
    if mpi_from.is_none_or(|t| deadline.saturating_duration_since(t) < Duration::from_secs(40)) {
        s.failures.push(
            "the MPI phase was too short to judge memory (the simulated job ran long)".into(),
        );
    }
    let mut memory = Vec::new();
    let mib = |b: u64| b as f64 / 1048576.0;
    for p in s.collectors.iter().chain(&s.agents) {
        let [sim, a, b] = p.peak;
        memory.push(format!(
            "{} peak RSS {:.0} MiB with the simulated job; MPI phase {:.0} MiB → {:.0} MiB ({} restarts, {:.1} CPU-s)",
            p.name,
            mib(sim),
            mib(a),
            mib(b),
            p.restarts,
            p.cpu_s
        ));
        if a > 0 && b as f64 > a as f64 * 1.25 + 16.0 * 1048576.0 {
            s.failures
                .push(format!("{}: memory grew from {a} to {b} bytes", p.name));
        }
    }
    let spooled_full = s.agents[1]
        .log()
        .contains("rings are not drained until the collector is back or the spool has room");
    println!("--- results");
    println!(
        "jobs: {} MPI jobs, {procs} processes; records made {made}: stored once {stored}, counted as dropped {dropped}, missing {missing}, stored twice {dups}",
        jobs.len()
    );
    println!(
        "accounts: {by_shim} processes by the shim's last heartbeat (their agent was killed after they ended, before its own final account)"
    );
    println!("simulated job: {sim_line}");
    println!(
        "simulated job records: {} processes, made {}, stored once {}, missing {}, stored twice {}",
        sim_acc.len(),
        sim_rec[0],
        sim_rec[1],
        sim_rec[2],
        sim_rec[3]
    );
    println!(
        "throughput: {:.0} records/s stored on average over {secs} s",
        stored as f64 / secs as f64
    );
    println!(
        "recovery: agents reconnected {} times, longest {:.1} s, median {:.1} s",
        s.reconnects.len(),
        s.reconnects.iter().cloned().fold(0.0, f64::max),
        median(&mut s.reconnects.clone())
    );
    println!(
        "garbage: {} connections; spool disk full reported by agent 1: {spooled_full}",
        s.garbage_sent
    );
    for c in &agent_counts {
        println!("agent counters: {c}");
    }
    for m in &memory {
        println!("memory: {m}");
    }
    if mounted {
        let _ = Command::new("umount").arg(&small_spool).status();
    }
    if s.failures.is_empty() {
        println!(
            "soak: PASS {secs} s, {} jobs, {stored} records stored once, {dropped} counted as dropped, 0 lost",
            jobs.len()
        );
    } else {
        for f in &s.failures {
            println!("failure: {f}");
        }
        // Kept for a look: the traces, and the components' logs.
        for p in s.collectors.iter().chain(&s.agents) {
            let _ = std::fs::write(
                root.join(format!("{}.log", p.name.replace(' ', "-"))),
                p.log(),
            );
        }
        let kept = tmp.keep();
        println!("traces and logs kept in {}", kept.display());
        println!(
            "soak: FAIL {} problem(s); first: {}",
            s.failures.len(),
            s.failures[0].lines().next().unwrap_or("")
        );
        std::process::exit(1);
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
