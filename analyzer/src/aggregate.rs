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

/// (comm, rank, time bin, completed through, the bin's last completion in ns).
pub type ProgressRow = (u64, i32, u64, u64, u64);
/// (rank, start ns, end ns, op, seq).
pub type WindowCall = (i32, u64, u64, String, u64);

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
        let gpu = u64c("gpu_start_ns")
            .gt(lit(0i64))
            .and(u64c("gpu_end_ns").gt_eq(u64c("gpu_start_ns")));
        let host_real = col("clock").eq(lit("host-real")).fill_null(lit(false));
        // The GPU interval is on the host-mono clock, whatever the call's own clock.
        let real = gpu.clone().not().and(host_real);
        let a = when(gpu.clone())
            .then(u64c("gpu_start_ns"))
            .otherwise(u64c("t_enter_ns"));
        let b = when(gpu)
            .then(u64c("gpu_end_ns"))
            .otherwise(u64c("t_exit_ns"));
        Ok(self.rows()?.filter(col("kind").eq(lit("call"))).select([
            col("rank"),
            col("node"),
            u64c("comm_id").alias("comm_id"),
            u64c("seq").alias("seq"),
            col("op").fill_null(lit("")),
            u64c("bytes").alias("bytes"),
            col("comm_size").fill_null(lit(0i32)),
            on_base(a.clone(), real.clone()).alias("a"),
            on_base(b.clone(), real).alias("b"),
            (b - a).clip_min(lit(0i64)).alias("span_ns"),
        ]))
    }

    /// Rows of all kinds, and the first time any call, `enter` or heartbeat carries (ns on
    /// the common base; 0 when none does).
    pub fn extent(&self) -> Result<(u64, u64), Error> {
        let host_real = col("clock").eq(lit("host-real")).fill_null(lit(false));
        let t = when(col("kind").eq(lit("heartbeat")))
            .then(on_base(u64c("t_ns"), lit(false)))
            .when(col("kind").eq(lit("call")).or(col("kind").eq(lit("enter"))))
            .then(on_base(
                when(
                    u64c("gpu_start_ns")
                        .gt(lit(0i64))
                        .and(u64c("gpu_end_ns").gt_eq(u64c("gpu_start_ns"))),
                )
                .then(u64c("gpu_start_ns"))
                .otherwise(u64c("t_enter_ns")),
                host_real,
            ))
            .otherwise(lit(0i64));
        let df = collect(
            self.rows()?.select([
                len().cast(DataType::UInt64).alias("rows"),
                when(t.clone().gt(lit(0i64)))
                    .then(t)
                    .otherwise(lit(NULL).cast(DataType::Int64))
                    .min()
                    .alias("start"),
            ]),
        )?;
        let rows = u64_at(&df, "rows", 0);
        let start = i64_at(&df, "start", 0).max(0) as u64;
        Ok((rows, start))
    }

    /// Mean lateness (ms) of each rank row and time column: each collective instance's members
    /// against its first arrival. `row_of` maps ranks to rows; columns are `bin_ns` wide from
    /// `start`, the last one open-ended at `cols - 1`.
    pub fn lateness(
        &self,
        row_of: &[(i32, u32)],
        start: u64,
        bin_ns: u64,
        cols: u32,
    ) -> Result<Vec<(usize, usize, f64)>, Error> {
        let collective = col("op")
            .neq(lit(""))
            .and(col("op").neq(lit("none")))
            .and(col("comm_size").gt_eq(lit(2)))
            .and(p2p(col("op")).not());
        let calls = self.calls()?.filter(collective);
        let first = calls
            .clone()
            .group_by([col("comm_id"), col("seq")])
            .agg([col("a").min().alias("first"), len().alias("n")])
            .filter(col("n").gt_eq(lit(2)));
        let rows = DataFrame::new_infer_height(vec![
            Column::new(
                "rank".into(),
                row_of.iter().map(|x| x.0).collect::<Vec<i32>>(),
            ),
            Column::new(
                "row".into(),
                row_of.iter().map(|x| x.1).collect::<Vec<u32>>(),
            ),
        ])?;
        let q = calls
            .join(
                first,
                cols_of(&["comm_id", "seq"]),
                cols_of(&["comm_id", "seq"]),
                JoinArgs::new(JoinType::Inner),
            )
            .inner_join(rows.lazy(), col("rank"), col("rank"))
            .filter(col("a").gt_eq(lit(start as i64)))
            .with_columns([
                ((col("a") - lit(start as i64)) / lit(bin_ns.max(1) as i64))
                    .clip_max(lit(i64::from(cols) - 1))
                    .alias("col"),
                ((col("a") - col("first")).cast(DataType::Float64) / lit(1e6)).alias("late_ms"),
            ])
            .group_by([col("col"), col("row")])
            .agg([col("late_ms").mean()]);
        let df = collect(q)?;
        let c = df.column("col")?.cast(&DataType::Int64)?;
        let r = df.column("row")?.cast(&DataType::Int64)?;
        let m = df.column("late_ms")?.cast(&DataType::Float64)?;
        let (c, r, m) = (c.i64()?, r.i64()?, m.f64()?);
        let mut out: Vec<(usize, usize, f64)> = (0..df.height())
            .filter_map(|i| {
                Some((
                    c.get(i)?.max(0) as usize,
                    r.get(i)?.max(0) as usize,
                    m.get(i)?,
                ))
            })
            .collect();
        out.sort_by_key(|x| (x.0, x.1));
        Ok(out)
    }

    /// The communicators with the most collective calls, most first: (comm, calls).
    pub fn busiest_comms(&self, n: usize) -> Result<Vec<(u64, u64)>, Error> {
        let q = self
            .calls()?
            .filter(p2p(col("op")).not())
            .group_by([col("comm_id")])
            .agg([len().cast(DataType::UInt64).alias("n")]);
        let df = collect(q)?;
        let ids = df.column("comm_id")?.cast(&DataType::UInt64)?;
        let ns = df.column("n")?.cast(&DataType::UInt64)?;
        let (ids, ns) = (ids.u64()?, ns.u64()?);
        let mut out: Vec<(u64, u64)> = (0..df.height())
            .filter_map(|i| Some((ids.get(i)?, ns.get(i)?)))
            .collect();
        out.sort_by_key(|(c, n)| (std::cmp::Reverse(*n), *c));
        out.truncate(n);
        Ok(out)
    }

    /// Per communicator in `comms`, rank and time bin (`bin_ns` wide from `start`): the
    /// collectives completed through (seq + 1) and the bin's last completion (ns). Sorted by
    /// communicator, bin.
    pub fn progress(
        &self,
        comms: &[u64],
        start: u64,
        bin_ns: u64,
    ) -> Result<Vec<ProgressRow>, Error> {
        let keep = comms
            .iter()
            .fold(lit(false), |e, c| e.or(col("comm_id").eq(lit(*c as i64))));
        let q = self
            .calls()?
            .filter(p2p(col("op")).not().and(keep))
            .with_columns([((col("b") - lit(start as i64)).clip_min(lit(0i64))
                / lit(bin_ns.max(1) as i64))
            .alias("bin")])
            .group_by([col("comm_id"), col("rank"), col("bin")])
            .agg([
                (col("seq") + lit(1i64)).max().alias("through"),
                col("b").max().alias("last"),
            ]);
        let df = collect(q)?;
        let get = |n: &str| df.column(n).and_then(|c| c.cast(&DataType::Int64));
        let (c, r, bin, th, last) = (
            get("comm_id")?,
            get("rank")?,
            get("bin")?,
            get("through")?,
            get("last")?,
        );
        let (c, r, bin, th, last) = (c.i64()?, r.i64()?, bin.i64()?, th.i64()?, last.i64()?);
        let mut out: Vec<ProgressRow> = (0..df.height())
            .filter_map(|i| {
                Some((
                    c.get(i)? as u64,
                    r.get(i)? as i32,
                    bin.get(i)?.max(0) as u64,
                    th.get(i)?.max(0) as u64,
                    last.get(i)?.max(0) as u64,
                ))
            })
            .collect();
        out.sort_by_key(|x| (x.0, x.2, x.1));
        Ok(out)
    }

    /// Call durations per op, in bins of a quarter decade from 1 µs: (op, bin, calls).
    pub fn durations(&self) -> Result<Vec<(String, i32, u64)>, Error> {
        let us = (col("span_ns").cast(DataType::Float64) / lit(1e3)).clip_min(lit(1.0));
        let q = self
            .calls()?
            .with_columns([(us.log(lit(10.0)) * lit(4.0))
                .floor()
                .cast(DataType::Int32)
                .alias("bin")])
            .group_by([col("op"), col("bin")])
            .agg([len().cast(DataType::UInt64).alias("n")]);
        let df = collect(q)?;
        let op = df.column("op")?.cast(&DataType::String)?;
        let bin = df.column("bin")?.cast(&DataType::Int32)?;
        let n = df.column("n")?.cast(&DataType::UInt64)?;
        let (op, bin, n) = (op.str()?, bin.i32()?, n.u64()?);
        let mut out: Vec<(String, i32, u64)> = (0..df.height())
            .filter_map(|i| Some((op.get(i)?.to_owned(), bin.get(i)?, n.get(i)?)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Median bus bandwidth (GB/s) per op and message size, with the calls measured: nccl-tests'
    /// factor ([`busbw_factor`]) for each op and communicator size.
    pub fn busbw(&self) -> Result<Vec<(String, u64, f64, u64)>, Error> {
        let measured = self.calls()?.filter(
            col("span_ns")
                .gt(lit(0i64))
                .and(col("bytes").gt(lit(0i64)))
                .and(p2p(col("op")).not().or(col("op").eq(lit("sendrecv")))),
        );
        // The factor of each (op, size) present, from the one definition of it.
        let shapes = collect(
            measured
                .clone()
                .group_by([col("op"), col("comm_size")])
                .agg([len()]),
        )?;
        let sop = shapes.column("op")?.cast(&DataType::String)?;
        let ssz = shapes.column("comm_size")?.cast(&DataType::Int32)?;
        let (sop, ssz) = (sop.str()?, ssz.i32()?);
        let (mut fo, mut fs, mut ff) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..shapes.height() {
            let (Some(o), Some(n)) = (sop.get(i), ssz.get(i)) else {
                continue;
            };
            if let Some(f) = Op::from_name(o).and_then(|op| busbw_factor(op, n)) {
                fo.push(o.to_owned());
                fs.push(n);
                ff.push(f);
            }
        }
        let factors = DataFrame::new_infer_height(vec![
            Column::new("op".into(), fo),
            Column::new("comm_size".into(), fs),
            Column::new("factor".into(), ff),
        ])?;
        let q = measured
            .join(
                factors.lazy(),
                cols_of(&["op", "comm_size"]),
                cols_of(&["op", "comm_size"]),
                JoinArgs::new(JoinType::Inner),
            )
            .with_columns([(col("bytes").cast(DataType::Float64)
                / col("span_ns").cast(DataType::Float64)
                * col("factor"))
            .alias("gbs")])
            .group_by([col("op"), col("bytes")])
            .agg([
                col("gbs").median().alias("median"),
                len().cast(DataType::UInt64).alias("n"),
            ]);
        let df = collect(q)?;
        let op = df.column("op")?.cast(&DataType::String)?;
        let bytes = df.column("bytes")?.cast(&DataType::Int64)?;
        let med = df.column("median")?.cast(&DataType::Float64)?;
        let n = df.column("n")?.cast(&DataType::UInt64)?;
        let (op, bytes, med, n) = (op.str()?, bytes.i64()?, med.f64()?, n.u64()?);
        let mut out: Vec<(String, u64, f64, u64)> = (0..df.height())
            .filter_map(|i| {
                Some((
                    op.get(i)?.to_owned(),
                    bytes.get(i)?.max(0) as u64,
                    med.get(i)?,
                    n.get(i)?,
                ))
            })
            .collect();
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        Ok(out)
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

/// Whether the op column names a point-to-point operation.
fn p2p(op: Expr) -> Expr {
    Op::ALL
        .iter()
        .filter(|o| o.is_p2p())
        .fold(lit(false), |e, o| e.or(op.clone().eq(lit(o.name()))))
}

fn cols_of(names: &[&str]) -> Vec<Expr> {
    names.iter().map(|n| col(*n)).collect()
}

/// Runs a query on the streaming engine.
fn collect(q: LazyFrame) -> Result<DataFrame, Error> {
    Ok(q.collect_with_engine(Engine::Streaming)?.unwrap_single())
}

fn u64_at(df: &DataFrame, name: &str, i: usize) -> u64 {
    df.column(name)
        .and_then(|c| c.cast(&DataType::UInt64))
        .ok()
        .and_then(|c| c.u64().ok().and_then(|a| a.get(i)))
        .unwrap_or(0)
}

fn i64_at(df: &DataFrame, name: &str, i: usize) -> i64 {
    df.column(name)
        .and_then(|c| c.cast(&DataType::Int64))
        .ok()
        .and_then(|c| c.i64().ok().and_then(|a| a.get(i)))
        .unwrap_or(0)
}
