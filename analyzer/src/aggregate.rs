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

use commscope_wire::op::{Op, busbw_factor};
use commscope_wire::parquet::ProcessTrace;
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

fn u64c(name: &str) -> Expr {
    col(name).cast(DataType::Int64).fill_null(lit(0i64))
}

/// `t` (a column of host times on `clock`) on the common base.
fn on_base(t: Expr, host_real: Expr) -> Expr {
    let moved = when(host_real.or(u64c("real_anchor_ns").eq(lit(0i64))))
        .then(t.clone())
        .otherwise(t - u64c("mono_anchor_ns") + u64c("real_anchor_ns"));
    (moved + col("offset_ns").fill_null(lit(0i64))).clip_min(lit(0i64))
}

fn host_real() -> Expr {
    col("clock").eq(lit("host-real")).fill_null(lit(false))
}

fn has_gpu_time() -> Expr {
    u64c("gpu_start_ns")
        .gt(lit(0i64))
        .and(u64c("gpu_end_ns").gt_eq(u64c("gpu_start_ns")))
}

/// A call's span as its columns hold it ([`commscope_wire::record::Call::span`]): its GPU
/// interval when it has one, else its host interval.
fn span() -> (Expr, Expr) {
    (
        when(has_gpu_time())
            .then(u64c("gpu_start_ns"))
            .otherwise(u64c("t_enter_ns")),
        when(has_gpu_time())
            .then(u64c("gpu_end_ns"))
            .otherwise(u64c("t_exit_ns")),
    )
}

/// Whether [`span`] is on the host's real-time clock: the GPU interval is on the host-mono
/// clock, whatever the call's own clock ([`crate::batch::call_start`]).
fn span_real() -> Expr {
    has_gpu_time().not().and(host_real())
}

