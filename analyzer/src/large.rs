//! Traces too big to hold in memory: the batch analysis streamed from Parquet files.
//!
//! Each process's rows are read in the order it wrote them by a cursor of its own (its row
//! ranges, file after file), one batch at a time. Its replay ([`ProcessReplay`]) sees every
//! record in that order, and a k-way merge on record time feeds the instance detectors as
//! [`crate::batch`] does for a trace in memory. What is held is one batch per process, the
//! replay's calls in flight and the detectors' bounded state, however long the trace.
//!
//! Records of one process are ordered by time within each batch; a process whose records run
//! backwards in time across a batch boundary (never seen from the shim, which writes calls as
//! they complete) is fed in file order there.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use commscope_wire::parquet::{self as pq, Footer, ProcessKey, ProcessTrace, Reader};
use commscope_wire::record::Record;

use crate::batch::{Analysis, Evaluator, Thresholds, call_start, conclude, dispatch, feed_time};
use crate::lateness::Lateness;
use crate::replay::{ProcessReplay, add_rank, finish};
use crate::stream::Detectors;
use crate::view::{CommView, JobView};

/// A record with its feed time and, for a call, its start ([`call_start`]), as a cursor holds it.
type Buffered = (u64, u64, Record);
/// A merged record: feed time, process index, call start, the record.
type Fed = (u64, usize, u64, Record);

/// Records handed to the detectors' thread at a time.
const CHUNK: usize = 8192;
/// Rows each process's cursor decodes at a time.
const CURSOR_ROWS: usize = 1024;

/// One job's trace, analyzed as it streamed by.
#[derive(Debug)]
pub struct Streamed {
    pub job: String,
    pub analysis: Analysis,
    /// Each process's header and clock (no records).
    pub processes: Vec<ProcessTrace>,
    /// Records read.
    pub records: u64,
}

/// The analyses of every job in `files` (Parquet traces), and a warning
/// (`FILE: what is wrong`) for each file that could not be read whole: what was read before
/// the damage is kept. Fails only when no file can be opened at all.
pub fn analyze(files: &[PathBuf], th: &Thresholds) -> Result<(Vec<Streamed>, Vec<String>), String> {
    let mut warnings = Vec::new();
    let mut damage = Damage::new();
    // Per job, per process: its header and its parts (file, row ranges), in file order.
    let mut jobs: BTreeMap<String, Vec<Cursor>> = BTreeMap::new();
    let mut index: HashMap<ProcessKey, usize> = HashMap::new();
    let mut opened = 0;
    for f in files {
        let rows =
            match Footer::read(f).and_then(|footer| Ok((pq::process_rows(f, &footer)?, footer))) {
                Ok(r) => r,
                Err(e) => {
                    warnings.push(format!("{}: {e}", f.display()));
                    continue;
                }
            };
        opened += 1;
        let (rows, footer) = rows;
        for (trace, ranges) in rows {
            let key = (
                trace.header.job.clone(),
                trace.header.node.clone(),
                trace.header.pid,
                trace.header.start_time,
            );
            let cursors = jobs.entry(trace.header.job.clone()).or_default();
            let i = *index.entry(key).or_insert_with(|| {
                cursors.push(Cursor::new(trace));
                cursors.len() - 1
            });
            cursors[i]
                .parts
                .push_back((f.clone(), footer.clone(), ranges));
        }
    }
    if opened == 0 {
        return Err(warnings.join("; "));
    }
    let mut out = Vec::new();
    for (job, cursors) in jobs {
        out.push(analyze_job(&job, cursors, th, &mut damage));
    }
    for (path, (what, ranks)) in damage {
        warnings.push(format!(
            "{}: {what}; the rows around it are kept{}",
            path.display(),
            pq::lost_ranks_phrase(&ranks.into_iter().collect::<Vec<_>>())
        ));
    }
    Ok((out, warnings))
}

/// One process's rows, read in order.
struct Cursor {
    trace: ProcessTrace,
    parts: VecDeque<(PathBuf, Footer, pq::RowRanges)>,
    reader: Option<(PathBuf, Reader)>,
    replay: ProcessReplay,
    /// Decoded records with their feed time; records the detectors do not take
    /// (heartbeats, `enter`s) are replayed only.
    buf: Batch,
    records: u64,
}

/// One decoded batch, handed out in time order. Records stay where they were decoded (they
/// are large): a batch out of order is sorted by index.
#[derive(Default)]
struct Batch {
    items: Vec<Option<Buffered>>,
    /// Indices into `items` by time, ties in decoding order; empty when `items` is in order.
    order: Vec<u32>,
    next: usize,
}

