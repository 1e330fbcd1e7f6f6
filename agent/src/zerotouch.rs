//! Zero-touch recording: NCCL calls of processes started without the preload, from the
//! transport view's uprobes on the NCCL API.
//!
//! A process is adopted at its first `ncclCommInitRank[Config]`: the agent gives it an identity
//! as the preload would (job and rank from its launcher's environment, read from
//! `/proc/<pid>/environ`, through the same rule, [`commscope_wire::launcher`]), a ring of its own
//! in agent memory, and registers it with the pump like any traced process. From then on its
//! communicators (`comm` records, ids computed from the unique id as NCCL computes `commHash`)
//! and calls (`call` records) go into that ring, with a heartbeat every second; its exit is
//! watched like any other.
//!
//! What the host sees of an NCCL call is its enqueue: the records carry that interval and are
//! marked [`flags::HOST_ONLY`] (counted and ordered, never timed: no GPU interval). Each
//! communicator's latest collective stays in the ring's in-flight table as
//! [`in_flight_status::ISSUED`]: the hang detector reads a member that never issued what the
//! others did as the one they wait for, and nothing else from it. Processes that carry the preload are never adopted; communicators made
//! before the probes attached (or by functions not probed: `ncclCommSplit`,
//! `ncclCommInitAll`, `ncclCommInitRankScalable`) are unknown, and their calls only counted.
//! The in-flight table keeps one slot per communicator ([`IN_FLIGHT_SLOTS`]).

use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use commscope_ebpf_common::{NcclCallEvent, NcclInitEvent, nccl_api};
use commscope_wire::launcher;
use commscope_wire::nccl_hash::{self, Version};
use commscope_wire::op::{Clock, OP_COUNT, Op, flags, lib};
use commscope_wire::record::{
    Call, Comm, CommEvent, EXIT_STATUS_UNKNOWN, Heartbeat, Process, ProcessEvent, Record,
};
use commscope_wire::registration::{PROTOCOL_VERSION, Request};
use commscope_wire::shm::{Counter, Geometry, InFlight, LAYOUT_VERSION, Shm, in_flight_status};

use crate::daemon::{now_mono, now_real};
use crate::region::Region;
use crate::registration::Registered;

/// In-flight slots of an adopted process: one per live communicator (more are counted as
/// dropped, and those communicators' calls are still recorded).
const IN_FLIGHT_SLOTS: u32 = 256;

/// An adopted process's heartbeat period, as the preload's.
const BEAT_NS: u64 = 1_000_000_000;

/// How early a heartbeat may go: the recorder ticks about once a second, late by a varying
/// delay, and a tick that comes a little early must not push the beat to the next one (two
/// seconds of silence).
const BEAT_SLACK_NS: u64 = 250_000_000;

/// Records an adopted process's ring holds (2 MiB): a second of calls at 16,000 calls/s.
const RING_RECORDS: u64 = 1 << 14;

/// The flavour adopted processes register with: NCCL's, so the collector reads their calls as
/// stream work.
pub const FLAVOUR: &str = "nccl";

/// The NCCL version assumed when the library's own version string cannot be read: 2.26 or
/// later (its `commHash` algorithm).
const DEFAULT_VERSION: Version = Version(22600);

/// What the recorder did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub processes: u64,
    pub comms: u64,
    pub calls: u64,
    /// Calls on communicators the recorder never saw created.
    pub unknown_comm: u64,
    /// Records lost because an adopted process's ring was full.
    pub ring_full: u64,
    /// Processes that could not be adopted (no memory for a ring).
    pub failed: u64,
}

#[derive(Debug)]
struct CommSt {
    id: u64,
    rank: i32,
    size: i32,
    seq: u64,
    op_seq: [u64; OP_COUNT],
    /// Its in-flight slot, holding its latest collective.
    slot: Option<usize>,
}

