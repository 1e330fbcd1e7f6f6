//! `commscope report` and `commscope export perfetto`: traces in, one file out.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use commscope_analyzer::aggregate::Calls;
use commscope_analyzer::postmortem;
use commscope_wire::op::Clock;
use commscope_wire::record::Record;
use serde_json::{Value, json};

use crate::traces;

/// Writes `out` whole or not at all (a temporary file renamed over it).
fn write_atomically(out: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = out.with_extension("commscope-tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("failed to write {}", tmp.display()))?;
    std::fs::rename(&tmp, out).with_context(|| format!("failed to write {}", out.display()))
}

/// Chrome trace events written one by one (a trace's events are never all in memory), to a
/// temporary file renamed over the output when whole.
struct EventWriter {
    out: PathBuf,
    tmp: PathBuf,
    w: std::io::BufWriter<std::fs::File>,
    first: bool,
}

impl EventWriter {
    fn create(out: &Path) -> Result<EventWriter> {
        let tmp = out.with_extension("commscope-tmp");
        let f = std::fs::File::create(&tmp)
            .with_context(|| format!("failed to write {}", tmp.display()))?;
        let mut w = std::io::BufWriter::new(f);
        w.write_all(b"{\"displayTimeUnit\":\"ms\",\"otherData\":")?;
        serde_json::to_writer(
            &mut w,
            &json!({"generator": "commscope", "version": env!("CARGO_PKG_VERSION")}),
        )?;
        w.write_all(b",\"traceEvents\":[\n")?;
        Ok(EventWriter {
            out: out.to_owned(),
            tmp,
            w,
            first: true,
        })
    }

    fn push(&mut self, ev: &Value) -> Result<()> {
        if !self.first {
            self.w.write_all(b",\n")?;
        }
        self.first = false;
        serde_json::to_writer(&mut self.w, ev)?;
        Ok(())
    }

    fn finish(mut self) -> Result<()> {
        self.w.write_all(b"\n]}\n")?;
        self.w
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_all())
            .with_context(|| format!("failed to write {}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.out)
            .with_context(|| format!("failed to write {}", self.out.display()))
    }
}

/// `commscope analyze PATH… [--format json]`: every finding of every job, as sentences or in
/// the contract's JSON shape.
pub fn analyze(paths: &[PathBuf], json: bool) -> Result<ExitCode> {
    let th = commscope_analyzer::Thresholds::default();
    let (jobs, _) = traces::analyzed(
        paths,
        traces::streamed_files(paths)?,
        &th,
        traces::Warnings::Print,
    )?;
    let mut all = Vec::new();
    for job in jobs {
        if std::env::var_os("COMMSCOPE_EXPLAIN").is_some() {
            explain(&job, &th);
        }
        let found = job.analysis.findings;
        if !json {
            if found.is_empty() {
                println!(
                    "job {}: no findings ({} ranks, {} records)",
                    job.job,
                    job.processes
                        .iter()
                        .filter(|p| !p.header.is_transport())
                        .count(),
                    job.records
                );
            }
            for f in &found {
                println!("job {}: {} — {}", job.job, f.kind.name(), f.summary);
            }
        }
        all.extend(found);
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "findings": all }))?
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `COMMSCOPE_EXPLAIN=1`: what the detectors saw of each rank, on standard error.
fn explain(job: &traces::Job, th: &commscope_analyzer::Thresholds) {
    let v = &job.analysis.view;
    for r in v.ranks.values() {
        eprintln!(
            "job {}: rank {}: last heard {:.3} s before the end, ended {:?}, finalized {}, in flight {:?}",
            job.job,
            r.rank,
            v.now_ns.saturating_sub(r.last_heard_ns) as f64 / 1e9,
            r.ended,
            r.finalized,
            r.in_flight
                .iter()
                .map(|c| format!(
                    "{} #{} on {:#x} for {:.3} s",
                    c.op.name(),
                    c.seq,
                    c.comm,
                    c.age_ns as f64 / 1e9
                ))
                .collect::<Vec<_>>()
        );
    }
    let health = if job.loaded() {
        commscope_analyzer::batch::slow_rank_view(&job.processes, &th.tuning)
    } else {
        Vec::new()
    };
    for (r, share, late, ratio, blame) in health.iter().take(8) {
        eprintln!(
            "job {}: rank {r}: others waited for it {:.1} % of the time (blame {blame:.3} s), late {late:.1} (decayed), late ratio {ratio:.2}",
            job.job,
            share * 100.0
        );
    }
}

fn aggregate(calls: &Calls, job: &str) -> Result<postmortem::Aggregates> {
    postmortem::aggregate(calls)
        .with_context(|| format!("failed to aggregate the calls of job {job}"))
}

/// `commscope report PATH… -o FILE.html`. A streamed trace is aggregated by polars while the
/// detectors read it (when its files' footers name its jobs).
pub fn report(paths: &[PathBuf], out: &Path) -> Result<ExitCode> {
    let streamed = traces::streamed_files(paths)?;
    if streamed.is_none() {
        return report_from(paths, out, None, traces::Warnings::Print);
    }
    // polars cannot read past damage in a file; loaded, what is readable still reports (its
    // files' warnings were printed by the first reading).
    report_from(paths, out, streamed, traces::Warnings::Print).or_else(|e| {
        eprintln!("commscope: warning: {e:#}; loading the trace instead of streaming it");
        report_from(paths, out, None, traces::Warnings::Quiet)
    })
}

/// [`report`], streaming `streamed` ([`traces::streamed_files`]) or loading `paths`.
fn report_from(
    paths: &[PathBuf],
    out: &Path,
    streamed: Option<Vec<PathBuf>>,
    print: traces::Warnings,
) -> Result<ExitCode> {
    let th = commscope_analyzer::Thresholds::default();
    // (job, its calls, their aggregates) computed beside the analysis.
    type Early = Vec<(String, Calls, postmortem::Aggregates)>;
    let early: Option<std::thread::JoinHandle<Result<Early>>> = streamed
        .clone()
        .and_then(|files| Some((traces::jobs_of(&files)?, files)))
        .map(|(jobs, files)| {
            std::thread::spawn(move || {
                jobs.into_iter()
                    .map(|job| {
                        let calls = Calls::scan(files.clone(), &job);
                        let agg = aggregate(&calls, &job)?;
                        Ok((job, calls, agg))
                    })
                    .collect()
            })
        });
    let t0 = std::time::Instant::now();
    let (jobs, warnings) = traces::analyzed(paths, streamed, &th, print)?;
    tracing::debug!(elapsed_ms = t0.elapsed().as_millis() as u64, "analyzed");
    let mut early: Early = match early.map(|h| h.join()) {
        Some(Ok(r)) => r?,
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => Vec::new(),
    };
    tracing::debug!(elapsed_ms = t0.elapsed().as_millis() as u64, "aggregated");
    let mut reports = Vec::with_capacity(jobs.len());
    for j in &jobs {
        let (calls, agg) = match early.iter().position(|e| e.0 == j.job) {
            Some(i) => {
                let (_, calls, agg) = early.swap_remove(i);
                (calls, agg)
            }
            None => {
                let calls = j.calls()?;
                let agg = aggregate(&calls, &j.job)?;
                (calls, agg)
            }
        };
        reports.push(
            postmortem::report(&j.job, &j.processes, &calls, agg, &j.analysis)
                .with_context(|| format!("failed to draw the timelines of job {}", j.job))?,
        );
    }
    tracing::debug!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "reports drawn"
    );
    let sources: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let html = commscope_report::render(&reports, &sources, &warnings);
    write_atomically(out, html.as_bytes())?;
    let findings: usize = reports.iter().map(|j| j.findings.len()).sum();
    eprintln!(
        "wrote {} ({} job{}, {findings} finding{}, {:.1} MiB)",
        out.display(),
        reports.len(),
        if reports.len() == 1 { "" } else { "s" },
        if findings == 1 { "" } else { "s" },
        html.len() as f64 / (1 << 20) as f64
    );
    Ok(ExitCode::SUCCESS)
}

