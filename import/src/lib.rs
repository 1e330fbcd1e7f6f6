//! Trace importers: every file format commscope reads after the fact, as commscope records,
//! grouped by job. `analyze`, `report`, `export`, `trace summary` and `tui --replay` all load
//! through [`load`].
//!
//! Formats are recognised by content ([`detect`]), for files inside directories too: commscope's
//! `.cst` files, Parquet traces and write-ahead logs; PyTorch Flight Recorder dumps; Kineto
//! (PyTorch profiler) Chrome traces, gzipped or not; NCCL Inspector JSONL; `ncclras` JSON.
//!
//! A damaged or unknown file is one warning naming it ([`Loaded::warnings`]); the rest still
//! load, and whatever prefix of a damaged file is readable is kept.

pub mod flight_recorder;
pub mod inspector;
pub mod kineto;
mod native;
pub mod pickle;
pub mod ras;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::Record;

/// All processes of one job found in the inputs.
#[derive(Debug, Default)]
pub struct JobTrace {
    pub job: String,
    pub processes: Vec<ProcessTrace>,
    /// The formats its processes came from.
    pub formats: Vec<Format>,
    /// Damage found in its files (`FILE: what is wrong`; also in [`Loaded::warnings`]).
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
    /// `FILE: what is wrong`, one per damaged, unreadable or unknown file.
    pub warnings: Vec<String>,
}

/// The latest time an imported record may carry (ns since the epoch, about the year 2116): a
/// damaged timestamp beyond it is held there, so arithmetic on times cannot overflow.
pub const MAX_TIME_NS: u64 = 1 << 62;

/// A time from a foreign file, held to [`MAX_TIME_NS`].
pub fn time_ns(t: u64) -> u64 {
    t.min(MAX_TIME_NS)
}

/// An imported process: its records numbered in order from 1, as the shim numbers its own (the
/// loader joins a process's pieces by that number).
pub(crate) fn imported(
    header: commscope_wire::cst::Header,
    mut records: Vec<Record>,
) -> ProcessTrace {
    for (i, r) in records.iter_mut().enumerate() {
        r.set_rec_seq(i as u64 + 1);
    }
    ProcessTrace {
        header,
        records,
        clock: None,
        cut_short: false,
    }
}

/// Trace formats recognised by content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    Cst,
    Parquet,
    /// A collector's write-ahead log (records not yet in a Parquet segment).
    Wal,
    FlightRecorder,
    Kineto,
    Inspector,
    Ras,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Cst => "commscope .cst",
            Format::Parquet => "commscope Parquet",
            Format::Wal => "commscope write-ahead log",
            Format::FlightRecorder => "PyTorch Flight Recorder",
            Format::Kineto => "Kineto trace",
            Format::Inspector => "NCCL Inspector",
            Format::Ras => "NCCL RAS",
        }
    }
}

/// How much of a file [`detect`] looks at.
const SNIFF_BYTES: usize = 64 * 1024;

/// Recognises a file's format from its first bytes (decompressed when gzipped).
pub fn detect(path: &Path) -> Result<Option<Format>> {
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    std::fs::File::open(path)
        .with_context(|| format!("failed to open {}", path.display()))?
        .take(SNIFF_BYTES as u64)
        .read_to_end(&mut head)
        .with_context(|| format!("failed to read {}", path.display()))?;
    Ok(sniff(&head))
}

/// Recognises a format from a file's first bytes.
pub fn sniff(head: &[u8]) -> Option<Format> {
    use commscope_wire::{cst, parquet, wal};
    if cst::sniff(head) {
        return Some(Format::Cst);
    }
    if parquet::sniff(head) {
        return Some(Format::Parquet);
    }
    if wal::sniff(head) {
        return Some(Format::Wal);
    }
    if flight_recorder::sniff(head) {
        return Some(Format::FlightRecorder);
    }
    let text = if head.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        // A truncated head decompresses as far as it goes.
        let _ = flate2::read::GzDecoder::new(head)
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut out);
        out
    } else {
        head.to_vec()
    };
    let text = String::from_utf8_lossy(&text);
    let t = text.trim_start_matches('\u{feff}').trim_start();
    if !t.starts_with('{') && !t.starts_with('[') {
        return None;
    }
    if kineto::sniff(t) {
        Some(Format::Kineto)
    } else if inspector::sniff(t) {
        Some(Format::Inspector)
    } else if ras::sniff(t) {
        Some(Format::Ras)
    } else {
        None
    }
}