#[derive(Debug)]
struct Proc {
    rank: i32,
    start_time: u64,
    /// The agent's own mapping of the ring it registered for the process.
    ring: Region,
    comms: HashMap<u64, CommSt>,
    /// Next message sequence per (communicator, peer, sending).
    p2p: HashMap<(u64, i32, bool), u64>,
    version: Version,
    last_beat: u64,
    /// Set once the process is gone and nothing more will be written (the pump's exit batch
    /// waits for it).
    done: Arc<AtomicBool>,
}

/// The zero-touch recorder of one node.
#[derive(Debug)]
pub struct Recorder {
    proc_root: PathBuf,
    node: String,
    procs: HashMap<u32, Proc>,
    /// The registration socket's identity (device, inode): a process is adopted only when the
    /// socket it would register at is this one (None: any).
    socket: Option<(u64, u64)>,
    /// Processes never adopted, with their start times: those that carry the preload, and those
    /// whose agent is another one.
    ignored: HashMap<u32, u64>,
    /// Processes this agent serves whose communicator inits the probes missed (they started
    /// first), with their start times: their calls count as `unknown_comm`.
    late: HashMap<u32, u64>,
    versions: HashMap<PathBuf, Version>,
    pub counts: Counts,
}

impl Recorder {
    /// A recorder for the processes under `proc_root` whose registration socket is `socket`
    /// (the agent's own: the one they would register at with the preload).
    pub fn new(proc_root: impl Into<PathBuf>, node: impl Into<String>, socket: &Path) -> Recorder {
        Recorder {
            proc_root: proc_root.into(),
            node: node.into(),
            procs: HashMap::new(),
            socket: file_id(socket),
            ignored: HashMap::new(),
            late: HashMap::new(),
            versions: HashMap::new(),
            counts: Counts::default(),
        }
    }

