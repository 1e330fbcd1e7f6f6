//! The shared-memory region a traced process shares with its node agent: a header, the
//! in-flight table and the record ring, in one memfd.
//!
//! ```text
//! 0        header (4096 bytes): identity, geometry, ring cursors (one cache line each), counters
//! 4096     in-flight table: `slots` × 128 bytes
//! …        ring: `capacity` × 128-byte records (capacity a power of two)
//! ```
//!
//! The ring is multi-producer (every thread of the process that calls the library) and has two
//! consumers with their own read cursors: the agent (in another process) and the shim's local
//! trace writer. A producer reserves a position by compare-and-swap on `head`, but only while
//! `head - floor < capacity`, where `floor` is the slowest attached consumer's cursor;
//! otherwise it counts a drop and returns. It writes the record's body and then publishes it
//! by storing `rec_seq = position + 1` (release). A consumer reads position `p` once its
//! `rec_seq` is `p + 1` (acquire), and advances its cursor only when it is done with the record
//! (for the agent: once the collector acknowledged it or it is spooled), so an agent restart
//! loses nothing still in the ring.
//!
//! The in-flight table holds one slot per call in progress. A thread claims a free slot by
//! compare-and-swap on its owner word, writes the fields under a per-slot sequence lock, and
//! frees it when the call completes; readers in other processes take consistent snapshots.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::record::{RECORD_SIZE, RawRecord};

/// `"CSCOPESH"`: the first 8 bytes of every region.
pub const SHM_MAGIC: u64 = u64::from_le_bytes(*b"CSCOPESH");
/// The layout version; a reader rejects regions of another version. Version 2 grew the
/// in-flight slot to 128 bytes: a call in flight carries its whole signature (count, datatype,
/// reduction), so members that disagree are told apart while none can complete.
pub const LAYOUT_VERSION: u32 = 2;
/// Size of the header.
pub const HEADER_SIZE: usize = 4096;
/// Size of one in-flight slot.
pub const IN_FLIGHT_SLOT_SIZE: usize = 128;
/// 64-bit words in one in-flight slot.
const SLOT_WORDS: usize = IN_FLIGHT_SLOT_SIZE / 8;
/// Length of the job and node name fields in the header.
pub const NAME_FIELD: usize = 64;

// Header offsets.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_HEADER_SIZE: usize = 12;
const H_TOTAL: usize = 16;
const H_RING_OFF: usize = 24;
const H_RING_CAP: usize = 32;
const H_INFL_OFF: usize = 40;
const H_INFL_SLOTS: usize = 48;
const H_RECORD_SIZE: usize = 52;
const H_PID: usize = 56;
const H_RANK: usize = 60;
const H_WORLD: usize = 64;
const H_STATE: usize = 68;
const H_START_TIME: usize = 72;
const H_BEAT: usize = 80;
const H_JOB: usize = 128;
const H_NODE: usize = 192;
const H_HEAD: usize = 256;
const H_AGENT_READ: usize = 320;
const H_LOCAL_READ: usize = 384;
const H_CONSUMERS: usize = 448;
const H_COUNTERS: usize = 512;

/// Process states published in the header.
pub mod state {
    /// Loaded, not yet active (before `MPI_Init` / the first NCCL call).
    pub const DORMANT: u32 = 0;
    /// Recording.
    pub const ACTIVE: u32 = 1;
    /// Finalized cleanly (`MPI_Finalize`, exit).
    pub const FINALIZED: u32 = 2;
    /// Turned into a pure pass-through after an internal failure.
    pub const FAILED: u32 = 3;
}

/// Which ring consumer a cursor belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    /// The node agent (another process).
    Agent,
    /// The shim's own trace-file writer.
    Local,
}

impl Consumer {
    fn bit(self) -> u32 {
        match self {
            Consumer::Agent => 1,
            Consumer::Local => 2,
        }
    }
    fn offset(self) -> usize {
        match self {
            Consumer::Agent => H_AGENT_READ,
            Consumer::Local => H_LOCAL_READ,
        }
    }
}

/// Drop and health counters kept in the header (indices into the counter array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Records not written because the ring was full.
    DroppedRingFull = 0,
    /// Calls not entered into the in-flight table because it was full.
    DroppedInFlight = 1,
    /// Nonblocking requests whose completion could not be tracked (request table full).
    DroppedRequests = 2,
    /// Point-to-point sequence numbers not assigned (p2p table full).
    DroppedP2pSeq = 3,
    /// Communicators that could not be entered into the communicator table.
    DroppedComms = 4,
    /// Calls not recorded because of an internal error (the shim became a pass-through).
    DroppedInternal = 5,
    /// Records that a consumer found overwritten before it read them.
    ConsumerOverrun = 6,
    /// Trace-file writes that failed.
    TraceWriteErrors = 7,
}

