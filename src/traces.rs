//! Loading traces: files or directories (searched recursively), every supported format
//! auto-detected by content, grouped by job.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commscope_wire::parquet::{self, ProcessTrace};
use commscope_wire::record::Record;
use commscope_wire::{cst, wal};

/// All processes of one job found in the inputs.
#[derive(Debug, Default)]
pub struct JobTrace {
    pub job: String,
    pub processes: Vec<ProcessTrace>,
    /// Damage found while reading (each a sentence naming the file).
    pub warnings: Vec<String>,
}

impl JobTrace {
    /// Total records.
    pub fn records(&self) -> usize {
        self.processes.iter().map(|p| p.records.len()).sum()
    }
}

/// Everything loaded.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Jobs by id.
    pub jobs: BTreeMap<String, JobTrace>,
    /// Files that could not be read at all (each a sentence).
    pub errors: Vec<String>,
}

/// Trace file formats recognised by content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Cst,
    Parquet,
    /// A collector's write-ahead log (records not yet in a Parquet segment).
    Wal,
}

/// Recognises a file's format from its first bytes.
pub fn detect(path: &Path) -> Result<Option<Format>> {
    let mut head = [0u8; 8];
    let mut f =
        std::fs::File::open(path).with_context(|| format!("failed to open {}", path.display()))?;
    let n = f
        .read(&mut head)
        .with_context(|| format!("failed to read {}", path.display()))?;
    let head = &head[..n];
    Ok(if cst::sniff(head) {
        Some(Format::Cst)
    } else if parquet::sniff(head) {
        Some(Format::Parquet)
    } else if wal::sniff(head) {
        Some(Format::Wal)
    } else {
        None
    })
}

fn collect(path: &Path, out: &mut Vec<PathBuf>, explicit: bool) -> Result<()> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("failed to access {}", path.display()))?;
    if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("failed to list {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            collect(&e, out, false)?;
        }
    } else if meta.is_file() && (explicit || is_candidate(path)) {
        out.push(path.to_owned());
    }
    Ok(())
}

/// Files inside directories are considered by extension, so unrelated files are skipped quietly.
fn is_candidate(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("cst" | "parquet" | "cswal")
    )
}

/// Loads every trace under `paths`. A file that cannot be read is reported in
/// [`Loaded::errors`] and the rest are still loaded; a path that does not exist is an error.
pub fn load(paths: &[PathBuf]) -> Result<Loaded> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files, true)?;
    }
    let mut loaded = Loaded::default();
    for f in &files {
        match detect(f) {
            Ok(Some(Format::Cst)) => match cst::read_file(f) {
                Ok(t) => {
                    let job = loaded
                        .jobs
                        .entry(t.header.job.clone())
                        .or_insert_with(|| JobTrace {
                            job: t.header.job.clone(),
                            ..Default::default()
                        });
                    job.warnings
                        .extend(t.warnings.iter().map(|w| format!("{}: {w}", f.display())));
                    job.processes.push(ProcessTrace {
                        header: t.header,
                        records: t.records,
                        clock: None,
                    });
                }
                Err(e) => loaded.errors.push(e.to_string()),
            },
            Ok(Some(Format::Parquet)) => match parquet::read(f) {
                Ok((procs, unknown)) => {
                    for p in procs {
                        let job =
                            loaded
                                .jobs
                                .entry(p.header.job.clone())
                                .or_insert_with(|| JobTrace {
                                    job: p.header.job.clone(),
                                    ..Default::default()
                                });
                        if unknown > 0 {
                            job.warnings.push(format!(
                                "{}: {unknown} rows of unknown kind were skipped",
                                f.display()
                            ));
                        }
                        job.processes.push(p);
                    }
                }
                Err(e) => loaded.errors.push(e.to_string()),
            },
            Ok(Some(Format::Wal)) => match std::fs::read(f) {
                Ok(bytes) => match wal::parse(&bytes) {
                    Ok(log) => {
                        for e in log.entries {
                            let job =
                                loaded.jobs.entry(e.header.job.clone()).or_insert_with(|| {
                                    JobTrace {
                                        job: e.header.job.clone(),
                                        ..Default::default()
                                    }
                                });
                            job.processes.push(ProcessTrace {
                                records: e
                                    .records
                                    .iter()
                                    .filter_map(|r| Record::decode(r).ok())
                                    .collect(),
                                header: e.header,
                                clock: e.clock.map(|(offset_ns, error_ns)| {
                                    parquet::ClockAlignment {
                                        offset_ns,
                                        error_ns,
                                    }
                                }),
                            });
                        }
                        // A torn tail is normal for a live log: never acknowledged, not lost.
                        let _ = log.warnings;
                    }
                    Err(e) => loaded.errors.push(format!("{}: {e}", f.display())),
                },
                Err(e) => loaded
                    .errors
                    .push(format!("failed to read {}: {e}", f.display())),
            },
            Ok(None) => loaded.errors.push(format!(
                "{} is not a trace file commscope can read (unknown format)",
                f.display()
            )),
            Err(e) => loaded.errors.push(format!("{e:#}")),
        }
    }
    if loaded.jobs.is_empty() && loaded.errors.is_empty() {
        bail!(
            "no trace files found under {}",
            paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for job in loaded.jobs.values_mut() {
        merge_processes(job);
    }
    Ok(loaded)
}

/// One entry per process: a collector's trace holds a process's records in several segments
/// (and its log); they are joined in `rec_seq` order, each record once.
fn merge_processes(job: &mut JobTrace) {
    let mut by_key: BTreeMap<(i32, String, u32, u64), ProcessTrace> = BTreeMap::new();
    for p in std::mem::take(&mut job.processes) {
        let key = (
            p.header.rank,
            p.header.node.clone(),
            p.header.pid,
            p.header.start_time,
        );
        match by_key.get_mut(&key) {
            Some(m) => {
                m.records.extend(p.records);
                if p.clock.is_some() {
                    m.clock = p.clock;
                }
                if m.header.library.is_empty() {
                    m.header.library = p.header.library;
                }
            }
            None => {
                by_key.insert(key, p);
            }
        }
    }
    job.processes = by_key
        .into_values()
        .map(|mut p| {
            p.records.sort_by_key(Record::rec_seq);
            p.records.dedup_by_key(|r| r.rec_seq());
            p
        })
        .collect();
}