/// `commscope export perfetto PATH… -o FILE.json`: the Chrome trace event format, which
/// ui.perfetto.dev and chrome://tracing open. One process per rank (its track), named by rank
/// and node; calls as complete events in lanes that never overlap; calls never completed run to
/// the trace's end; findings as instant events on the ranks they name (global when none).
/// Every time is on the trace's common clock (clock offsets applied), in µs from its start.
pub fn perfetto(paths: &[PathBuf], out: &Path) -> Result<ExitCode> {
    let loaded = traces::load(paths)?;
    let th = commscope_analyzer::Thresholds::default();
    let mut events = EventWriter::create(out)?;
    let mut calls = 0usize;
    for (ji, j) in loaded.jobs.values().enumerate() {
        let a = commscope_analyzer::analysis(&j.job, &j.processes, &th);
        let start = j
            .processes
            .iter()
            .flat_map(|p| {
                p.records.iter().filter_map(move |r| match r {
                    Record::Call(c) | Record::Enter(c) => Some(
                        commscope_analyzer::batch::real_time(p, c.span().0, Clock::HostMono),
                    ),
                    _ => None,
                })
            })
            .filter(|t| *t > 0)
            .min()
            .unwrap_or(0);
        let us = |t: u64| t.saturating_sub(start) as f64 / 1e3;
        let end = a.view.now_ns.max(start);
        let pid_of = |rank: i32| (ji as i64) * 1_000_000 + i64::from(rank) + 1;
        for p in j.processes.iter().filter(|p| !p.header.is_transport()) {
            let pid = pid_of(p.header.rank);
            let name = if p.header.node.is_empty() {
                format!("{}: rank {}", j.job, p.header.rank)
            } else {
                format!("{}: rank {} on {}", j.job, p.header.rank, p.header.node)
            };
            events.push(
                &json!({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}),
            )?;
            events.push(&json!({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": p.header.rank}}))?;
            // Lanes: each call goes to the first whose last call ended before it began.
            let mut spans: Vec<(u64, u64, Value)> = Vec::new();
            for r in &p.records {
                let Record::Call(c) = r else { continue };
                let (s, e) = c.span();
                let (s, e) = (
                    commscope_analyzer::batch::real_time(p, s, Clock::HostMono),
                    commscope_analyzer::batch::real_time(p, e, Clock::HostMono),
                );
                let comm = a.view.comm_label(c.comm_id);
                spans.push((
                    s,
                    e.max(s),
                    json!({"name": c.op().name(), "cat": if c.op().is_p2p() { "p2p" } else { "collective" },
                           "args": {"communicator": comm, "seq": c.seq, "bytes": c.bytes, "count": c.count,
                                    "peer": c.peer, "status": c.status,
                                    "gpu": c.has_gpu_time()}}),
                ));
            }
            if let Some(v) = a.view.ranks.get(&p.header.rank) {
                for c in &v.in_flight {
                    spans.push((
                        c.entered_ns.max(start),
                        end,
                        json!({"name": format!("{} (never completed)", c.op.name()), "cat": "in-flight",
                               "args": {"communicator": a.view.comm_label(c.comm), "seq": c.seq, "bytes": c.bytes}}),
                    ));
                }
            }
            spans.sort_by_key(|x| (x.0, std::cmp::Reverse(x.1)));
            let mut lanes: Vec<u64> = Vec::new();
            for (s, e, mut ev) in spans {
                let lane = match lanes.iter().position(|l| *l <= s) {
                    Some(i) => {
                        lanes[i] = e;
                        i
                    }
                    None => {
                        lanes.push(e);
                        lanes.len() - 1
                    }
                };
                ev["ph"] = "X".into();
                ev["pid"] = pid.into();
                ev["tid"] = (lane + 1).into();
                ev["ts"] = us(s).into();
                ev["dur"] = ((e - s) as f64 / 1e3).into();
                events.push(&ev)?;
                calls += 1;
            }
            for l in 0..lanes.len() {
                events.push(&json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": l + 1,
                                   "args": {"name": if l == 0 { "calls".to_owned() } else { format!("calls ({})", l + 1) }}}))?;
            }
        }
        for f in &a.findings {
            let at = us(f.opened_at.clamp(start, end));
            let args = json!({"summary": f.summary, "id": f.id, "state": f.state, "comm": f.comm, "seq": f.seq});
            if f.ranks.is_empty() {
                events.push(&json!({"ph": "i", "s": "g", "name": f.kind.name(), "ts": at, "pid": pid_of(-1), "tid": 0, "args": args}))?;
            }
            for r in &f.ranks {
                events.push(
                    &json!({"ph": "i", "s": "p", "name": f.kind.name(), "ts": at,
                                   "pid": pid_of(*r), "tid": 1, "args": args}),
                )?;
            }
        }
    }
    events.finish()?;
    eprintln!("wrote {} ({calls} calls)", out.display());
    Ok(traces::exit_code(&loaded))
}
