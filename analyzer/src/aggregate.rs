//! The batch driver's aggregations over a trace's calls, with polars: lazy queries run on its
//! streaming engine over Parquet, so a trace of a hundred million records is aggregated in a
//! few passes without being held. `commscope report` and `trace summary` take their tables
//! from here; the detectors keep their record-at-a-time path ([`crate::batch`],
//! [`crate::large`]).
//!
//! A trace held in memory (imported from another format, or small) is written to a temporary
//! Parquet file first, so every trace goes through the same queries.
//!
//! Times are placed on the trace's common base as [`crate::batch::real_time`] places them: a
//! call's span is its GPU interval when it has one (host-mono clock), else its host interval
//! on its own clock; monotonic times move to real time by the process's anchors, then by the
//! collector's clock offset.

use std::path::PathBuf;

use commscope_wire::op::{Op, busbw_factor, flags, lib};
use commscope_wire::parquet::{self as pq, ProcessTrace};
use polars::prelude::*;

/// (comm, rank, time bin, completed through, the bin's last completion in ns, calls).
pub type ProgressRow = (u64, i32, u64, u64, u64, u64);
/// (rank, start ns, end ns, op, seq).
pub type WindowCall = (i32, u64, u64, String, u64);

/// (op, communicator size, message bytes, bandwidth bin, calls).
pub type BandwidthRow = (String, i32, u64, i64, u64);

/// Why a query failed.
pub type Error = PolarsError;

/// The calls of a trace, as a lazy frame with their spans on the common base (`a`, `b`, ns)
/// and `span_ns`.
pub struct Calls {
    files: Vec<PathBuf>,
    /// The job whose rows are read, when the files may hold several.
    job: Option<String>,
    /// A temporary file holding a trace that came from memory.
    _tmp: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls").field("files", &self.files).finish()
    }
}

/// A column of ids (hashes: the top bit is often set) as unsigned 64-bit, 0 for null.
fn id_col(name: &str) -> Expr {
    col(name)
        .cast(DataType::UInt64)
        .fill_null(lit(0u64))
        .alias(name)
}

fn u64c(name: &str) -> Expr {
    col(name).cast(DataType::Int64).fill_null(lit(0i64))
}

/// Each row's facts, computed once for the expressions below: `gpu` (the call has a GPU
/// interval), `hreal` (its host times are on the real-time clock), `shift` (its process's
/// monotonic clock to real time; 0 without anchors) and `off` (the collector's clock offset).
fn with_facts(rows: LazyFrame) -> LazyFrame {
    let shift = when(u64c("real_anchor_ns").eq(lit(0i64)))
        .then(lit(0i64))
        .otherwise(u64c("real_anchor_ns") - u64c("mono_anchor_ns"));
    rows.with_columns([
        has_gpu_time().alias("gpu"),
        col("clock")
            .eq(lit("host-real"))
            .fill_null(lit(false))
            .alias("hreal"),
        shift.alias("shift"),
        col("offset_ns").fill_null(lit(0i64)).alias("off"),
    ])
}

/// `t` (host times; on the real-time clock where `real`) on the common base ([`with_facts`]).
fn on_base(t: Expr, real: Expr) -> Expr {
    (t + when(real).then(lit(0i64)).otherwise(col("shift")) + col("off")).clip_min(lit(0i64))
}

fn has_gpu_time() -> Expr {
    u64c("gpu_start_ns")
        .gt(lit(0i64))
        .and(u64c("gpu_end_ns").gt_eq(u64c("gpu_start_ns")))
}

/// A call's span as its columns hold it ([`commscope_wire::record::Call::span`]): its GPU
/// interval when it has one, else its host interval ([`with_facts`]).
fn span() -> (Expr, Expr) {
    (
        when(col("gpu"))
            .then(u64c("gpu_start_ns"))
            .otherwise(u64c("t_enter_ns")),
        when(col("gpu"))
            .then(u64c("gpu_end_ns"))
            .otherwise(u64c("t_exit_ns")),
    )
}

/// Whether [`span`] is on the host's real-time clock: the GPU interval is on the host-mono
/// clock, whatever the call's own clock ([`crate::batch::call_start`]).
fn span_real() -> Expr {
    col("gpu").not().and(col("hreal"))
}