/// Whether a producer that read the head at `pos` would overwrite a record the slowest consumer
/// (at `floor`) has not read. `pos` may be stale: other producers can have pushed, and the
/// consumer read, past it since. A floor beyond `pos` then means the ring had room, not that it
/// was full; the reservation that follows fails and retries with the current head.
#[inline]
fn ring_full(pos: u64, floor: u64, cap: u64) -> bool {
    pos.saturating_sub(floor) >= cap
}

/// Number of counters.
pub const COUNTER_COUNT: usize = 8;

/// Why a region cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// The region is smaller than its header says, or than a header.
    TooSmall { have: usize, need: usize },
    /// The magic number is wrong: not a commscope region.
    BadMagic,
    /// The layout version is newer than this reader supports.
    NewerVersion { found: u32, supported: u32 },
    /// The geometry fields are inconsistent.
    BadGeometry(&'static str),
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::TooSmall { have, need } => {
                write!(f, "shared-memory region is {have} bytes, needs {need}")
            }
            LayoutError::BadMagic => write!(f, "not a commscope shared-memory region (bad magic)"),
            LayoutError::NewerVersion { found, supported } => write!(
                f,
                "shared-memory layout version {found} is newer than the supported version {supported}; upgrade commscope"
            ),
            LayoutError::BadGeometry(what) => {
                write!(f, "inconsistent shared-memory geometry: {what}")
            }
        }
    }
}

impl std::error::Error for LayoutError {}

/// The region's geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Ring capacity in records (a power of two).
    pub ring_capacity: u64,
    /// In-flight slots.
    pub in_flight_slots: u32,
}

impl Geometry {
    /// Offset of the in-flight table.
    pub fn in_flight_offset(&self) -> usize {
        HEADER_SIZE
    }
    /// Offset of the ring.
    pub fn ring_offset(&self) -> usize {
        HEADER_SIZE + self.in_flight_slots as usize * IN_FLIGHT_SLOT_SIZE
    }
    /// Total size in bytes.
    pub fn total_size(&self) -> usize {
        self.ring_offset() + self.ring_capacity as usize * RECORD_SIZE
    }
}

/// What a consumer found at a ring position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// The record at this position (copied out).
    Ready,
    /// Nothing published here yet.
    Pending,
    /// The slot already holds a later record: the consumer fell more than a ring behind.
    Overwritten,
}

/// An entry of the in-flight table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    pub comm_id: u64,
    /// The instance's `seq` (collectives) or p2p sequence.
    pub seq: u64,
    pub t_enter: u64,
    pub bytes: u64,
    pub op: u8,
    /// See [`in_flight_status`].
    pub status: u8,
    pub flags: u16,
    pub peer: i32,
    pub tag: i32,
    /// Kernel thread id of the caller.
    pub tid: u32,
    pub comm_rank: i32,
    /// Elements, datatype and reduction, as in the call's record (the signature members of a
    /// collective instance must agree on).
    pub count: u64,
    pub dtype: u16,
    pub red_op: u8,
}

impl InFlight {
    /// The `enter` record of this call, made by `rank`'s process through library `lib`
    /// (`crate::op::lib`): a call in flight, not completed (yet).
    pub fn enter_record(&self, rank: i32, lib: u8) -> crate::record::Call {
        let p2p = crate::op::Op::from_code(self.op).is_p2p();
        crate::record::Call {
            op: self.op,
            flags: self.flags,
            comm_id: self.comm_id,
            seq: if p2p { 0 } else { self.seq },
            op_seq: if p2p { self.seq } else { 0 },
            bytes: self.bytes,
            count: self.count,
            dtype: self.dtype,
            red_op: self.red_op,
            peer: self.peer,
            tag: self.tag,
            t_enter: self.t_enter,
            rank,
            comm_rank: self.comm_rank,
            peer2: -1,
            tag2: -1,
            lib,
            ..Default::default()
        }
    }
}

/// Values of [`InFlight::status`].
pub mod in_flight_status {
    /// The caller is inside a blocking call.
    pub const IN_CALL: u8 = 1;
    /// A nonblocking call was posted and its completion not yet observed.
    pub const POSTED: u8 = 2;
    /// Enqueued to a GPU; waiting for its end event.
    pub const ON_GPU: u8 = 3;
    /// Enqueued to a GPU, seen from the host only (the node agent's uprobes, for a process
    /// without the preload): the rank's latest collective on the communicator, whose completion
    /// is unknown. It says the rank issued it, not that it waits in it.
    pub const ISSUED: u8 = 4;
}

