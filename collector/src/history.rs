//! Job history: every job whose trace is under `--trace-dir`, with its findings, served until
//! retention deletes the trace — across restarts, and after `--job-linger` released the job
//! from memory (which bounds memory and metrics only).
//!
//! Beside a job's segments, `<trace-dir>/<job>/` holds:
//! - `job.json`: the job's summary line (the jobs API's shape), rewritten atomically when the
//!   job changes (at most every few seconds) and when it ends;
//! - `findings.jsonl`: one finding per line in the contract's shape, appended (and synced) each
//!   time one opens or resolves; the latest line of an id is its state.
//!
//! Trace readers consider files by extension (`.parquet`, `.cst`, `.cswal`) and skip both.
//! Retention removes them with the job's last segment ([`forget_emptied`]).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use commscope_analyzer::finding::{Change, Finding, State as FindingState};
use commscope_wire::cst::sanitize;

use crate::http::JobLine;

/// The job summary file.
pub const JOB_FILE: &str = "job.json";
/// The findings file.
pub const FINDINGS_FILE: &str = "findings.jsonl";

#[derive(Debug, Default)]
struct Entry {
    line: Option<JobLine>,
    /// Latest version of each finding, by id.
    findings: BTreeMap<String, Finding>,
}

/// What is on disk, cached: summaries and findings are small (a line per job, a few findings).
#[derive(Debug)]
pub struct History {
    dir: PathBuf,
    jobs: Mutex<BTreeMap<String, Entry>>,
}

