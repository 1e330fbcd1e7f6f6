//! `commscope agent`, `commscope collector` and `commscope up`: settings resolved (see
//! [`crate::config`]) and the services run on a tokio runtime until SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::cli::{AgentArgs, CollectorArgs, UpArgs};
use crate::config::{self, parse_addr, parse_duration, pick};

/// Default agent HTTP address.
pub const DEFAULT_AGENT_HTTP: &str = "127.0.0.1:4652";

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("commscope")
        .build()
        .context("cannot start the async runtime")
}

/// Where the agent reads NIC counters: `COMMSCOPE_SYSFS_ROOT` (a fixture tree in tests; `off`
/// reads none), else `/sys`.
fn sysfs_root() -> Option<PathBuf> {
    match std::env::var_os("COMMSCOPE_SYSFS_ROOT") {
        None => Some(PathBuf::from("/sys")),
        Some(v) if v.is_empty() || v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
    }
}

/// The agent's settings from its flags, environment and file, and the trace directory of its
/// local mode (no collector: one runs in the same process, writing there).
pub fn agent_config(a: &AgentArgs) -> Result<(commscope_agent::Config, Option<PathBuf>)> {
    let f = config::load(a.config.as_deref())?.agent;
    let node = pick(a.node.clone(), f.node, config::default_node());
    let mut c = commscope_agent::Config::new(node);
    c.sysfs = sysfs_root();
    c.collectors = collector_list(a.collector.clone().or(f.collector).as_deref())?;
    c.socket = pick(a.socket.clone(), f.socket, c.socket);
    let trace_dir = a.trace_dir.clone().or(f.trace_dir);
    if c.collectors.is_empty() && trace_dir.is_none() {
        anyhow::bail!(
            "the agent needs a collector (--collector URL) or a directory to write traces itself (--trace-dir DIR)"
        );
    }
    let http = pick(a.http.clone(), f.http, DEFAULT_AGENT_HTTP.into());
    c.http = if http == "off" {
        None
    } else {
        Some(parse_addr(&http)?)
    };
    c.spool_dir = pick(a.spool_dir.clone(), f.spool_dir, c.spool_dir);
    c.spool_max_bytes = pick(a.spool_max_bytes, f.spool_max_bytes, c.spool_max_bytes);
    if let Some(n) = f.batch_records {
        c.batch_records = n.clamp(1, commscope_collector::ingest::MAX_BATCH_RECORDS);
    }
    if let Some(p) = f.poll {
        c.poll = parse_duration(&p)?.max(Duration::from_millis(1));
    }
    if a.no_stacks {
        c.stacks = false;
    }
    if a.no_ebpf {
        c.ebpf = None;
    }
    if let Some(o) = c.ebpf.as_mut() {
        o.nccl_data = std::env::var("COMMSCOPE_EBPF_NCCL_DATA").is_ok_and(|v| v == "1");
        o.nccl_api = !std::env::var("COMMSCOPE_EBPF_NCCL_API").is_ok_and(|v| v == "0");
        // Libraries to probe from the start, whoever maps them (a site's known paths): a
        // process that creates its communicators before the next /proc scan is still seen.
        if let Some(v) = std::env::var_os("COMMSCOPE_EBPF_LIBRARIES") {
            o.libraries = std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
        }
    }
    if let Some(s) = a.spool_after.clone().or(f.spool_after) {
        c.spool_after = parse_duration(&s)?;
    }
    if let Some(s) = a.shutdown_timeout.clone().or(f.shutdown_timeout) {
        c.shutdown_timeout = parse_duration(&s)?;
    }
    c.pods = match a.pods_url.clone().or(f.pods_url) {
        Some(url) if url == "off" => None,
        Some(url) => Some(commscope_agent::attribution::PodSource {
            url,
            token_file: a.pods_token_file.clone().or(f.pods_token_file),
            ca_file: a.pods_ca_file.clone().or(f.pods_ca_file),
        }),
        None => commscope_agent::attribution::PodSource::in_cluster(&c.node),
    };
    c.auth_token = token(a.auth_token_file.clone().or(f.auth_token_file))?;
    c.tls = a.tls.files();
    // Bad TLS files are this agent's mistake, said at start (not as the collector's refusal).
    if !c.tls.is_empty() {
        c.tls.client().map_err(anyhow::Error::msg)?;
    }
    Ok((c, trace_dir))
}

/// `up`'s agent as the collector's client: the same certificate and key (its identity for
/// mutual TLS), trusting the CA, or without one the certificate itself (self-signed).
fn up_agent_tls(collector: &commscope_wire::tls::TlsFiles) -> commscope_wire::tls::TlsFiles {
    let mut t = collector.clone();
    if t.ca.is_none() {
        t.ca.clone_from(&t.cert);
    }
    t
}