    /// Whether `pid` was adopted.
    pub fn adopted(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Processes never adopted: they carry the preload, or another agent serves them (the
    /// probes skip them).
    pub fn ignored(&self) -> impl Iterator<Item = u32> + '_ {
        self.ignored.keys().copied()
    }

    /// A communicator init returned. Returns the registration of a newly adopted process, for
    /// the pump.
    pub fn init(&mut self, e: &NcclInitEvent) -> Option<Registered> {
        let pid = e.head.pid;
        if self.ignored.contains_key(&pid) {
            return None;
        }
        let mut adopted = None;
        if !self.procs.contains_key(&pid) {
            let env = self.ours(pid)?;
            self.late.remove(&pid);
            let (p, reg) = self.adopt(pid, e, &env)?;
            self.procs.insert(pid, p);
            adopted = Some(reg);
        }
        let p = self.procs.get_mut(&pid)?;
        let id = nccl_hash::init_comm_hash(p.version, &e.id);
        let mut c = Comm::new(
            if e.ret == 0 {
                CommEvent::Created
            } else {
                CommEvent::Failed
            },
            id,
            0,
            e.head.ts_ns,
            p.rank,
            e.rank,
            e.nranks,
            0,
        );
        c.flags = flags::NCCL_COMM;
        c.status = e.ret;
        if e.ret == 0 && e.comm != 0 {
            p.comms.insert(
                e.comm,
                CommSt {
                    id,
                    rank: e.rank,
                    size: e.nranks,
                    seq: 0,
                    op_seq: [0; OP_COUNT],
                    slot: None,
                },
            );
            self.counts.comms += 1;
        }
        push(p, &mut self.counts, &Record::Comm(c));
        adopted
    }

    /// A collective or point-to-point call returned, or a communicator ended.
    pub fn call(&mut self, e: &NcclCallEvent) {
        let pid = e.head.pid;
        if !self.procs.contains_key(&pid) {
            // A process whose init the probes never saw (it started before them): one this
            // agent serves calls on a communicator never seen created; another agent's, or one
            // carrying the preload, is none of this recorder's business.
            if self.ignored.contains_key(&pid) {
                return;
            }
            if !self.late.contains_key(&pid) {
                if self.ours(pid).is_none() {
                    return;
                }
                let start = start_time(&self.proc_root, pid);
                self.late.insert(pid, start);
            }
            self.counts.unknown_comm += 1;
            return;
        }
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if matches!(
            e.op,
            nccl_api::DESTROY | nccl_api::ABORT | nccl_api::FINALIZE
        ) {
            // Finalize flushes; destroy or abort frees the handle.
            if e.op == nccl_api::FINALIZE {
                return;
            }
            if let Some(c) = p.comms.remove(&e.comm) {
                if let Some(i) = c.slot {
                    p.ring.shm().in_flight_release(i);
                }
                let mut r = Comm::new(
                    CommEvent::Freed,
                    c.id,
                    0,
                    e.head.ts_ns,
                    p.rank,
                    c.rank,
                    c.size,
                    0,
                );
                r.flags = flags::NCCL_COMM;
                push(p, &mut self.counts, &Record::Comm(r));
            }
            return;
        }
        let Some(op) = op_of(e.op) else { return };
        let Some(c) = p.comms.get_mut(&e.comm) else {
            self.counts.unknown_comm += 1;
            return;
        };
        let (esize, code) = commscope_wire::op::nccl_dtype(e.dtype);
        let per_rank = commscope_wire::op::nccl_count_is_per_rank(op);
        let n = c.size.max(0) as u64;
        let mut call = Call {
            op: op as u8,
            flags: flags::NONBLOCKING | flags::HOST_ONLY,
            status: e.ret,
            comm_id: c.id,
            bytes: e.count * esize * if per_rank { n } else { 1 },
            count: if per_rank { e.count * n } else { e.count },
            peer: e.peer,
            tag: -1,
            t_enter: e.t_enter,
            t_exit: e.head.ts_ns,
            rank: p.rank,
            comm_rank: c.rank,
            comm_size: c.size,
            dtype: code,
            clock: Clock::HostMono as u8,
            lib: lib::NCCL,
            peer2: -1,
            tag2: -1,
            red_op: if op.is_reducing() {
                commscope_wire::op::red_op::from_nccl(e.red_op)
            } else {
                commscope_wire::op::red_op::UNKNOWN
            },
            ..Call::default()
        };
        if op.is_p2p() {
            call.seq = c.seq;
            call.tag = 0;
            let s = p.p2p.entry((c.id, e.peer, op == Op::Send)).or_insert(0);
            call.op_seq = *s;
            *s += 1;
        } else {
            call.seq = c.seq;
            c.seq += 1;
            call.op_seq = c.op_seq[op as usize];
            c.op_seq[op as usize] += 1;
            let issued = InFlight {
                comm_id: c.id,
                seq: call.seq,
                t_enter: call.t_enter,
                bytes: call.bytes,
                op: call.op,
                status: in_flight_status::ISSUED,
                flags: call.flags,
                peer: call.peer,
                tag: -1,
                tid: e.head.tid,
                comm_rank: c.rank,
                count: call.count,
                dtype: call.dtype,
                red_op: call.red_op,
            };
            let shm = p.ring.shm();
            match c.slot {
                Some(i) => shm.in_flight_write(i, &issued),
                None => c.slot = shm.in_flight_claim(0, &issued),
            }
        }
        self.counts.calls += 1;
        push(p, &mut self.counts, &Record::Call(call));
    }

    /// Writes each adopted process's heartbeat (once a second) and forgets processes that are
    /// gone, marking their writing done (their exits are the pump's to report; call this after
    /// taking every event the probes have delivered, so that a process's last calls are in). Returns the ignored processes that are
    /// gone, for the probes' skip list.
    pub fn tick(&mut self, now: u64) -> Vec<u32> {
        let root = self.proc_root.clone();
        let alive = |pid: u32, start: u64| running_since(&root, pid) == Some(start);
        self.procs.retain(|pid, p| {
            let live = alive(*pid, p.start_time);
            if !live {
                p.done.store(true, Ordering::Release);
            }
            live
        });
        for p in self.procs.values_mut() {
            if now.saturating_sub(p.last_beat) < BEAT_NS - BEAT_SLACK_NS {
                continue;
            }
            p.last_beat = now;
            let shm = p.ring.shm();
            let beat = Record::Heartbeat(Heartbeat {
                rec_seq: 0,
                flags: 0,
                t_mono: now,
                t_real: now_real(),
                in_flight: 0,
                rank: p.rank,
                dropped_ring_full: shm.counter(Counter::DroppedRingFull),
                dropped_in_flight: 0,
                dropped_other: 0,
                produced: shm.head(),
            });
            push(p, &mut self.counts, &beat);
            p.ring.shm().beat(now);
        }
        self.late.retain(|pid, start| alive(*pid, *start));
        let gone: Vec<u32> = self
            .ignored
            .iter()
            .filter(|(pid, start)| !alive(**pid, **start))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in &gone {
            self.ignored.remove(pid);
        }
        gone
    }

    /// The environment of a process this recorder may adopt: one that does not carry the
    /// preload and that this agent serves. Any other goes on the skip list (None), unless it
    /// is gone already.
    fn ours(&mut self, pid: u32) -> Option<HashMap<String, String>> {
        let dir = self.proc_root.join(pid.to_string());
        let environ = std::fs::read(dir.join("environ")).unwrap_or_default();
        let env = launcher::parse_environ(&environ);
        if !self.carries_preload(pid) && self.serves(pid, &env) {
            return Some(env);
        }
        let start = start_time(&self.proc_root, pid);
        if start != 0 {
            self.ignored.insert(pid, start);
        }
        None
    }

    /// Whether this agent serves the process: the socket it would register at with the preload
    /// (`COMMSCOPE_AGENT_SOCKET`, else the default, seen from its own root) is this agent's.
    fn serves(&self, pid: u32, env: &HashMap<String, String>) -> bool {
        let Some(ours) = self.socket else {
            return true;
        };
        let path = env
            .get("COMMSCOPE_AGENT_SOCKET")
            .filter(|s| !s.trim().is_empty())
            .map_or(commscope_wire::registration::DEFAULT_SOCKET, String::as_str);
        let theirs = self
            .proc_root
            .join(pid.to_string())
            .join("root")
            .join(path.trim_start_matches('/'));
        file_id(&theirs) == Some(ours)
    }

    /// Whether the process maps the preload library.
    fn carries_preload(&self, pid: u32) -> bool {
        std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("maps"))
            .is_ok_and(|m| m.lines().any(|l| l.ends_with("/libcommscope.so")))
    }