impl Calls {
    /// The calls of one job in Parquet traces. Files whose footers say they hold other jobs
    /// only are left out, and rows are filtered by job only when some file may hold others.
    pub fn scan(files: Vec<PathBuf>, job: &str) -> Calls {
        let jobs: Vec<Option<Vec<String>>> = files.iter().map(|f| pq::jobs_in_file(f)).collect();
        let only_this = jobs
            .iter()
            .all(|j| j.as_ref().is_some_and(|j| j.iter().all(|x| x == job)));
        let files = files
            .into_iter()
            .zip(jobs)
            .filter(|(_, j)| j.as_ref().is_none_or(|j| j.iter().any(|x| x == job)))
            .map(|(f, _)| f)
            .collect();
        Calls {
            files,
            job: (!only_this).then(|| job.to_owned()),
            _tmp: None,
        }
    }

    /// The calls of processes held in memory (written to a temporary Parquet file).
    pub fn of(processes: &[ProcessTrace]) -> Result<Calls, String> {
        let dir =
            tempfile::tempdir().map_err(|e| format!("failed to make a temporary dir: {e}"))?;
        let path = dir.path().join("trace.parquet");
        commscope_wire::parquet::write(&path, processes).map_err(|e| e.to_string())?;
        Ok(Calls {
            files: vec![path],
            job: None,
            _tmp: Some(dir),
        })
    }

    /// Every row of the traces (all record kinds), with [`with_facts`].
    fn rows(&self) -> Result<LazyFrame, Error> {
        let paths: Vec<PlRefPath> = self
            .files
            .iter()
            .map(|p| PlRefPath::new(p.to_string_lossy().as_ref()))
            .collect();
        let args = ScanArgsParquet {
            allow_missing_columns: true,
            ..Default::default()
        };
        let rows = LazyFrame::scan_parquet_files(paths.into_iter().collect(), args)?;
        Ok(with_facts(match &self.job {
            Some(job) => rows.filter(col("job").eq(lit(job.as_str()))),
            None => rows,
        }))
    }

    /// Completed calls with `a`, `b` (span on the common base) and `span_ns`.
    pub fn calls(&self) -> Result<LazyFrame, Error> {
        let (a, b) = span();
        Ok(self.rows()?.filter(col("kind").eq(lit("call"))).select([
            col("rank"),
            id_col("comm_id"),
            u64c("seq").alias("seq"),
            col("op").fill_null(lit("")),
            u64c("bytes").alias("bytes"),
            col("comm_size").fill_null(lit(0i32)),
            on_base(a.clone(), span_real()).alias("a"),
            on_base(b.clone(), span_real()).alias("b"),
            (b - a).clip_min(lit(0i64)).alias("span_ns"),
        ]))
    }