/// Where a process on this machine reaches a listener: its address, or loopback when it listens
/// on every interface.
fn local_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, listen.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, listen.port()))
        }
        _ => listen,
    }
}

/// The collector's settings from its flags, environment and file.
pub fn collector_config(a: &CollectorArgs) -> Result<commscope_collector::Config> {
    let f = config::load(a.config.as_deref())?.collector;
    let dir = pick(
        a.trace_dir.clone(),
        f.trace_dir,
        PathBuf::from("/var/lib/commscope/traces"),
    );
    let mut c = commscope_collector::Config::new(dir);
    if let Some(l) = a.listen.clone().or(f.listen) {
        c.listen = parse_addr(&l)?;
    }
    if let Some(h) = a.http.clone().or(f.http) {
        c.http = parse_addr(&h)?;
    }
    c.segment_bytes = pick(a.segment_bytes, f.segment_bytes, c.segment_bytes).max(4096);
    if let Some(s) = a.segment_age.clone().or(f.segment_age) {
        c.segment_age = parse_duration(&s)?.max(Duration::from_millis(100));
    }
    if let Some(s) = a.retention.clone().or(f.retention) {
        c.retention = Some(parse_duration(&s)?);
    }
    c.retention_bytes = a.retention_bytes.or(f.retention_bytes);
    c.max_message_bytes = pick(
        a.max_message_bytes,
        f.max_message_bytes,
        c.max_message_bytes,
    )
    .max(64 << 10);
    c.max_agent_rate = pick(a.max_agent_rate, f.max_agent_rate, c.max_agent_rate).max(1);
    c.ingest_budget_bytes = pick(
        a.ingest_budget_bytes,
        f.ingest_budget_bytes,
        c.ingest_budget_bytes,
    )
    .max(1 << 10);
    c.sample_budget = pick(a.sample_budget, f.sample_budget, c.sample_budget).max(1);
    c.sample_modulus = a
        .sample_modulus
        .or(f.sample_modulus)
        .filter(|k| *k > 1)
        .map(commscope_wire::sampling::modulus_floor);
    c.memory_limit = a
        .memory_limit
        .clone()
        .or(f.memory_limit)
        .map(|s| commscope_collector::memory::parse_limit(&s))
        .transpose()
        .map_err(|e| anyhow::anyhow!("--memory-limit {e}"))?;
    c.limits.max_jobs = pick(a.max_jobs, f.max_jobs, c.limits.max_jobs).max(1);
    c.shards = pick(a.shards, f.shards, c.shards).clamp(1, 256);
    c.peers = if a.peers.is_empty() {
        f.peers.unwrap_or_default()
    } else {
        a.peers.clone()
    };
    c.peers = c
        .peers
        .iter()
        .map(|p| p.trim().trim_end_matches('/').to_owned())
        .filter(|p| !p.is_empty())
        .collect();
    for p in &c.peers {
        if !(p.starts_with("http://") || p.starts_with("https://")) {
            anyhow::bail!("--peers: {p:?} is not an http:// or https:// URL");
        }
    }
    if let Some(s) = a.job_linger.clone().or(f.job_linger) {
        c.limits.linger = parse_duration(&s)?;
    }
    c.otlp = a.otlp.clone().or(f.otlp).filter(|u| !u.trim().is_empty());
    if let Some(s) = a.otlp_interval.clone().or(f.otlp_interval) {
        c.otlp_interval = parse_duration(&s)?.max(std::time::Duration::from_millis(100));
    }
    if let Some(s) = a.shutdown_timeout.clone().or(f.shutdown_timeout) {
        c.shutdown_timeout = parse_duration(&s)?;
    }
    c.max_jobs_per_agent = pick(
        a.max_jobs_per_agent,
        f.max_jobs_per_agent,
        c.max_jobs_per_agent,
    )
    .max(1);
    c.max_ranks_per_agent = pick(
        a.max_ranks_per_agent,
        f.max_ranks_per_agent,
        c.max_ranks_per_agent,
    )
    .max(1);
    c.auth_token = token(a.auth_token_file.clone().or(f.auth_token_file))?;
    c.tls = a.tls.files();
    Ok(c)
}

/// `--collector`: one URL, or the replicas' URLs separated by commas (a job goes to one of
/// them by rendezvous hashing of its id: every agent must list the same names). A URL without
/// a scheme gets `http://`.
pub fn collector_list(spec: Option<&str>) -> Result<Vec<String>> {
    let mut out: Vec<String> = Vec::new();
    for u in spec.unwrap_or("").split(',') {
        let u = u.trim().trim_end_matches('/');
        if u.is_empty() {
            continue;
        }
        let u = if u.contains("://") {
            u.to_owned()
        } else {
            format!("http://{u}")
        };
        if !(u.starts_with("http://") || u.starts_with("https://")) {
            anyhow::bail!("--collector: {u:?} is not an http:// or https:// URL");
        }
        if out.contains(&u) {
            anyhow::bail!("--collector: {u} is listed twice");
        }
        out.push(u);
    }
    Ok(out)
}