    /// Makes an identity and a ring for `pid`.
    fn adopt(
        &mut self,
        pid: u32,
        e: &NcclInitEvent,
        env: &HashMap<String, String>,
    ) -> Option<(Proc, Registered)> {
        let get = |k: &str| env.get(k).cloned();
        let start_time = start_time(&self.proc_root, pid);
        let version = self.version_of(pid);
        let first = nccl_hash::init_comm_hash(version, &e.id);
        let rank = launcher::int(get, &launcher::RANK_VARS).unwrap_or(e.rank.max(0));
        let size = launcher::int(get, &launcher::SIZE_VARS).unwrap_or(e.nranks.max(1));
        let job = launcher::nccl_job(get, first, pid, start_time);
        let geometry = Geometry {
            ring_capacity: RING_RECORDS,
            in_flight_slots: IN_FLIGHT_SLOTS,
        };
        let (ring, theirs) = match rings(geometry) {
            Ok(r) => r,
            Err(why) => {
                self.counts.failed += 1;
                tracing::warn!("cannot record pid {pid}'s NCCL calls: {why}");
                return None;
            }
        };
        let (stream, _) = std::os::unix::net::UnixStream::pair().ok()?;
        let node = get("COMMSCOPE_NODE")
            .or_else(|| get("NODE_NAME"))
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| self.node.clone());
        ring.shm()
            .set_identity(pid, start_time, rank, size, &job, &node);
        let request = Request {
            version: PROTOCOL_VERSION,
            layout_version: LAYOUT_VERSION as u16,
            pid,
            rank,
            world_size: size,
            start_time,
            shm_size: geometry.total_size() as u64,
            job: job.clone(),
            node,
            flavour: FLAVOUR.to_owned(),
        };
        let mut p = Proc {
            rank,
            start_time,
            ring,
            comms: HashMap::new(),
            p2p: HashMap::new(),
            version,
            last_beat: now_mono(),
            done: Arc::new(AtomicBool::new(false)),
        };
        let start = Record::Process(Process {
            rec_seq: 0,
            event: ProcessEvent::Start,
            flags: flags::OBSERVED,
            t_mono: e.t_enter,
            t_real: now_real(),
            pid,
            exit_status: EXIT_STATUS_UNKNOWN,
            start_time,
            rank,
            world_size: size,
            signal: 0,
            step: 0,
        });
        push(&mut p, &mut self.counts, &start);
        self.counts.processes += 1;
        tracing::info!(
            "recording pid {pid}'s NCCL calls from uprobes (no preload): rank {rank} of {size}, job {job}, NCCL {}",
            version.0
        );
        let done = p.done.clone();
        Some((
            p,
            Registered {
                request,
                region: theirs,
                stream,
                writer_done: Some(done),
            },
        ))
    }

    /// The NCCL version of the library `pid` maps (its `NCCL version X.Y.Z` string), which
    /// says how it computes `commHash`.
    fn version_of(&mut self, pid: u32) -> Version {
        let dir = self.proc_root.join(pid.to_string());
        let Ok(maps) = std::fs::read_to_string(dir.join("maps")) else {
            return DEFAULT_VERSION;
        };
        let Some(path) = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| crate::transport::procfs::is_nccl_library(p))
        else {
            return DEFAULT_VERSION;
        };
        let file = dir.join("root").join(path.trim_start_matches('/'));
        if let Some(v) = self.versions.get(&file) {
            return *v;
        }
        let v = version_in_file(&file).unwrap_or(DEFAULT_VERSION);
        self.versions.insert(file, v);
        v
    }
}