/// Reads a whole file, gunzipping it when it is gzipped. A damaged gzip stream keeps what
/// decompressed before the damage, with the reason.
pub fn read_maybe_gz(path: &Path) -> Result<(Vec<u8>, Option<String>)> {
    let raw = std::fs::read(path).with_context(|| format!("failed to read {}", path.display()))?;
    if !raw.starts_with(&[0x1f, 0x8b]) {
        return Ok((raw, None));
    }
    let mut out = Vec::new();
    let mut d = flate2::read::MultiGzDecoder::new(&raw[..]);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match d.read(&mut buf) {
            Ok(0) => return Ok((out, None)),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => {
                let why = format!(
                    "the gzip stream is damaged after {} decompressed bytes ({e})",
                    out.len()
                );
                return Ok((out, Some(why)));
            }
        }
    }
}

/// Names of files in trace directories that are not traces and are skipped without a word
/// (a collector's job metadata and findings, logs and notes).
fn companion(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    name.starts_with('.')
        || matches!(name, "job.json" | "findings.jsonl")
        || matches!(
            ext,
            "log" | "txt" | "md" | "yaml" | "yml" | "csv" | "png" | "svg" | "html" | "lock" | "tmp"
        ) && !name.contains("-pid")
}

/// A file a writer has not finished (`seg-…parquet.partial`, `job.json.partial`): its
/// records are still in the log it is being made from, so a directory listing skips it rather
/// than warn that it cannot be read. Named on the command line, it is read (and warned about).
fn in_progress(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "partial")
}

fn collect(path: &Path, out: &mut Vec<(PathBuf, bool)>, explicit: bool) -> Result<()> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("failed to access {}", path.display()))?;
    if meta.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("failed to list {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries.iter().filter(|e| !in_progress(e)) {
            collect(e, out, false)?;
        }
    } else if meta.is_file() {
        out.push((path.to_owned(), explicit));
    }
    Ok(())
}

/// The job a file belongs to when its format names none: its directory's name.
fn job_from_dir(path: &Path) -> String {
    path.parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .unwrap_or("imported")
        .to_owned()
}

/// The files under `paths` when every trace among them is a commscope Parquet trace (companion
/// files aside), with their rows in all: such a trace can be streamed rather than loaded.
/// `None` when any other format (or an unreadable file) is among them.
pub fn parquet_only(paths: &[PathBuf]) -> Result<Option<(Vec<PathBuf>, u64)>> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files, true)?;
    }
    let mut out = Vec::new();
    let mut rows = 0u64;
    for (f, explicit) in files {
        match detect(&f) {
            Ok(Some(Format::Parquet)) => match commscope_wire::parquet::num_rows(&f) {
                Ok(n) => {
                    rows = rows.saturating_add(n);
                    out.push(f);
                }
                Err(_) => return Ok(None),
            },
            Ok(None) if !explicit && companion(&f) => {}
            _ => return Ok(None),
        }
    }
    Ok((!out.is_empty()).then_some((out, rows)))
}