    /// One pass over every row: how many there are, the first and last times any call,
    /// `enter` or heartbeat carries (ns on the common base; 0 when none does), and the
    /// duration and bandwidth histograms of the calls.
    pub fn shape(&self) -> Result<Shape, Error> {
        let (a, b) = span();
        let beat_t = on_base(u64c("t_ns"), lit(false));
        let first = when(col("beat"))
            .then(beat_t.clone())
            .when(col("call").or(col("enter")))
            .then(col("a"))
            .otherwise(lit(0i64));
        // An `enter` record's call had not ended: it was last heard of when entered.
        let last = when(col("beat"))
            .then(beat_t)
            .when(col("call"))
            .then(col("b"))
            .when(col("enter"))
            .then(on_base(u64c("t_enter_ns"), col("hreal")))
            .otherwise(lit(0i64));
        let us = (col("span_ns").cast(DataType::Float64) / lit(1e3)).clip_min(lit(1.0));
        let gbs = col("bytes").cast(DataType::Float64) / col("span_ns").cast(DataType::Float64);
        // (Point-to-point ops are left out of the bandwidth after grouping, by op.)
        let measured = col("span_ns").gt(lit(0i64)).and(col("bytes").gt(lit(0i64)));
        let q = self
            .rows()?
            .with_columns([
                col("kind").eq(lit("call")).alias("call"),
                col("kind").eq(lit("heartbeat")).alias("beat"),
                col("kind").eq(lit("enter")).alias("enter"),
                u64c("bytes").alias("bytes"),
            ])
            .with_columns([
                on_base(a.clone(), span_real()).alias("a"),
                on_base(b.clone(), span_real()).alias("b"),
                (b - a).clip_min(lit(0i64)).alias("span_ns"),
            ])
            .select([
                col("call"),
                col("op"),
                col("comm_size"),
                col("bytes"),
                (us.log(lit(10.0)) * lit(4.0))
                    .floor()
                    .cast(DataType::Int32)
                    .alias("dbin"),
                when(measured)
                    .then(
                        (gbs.log(lit(10.0)) * lit(BW_BINS_PER_DECADE))
                            .floor()
                            .cast(DataType::Int64),
                    )
                    .otherwise(lit(NULL).cast(DataType::Int64))
                    .alias("bwbin"),
                when(first.clone().gt(lit(0i64)))
                    .then(first)
                    .otherwise(lit(NULL).cast(DataType::Int64))
                    .alias("first"),
                last.alias("last"),
            ])
            .group_by([
                col("call"),
                col("op"),
                col("comm_size"),
                col("bytes"),
                col("dbin"),
                col("bwbin"),
            ])
            .agg([
                col("first").min().alias("first"),
                col("last").max().alias("last"),
                len().cast(DataType::UInt64).alias("n"),
            ]);
        shape_of(&collect(q)?)
    }

    /// What `trace summary` tells of the calls, per communicator, op, communicator size and
    /// rank ([`CommOpRow`]).
    pub fn per_comm_op(&self) -> Result<Vec<CommOpRow>, Error> {
        let bit = |b: u16| (u64c("flags") / lit(i64::from(b)) % lit(2i64)).eq(lit(1i64));
        let nccl_like = col("library")
            .fill_null(lit(lib::name(lib::MPI)))
            .neq(lit(lib::name(lib::MPI)));
        let captured = nccl_like.clone().and(bit(flags::GRAPH_CAPTURED));
        let replay = captured.clone().and(bit(flags::GRAPH_REPLAY));
        let (a, b) = span();
        let span_ns = (b - a).clip_min(lit(0i64));
        let count = |e: Expr| e.cast(DataType::UInt64).sum();
        let host_only = nccl_like.clone().and(bit(flags::HOST_ONLY));
        let timed = captured.clone().or(host_only).not();
        let measured = timed.clone().and(span_ns.clone().gt(lit(0i64)));
        let q = self
            .rows()?
            .filter(col("kind").eq(lit("call")))
            .select([
                id_col("comm_id"),
                col("op").fill_null(lit("")).alias("op"),
                col("comm_size").fill_null(lit(0i32)).alias("comm_size"),
                col("rank").fill_null(lit(-1i32)).alias("rank"),
                u64c("bytes").alias("bytes"),
                col("gpu"),
                replay.clone().alias("replay"),
                captured.and(replay.not()).alias("captured"),
                timed.alias("timed"),
                measured.alias("measured"),
                span_ns.alias("span_ns"),
                bit(flags::LOCAL_COMM_ID).alias("local"),
            ])
            .group_by([col("comm_id"), col("op"), col("comm_size"), col("rank")])
            .agg([
                len().cast(DataType::UInt64).alias("calls"),
                col("bytes").sum().alias("bytes"),
                count(col("gpu")).alias("gpu"),
                count(col("replay")).alias("replay"),
                count(col("captured")).alias("captured"),
                count(col("timed")).alias("timed"),
                when(col("timed"))
                    .then(col("span_ns"))
                    .otherwise(lit(0i64))
                    .sum()
                    .alias("timed_ns"),
                when(col("measured"))
                    .then(col("bytes"))
                    .otherwise(lit(0i64))
                    .sum()
                    .alias("bw_bytes"),
                when(col("measured"))
                    .then(col("span_ns"))
                    .otherwise(lit(0i64))
                    .sum()
                    .alias("bw_ns"),
                col("local").max().alias("local"),
            ]);
        let df = collect(q)?;
        let (comm, op, size, rank) = (
            u64_col(&df, "comm_id")?,
            str_col(&df, "op")?,
            i64_col(&df, "comm_size")?,
            i64_col(&df, "rank")?,
        );
        let n = |name: &str| -> Result<Vec<u64>, Error> {
            Ok(i64_col(&df, name)?
                .into_iter()
                .map(|v| v.unwrap_or(0).max(0) as u64)
                .collect())
        };
        let (calls, bytes, gpu, replay, captured) = (
            n("calls")?,
            n("bytes")?,
            n("gpu")?,
            n("replay")?,
            n("captured")?,
        );
        let (timed, timed_ns, bw_bytes, bw_ns) =
            (n("timed")?, n("timed_ns")?, n("bw_bytes")?, n("bw_ns")?);
        let local = df.column("local")?.cast(&DataType::Boolean)?;
        let local = local.bool()?;
        let mut out: Vec<CommOpRow> = (0..df.height())
            .map(|i| CommOpRow {
                comm: comm[i].unwrap_or(0),
                op: op[i].clone().unwrap_or_default(),
                size: size[i].unwrap_or(0) as i32,
                rank: rank[i].unwrap_or(-1) as i32,
                calls: calls[i],
                bytes: bytes[i],
                gpu_timed: gpu[i],
                graph_launches: replay[i],
                graph_captured: captured[i],
                timed: timed[i],
                timed_ns: timed_ns[i],
                bw_bytes: bw_bytes[i],
                bw_ns: bw_ns[i],
                local_id: local.get(i).unwrap_or(false),
            })
            .collect();
        out.sort_by(|a, b| (a.comm, &a.op, a.size, a.rank).cmp(&(b.comm, &b.op, b.size, b.rank)));
        Ok(out)
    }