/// A file's (device, inode).
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// A process's start time, 0 when it is gone.
fn start_time(proc_root: &Path, pid: u32) -> u64 {
    commscope_wire::registration::start_time_of(proc_root, pid)
}

/// A process's start time while it runs: None once it has exited, a zombie included (its
/// records are done, though its parent has not reaped it yet). A zombie leader whose other
/// threads run on (its main thread called `pthread_exit`) still runs.
fn running_since(proc_root: &Path, pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")).ok()?;
    let rest = commscope_wire::registration::stat_fields(&stat)?;
    let threads: u64 = rest.get(17)?.parse().ok()?;
    match *rest.first()? {
        "X" | "x" => return None,
        "Z" if threads <= 1 => return None,
        _ => {}
    }
    rest.get(19)?.parse().ok()
}

fn push(p: &mut Proc, counts: &mut Counts, r: &Record) {
    if p.ring.shm().push(&r.encode()).is_none() {
        counts.ring_full += 1;
    }
}

/// The operation of an NCCL API event.
fn op_of(op: u32) -> Option<Op> {
    Some(match op {
        nccl_api::ALL_REDUCE => Op::Allreduce,
        nccl_api::BROADCAST => Op::Broadcast,
        nccl_api::REDUCE => Op::Reduce,
        nccl_api::ALL_GATHER => Op::Allgather,
        nccl_api::REDUCE_SCATTER => Op::Reducescatter,
        nccl_api::ALL_TO_ALL => Op::Alltoall,
        nccl_api::GATHER => Op::Gather,
        nccl_api::SCATTER => Op::Scatter,
        nccl_api::SEND => Op::Send,
        nccl_api::RECV => Op::Recv,
        _ => return None,
    })
}

