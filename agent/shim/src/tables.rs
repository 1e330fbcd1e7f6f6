//! Fixed-size, lock-free-for-readers tables the hot path uses: communicators by handle, pending
//! nonblocking requests by handle, and point-to-point sequence counters.
//!
//! All are open-addressing arrays allocated once at activation; nothing allocates afterwards.
//! When a table is full the caller counts a drop and records what it can.

use std::cell::UnsafeCell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use commscope_wire::hash::splitmix64;
use commscope_wire::op::{OP_COUNT, Op, flags};
use commscope_wire::record::Call;

const EMPTY: u64 = 0;
const TOMB: u64 = u64::MAX;
const BUSY: u64 = u64::MAX - 1;
/// Longest probe sequence for the request and p2p tables.
const MAX_PROBE: usize = 64;

/// Communicator flags.
pub mod comm_flags {
    /// The id is local to this process.
    pub const LOCAL_ID: u32 = 1;
    /// An intercommunicator.
    pub const INTERCOMM: u32 = 2;
}

/// What commscope knows about one live communicator.
#[derive(Debug, Default)]
pub struct CommEntry {
    key: AtomicU64,
    pub id: AtomicU64,
    /// Collective calls so far (the next call's `seq`).
    pub seq: AtomicU64,
    /// Per-op calls so far.
    pub op_seq: [AtomicU64; OP_COUNT],
    /// Communicators created from this one by constructors collective over it.
    pub children: AtomicU64,
    pub size: AtomicI32,
    pub rank: AtomicI32,
    pub remote_size: AtomicI32,
    pub flags: AtomicU32,
    /// A topology communicator's neighbours this rank receives from and sends to (0 without a
    /// topology), for the neighbourhood collectives' sizes.
    pub indegree: AtomicI32,
    pub outdegree: AtomicI32,
}

impl CommEntry {
    /// The flags a call on this communicator carries (`LOCAL_COMM_ID`, `INTERCOMM`).
    #[inline]
    pub fn call_flags(&self) -> u16 {
        let f = self.flags.load(Ordering::Relaxed);
        let mut out = 0;
        if f & comm_flags::LOCAL_ID != 0 {
            out |= flags::LOCAL_COMM_ID;
        }
        if f & comm_flags::INTERCOMM != 0 {
            out |= flags::INTERCOMM;
        }
        out
    }

    /// Stamps a call with this communicator: its id, the caller's rank in it, its size, flags.
    #[inline]
    pub fn stamp(&self, call: &mut Call) {
        call.comm_id = self.id.load(Ordering::Relaxed);
        call.comm_rank = self.rank.load(Ordering::Relaxed);
        call.comm_size = self.size.load(Ordering::Relaxed);
        call.flags |= self.call_flags();
    }

    /// Numbers a collective as this communicator's next instance (`seq`, and `op_seq` for its
    /// op). The libraries require one order of collectives per communicator on every member, so
    /// no two threads of a correct program issue them concurrently: a plain load and store
    /// suffice (no locked read-modify-write on the hot path).
    #[inline]
    pub fn next_instance(&self, call: &mut Call, op: Op) {
        call.seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(call.seq + 1, Ordering::Relaxed);
        let per_op = &self.op_seq[op as usize];
        call.op_seq = per_op.load(Ordering::Relaxed);
        per_op.store(call.op_seq + 1, Ordering::Relaxed);
    }
}

/// Communicators by normalized handle.
#[derive(Debug)]
pub struct CommTable {
    entries: Box<[CommEntry]>,
    write: Mutex<()>,
}

/// A communicator's identity, for inserting.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommInfo {
    pub id: u64,
    pub size: i32,
    pub rank: i32,
    pub remote_size: i32,
    pub flags: u32,
    pub indegree: i32,
    pub outdegree: i32,
}

impl CommTable {
    /// A table of `capacity` entries (a power of two).
    pub fn new(capacity: usize) -> CommTable {
        let capacity = capacity.next_power_of_two();
        CommTable {
            entries: (0..capacity).map(|_| CommEntry::default()).collect(),
            write: Mutex::new(()),
        }
    }

    fn start(&self, handle: u64) -> usize {
        splitmix64(handle) as usize & (self.entries.len() - 1)
    }