    /// Collectives completed per communicator, rank and time bin (`bin_ns` wide from `start`).
    pub fn progress(&self, start: u64, bin_ns: u64) -> Result<Vec<ProgressRow>, Error> {
        progress_rows(&collect(progress_plan(self.calls()?, start, bin_ns))?)
    }

    /// The calls of `ranks` that overlap `[from, to]`, earliest first, `per_rank` at most each:
    /// (rank, a, b, op, seq).
    pub fn window(
        &self,
        ranks: &[i32],
        from: u64,
        to: u64,
        per_rank: usize,
    ) -> Result<Vec<WindowCall>, Error> {
        let who = ranks
            .iter()
            .fold(lit(false), |e, r| e.or(col("rank").eq(lit(*r))));
        let q = self
            .calls()?
            .filter(
                who.and(col("b").gt_eq(lit(from as i64)))
                    .and(col("a").lt_eq(lit(to as i64))),
            )
            .select([col("rank"), col("a"), col("b"), col("op"), col("seq")]);
        let df = collect(q)?;
        let rank = df.column("rank")?.cast(&DataType::Int32)?;
        let a = df.column("a")?.cast(&DataType::Int64)?;
        let b = df.column("b")?.cast(&DataType::Int64)?;
        let op = df.column("op")?.cast(&DataType::String)?;
        let seq = df.column("seq")?.cast(&DataType::Int64)?;
        let (rank, a, b, op, seq) = (rank.i32()?, a.i64()?, b.i64()?, op.str()?, seq.i64()?);
        let mut out: Vec<WindowCall> = (0..df.height())
            .filter_map(|i| {
                Some((
                    rank.get(i)?,
                    a.get(i)?.max(0) as u64,
                    b.get(i)?.max(0) as u64,
                    op.get(i)?.to_owned(),
                    seq.get(i)?.max(0) as u64,
                ))
            })
            .collect();
        out.sort_by_key(|x| (x.0, x.1));
        let mut kept = Vec::with_capacity(out.len());
        let mut last = (i32::MIN, 0usize);
        for x in out {
            last = if x.0 == last.0 {
                (x.0, last.1 + 1)
            } else {
                (x.0, 1)
            };
            if last.1 <= per_rank {
                kept.push(x);
            }
        }
        Ok(kept)
    }
}