/// The version string in a library file: read in 1 MiB pieces, up to the first 64 MiB (NCCL's
/// is in `.rodata`, a few MiB in; the whole file is hundreds).
fn version_in_file(path: &Path) -> Option<Version> {
    use std::io::Read;
    const PIECE: usize = 1 << 20;
    const OVERLAP: usize = 64;
    let mut f = std::fs::File::open(path).ok()?;
    let mut buf = vec![0u8; PIECE + OVERLAP];
    let mut kept = 0;
    for _ in 0..64 {
        let n = f.read(&mut buf[kept..]).ok()?;
        if n == 0 {
            return None;
        }
        let end = kept + n;
        if let Some(v) = version_in(&buf[..end]) {
            return Some(v);
        }
        // The last bytes again at the front: a string across two pieces is still found.
        kept = end.min(OVERLAP);
        buf.copy_within(end - kept..end, 0);
    }
    None
}

/// `NCCL version X.Y.Z` in a library's bytes, as `ncclGetVersion` codes it.
pub fn version_in(bytes: &[u8]) -> Option<Version> {
    const NEEDLE: &[u8] = b"NCCL version ";
    let mut from = 0;
    while let Some(i) = bytes[from..]
        .windows(NEEDLE.len())
        .position(|w| w == NEEDLE)
    {
        let at = from + i + NEEDLE.len();
        let tail = &bytes[at..bytes.len().min(at + 16)];
        let text: String = tail
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .map(|b| *b as char)
            .collect();
        let parts: Vec<i32> = text.split('.').filter_map(|s| s.parse().ok()).collect();
        if let [x, y, z] = parts[..] {
            let code = if x > 2 || (x == 2 && y >= 9) {
                x * 10000 + y * 100 + z
            } else {
                x * 1000 + y * 100 + z
            };
            return Some(Version(code));
        }
        from = at;
    }
    None
}

/// A fresh ring in a memfd, mapped twice: the agent's writing side, and the side the pump
/// reads as a registered process's region.
fn rings(geometry: Geometry) -> Result<(Region, Region), String> {
    let size = geometry.total_size();
    // SAFETY: a NUL-terminated name and no flags beyond close-on-exec.
    let fd = unsafe { libc::memfd_create(c"commscope-zero-touch".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "memfd_create failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a new descriptor this function owns from here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let file = std::fs::File::from(fd);
    file.set_len(size as u64)
        .map_err(|e| format!("cannot size the ring ({size} bytes): {e}"))?;
    format_ring(&file, size, geometry)?;
    let dup = file
        .try_clone()
        .map_err(|e| format!("cannot duplicate the ring's descriptor: {e}"))?;
    let mine = Region::map(OwnedFd::from(file)).map_err(|e| e.to_string())?;
    let theirs = Region::map(OwnedFd::from(dup)).map_err(|e| e.to_string())?;
    // As the preload does with an agent on its node: every record is kept for the agent.
    mine.shm().set_state(commscope_wire::shm::state::ACTIVE);
    mine.shm()
        .attach_consumer(commscope_wire::shm::Consumer::Agent);
    Ok((mine, theirs))
}

/// Writes a fresh region's header into the memfd.
fn format_ring(file: &std::fs::File, size: usize, geometry: Geometry) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    // SAFETY: mapping `size` bytes of a memfd of that size, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!(
            "cannot map the ring: {}",
            std::io::Error::last_os_error()
        ));
    }
    let base = std::ptr::NonNull::new(p.cast::<u8>()).ok_or("mmap returned null")?;
    // SAFETY: a fresh, zero-filled, page-aligned mapping of `size` bytes, unmapped below only
    // after the view is dropped.
    let r = unsafe { Shm::format(base, size, geometry) }.map(drop);
    // SAFETY: unmapping what was mapped above; the view is gone.
    unsafe { libc::munmap(p, size) };
    r.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
