//! Durable storage of ingested records.
//!
//! One writer thread owns everything that must be consistent: the dedup high-water marks and the
//! open write-ahead logs (`<dir>/<job>/wal-<generation>.cswal`, see `commscope_wire::wal`).
//! Batches from every stream are appended, then synced together (group commit), and only then
//! answered, so an acknowledgement always means "on disk". When a job's log grows past
//! [`Config::roll_bytes`], ages past [`Config::roll_age`], or the job ends, its generation is
//! closed and a segment thread (the job's of `Config::segment_threads`) turns it into
//! `seg-<generation>.parquet` (synced, renamed, then the
//! log is deleted). On start the store reads every segment's recorded high-water marks and every
//! log left behind, so a `kill -9` loses nothing that was acknowledged and accepts nothing twice.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use commscope_wire::cst::{self, Header};
use commscope_wire::parquet::{self as pq, ClockAlignment, ProcessTrace};
use commscope_wire::record::{RawRecord, Record};
use commscope_wire::wal;

/// Store settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Root directory: one sub-directory per job.
    pub dir: PathBuf,
    /// A job's log rolls into a segment at this size (bytes of log).
    pub roll_bytes: u64,
    /// ... or at this age.
    pub roll_age: Duration,
    /// Segments older than this are deleted (None: kept).
    pub retention: Option<Duration>,
    /// Oldest segments are deleted while all segments together exceed this (None: no limit).
    pub retention_bytes: Option<u64>,
    /// Segment threads: each job's logs become segments on the thread
    /// [`commscope_wire::route::shard_of`] names, so jobs convert in parallel.
    pub segment_threads: usize,
}

impl Config {
    /// Defaults for a directory.
    pub fn new(dir: impl Into<PathBuf>) -> Config {
        Config {
            dir: dir.into(),
            roll_bytes: 64 << 20,
            roll_age: Duration::from_secs(60),
            retention: None,
            retention_bytes: None,
            segment_threads: 1,
        }
    }
}

/// The dedup key of a process: with `rec_seq`, the dedup key of a record.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    pub job: String,
    pub node: String,
    pub pid: u32,
    pub start_time: u64,
}

impl ProcessKey {
    /// The key of a process header.
    pub fn of(h: &Header) -> ProcessKey {
        ProcessKey {
            job: h.job.clone(),
            node: h.node.clone(),
            pid: h.pid,
            start_time: h.start_time,
        }
    }
}

/// The `rec_seq` values stored for a process: sorted, disjoint, non-adjacent inclusive ranges
/// (almost always one). Dedup checks membership, so batches may arrive in any order and any
/// number of times: a record is stored exactly once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ranges(Vec<(u64, u64)>);

impl Ranges {
    /// Whether `x` is stored.
    pub fn contains(&self, x: u64) -> bool {
        match self.0.last() {
            Some(&(a, b)) if x >= a => x <= b,
            _ => {
                let i = self.0.partition_point(|r| r.1 < x);
                self.0.get(i).is_some_and(|r| r.0 <= x)
            }
        }
    }

    /// Adds `x`.
    pub fn insert(&mut self, x: u64) {
        self.insert_range(x, x);
    }

    /// Adds `a..=b`.
    pub fn insert_range(&mut self, a: u64, b: u64) {
        if let Some(last) = self.0.last_mut() {
            if a >= last.0 && a <= last.1.saturating_add(1) {
                last.1 = last.1.max(b);
                return;
            }
            if a > last.1 {
                self.0.push((a, b));
                return;
            }
        } else {
            self.0.push((a, b));
            return;
        }
        // Out of order: merge into place.
        self.0.push((a, b));
        self.0.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(self.0.len());
        for &(x, y) in &self.0 {
            match out.last_mut() {
                Some(l) if x <= l.1.saturating_add(1) => l.1 = l.1.max(y),
                _ => out.push((x, y)),
            }
        }
        self.0 = out;
    }

    /// Every range.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.0
    }

    /// The highest stored `rec_seq` (0 when none).
    pub fn max(&self) -> u64 {
        self.0.last().map_or(0, |r| r.1)
    }

    /// Records stored.
    pub fn count(&self) -> u64 {
        self.0.iter().map(|(a, b)| b - a + 1).sum()
    }
}

/// Records of one process to store.
#[derive(Clone, Debug)]
pub struct Batch {
    pub header: Header,
    pub clock: Option<ClockAlignment>,
    pub records: Vec<RawRecord>,
}

/// What became of a batch once it was durable.
#[derive(Clone, Debug, Default)]
pub struct Committed {
    /// The records stored now (decoded), in order.
    pub accepted: Vec<Record>,
    /// Records already stored earlier (resent), skipped.
    pub duplicates: u64,
    /// Records that could not be decoded (unknown kind, bad field), not stored.
    pub invalid: u64,
    /// The process had records stored before this batch (by this run or an earlier one).
    pub known: bool,
}