/// The calls of one communicator, op, communicator size and rank ([`Calls::per_comm_op`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommOpRow {
    pub comm: u64,
    pub op: String,
    pub size: i32,
    pub rank: i32,
    pub calls: u64,
    pub bytes: u64,
    /// Calls with a GPU interval.
    pub gpu_timed: u64,
    /// Records of CUDA graph launches that ran the op again.
    pub graph_launches: u64,
    /// Calls captured into a CUDA graph (no GPU interval of their own).
    pub graph_captured: u64,
    /// Calls not captured into a graph, and their summed span (ns).
    pub timed: u64,
    pub timed_ns: u64,
    /// Of those, the calls with a span: their bytes and summed span (ns).
    pub bw_bytes: u64,
    pub bw_ns: u64,
    /// A call carried a communicator id local to its process.
    pub local_id: bool,
}

/// What one pass over a trace's rows gives ([`Calls::shape`]).
#[derive(Debug, Default)]
pub struct Shape {
    /// Rows of every kind.
    pub rows: u64,
    /// The first and last times on the common base (ns; 0 when no row carries one).
    pub start: u64,
    pub end: u64,
    /// (op, quarter-decade bin from 1 µs, calls).
    pub durations: Vec<(String, i32, u64)>,
    /// (op, communicator size, message bytes, bandwidth bin, calls): algorithm bandwidth in
    /// bins of 1 % ([`bandwidth_of_bin`]).
    pub bandwidth: Vec<BandwidthRow>,
}

/// Bandwidth bins per decade (a bin is 1/100 of a decade: about 2.3 % wide).
const BW_BINS_PER_DECADE: f64 = 100.0;

/// The middle of a bandwidth bin, GB/s.
pub fn bandwidth_of_bin(bin: i64) -> f64 {
    10f64.powf((bin as f64 + 0.5) / BW_BINS_PER_DECADE)
}

fn progress_plan(calls: LazyFrame, start: u64, bin_ns: u64) -> LazyFrame {
    calls
        .filter(p2p(col("op")).not())
        .with_columns([((col("b") - lit(start as i64)).clip_min(lit(0i64))
            / lit(bin_ns.max(1) as i64))
        .alias("bin")])
        .group_by([col("comm_id"), col("rank"), col("bin")])
        .agg([
            (col("seq") + lit(1i64)).max().alias("through"),
            col("b").max().alias("last"),
            len().cast(DataType::UInt64).alias("n"),
        ])
}

fn u64_col(df: &DataFrame, name: &str) -> Result<Vec<Option<u64>>, Error> {
    let c = df.column(name)?.cast(&DataType::UInt64)?;
    let a = c.u64()?;
    Ok((0..a.len()).map(|i| a.get(i)).collect())
}

fn i64_col(df: &DataFrame, name: &str) -> Result<Vec<Option<i64>>, Error> {
    let c = df.column(name)?.cast(&DataType::Int64)?;
    let a = c.i64()?;
    Ok((0..a.len()).map(|i| a.get(i)).collect())
}

fn str_col(df: &DataFrame, name: &str) -> Result<Vec<Option<String>>, Error> {
    let c = df.column(name)?.cast(&DataType::String)?;
    let a = c.str()?;
    Ok((0..a.len()).map(|i| a.get(i).map(str::to_owned)).collect())
}

fn progress_rows(df: &DataFrame) -> Result<Vec<ProgressRow>, Error> {
    let (c, r, bin, th, last, n) = (
        u64_col(df, "comm_id")?,
        i64_col(df, "rank")?,
        i64_col(df, "bin")?,
        i64_col(df, "through")?,
        i64_col(df, "last")?,
        i64_col(df, "n")?,
    );
    let mut out: Vec<ProgressRow> = (0..df.height())
        .filter_map(|i| {
            Some((
                c[i]?,
                r[i]? as i32,
                bin[i]?.max(0) as u64,
                th[i]?.max(0) as u64,
                last[i]?.max(0) as u64,
                n[i]?.max(0) as u64,
            ))
        })
        .collect();
    out.sort_by_key(|x| (x.0, x.2, x.1));
    Ok(out)
}