/// A view of a region. It does not own the memory: whoever mapped it keeps it mapped for as long
/// as the view lives (the shim never unmaps; the agent unmaps after dropping the view).
#[derive(Debug)]
pub struct Shm {
    base: NonNull<u8>,
    len: usize,
    geometry: Geometry,
}

// SAFETY: all shared state in the region is accessed through atomics or, for ring slots, under
// the publication protocol described in the module docs.
unsafe impl Send for Shm {}
// SAFETY: as above.
unsafe impl Sync for Shm {}

impl Shm {
    /// Formats a fresh region.
    ///
    /// # Safety
    /// `base` must point to `len` writable bytes, zero-filled (a new memfd mapping is), aligned to
    /// 64 bytes, that stay mapped for the life of the returned view and of every copy made by
    /// [`Shm::attach`].
    pub unsafe fn format(
        base: NonNull<u8>,
        len: usize,
        geometry: Geometry,
    ) -> Result<Shm, LayoutError> {
        if !geometry.ring_capacity.is_power_of_two() {
            return Err(LayoutError::BadGeometry(
                "ring capacity is not a power of two",
            ));
        }
        if len < geometry.total_size() {
            return Err(LayoutError::TooSmall {
                have: len,
                need: geometry.total_size(),
            });
        }
        let shm = Shm {
            base,
            len,
            geometry,
        };
        shm.u32_at(H_VERSION)
            .store(LAYOUT_VERSION, Ordering::Relaxed);
        shm.u32_at(H_HEADER_SIZE)
            .store(HEADER_SIZE as u32, Ordering::Relaxed);
        shm.u64_at(H_TOTAL)
            .store(geometry.total_size() as u64, Ordering::Relaxed);
        shm.u64_at(H_RING_OFF)
            .store(geometry.ring_offset() as u64, Ordering::Relaxed);
        shm.u64_at(H_RING_CAP)
            .store(geometry.ring_capacity, Ordering::Relaxed);
        shm.u64_at(H_INFL_OFF)
            .store(geometry.in_flight_offset() as u64, Ordering::Relaxed);
        shm.u32_at(H_INFL_SLOTS)
            .store(geometry.in_flight_slots, Ordering::Relaxed);
        shm.u32_at(H_RECORD_SIZE)
            .store(RECORD_SIZE as u32, Ordering::Relaxed);
        shm.u64_at(H_MAGIC).store(SHM_MAGIC, Ordering::Release);
        Ok(shm)
    }