/// Why a batch could not be stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

/// What the store found on disk when it opened.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Processes with records, and the `rec_seq`s stored for each.
    pub high_water: HashMap<ProcessKey, Ranges>,
    /// Log entries, and their records, that had not become segments yet: handed to the
    /// replay as they were read (to rebuild the live state), one entry at a time.
    pub pending_entries: usize,
    pub pending_records: u64,
    /// Segments found.
    pub segments: usize,
    /// Damage found and skipped (torn log tails), one sentence each.
    pub warnings: Vec<String>,
}

/// Counters the store keeps (read by `/metrics`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    pub records_stored: u64,
    pub records_duplicate: u64,
    pub records_invalid: u64,
    pub batches: u64,
    pub commits: u64,
    pub commit_errors: u64,
    pub log_bytes: u64,
    pub segments_written: u64,
    pub segment_errors: u64,
    pub segment_rows: u64,
    pub segments_deleted: u64,
    /// Bytes of segments on disk.
    pub segment_bytes: u64,
}

enum Request {
    Append(
        Batch,
        tokio::sync::oneshot::Sender<Result<Committed, StoreError>>,
    ),
    Roll(String, tokio::sync::oneshot::Sender<()>),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// A handle to the store (cheap to clone).
#[derive(Clone, Debug)]
pub struct Store {
    tx: mpsc::Sender<Request>,
    stats: Arc<Mutex<Stats>>,
    dir: PathBuf,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Request::Append(..) => "Append",
            Request::Roll(..) => "Roll",
            Request::Flush(..) => "Flush",
        })
    }
}