impl Calls {
    /// The calls of one job in Parquet traces.
    pub fn scan(files: Vec<PathBuf>, job: &str) -> Calls {
        Calls {
            files,
            job: Some(job.to_owned()),
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

    /// Every row of the traces (all record kinds).
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
        Ok(match &self.job {
            Some(job) => rows.filter(col("job").eq(lit(job.as_str()))),
            None => rows,
        })
    }

    /// Completed calls with `a`, `b` (span on the common base) and `span_ns`.
    pub fn calls(&self) -> Result<LazyFrame, Error> {
        let (a, b) = span();
        Ok(self.rows()?.filter(col("kind").eq(lit("call"))).select([
            col("rank"),
            col("node"),
            u64c("comm_id").alias("comm_id"),
            u64c("seq").alias("seq"),
            col("op").fill_null(lit("")),
            u64c("bytes").alias("bytes"),
            col("comm_size").fill_null(lit(0i32)),
            on_base(a.clone(), span_real()).alias("a"),
            on_base(b.clone(), span_real()).alias("b"),
            (b - a).clip_min(lit(0i64)).alias("span_ns"),
        ]))
    }

    /// Rows of all kinds, and the first and last times any call, `enter` or heartbeat carries
    /// (ns on the common base; 0 when none does).
    pub fn extent(&self) -> Result<(u64, u64, u64), Error> {
        let (a, b) = span();
        let beat = col("kind").eq(lit("heartbeat"));
        let call = col("kind").eq(lit("call"));
        let enter = col("kind").eq(lit("enter"));
        let beat_t = on_base(u64c("t_ns"), lit(false));
        let first = when(beat.clone())
            .then(beat_t.clone())
            .when(call.clone().or(enter.clone()))
            .then(on_base(a, span_real()))
            .otherwise(lit(0i64));
        // An `enter` record's call had not ended: it was last heard of when entered.
        let last = when(beat)
            .then(beat_t)
            .when(call)
            .then(on_base(b, span_real()))
            .when(enter)
            .then(on_base(u64c("t_enter_ns"), host_real()))
            .otherwise(lit(0i64));
        let df = collect(
            self.rows()?.select([
                len().alias("rows"),
                when(first.clone().gt(lit(0i64)))
                    .then(first)
                    .otherwise(lit(NULL).cast(DataType::Int64))
                    .min()
                    .alias("start"),
                last.max().alias("end"),
            ]),
        )?;
        let at = |name: &str| -> Result<u64, Error> {
            Ok(i64_col(&df, name)?
                .first()
                .copied()
                .flatten()
                .unwrap_or(0)
                .max(0) as u64)
        };
        let (start, end) = (at("start")?, at("end")?);
        Ok((at("rows")?, start, end.max(start)))
    }

    /// Every table of the report; progress bins are `progress_bin_ns` wide from `start`.
    pub fn tables(&self, start: u64, progress_bin_ns: u64) -> Result<Tables, Error> {
        let calls = self.calls()?;
        // One query at a time: plans collected together share their scan, and the engine
        // buffers what one has read ahead of another (memory growing with the trace).
        Ok(Tables {
            progress: progress_rows(&collect(progress_plan(
                calls.clone(),
                start,
                progress_bin_ns,
            ))?)?,
            durations: durations_rows(&collect(durations_plan(calls.clone()))?)?,
            bandwidth: bandwidth_rows(&collect(bandwidth_plan(calls))?)?,
        })
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

/// The report's tables ([`Calls::tables`]).
#[derive(Debug, Default)]
pub struct Tables {
    /// Per communicator, rank and time bin: collectives completed through and the bin's last
    /// completion; by communicator and bin.
    pub progress: Vec<ProgressRow>,
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

fn durations_plan(calls: LazyFrame) -> LazyFrame {
    let us = (col("span_ns").cast(DataType::Float64) / lit(1e3)).clip_min(lit(1.0));
    calls
        .with_columns([(us.log(lit(10.0)) * lit(4.0))
            .floor()
            .cast(DataType::Int32)
            .alias("bin")])
        .group_by([col("op"), col("bin")])
        .agg([len().cast(DataType::UInt64).alias("n")])
}

/// Algorithm bandwidth histograms per op, communicator size and message size: a median from
/// them needs no call's value held (the bus factor is applied per communicator size after).
fn bandwidth_plan(calls: LazyFrame) -> LazyFrame {
    let gbs = col("bytes").cast(DataType::Float64) / col("span_ns").cast(DataType::Float64);
    calls
        .filter(
            col("span_ns")
                .gt(lit(0i64))
                .and(col("bytes").gt(lit(0i64)))
                .and(p2p(col("op")).not().or(col("op").eq(lit("sendrecv")))),
        )
        .with_columns([(gbs.log(lit(10.0)) * lit(BW_BINS_PER_DECADE))
            .floor()
            .cast(DataType::Int64)
            .alias("bin")])
        .group_by([col("op"), col("comm_size"), col("bytes"), col("bin")])
        .agg([len().cast(DataType::UInt64).alias("n")])
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
        i64_col(df, "comm_id")?,
        i64_col(df, "rank")?,
        i64_col(df, "bin")?,
        i64_col(df, "through")?,
        i64_col(df, "last")?,
        i64_col(df, "n")?,
    );
    let mut out: Vec<ProgressRow> = (0..df.height())
        .filter_map(|i| {
            Some((
                c[i]? as u64,
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

fn durations_rows(df: &DataFrame) -> Result<Vec<(String, i32, u64)>, Error> {
    let (op, bin, n) = (str_col(df, "op")?, i64_col(df, "bin")?, i64_col(df, "n")?);
    let mut out: Vec<(String, i32, u64)> = (0..df.height())
        .filter_map(|i| Some((op[i].clone()?, bin[i]? as i32, n[i]?.max(0) as u64)))
        .collect();
    out.sort();
    Ok(out)
}

fn bandwidth_rows(df: &DataFrame) -> Result<Vec<BandwidthRow>, Error> {
    let (op, size, bytes, bin, n) = (
        str_col(df, "op")?,
        i64_col(df, "comm_size")?,
        i64_col(df, "bytes")?,
        i64_col(df, "bin")?,
        i64_col(df, "n")?,
    );
    let mut out: Vec<BandwidthRow> = (0..df.height())
        .filter_map(|i| {
            Some((
                op[i].clone()?,
                size[i]? as i32,
                bytes[i]?.max(0) as u64,
                bin[i]?,
                n[i]?.max(0) as u64,
            ))
        })
        .collect();
    out.sort();
    Ok(out)
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
    Op::ALL
        .iter()
        .filter(|o| o.is_p2p())
        .fold(lit(false), |e, o| e.or(op.clone().eq(lit(o.name()))))
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
                            comm_id: 0xc,
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
            })
            .collect()
    }

    #[test]
    fn the_report_tables_hold_what_the_calls_say() {
        let calls = Calls::of(&job()).expect("calls");
        let (rows, start, end) = calls.extent().expect("extent");
        assert_eq!((rows, start, end), (20, 1_000 * MS, 1_905 * MS));
        let t = calls.tables(start, 500 * MS).expect("tables");
        // 5 ms (rank 0) and 2 ms (rank 1): bins of a quarter decade from 1 µs.
        let bin = |us: f64| (us.log10() * 4.0).floor() as i32;
        let mut want = vec![
            ("allreduce".to_owned(), bin(2000.0), 10),
            ("allreduce".to_owned(), bin(5000.0), 10),
        ];
        want.sort();
        assert_eq!(t.durations, want);
        // Progress: both ranks through seq 4 in the first 500 ms bin, through 9 in the second.
        let through: Vec<(i32, u64, u64)> = t.progress.iter().map(|r| (r.1, r.2, r.3)).collect();
        assert_eq!(through, vec![(0, 0, 5), (1, 0, 5), (0, 1, 10), (1, 1, 10)]);
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
