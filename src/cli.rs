//! The `commscope` command line: argument definitions and dispatch.
//!
//! Settings come from flags and `COMMSCOPE_*` environment variables; a flag wins over its
//! variable, which wins over the default.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

use commscope_telemetry::logging::{self, LogFormat};

use crate::{daemons, demo, postmortem, run, simulate, summary, traces};

/// commscope — a communication profiler and fault-diagnosis tool for MPI and NCCL jobs.
#[derive(Debug, Parser)]
#[command(name = "commscope", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
    /// How log lines on standard error are written; their filter is COMMSCOPE_LOG (RUST_LOG
    /// syntax, e.g. `debug` or `commscope_collector=debug,warn`) [default filter: info for
    /// collector, agent and up; warn for the others].
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "COMMSCOPE_LOG_FORMAT")]
    pub log_format: LogFormat,
}

/// Output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Sentences for people.
    Text,
    /// JSON for programs.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run a command with the shim preloaded into every rank (Open MPI, MPICH/Hydra, Slurm, torchrun).
    Run(RunArgs),
    /// Read and convert trace files.
    #[command(subcommand)]
    Trace(TraceCmd),
    /// Run a bundled 4-rank MPI example through a local agent and collector and show what was captured.
    Demo(DemoArgs),
    /// The node agent: accepts shim registrations, drains their rings, streams to the collector.
    Agent(AgentArgs),
    /// The collector: ingests from agents, stores traces, serves metrics and the query API.
    Collector(CollectorArgs),
    /// A collector and an agent on this machine (default socket), until interrupted.
    Up(UpArgs),
    /// Diagnose jobs from their traces: slow ranks, hangs and who they wait for, dead ranks, mismatched collectives, degraded collectives, errors.
    Analyze(SummaryArgs),
    /// A post-mortem as one self-contained HTML file: findings with their timelines, lateness heatmap, progress and hang front, durations, bandwidth, links, what-if.
    Report(ReportArgs),
    /// Convert traces for other tools.
    #[command(subcommand)]
    Export(ExportCmd),
    /// A synthetic data/tensor/pipeline-parallel job with injected faults, streamed to a collector as its nodes' agents would.
    Simulate(SimulateArgs),
    /// The live terminal view: jobs, ranks, hangs and findings on a collector, or traces replayed with a time cursor.
    Tui(TuiArgs),
}

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("what").args(["collector", "replay"]))]
pub struct TuiArgs {
    /// The collector's gRPC address (its --listen) [default: http://127.0.0.1:4650].
    #[arg(long, value_name = "URL", env = "COMMSCOPE_COLLECTOR")]
    pub collector: Option<String>,
    /// Replay traces (files or directories) instead, with a time cursor ([ and ] step it).
    #[arg(long, value_name = "PATH", num_args = 1..)]
    pub replay: Vec<PathBuf>,
    /// A file holding the token the collector requires (docs/security.md).
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// TLS settings (docs/security.md). On the collector: the certificate and key of its gRPC and
/// HTTP listeners (their URLs become https://), and the CA whose certificates agents must
/// present (mutual TLS). On a client: the CA that signed the collector's certificate (else the
/// system's roots), and its own certificate and key for mutual TLS.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// This side's TLS certificate (PEM).
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// The CA certificate (PEM) the other side's certificate must be signed by.
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
}

