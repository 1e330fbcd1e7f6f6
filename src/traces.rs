//! Loading traces for the commands that read them: every format [`commscope_import`] knows,
//! with its warnings printed the way every command prints them. A Parquet trace of more rows
//! than [`stream_rows`] is never loaded: it is analyzed as it streams by
//! ([`commscope_analyzer::large`]) and aggregated by polars from its files.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Result, bail};
use commscope_analyzer::aggregate::Calls;
use commscope_analyzer::{Analysis, Thresholds};
pub use commscope_import::{JobTrace, Loaded};
use commscope_wire::parquet::ProcessTrace;

/// Parquet traces with at least this many rows in all are streamed, not loaded
/// (`COMMSCOPE_STREAM_ROWS` sets another bound; 0 streams every Parquet trace).
const STREAM_ROWS: u64 = 4_000_000;

fn stream_rows() -> u64 {
    std::env::var("COMMSCOPE_STREAM_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(STREAM_ROWS)
}

/// Loads `paths`, printing one `commscope: warning: FILE: what is wrong` line per damaged,
/// unreadable or unknown file.
pub fn load(paths: &[PathBuf]) -> Result<Loaded> {
    let loaded = commscope_import::load(paths)?;
    for w in &loaded.warnings {
        eprintln!("commscope: warning: {w}");
    }
    Ok(loaded)
}

/// How [`analyzed`] treats warnings about the files it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warnings {
    Print,
    /// Already printed by an earlier reading of the same files (kept in the result only).
    Quiet,
}

/// A command that read traces succeeds when it read a job, whatever else was damaged.
pub fn exit_code(loaded: &Loaded) -> ExitCode {
    if loaded.jobs.is_empty() {
        eprintln!("commscope: no trace could be read");
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// One job's trace, analyzed.
#[derive(Debug)]
pub struct Job {
    pub job: String,
    /// Its processes: with their records when the trace was loaded, headers only when it
    /// was streamed.
    pub processes: Vec<ProcessTrace>,
    pub records: u64,
    pub analysis: Analysis,
    /// The Parquet files it streamed from (none when loaded).
    files: Vec<PathBuf>,
}

impl Job {
    /// Whether its records are in memory.
    pub fn loaded(&self) -> bool {
        self.files.is_empty()
    }

    /// Its calls for the aggregations: the files it streamed from, or its records.
    pub fn calls(&self) -> Result<Calls> {
        if self.loaded() {
            Calls::of(&self.processes).map_err(anyhow::Error::msg)
        } else {
            Ok(Calls::scan(self.files.clone(), &self.job))
        }
    }
}

/// The Parquet files under `paths` when they make a trace to stream rather than load.
pub fn streamed_files(paths: &[PathBuf]) -> Result<Option<Vec<PathBuf>>> {
    Ok(commscope_import::parquet_only(paths)?
        .filter(|(_, rows)| *rows >= stream_rows())
        .map(|(files, _)| files))
}

/// The jobs of Parquet `files` when their footers tell.
pub fn jobs_of(files: &[PathBuf]) -> Option<Vec<String>> {
    let mut jobs = std::collections::BTreeSet::new();
    for f in files {
        jobs.extend(commscope_wire::parquet::jobs_in_file(f)?);
    }
    Some(jobs.into_iter().collect())
}

/// Every job under `paths`, analyzed, and the warnings printed: streamed from `streamed` (what
/// [`streamed_files`] gave for `paths`) when there are such files, else loaded. Fails when
/// nothing could be read.
pub fn analyzed(
    paths: &[PathBuf],
    streamed: Option<Vec<PathBuf>>,
    th: &Thresholds,
    print: Warnings,
) -> Result<(Vec<Job>, Vec<String>)> {
    if let Some(files) = streamed {
        let (streamed, warnings) =
            commscope_analyzer::large::analyze(&files, th).map_err(anyhow::Error::msg)?;
        if print == Warnings::Print {
            for w in &warnings {
                eprintln!("commscope: warning: {w}");
            }
        }
        let jobs: Vec<Job> = streamed
            .into_iter()
            .map(|s| Job {
                job: s.job,
                processes: s.processes,
                records: s.records,
                analysis: s.analysis,
                files: files.clone(),
            })
            .collect();
        if jobs.is_empty() {
            bail!("no trace could be read");
        }
        return Ok((jobs, warnings));
    }
    let loaded = match print {
        Warnings::Print => load(paths)?,
        Warnings::Quiet => commscope_import::load(paths)?,
    };
    if loaded.jobs.is_empty() {
        bail!("no trace could be read");
    }
    let jobs = loaded
        .jobs
        .into_values()
        .map(|j| {
            let analysis = commscope_analyzer::analysis(&j.job, &j.processes, th);
            Job {
                records: j.records() as u64,
                job: j.job,
                processes: j.processes,
                analysis,
                files: Vec::new(),
            }
        })
        .collect();
    Ok((jobs, loaded.warnings))
}
