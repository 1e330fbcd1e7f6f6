//! The `commscope` command line: argument definitions and dispatch.
//!
//! Settings come from flags and `COMMSCOPE_*` environment variables; a flag wins over its
//! variable, which wins over the default.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

use crate::{demo, run, summary, traces};

/// commscope — a communication profiler and fault-diagnosis tool for MPI and NCCL jobs.
#[derive(Debug, Parser)]
#[command(name = "commscope", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
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
    /// Run a bundled 4-rank MPI example under the shim and summarize its trace.
    Demo(DemoArgs),
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
    /// Ranks to start.
    #[arg(long, default_value_t = 4)]
    pub ranks: u32,
}

/// Runs the command line; the process exit code.
pub fn main_with(cli: Cli) -> ExitCode {
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
            for e in &loaded.errors {
                eprintln!("commscope: {e}");
            }
            let sums: Vec<_> = loaded.jobs.values().map(summary::summarize).collect();
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
            Ok(if loaded.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Trace(TraceCmd::Merge(a)) => {
            let loaded = traces::load(&a.paths)?;
            for e in &loaded.errors {
                eprintln!("commscope: {e}");
            }
            if loaded.jobs.is_empty() {
                bail!("nothing to merge: no trace could be read");
            }
            let procs: Vec<_> = loaded
                .jobs
                .into_values()
                .flat_map(|j| {
                    for w in &j.warnings {
                        eprintln!("commscope: warning: {w}");
                    }
                    j.processes
                })
                .collect();
            let rows = commscope_wire::parquet::write(&a.output, &procs)
                .with_context(|| format!("failed to write {}", a.output.display()))?;
            eprintln!(
                "wrote {rows} records from {} processes to {}",
                procs.len(),
                a.output.display()
            );
            Ok(if loaded.errors.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        Cmd::Demo(a) => demo::run(&a),
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
        for sub in ["run", "trace", "demo"] {
            assert!(help.contains(sub), "{help}");
            assert!(
                readme.contains(&format!("commscope {sub}"))
                    || readme.contains(&format!("scripts/{sub}")),
                "README never shows `{sub}`"
            );
        }
    }
}