fn shape_of(df: &DataFrame) -> Result<Shape, Error> {
    let call = df.column("call")?.cast(&DataType::Boolean)?;
    let call = call.bool()?;
    let (op, size, bytes) = (
        str_col(df, "op")?,
        i64_col(df, "comm_size")?,
        i64_col(df, "bytes")?,
    );
    let (dbin, bwbin) = (i64_col(df, "dbin")?, i64_col(df, "bwbin")?);
    let (first, last, n) = (
        i64_col(df, "first")?,
        i64_col(df, "last")?,
        i64_col(df, "n")?,
    );
    let mut rows = 0u64;
    let mut start: Option<i64> = None;
    let mut end = 0i64;
    let mut durations: std::collections::BTreeMap<(String, i32), u64> = Default::default();
    let mut bandwidth: std::collections::BTreeMap<(String, i32, u64, i64), u64> =
        Default::default();
    for i in 0..df.height() {
        let k = n[i].unwrap_or(0).max(0) as u64;
        rows += k;
        if let Some(f) = first[i] {
            start = Some(start.map_or(f, |s| s.min(f)));
        }
        end = end.max(last[i].unwrap_or(0));
        if call.get(i) != Some(true) {
            continue;
        }
        let op = op[i].clone().unwrap_or_default();
        if let Some(d) = dbin[i] {
            *durations.entry((op.clone(), d as i32)).or_default() += k;
        }
        let p2p = Op::from_name(&op).is_some_and(|o| o.is_p2p() && o != Op::Sendrecv);
        if p2p {
            continue;
        }
        if let (Some(b), s, Some(bytes)) = (bwbin[i], size[i].unwrap_or(0), bytes[i]) {
            *bandwidth
                .entry((op, s as i32, bytes.max(0) as u64, b))
                .or_default() += k;
        }
    }
    let start = start.unwrap_or(0).max(0) as u64;
    Ok(Shape {
        rows,
        start,
        end: (end.max(0) as u64).max(start),
        durations: durations.into_iter().map(|((o, b), n)| (o, b, n)).collect(),
        bandwidth: bandwidth
            .into_iter()
            .map(|((o, s, bytes, b), n)| (o, s, bytes, b, n))
            .collect(),
    })
}

/// Median bus bandwidth (GB/s) per op and message size, with the calls measured, from the
/// algorithm-bandwidth histograms: nccl-tests' factor ([`busbw_factor`]) for each op and
/// communicator size, applied to each bin.
pub fn busbw_medians(bandwidth: &[BandwidthRow]) -> Vec<(String, u64, f64, u64)> {
    let mut by: std::collections::BTreeMap<(&str, u64), Vec<(f64, u64)>> = Default::default();
    for (op, size, bytes, bin, n) in bandwidth {
        let Some(f) = Op::from_name(op).and_then(|o| busbw_factor(o, *size)) else {
            continue;
        };
        by.entry((op.as_str(), *bytes))
            .or_default()
            .push((bandwidth_of_bin(*bin) * f, *n));
    }
    by.into_iter()
        .map(|((op, bytes), mut bins)| {
            bins.sort_by(|a, b| a.0.total_cmp(&b.0));
            let total: u64 = bins.iter().map(|b| b.1).sum();
            let mut seen = 0;
            let mut median = 0.0;
            for (v, n) in &bins {
                seen += n;
                if seen * 2 > total {
                    median = *v;
                    break;
                }
            }
            (op.to_owned(), bytes, median, total)
        })
        .collect()
}

/// Whether the op column names a point-to-point operation.
fn p2p(op: Expr) -> Expr {
    let names: Vec<&str> = Op::ALL
        .iter()
        .filter(|o| o.is_p2p())
        .map(|o| o.name())
        .collect();
    op.is_in(lit(Series::new("p2p".into(), names)).implode(false), false)
}

