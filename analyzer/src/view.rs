//! One view of a job, the input of the liveness detectors (`hang`, `dead-rank`): its ranks and
//! how their processes stand, their calls in flight, and each communicator's members and
//! progress. The collector builds it from its live state ([`JobView::live`] is then true), and
//! [`crate::replay`] builds it from a trace, so both run the very same detectors.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use commscope_wire::op::Op;

/// A job at one moment ("now").
#[derive(Clone, Debug, Default)]
pub struct JobView {
    pub job: String,
    /// Built from a running job (present tense, process states known) rather than a trace.
    pub live: bool,
    /// Its processes call MPI, which they must finalize (NCCL alone has nothing to finalize:
    /// an exit 0 is a normal end).
    pub mpi: bool,
    /// Now, on the records' realtime clock (ns since the epoch). From a trace: the latest
    /// heartbeat of any process.
    pub now_ns: u64,
    /// Global rank → its process.
    pub ranks: BTreeMap<i32, RankView>,
    pub comms: HashMap<u64, CommView>,
    /// Nodes whose agent the collector lost contact with (live only): their ranks are out of
    /// sight, and their silence is no evidence about them.
    pub lost: BTreeMap<String, LostContact>,
    /// Nodes whose stream is open but whose data lags the job's other nodes (live only): their
    /// ranks are not judged until it catches up.
    pub behind: BTreeSet<String>,
    /// Network links the transport view shows dead: data sent and retransmitted with nothing
    /// acknowledged ([`crate::flows::FlowLinks::dead_links`]).
    pub dead_links: Vec<DeadLink>,
}

/// A link whose sender has retransmitted with nothing acknowledged since `dead_s` ago.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeadLink {
    /// The sending node, and the receiving node (its address when no agent reports it).
    pub src: String,
    pub dst: String,
    pub transport: &'static str,
    pub dead_s: f64,
    pub retransmits: u64,
    /// The ranks whose sockets retransmitted.
    pub ranks: Vec<i32>,
    /// The sending node's interface, when its agent named it.
    pub src_nic: Option<String>,
}

/// A node out of contact: no stream from its agent since `since_ns` (realtime).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LostContact {
    pub since_ns: u64,
    /// How its last stream ended (the transport's error, or that it ended).
    pub why: String,
    /// Not heard from since the collector (re)started, within the time agents take to come
    /// back: nothing is known of it yet, its failure included.
    pub awaited: bool,
}

/// One rank's process.
#[derive(Clone, Debug, Default)]
pub struct RankView {
    pub rank: i32,
    pub node: String,
    pub pid: u32,
    /// It shut down cleanly (finalized, or its final heartbeat) before it ended.
    pub finalized: bool,
    /// How it ended, if it did.
    pub ended: Option<Ending>,
    /// Realtime of the last record the process itself wrote (heartbeat or call; 0: none).
    pub last_heard_ns: u64,
    /// Calls in flight at its last observation: now while it runs, when it ended otherwise.
    pub in_flight: Vec<InFlight>,
    /// Its last heartbeat counted a call in flight that no record shows (entered less than the
    /// shim's `enter` delay before its records end): it was inside some call, not elsewhere.
    pub busy_unseen: bool,
    /// Its trace lost records to damage and does not say how it ended: its silence after its
    /// last record is not evidence (it is never taken for dead or frozen), and no call is
    /// taken to be in flight.
    pub data_lost: bool,
    /// Live: its own data (records, snapshots) lags the time the job is judged at — still on
    /// its way (a stream reopened, batches resent): it is not judged until it catches up.
    pub behind: bool,
    /// The process as its node's agent sees it (live only).
    pub process: Option<ProcessState>,
    /// How long ago its agent last reported on it (live, while it runs; None: not yet, or a
    /// trace).
    pub observed_age_ns: Option<u64>,
    /// Extra evidence about the process (stacks, kernel state) for findings that name it.
    pub evidence: serde_json::Value,
}

/// How a process ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ending {
    /// When (realtime ns): when the process recorded its own end, else when its agent saw it
    /// end, else (from a trace without exit records) its last heartbeat.
    pub at_ns: u64,
    /// A precise time (recorded by the process or seen by its agent), rather than inferred
    /// from silence.
    pub observed: bool,
    /// Its exit status (with `aborted`, `MPI_Abort`'s error code).
    pub status: Option<i32>,
    pub signal: Option<i32>,
    /// It called `MPI_Abort`.
    pub aborted: bool,
    /// The process recorded its own end (`exit` without finalizing, a fatal signal,
    /// `MPI_Abort`): it was ending at `at_ns`, before anything it caused took others down.
    pub recorded: bool,
    /// Who sent the signal that ended it, when its observer saw that.
    pub sent_by: Option<Sender>,
}