    /// Opens an existing region (the agent's side), validating its header.
    ///
    /// # Safety
    /// `base` must point to `len` readable and writable bytes, aligned to 64 bytes, that stay
    /// mapped for the life of the returned view.
    pub unsafe fn attach(base: NonNull<u8>, len: usize) -> Result<Shm, LayoutError> {
        if len < HEADER_SIZE {
            return Err(LayoutError::TooSmall {
                have: len,
                need: HEADER_SIZE,
            });
        }
        let probe = Shm {
            base,
            len,
            geometry: Geometry {
                ring_capacity: 1,
                in_flight_slots: 0,
            },
        };
        if probe.u64_at(H_MAGIC).load(Ordering::Acquire) != SHM_MAGIC {
            return Err(LayoutError::BadMagic);
        }
        let version = probe.u32_at(H_VERSION).load(Ordering::Relaxed);
        if version > LAYOUT_VERSION {
            return Err(LayoutError::NewerVersion {
                found: version,
                supported: LAYOUT_VERSION,
            });
        }
        if probe.u32_at(H_HEADER_SIZE).load(Ordering::Relaxed) as usize != HEADER_SIZE
            || probe.u32_at(H_RECORD_SIZE).load(Ordering::Relaxed) as usize != RECORD_SIZE
        {
            return Err(LayoutError::BadGeometry("header or record size"));
        }
        let geometry = Geometry {
            ring_capacity: probe.u64_at(H_RING_CAP).load(Ordering::Relaxed),
            in_flight_slots: probe.u32_at(H_INFL_SLOTS).load(Ordering::Relaxed),
        };
        if !geometry.ring_capacity.is_power_of_two() || geometry.in_flight_slots > 1 << 20 {
            return Err(LayoutError::BadGeometry("ring capacity or in-flight slots"));
        }
        if probe.u64_at(H_RING_OFF).load(Ordering::Relaxed) != geometry.ring_offset() as u64
            || probe.u64_at(H_INFL_OFF).load(Ordering::Relaxed)
                != geometry.in_flight_offset() as u64
        {
            return Err(LayoutError::BadGeometry("section offsets"));
        }
        if len < geometry.total_size() {
            return Err(LayoutError::TooSmall {
                have: len,
                need: geometry.total_size(),
            });
        }
        Ok(Shm {
            base,
            len,
            geometry,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// The mapped length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a region has at least a header.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: `off` is a constant header offset or an offset computed from the validated
        // geometry, 8-aligned and inside the mapping; the mapping outlives `self`.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: as in `u64_at`, 4-aligned.
        unsafe { &*(self.base.as_ptr().add(off) as *const AtomicU32) }
    }

    // ----- identity ------------------------------------------------------------------------

    /// Writes the identity fields (by the owning process, before registering).
    pub fn set_identity(
        &self,
        pid: u32,
        start_time: u64,
        rank: i32,
        world_size: i32,
        job: &str,
        node: &str,
    ) {
        self.u32_at(H_PID).store(pid, Ordering::Relaxed);
        self.u64_at(H_START_TIME)
            .store(start_time, Ordering::Relaxed);
        self.u32_at(H_RANK).store(rank as u32, Ordering::Relaxed);
        self.u32_at(H_WORLD)
            .store(world_size as u32, Ordering::Relaxed);
        self.write_name(H_JOB, job);
        self.write_name(H_NODE, node);
    }

    fn write_name(&self, off: usize, s: &str) {
        let bytes = s.as_bytes();
        let n = bytes.len().min(NAME_FIELD - 1);
        for i in 0..NAME_FIELD / 8 {
            let mut w = [0u8; 8];
            for (j, b) in w.iter_mut().enumerate() {
                let k = i * 8 + j;
                if k < n {
                    *b = bytes[k];
                }
            }
            self.u64_at(off + i * 8)
                .store(u64::from_le_bytes(w), Ordering::Relaxed);
        }
    }

    fn read_name(&self, off: usize) -> String {
        let mut out = Vec::with_capacity(NAME_FIELD);
        for i in 0..NAME_FIELD / 8 {
            out.extend_from_slice(
                &self
                    .u64_at(off + i * 8)
                    .load(Ordering::Relaxed)
                    .to_le_bytes(),
            );
        }
        let end = out.iter().position(|&b| b == 0).unwrap_or(out.len());
        String::from_utf8_lossy(&out[..end]).into_owned()
    }

    /// The process id written by the owner.
    pub fn pid(&self) -> u32 {
        self.u32_at(H_PID).load(Ordering::Relaxed)
    }
    /// The global rank written by the owner.
    pub fn rank(&self) -> i32 {
        self.u32_at(H_RANK).load(Ordering::Relaxed) as i32
    }
    /// The world size written by the owner.
    pub fn world_size(&self) -> i32 {
        self.u32_at(H_WORLD).load(Ordering::Relaxed) as i32
    }
    /// The process start time (clock ticks since boot).
    pub fn start_time(&self) -> u64 {
        self.u64_at(H_START_TIME).load(Ordering::Relaxed)
    }
    /// The job id.
    pub fn job(&self) -> String {
        self.read_name(H_JOB)
    }
    /// The node name.
    pub fn node(&self) -> String {
        self.read_name(H_NODE)
    }
    /// See [`state`].
    pub fn state(&self) -> u32 {
        self.u32_at(H_STATE).load(Ordering::Acquire)
    }
    /// Publishes a new [`state`].
    pub fn set_state(&self, s: u32) {
        self.u32_at(H_STATE).store(s, Ordering::Release)
    }
    /// Host monotonic time of the owner's last heartbeat.
    pub fn last_beat(&self) -> u64 {
        self.u64_at(H_BEAT).load(Ordering::Acquire)
    }
    /// Records a heartbeat time.
    pub fn beat(&self, t_mono: u64) {
        self.u64_at(H_BEAT).store(t_mono, Ordering::Release)
    }

    // ----- counters --------------------------------------------------------------------------

    /// Adds to a counter.
    #[inline]
    pub fn count(&self, c: Counter, n: u64) {
        self.u64_at(H_COUNTERS + c as usize * 8)
            .fetch_add(n, Ordering::Relaxed);
    }
    /// Reads a counter.
    pub fn counter(&self, c: Counter) -> u64 {
        self.u64_at(H_COUNTERS + c as usize * 8)
            .load(Ordering::Relaxed)
    }

    // ----- ring: producers -------------------------------------------------------------------

    /// The next position a producer will reserve (records produced so far).
    pub fn head(&self) -> u64 {
        self.u64_at(H_HEAD).load(Ordering::Acquire)
    }

    /// The slowest attached consumer's cursor.
    fn floor(&self) -> u64 {
        let attached = self.u32_at(H_CONSUMERS).load(Ordering::Acquire);
        let agent = self.u64_at(H_AGENT_READ).load(Ordering::Acquire);
        if attached & Consumer::Local.bit() == 0 {
            return agent;
        }
        let local = self.u64_at(H_LOCAL_READ).load(Ordering::Acquire);
        if attached & Consumer::Agent.bit() == 0 {
            local
        } else {
            agent.min(local)
        }
    }

    /// Appends a record: `body` fills bytes 8..128; `rec_seq` (returned) is assigned here.
    /// Returns `None`, after counting the drop, when the ring is full. Never blocks.
    #[inline]
    pub fn push(&self, body: &RawRecord) -> Option<u64> {
        let cap = self.geometry.ring_capacity;
        let head = self.u64_at(H_HEAD);
        let mut pos = head.load(Ordering::Relaxed);
        loop {
            if ring_full(pos, self.floor(), cap) {
                self.count(Counter::DroppedRingFull, 1);
                return None;
            }
            match head.compare_exchange_weak(pos, pos + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(now) => pos = now,
            }
        }
        let slot = self.slot_ptr(pos);
        // SAFETY: position `pos` is reserved for this producer alone, and every consumer has
        // moved past `pos - capacity` (checked against `floor` above), so nobody reads this
        // slot until `rec_seq` is published below. Bytes 8..128 lie inside the slot.
        unsafe {
            std::ptr::copy_nonoverlapping(body.as_ptr().add(8), slot.add(8), RECORD_SIZE - 8);
        }
        let rec_seq = pos + 1;
        // SAFETY: the slot start is 128-aligned inside the mapping.
        unsafe { &*(slot as *const AtomicU64) }.store(rec_seq, Ordering::Release);
        Some(rec_seq)
    }

    fn slot_ptr(&self, pos: u64) -> *mut u8 {
        let idx = (pos & (self.geometry.ring_capacity - 1)) as usize;
        // SAFETY: idx < capacity, so the slot lies inside the ring section of the mapping.
        unsafe {
            self.base
                .as_ptr()
                .add(self.geometry.ring_offset() + idx * RECORD_SIZE)
        }
    }

    // ----- ring: consumers -------------------------------------------------------------------

    /// Attaches a consumer. Its cursor starts at the oldest record still guaranteed intact
    /// (the current floor) unless it is already further on (a consumer re-attaching resumes).
    pub fn attach_consumer(&self, c: Consumer) {
        let attached = self.u32_at(H_CONSUMERS).load(Ordering::Acquire);
        if attached & c.bit() != 0 {
            return;
        }
        let start = if attached == 0 {
            self.u64_at(H_AGENT_READ).load(Ordering::Acquire)
        } else {
            self.floor()
        };
        let cursor = self.u64_at(c.offset());
        if cursor.load(Ordering::Acquire) < start {
            cursor.store(start, Ordering::Release);
        }
        self.u32_at(H_CONSUMERS).fetch_or(c.bit(), Ordering::AcqRel);
    }

    /// Detaches a consumer (it stopped for good): producers no longer wait for it.
    pub fn detach_consumer(&self, c: Consumer) {
        self.u32_at(H_CONSUMERS)
            .fetch_and(!c.bit(), Ordering::AcqRel);
    }

    /// Whether a consumer is attached.
    pub fn is_attached(&self, c: Consumer) -> bool {
        self.u32_at(H_CONSUMERS).load(Ordering::Acquire) & c.bit() != 0
    }

    /// A consumer's cursor: the next position it will read.
    pub fn cursor(&self, c: Consumer) -> u64 {
        self.u64_at(c.offset()).load(Ordering::Acquire)
    }

    /// Moves a consumer's cursor forward (releasing the slots before `pos` to producers).
    pub fn advance(&self, c: Consumer, pos: u64) {
        self.u64_at(c.offset()).fetch_max(pos, Ordering::AcqRel);
    }

    /// Reads position `pos` into `out`.
    pub fn read(&self, pos: u64, out: &mut RawRecord) -> Slot {
        let slot = self.slot_ptr(pos);
        // SAFETY: the slot start is 128-aligned inside the mapping.
        let seq = unsafe { &*(slot as *const AtomicU64) }.load(Ordering::Acquire);
        if seq == pos + 1 {
            // SAFETY: the record at `pos` is published (acquire above) and stays intact until
            // this consumer's cursor passes `pos`.
            unsafe { std::ptr::copy_nonoverlapping(slot, out.as_mut_ptr(), RECORD_SIZE) };
            Slot::Ready
        } else if seq > pos + 1 {
            Slot::Overwritten
        } else {
            Slot::Pending
        }
    }

    /// Reads published records from `from` on, up to `max`, handing each to `f`. Returns the
    /// position after the last record read; it does not move the cursor. A consumer that fell
    /// behind (its records overwritten) skips to the oldest intact record and the skip is
    /// counted in [`Counter::ConsumerOverrun`].
    pub fn read_from(&self, mut from: u64, max: usize, mut f: impl FnMut(&RawRecord)) -> u64 {
        let mut buf = [0u8; RECORD_SIZE];
        let mut n = 0;
        while n < max {
            match self.read(from, &mut buf) {
                Slot::Ready => {
                    f(&buf);
                    from += 1;
                    n += 1;
                }
                Slot::Pending => break,
                Slot::Overwritten => {
                    let oldest = self.head().saturating_sub(self.geometry.ring_capacity);
                    let to = oldest.max(from + 1);
                    self.count(Counter::ConsumerOverrun, to - from);
                    from = to;
                }
            }
        }
        from
    }

    // ----- in-flight table -------------------------------------------------------------------

    fn in_flight_words(&self, idx: usize) -> &[AtomicU64; SLOT_WORDS] {
        debug_assert!(idx < self.geometry.in_flight_slots as usize);
        // SAFETY: idx < slots (checked by callers), so the slot lies inside the table.
        unsafe {
            &*(self
                .base
                .as_ptr()
                .add(self.geometry.in_flight_offset() + idx * IN_FLIGHT_SLOT_SIZE)
                as *const [AtomicU64; SLOT_WORDS])
        }
    }

    /// Claims a free slot, starting the search at `hint`, and fills it. Returns the slot index,
    /// or `None` (counted) when the table is full.
    #[inline]
    pub fn in_flight_claim(&self, hint: usize, e: &InFlight) -> Option<usize> {
        let n = self.geometry.in_flight_slots as usize;
        if n == 0 {
            self.count(Counter::DroppedInFlight, 1);
            return None;
        }
        let owner_token = u64::from(e.tid) | 1 << 32;
        for i in 0..n {
            let idx = (hint + i) % n;
            let w = self.in_flight_words(idx);
            if w[0].load(Ordering::Relaxed) == 0
                && w[0]
                    .compare_exchange(0, owner_token, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.in_flight_write(idx, e);
                return Some(idx);
            }
        }
        self.count(Counter::DroppedInFlight, 1);
        None
    }

    /// Runs `f` on slot `idx`'s words under its sequence lock (odd while writing; only the owner
    /// writes, so a load and a store suffice). `f` gets the upper half of the sequence word (the
    /// comm rank) and returns its new value.
    #[inline]
    fn in_flight_locked(&self, idx: usize, f: impl FnOnce(&[AtomicU64; SLOT_WORDS], u64) -> u64) {
        if idx >= self.geometry.in_flight_slots as usize {
            return;
        }
        let w = self.in_flight_words(idx);
        let v = w[7].load(Ordering::Relaxed);
        w[7].store(v | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        let upper = f(w, v >> 32);
        w[7].store(((v | 1) + 1) & 0xffff_ffff | upper << 32, Ordering::Release);
    }

    /// Rewrites a claimed slot (e.g. a status change).
    #[inline]
    pub fn in_flight_write(&self, idx: usize, e: &InFlight) {
        self.in_flight_locked(idx, |w, _| {
            w[1].store(e.comm_id, Ordering::Relaxed);
            w[2].store(e.seq, Ordering::Relaxed);
            w[3].store(e.t_enter, Ordering::Relaxed);
            w[4].store(e.bytes, Ordering::Relaxed);
            w[5].store(
                u64::from(e.op)
                    | u64::from(e.status) << 8
                    | u64::from(e.flags) << 16
                    | u64::from(e.tid) << 32,
                Ordering::Relaxed,
            );
            w[6].store(
                u64::from(e.peer as u32) | u64::from(e.tag as u32) << 32,
                Ordering::Relaxed,
            );
            w[8].store(e.count, Ordering::Relaxed);
            w[9].store(
                u64::from(e.dtype) | u64::from(e.red_op) << 16,
                Ordering::Relaxed,
            );
            // The comm rank rides in the upper half of the sequence word, beside the version.
            u64::from(e.comm_rank as u32)
        });
    }

    /// Marks a claimed slot idle (status 0) while keeping it: a thread keeps one such home
    /// slot for its blocking calls, so entering and leaving a call needs no atomic
    /// read-modify-write.
    #[inline]
    pub fn in_flight_leave(&self, idx: usize) {
        self.in_flight_locked(idx, |w, upper| {
            w[5].store(w[5].load(Ordering::Relaxed) & !0xff00, Ordering::Relaxed);
            upper
        });
    }

    /// Frees a claimed slot.
    #[inline]
    pub fn in_flight_release(&self, idx: usize) {
        if idx < self.geometry.in_flight_slots as usize {
            self.in_flight_words(idx)[0].store(0, Ordering::Release);
        }
    }

    /// A consistent snapshot of slot `idx`, or `None` if it is free or idle (or kept changing).
    pub fn in_flight_read(&self, idx: usize) -> Option<InFlight> {
        if idx >= self.geometry.in_flight_slots as usize {
            return None;
        }
        let w = self.in_flight_words(idx);
        for _ in 0..16 {
            let v1 = w[7].load(Ordering::Acquire);
            if v1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            if w[0].load(Ordering::Acquire) == 0 {
                return None;
            }
            let e = InFlight {
                comm_id: w[1].load(Ordering::Relaxed),
                seq: w[2].load(Ordering::Relaxed),
                t_enter: w[3].load(Ordering::Relaxed),
                bytes: w[4].load(Ordering::Relaxed),
                op: (w[5].load(Ordering::Relaxed) & 0xff) as u8,
                status: (w[5].load(Ordering::Relaxed) >> 8 & 0xff) as u8,
                flags: (w[5].load(Ordering::Relaxed) >> 16 & 0xffff) as u16,
                tid: (w[5].load(Ordering::Relaxed) >> 32) as u32,
                peer: (w[6].load(Ordering::Relaxed) & 0xffff_ffff) as u32 as i32,
                tag: (w[6].load(Ordering::Relaxed) >> 32) as u32 as i32,
                comm_rank: (v1 >> 32) as u32 as i32,
                count: w[8].load(Ordering::Relaxed),
                dtype: (w[9].load(Ordering::Relaxed) & 0xffff) as u16,
                red_op: (w[9].load(Ordering::Relaxed) >> 16 & 0xff) as u8,
            };
            std::sync::atomic::fence(Ordering::Acquire);
            if w[7].load(Ordering::Relaxed) == v1 && w[0].load(Ordering::Relaxed) != 0 {
                return (e.status != 0).then_some(e);
            }
        }
        None
    }

    /// Number of calls in flight now.
    pub fn in_flight_count(&self) -> usize {
        (0..self.geometry.in_flight_slots as usize)
            .filter(|&i| self.in_flight_read(i).is_some())
            .count()
    }

    /// Snapshots every occupied slot.
    pub fn in_flight(&self) -> Vec<(usize, InFlight)> {
        (0..self.geometry.in_flight_slots as usize)
            .filter_map(|i| self.in_flight_read(i).map(|e| (i, e)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Call, Record};

    /// A heap region standing in for a memfd mapping.
    struct Region {
        buf: Vec<u64>,
    }

    impl Region {
        fn new(g: Geometry) -> (Region, Shm) {
            let mut r = Region {
                buf: vec![0u64; g.total_size() / 8 + 8],
            };
            let ptr = r.buf.as_mut_ptr() as *mut u8;
            let aligned = ptr.wrapping_add(ptr.align_offset(64));
            let base = NonNull::new(aligned).expect("non-null");
            // SAFETY: the buffer is zeroed, large enough after alignment, and outlives the view
            // in each test (the Region is kept alive alongside it).
            let shm = unsafe { Shm::format(base, g.total_size(), g) }.expect("format");
            (r, shm)
        }
    }

    fn call(n: u64) -> RawRecord {
        Record::Call(Call {
            seq: n,
            ..Default::default()
        })
        .encode()
    }

    #[test]
    fn a_head_read_before_the_consumer_moved_past_it_is_not_a_full_ring() {
        assert!(!ring_full(10, 10, 8));
        assert!(!ring_full(17, 10, 8));
        assert!(ring_full(18, 10, 8));
        // Read at 10; another producer pushed 10 and the consumer read it: floor 11.
        assert!(!ring_full(10, 11, 8));
    }

    #[test]
    fn a_ring_that_never_fills_never_drops_under_concurrent_producers() {
        // Two producers (an application thread and the heartbeat thread) and a consumer that
        // keeps up: producers never let the ring get more than half full, so any drop counted
        // is a false "ring full" (a producer judging by a position that others and the
        // consumer have already moved past).
        let g = Geometry {
            ring_capacity: 64,
            in_flight_slots: 4,
        };
        let (_r, shm) = Region::new(g);
        shm.attach_consumer(Consumer::Agent);
        let per_producer = 20_000u64;
        let done = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for i in 0..per_producer {
                        while shm.head().saturating_sub(shm.cursor(Consumer::Agent)) > 32 {
                            std::thread::yield_now();
                        }
                        let _ = shm.push(&call(i));
                    }
                    done.fetch_add(1, Ordering::AcqRel);
                });
            }
            s.spawn(|| {
                let mut from = shm.cursor(Consumer::Agent);
                while done.load(Ordering::Acquire) < 2 || from < shm.head() {
                    from = shm.read_from(from, 8, |_| {});
                    shm.advance(Consumer::Agent, from);
                }
            });
        });
        assert_eq!(shm.counter(Counter::DroppedRingFull), 0);
        assert_eq!(shm.head(), 2 * per_producer);
    }

