//! The process-wide recorder: activation, the hot-path gate, and the helpers every wrapper uses
//! to record a call.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicU64, Ordering};

use commscope_wire::hash::{self, Hasher, domain};
use commscope_wire::op::{Clock, Op, flags};
use commscope_wire::record::{
    Call, Comm, CommEvent, EXIT_STATUS_UNKNOWN, Heartbeat, Process, ProcessEvent, RECORD_SIZE,
    Record, encode_call, kind,
};
use commscope_wire::shm::{Counter, Geometry, InFlight, Shm, in_flight_status, state as shm_state};

use crate::abi::{Abi, H};
use crate::tables::{CommEntry, CommInfo, CommTable, Dir, P2pTable, RequestTable, comm_flags};
use crate::util::{self, Config, now_mono, now_real};

/// Lifecycle of the shim in this process.
pub mod life {
    /// Loaded; waiting for `MPI_Init`.
    pub const DORMANT: u8 = 0;
    /// Recording.
    pub const ACTIVE: u8 = 1;
    /// `COMMSCOPE_DISABLE=1`, a forked child, or activation failed: pure pass-through.
    pub const OFF: u8 = 2;
    /// After `MPI_Finalize` or exit.
    pub const DONE: u8 = 3;
}

static LIFE: AtomicU8 = AtomicU8::new(life::DORMANT);
static SHIM: AtomicPtr<Shim> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    static SLOT_HINT: Cell<usize> = const { Cell::new(0) };
    /// The last predefined datatype seen: (normalized handle, size, code).
    static TYPE_CACHE: Cell<(u64, u64, u16)> = const { Cell::new((0, 0, 0)) };
    /// The last reduction operation seen: (normalized handle, code).
    static OP_CACHE: Cell<(u64, u8)> = const { Cell::new((0, 0)) };
    /// This thread's home in-flight slot for blocking calls (usize::MAX: none yet).
    static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Held while a wrapper records; a nested wrapper (the MPI library calling its own public
/// entry points) finds it taken and passes straight through.
#[derive(Debug)]
pub struct Guard(());

impl Drop for Guard {
    #[inline]
    fn drop(&mut self) {
        IN_HOOK.with(|f| f.set(false));
    }
}

/// The recorder, if recording and not re-entered.
#[inline]
pub fn active() -> Option<(&'static Shim, Guard)> {
    if LIFE.load(Ordering::Acquire) != life::ACTIVE {
        return None;
    }
    let taken = IN_HOOK.with(|f| f.replace(true));
    if taken {
        return None;
    }
    let p = SHIM.load(Ordering::Acquire);
    // SAFETY: SHIM is set (to a leaked, never freed Box) before LIFE becomes ACTIVE.
    let shim = unsafe { p.as_ref() }?;
    Some((shim, Guard(())))
}

/// The recorder for an MPI entry point: recording, not re-entered, and MPI is what activated
/// it (a process whose NCCL activated the shim before any `MPI_Init` has no MPI ABI to use).
#[inline]
pub fn active_mpi() -> Option<(&'static Shim, Guard)> {
    active().filter(|(s, _)| s.mpi)
}

/// Marks this thread as inside a wrapper whatever the lifecycle state (so the library's calls
/// to its own entry points pass through while, e.g., a communicator is being created and the
/// recorder may activate); `None` when already inside one.
#[inline]
pub fn enter_hook() -> Option<Guard> {
    if IN_HOOK.with(|f| f.replace(true)) {
        return None;
    }
    Some(Guard(()))
}

/// Whether this thread is inside a wrapper (a library calling its own entry points).
#[inline]
pub fn in_hook() -> bool {
    IN_HOOK.with(Cell::get)
}

/// The current lifecycle state.
pub fn life() -> u8 {
    LIFE.load(Ordering::Acquire)
}

/// Switches to pure pass-through.
pub fn set_life(v: u8) {
    LIFE.store(v, Ordering::Release);
}

/// The recorder regardless of state (for shutdown paths).
pub fn shim() -> Option<&'static Shim> {
    // SAFETY: as in `active`.
    unsafe { SHIM.load(Ordering::Acquire).as_ref() }
}

/// Runs `f`, turning a panic into pass-through mode instead of unwinding into C.
#[inline]
pub fn shielded<T>(shim: &Shim, f: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => Some(v),
        Err(_) => {
            shim.shm.count(Counter::DroppedInternal, 1);
            set_life(life::OFF);
            shim.shm.set_state(shm_state::FAILED);
            util::warn(format_args!(
                "internal error; recording stopped, the application continues unaffected"
            ));
            None
        }
    }
}

/// The in-flight slot of a call in progress.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Slot {
    /// The table was full: the call is not shown (counted).
    #[default]
    None,
    /// The calling thread's own slot, kept between its blocking calls.
    Home(usize),
    /// A slot claimed for this call alone (nonblocking calls), freed at completion.
    Owned(usize),
}

