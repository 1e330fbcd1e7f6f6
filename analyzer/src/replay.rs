//! A trace replayed into a [`JobView`] at its end: what each process had completed, what it
//! was inside when its records end (`enter` records never matched by a completed call), how
//! it ended, and when it was last heard from. "Now" is the last moment any process was heard
//! from.

use std::collections::{BTreeMap, HashMap};

use commscope_wire::op::{Clock, flags};
use commscope_wire::parquet::ProcessTrace;
use commscope_wire::record::{Call, CommEvent, EXIT_STATUS_UNKNOWN, ProcessEvent, Record};

use crate::batch::real_time;
use crate::view::{CommView, Ending, InFlight, JobView, RankView};

/// The shim writes an `enter` record for a call in flight this long: a call known only from
/// its `enter` record was in flight at least this long.
const ENTER_AFTER_NS: u64 = 100_000_000;

/// The view of a job at the end of its trace.
pub fn view(job: &str, processes: &[ProcessTrace]) -> JobView {
    let mut v = JobView {
        job: job.to_owned(),
        live: false,
        mpi: processes.iter().any(|p| {
            p.records.iter().any(|r| {
                matches!(r, commscope_wire::record::Record::Call(c) if c.lib == commscope_wire::op::lib::MPI)
            })
        }),
        ..Default::default()
    };
    // The agents' transport records are not a rank's.
    for p in processes.iter().filter(|p| !p.header.is_transport()) {
        let mut r = ProcessReplay::new(p);
        for rec in &p.records {
            r.record(p, rec, &mut v.comms);
        }
        add_rank(&mut v, r.finish(p));
    }
    finish(v)
}

/// Adds a replayed process's rank to the view. Several processes of one rank (a restart): the
/// later one stands.
pub fn add_rank(v: &mut JobView, r: RankView) {
    match v.ranks.get(&r.rank) {
        Some(old) if old.last_heard_ns > r.last_heard_ns => {}
        _ => {
            v.ranks.insert(r.rank, r);
        }
    }
}

/// Completes a view once every process is added: peers made global, "now" set.
pub fn finish(mut v: JobView) -> JobView {
    for r in v.ranks.values_mut() {
        for c in &mut r.in_flight {
            c.peer = c.peer.and_then(|p| {
                v.comms
                    .get(&c.comm)
                    .and_then(|m| m.members.get(&p))
                    .copied()
            });
        }
    }
    v.now_ns = v.ranks.values().map(|r| r.last_heard_ns).max().unwrap_or(0);
    v
}

/// The traces as they stood at `t_ns` (realtime, the processes' common base): records written
/// later are left out, and a call entered by then but completed later becomes an `enter` record
/// — in flight at `t_ns`. What a live collector would have held at that moment.
pub fn until(processes: &[ProcessTrace], t_ns: u64) -> Vec<ProcessTrace> {
    processes
        .iter()
        .map(|p| {
            let at = |t: u64| real_time(p, t, Clock::HostMono);
            let records = p
                .records
                .iter()
                .filter_map(|r| {
                    let t = match r {
                        Record::Call(c) => {
                            if at(c.t_exit) <= t_ns {
                                return Some(*r);
                            }
                            return (at(c.t_enter) <= t_ns).then_some(Record::Enter(*c));
                        }
                        Record::Enter(c) => at(c.t_enter),
                        Record::Heartbeat(h) => at(h.t_mono),
                        Record::Process(x) if x.t_mono > 0 => at(x.t_mono),
                        Record::Process(x) => real_time(p, x.t_real, Clock::HostReal),
                        Record::Comm(c) => at(c.t),
                        Record::Skip(k) => at(k.t_last),
                        Record::Link(l) => at(l.t_end),
                        Record::Flow(f) => at(f.t_end),
                        Record::LinkEvent(e) => at(e.t),
                    };
                    (t <= t_ns).then_some(*r)
                })
                .collect();
            ProcessTrace {
                header: p.header.clone(),
                records,
                clock: p.clock,
                cut_short: p.cut_short,
            }
        })
        .collect()
}