    #[test]
    fn ring_delivers_in_order_to_both_consumers_and_drops_when_full() {
        let g = Geometry {
            ring_capacity: 8,
            in_flight_slots: 4,
        };
        let (_r, shm) = Region::new(g);
        shm.attach_consumer(Consumer::Local);
        shm.attach_consumer(Consumer::Agent);
        for i in 0..8 {
            assert_eq!(shm.push(&call(i)), Some(i + 1));
        }
        assert_eq!(shm.push(&call(99)), None, "full ring must drop");
        assert_eq!(shm.counter(Counter::DroppedRingFull), 1);

        let mut seen = Vec::new();
        let end = shm.read_from(shm.cursor(Consumer::Local), 100, |b| {
            if let Ok(Record::Call(c)) = Record::decode(b) {
                seen.push(c.seq)
            }
        });
        assert_eq!(seen, (0..8).collect::<Vec<_>>());
        shm.advance(Consumer::Local, end);
        // The agent has not advanced: still full.
        assert_eq!(shm.push(&call(100)), None);
        shm.advance(Consumer::Agent, 4);
        assert_eq!(shm.push(&call(100)), Some(9));
    }

    #[test]
    fn unattached_agent_does_not_hold_back_the_local_writer() {
        let g = Geometry {
            ring_capacity: 4,
            in_flight_slots: 0,
        };
        let (_r, shm) = Region::new(g);
        shm.attach_consumer(Consumer::Local);
        for round in 0..5u64 {
            for i in 0..4 {
                assert!(shm.push(&call(round * 4 + i)).is_some());
            }
            let end = shm.read_from(shm.cursor(Consumer::Local), 100, |_| {});
            shm.advance(Consumer::Local, end);
        }
        // An agent attaching late starts at the local cursor, not at 0.
        shm.attach_consumer(Consumer::Agent);
        assert_eq!(shm.cursor(Consumer::Agent), 20);
        assert!(shm.push(&call(0)).is_some());
    }