/// A call in progress.
#[derive(Debug)]
pub struct Begun {
    pub call: Call,
    pub slot: Slot,
}

/// Everything the recorder holds for the process.
#[derive(Debug)]
pub struct Shim {
    pub abi: Abi,
    /// MPI activated the recorder (else NCCL did, and `abi` is [`Abi::absent`]).
    pub mpi: bool,
    pub nccl: crate::nccl::NcclState,
    pub shm: Shm,
    pub memfd: c_int,
    pub config: Config,
    pub rank: i32,
    pub world_size: i32,
    pub job: String,
    pub node: String,
    pub pid: u32,
    pub start_time: u64,
    pub library: String,
    pub mono_anchor: u64,
    pub real_anchor: u64,
    pub comms: CommTable,
    pub requests: RequestTable,
    /// Persistent requests' templates, by handle, from `*_init` to `MPI_Request_free`.
    pub persistent: RequestTable,
    pub p2p: P2pTable,
    /// Messages matched by a probe, until received.
    pub probed: crate::tables::ProbedTable,
    /// The world group, for translating ranks.
    pub world_group: H,
    /// Counters for communicators created from a member set rather than a whole parent.
    pub set_counters: Mutex<HashMap<(u64, u64), u64>>,
    /// Counter for process-local communicator ids.
    pub local_ids: AtomicU64,
    /// The local trace file, shared by the background thread and shutdown paths.
    pub local: Mutex<Option<crate::writer::LocalTrace>>,
    pub stop: AtomicBool,
    pub background: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The background thread, for waking it without a lock (from a signal handler).
    pub background_thread: std::sync::OnceLock<std::thread::Thread>,
    /// The registration, handed from the background thread to the exit path
    /// ([`crate::agent::hand_over`]).
    pub exit_link: Mutex<Option<crate::agent::Link>>,
}

/// Creates the shared-memory region (a memfd, mapped shared).
fn create_region(config: &Config) -> Result<(Shm, c_int), String> {
    let geometry = Geometry {
        ring_capacity: config.ring_records,
        in_flight_slots: config.in_flight_slots,
    };
    let size = geometry.total_size();
    // SAFETY: a valid NUL-terminated name and flags.
    let fd = unsafe { libc::memfd_create(c"commscope-ring".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "memfd_create failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd is our new memfd.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return Err(format!("failed to size the ring ({size} bytes): {e}"));
    }
    // SAFETY: mapping `size` bytes of our memfd, shared, read-write.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            // Fault every page in now, at MPI_Init, so the hot path never takes a page fault.
            libc::MAP_SHARED | libc::MAP_POPULATE,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing our own fd.
        unsafe { libc::close(fd) };
        return Err(format!("failed to map the ring ({size} bytes): {e}"));
    }
    let base = NonNull::new(p as *mut u8).ok_or("mmap returned null")?;
    // SAFETY: a fresh, zero-filled, page-aligned mapping of `size` bytes that is never unmapped.
    let shm = unsafe { Shm::format(base, size, geometry) }.map_err(|e| e.to_string())?;
    Ok((shm, fd))
}

/// The job id from the environment (commscope's own, then the launcher's), if any.
fn job_from_env() -> Option<String> {
    commscope_wire::launcher::job(util::env)
}

crate::abi::pmpi! { own:
    fn PMPI_Comm_rank(comm: H, rank: *mut c_int) -> c_int;
    fn PMPI_Comm_size(comm: H, size: *mut c_int) -> c_int;
    fn PMPI_Comm_remote_size(comm: H, size: *mut c_int) -> c_int;
    fn PMPI_Comm_test_inter(comm: H, flag: *mut c_int) -> c_int;
    fn PMPI_Comm_group(comm: H, group: *mut c_void) -> c_int;
    fn PMPI_Comm_remote_group(comm: H, group: *mut c_void) -> c_int;
    fn PMPI_Group_size(group: H, size: *mut c_int) -> c_int;
    fn PMPI_Group_translate_ranks(g1: H, n: c_int, r1: *const c_int, g2: H, r2: *mut c_int) -> c_int;
    fn PMPI_Group_free(group: *mut c_void) -> c_int;
    fn PMPI_Bcast(buf: *mut c_void, count: c_int, dtype: H, root: c_int, comm: H) -> c_int;
    fn PMPI_Type_size(dtype: H, size: *mut c_int) -> c_int;
    fn PMPI_Get_count(status: *const c_void, dtype: H, count: *mut c_int) -> c_int;
    fn PMPI_Topo_test(comm: H, status: *mut c_int) -> c_int;
    fn PMPI_Cartdim_get(comm: H, ndims: *mut c_int) -> c_int;
    fn PMPI_Graph_neighbors_count(comm: H, rank: c_int, n: *mut c_int) -> c_int;
    fn PMPI_Dist_graph_neighbors_count(comm: H, indeg: *mut c_int, outdeg: *mut c_int, weighted: *mut c_int) -> c_int;
}