impl Batch {
    fn is_empty(&self) -> bool {
        self.next >= self.items.len()
    }

    fn at(&self, k: usize) -> usize {
        if self.order.is_empty() {
            k
        } else {
            self.order[k] as usize
        }
    }

    /// The next record's feed time.
    fn front(&self) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        self.items[self.at(self.next)].as_ref().map(|x| x.0)
    }

    fn pop(&mut self) -> Option<Buffered> {
        if self.is_empty() {
            return None;
        }
        let i = self.at(self.next);
        self.next += 1;
        self.items[i].take()
    }

    /// Starts a new batch (after the last was handed out).
    fn clear(&mut self) {
        self.items.clear();
        self.order.clear();
        self.next = 0;
    }

    /// Orders what was pushed since [`Batch::clear`].
    fn seal(&mut self) {
        let t = |x: &Option<Buffered>| x.as_ref().map_or(0, |x| x.0);
        if self.items.is_sorted_by_key(t) {
            return;
        }
        let mut keyed: Vec<(u64, u32)> = self
            .items
            .iter()
            .enumerate()
            .map(|(i, x)| (t(x), i as u32))
            .collect();
        keyed.sort_unstable();
        self.order = keyed.into_iter().map(|(_, i)| i).collect();
    }
}

impl Cursor {
    fn new(trace: ProcessTrace) -> Cursor {
        Cursor {
            replay: ProcessReplay::new(&trace),
            trace,
            parts: VecDeque::new(),
            reader: None,
            buf: Batch::default(),
            records: 0,
        }
    }

    /// Decodes batches until one holds a record for the detectors; false when the process
    /// has no more rows. A file that fails mid-way is one warning, and its remaining rows of
    /// this process are skipped.
    fn fill(&mut self, comms: &mut HashMap<u64, CommView>, damage: &mut Damage) -> bool {
        while self.buf.is_empty() {
            if self.reader.is_none() {
                let Some((path, footer, ranges)) = self.parts.pop_front() else {
                    return false;
                };
                match Reader::open_with(&path, &footer, Some((&ranges, CURSOR_ROWS))) {
                    Ok(r) => self.reader = Some((path, r)),
                    Err(e) => {
                        self.damaged(damage, &path, e.reason());
                        continue;
                    }
                }
            }
            let Some((path, reader)) = self.reader.as_mut() else {
                continue;
            };
            self.buf.clear();
            let batch = &mut self.buf.items;
            let (trace, replay, records) = (&self.trace, &mut self.replay, &mut self.records);
            let more = reader.next_batch(&mut |_, rec| {
                *records += 1;
                replay.record(trace, &rec, comms);
                if let Some(t) = feed_time(trace, &rec) {
                    let a = match &rec {
                        Record::Call(c) => call_start(trace, c),
                        _ => 0,
                    };
                    batch.push(Some((t, a, rec)));
                }
            });
            match more {
                Ok(true) => {}
                Ok(false) => self.reader = None,
                Err(e) => {
                    let path = path.clone();
                    self.damaged(damage, &path, e.reason());
                    self.reader = None;
                }
            }
            self.buf.seal();
        }
        true
    }
}

/// Files that could not be read whole: what was wrong, and the ranks that lost records to it.
type Damage = BTreeMap<PathBuf, (String, BTreeSet<i32>)>;

impl Cursor {
    /// Its rows in `path` could not all be read: the rest of them are skipped, and its trace
    /// is marked cut short.
    fn damaged(&mut self, damage: &mut Damage, path: &Path, what: String) {
        self.trace.cut_short = true;
        damage
            .entry(path.to_owned())
            .or_insert((what, BTreeSet::new()))
            .1
            .insert(self.trace.header.rank);
    }
}