/// Runs a query on the streaming engine.
fn collect(q: LazyFrame) -> Result<DataFrame, Error> {
    Ok(q.collect_with_engine(Engine::Streaming)?.unwrap_single())
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::cst::Header;
    use commscope_wire::record::{Call, Record};

    const MS: u64 = 1_000_000;

    /// Two ranks, ten all-reduces of 1 MiB 100 ms apart; rank 1 arrives 3 ms after rank 0 and
    /// both leave together 2 ms later.
    fn job() -> Vec<ProcessTrace> {
        (0..2)
            .map(|rank| ProcessTrace {
                header: Header {
                    job: "j".into(),
                    node: format!("n{rank}"),
                    pid: 10 + rank as u32,
                    rank,
                    world_size: 2,
                    ..Default::default()
                },
                records: (0..10u64)
                    .map(|seq| {
                        let t0 = 1_000 * MS + seq * 100 * MS;
                        Record::Call(Call {
                            op: Op::Allreduce as u8,
                            comm_id: 0xc000_0000_0000_000c,
                            seq,
                            bytes: 1 << 20,
                            peer: -1,
                            rank,
                            comm_rank: rank,
                            comm_size: 2,
                            t_enter: t0 + rank as u64 * 3 * MS,
                            t_exit: t0 + 5 * MS,
                            rec_seq: seq + 1,
                            ..Default::default()
                        })
                    })
                    .collect(),
                clock: None,
                cut_short: false,
            })
            .collect()
    }

    #[test]
    fn the_report_tables_hold_what_the_calls_say() {
        let calls = Calls::of(&job()).expect("calls");
        let t = calls.shape().expect("shape");
        assert_eq!((t.rows, t.start, t.end), (20, 1_000 * MS, 1_905 * MS));
        let progress = calls.progress(t.start, 500 * MS).expect("progress");
        // 5 ms (rank 0) and 2 ms (rank 1): bins of a quarter decade from 1 µs.
        let bin = |us: f64| (us.log10() * 4.0).floor() as i32;
        let mut want = vec![
            ("allreduce".to_owned(), bin(2000.0), 10),
            ("allreduce".to_owned(), bin(5000.0), 10),
        ];
        want.sort();
        assert_eq!(t.durations, want);
        // Progress: both ranks through seq 4 in the first 500 ms bin, through 9 in the second.
        let through: Vec<(i32, u64, u64)> = progress.iter().map(|r| (r.1, r.2, r.3)).collect();
        assert_eq!(through, vec![(0, 0, 5), (1, 0, 5), (0, 1, 10), (1, 1, 10)]);
        // Communicator ids are hashes: the top bit survives.
        assert!(progress.iter().all(|r| r.0 == 0xc000_0000_0000_000c));
        let per = calls.per_comm_op().expect("per communicator");
        let rank = |r: i32| CommOpRow {
            comm: 0xc000_0000_0000_000c,
            op: "allreduce".into(),
            size: 2,
            rank: r,
            calls: 10,
            bytes: 10 << 20,
            timed: 10,
            timed_ns: 10 * if r == 0 { 5 * MS } else { 2 * MS },
            bw_bytes: 10 << 20,
            bw_ns: 10 * if r == 0 { 5 * MS } else { 2 * MS },
            ..Default::default()
        };
        assert_eq!(per, vec![rank(0), rank(1)]);
        // Bus bandwidth: factor 2 (n-1)/n = 1 for two ranks; the median is rank 0's 5 ms or
        // rank 1's 2 ms call, within a bin (2.3 %).
        let med = busbw_medians(&t.bandwidth);
        assert_eq!(med.len(), 1);
        let (op, bytes, gbs, n) = &med[0];
        assert_eq!((op.as_str(), *bytes, *n), ("allreduce", 1 << 20, 20));
        let slow = (1u64 << 20) as f64 / (5 * MS) as f64;
        let fast = (1u64 << 20) as f64 / (2 * MS) as f64;
        assert!(
            (gbs / slow - 1.0).abs() < 0.025 || (gbs / fast - 1.0).abs() < 0.025,
            "{gbs} GB/s"
        );
        // The calls of rank 1 around 1.2 s.
        let w = calls
            .window(&[1], 1_200 * MS, 1_250 * MS, 10)
            .expect("window");
        assert_eq!(
            w,
            vec![(1, 1_203 * MS, 1_205 * MS, "allreduce".to_owned(), 2)]
        );
    }
}