/// The first and last realtime any record of the traces carries.
pub fn time_span(processes: &[ProcessTrace]) -> Option<(u64, u64)> {
    let mut span: Option<(u64, u64)> = None;
    for p in processes {
        for r in &p.records {
            let t = match r {
                Record::Call(c) => real_time(p, c.t_exit, Clock::HostMono),
                Record::Heartbeat(h) => real_time(p, h.t_mono, Clock::HostMono),
                Record::Enter(c) => real_time(p, c.t_enter, Clock::HostMono),
                _ => continue,
            };
            if t == 0 {
                continue;
            }
            span = Some(span.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        }
    }
    span
}

/// Completed calls remembered per process to match an `enter` record written after its call's
/// own record (the shim's heartbeat thread descheduled for a moment): a few records late, never
/// thousands.
const RECENT_COMPLETED: usize = 4096;

/// A call's identity within its process, shared by its `enter` record and its own:
/// (communicator, op, entry time). Not its sequence: a receive's is known only once it
/// completes (which message it got), so its `enter` record has none.
type CallKey = (u64, u8, u64);

fn call_key(c: &Call) -> CallKey {
    (c.comm_id, c.op, c.t_enter)
}

/// A heartbeat this long after a process recorded its end means it lived on.
const SURVIVED_NS: u64 = 1_000_000_000;

/// How an exit record says the process ended (`at_ns` and `observed` left to the caller).
fn ending_of(x: &commscope_wire::record::Process) -> Ending {
    Ending {
        status: (x.signal == 0 && x.exit_status != EXIT_STATUS_UNKNOWN).then_some(x.exit_status),
        signal: (x.signal != 0).then_some(x.signal),
        aborted: x.flags & flags::ABORTED != 0,
        sent_by: crate::view::Sender::of(x),
        ..Default::default()
    }
}

/// One process's records replayed one at a time, in the order it wrote them: its rank's view,
/// and what it adds to the communicators. State is bounded by what is in flight, so a trace of
/// any length streams through it.
#[derive(Debug)]
pub struct ProcessReplay {
    r: RankView,
    enters: BTreeMap<CallKey, Call>,
    /// The last completed calls, newest last (searched only for a late `enter`, which is rare).
    recent: std::collections::VecDeque<CallKey>,
    /// The end its agent saw, and the one the process recorded itself.
    exit: Option<Ending>,
    own_end: Option<Ending>,
    /// The last own heartbeat: (time, calls in flight), and the last completed call's end.
    last_beat: (u64, u32),
    last_exit: u64,
}

impl ProcessReplay {
    pub fn new(p: &ProcessTrace) -> ProcessReplay {
        ProcessReplay {
            r: RankView {
                rank: p.header.rank,
                node: p.header.node.clone(),
                pid: p.header.pid,
                ..Default::default()
            },
            enters: BTreeMap::new(),
            recent: Default::default(),
            exit: None,
            own_end: None,
            last_beat: (0, 0),
            last_exit: 0,
        }
    }

    /// The next record of process `p` (whose header and clock place its times).
    pub fn record(&mut self, p: &ProcessTrace, rec: &Record, comms: &mut HashMap<u64, CommView>) {
        let rank = self.r.rank;
        let r = &mut self.r;
        let heard = |t: u64, clock: Clock| real_time(p, t, clock);
        match rec {
            Record::Comm(c) if c.event == CommEvent::Created => {
                // Written to the file as it is created: a rank that dies in its first
                // milliseconds was heard then.
                r.last_heard_ns = r.last_heard_ns.max(heard(c.t, Clock::HostMono));
                let cv = comms.entry(c.comm_id).or_default();
                if c.comm_rank >= 0 {
                    cv.members.insert(c.comm_rank, c.rank);
                }
                cv.progress.entry(c.rank).or_insert(0);
                if cv.name.is_empty() {
                    cv.name = c.name().to_owned();
                }
            }
            Record::Comm(c) if c.event == CommEvent::Named && !c.name().is_empty() => {
                comms.entry(c.comm_id).or_default().name = c.name().to_owned();
            }
            Record::Heartbeat(h) => {
                if h.flags & flags::AGENT_BEAT == 0 {
                    let t = heard(h.t_mono, Clock::HostMono);
                    r.last_heard_ns = r.last_heard_ns.max(t);
                    if t >= self.last_beat.0 {
                        self.last_beat = (t, h.in_flight);
                    }
                    // Beating on well after it recorded its end: it survived (a handler of
                    // its own caught the signal), and that end was not one.
                    if self.own_end.is_some_and(|e| t >= e.at_ns + SURVIVED_NS) {
                        self.own_end = None;
                    }
                }
                if h.flags & flags::FINAL != 0 {
                    r.finalized = true;
                }
            }
            Record::Process(x) if x.event == ProcessEvent::Exit => {
                if x.flags & flags::OBSERVED != 0 {
                    self.exit = Some(Ending {
                        at_ns: x.t_real,
                        observed: true,
                        ..ending_of(x)
                    });
                } else if x.flags & flags::UNFINALIZED != 0 {
                    let at = heard(x.t_mono, Clock::HostMono);
                    r.last_heard_ns = r.last_heard_ns.max(at);
                    self.own_end = Some(Ending {
                        at_ns: at,
                        observed: true,
                        recorded: true,
                        ..ending_of(x)
                    });
                } else {
                    r.finalized = true;
                }
            }
            Record::Process(x) if x.event == ProcessEvent::Start => {
                r.last_heard_ns = r.last_heard_ns.max(heard(x.t_mono, Clock::HostMono));
            }
            Record::Enter(c) => {
                let key = call_key(c);
                // Completed already (its `enter` written late): not in flight. (A call seen from
                // the host only has its record once issued: that says nothing of completion.)
                if c.host_only() || !self.recent.iter().rev().any(|k| *k == key) {
                    self.enters.insert(key, *c);
                }
                // Written once the call had been in flight that long: alive then.
                r.last_heard_ns = r
                    .last_heard_ns
                    .max(heard(c.t_enter, c.clock()) + ENTER_AFTER_NS);
            }
            Record::Call(c) => {
                let t = heard(c.span().1, c.clock());
                r.last_heard_ns = r.last_heard_ns.max(t);
                self.last_exit = self.last_exit.max(t);
                let key = call_key(c);
                self.enters.remove(&key);
                if self.recent.len() == RECENT_COMPLETED {
                    self.recent.pop_front();
                }
                self.recent.push_back(key);
                let cv = comms.entry(c.comm_id).or_default();
                if c.flags & (flags::NONBLOCKING | flags::PERSISTENT) == 0 {
                    cv.longest_ns = cv.longest_ns.max(c.duration_ns());
                }
                if !c.op().is_p2p() {
                    let e = cv.progress.entry(rank).or_insert(0);
                    *e = (*e).max(c.seq + 1);
                }
            }
            // Calls left out by sampling completed too.
            Record::Skip(k) if !k.op().is_p2p() => {
                let e = comms
                    .entry(k.comm_id)
                    .or_default()
                    .progress
                    .entry(rank)
                    .or_insert(0);
                *e = (*e).max(k.last_seq + 1);
            }
            _ => {}
        }
    }

    /// The rank's view once every record of the process is replayed.
    pub fn finish(self, p: &ProcessTrace) -> RankView {
        let mut r = self.r;
        let mut enters = self.enters;
        let heard = |t: u64, clock: Clock| real_time(p, t, clock);
        let ended = match (self.own_end, self.exit) {
            (Some(own), Some(seen)) => Some(own.merged(seen)),
            (own, seen) => own.or(seen),
        };
        r.ended = ended.filter(|_| !r.finalized);
        // Nothing of the process is heard after its exit was seen: a later record was written
        // on its behalf (an agent that had not yet seen it go).
        if let Some(e) = r.ended.filter(|e| e.observed) {
            r.last_heard_ns = r.last_heard_ns.min(e.at_ns);
        }
        // Still in flight: entered, never completed, and the process did not finalize.
        r.busy_unseen =
            enters.is_empty() && self.last_beat.1 > 0 && self.last_beat.0 > self.last_exit;
        // Records lost to damage: unless its ending was recorded, where its records stop is
        // not where it stopped, and what it was inside there is unknown.
        r.data_lost = p.cut_short && !r.finalized && r.ended.is_none();
        if r.data_lost {
            r.busy_unseen = false;
        }
        if r.finalized || r.data_lost {
            enters.clear();
        }
        let until = r
            .ended
            .map_or(r.last_heard_ns, |e| e.at_ns.max(r.last_heard_ns));
        let mut enters: Vec<Call> = enters.into_values().collect();
        enters.sort_by_key(|c| (c.comm_id, c.op().is_p2p(), c.seq, c.op_seq, c.t_enter));
        for c in enters {
            let (comm, seq) = (c.comm_id, if c.op().is_p2p() { c.op_seq } else { c.seq });
            let entered = heard(c.t_enter, c.clock());
            // The peer's rank in the communicator, made global once every process is read.
            let peer = (c.peer >= 0).then_some(c.peer);
            r.in_flight.push(InFlight {
                comm,
                seq,
                op: c.op(),
                bytes: c.bytes,
                peer,
                tag: c.tag,
                entered_ns: entered,
                age_ns: until.saturating_sub(entered).max(ENTER_AFTER_NS),
                stream: c.lib != commscope_wire::op::lib::MPI,
                issued_only: c.host_only(),
                posted: c.nonblocking(),
                shape: crate::stream::Shape::of_call(&c),
            });
        }
        r
    }
}