impl TlsArgs {
    pub fn files(&self) -> commscope_wire::tls::TlsFiles {
        commscope_wire::tls::TlsFiles {
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            ca: self.tls_ca.clone(),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// The collector's gRPC address; without it a collector runs inside the command.
    #[arg(long, value_name = "URL")]
    pub collector: Option<String>,
    /// The collector's HTTP address, to read its findings (with --collector).
    #[arg(long, value_name = "ADDR")]
    pub collector_http: Option<String>,
    /// A file holding the token the collector requires (docs/security.md).
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Ranks (a multiple of --ranks-per-node).
    #[arg(long, default_value_t = 1024)]
    pub ranks: usize,
    /// Ranks per node.
    #[arg(long, default_value_t = 8)]
    pub ranks_per_node: usize,
    /// Tensor-parallel group size [default: a node's ranks].
    #[arg(long, value_name = "N")]
    pub tp: Option<usize>,
    /// Pipeline stages [default: 4 when there are at least 8 tensor-parallel groups in a
    /// multiple of 4, else 1]; data parallelism takes the rest.
    #[arg(long, value_name = "N")]
    pub pp: Option<usize>,
    /// A fault: straggler:R, slow-node:NODE, hang:R[:SEQ], mismatch:R[:SEQ], dead:R[:SEQ], degraded[:STEP], stall[:SEQ], teardown:R[:SEQ], freeze:R[:SEQ], flaky:R[:EVERY] (SEQ: the world communicator's collective number, one per step). Repeatable.
    #[arg(long, value_name = "SPEC")]
    pub fault: Vec<String>,
    /// Compute slowdown of stragglers, slow nodes and flaky ranks (1.5: 50 % longer).
    #[arg(long, value_name = "F", default_value_t = 1.5)]
    pub slowdown: f64,
    /// Transfer slowdown of `degraded`.
    #[arg(long, value_name = "F", default_value_t = 4.0)]
    pub degradation: f64,
    /// Seconds to run (real time).
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seed of the job's randomness.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The job id [default: sim-SEED-…].
    #[arg(long)]
    pub job_id: Option<String>,
    /// Also write the link records NCCL's profiler plugin would (ring sends between nodes): the
    /// slow-link data and the fabric dashboard.
    #[arg(long)]
    pub links: bool,
    /// Step at which stragglers, slow nodes and degradation begin (and the default SEQ).
    #[arg(long, default_value_t = 10)]
    pub onset_step: u64,
    /// Forward compute per microbatch, ms (a step is about 15× this with 4 pipeline stages).
    #[arg(long, default_value_t = 10.0)]
    pub compute_ms: f64,
    /// Run in virtual time (no collector) and analyze the trace in-process.
    #[arg(long = "virtual")]
    pub virtual_time: bool,
    /// Steps to simulate with --virtual.
    #[arg(long, default_value_t = 40)]
    pub steps: u64,
    /// Exit with status 1 when an injected fault's expected finding was not named, or a
    /// finding no injected fault explains was.
    #[arg(long)]
    pub check: bool,
    /// Output format of --virtual: `json` prints only the findings (`{"findings":[…]}`).
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Consistent sampling: with --virtual, every communicator at 1 instance in K; live, the
    /// collector started here forces K (a collector given with --collector decides itself).
    #[arg(long, value_name = "K")]
    pub sample_modulus: Option<u32>,
    /// The collector started here: calls per second taken in full before sampling [default: 150000].
    #[arg(long, value_name = "N")]
    pub sample_budget: Option<u64>,
    /// The collector started here: its memory bound, as `collector --memory-limit` (it counts
    /// the whole process, the generator included) [default: 50%].
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct AgentArgs {
    /// The collector's gRPC address, e.g. http://collector:4650; or several replicas'
    /// addresses, comma-separated: each job goes to one of them (rendezvous hashing of its id;
    /// every agent must be given the same list).
    #[arg(long, value_name = "URL[,URL…]", env = "COMMSCOPE_COLLECTOR")]
    pub collector: Option<String>,
    /// The registration socket [default: /run/commscope/agent.sock].
    #[arg(long, value_name = "PATH", env = "COMMSCOPE_AGENT_SOCKET")]
    pub socket: Option<PathBuf>,
    /// This node's name [default: $NODE_NAME, else the host name].
    #[arg(long, value_name = "NAME", env = "COMMSCOPE_NODE")]
    pub node: Option<String>,
    /// Without a collector: write job traces (Parquet) under DIR.
    #[arg(long, value_name = "DIR", env = "COMMSCOPE_AGENT_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// Serve /metrics and /healthz on ADDR [default: 127.0.0.1:4652].
    #[arg(long, value_name = "ADDR", env = "COMMSCOPE_AGENT_HTTP")]
    pub http: Option<String>,
    /// Where batches wait while the collector is unreachable [default: /var/lib/commscope/spool].
    #[arg(long, value_name = "DIR", env = "COMMSCOPE_SPOOL_DIR")]
    pub spool_dir: Option<PathBuf>,
    /// The spool's size limit in bytes [default: 1 GiB].
    #[arg(long, value_name = "BYTES", env = "COMMSCOPE_SPOOL_MAX_BYTES", value_parser = crate::config::bytes_arg)]
    pub spool_max_bytes: Option<u64>,
    /// Unreachable collector: spool batches after this long [default: 2s].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_SPOOL_AFTER")]
    pub spool_after: Option<String>,
    /// On SIGTERM, stop within this long whatever the collector does; what is not acknowledged
    /// stays in the rings and the spool [default: 10s].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<String>,
    /// Never attach to a process to take its stacks (a hang's culprits, on the collector's
    /// request; eu-stack or gdb pauses the process while it reads them).
    #[arg(long)]
    pub no_stacks: bool,
    /// Load no eBPF programs: no TCP, RDMA verbs or NCCL network view, no zero-touch probes
    /// (by default they are loaded where the agent is permitted to).
    #[arg(long, env = "COMMSCOPE_NO_EBPF")]
    pub no_ebpf: bool,
    /// The node's pod list, to name each process's Kubernetes pod, namespace and owner: a URL
    /// answering a PodList (the API server's `/api/v1/pods?fieldSelector=spec.nodeName=NODE`,
    /// or the kubelet's `/pods`); `off` for none [default: inside a pod with a service
    /// account, the API server's list of this node's pods; else none].
    #[arg(long, value_name = "URL", env = "COMMSCOPE_PODS_URL")]
    pub pods_url: Option<String>,
    /// A bearer token for the pod list [default: the service account's, with the in-cluster
    /// URL].
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_PODS_TOKEN_FILE")]
    pub pods_token_file: Option<PathBuf>,
    /// The CA certificate (PEM) the pod list's server is signed by [default: the service
    /// account's, with the in-cluster URL; else the system's roots].
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_PODS_CA_FILE")]
    pub pods_ca_file: Option<PathBuf>,
    /// A file holding the token the collector requires (docs/security.md).
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Settings file (TOML, table [agent]); flags and environment variables win over it.
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct CollectorArgs {
    /// gRPC address for agents and the TUI [default: 127.0.0.1:4650].
    #[arg(long, value_name = "ADDR", env = "COMMSCOPE_LISTEN")]
    pub listen: Option<String>,
    /// HTTP address for the JSON API, /metrics and health [default: 127.0.0.1:4651].
    #[arg(long, value_name = "ADDR", env = "COMMSCOPE_HTTP")]
    pub http: Option<String>,
    /// Where job traces are stored [default: /var/lib/commscope/traces].
    #[arg(long, value_name = "DIR", env = "COMMSCOPE_COLLECTOR_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// A job's write-ahead log becomes a Parquet segment at this size [default: 64 MiB].
    #[arg(long, value_name = "BYTES", env = "COMMSCOPE_SEGMENT_BYTES", value_parser = crate::config::bytes_arg)]
    pub segment_bytes: Option<u64>,
    /// ... or at this age [default: 60s].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_SEGMENT_AGE")]
    pub segment_age: Option<String>,
    /// Delete segments older than this [default: keep].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_RETENTION")]
    pub retention: Option<String>,
    /// Delete the oldest segments while all together exceed this many bytes [default: no limit].
    #[arg(long, value_name = "BYTES", env = "COMMSCOPE_RETENTION_BYTES", value_parser = crate::config::bytes_arg)]
    pub retention_bytes: Option<u64>,
    /// Largest gRPC message accepted [default: 16 MiB].
    #[arg(long, value_name = "BYTES", env = "COMMSCOPE_MAX_MESSAGE_BYTES", value_parser = crate::config::bytes_arg_usize)]
    pub max_message_bytes: Option<usize>,
    /// Records per second one agent may send; more is refused with a retry delay [default: 2000000].
    #[arg(long, value_name = "N", env = "COMMSCOPE_MAX_AGENT_RATE")]
    pub max_agent_rate: Option<u64>,
    /// Bytes of records read from all agents and not yet stored, at most; beyond, the agents'
    /// streams wait (flow control slows them down) [default: 256 MiB].
    #[arg(long, value_name = "BYTES", env = "COMMSCOPE_INGEST_BUDGET_BYTES", value_parser = crate::config::bytes_arg_usize)]
    pub ingest_budget_bytes: Option<usize>,
    /// Jobs one agent may send records of; batches of more are refused [default: 64].
    #[arg(long, value_name = "N", env = "COMMSCOPE_MAX_JOBS_PER_AGENT")]
    pub max_jobs_per_agent: Option<usize>,
    /// Processes (ranks) one agent may send records of; batches of more are refused
    /// [default: 4096].
    #[arg(long, value_name = "N", env = "COMMSCOPE_MAX_RANKS_PER_AGENT")]
    pub max_ranks_per_agent: Option<usize>,
    /// Require this token (a file holding it) on every gRPC request and every HTTP request but
    /// /healthz and /readyz: agents, the TUI, API clients and Prometheus send it as
    /// `Authorization: Bearer <token>` (docs/security.md).
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Consistent sampling: calls per second (all jobs) taken in full; above it, busy
    /// communicators are sampled (a power-of-two modulus each) [default: 150000].
    #[arg(long, value_name = "N", env = "COMMSCOPE_SAMPLE_BUDGET")]
    pub sample_budget: Option<u64>,
    /// Consistent sampling: keep 1 instance in K on every communicator, whatever the load.
    #[arg(long, value_name = "K", env = "COMMSCOPE_SAMPLE_MODULUS")]
    pub sample_modulus: Option<u32>,
    /// Resident memory at most: a size (8G, 512MiB) or a share of the memory available (40%).
    /// Near it busy communicators are sampled harder; at it record batches are refused with a
    /// retry delay (agents send them again) [default: 50%].
    #[arg(long, value_name = "SIZE", env = "COMMSCOPE_MEMORY_LIMIT")]
    pub memory_limit: Option<String>,
    /// Jobs kept in memory at most [default: 256].
    #[arg(long, value_name = "N", env = "COMMSCOPE_MAX_JOBS")]
    pub max_jobs: Option<usize>,
    /// Split jobs over N shards of live state, findings and storage, each job in one, so that
    /// jobs use separate cores [default: one per CPU, at most 16].
    #[arg(long, value_name = "N", env = "COMMSCOPE_SHARDS")]
    pub shards: Option<usize>,
    /// The replicas' gRPC addresses (http://host:port, comma-separated; the list agents get
    /// with `agent --collector URL,URL,…`, this replica's own entry is harmless): the JSON API
    /// and the query service answer for the jobs of all of them.
    #[arg(
        long,
        value_name = "URL,…",
        env = "COMMSCOPE_PEERS",
        value_delimiter = ','
    )]
    pub peers: Vec<String>,
    /// How long an ended job stays in memory and in the metrics (the API serves it from disk
    /// after that, until retention deletes its trace) [default: 5m].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_JOB_LINGER")]
    pub job_linger: Option<String>,
    /// Export the metrics, a span per finding and spans of slow collective calls over OTLP
    /// (gRPC) to this endpoint, e.g. http://otel-collector:4317.
    #[arg(long, value_name = "URL", env = "COMMSCOPE_OTLP")]
    pub otlp: Option<String>,
    /// How often to export over OTLP [default: 10s].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_OTLP_INTERVAL")]
    pub otlp_interval: Option<String>,
    /// On SIGTERM, stop within this long whatever the agents do (connections still open are
    /// cut; what was acknowledged is in the write-ahead logs) [default: 10s].
    #[arg(long, value_name = "DURATION", env = "COMMSCOPE_SHUTDOWN_TIMEOUT")]
    pub shutdown_timeout: Option<String>,
    /// Settings file (TOML, table [collector]); flags and environment variables win over it.
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// State directory: traces in DIR/traces, the spool in DIR/spool [default: /var/lib/commscope].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The registration socket [default: /run/commscope/agent.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The collector's gRPC address [default: 127.0.0.1:4650].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The collector's HTTP address [default: 127.0.0.1:4651].
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
    /// The agent's HTTP address [default: 127.0.0.1:4652].
    #[arg(long, value_name = "ADDR")]
    pub agent_http: Option<String>,
    /// A token (a file holding it) the collector requires and the agent sends.
    #[arg(long, value_name = "FILE", env = "COMMSCOPE_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// TLS on the collector's gRPC and HTTP listeners (docs/security.md): the agent connects
    /// with the same certificate and key, and trusts --tls-ca (with it, the collector requires
    /// certificates that CA signed) or, without one, the certificate itself (self-signed, not a
    /// CA's). It must name 127.0.0.1 (or the --listen address).
    #[command(flatten)]
    pub tls: TlsArgs,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Write local trace files under DIR/<job>/.
    #[arg(long, value_name = "DIR", env = "COMMSCOPE_TRACE_DIR")]
    pub trace_dir: Option<PathBuf>,
    /// The node agent's socket [default: /run/commscope/agent.sock, used when it exists].
    #[arg(long, value_name = "PATH", env = "COMMSCOPE_AGENT_SOCKET")]
    pub agent_socket: Option<PathBuf>,
    /// The job id every rank records [default: run-<date>-<time>-<pid>].
    #[arg(long, value_name = "ID", env = "COMMSCOPE_JOB_ID")]
    pub job_id: Option<String>,
    /// The shim library [default: libcommscope.so beside this executable].
    #[arg(long, value_name = "PATH", env = "COMMSCOPE_SHIM")]
    pub shim: Option<PathBuf>,
    /// Preload the shim but keep it a pure pass-through (sets COMMSCOPE_DISABLE=1 in every rank).
    #[arg(long)]
    pub disable: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Subcommand)]
pub enum TraceCmd {
    /// Summarize traces: communicators and their call counts, point-to-point pairing, calls in flight.
    Summary(SummaryArgs),
    /// Merge traces (any supported format) into one Parquet file.
    Merge(MergeArgs),
}

#[derive(Debug, clap::Args)]
pub struct SummaryArgs {
    /// Trace files or directories (searched recursively); formats are detected from content.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Traces: commscope's, PyTorch Flight Recorder dumps, Kineto traces, NCCL Inspector or RAS output (files or directories; formats are detected from content).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short, long, value_name = "FILE.html")]
    pub output: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum ExportCmd {
    /// The Chrome trace event format, for ui.perfetto.dev and chrome://tracing: a track per rank, calls as slices, findings as instants.
    Perfetto(ExportArgs),
}

#[derive(Debug, clap::Args)]
pub struct ExportArgs {
    /// Traces of any supported format (files or directories).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The JSON file to write.
    #[arg(short, long, value_name = "FILE.json")]
    pub output: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct MergeArgs {
    /// Trace files or directories (searched recursively).
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// The Parquet file to write.
    #[arg(short, long, value_name = "FILE.parquet")]
    pub output: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Keep the trace here instead of a temporary directory.
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
    /// Ranks to start [default: 8; 4 with --capture].
    #[arg(long)]
    pub ranks: Option<u32>,
    /// Instead of the diagnosis story: run the bundled 4-rank example and show what was captured.
    #[arg(long)]
    pub capture: bool,
}

/// Runs the command line; the process exit code.
pub fn main_with(cli: Cli) -> ExitCode {
    let daemon = matches!(cli.command, Cmd::Agent(_) | Cmd::Collector(_) | Cmd::Up(_));
    // The TUI owns the terminal: no log line may land on its screen.
    if !matches!(cli.command, Cmd::Tui(_)) {
        logging::init(cli.log_format, if daemon { "info" } else { "warn" });
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("commscope: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn dispatch(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Cmd::Run(a) => {
            let spec = run::RunSpec {
                shim: run::find_shim(a.shim.as_deref())?,
                job_id: a
                    .job_id
                    .filter(|j| !j.trim().is_empty())
                    .unwrap_or_else(run::new_job_id),
                trace_dir: a.trace_dir,
                agent_socket: a.agent_socket,
                extra_env: if a.disable {
                    vec![("COMMSCOPE_DISABLE".into(), "1".into())]
                } else {
                    vec![]
                },
                command: a.command,
            };
            let code = run::run(&spec)?;
            Ok(ExitCode::from(code.clamp(0, 255) as u8))
        }
        Cmd::Trace(TraceCmd::Summary(a)) => {
            let loaded = traces::load(&a.paths)?;
            let sums = loaded
                .jobs
                .values()
                .map(summary::summarize)
                .collect::<Result<Vec<_>>>()?;
            match a.format {
                Format::Text => {
                    for s in &sums {
                        print!("{}", summary::render_text(s));
                    }
                }
                Format::Json => {
                    let v = if sums.len() == 1 {
                        serde_json::to_value(&sums[0])?
                    } else {
                        serde_json::json!({ "jobs": sums })
                    };
                    println!("{}", serde_json::to_string_pretty(&v)?);
                }
            }
            Ok(traces::exit_code(&loaded))
        }
        Cmd::Trace(TraceCmd::Merge(a)) => {
            let loaded = traces::load(&a.paths)?;
            if loaded.jobs.is_empty() {
                bail!("nothing to merge: no trace could be read");
            }
            let procs: Vec<_> = loaded
                .jobs
                .into_values()
                .flat_map(|j| j.processes)
                .collect();
            let rows = commscope_wire::parquet::write(&a.output, &procs)
                .with_context(|| format!("failed to write {}", a.output.display()))?;
            eprintln!(
                "wrote {rows} records from {} processes to {}",
                procs.len(),
                a.output.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Agent(a) => daemons::agent(a),
        Cmd::Collector(a) => daemons::collector(a),
        Cmd::Up(a) => daemons::up(a),
        Cmd::Simulate(a) => simulate::run(&a),
        Cmd::Tui(a) => {
            let source: Box<dyn commscope_tui::source::Source> = if a.replay.is_empty() {
                let url = a.collector.unwrap_or_else(|| {
                    format!(
                        "http://127.0.0.1:{}",
                        commscope_collector::DEFAULT_GRPC_PORT
                    )
                });
                let token = daemons::token(a.auth_token_file.clone())?;
                Box::new(commscope_tui::live::Live::connect(
                    &url,
                    token,
                    a.tls.files(),
                )?)
            } else {
                Box::new(crate::tui::Replay::load(&a.replay)?)
            };
            if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
                bail!("commscope tui needs a terminal on standard output");
            }
            commscope_tui::run(source)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Report(a) => postmortem::report(&a.paths, &a.output),
        Cmd::Export(ExportCmd::Perfetto(a)) => postmortem::perfetto(&a.paths, &a.output),
        Cmd::Analyze(a) => postmortem::analyze(&a.paths, a.format == Format::Json),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every subcommand's help renders, and every environment variable a flag reads is
    /// documented in the README's settings table, so the two cannot drift apart.
    #[test]
    fn help_and_readme_agree() {
        Cli::command().debug_assert();
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
            .expect("README");
        let mut cmd = Cli::command();
        let mut seen = 0;
        let mut stack: Vec<clap::Command> = vec![cmd.clone()];
        while let Some(c) = stack.pop() {
            for a in c.get_arguments() {
                if let Some(env) = a.get_env() {
                    let env = env.to_string_lossy();
                    assert!(
                        readme.contains(&format!("`{env}`")),
                        "README does not document {env}"
                    );
                    seen += 1;
                }
            }
            stack.extend(c.get_subcommands().cloned());
        }
        assert!(seen >= 4, "flags with environment variables: {seen}");
        let help = cmd.render_long_help().to_string();
        for sub in [
            "run",
            "trace",
            "demo",
            "agent",
            "collector",
            "up",
            "analyze",
            "simulate",
        ] {
            assert!(help.contains(sub), "{help}");
            assert!(
                readme.contains(&format!("commscope {sub}"))
                    || readme.contains(&format!("scripts/{sub}")),
                "README never shows `{sub}`"
            );
        }
    }
}