    #[test]
    fn in_flight_slots_claim_snapshot_release() {
        let g = Geometry {
            ring_capacity: 4,
            in_flight_slots: 2,
        };
        let (_r, shm) = Region::new(g);
        let e = InFlight {
            comm_id: 0xabc,
            seq: 5,
            t_enter: 10,
            bytes: 64,
            op: 1,
            status: in_flight_status::IN_CALL,
            flags: 0,
            peer: -1,
            tag: 7,
            tid: 1234,
            comm_rank: 3,
            count: 8,
            dtype: crate::op::dtype::DOUBLE,
            red_op: crate::op::red_op::MAX,
        };
        let a = shm.in_flight_claim(0, &e).expect("slot");
        let b = shm
            .in_flight_claim(0, &InFlight { seq: 6, ..e })
            .expect("slot");
        assert_ne!(a, b);
        assert_eq!(shm.in_flight_claim(0, &e), None);
        assert_eq!(shm.counter(Counter::DroppedInFlight), 1);
        assert_eq!(shm.in_flight_read(a), Some(e));
        shm.in_flight_release(a);
        assert_eq!(shm.in_flight_read(a), None);
        assert_eq!(shm.in_flight().len(), 1);
        // A home slot left idle is not in flight, stays owned, and is reused by its owner.
        shm.in_flight_leave(b);
        assert_eq!(shm.in_flight_read(b), None);
        assert_eq!(
            shm.in_flight_claim(0, &e),
            Some(a),
            "only the released slot is free"
        );
        shm.in_flight_write(b, &InFlight { seq: 7, ..e });
        assert_eq!(shm.in_flight_read(b).map(|x| x.seq), Some(7));
    }

    #[test]
    fn attach_rejects_foreign_and_newer_regions() {
        let g = Geometry {
            ring_capacity: 4,
            in_flight_slots: 1,
        };
        let (_r, shm) = Region::new(g);
        let base = shm.base;
        // SAFETY: same live region as `shm`.
        let again = unsafe { Shm::attach(base, g.total_size()) }.expect("attach");
        assert_eq!(again.geometry(), g);
        shm.u32_at(H_VERSION)
            .store(LAYOUT_VERSION + 1, Ordering::Relaxed);
        // SAFETY: as above.
        let err = unsafe { Shm::attach(base, g.total_size()) }.expect_err("newer");
        assert!(err.to_string().contains("newer"), "{err}");
        shm.u64_at(H_MAGIC).store(1, Ordering::Relaxed);
        // SAFETY: as above.
        let err = unsafe { Shm::attach(base, g.total_size()) }.expect_err("magic");
        assert_eq!(err, LayoutError::BadMagic);
    }
}