    /// The entry of a handle.
    #[inline]
    pub fn get(&self, handle: u64) -> Option<&CommEntry> {
        let n = self.entries.len();
        let start = self.start(handle);
        for i in 0..n {
            let e = &self.entries[(start + i) & (n - 1)];
            match e.key.load(Ordering::Acquire) {
                k if k == handle => return Some(e),
                EMPTY => return None,
                _ => {}
            }
        }
        None
    }

    /// Enters (or replaces) a handle. Returns `None` when the table is full.
    pub fn insert(&self, handle: u64, info: CommInfo) -> Option<&CommEntry> {
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = self.get(handle) {
            e.key.store(TOMB, Ordering::Release);
        }
        let n = self.entries.len();
        let start = self.start(handle);
        for i in 0..n {
            let e = &self.entries[(start + i) & (n - 1)];
            let k = e.key.load(Ordering::Acquire);
            if k == EMPTY || k == TOMB {
                e.id.store(info.id, Ordering::Relaxed);
                e.seq.store(0, Ordering::Relaxed);
                for c in &e.op_seq {
                    c.store(0, Ordering::Relaxed);
                }
                e.children.store(0, Ordering::Relaxed);
                e.size.store(info.size, Ordering::Relaxed);
                e.rank.store(info.rank, Ordering::Relaxed);
                e.remote_size.store(info.remote_size, Ordering::Relaxed);
                e.flags.store(info.flags, Ordering::Relaxed);
                e.indegree.store(info.indegree, Ordering::Relaxed);
                e.outdegree.store(info.outdegree, Ordering::Relaxed);
                e.key.store(handle, Ordering::Release);
                return Some(e);
            }
        }
        None
    }

    /// Forgets a handle (after `MPI_Comm_free`): returns its id.
    pub fn remove(&self, handle: u64) -> Option<u64> {
        let _w = self.write.lock().unwrap_or_else(|p| p.into_inner());
        let e = self.get(handle)?;
        let id = e.id.load(Ordering::Relaxed);
        e.key.store(TOMB, Ordering::Release);
        Some(id)
    }
}

/// A nonblocking call waiting for its completion.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pending {
    /// The record so far (everything but `t_exit` and what the status tells).
    pub call: Call,
    /// Its in-flight slot.
    pub slot: crate::state::Slot,
    /// A receive whose p2p sequence is assigned at completion (wildcard source or tag).
    pub seq_at_completion: bool,
    /// The communicator's normalized handle (persistent requests look up `seq` at each start).
    pub comm: u64,
    /// A receive's datatype handle, to count what arrived (0 for anything else).
    pub dtype: u64,
}

/// A message matched by `MPI_Mprobe`/`MPI_Improbe`, waiting for its `MPI_Mrecv`/`MPI_Imrecv`
/// (which name only the message, not its communicator).
#[derive(Clone, Copy, Debug, Default)]
pub struct Probed {
    /// The communicator's handle.
    pub comm: usize,
    /// The message's source and tag, from the probe's status.
    pub source: i32,
    pub tag: i32,
    /// The probe's wildcards (`ANY_SOURCE`, `ANY_TAG`).
    pub flags: u16,
    /// When the probe that matched it was entered: the receive waited from then.
    pub t_enter: u64,
}

/// Matched messages by normalized handle: a small map, taken only by the matched-probe calls.
#[derive(Debug, Default)]
pub struct ProbedTable {
    map: std::sync::Mutex<std::collections::HashMap<u64, Probed>>,
}

impl ProbedTable {
    /// Most messages kept at once; a program that probes but never receives cannot grow it.
    pub const MAX: usize = 4096;

    /// Notes a matched message; false when the table is full.
    pub fn insert(&self, h: u64, p: Probed) -> bool {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= Self::MAX && !m.contains_key(&h) {
            return false;
        }
        m.insert(h, p);
        true
    }

    /// Takes a message out.
    pub fn take(&self, h: u64) -> Option<Probed> {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&h)
    }
}

struct ReqEntry {
    key: AtomicU64,
    data: UnsafeCell<Pending>,
}

/// Pending nonblocking requests by normalized handle.
pub struct RequestTable {
    entries: Box<[ReqEntry]>,
    live: AtomicUsize,
}

impl std::fmt::Debug for RequestTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTable")
            .field("capacity", &self.entries.len())
            .field("live", &self.len())
            .finish()
    }
}