impl Store {
    /// Opens (or creates) the store, recovers what is on disk, and starts its threads. The
    /// records of logs that had not become segments yet go to `replay`, one entry at a time, as
    /// they are read: a collector restarted under a large job never holds them all at once.
    pub fn open(
        cfg: Config,
        replay: &mut dyn FnMut(&Header, &[Record]),
    ) -> Result<(Store, Recovered), StoreError> {
        std::fs::create_dir_all(&cfg.dir)
            .map_err(|e| StoreError(format!("cannot create {}: {e}", cfg.dir.display())))?;
        let stats = Arc::new(Mutex::new(Stats::default()));
        let mut seg_txs = Vec::new();
        let mut seg_rxs = Vec::new();
        for _ in 0..cfg.segment_threads.max(1) {
            let (tx, rx) = mpsc::channel::<SegmentJob>();
            seg_txs.push(tx);
            seg_rxs.push(rx);
        }
        let seg_tx = Segmenters(seg_txs);
        let mut recovered = Recovered::default();
        let mut next_gen: HashMap<String, u64> = HashMap::new();
        recover(&cfg, &mut recovered, &mut next_gen, &seg_tx, &stats, replay)?;
        let (tx, rx) = mpsc::channel();
        let writer = Writer {
            cfg: cfg.clone(),
            high_water: recovered.high_water.clone(),
            logs: HashMap::new(),
            next_gen,
            seg_tx,
            stats: stats.clone(),
            last_retention: Instant::now(),
        };
        std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| StoreError(format!("cannot start the store thread: {e}")))?;
        for (i, seg_rx) in seg_rxs.into_iter().enumerate() {
            let seg_stats = stats.clone();
            let seg_cfg = cfg.clone();
            std::thread::Builder::new()
                .name(format!("store-segments-{i}"))
                .spawn(move || segment_thread(seg_cfg, seg_rx, seg_stats))
                .map_err(|e| StoreError(format!("cannot start a segment thread: {e}")))?;
        }
        Ok((
            Store {
                tx,
                stats,
                dir: cfg.dir,
            },
            recovered,
        ))
    }

    /// Stores a batch; resolves once it is durable (or refused).
    pub async fn append(&self, batch: Batch) -> Result<Committed, StoreError> {
        self.submit(batch).await
    }

    /// Queues a batch now and returns the future of its commit: batches submitted in order
    /// are committed in order (a stream pipelines them this way).
    pub fn submit(
        &self,
        batch: Batch,
    ) -> impl std::future::Future<Output = Result<Committed, StoreError>> + Send + 'static {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = self.tx.send(Request::Append(batch, tx));
        async move {
            if sent.is_err() {
                return Err(StoreError("the store has stopped".into()));
            }
            rx.await
                .unwrap_or_else(|_| Err(StoreError("the store has stopped".into())))
        }
    }

    /// Closes the job's current log generation and turns it into a segment (the job ended).
    /// Resolves once the log is closed; the segment follows shortly.
    pub async fn roll(&self, job: &str) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.tx.send(Request::Roll(job.to_owned(), tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Rolls every job and waits until every segment is written (tests, shutdown).
    pub async fn flush(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.tx.send(Request::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// A copy of the counters.
    pub fn stats(&self) -> Stats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

struct Log {
    file: File,
    path: PathBuf,
    generation: u64,
    bytes: u64,
    synced_len: u64,
    opened: Instant,
    buf: Vec<u8>,
}

struct SegmentJob {
    job: String,
    generation: u64,
    /// None: a barrier (only `done` is answered).
    log: Option<PathBuf>,
    done: Option<Arc<Countdown>>,
}

/// Answers a waiter once every segment thread it was handed to got this far.
struct Countdown {
    left: std::sync::atomic::AtomicUsize,
    tx: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl Countdown {
    fn new(n: usize, tx: tokio::sync::oneshot::Sender<()>) -> Arc<Countdown> {
        Arc::new(Countdown {
            left: n.into(),
            tx: Mutex::new(Some(tx)),
        })
    }

    fn hit(&self) {
        if self.left.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1
            && let Some(tx) = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take()
        {
            let _ = tx.send(());
        }
    }
}

/// The segment threads' queues: a job's logs always go to the same one, in order.
struct Segmenters(Vec<mpsc::Sender<SegmentJob>>);

impl Segmenters {
    /// Queues a closed log (or nothing, when `log` is None) of `job`.
    fn send(
        &self,
        job: &str,
        generation: u64,
        log: Option<PathBuf>,
        done: Option<tokio::sync::oneshot::Sender<()>>,
    ) {
        let i = commscope_wire::route::shard_of(job, self.0.len());
        let _ = self.0[i].send(SegmentJob {
            job: job.to_owned(),
            generation,
            log,
            done: done.map(|d| Countdown::new(1, d)),
        });
    }

    /// Answers `done` once every log queued before is a segment.
    fn barrier(&self, done: tokio::sync::oneshot::Sender<()>) {
        let c = Countdown::new(self.0.len(), done);
        for tx in &self.0 {
            if tx
                .send(SegmentJob {
                    job: String::new(),
                    generation: 0,
                    log: None,
                    done: Some(c.clone()),
                })
                .is_err()
            {
                c.hit();
            }
        }
    }
}

struct Writer {
    cfg: Config,
    high_water: HashMap<ProcessKey, Ranges>,
    logs: HashMap<String, Log>,
    next_gen: HashMap<String, u64>,
    seg_tx: Segmenters,
    stats: Arc<Mutex<Stats>>,
    last_retention: Instant,
}

/// Requests taken per group commit at most.
const GROUP: usize = 512;

impl Writer {
    fn run(mut self, rx: mpsc::Receiver<Request>) {
        loop {
            let first = match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(r) => r,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    self.housekeeping();
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let mut reqs = vec![first];
            while reqs.len() < GROUP {
                match rx.try_recv() {
                    Ok(r) => reqs.push(r),
                    Err(_) => break,
                }
            }
            self.group(reqs);
            self.housekeeping();
        }
        // Every handle is gone: close the logs so they become segments.
        let jobs: Vec<String> = self.logs.keys().cloned().collect();
        for job in jobs {
            self.roll(&job, None);
        }
    }

    fn group(&mut self, reqs: Vec<Request>) {
        let mut replies = Vec::new();
        let mut pending_hw: HashMap<ProcessKey, Ranges> = HashMap::new();
        let mut after = Vec::new();
        for r in reqs {
            match r {
                Request::Append(batch, tx) => {
                    let result = self.stage(batch, &mut pending_hw);
                    replies.push((tx, result));
                }
                other => after.push(other),
            }
        }
        let synced = self.sync();
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.commits += 1;
        match synced {
            Ok(bytes) => {
                stats.log_bytes += bytes;
                self.high_water.extend(pending_hw);
                for (tx, result) in replies {
                    if let Ok(c) = &result {
                        stats.batches += 1;
                        stats.records_stored += c.accepted.len() as u64;
                        stats.records_duplicate += c.duplicates;
                        stats.records_invalid += c.invalid;
                    }
                    let _ = tx.send(result);
                }
            }
            Err(e) => {
                stats.commit_errors += 1;
                for (tx, _) in replies {
                    let _ = tx.send(Err(StoreError(e.clone())));
                }
            }
        }
        drop(stats);
        for r in after {
            match r {
                Request::Roll(job, tx) => {
                    self.roll(&job, None);
                    let _ = tx.send(());
                }
                Request::Flush(tx) => {
                    let jobs: Vec<String> = self.logs.keys().cloned().collect();
                    for job in jobs {
                        self.roll(&job, None);
                    }
                    // Answered by the segment thread once everything before it is written.
                    self.seg_tx.barrier(tx);
                }
                Request::Append(..) => {}
            }
        }
    }

    /// Dedups a batch against the marks (committed and staged in this group) and appends what
    /// is new to its job's log buffer.
    fn stage(
        &mut self,
        batch: Batch,
        pending_hw: &mut HashMap<ProcessKey, Ranges>,
    ) -> Result<Committed, StoreError> {
        if batch.header.job.is_empty() {
            return Err(StoreError("a batch without a job id was refused".into()));
        }
        let key = ProcessKey::of(&batch.header);
        let mut hw = match pending_hw.remove(&key) {
            Some(r) => r,
            None => self.high_water.get(&key).cloned().unwrap_or_default(),
        };
        let mut out = Committed {
            known: !hw.ranges().is_empty(),
            ..Default::default()
        };
        let mut block = cst::Block::with_capacity(batch.records.len());
        let mut spans = Vec::new();
        for raw in &batch.records {
            let seq = u64::from_le_bytes(raw[..8].try_into().unwrap_or_default());
            if seq == 0 || hw.contains(seq) {
                out.duplicates += 1;
                continue;
            }
            match Record::decode(raw) {
                Ok(r) => {
                    match r {
                        // A skip's span has been sent whole (agents deliver in order); it is
                        // marked after the batch, which holds the span's other skips.
                        Record::Skip(k) => {
                            hw.insert(seq);
                            spans.extend(k.sent_span());
                        }
                        _ => hw.insert(seq),
                    }
                    block.push(raw);
                    out.accepted.push(r);
                }
                Err(_) => out.invalid += 1,
            }
        }
        for (a, b) in spans {
            hw.insert_range(a, b);
        }
        let stored = !out.accepted.is_empty();
        pending_hw.insert(key, hw);
        if !stored {
            return Ok(out);
        }
        let log = self.log(&batch.header.job)?;
        let header = batch.header.encode();
        wal::encode_entry(
            &mut log.buf,
            &header,
            batch.clock.map(|c| (c.offset_ns, c.error_ns)),
            block.finish(),
        );
        Ok(out)
    }

    /// The job's open log, opened (a new generation) if needed.
    fn log(&mut self, job: &str) -> Result<&mut Log, StoreError> {
        if !self.logs.contains_key(job) {
            let dir = self.cfg.dir.join(cst::sanitize(job));
            std::fs::create_dir_all(&dir)
                .map_err(|e| StoreError(format!("cannot create {}: {e}", dir.display())))?;
            let generation = self.next_gen.entry(job.to_owned()).or_insert(1);
            let g = *generation;
            *generation += 1;
            let path = dir.join(format!("wal-{g:08}.{}", wal::EXTENSION));
            let mut file = File::create(&path)
                .map_err(|e| StoreError(format!("cannot create {}: {e}", path.display())))?;
            file.write_all(&wal::file_header())
                .and_then(|_| file.sync_all())
                .and_then(|_| File::open(&dir)?.sync_all())
                .map_err(|e| StoreError(format!("cannot write {}: {e}", path.display())))?;
            self.logs.insert(
                job.to_owned(),
                Log {
                    file,
                    path,
                    generation: g,
                    bytes: wal::FILE_HEADER as u64,
                    synced_len: wal::FILE_HEADER as u64,
                    opened: Instant::now(),
                    buf: Vec::new(),
                },
            );
        }
        self.logs
            .get_mut(job)
            .ok_or_else(|| StoreError("log vanished".into()))
    }

    /// Writes and syncs every log with staged bytes. On failure every log is cut back to its
    /// last synced length, so nothing unacknowledged stays behind.
    fn sync(&mut self) -> Result<u64, String> {
        let mut written = 0u64;
        let mut failure = None;
        for log in self.logs.values_mut() {
            if log.buf.is_empty() {
                continue;
            }
            let r = log
                .file
                .write_all(&log.buf)
                .and_then(|_| log.file.sync_data());
            match r {
                Ok(()) => {
                    log.bytes += log.buf.len() as u64;
                    log.synced_len = log.bytes;
                    written += log.buf.len() as u64;
                }
                Err(e) => {
                    failure = Some(format!("cannot write {}: {e}", log.path.display()));
                    let _ = log.file.set_len(log.synced_len);
                    let _ = std::io::Seek::seek(
                        &mut log.file,
                        std::io::SeekFrom::Start(log.synced_len),
                    );
                }
            }
            log.buf.clear();
        }
        match failure {
            None => Ok(written),
            Some(e) => Err(e),
        }
    }

    fn roll(&mut self, job: &str, done: Option<tokio::sync::oneshot::Sender<()>>) {
        match self.logs.remove(job) {
            Some(log) => {
                self.seg_tx.send(job, log.generation, Some(log.path), done);
            }
            None => {
                if let Some(d) = done {
                    let _ = d.send(());
                }
            }
        }
    }

    fn housekeeping(&mut self) {
        let due: Vec<String> = self
            .logs
            .iter()
            .filter(|(_, l)| {
                l.bytes >= self.cfg.roll_bytes || l.opened.elapsed() >= self.cfg.roll_age
            })
            .map(|(j, _)| j.clone())
            .collect();
        for job in due {
            self.roll(&job, None);
        }
        if self.last_retention.elapsed() >= Duration::from_secs(10) {
            self.last_retention = Instant::now();
            apply_retention(&self.cfg, &self.stats);
        }
    }
}

/// Deletes segments past the retention age, then the oldest while over the byte limit.
fn apply_retention(cfg: &Config, stats: &Mutex<Stats>) {
    let mut segs = list_segments(&cfg.dir);
    let mut deleted = 0u64;
    let now = SystemTime::now();
    if let Some(age) = cfg.retention {
        segs.retain(|(path, mtime, _)| {
            let old = now.duration_since(*mtime).unwrap_or_default() > age;
            if old && std::fs::remove_file(path).is_ok() {
                deleted += 1;
            }
            !old
        });
    }
    if let Some(limit) = cfg.retention_bytes {
        segs.sort_by_key(|(_, mtime, _)| *mtime);
        let mut total: u64 = segs.iter().map(|s| s.2).sum();
        for (path, _, size) in &segs {
            if total <= limit {
                break;
            }
            if std::fs::remove_file(path).is_ok() {
                total -= size;
                deleted += 1;
            }
        }
    }
    if deleted > 0 {
        crate::history::forget_emptied(&cfg.dir);
    }
    let bytes: u64 = list_segments(&cfg.dir).iter().map(|s| s.2).sum();
    let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
    s.segments_deleted += deleted;
    s.segment_bytes = bytes;
}

fn list_segments(dir: &Path) -> Vec<(PathBuf, SystemTime, u64)> {
    let mut out = Vec::new();
    let Ok(jobs) = std::fs::read_dir(dir) else {
        return out;
    };
    for j in jobs.flatten() {
        let Ok(files) = std::fs::read_dir(j.path()) else {
            continue;
        };
        for f in files.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "parquet")
                && let Ok(m) = f.metadata()
            {
                out.push((p, m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
            }
        }
    }
    out
}

/// Metadata key of a segment's per-process high-water marks.
const HW_KEY: &str = "commscope.high_water";

fn segment_thread(cfg: Config, rx: mpsc::Receiver<SegmentJob>, stats: Arc<Mutex<Stats>>) {
    background_priority();
    for job in rx {
        let Some(log) = &job.log else {
            if let Some(d) = job.done {
                d.hit();
            }
            continue;
        };
        let result = write_segment(&cfg, &job.job, job.generation, log);
        {
            let mut s = stats.lock().unwrap_or_else(|p| p.into_inner());
            match result {
                Ok(rows) => {
                    s.segments_written += 1;
                    s.segment_rows += rows;
                }
                Err(e) => {
                    s.segment_errors += 1;
                    tracing::error!("{e}; the log stays and is retried at the next start");
                }
            }
        }
        if let Some(d) = job.done {
            d.hit();
        }
    }
}

/// Niceness of the segment threads: converting logs into segments is work for spare CPU (the
/// records are durable in their logs already); ingest and the findings engine come first.
const SEGMENT_NICE: libc::c_int = 10;

/// Lowers the calling thread's CPU priority to [`SEGMENT_NICE`] (Linux: niceness is per thread).
fn background_priority() {
    // SAFETY: gettid and setpriority take no pointers; they affect this thread only.
    let rc = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, SEGMENT_NICE)
    };
    if rc != 0 {
        tracing::debug!(
            "segment thread keeps its priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Turns a closed log into a segment; the log is deleted once the segment is durable.
fn write_segment(cfg: &Config, job: &str, generation: u64, log_path: &Path) -> Result<u64, String> {
    let bytes =
        std::fs::read(log_path).map_err(|e| format!("cannot read {}: {e}", log_path.display()))?;
    let log = wal::parse(&bytes).map_err(|e| format!("{}: {e}", log_path.display()))?;
    drop(bytes);
    // Each process's records decoded into a vector of its exact size (a log holds up to
    // `roll_bytes` of records, and every segment thread converts one at a time), each log entry
    // freed once decoded.
    let mut counts: HashMap<ProcessKey, usize> = HashMap::new();
    for e in &log.entries {
        *counts.entry(ProcessKey::of(&e.header)).or_default() += e.records.len();
    }
    let mut procs: BTreeMap<ProcessKey, ProcessTrace> = BTreeMap::new();
    for e in log.entries {
        let key = ProcessKey::of(&e.header);
        let n = counts.get(&key).copied().unwrap_or_default();
        let p = procs.entry(key).or_insert_with(|| ProcessTrace {
            header: e.header.clone(),
            records: Vec::with_capacity(n),
            ..Default::default()
        });
        if let Some((offset_ns, error_ns)) = e.clock {
            p.clock = Some(ClockAlignment {
                offset_ns,
                error_ns,
            });
        }
        p.records
            .extend(e.records.iter().filter_map(|r| Record::decode(r).ok()));
    }
    let dir = log_path.parent().unwrap_or(&cfg.dir);
    let path = dir.join(format!("seg-{generation:08}.parquet"));
    let rows = if procs.is_empty() {
        0
    } else {
        let marks: Vec<(&str, u32, u64, Ranges)> = procs
            .iter()
            .map(|(k, p)| {
                let mut r = Ranges::default();
                for rec in &p.records {
                    mark(&mut r, rec);
                }
                (k.node.as_str(), k.pid, k.start_time, r)
            })
            .collect();
        let meta = vec![(HW_KEY.to_owned(), marks_json(job, &marks))];
        drop(marks);
        let traces: Vec<ProcessTrace> = procs.into_values().collect();
        let rows = pq::write_with_metadata(&path, &traces, &meta).map_err(|e| e.to_string())?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        rows
    };
    std::fs::remove_file(log_path)
        .map_err(|e| format!("cannot remove {}: {e}", log_path.display()))?;
    Ok(rows)
}

/// Reads what a previous run left: segment marks, and logs that had not become segments
/// (queued for conversion now; their records returned for the live state).
fn recover(
    cfg: &Config,
    out: &mut Recovered,
    next_gen: &mut HashMap<String, u64>,
    seg_tx: &Segmenters,
    stats: &Mutex<Stats>,
    replay: &mut dyn FnMut(&Header, &[Record]),
) -> Result<(), StoreError> {
    let jobs = std::fs::read_dir(&cfg.dir)
        .map_err(|e| StoreError(format!("cannot read {}: {e}", cfg.dir.display())))?;
    for j in jobs.flatten() {
        let dir = j.path();
        if !dir.is_dir() {
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|it| it.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        let mut max_gen = 0u64;
        let mut segments: HashSet<u64> = HashSet::new();
        let mut job_name: Option<String> = None;
        for f in &files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.ends_with(".parquet.partial") {
                let _ = std::fs::remove_file(f);
                continue;
            }
            if let Some(g) = generation_of(name, "seg-", ".parquet") {
                max_gen = max_gen.max(g);
                segments.insert(g);
                out.segments += 1;
                match pq::read_metadata(f) {
                    Ok(meta) => {
                        if let Some(v) = meta.get(HW_KEY) {
                            merge_marks(&mut out.high_water, v, &mut job_name);
                        }
                    }
                    Err(e) => out.warnings.push(format!("{e}; its marks were not read")),
                }
            }
        }
        for f in &files {
            let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            let Some(g) = generation_of(name, "wal-", &format!(".{}", wal::EXTENSION)) else {
                continue;
            };
            max_gen = max_gen.max(g);
            if segments.contains(&g) {
                // The segment was written but the log not yet deleted.
                let _ = std::fs::remove_file(f);
                continue;
            }
            let bytes = std::fs::read(f)
                .map_err(|e| StoreError(format!("cannot read {}: {e}", f.display())))?;
            let log = match wal::parse(&bytes) {
                Ok(l) => l,
                Err(e) => {
                    out.warnings
                        .push(format!("{}: {e}; left as it is", f.display()));
                    continue;
                }
            };
            for w in &log.warnings {
                out.warnings.push(format!("{}: {w}", f.display()));
            }
            if log.valid_len < bytes.len() {
                // Cut the torn tail so the segment and any reader see exactly what was synced.
                if let Ok(file) = std::fs::OpenOptions::new().write(true).open(f) {
                    let _ = file.set_len(log.valid_len as u64);
                    let _ = file.sync_all();
                }
            }
            drop(bytes);
            for e in log.entries {
                let key = ProcessKey::of(&e.header);
                job_name.get_or_insert_with(|| key.job.clone());
                let hw = out.high_water.entry(key).or_default();
                let mut recs = Vec::with_capacity(e.records.len());
                for raw in &e.records {
                    let seq = u64::from_le_bytes(raw[..8].try_into().unwrap_or_default());
                    hw.insert(seq);
                    if let Ok(r) = Record::decode(raw) {
                        mark(hw, &r);
                        recs.push(r);
                    }
                }
                out.pending_entries += 1;
                out.pending_records += recs.len() as u64;
                replay(&e.header, &recs);
            }
            let job = job_name.clone().unwrap_or_default();
            seg_tx.send(&job, g, Some(f.clone()), None);
        }
        if let Some(job) = job_name {
            next_gen.insert(job, max_gen + 1);
        } else if max_gen > 0 {
            // A directory whose job name is unknown (no records): keep generations unique.
            let name = dir
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            next_gen.insert(name, max_gen + 1);
        }
    }
    let bytes: u64 = list_segments(&cfg.dir).iter().map(|s| s.2).sum();
    stats
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .segment_bytes = bytes;
    Ok(())
}

/// Marks a record stored: its `rec_seq`, and for a skip the span it stands for (sent whole, so
/// never sent again).
fn mark(r: &mut Ranges, rec: &Record) {
    r.insert(rec.rec_seq());
    if let Record::Skip(k) = rec
        && let Some((a, b)) = k.sent_span()
    {
        r.insert_range(a, b);
    }
}

/// A segment's marks as its metadata holds them (read back by [`merge_marks`]):
/// `{"job": …, "processes": [[node, pid, start_time, [[from, through], …]], …]}`, written
/// straight to text (a `serde_json::Value` of a large job's ranges costs tens of bytes a
/// number).
fn marks_json(job: &str, marks: &[(&str, u32, u64, Ranges)]) -> String {
    /// node, pid, start time, ranges.
    type Row<'a> = (&'a str, u32, u64, &'a [(u64, u64)]);
    #[derive(serde::Serialize)]
    struct Marks<'a> {
        job: &'a str,
        processes: Vec<Row<'a>>,
    }
    let m = Marks {
        job,
        processes: marks
            .iter()
            .map(|(node, pid, start, r)| (*node, *pid, *start, r.ranges()))
            .collect(),
    };
    serde_json::to_string(&m).unwrap_or_default()
}

fn merge_marks(marks: &mut HashMap<ProcessKey, Ranges>, json: &str, job_name: &mut Option<String>) {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return;
    };
    let Some(job) = v.get("job").and_then(|j| j.as_str()) else {
        return;
    };
    *job_name = Some(job.to_owned());
    for row in v
        .get("processes")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
    {
        let (Some(node), Some(pid), Some(start), Some(ranges)) = (
            row.get(0).and_then(|v| v.as_str()),
            row.get(1).and_then(|v| v.as_u64()),
            row.get(2).and_then(|v| v.as_u64()),
            row.get(3).and_then(|v| v.as_array()),
        ) else {
            continue;
        };
        let key = ProcessKey {
            job: job.to_owned(),
            node: node.to_owned(),
            pid: pid as u32,
            start_time: start,
        };
        let e = marks.entry(key).or_default();
        for r in ranges {
            if let (Some(a), Some(b)) = (
                r.get(0).and_then(|v| v.as_u64()),
                r.get(1).and_then(|v| v.as_u64()),
            ) && a <= b
            {
                e.insert_range(a, b);
            }
        }
    }
}

fn generation_of(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::record::Call;

    fn header(pid: u32) -> Header {
        Header {
            version: cst::FORMAT_VERSION,
            job: "job-1".into(),
            node: "n1".into(),
            pid,
            rank: pid as i32,
            world_size: 2,
            start_time: 7,
            ..Default::default()
        }
    }

    fn batch(pid: u32, seqs: std::ops::RangeInclusive<u64>) -> Batch {
        Batch {
            header: header(pid),
            clock: Some(ClockAlignment {
                offset_ns: 5,
                error_ns: 1,
            }),
            records: seqs
                .map(|s| {
                    Record::Call(Call {
                        rec_seq: s,
                        seq: s,
                        ..Default::default()
                    })
                    .encode()
                })
                .collect(),
        }
    }

    #[test]
    fn a_segments_marks_cover_its_skips_spans_and_read_back() {
        use commscope_wire::record::Skip;
        let recs = [
            Record::Call(Call {
                rec_seq: 1,
                ..Default::default()
            }),
            Record::Skip(Skip {
                rec_seq: 2,
                from_rec_seq: 3,
                through_rec_seq: 9,
                ..Default::default()
            }),
            Record::Call(Call {
                rec_seq: 10,
                ..Default::default()
            }),
            Record::Call(Call {
                rec_seq: 12,
                ..Default::default()
            }),
        ];
        let mut r = Ranges::default();
        for rec in &recs {
            mark(&mut r, rec);
        }
        let text = marks_json("job \"1\"", &[("n1", 4, 7, r)]);
        let mut back = HashMap::new();
        let mut job = None;
        merge_marks(&mut back, &text, &mut job);
        assert_eq!(job.as_deref(), Some("job \"1\""));
        let key = ProcessKey {
            job: "job \"1\"".into(),
            node: "n1".into(),
            pid: 4,
            start_time: 7,
        };
        assert_eq!(back[&key].ranges(), &[(1, 10), (12, 12)], "{text}");
    }

    #[test]
    fn ranges_merge_in_any_order() {
        let mut r = Ranges::default();
        for x in [5, 1, 2, 3, 9, 4, 7] {
            r.insert(x);
        }
        assert_eq!(r.ranges(), &[(1, 5), (7, 7), (9, 9)]);
        assert!(r.contains(4) && !r.contains(6) && r.contains(9) && !r.contains(0));
        r.insert_range(6, 8);
        assert_eq!(r.ranges(), &[(1, 9)]);
        assert_eq!((r.max(), r.count()), (9, 9));
    }

    #[tokio::test]
    async fn resends_are_stored_once_across_restarts_and_torn_tails() {
        let d = tempfile::tempdir().expect("tempdir");
        let cfg = Config::new(d.path());
        {
            let (s, rec) = Store::open(cfg.clone(), &mut |_, _| {}).expect("open");
            assert!(rec.high_water.is_empty());
            let c = s.append(batch(1, 1..=10)).await.expect("append");
            assert_eq!((c.accepted.len(), c.duplicates), (10, 0));
            // A resend overlapping what is stored, out of order: only the new ones.
            let c = s.append(batch(1, 8..=15)).await.expect("append");
            assert_eq!((c.accepted.len(), c.duplicates), (5, 3));
            let c = s.append(batch(2, 1..=3)).await.expect("append");
            assert_eq!(c.accepted.len(), 3);
            // The first job's log becomes a segment; later records go to a new log.
            s.roll("job-1").await;
            s.flush().await;
            let c = s.append(batch(1, 14..=20)).await.expect("append");
            assert_eq!((c.accepted.len(), c.duplicates), (5, 2));
            assert_eq!(s.stats().segments_written, 1);
        }
        // A torn entry at the end of the open log (never acknowledged).
        let job_dir = d.path().join("job-1");
        let log = std::fs::read_dir(&job_dir)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == wal::EXTENSION))
            .expect("an open log");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .expect("log");
        f.write_all(b"CWAL\x40\x00\x00\x00partial").expect("torn");
        drop(f);

        let mut replayed = Vec::new();
        let (s, rec) = Store::open(cfg.clone(), &mut |h, r| {
            replayed.push((h.pid, r.iter().map(|r| r.rec_seq()).collect::<Vec<_>>()))
        })
        .expect("reopen");
        let key = ProcessKey::of(&header(1));
        assert_eq!(rec.high_water[&key].ranges(), &[(1, 20)]);
        assert_eq!(
            rec.high_water[&ProcessKey::of(&header(2))].ranges(),
            &[(1, 3)]
        );
        assert_eq!(rec.segments, 1);
        assert_eq!(rec.warnings.len(), 1, "{:?}", rec.warnings);
        assert_eq!(rec.pending_entries, 1, "the unconverted log is replayed");
        assert_eq!(replayed, vec![(1, (16..=20).collect::<Vec<u64>>())]);
        let c = s.append(batch(1, 1..=21)).await.expect("append");
        assert_eq!((c.accepted.len(), c.duplicates), (1, 20));
        s.flush().await;
        // Every record once in the segments.
        let mut seen = std::collections::BTreeMap::<(u32, u64), u32>::new();
        for e in std::fs::read_dir(&job_dir).expect("dir").flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "parquet") {
                for t in pq::read(&p).expect("segment").0 {
                    assert_eq!(
                        t.clock,
                        Some(ClockAlignment {
                            offset_ns: 5,
                            error_ns: 1
                        })
                    );
                    for r in t.records {
                        *seen.entry((t.header.pid, r.rec_seq())).or_default() += 1;
                    }
                }
            } else {
                panic!("left over after flush: {}", p.display());
            }
        }
        assert_eq!(seen.len(), 21 + 3);
        assert!(seen.values().all(|n| *n == 1));
    }

    #[tokio::test]
    async fn retention_deletes_the_oldest_segments_over_the_limit() {
        let d = tempfile::tempdir().expect("tempdir");
        let mut cfg = Config::new(d.path());
        cfg.retention_bytes = Some(1);
        let (s, _) = Store::open(cfg.clone(), &mut |_, _| {}).expect("open");
        for i in 0..3u64 {
            s.append(batch(1, i * 10 + 1..=i * 10 + 10))
                .await
                .expect("append");
            s.flush().await;
        }
        assert_eq!(s.stats().segments_written, 3);
        apply_retention(&cfg, &s.stats);
        assert_eq!(list_segments(d.path()).len(), 0);
        assert_eq!(s.stats().segments_deleted, 3);
        // Dedup still holds for what was stored (the marks live on in memory).
        let c = s.append(batch(1, 1..=5)).await.expect("append");
        assert_eq!(c.duplicates, 5);
    }
}