/// Activates recording after a successful `MPI_Init`. Never fails the application: on any
/// problem it reports once and leaves the shim a pass-through.
pub fn activate() {
    if life() != life::DORMANT {
        return;
    }
    if util::env_flag("COMMSCOPE_DISABLE", false) {
        set_life(life::OFF);
        return;
    }
    let result = std::panic::catch_unwind(build);
    install(result);
}

/// Activates recording for a process that uses NCCL without MPI, at its first communicator:
/// `rank`/`size` and `first_comm` (that communicator's `commHash`) stand in where the launcher's
/// environment says nothing.
pub fn activate_nccl(rank: i32, size: i32, first_comm: u64) {
    if life() != life::DORMANT {
        return;
    }
    if util::env_flag("COMMSCOPE_DISABLE", false) {
        set_life(life::OFF);
        return;
    }
    static ONCE: Mutex<()> = Mutex::new(());
    let _g = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    if life() != life::DORMANT {
        return;
    }
    let result = std::panic::catch_unwind(|| build_nccl(rank, size, first_comm));
    install(result);
}

fn install(result: std::thread::Result<Result<Shim, String>>) {
    match result {
        Ok(Ok(shim)) => {
            let shim: &'static Shim = Box::leak(Box::new(shim));
            SHIM.store(shim as *const Shim as *mut Shim, Ordering::Release);
            shim.shm.set_state(shm_state::ACTIVE);
            set_life(life::ACTIVE);
            // With an agent on this node, keep every record for it from the very first one.
            if shim.config.agent_socket_explicit || shim.config.agent_socket.exists() {
                shim.shm
                    .attach_consumer(commscope_wire::shm::Consumer::Agent);
            }
            shim.announce();
            crate::writer::start(shim);
            crate::ending::install();
            // SAFETY: registering a plain extern "C" function without arguments.
            unsafe { libc::pthread_atfork(None, None, Some(in_forked_child)) };
        }
        Ok(Err(why)) => {
            set_life(life::OFF);
            util::warn(format_args!("not recording: {why}"));
        }
        Err(_) => {
            set_life(life::OFF);
            util::warn(format_args!(
                "not recording: internal error during activation"
            ));
        }
    }
}

fn build_nccl(rank_hint: i32, size_hint: i32, first_comm: u64) -> Result<Shim, String> {
    let config = Config::from_env();
    use commscope_wire::launcher;
    let rank = launcher::int(util::env, &launcher::RANK_VARS).unwrap_or(rank_hint.max(0));
    let size = launcher::int(util::env, &launcher::SIZE_VARS).unwrap_or(size_hint.max(1));
    let pid = std::process::id();
    let start_time = util::process_start_time();
    let job = launcher::nccl_job(util::env, first_comm, pid, start_time);
    assemble(
        Abi::absent(),
        0,
        crate::nccl::library_string(),
        config,
        (rank, size),
        job,
        (pid, start_time),
    )
}

/// The recorder around its shared memory: `world_group` is MPI's world group (0 without MPI,
/// which also sizes the MPI tables down to nothing).
fn assemble(
    abi: Abi,
    world_group: H,
    library: String,
    config: Config,
    (rank, size): (i32, i32),
    job: String,
    (pid, start_time): (u32, u64),
) -> Result<Shim, String> {
    crate::clock::start();
    let node = util::env("COMMSCOPE_NODE")
        .or_else(|| util::env("NODE_NAME"))
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(hostname);
    let (shm, memfd) = create_region(&config)?;
    shm.set_identity(pid, start_time, rank, size, &job, &node);
    let mpi = abi.flavour != crate::abi::Flavour::None;
    let (comms, requests, persistent) = if mpi {
        (4096, 8192, 1024)
    } else {
        (16, 16, 16)
    };
    Ok(Shim {
        library,
        nccl: crate::nccl::NcclState::new(config.in_flight_slots as usize),
        abi,
        mpi,
        shm,
        memfd,
        config,
        rank,
        world_size: size,
        job,
        node,
        pid,
        start_time,
        mono_anchor: now_mono(),
        real_anchor: now_real(),
        comms: CommTable::new(comms),
        requests: RequestTable::new(requests),
        persistent: RequestTable::new(persistent),
        p2p: P2pTable::new(16384),
        probed: Default::default(),
        world_group,
        set_counters: Mutex::new(HashMap::new()),
        local_ids: AtomicU64::new(0),
        local: Mutex::new(None),
        stop: AtomicBool::new(false),
        background: Mutex::new(None),
        background_thread: std::sync::OnceLock::new(),
        exit_link: Mutex::new(None),
    })
}