fn analyze_job(job: &str, cursors: Vec<Cursor>, th: &Thresholds, damage: &mut Damage) -> Streamed {
    let mut det = Detectors::new(job, th.tuning.clone());
    for c in &cursors {
        if !c.trace.header.is_transport() {
            det.rank_node(c.trace.header.rank, &c.trace.header.node);
        }
    }
    // Decoders on threads of their own, each merging its share of the processes in time
    // order; this thread merges their streams and runs the detectors. Ties in time go in
    // process order, as for a trace in memory.
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, DECODERS)
        .min(cursors.len().max(1));
    let nodes: Vec<String> = cursors
        .iter()
        .map(|c| c.trace.header.node.clone())
        .collect();
    let mut shares: Vec<Vec<(usize, Cursor)>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, c) in cursors.into_iter().enumerate() {
        shares[i % workers].push((i, c));
    }
    let mut receivers = Vec::with_capacity(workers);
    let mut decoders = Vec::with_capacity(workers);
    for share in shares {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Fed>>(4);
        decoders.push(std::thread::spawn(move || decode(share, tx)));
        receivers.push(rx);
    }
    let mut streams: Vec<Stream> = receivers.into_iter().map(Stream::new).collect();
    let mut ev = Evaluator::default();
    let mut late = Lateness::default();
    // A decoder or two: the earliest head is found by looking at each.
    while let Some(s) = streams
        .iter()
        .enumerate()
        .filter_map(|(s, st)| st.peek().map(|(t, pi, _, _)| ((*t, *pi), s)))
        .min()
        .map(|x| x.1)
    {
        if let Some((t, pi, a, rec)) = streams[s].next() {
            ev.tick(&mut det, t);
            if let Record::Call(c) = &rec {
                late.call(c, a, t);
            }
            dispatch(&mut det, &rec, t, nodes.get(pi).map_or("", String::as_str));
        }
    }
    drop(streams);
    let mut comms: HashMap<u64, CommView> = HashMap::new();
    let mut done: Vec<(usize, Cursor)> = Vec::new();
    for d in decoders {
        let (cursors, theirs, w) = match d.join() {
            Ok(x) => x,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        for (id, c) in theirs {
            comms.entry(id).or_default().merge(c);
        }
        for (path, (what, ranks)) in w {
            let d = damage.entry(path).or_insert((what, BTreeSet::new()));
            d.1.extend(ranks);
        }
        done.extend(cursors);
    }
    done.sort_by_key(|x| x.0);
    let mut view = JobView {
        job: job.to_owned(),
        live: false,
        comms,
        ..Default::default()
    };
    let mut processes = Vec::with_capacity(done.len());
    let mut records = 0;
    for (_, c) in done {
        records += c.records;
        // The agents' transport records are not a rank's.
        if !c.trace.header.is_transport() {
            add_rank(&mut view, c.replay.finish(&c.trace));
        }
        processes.push(c.trace);
    }
    let view = finish(view);
    Streamed {
        job: job.to_owned(),
        analysis: conclude(view, det, ev, late, th),
        processes,
        records,
    }
}

/// Threads decoding a job's processes, at most.
const DECODERS: usize = 2;

/// What a decoder hands back: its cursors (by process index), what its processes added to
/// the communicators, and the damage it met.
type Decoded = (Vec<(usize, Cursor)>, HashMap<u64, CommView>, Damage);

/// Merges `cursors` (process index, cursor) in time order into chunks sent on `tx`.
fn decode(mut cursors: Vec<(usize, Cursor)>, tx: std::sync::mpsc::SyncSender<Vec<Fed>>) -> Decoded {
    let mut comms: HashMap<u64, CommView> = HashMap::new();
    let mut damage = Damage::new();
    let mut heap: BinaryHeap<Reverse<(u64, usize, usize)>> = BinaryHeap::new();
    for (k, (pi, c)) in cursors.iter_mut().enumerate() {
        if c.fill(&mut comms, &mut damage)
            && let Some(t) = c.buf.front()
        {
            heap.push(Reverse((t, *pi, k)));
        }
    }
    let mut chunk = Vec::with_capacity(CHUNK);
    while let Some(Reverse((_, pi, k))) = heap.pop() {
        let c = &mut cursors[k].1;
        if let Some((t, a, rec)) = c.buf.pop() {
            chunk.push((t, pi, a, rec));
            if chunk.len() == CHUNK {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK));
                if tx.send(full).is_err() {
                    break;
                }
            }
        }
        if c.fill(&mut comms, &mut damage)
            && let Some(t) = c.buf.front()
        {
            heap.push(Reverse((t, pi, k)));
        }
    }
    let _ = tx.send(chunk);
    (cursors, comms, damage)
}

/// One decoder's chunks, record by record.
struct Stream {
    rx: std::sync::mpsc::Receiver<Vec<Fed>>,
    chunk: std::vec::IntoIter<Fed>,
}

impl Stream {
    fn new(rx: std::sync::mpsc::Receiver<Vec<Fed>>) -> Stream {
        let mut s = Stream {
            rx,
            chunk: Vec::new().into_iter(),
        };
        s.pull();
        s
    }

    /// Receives chunks until one holds a record (or the decoder is done).
    fn pull(&mut self) {
        while self.chunk.as_slice().is_empty() {
            match self.rx.recv() {
                Ok(c) => self.chunk = c.into_iter(),
                Err(_) => return,
            }
        }
    }

    fn peek(&self) -> Option<&Fed> {
        self.chunk.as_slice().first()
    }

    fn next(&mut self) -> Option<Fed> {
        let x = self.chunk.next();
        self.pull();
        x
    }
}