// SAFETY: an entry's `data` is written only by the thread that moved its key from EMPTY/TOMB to
// BUSY, and read only by the thread that moved it from the handle to BUSY; the key's
// release/acquire transitions order those accesses.
unsafe impl Sync for RequestTable {}
// SAFETY: as above; the table owns plain data.
unsafe impl Send for RequestTable {}

impl RequestTable {
    /// A table of `capacity` entries (a power of two).
    pub fn new(capacity: usize) -> RequestTable {
        let capacity = capacity.next_power_of_two();
        RequestTable {
            entries: (0..capacity)
                .map(|_| ReqEntry {
                    key: AtomicU64::new(EMPTY),
                    data: UnsafeCell::new(Pending::default()),
                })
                .collect(),
            live: AtomicUsize::new(0),
        }
    }

    /// Number of pending requests.
    #[inline]
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// Whether no request is pending (the fast path of every wait/test).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn probe(&self, handle: u64) -> impl Iterator<Item = &ReqEntry> {
        let n = self.entries.len();
        let start = splitmix64(handle) as usize;
        (0..MAX_PROBE.min(n)).map(move |i| &self.entries[(start + i) & (n - 1)])
    }

    /// Adds a pending request; false when the table is full.
    ///
    /// One handle may be pending several times: Open MPI hands out the same completed request
    /// object for every nonblocking call that finished at once (small eager sends), and the
    /// application waits on that handle once per call.
    pub fn insert(&self, handle: u64, p: Pending) -> bool {
        if handle == EMPTY || handle >= BUSY {
            return false;
        }
        for e in self.probe(handle) {
            let k = e.key.load(Ordering::Relaxed);
            if (k == EMPTY || k == TOMB)
                && e.key
                    .compare_exchange(k, BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                // SAFETY: this thread holds the entry (BUSY).
                unsafe { *e.data.get() = p };
                e.key.store(handle, Ordering::Release);
                self.live.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        }
        false
    }

    /// Removes and returns the pending request of a handle (the oldest, when one handle is
    /// pending several times).
    #[inline]
    pub fn take(&self, handle: u64) -> Option<Pending> {
        if self.is_empty() || handle == EMPTY || handle >= BUSY {
            return None;
        }
        for _attempt in 0..4 {
            let mut best: Option<(&ReqEntry, u64)> = None;
            for e in self.probe(handle) {
                let k = e.key.load(Ordering::Acquire);
                if k == handle {
                    // SAFETY: an entry keyed by a handle is fully written (release store of the
                    // key) and changes only after a taker moves it to BUSY; a racing taker makes
                    // the compare-and-swap below fail and this search repeat.
                    let t = unsafe { (*e.data.get()).call.t_enter };
                    if best.is_none_or(|(_, bt)| t < bt) {
                        best = Some((e, t));
                    }
                } else if k == EMPTY {
                    break;
                }
            }
            let (e, _) = best?;
            if e.key
                .compare_exchange(handle, BUSY, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: this thread holds the entry (BUSY).
                let p = unsafe { *e.data.get() };
                e.key.store(TOMB, Ordering::Release);
                self.live.fetch_sub(1, Ordering::Relaxed);
                return Some(p);
            }
        }
        None
    }

    /// A copy of the entry of a handle, left in place (persistent request templates).
    #[inline]
    pub fn get(&self, handle: u64) -> Option<Pending> {
        if self.is_empty() || handle == EMPTY || handle >= BUSY {
            return None;
        }
        for e in self.probe(handle) {
            let k = e.key.load(Ordering::Acquire);
            if k == handle {
                // SAFETY: an entry keyed by a handle is fully written; templates change only when
                // their request is freed, which the application does not do while starting it.
                return Some(unsafe { *e.data.get() });
            }
            if k == EMPTY {
                return None;
            }
        }
        None
    }

    /// Whether a handle is pending (without taking it).
    #[inline]
    pub fn contains(&self, handle: u64) -> bool {
        !self.is_empty()
            && self
                .probe(handle)
                .take_while(|e| e.key.load(Ordering::Relaxed) != EMPTY)
                .any(|e| e.key.load(Ordering::Acquire) == handle)
    }
}

/// Point-to-point sequence counters per (communicator, peer, tag, direction).
#[derive(Debug)]
pub struct P2pTable {
    keys: Box<[AtomicU64]>,
    counters: Box<[AtomicU64]>,
}

/// Direction of a point-to-point message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Send = 1,
    Recv = 2,
}