impl History {
    /// Reads every job's files under `dir`. What cannot be read is returned as warnings (a torn
    /// last line of a findings file, left by a crash mid-write, among them); the rest is kept.
    pub fn open(dir: &Path) -> (History, Vec<String>) {
        let mut jobs: BTreeMap<String, Entry> = BTreeMap::new();
        let mut warnings = Vec::new();
        let dirs = std::fs::read_dir(dir)
            .map(|it| it.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        for d in dirs {
            let job_file = d.join(JOB_FILE);
            if let Ok(text) = std::fs::read_to_string(&job_file) {
                match serde_json::from_str::<JobLine>(&text) {
                    Ok(line) => {
                        let e = jobs.entry(line.job.clone()).or_default();
                        e.line = Some(line);
                    }
                    Err(e) => warnings.push(format!("{}: {e}; skipped", job_file.display())),
                }
            }
            let f_file = d.join(FINDINGS_FILE);
            if let Ok(text) = std::fs::read_to_string(&f_file) {
                for (i, l) in text
                    .lines()
                    .enumerate()
                    .filter(|(_, l)| !l.trim().is_empty())
                {
                    match serde_json::from_str::<Finding>(l) {
                        Ok(f) => {
                            let e = jobs.entry(f.job.clone()).or_default();
                            e.findings.insert(f.id.clone(), f);
                        }
                        Err(e) => warnings.push(format!(
                            "{} line {}: {e}; skipped",
                            f_file.display(),
                            i + 1
                        )),
                    }
                }
            }
        }
        let h = History {
            dir: dir.to_owned(),
            jobs: Mutex::new(jobs),
        };
        (h, warnings)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn job_dir(&self, job: &str) -> PathBuf {
        self.dir.join(sanitize(job))
    }

    /// Appends what opened and resolved to each job's findings file.
    pub fn record_findings(&self, changes: &[Change]) -> Result<(), String> {
        let mut by_job: HashMap<&str, Vec<&Finding>> = HashMap::new();
        for c in changes {
            let f = match c {
                Change::Opened(f) | Change::Resolved(f) => f,
            };
            by_job.entry(f.job.as_str()).or_default().push(f);
        }
        let mut errors = Vec::new();
        for (job, fs) in by_job {
            if let Err(e) = self.append(job, &fs) {
                errors.push(e);
            }
            let mut jobs = self.lock();
            let e = jobs.entry(job.to_owned()).or_default();
            for f in fs {
                e.findings.insert(f.id.clone(), f.clone());
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    fn append(&self, job: &str, fs: &[&Finding]) -> Result<(), String> {
        let dir = self.job_dir(job);
        let path = dir.join(FINDINGS_FILE);
        let mut buf = Vec::new();
        for f in fs {
            serde_json::to_writer(&mut buf, f).map_err(|e| e.to_string())?;
            buf.push(b'\n');
        }
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&path)?;
            // A line torn by a crash stays torn: start on a line of our own.
            if ends_torn(&mut file)? {
                file.write_all(b"\n")?;
            }
            file.write_all(&buf)?;
            file.sync_data()
        };
        write().map_err(|e| format!("cannot append to {}: {e}", path.display()))
    }

    /// Writes a job's summary (atomically: a new file renamed over the old).
    pub fn record_job(&self, line: &JobLine) -> Result<(), String> {
        let dir = self.job_dir(&line.job);
        let path = dir.join(JOB_FILE);
        let tmp = dir.join(format!("{JOB_FILE}.partial"));
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let text = serde_json::to_vec(line)?;
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.lock().entry(line.job.clone()).or_default().line = Some(line.clone());
        Ok(())
    }

    /// Drops jobs whose files retention removed.
    fn prune(&self, jobs: &mut BTreeMap<String, Entry>) {
        jobs.retain(|job, _| {
            let d = self.job_dir(job);
            d.join(JOB_FILE).exists() || d.join(FINDINGS_FILE).exists()
        });
    }

    /// The summary lines of stored jobs, except those named in `live` (the live line stands
    /// for them). A stored job that is not live has ended, whatever its last line said.
    pub fn jobs(&self, live: &dyn Fn(&str) -> bool) -> Vec<JobLine> {
        let mut jobs = self.lock();
        self.prune(&mut jobs);
        jobs.values()
            .filter_map(|e| e.line.as_ref())
            .filter(|l| !live(&l.job))
            .map(|l| ended(l.clone()))
            .collect()
    }

    /// One stored job's line.
    pub fn job(&self, job: &str) -> Option<JobLine> {
        let mut jobs = self.lock();
        self.prune(&mut jobs);
        jobs.get(job).and_then(|e| e.line.clone()).map(ended)
    }

    /// Whether the job's stored line says it ended (not merely that it is not live now).
    pub fn ended_on_disk(&self, job: &str) -> bool {
        let mut jobs = self.lock();
        self.prune(&mut jobs);
        jobs.get(job)
            .and_then(|e| e.line.as_ref())
            .is_some_and(|l| l.state == "ended")
    }

    /// The stored findings of one job as they were last written (open ones still open), oldest
    /// first: what a restarted collector takes back for a job it holds again.
    pub fn of_job(&self, job: &str) -> Vec<Finding> {
        let jobs = self.lock();
        let mut out: Vec<Finding> = jobs
            .get(job)
            .map(|e| e.findings.values().cloned().collect())
            .unwrap_or_default();
        out.sort_by(|a, b| (a.opened_at, &a.id).cmp(&(b.opened_at, &b.id)));
        out
    }

    /// Stored findings of jobs not live (all jobs when `job` is None), oldest first. A job that
    /// is not live has ended, so a finding still open in its file (the collector stopped before
    /// it could resolve it) is reported resolved when the job was last heard of.
    pub fn findings(&self, job: Option<&str>, live: &dyn Fn(&str) -> bool) -> Vec<Finding> {
        let mut jobs = self.lock();
        self.prune(&mut jobs);
        let mut out: Vec<Finding> = jobs
            .iter()
            .filter(|(name, _)| job.is_none_or(|j| j == name.as_str()) && !live(name))
            .flat_map(|(_, e)| {
                let end = e.line.as_ref().map(|l| l.last_seen_ns);
                e.findings.values().map(move |f| {
                    let mut f = f.clone();
                    if f.state == FindingState::Open {
                        f.state = FindingState::Resolved;
                        f.resolved_at = Some(end.unwrap_or(f.opened_at).max(f.opened_at));
                    }
                    f
                })
            })
            .collect();
        out.sort_by(|a, b| (a.opened_at, &a.id).cmp(&(b.opened_at, &b.id)));
        out
    }
}

/// Whether a file's last byte is not a newline (a line torn by a crash).
fn ends_torn(f: &mut std::fs::File) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    if f.metadata()?.len() == 0 {
        return Ok(false);
    }
    f.seek(SeekFrom::End(-1))?;
    let mut last = [0u8; 1];
    f.read_exact(&mut last)?;
    Ok(last[0] != b'\n')
}

/// A stored job's line as served: a job that is not live has ended, with nothing in flight.
fn ended(l: JobLine) -> JobLine {
    JobLine {
        state: "ended".into(),
        in_flight: 0,
        ..l
    }
}

/// After retention deleted segments: removes the history files (and the directory) of every job
/// that has no segment and no log left.
pub fn forget_emptied(dir: &Path) {
    let Ok(jobs) = std::fs::read_dir(dir) else {
        return;
    };
    for j in jobs.flatten() {
        let d = j.path();
        let Ok(files) = std::fs::read_dir(&d) else {
            continue;
        };
        let trace_left = files.flatten().any(|f| {
            let p = f.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
            ext == "parquet" || ext == commscope_wire::wal::EXTENSION
        });
        if !trace_left {
            let _ = std::fs::remove_file(d.join(JOB_FILE));
            let _ = std::fs::remove_file(d.join(FINDINGS_FILE));
            let _ = std::fs::remove_dir(&d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_analyzer::finding::{Class, Kind};

    fn line(job: &str, state: &str) -> JobLine {
        JobLine {
            job: job.into(),
            state: state.into(),
            flavour: "openmpi".into(),
            ranks: 4,
            world_size: 4,
            nodes: vec!["n1".into()],
            records: 100,
            in_flight: 1,
            dropped: 0,
            first_seen_ns: 10,
            last_seen_ns: 5_000,
            attribution: crate::state::JobAttribution::default(),
            contact: None,
        }
    }

    fn finding(job: &str, id: &str, state: FindingState) -> Finding {
        Finding {
            id: id.into(),
            kind: Kind::Hang,
            class: Class::NonCommunicationHang,
            state,
            job: job.into(),
            comm: Some("0x1".into()),
            seq: Some(3),
            ranks: vec![2],
            nodes: vec!["n1".into()],
            link: None,
            opened_at: 1_000,
            resolved_at: None,
            confidence: 0.9,
            summary: "rank 2 on n1 has not entered allreduce #3".into(),
            evidence: serde_json::json!({"victims": [0, 1, 3]}),
        }
    }

    #[test]
    fn jobs_and_findings_survive_a_reopen_and_the_latest_line_wins() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (h, w) = History::open(dir.path());
        assert!(w.is_empty());
        h.record_job(&line("a/b", "running")).expect("job");
        let f = finding("a/b", "0xf1", FindingState::Open);
        h.record_findings(&[Change::Opened(f.clone())])
            .expect("open");
        let mut r = f.clone();
        r.state = FindingState::Resolved;
        r.resolved_at = Some(2_000);
        h.record_findings(&[Change::Resolved(r.clone())])
            .expect("resolve");
        h.record_findings(&[Change::Opened(finding("a/b", "0xf2", FindingState::Open))])
            .expect("second");

        let (h2, w) = History::open(dir.path());
        assert!(w.is_empty(), "{w:?}");
        let none = |_: &str| false;
        let jobs = h2.jobs(&none);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].job, "a/b");
        assert_eq!(jobs[0].state, "ended", "not live: ended");
        assert_eq!(jobs[0].in_flight, 0);
        let fs = h2.findings(Some("a/b"), &none);
        assert_eq!(fs.len(), 2);
        assert_eq!(fs[0].id, "0xf1");
        assert_eq!(fs[0], r, "the resolved line is the latest");
        assert_eq!(fs[1].state, FindingState::Resolved, "its job ended");
        assert_eq!(
            fs[1].resolved_at,
            Some(5_000),
            "when the job was last heard of"
        );
        // A live job's stored lines give way to the live ones.
        let live = |j: &str| j == "a/b";
        assert!(h2.jobs(&live).is_empty());
        assert!(h2.findings(None, &live).is_empty());
    }

    #[test]
    fn a_torn_last_line_is_reported_and_the_rest_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (h, _) = History::open(dir.path());
        h.record_findings(&[Change::Opened(finding("j", "0xa", FindingState::Open))])
            .expect("open");
        let path = dir.path().join("j").join(FINDINGS_FILE);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.write_all(b"{\"id\":\"0xb\",\"kind\":\"ha")
            .expect("write");
        let (h2, w) = History::open(dir.path());
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("findings.jsonl line 2"), "{w:?}");
        assert_eq!(h2.findings(None, &|_: &str| false).len(), 1);
        // What is recorded after the crash is not glued to the torn line.
        h2.record_findings(&[Change::Opened(finding("j", "0xc", FindingState::Open))])
            .expect("append");
        let (h3, w) = History::open(dir.path());
        assert_eq!(w.len(), 1, "only the torn line: {w:?}");
        let ids: Vec<String> = h3
            .findings(None, &|_: &str| false)
            .into_iter()
            .map(|f| f.id)
            .collect();
        assert_eq!(ids, ["0xa", "0xc"]);
    }

    #[test]
    fn retention_takes_the_history_with_the_last_segment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (h, _) = History::open(dir.path());
        h.record_job(&line("kept", "ended")).expect("job");
        h.record_job(&line("gone", "ended")).expect("job");
        std::fs::write(dir.path().join("kept").join("seg-1.parquet"), b"x").expect("seg");
        forget_emptied(dir.path());
        assert!(!dir.path().join("gone").exists());
        let jobs = h.jobs(&|_: &str| false);
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].job, "kept");
    }
}