fn build() -> Result<Shim, String> {
    let abi = Abi::detect().ok_or("no MPI library found in the process")?;
    let config = Config::from_env();
    let world = abi.comm_world as H;
    let (mut rank, mut size) = (0, 0);
    // SAFETY: valid out-pointers; MPI is initialized.
    unsafe {
        PMPI_Comm_rank(world, &mut rank);
        PMPI_Comm_size(world, &mut size);
    }
    let pid = std::process::id();
    let start_time = util::process_start_time();

    // The job id: every rank must agree. The environment is the same on every rank of a launch;
    // without a launcher id, rank 0 draws a nonce and broadcasts it (through PMPI, before the
    // application can issue any collective).
    let job = match job_from_env() {
        Some(j) => util::sanitize_job(&j),
        None => {
            let mut buf = [0u8; 64];
            if rank == 0 {
                let nonce = Hasher::new()
                    .word(domain::JOB_NONCE)
                    .word(now_real())
                    .word(u64::from(pid))
                    .word(start_time)
                    .finish();
                let s = format!("mpi-{nonce:016x}");
                buf[..s.len()].copy_from_slice(s.as_bytes());
            }
            let byte = abi
                .dtypes
                .iter()
                .find(|d| d.1 == commscope_wire::op::dtype::BYTE)
                .map(|d| d.0)
                .unwrap_or(0);
            // SAFETY: a 64-byte buffer broadcast as 64 MPI_BYTEs on the world communicator.
            let rc = unsafe { PMPI_Bcast(buf.as_mut_ptr().cast(), 64, byte as H, 0, world) };
            if rc != 0 {
                return Err(format!(
                    "failed to agree on a job id (MPI_Bcast returned {rc}); set COMMSCOPE_JOB_ID"
                ));
            }
            let end = buf.iter().position(|&b| b == 0).unwrap_or(64);
            util::sanitize_job(&String::from_utf8_lossy(&buf[..end]))
        }
    };
    let mut world_group: u64 = 0;
    // SAFETY: valid out-pointer large enough for either handle width.
    unsafe { PMPI_Comm_group(world, (&mut world_group as *mut u64).cast()) };
    // SAFETY: the out-pointer was just written by MPI.
    let world_group = unsafe { abi.read_handle((&world_group as *const u64).cast()) } as H;
    let shim = assemble(
        abi,
        world_group,
        crate::abi::library_version(),
        config,
        (rank, size),
        job,
        (pid, start_time),
    )?;
    let world_id = hash::world_comm_id(&shim.job);
    let self_id = hash::self_comm_id(&shim.job, rank);
    shim.comms.insert(
        shim.abi.comm_world,
        CommInfo {
            id: world_id,
            size,
            rank,
            ..Default::default()
        },
    );
    shim.comms.insert(
        shim.abi.comm_self,
        CommInfo {
            id: self_id,
            size: 1,
            rank: 0,
            ..Default::default()
        },
    );
    Ok(shim)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buffer and its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "localhost".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

extern "C" fn in_forked_child() {
    // The child shares the parent's ring mapping; it must never write to it.
    if life() == life::ACTIVE {
        set_life(life::OFF);
    }
}

/// Stops recording and flushes everything: at `MPI_Finalize`, at exit, or before `MPI_Abort`
/// (`end` says which). An unclean end first records the calls then in flight.
pub fn shutdown(end: crate::ending::End) {
    if LIFE
        .compare_exchange(
            life::ACTIVE,
            life::DONE,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        return;
    }
    let Some(shim) = shim() else { return };
    // Let the GPU poller write what completed (it stops once recording is DONE), then stop the
    // background thread and empty the ring, so the last records find room even when the ring
    // was full.
    crate::nccl::stop(shim, std::time::Duration::from_millis(300));
    crate::writer::stop(shim);
    let clean = end == crate::ending::End::Clean;
    if !clean {
        crate::ending::record_in_flight(shim);
    }
    let now = now_mono();
    shim.push_heartbeat(now, clean);
    let (fl, status, signal) = end.fields();
    shim.push(&shim.exit_record(now, now_real(), fl, status, signal));
    crate::writer::drain_local(shim);
    shim.shm.set_state(shm_state::FINALIZED);
    crate::agent::hand_over(shim);
}

impl Shim {
    /// Appends a (non-call) record to the ring.
    pub fn push(&self, r: &Record) -> Option<u64> {
        let mut raw = [0u8; RECORD_SIZE];
        r.encode_body(&mut raw);
        self.shm.push(&raw)
    }

    /// A `process` record of this process.
    fn process_record(
        &self,
        event: ProcessEvent,
        t_mono: u64,
        exit_status: i32,
        step: u64,
    ) -> Record {
        Record::Process(Process {
            rec_seq: 0,
            event,
            t_mono,
            t_real: now_real(),
            pid: self.pid,
            exit_status,
            start_time: self.start_time,
            rank: self.rank,
            world_size: self.world_size,
            flags: 0,
            signal: 0,
            step,
        })
    }

    /// The `process` record of this process's end: `flags`, exit status and signal as
    /// [`crate::ending::End::fields`] gives them.
    pub fn exit_record(
        &self,
        t_mono: u64,
        t_real: u64,
        flags: u16,
        status: i32,
        signal: i32,
    ) -> Record {
        Record::Process(Process {
            rec_seq: 0,
            event: ProcessEvent::Exit,
            t_mono,
            t_real,
            pid: self.pid,
            exit_status: status,
            start_time: self.start_time,
            rank: self.rank,
            world_size: self.world_size,
            flags,
            signal,
            step: 0,
        })
    }

    /// Appends a step marker (`commscope_step`).
    pub fn push_step(&self, step: u64) {
        self.push(&self.process_record(ProcessEvent::Step, now_mono(), EXIT_STATUS_UNKNOWN, step));
    }

    /// Appends a heartbeat.
    pub fn push_heartbeat(&self, now: u64, last: bool) {
        let in_flight = self.shm.in_flight_count() as u32;
        self.push(&Record::Heartbeat(Heartbeat {
            rec_seq: 0,
            flags: if last { flags::FINAL } else { 0 },
            t_mono: now,
            t_real: now_real(),
            in_flight,
            rank: self.rank,
            dropped_ring_full: self.shm.counter(Counter::DroppedRingFull),
            dropped_in_flight: self.shm.counter(Counter::DroppedInFlight),
            dropped_other: self.shm.counter(Counter::DroppedRequests)
                + self.shm.counter(Counter::DroppedP2pSeq)
                + self.shm.counter(Counter::DroppedComms)
                + self.shm.counter(Counter::DroppedInternal),
            produced: self.shm.head(),
        }));
        self.shm.beat(now);
    }

    /// The first records: process start and the predefined communicators.
    fn announce(&self) {
        self.push(&self.process_record(ProcessEvent::Start, now_mono(), EXIT_STATUS_UNKNOWN, 0));
        // What the node's network offers: a reference for bus bandwidth that does not depend
        // on a healthy start. Read once here, never on a call's path.
        if let Some(mbps) = commscope_wire::netinfo::line_rate_mbps(std::path::Path::new("/sys")) {
            self.push(&self.process_record(
                ProcessEvent::Network,
                now_mono(),
                EXIT_STATUS_UNKNOWN,
                mbps,
            ));
        }
        for (h, name) in [
            (self.abi.comm_world, "MPI_COMM_WORLD"),
            (self.abi.comm_self, "MPI_COMM_SELF"),
        ] {
            if let Some(e) = self.comms.get(h) {
                self.comm_record(CommEvent::Created, e, 0, Some(name.as_bytes()));
            }
        }
    }

    /// Writes a `comm` record for an entry.
    pub fn comm_record(&self, event: CommEvent, e: &CommEntry, parent: u64, name: Option<&[u8]>) {
        let mut c = self.comm_of(event, e, parent);
        if let Some(n) = name {
            c.set_name(n);
        }
        self.push_comm(c);
    }

    /// Appends a `comm` record; a communicator created (or failed) is written to the trace file
    /// at once, not at the next flush: a rank that dies in its first milliseconds is still known
    /// as a member. (The node agent maps the ring itself and needs no flush.) Communicators are
    /// created rarely, by calls that are collective themselves.
    pub fn push_comm(&self, c: Comm) {
        let event = c.event;
        self.push(&Record::Comm(c));
        if matches!(event, CommEvent::Created | CommEvent::Failed) {
            crate::writer::drain_local(self);
        }
    }

    /// A `comm` record of an entry (its id, rank, sizes and flags), stamped now.
    pub fn comm_of(&self, event: CommEvent, e: &CommEntry, parent: u64) -> Comm {
        let mut c = Comm::new(
            event,
            e.id.load(Ordering::Relaxed),
            parent,
            now_mono(),
            self.rank,
            e.rank.load(Ordering::Relaxed),
            e.size.load(Ordering::Relaxed),
            e.remote_size.load(Ordering::Relaxed),
        );
        c.flags = e.call_flags();
        c
    }

    /// The entry of a communicator handle; one the shim has not seen created (a constructor it
    /// does not wrap) gets a process-local id, flagged as such.
    #[inline]
    pub fn comm(&self, h: H) -> Option<&CommEntry> {
        let key = self.abi.norm(h);
        if let Some(e) = self.comms.get(key) {
            return Some(e);
        }
        self.adopt_unknown_comm(h)
    }

    #[cold]
    fn adopt_unknown_comm(&self, h: H) -> Option<&CommEntry> {
        let key = self.abi.norm(h);
        if key == self.abi.comm_null {
            return None;
        }
        let (inter, size, rank, remote) = self.comm_shape(h);
        let (indegree, outdegree) = if inter { (0, 0) } else { self.degrees(h) };
        let id = self.local_comm_id(key);
        let flags = comm_flags::LOCAL_ID | if inter { comm_flags::INTERCOMM } else { 0 };
        match self.comms.insert(
            key,
            CommInfo {
                id,
                size,
                rank,
                remote_size: remote,
                flags,
                indegree,
                outdegree,
            },
        ) {
            Some(e) => {
                self.comm_record(CommEvent::Created, e, 0, None);
                Some(e)
            }
            None => {
                self.shm.count(Counter::DroppedComms, 1);
                None
            }
        }
    }

    /// A process-local communicator id for handle `key` (MPI or NCCL), never repeated in this
    /// process; records carrying it are flagged `LOCAL_COMM_ID`.
    pub fn local_comm_id(&self, key: u64) -> u64 {
        Hasher::new()
            .word(domain::LOCAL)
            .str(&self.job)
            .word(self.rank as u32 as u64)
            .word(key)
            .word(self.local_ids.fetch_add(1, Ordering::Relaxed))
            .finish()
    }

    /// (intercommunicator?, size, rank, remote size) of a communicator.
    pub fn comm_shape(&self, h: H) -> (bool, i32, i32, i32) {
        let (mut inter, mut size, mut rank, mut remote) = (0, 0, 0, 0);
        // SAFETY: valid out-pointers; `h` is a communicator the application passed.
        unsafe {
            PMPI_Comm_test_inter(h, &mut inter);
            PMPI_Comm_size(h, &mut size);
            PMPI_Comm_rank(h, &mut rank);
            if inter != 0 {
                PMPI_Comm_remote_size(h, &mut remote);
            }
        }
        (inter != 0, size, rank, remote)
    }

    /// (in-degree, out-degree) of a topology communicator: the neighbours this rank receives
    /// from and sends to in a neighbourhood collective; (0, 0) without a topology.
    pub fn degrees(&self, h: H) -> (i32, i32) {
        const DIST_GRAPH: c_int = 3;
        let mut kind: c_int = -1;
        // SAFETY: valid out-pointers; `h` is a communicator the application passed or got.
        unsafe {
            if PMPI_Topo_test(h, &mut kind) != 0 {
                return (0, 0);
            }
            match kind {
                k if k == self.abi.topo_cart => {
                    let mut nd: c_int = 0;
                    PMPI_Cartdim_get(h, &mut nd);
                    (2 * nd.max(0), 2 * nd.max(0))
                }
                k if k == self.abi.topo_graph => {
                    let (mut rank, mut n) = (0, 0);
                    PMPI_Comm_rank(h, &mut rank);
                    PMPI_Graph_neighbors_count(h, rank, &mut n);
                    (n.max(0), n.max(0))
                }
                DIST_GRAPH => {
                    let (mut i, mut o, mut w) = (0, 0, 0);
                    PMPI_Dist_graph_neighbors_count(h, &mut i, &mut o, &mut w);
                    (i.max(0), o.max(0))
                }
                _ => (0, 0),
            }
        }
    }

    /// Sorted world ranks of a communicator's members (both groups of an intercommunicator).
    pub fn members(&self, h: H) -> Vec<i32> {
        let (inter, ..) = self.comm_shape(h);
        let mut out = self.group_world_ranks(h, false);
        if inter {
            out.extend(self.group_world_ranks(h, true));
        }
        out.sort_unstable();
        out
    }

    fn group_world_ranks(&self, comm: H, remote: bool) -> Vec<i32> {
        let mut g: u64 = 0;
        // SAFETY: valid out-pointer, large enough for either handle width.
        let rc = unsafe {
            if remote {
                PMPI_Comm_remote_group(comm, (&mut g as *mut u64).cast())
            } else {
                PMPI_Comm_group(comm, (&mut g as *mut u64).cast())
            }
        };
        if rc != 0 {
            return Vec::new();
        }
        // SAFETY: just written by MPI.
        let gh = unsafe { self.abi.read_handle((&g as *const u64).cast()) } as H;
        let mut n = 0;
        // SAFETY: valid out-pointer.
        unsafe { PMPI_Group_size(gh, &mut n) };
        let ranks: Vec<c_int> = (0..n.max(0)).collect();
        let mut world = vec![0 as c_int; ranks.len()];
        // SAFETY: both arrays hold `n` ints.
        unsafe {
            PMPI_Group_translate_ranks(gh, n, ranks.as_ptr(), self.world_group, world.as_mut_ptr())
        };
        // SAFETY: frees the group handle MPI gave us (written back as GROUP_NULL).
        unsafe { PMPI_Group_free((&mut g as *mut u64).cast()) };
        world
    }

    /// (size in bytes, datatype code) of a datatype; size 0 for a null or invalid type.
    /// Predefined types never change, so the last one seen is cached per thread.
    #[inline]
    pub fn type_info(&self, dt: H) -> (u64, u16) {
        let key = self.abi.norm(dt);
        let (k, size, code) = TYPE_CACHE.with(Cell::get);
        if k == key && k != 0 {
            return (size, code);
        }
        let mut s: c_int = 0;
        // SAFETY: valid out-pointer; an invalid type makes MPI return an error, leaving 0.
        unsafe { PMPI_Type_size(dt, &mut s) };
        let size = s.max(0) as u64;
        let code = self.abi.dtype_code(key);
        if code != commscope_wire::op::dtype::DERIVED {
            TYPE_CACHE.with(|c| c.set((key, size, code)));
        }
        (size, code)
    }

    /// The [`commscope_wire::op::red_op`] code of a reduction operation. Programs reduce with
    /// one or two operations, so the last one is cached per thread.
    #[inline]
    pub fn red_op_code(&self, op: H) -> u8 {
        let key = self.abi.norm(op);
        let (k, code) = OP_CACHE.with(Cell::get);
        if k == key && k != 0 {
            return code;
        }
        let code = self.abi.red_op_code(op);
        OP_CACHE.with(|c| c.set((key, code)));
        code
    }

    /// The size in bytes of one element of a datatype (0 for a null or invalid type).
    #[inline]
    pub fn type_size(&self, dt: H) -> u64 {
        self.type_info(dt).0
    }

    /// A collective's record as it enters, stamped with its communicator's identity and not yet
    /// numbered ([`Shim::begin_coll`] makes it the communicator's next instance).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn coll_call(
        &self,
        comm: Option<&CommEntry>,
        op: Op,
        bytes: u64,
        count: u64,
        dtype: u16,
        root: i32,
        flags: u16,
    ) -> Call {
        let mut call = Call {
            op: op as u8,
            flags,
            peer: root,
            tag: -1,
            bytes,
            count,
            dtype,
            rank: self.rank,
            clock: Clock::HostMono as u8,
            peer2: -1,
            tag2: -1,
            t_enter: now_mono(),
            ..Default::default()
        };
        if let Some(e) = comm {
            e.stamp(&mut call);
        }
        call
    }

    /// Starts recording a collective from its entry record ([`Shim::coll_call`]): the next
    /// instance on its communicator.
    #[inline]
    pub fn begin_coll(&self, comm: Option<&CommEntry>, mut call: Call) -> Begun {
        if let Some(e) = comm {
            let op = Op::from_code(call.op);
            e.next_instance(&mut call, op);
        }
        let slot = self.claim(&call, in_flight_status::IN_CALL);
        Begun { call, slot }
    }

    /// Starts recording a point-to-point call from its entry record ([`Shim::p2p_call`]): the
    /// message sequence is assigned now for a send, and for a receive without wildcards
    /// (messages match in posting order); a wildcard receive's waits for its status.
    #[inline]
    pub fn begin_p2p(&self, mut call: Call) -> Begun {
        let dir = Dir::of(Op::from_code(call.op));
        if dir == Dir::Send || call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) == 0 {
            self.assign_p2p_seq(&mut call, dir);
        }
        let slot = self.claim(&call, in_flight_status::IN_CALL);
        Begun { call, slot }
    }

    /// A point-to-point call's record as it enters, without its p2p sequence; `peer` and `tag`
    /// are the application's values (possibly wildcards).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn p2p_call(
        &self,
        comm: H,
        op: Op,
        peer: i32,
        tag: i32,
        bytes: u64,
        count: u64,
        dtype: u16,
        flags: u16,
    ) -> Call {
        let t = now_mono();
        let mut call = Call {
            op: op as u8,
            flags,
            peer: self.abi.rank_value(peer),
            tag,
            bytes,
            count,
            dtype,
            rank: self.rank,
            clock: Clock::HostMono as u8,
            peer2: -1,
            tag2: -1,
            t_enter: t,
            ..Default::default()
        };
        if peer == self.abi.any_source {
            call.flags |= flags::ANY_SOURCE;
        }
        if Dir::of(op) == Dir::Recv && tag == self.abi.any_tag {
            call.flags |= flags::ANY_TAG;
        }
        if let Some(e) = self.comm(comm) {
            e.stamp(&mut call);
            call.seq = e.seq.load(Ordering::Relaxed);
        }
        call
    }

    /// Sets `op_seq` from the p2p counters (`peer`/`tag` must be resolved).
    #[inline]
    pub fn assign_p2p_seq(&self, call: &mut Call, dir: Dir) {
        if let Some(s) = self.next_p2p_seq(call, call.peer, call.tag, dir) {
            call.op_seq = s;
        }
    }

    /// Sets `op_seq2`, a send-receive's receive half, from the p2p counters (`peer2`/`tag2`
    /// must be resolved).
    #[inline]
    pub fn assign_p2p_seq2(&self, call: &mut Call) {
        if let Some(s) = self.next_p2p_seq(call, call.peer2, call.tag2, Dir::Recv) {
            call.op_seq2 = s;
        }
    }

    /// The next message sequence between this rank and `peer` on `call`'s communicator and
    /// `tag`; none for `MPI_PROC_NULL` (no message), nor when the table is full (then `call`
    /// is flagged and the loss counted).
    #[inline]
    fn next_p2p_seq(&self, call: &mut Call, peer: i32, tag: i32, dir: Dir) -> Option<u64> {
        if peer < 0 {
            return None;
        }
        let s = self.p2p.next(call.comm_id, peer, tag, dir);
        if s.is_none() {
            call.flags |= flags::P2P_SEQ_UNKNOWN;
            self.shm.count(Counter::DroppedP2pSeq, 1);
        }
        s
    }

    /// Fills in what a receive's status tells (source, tag, sequence for wildcards).
    ///
    /// # Safety
    /// `st` must point to a status of the loaded flavour.
    #[inline]
    pub unsafe fn complete_recv(
        &self,
        call: &mut Call,
        st: *const u8,
        seq_at_completion: bool,
        dt: H,
    ) {
        // SAFETY: per the contract.
        let (src, tag, _) = unsafe { self.abi.status_fields(st) };
        // What arrived, rather than what was posted: asked only for predefined types, which cannot
        // have been freed since the receive was posted.
        if dt != 0 && call.dtype != commscope_wire::op::dtype::DERIVED {
            let mut n: c_int = -1;
            // SAFETY: `st` is a status MPI filled; `dt` is the receive's predefined datatype.
            unsafe { PMPI_Get_count(st.cast(), dt, &mut n) };
            if n >= 0 {
                call.count = n as u64;
                call.bytes = n as u64 * self.type_size(dt);
            }
        }
        if call.flags & flags::ANY_SOURCE != 0 {
            call.peer = self.abi.rank_value(src);
        }
        if call.flags & flags::ANY_TAG != 0 {
            call.tag = tag;
        }
        if seq_at_completion {
            self.assign_p2p_seq(call, Dir::Recv);
        }
    }

    /// Shows a call in the in-flight table: blocking calls in the thread's home slot,
    /// nonblocking ones in a slot of their own.
    #[inline]
    pub fn claim(&self, call: &Call, status: u8) -> Slot {
        self.claim_in(call, status, call.flags & flags::NONBLOCKING != 0)
    }

    /// As [`Shim::claim`], choosing the kind of slot: `owned` for a call whose work outlives it
    /// (nonblocking MPI calls, NCCL work on a GPU).
    #[inline]
    pub fn claim_in(&self, call: &Call, status: u8, owned: bool) -> Slot {
        let entry = InFlight {
            comm_id: call.comm_id,
            seq: if Op::from_code(call.op).is_p2p() {
                call.op_seq
            } else {
                call.seq
            },
            t_enter: call.t_enter,
            bytes: call.bytes,
            count: call.count,
            dtype: call.dtype,
            red_op: call.red_op,
            op: call.op,
            status,
            flags: call.flags,
            peer: call.peer,
            tag: call.tag,
            tid: util::tid(),
            comm_rank: call.comm_rank,
        };
        let blocking = !owned;
        if blocking {
            let home = HOME.with(Cell::get);
            if home != usize::MAX {
                self.shm.in_flight_write(home, &entry);
                return Slot::Home(home);
            }
        }
        let hint = SLOT_HINT.with(Cell::get);
        match self.shm.in_flight_claim(hint, &entry) {
            Some(s) if blocking => {
                HOME.with(|h| h.set(s));
                Slot::Home(s)
            }
            Some(s) => {
                SLOT_HINT.with(|h| h.set(s + 1));
                Slot::Owned(s)
            }
            None => Slot::None,
        }
    }

    /// Takes a call out of the in-flight table.
    #[inline]
    pub fn unclaim(&self, slot: Slot) {
        match slot {
            Slot::Home(s) => self.shm.in_flight_leave(s),
            Slot::Owned(s) => self.shm.in_flight_release(s),
            Slot::None => {}
        }
    }

    /// Marks a begun call as posted (nonblocking) in the in-flight table.
    pub fn mark_posted(&self, b: &Begun) {
        if let Slot::Owned(s) = b.slot
            && let Some(mut e) = self.shm.in_flight_read(s)
        {
            e.status = in_flight_status::POSTED;
            self.shm.in_flight_write(s, &e);
        }
    }

    /// Completes a call: stamps the exit time and status, frees its in-flight slot and writes
    /// the record.
    #[inline]
    pub fn finish(&self, mut call: Call, slot: Slot, rc: c_int) {
        call.t_exit = now_mono();
        call.status = rc;
        self.unclaim(slot);
        let mut raw = [0u8; RECORD_SIZE];
        encode_call(&mut raw, kind::CALL, &call);
        self.shm.push(&raw);
    }

    /// The creation counter for a communicator built from a member set (not collectively over a
    /// whole parent): counts earlier creations of the same set from the same parent.
    pub fn set_counter(&self, parent: u64, members: &[i32]) -> u64 {
        let key = (parent, hash::member_set_hash(members));
        let mut m = self.set_counters.lock().unwrap_or_else(|p| p.into_inner());
        let c = m.entry(key).or_insert(0);
        let v = *c;
        *c += 1;
        v
    }
}