/// The shared token from its file (`--auth-token-file`), when one is named.
pub fn token(file: Option<PathBuf>) -> Result<Option<commscope_wire::auth::Token>> {
    file.map(|f| commscope_wire::auth::Token::from_file(&f).map_err(anyhow::Error::msg))
        .transpose()
}

/// `commscope agent`. Without a collector, local mode: a collector on loopback in the same
/// process writes the traces (assembled here, so the agent crate does not depend on the
/// collector's).
pub fn agent(a: AgentArgs) -> Result<ExitCode> {
    let (mut c, trace_dir) = agent_config(&a)?;
    let Some(dir) = trace_dir.filter(|_| c.collectors.is_empty()) else {
        runtime()?.block_on(async move {
            let stop = StopSignals::new()?;
            let agent = commscope_agent::start(c).await?;
            stop.wait().await;
            agent.stop().await;
            Ok::<_, anyhow::Error>(())
        })?;
        return Ok(ExitCode::SUCCESS);
    };
    runtime()?.block_on(async move {
        let stop = StopSignals::new()?;
        let mut cc = commscope_collector::Config::new(dir.clone());
        cc.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        cc.http = SocketAddr::from(([127, 0, 0, 1], 0));
        cc.segment_age = std::time::Duration::from_secs(30);
        cc.auth_token.clone_from(&c.auth_token);
        let collector = commscope_collector::start(cc).await?;
        c.collectors = vec![format!("http://{}", collector.listen)];
        let agent = commscope_agent::start(c).await?;
        tracing::info!(
            "local mode: a collector in this process writes {}",
            dir.display()
        );
        stop.wait().await;
        agent.stop().await;
        collector.stop().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// SIGINT and SIGTERM, caught from the moment this is made: one that comes while the services
/// start stops them once they are up, instead of killing the process half started. (Made inside
/// the runtime, before anything starts.)
struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> Result<StopSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(StopSignals {
            int: signal(SignalKind::interrupt()).context("catching SIGINT")?,
            term: signal(SignalKind::terminate()).context("catching SIGTERM")?,
        })
    }

    /// Until one of them comes.
    async fn wait(mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}

/// `commscope collector`.
pub fn collector(a: CollectorArgs) -> Result<ExitCode> {
    let c = collector_config(&a)?;
    runtime()?.block_on(async move {
        let stop = StopSignals::new()?;
        let collector = commscope_collector::start(c).await?;
        stop.wait().await;
        collector.stop().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `commscope up`.
pub fn up(a: UpArgs) -> Result<ExitCode> {
    let dir = a
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("/var/lib/commscope"));
    let mut cc = commscope_collector::Config::new(dir.join("traces"));
    if let Some(l) = &a.listen {
        cc.listen = parse_addr(l)?;
    }
    if let Some(h) = &a.http {
        cc.http = parse_addr(h)?;
    }
    let mut ac = commscope_agent::Config::new(config::default_node());
    ac.sysfs = sysfs_root();
    if let Some(s) = &a.socket {
        ac.socket = s.clone();
    }
    ac.spool_dir = dir.join("spool");
    ac.http = Some(parse_addr(
        a.agent_http.as_deref().unwrap_or(DEFAULT_AGENT_HTTP),
    )?);
    cc.auth_token = token(a.auth_token_file.clone())?;
    ac.auth_token.clone_from(&cc.auth_token);
    cc.tls = a.tls.files();
    ac.tls = up_agent_tls(&cc.tls);
    if !ac.tls.is_empty() {
        ac.tls.client().map_err(anyhow::Error::msg)?;
    }
    let scheme = if cc.tls.is_empty() { "http" } else { "https" };
    runtime()?.block_on(async move {
        let stop = StopSignals::new()?;
        let collector = commscope_collector::start(cc).await?;
        ac.collectors = vec![format!("{scheme}://{}", local_address(collector.listen))];
        let agent = commscope_agent::start(ac).await?;
        tracing::info!(
            target: "commscope_up",
            "collector on {} (HTTP {scheme}://{}), agent on {} (metrics http://{}/metrics); traces in {}. Ctrl-C stops.",
            collector.listen,
            collector.http,
            agent.socket.display(),
            agent.http.map(|h| h.to_string()).unwrap_or_default(),
            dir.join("traces").display()
        );
        stop.wait().await;
        agent.stop().await;
        collector.stop().await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