/// Who sent the signal that ended a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// The kernel on its own behalf: the OOM killer (SIGKILL), a terminal (SIGINT, SIGHUP).
    Kernel,
    /// The process itself.
    Itself,
    /// An ancestor of the process: its launcher, taking the job down.
    Launcher(u32),
    /// Another process (an operator's `kill`, a watchdog, a scheduler).
    Other(u32),
}

impl Sender {
    /// For a finding's evidence: `{"kernel": true}`, `{"itself": true}`, `{"launcher": pid}`,
    /// `{"other": pid}`.
    pub fn evidence(&self) -> serde_json::Value {
        match self {
            Sender::Kernel => serde_json::json!({"kernel": true}),
            Sender::Itself => serde_json::json!({"itself": true}),
            Sender::Launcher(p) => serde_json::json!({"launcher": p}),
            Sender::Other(p) => serde_json::json!({"other": p}),
        }
    }

    /// Who sent an observed exit record's signal, when its observer saw that.
    pub fn of(x: &commscope_wire::record::Process) -> Option<Sender> {
        use commscope_wire::op::flags;
        if x.flags & flags::SENDER_KNOWN == 0 || x.signal == 0 {
            return None;
        }
        let pid = u32::try_from(x.step).ok()?;
        Some(if pid == 0 {
            Sender::Kernel
        } else if pid == x.pid {
            Sender::Itself
        } else if x.flags & flags::SENT_BY_LAUNCHER != 0 {
            Sender::Launcher(pid)
        } else {
            Sender::Other(pid)
        })
    }
}

/// Signals by which a process is taken down from outside (a launcher, an operator, the OOM
/// killer), rather than ended by what it was doing itself.
pub const EXTERNAL_SIGNALS: [i32; 5] = [1, 2, 3, 9, 15];

impl Ending {
    /// It ended of its own doing: an exit without finalizing, `MPI_Abort`, or a fault of its
    /// own (SIGSEGV, SIGABRT, …) — not killed from outside (SIGTERM, SIGKILL, …) and not
    /// merely gone silent.
    pub fn by_itself(&self) -> bool {
        self.aborted
            || match self.signal {
                Some(sig) => !EXTERNAL_SIGNALS.contains(&sig),
                None => self.status.is_some() || self.recorded,
            }
    }

    /// Its observer saw it exit with status 0, and the process recorded no unclean end of its
    /// own: a normal end for a process that has nothing to finalize.
    pub fn clean_exit(&self) -> bool {
        self.observed
            && !self.recorded
            && !self.aborted
            && self.signal.is_none()
            && self.status == Some(0)
    }

    /// Says how it ended (else only when).
    fn says_how(&self) -> bool {
        self.aborted || self.status.is_some() || self.signal.is_some()
    }

    /// The same ending, completed with what another report of it says: the earlier time (the
    /// process records its end before the kernel sees it), and the more precise account of how
    /// (the process knows it aborted; the kernel knows the signal that finally ended it).
    pub fn merged(self, other: Ending) -> Ending {
        let (own, seen) = if self.recorded {
            (self, other)
        } else {
            (other, self)
        };
        // The process's own account stands whole when it says how (an aborting process may
        // then be killed by its launcher: it still aborted).
        let how = if own.says_how() { own } else { seen };
        Ending {
            at_ns: self.at_ns.min(other.at_ns),
            observed: self.observed || other.observed,
            status: how.status,
            signal: how.signal,
            aborted: how.aborted,
            recorded: self.recorded || other.recorded,
            sent_by: self.sent_by.or(other.sent_by),
        }
    }
}

/// A call in flight.
#[derive(Clone, Debug, PartialEq)]
pub struct InFlight {
    pub comm: u64,
    /// The collective instance, or the point-to-point operation's sequence.
    pub seq: u64,
    pub op: Op,
    pub bytes: u64,
    /// Point-to-point: the peer's global rank (None: unknown or any source).
    pub peer: Option<i32>,
    pub tag: i32,
    /// When it entered (realtime ns; 0 when not known).
    pub entered_ns: u64,
    /// How long it has been in flight at its rank's last observation.
    pub age_ns: u64,
    /// Work queued on a GPU stream (NCCL, RCCL): the host went on after queuing it, and the
    /// call completes on each rank when that rank's GPU finishes its part.
    pub stream: bool,
    /// Stream work seen from the host only (a process recorded without the preload): the
    /// rank's latest collective on the communicator, issued, its completion unknown. It says
    /// who issued what, not who waits.
    pub issued_only: bool,
    /// A nonblocking request (`MPI_I*`) posted and not yet seen complete: the rank went on
    /// after posting it, so it is not blocked in it (it may wait for it in `MPI_Wait*`).
    pub posted: bool,
    /// A collective's signature (op, size, root, datatype, reduction) as far as its record
    /// tells: what the members of its instance must agree on.
    pub shape: crate::stream::Shape,
}