/// Loads every trace under `paths`. A file that cannot be read, or only in part, is one
/// warning and the rest still load. Fails only when a path does not exist or nothing at all
/// is found.
pub fn load(paths: &[PathBuf]) -> Result<Loaded> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files, true)?;
    }
    let mut loaded = Loaded::default();
    // Flight Recorder dumps are read per job first: the dump time is the job's.
    let mut fr: BTreeMap<String, Vec<(String, flight_recorder::Dump)>> = BTreeMap::new();
    let mut seen_any = false;
    for (f, explicit) in &files {
        let shown = f.display().to_string();
        let format = match detect(f) {
            Ok(Some(x)) => x,
            Ok(None) => {
                if *explicit || !companion(f) {
                    loaded.warnings.push(format!(
                        "{shown}: not a trace commscope can read (unknown format)"
                    ));
                }
                continue;
            }
            Err(e) => {
                loaded.warnings.push(format!("{shown}: {e:#}"));
                continue;
            }
        };
        seen_any = true;
        let mut damage: Vec<String> = Vec::new();
        let procs = read_one(f, format, &mut damage, &mut fr);
        let damage: Vec<String> = damage
            .into_iter()
            .map(|w| format!("{shown}: {w}"))
            .collect();
        add(&mut loaded, procs, format, &damage);
        loaded.warnings.extend(damage);
    }
    for (job, dumps) in fr {
        let damage: Vec<String> = dumps
            .iter()
            .flat_map(|(path, d)| d.warnings.iter().map(move |w| format!("{path}: {w}")))
            .collect();
        let dumps: Vec<flight_recorder::Dump> = dumps.into_iter().map(|(_, d)| d).collect();
        let procs = flight_recorder::to_traces(&job, &dumps);
        add(&mut loaded, procs, Format::FlightRecorder, &damage);
        loaded.warnings.extend(damage);
    }
    if loaded.jobs.is_empty() && !seen_any && loaded.warnings.is_empty() {
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

/// Reads one file of a known format; its damage goes to `damage`. Flight Recorder dumps are
/// kept in `fr` (by job) and give no process yet.
fn read_one(
    f: &Path,
    format: Format,
    damage: &mut Vec<String>,
    fr: &mut BTreeMap<String, Vec<(String, flight_recorder::Dump)>>,
) -> Vec<ProcessTrace> {
    let mut warn = |w: String| damage.push(w);
    let gz = |warn: &mut dyn FnMut(String)| match read_maybe_gz(f) {
        Ok((bytes, d)) => {
            if let Some(d) = d {
                warn(d);
            }
            Some(bytes)
        }
        Err(e) => {
            warn(format!("{e:#}"));
            None
        }
    };
    match format {
        Format::Cst | Format::Parquet | Format::Wal => native::read(f, format, &mut warn)
            .unwrap_or_else(|e| {
                warn(e);
                vec![]
            }),
        Format::FlightRecorder => {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let Some(rank) = flight_recorder::rank_from_name(name) else {
                warn("a Flight Recorder dump whose name does not end in its rank (like _dump_3); skipped".into());
                return vec![];
            };
            match std::fs::read(f)
                .map_err(|e| e.to_string())
                .and_then(|b| flight_recorder::read(&b, rank))
            {
                Ok(d) => fr
                    .entry(job_from_dir(f))
                    .or_default()
                    .push((f.display().to_string(), d)),
                Err(e) => warn(e),
            }
            vec![]
        }
        Format::Kineto => {
            let Some(bytes) = gz(&mut warn) else {
                return vec![];
            };
            match kineto::read(&bytes, &job_from_dir(f)) {
                Ok((p, ws)) => {
                    ws.into_iter().for_each(&mut warn);
                    vec![p]
                }
                Err(e) => {
                    warn(e);
                    vec![]
                }
            }
        }
        Format::Inspector => {
            let Some(bytes) = gz(&mut warn) else {
                return vec![];
            };
            let (p, ws) = inspector::read(&bytes, &job_from_dir(f));
            ws.into_iter().for_each(&mut warn);
            p
        }
        Format::Ras => match std::fs::read(f)
            .map_err(|e| e.to_string())
            .and_then(|b| ras::read(&b, &job_from_dir(f)))
        {
            Ok(p) => p,
            Err(e) => {
                warn(e);
                vec![]
            }
        },
    }
}

fn add(loaded: &mut Loaded, procs: Vec<ProcessTrace>, format: Format, damage: &[String]) {
    for p in procs {
        let job = loaded
            .jobs
            .entry(p.header.job.clone())
            .or_insert_with(|| JobTrace {
                job: p.header.job.clone(),
                ..Default::default()
            });
        if !job.formats.contains(&format) {
            job.formats.push(format);
        }
        for d in damage {
            if !job.warnings.contains(d) {
                job.warnings.push(d.clone());
            }
        }
        job.processes.push(p);
    }
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
                m.cut_short |= p.cut_short;
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