impl Dir {
    /// The direction of a point-to-point op's message (a send-receive's first half: its send).
    pub fn of(op: Op) -> Dir {
        if op == Op::Recv { Dir::Recv } else { Dir::Send }
    }
}

impl P2pTable {
    /// A table of `capacity` counters (a power of two).
    pub fn new(capacity: usize) -> P2pTable {
        let capacity = capacity.next_power_of_two();
        P2pTable {
            keys: (0..capacity).map(|_| AtomicU64::new(EMPTY)).collect(),
            counters: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The next sequence number for a (comm, peer, tag, direction), counting from 0; `None` when
    /// the table is full.
    #[inline]
    pub fn next(&self, comm: u64, peer: i32, tag: i32, dir: Dir) -> Option<u64> {
        let mut key = commscope_wire::hash::Hasher::new()
            .word(comm)
            .word(dir as u64)
            .word(u64::from(peer as u32) | u64::from(tag as u32) << 32)
            .finish();
        if key == EMPTY || key >= BUSY {
            key = 1;
        }
        let n = self.keys.len();
        let start = splitmix64(key) as usize;
        for i in 0..MAX_PROBE.min(n) {
            let idx = (start + i) & (n - 1);
            let k = self.keys[idx].load(Ordering::Acquire);
            if k == key {
                return Some(self.counters[idx].fetch_add(1, Ordering::Relaxed));
            }
            if k == EMPTY {
                match self.keys[idx].compare_exchange(
                    EMPTY,
                    key,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return Some(self.counters[idx].fetch_add(1, Ordering::Relaxed)),
                    Err(now) if now == key => {
                        return Some(self.counters[idx].fetch_add(1, Ordering::Relaxed));
                    }
                    Err(_) => {}
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_table_follows_create_and_free_with_handle_reuse() {
        let t = CommTable::new(8);
        let a = t
            .insert(
                0x44000000,
                CommInfo {
                    id: 1,
                    size: 8,
                    rank: 0,
                    ..Default::default()
                },
            )
            .expect("room");
        a.seq.fetch_add(5, Ordering::Relaxed);
        assert_eq!(
            t.get(0x44000000).map(|e| e.id.load(Ordering::Relaxed)),
            Some(1)
        );
        assert_eq!(t.remove(0x44000000), Some(1));
        assert!(t.get(0x44000000).is_none());
        // The handle is reused by a new communicator: fresh counters.
        let b = t
            .insert(
                0x44000000,
                CommInfo {
                    id: 2,
                    size: 4,
                    rank: 1,
                    ..Default::default()
                },
            )
            .expect("room");
        assert_eq!(b.seq.load(Ordering::Relaxed), 0);
        assert_eq!(
            t.get(0x44000000).map(|e| e.id.load(Ordering::Relaxed)),
            Some(2)
        );
        for h in 1..8u64 {
            assert!(t.insert(h, CommInfo::default()).is_some());
        }
        assert!(t.insert(100, CommInfo::default()).is_none(), "full table");
    }

    #[test]
    fn requests_are_taken_once() {
        let t = RequestTable::new(16);
        let p = Pending {
            call: Call {
                seq: 9,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(t.insert(77, p));
        assert!(t.contains(77));
        assert_eq!(t.len(), 1);
        assert_eq!(t.take(77).map(|p| p.call.seq), Some(9));
        assert!(t.take(77).is_none());
        assert!(t.is_empty());
        // One handle pending twice (a shared completed request): taken oldest first.
        let newer = Pending {
            call: Call {
                seq: 2,
                t_enter: 20,
                ..Default::default()
            },
            ..Default::default()
        };
        let older = Pending {
            call: Call {
                seq: 1,
                t_enter: 10,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(t.insert(5, newer) && t.insert(5, older));
        assert_eq!(t.take(5).map(|p| p.call.seq), Some(1));
        assert_eq!(t.take(5).map(|p| p.call.seq), Some(2));
        assert!(t.take(5).is_none());
    }

    #[test]
    fn p2p_counters_are_per_key() {
        let t = P2pTable::new(64);
        assert_eq!(t.next(1, 2, 3, Dir::Send), Some(0));
        assert_eq!(t.next(1, 2, 3, Dir::Send), Some(1));
        assert_eq!(t.next(1, 2, 3, Dir::Recv), Some(0));
        assert_eq!(t.next(1, 2, 4, Dir::Send), Some(0));
        assert_eq!(t.next(2, 2, 3, Dir::Send), Some(0));
    }
}