/// A process's kernel state (live).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessState {
    /// "R", "S", "D", "T", …
    pub state: String,
    pub wchan: String,
    /// Its CPU time grew in the last two seconds.
    pub cpu_advancing: bool,
}

impl ProcessState {
    /// Stopped by a signal or a debugger (`T`, `t`).
    pub fn stopped(&self) -> bool {
        matches!(self.state.as_str(), "T" | "t")
    }
}

/// One communicator.
#[derive(Clone, Debug, Default)]
pub struct CommView {
    /// Its name (`MPI_Comm_set_name`, NCCL's `commName`, a process group's description), or "".
    pub name: String,
    /// Rank in the communicator → global rank.
    pub members: BTreeMap<i32, i32>,
    /// Global rank → collectives completed in order (highest completed seq + 1).
    pub progress: BTreeMap<i32, u64>,
    /// The longest completed blocking call on it (ns): the hang threshold adapts to it.
    pub longest_ns: u64,
}

impl CommView {
    /// Adds what other processes' records said of the same communicator.
    pub fn merge(&mut self, other: CommView) {
        if self.name.is_empty() {
            self.name = other.name;
        }
        self.members.extend(other.members);
        for (rank, done) in other.progress {
            let e = self.progress.entry(rank).or_insert(0);
            *e = (*e).max(done);
        }
        self.longest_ns = self.longest_ns.max(other.longest_ns);
    }
}

impl JobView {
    /// Ranks of the communicator (global), members and those seen progressing on it.
    pub fn members(&self, comm: u64) -> Vec<i32> {
        let Some(c) = self.comms.get(&comm) else {
            return vec![];
        };
        let mut v: Vec<i32> = c.members.values().copied().collect();
        v.extend(c.progress.keys().copied());
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Whether `rank` has completed collective `seq` of `comm`.
    pub fn done(&self, comm: u64, rank: i32, seq: u64) -> bool {
        self.comms
            .get(&comm)
            .and_then(|c| c.progress.get(&rank))
            .is_some_and(|p| *p > seq)
    }

    /// Whether `rank` is inside collective `seq` of `comm`.
    pub fn inside(&self, comm: u64, rank: i32, seq: u64) -> bool {
        self.ranks.get(&rank).is_some_and(|r| {
            r.in_flight
                .iter()
                .any(|x| x.comm == comm && x.seq == seq && !x.op.is_p2p())
        })
    }

    /// A communicator as sentences name it: `0x…` with its name when it has one.
    pub fn comm_label(&self, comm: u64) -> String {
        let id = commscope_wire::hash::format_comm_id(comm);
        match self.comms.get(&comm).map(|c| c.name.as_str()) {
            Some(name) if !name.is_empty() => format!("{id} ({name})"),
            _ => id,
        }
    }

    /// Ranks on nodes out of contact or behind, and ranks whose own data is behind.
    pub fn out_of_sight(&self) -> BTreeSet<i32> {
        self.ranks
            .values()
            .filter(|r| {
                r.behind || self.lost.contains_key(&r.node) || self.behind.contains(&r.node)
            })
            .map(|r| r.rank)
            .collect()
    }

    /// Live ranks still running whose agent has not reported on them for `after_ns`, on
    /// nodes not (yet) known to be out of contact.
    pub fn unseen(&self, after_ns: u64) -> BTreeSet<i32> {
        if !self.live {
            return BTreeSet::new();
        }
        self.ranks
            .values()
            .filter(|r| r.ended.is_none() && !r.finalized && !self.lost.contains_key(&r.node))
            .filter(|r| r.observed_age_ns.is_some_and(|a| a >= after_ns))
            .map(|r| r.rank)
            .collect()
    }

    /// The node of a rank ("" when unknown).
    pub fn node(&self, rank: i32) -> &str {
        self.ranks.get(&rank).map_or("", |r| r.node.as_str())
    }
}
