//! The transport view: commscope's eBPF programs (`ebpf/programs`), loaded and attached with
//! aya, and what they see.
//!
//! - TCP tracepoints are attached at start; the flows map is read every `flow_every`.
//! - Uprobes go on every libibverbs and libnccl file that any process on the node maps (found
//!   by scanning `/proc/*/maps`, containers included), once per file: a uprobe fires for every
//!   process that runs that file, with or without the preload.
//! - Events come through a ring buffer read on tokio.
//!
//! Nothing here can stop the agent: a kernel without BTF or tracefs, missing privileges or a
//! library without the expected symbols each give one warning and a metric, and the rest of
//! the agent runs as before.

pub mod btf;
pub mod events;
pub mod plan;
pub mod procfs;
pub mod symbols;
pub mod tracefs;
pub mod view;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope};
use aya::programs::{TracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use commscope_ebpf_common::{NetKey, NetStats, TcpFlow, stat};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

pub use view::TransportView;

/// The programs, built by `scripts/build-ebpf.sh` from `ebpf/programs` and checked in (the
/// host build needs no nightly toolchain). `OBJECT_STAMP` records the hash of the sources and
/// toolchain it was built from; a test recomputes it.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!("../../ebpf/commscope.bpf.o");
pub const OBJECT_STAMP: &str = include_str!("../../ebpf/commscope.bpf.stamp");

/// The tracepoints and the programs on them.
const TRACEPOINTS: [(&str, &str, &str); 3] = [
    ("tcp_probe", "tcp", "tcp_probe"),
    ("tcp_retransmit_skb", "tcp", "tcp_retransmit_skb"),
    ("inet_sock_set_state", "sock", "inet_sock_set_state"),
];

/// What the transport view does.
#[derive(Clone, Debug)]
pub struct Options {
    /// Attach the TCP tracepoints.
    pub tcp: bool,
    /// Scan `/proc` for libibverbs and libnccl and probe them.
    pub discover: bool,
    /// Library files to probe whoever maps them (tests, or a site's known path).
    pub libraries: Vec<PathBuf>,
    /// Also probe NCCL's per-step data functions (`isend`/`irecv`). Off by default: they run
    /// once per proxy step, and a uprobe costs the proxy thread microseconds per hit; the
    /// profiler plugin sees the same steps far cheaper. Connect/accept are always probed.
    pub nccl_data: bool,
    /// Record the NCCL API calls of processes without the preload (zero-touch,
    /// [`crate::zerotouch`]): two uprobe hits per call, skipped for preloaded processes.
    pub nccl_api: bool,
    /// How often the flows and connections maps are read, and `/proc` is scanned.
    pub flow_every: Duration,
    pub scan_every: Duration,
    pub proc_root: PathBuf,
    /// The kernel's BTF, for `struct tcp_sock`'s counters.
    pub btf: PathBuf,
    /// Where the RDMA ports' GIDs and LIDs are read (`class/infiniband/…`), for the local end
    /// of RDMA links.
    pub sysfs: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tcp: true,
            discover: true,
            libraries: Vec::new(),
            nccl_data: false,
            nccl_api: true,
            flow_every: Duration::from_secs(1),
            scan_every: Duration::from_secs(5),
            proc_root: PathBuf::from("/proc"),
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            sysfs: PathBuf::from("/sys"),
        }
    }
}

/// An attachment made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attached {
    pub program: &'static str,
    /// `tcp/tcp_probe`, or `<file>:<symbol>[@@version]`.
    pub target: String,
}

/// How the probes stand: for `/metrics` and the log.
#[derive(Clone, Debug, Default)]
pub struct Status {
    pub loaded: bool,
    pub attached: Vec<Attached>,
    /// Libraries probed (file paths), and targets they lacked.
    pub libraries: Vec<(PathBuf, Vec<String>)>,
    /// Each problem once: why something is not watched.
    pub warnings: Vec<String>,
    /// The programs' own counters: ring buffer full, map full, failed reads.
    pub kernel_drops: [u64; stat::COUNT as usize],
}

/// The loaded programs and their attachments.
pub struct Probes {
    bpf: Ebpf,
    nccl_data: bool,
    nccl_api: bool,
    known_files: HashSet<(u64, u64)>,
    status: Status,
}

impl std::fmt::Debug for Probes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probes")
            .field("status", &self.status)
            .finish()
    }
}

impl Probes {
    /// Loads the programs and attaches the TCP tracepoints (when `opts.tcp`). Fails only when
    /// nothing can be loaded at all (no privileges, no BPF in the kernel).
    pub fn load(opts: &Options) -> Result<Probes, String> {
        raise_memlock();
        let bpf = EbpfLoader::new()
            .load(OBJECT)
            .map_err(|e| format!("the eBPF programs could not be loaded: {}", chain(&e)))?;
        let mut p = Probes {
            bpf,
            nccl_data: opts.nccl_data,
            nccl_api: opts.nccl_api,
            known_files: HashSet::new(),
            status: Status {
                loaded: true,
                ..Status::default()
            },
        };
        if opts.tcp {
            p.attach_tcp(&opts.btf);
        }
        for lib in &opts.libraries {
            match p.attach_library(lib) {
                Ok(0) => p.warn(format!("{}: nothing to probe in it", lib.display())),
                Ok(_) => {}
                Err(e) => p.warn(e),
            }
        }
        Ok(p)
    }

    fn warn(&mut self, w: String) {
        if !self.status.warnings.contains(&w) {
            tracing::warn!("transport view: {w}");
            self.status.warnings.push(w);
        }
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    fn attach_tcp(&mut self, btf: &Path) {
        let tracefs = match tracefs::root() {
            Ok(t) => t,
            Err(e) => return self.warn(format!("no TCP view: {e}")),
        };
        let mut layout = tracefs::layout(&tracefs);
        let counters = std::fs::read(btf)
            .map_err(|e| format!("{}: {e}", btf.display()))
            .and_then(|b| btf::member_offsets(&b, "tcp_sock", &["bytes_received", "bytes_acked"]))
            .and_then(|m| match (m.get("bytes_received"), m.get("bytes_acked")) {
                (Some(&r), Some(&a)) => Ok((u16::try_from(r), u16::try_from(a))),
                _ => Err("tcp_sock has no bytes_received/bytes_acked".to_owned()),
            });
        match counters {
            Ok((Ok(r), Ok(a))) => {
                layout.layout.sock_bytes_received = r;
                layout.layout.sock_bytes_acked = a;
            }
            Ok(_) => self.warn("tcp_sock's counters lie beyond 64 KiB; TCP bytes are summed from segments".into()),
            Err(e) => self.warn(format!(
                "no kernel BTF ({e}): TCP bytes are summed from segment lengths, and received bytes undercount coalesced segments of 64 KiB or more"
            )),
        }
        for m in &layout.missing {
            self.warn(format!("tracepoint not usable: {m}"));
        }
        let set = self
            .bpf
            .map_mut("LAYOUT")
            .ok_or_else(|| "the object has no LAYOUT map".to_owned())
            .and_then(|m| Array::<&mut MapData, _>::try_from(m).map_err(|e| chain(&e)))
            .and_then(|mut a| a.set(0, layout.layout, 0).map_err(|e| chain(&e)));
        if let Err(e) = set {
            return self.warn(format!(
                "no TCP view: the tracepoint layout was not set: {e}"
            ));
        }
        for (program, category, name) in TRACEPOINTS {
            if !layout
                .usable
                .contains(&format!("{category}/{name}").as_str())
            {
                continue;
            }
            let r = (|| -> Result<(), String> {
                let prog: &mut TracePoint = self
                    .bpf
                    .program_mut(program)
                    .ok_or("not in the object")?
                    .try_into()
                    .map_err(|e| chain(&e))?;
                prog.load().map_err(|e| chain(&e))?;
                prog.attach(category, name).map_err(|e| chain(&e))?;
                Ok(())
            })();
            match r {
                Ok(()) => self.status.attached.push(Attached {
                    program,
                    target: format!("{category}/{name}"),
                }),
                Err(e) => self.warn(format!("tracepoint {category}:{name} not attached: {e}")),
            }
        }
    }

    /// Probes one library file (whoever maps it, now or later). Returns the targets attached.
    pub fn attach_library(&mut self, path: &Path) -> Result<usize, String> {
        let id = file_id(path)?;
        if self.known_files.contains(&id) {
            return Ok(0);
        }
        let plan = read_plan(path, self.programs())?;
        Ok(self.attach_plan(id, path, &plan))
    }

    /// Attaches a library's plan (read by [`read_plan`], off the async threads when live).
    fn attach_plan(&mut self, id: (u64, u64), path: &Path, plan: &plan::Plan) -> usize {
        self.known_files.insert(id);
        if plan.library.is_none() {
            // A library by that name without a network layer (a stub, a build without one).
            tracing::info!(
                "transport view: {} has neither libibverbs' control path nor NCCL's network layer: not probed",
                path.display()
            );
            return 0;
        }
        let mut attached = 0;
        for t in &plan.targets {
            match self.attach_uprobe(t, path) {
                Ok(()) => {
                    attached += 1;
                    let at = match &t.version {
                        Some(v) => format!("{}@@{v}", t.symbol),
                        None => t.symbol.clone(),
                    };
                    self.status.attached.push(Attached {
                        program: t.program,
                        target: format!("{}:{at}", path.display()),
                    });
                }
                Err(e) => self.warn(format!(
                    "{} not probed in {}: {e}",
                    t.function,
                    path.display()
                )),
            }
        }
        tracing::info!(
            "transport view: {} probes on {} ({} not found: {})",
            attached,
            path.display(),
            plan.missing.len(),
            plan.missing.join(", ")
        );
        self.status
            .libraries
            .push((path.to_path_buf(), plan.missing.clone()));
        attached
    }

    fn attach_uprobe(&mut self, t: &plan::Target, path: &Path) -> Result<(), String> {
        let prog: &mut UProbe = self
            .bpf
            .program_mut(t.program)
            .ok_or("not in the object")?
            .try_into()
            .map_err(|e| chain(&e))?;
        if prog.fd().is_err() {
            prog.load().map_err(|e| chain(&e))?;
        }
        let point = UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(t.offset),
            cookie: t.cookie,
        };
        prog.attach(point, path, UProbeScope::AllProcesses)
            .map_err(|e| chain(&e))?;
        Ok(())
    }

    /// Probes libraries newly mapped by processes under `proc_root`.
    pub fn discover(&mut self, proc_root: &Path) {
        let found = scan(proc_root, &self.known_files, self.programs());
        self.attach_found(found);
    }

    /// Which optional programs go on NCCL.
    fn programs(&self) -> Optional {
        Optional {
            nccl_data: self.nccl_data,
            nccl_api: self.nccl_api,
        }
    }

    /// Keeps the NCCL API probes off these processes (they carry the preload): `add` joins the
    /// skip list, `remove` leaves it.
    pub fn skip_nccl(&mut self, add: &[u32], remove: &[u32]) {
        let Some(m) = self.bpf.map_mut("NCCL_SKIP") else {
            return;
        };
        let Ok(mut map) = BpfHashMap::<&mut MapData, u32, u8>::try_from(m) else {
            return;
        };
        for pid in add {
            let _ = map.insert(pid, 1, 0);
        }
        for pid in remove {
            let _ = map.remove(pid);
        }
    }

    /// Attaches what a [`scan`] found; warns once about what it could not read (tried again at
    /// the next scan).
    fn attach_found(&mut self, found: Vec<Scanned>) {
        for (lib, plan) in found {
            match plan {
                Ok(plan) => {
                    self.attach_plan(lib.id, &lib.path, &plan);
                }
                Err(e) => self.warn(e),
            }
        }
    }

    /// The flows map.
    pub fn read_flows(&self) -> Vec<(u64, TcpFlow)> {
        let Some(m) = self.bpf.map("TCP_FLOWS") else {
            return Vec::new();
        };
        let Ok(map) = BpfHashMap::<&MapData, u64, TcpFlow>::try_from(m) else {
            return Vec::new();
        };
        map.iter().filter_map(Result::ok).collect()
    }

    /// Deletes flows whose last totals were read.
    pub fn forget_flows(&mut self, sockets: &[u64]) {
        let Some(m) = self.bpf.map_mut("TCP_FLOWS") else {
            return;
        };
        let Ok(mut map) = BpfHashMap::<&mut MapData, u64, TcpFlow>::try_from(m) else {
            return;
        };
        for sk in sockets {
            let _ = map.remove(sk);
        }
    }

    /// The NCCL connections map.
    pub fn read_conns(&self) -> Vec<(NetKey, NetStats)> {
        let Some(m) = self.bpf.map("NET_CONNS") else {
            return Vec::new();
        };
        let Ok(map) = BpfHashMap::<&MapData, NetKey, NetStats>::try_from(m) else {
            return Vec::new();
        };
        map.iter().filter_map(Result::ok).collect()
    }

    /// Refreshes the programs' own counters into the status.
    pub fn read_kernel_drops(&mut self) {
        let Some(m) = self.bpf.map("STATS") else {
            return;
        };
        let Ok(a) = PerCpuArray::<&MapData, u64>::try_from(m) else {
            return;
        };
        for i in 0..stat::COUNT {
            if let Ok(v) = a.get(&i, 0) {
                self.status.kernel_drops[i as usize] = v.iter().sum();
            }
        }
    }

    /// Per loaded program: (name, runs, ns spent running) — counted only while run-time stats
    /// are enabled ([`enable_run_time_stats`]).
    pub fn program_stats(&self) -> Vec<(String, u64, u64)> {
        let mut v: Vec<(String, u64, u64)> = self
            .bpf
            .programs()
            .filter_map(|(name, p)| {
                let i = p.info().ok()?;
                Some((
                    name.to_owned(),
                    i.run_count(),
                    i.run_time().as_nanos() as u64,
                ))
            })
            .collect();
        v.sort();
        v
    }

    /// The event ring buffer (taken once, for the reader task).
    pub fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        RingBuf::try_from(self.bpf.take_map("EVENTS")?).ok()
    }
}

/// Turns on the kernel's per-program run-time accounting (BPF_ENABLE_STATS) while the
/// returned descriptor is open; it costs two clock reads per program run.
pub fn enable_run_time_stats() -> Result<std::os::fd::OwnedFd, String> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).map_err(|e| chain(&e))
}

/// A library file's identity: (device, inode).
fn file_id(path: &Path) -> Result<(u64, u64), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((meta.dev(), meta.ino()))
}

/// The optional programs on NCCL.
#[derive(Clone, Copy, Debug)]
struct Optional {
    nccl_data: bool,
    nccl_api: bool,
}

/// Reads a library's symbols and plans its probes (file I/O: a blocking call).
fn read_plan(path: &Path, opt: Optional) -> Result<plan::Plan, String> {
    let symbols = symbols::Symbols::read(path).map_err(|e| e.to_string())?;
    let mut plan = plan::plan(&symbols);
    if !opt.nccl_data {
        plan.targets
            .retain(|t| !matches!(t.program, "net_isend" | "net_irecv"));
    }
    if !opt.nccl_api {
        plan.targets.retain(|t| !t.program.starts_with("nccl_"));
    }
    Ok(plan)
}

/// A library a scan found, and its plan or why it could not be read.
type Scanned = (procfs::Library, Result<plan::Plan, String>);

/// Finds the libraries newly mapped under `proc_root` and plans them: the `/proc` walk and the
/// symbol reading, all blocking I/O, in one call for a blocking thread.
fn scan(proc_root: &Path, known: &HashSet<(u64, u64)>, opt: Optional) -> Vec<Scanned> {
    procfs::libraries(proc_root, known)
        .into_iter()
        .map(|lib| {
            let plan = read_plan(&lib.path, opt);
            (lib, plan)
        })
        .collect()
}

/// Lifts the locked-memory limit for maps on kernels that still charge it (< 5.11).
pub(crate) fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain setrlimit with a valid struct; failure changes nothing.
    let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

/// An error with its sources, on one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// Shared state of the running transport view.
#[derive(Debug, Default)]
pub struct Shared {
    pub view: Mutex<TransportView>,
    pub status: Mutex<Status>,
    /// `flow` records lost because the agent's queue was full.
    pub records_dropped: std::sync::atomic::AtomicU64,
    /// What the zero-touch recorder did.
    pub zero_touch: Mutex<crate::zerotouch::Counts>,
}

/// A traced process whose sockets' flows are attributed to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub job: String,
    pub rank: i32,
}

/// Takes every event waiting in the ring buffer: into the view, and NCCL API events into the
/// zero-touch recorder (whose adopted processes go to `adopt`).
fn take_events(
    rb: &mut RingBuf<MapData>,
    shared: &Shared,
    recorder: &mut crate::zerotouch::Recorder,
    adopt: &impl Fn(crate::registration::Registered),
) {
    let mut v = shared.view.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(item) = rb.next() {
        let Some(ev) = events::decode(&item) else {
            v.undecodable += 1;
            continue;
        };
        v.apply(&ev);
        match ev {
            events::Event::NcclInit(e) => {
                if let Some(r) = recorder.init(&e) {
                    adopt(r);
                }
            }
            events::Event::NcclCall(e) => recorder.call(&e),
            _ => {}
        }
    }
}

/// Where the transport view's output goes.
pub struct Outputs<O, S, A> {
    /// The processes whose sockets flows are attributed to (the node's registered ranks).
    pub owners: O,
    /// Takes each job's `flow` and `link_event` records of an interval.
    pub sink: S,
    /// Takes the registration of each process the zero-touch recorder adopts.
    pub adopt: A,
    /// The node's name, for adopted processes.
    pub node: String,
    /// The agent's registration socket: only processes that would register there are adopted.
    pub socket: PathBuf,
}

impl<O, S, A> std::fmt::Debug for Outputs<O, S, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outputs").field("node", &self.node).finish()
    }
}

/// Loads the probes and runs them until `stop` turns true: reads the ring buffer, the maps
/// every `flow_every`, and `/proc` every `scan_every`. On failure to load, records the one
/// warning in `shared.status` and returns.
pub async fn run<O, S, A>(
    opts: Options,
    shared: Arc<Shared>,
    out: Outputs<O, S, A>,
    mut stop: watch::Receiver<bool>,
) where
    O: Fn() -> Vec<Owner> + Send + 'static,
    S: Fn(String, Vec<commscope_wire::record::Record>) + Send + 'static,
    A: Fn(crate::registration::Registered) + Send + 'static,
{
    let Outputs {
        owners,
        sink,
        adopt,
        node,
        socket,
    } = out;
    let mut recorder = crate::zerotouch::Recorder::new(opts.proc_root.clone(), node, &socket);
    // Processes on the probes' NCCL skip list.
    let mut skipped: HashSet<u32> = HashSet::new();
    let loaded = {
        let opts = opts.clone();
        tokio::task::spawn_blocking(move || Probes::load(&opts)).await
    };
    let mut probes = match loaded {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            tracing::warn!("transport view off: {e}");
            let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
            st.warnings.push(e);
            return;
        }
        Err(_) => return,
    };
    if opts.discover {
        let (root, known, opt) = (
            opts.proc_root.clone(),
            probes.known_files.clone(),
            probes.programs(),
        );
        if let Ok(found) = tokio::task::spawn_blocking(move || scan(&root, &known, opt)).await {
            probes.attach_found(found);
        }
    }
    *shared.status.lock().unwrap_or_else(|p| p.into_inner()) = probes.status().clone();
    let ring = probes.take_events().and_then(|r| {
        // SAFETY: the ring buffer owns its map's fd, which stays open and the same until the
        // `RingBuf` (moved into the `AsyncFd`) is dropped.
        unsafe { AsyncFd::register_with_interest(r, tokio::io::Interest::READABLE) }.ok()
    });
    let Some(mut ring) = ring else {
        tracing::warn!("transport view: the event ring buffer could not be opened");
        return;
    };
    let mut flow_tick = tokio::time::interval(opts.flow_every);
    let mut scan_tick = tokio::time::interval(opts.scan_every);
    scan_tick.tick().await;
    loop {
        tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => break,
            guard = ring.readable_mut() => {
                let Ok(mut guard) = guard else { break };
                take_events(guard.get_inner_mut(), &shared, &mut recorder, &adopt);
                guard.clear_ready();
            }
            _ = flow_tick.tick() => {
                // Every event delivered so far first: the recorder's tick ends the processes
                // that are gone, after their last calls.
                take_events(ring.get_mut(), &shared, &mut recorder, &adopt);
                let flows = probes.read_flows();
                let conns = probes.read_conns();
                probes.read_kernel_drops();
                // CLOCK_MONOTONIC: the clock the programs stamp with.
                let now = crate::daemon::now_mono();
                let unowned = {
                    let mut v = shared.view.lock().unwrap_or_else(|p| p.into_inner());
                    v.update_flows(now, &flows);
                    v.update_conns(now, &conns);
                    v.unowned()
                };
                let owned_by = owners();
                // Preloaded processes, and those another agent serves, are kept off the NCCL API
                // probes.
                let gone = recorder.tick(now);
                let preloaded: HashSet<u32> = owned_by
                    .iter()
                    .map(|o| o.pid)
                    .filter(|pid| !recorder.adopted(*pid))
                    .chain(recorder.ignored())
                    .collect();
                let add: Vec<u32> = preloaded.difference(&skipped).copied().collect();
                let remove: Vec<u32> = skipped
                    .iter()
                    .filter(|p| !preloaded.contains(p) || gone.contains(p))
                    .copied()
                    .collect();
                probes.skip_nccl(&add, &remove);
                skipped = preloaded;
                *shared.zero_touch.lock().unwrap_or_else(|p| p.into_inner()) = recorder.counts;
                if unowned > 0 {
                    let pids: Vec<u32> = owned_by.iter().map(|o| o.pid).collect();
                    let root = opts.proc_root.clone();
                    if let Ok(map) = tokio::task::spawn_blocking(move || procfs::socket_owners(&root, &pids)).await {
                        shared.view.lock().unwrap_or_else(|p| p.into_inner()).attribute(&map);
                    }
                }
                // The interfaces of this network namespace (a pod's own are not seen here).
                let ifaces = procfs::interface_addresses();
                let (records, link_errors, gone) = {
                    let mut v = shared.view.lock().unwrap_or_else(|p| p.into_inner());
                    let rank_of =
                        |pid: u32| owned_by.iter().find(|o| o.pid == pid).map(|o| o.rank);
                    let mut records = v.flow_records(now, rank_of, |ip| ifaces.get(ip).cloned());
                    let sysfs = &opts.sysfs;
                    records.extend(v.rdma_records(now, rank_of, |device, port, gid| match gid {
                        Some(i) => crate::nic::port_gid(sysfs, device, port, i),
                        None => crate::nic::port_lid(sysfs, device, port)
                            .map(commscope_wire::record::Flow::lid_address),
                    }));
                    let link_errors = v.take_link_errors(rank_of);
                    (records, link_errors, v.sweep())
                };
                if tracing::enabled!(tracing::Level::DEBUG) {
                    let v = shared.view.lock().unwrap_or_else(|p| p.into_inner());
                    let unowned: Vec<String> = v
                        .flows
                        .values()
                        .filter(|f| f.pid.is_none() && !f.remote.ip().is_loopback())
                        .take(8)
                        .map(|f| format!("{}->{}", f.local, f.remote))
                        .collect();
                    tracing::debug!(
                        "transport view: {} flows in the map, {} records for owners {:?}, {} swept; unowned: {}",
                        flows.len(),
                        records.len(),
                        owned_by.iter().map(|o| o.pid).collect::<Vec<_>>(),
                        gone.len(),
                        unowned.join(" ")
                    );
                }
                probes.forget_flows(&gone);
                use commscope_wire::record::Record;
                let mut by_job: std::collections::BTreeMap<&str, Vec<Record>> =
                    std::collections::BTreeMap::new();
                let owned = records
                    .into_iter()
                    .map(|(pid, r)| (pid, Record::Flow(r)))
                    .chain(link_errors.into_iter().map(|(pid, e)| (pid, Record::LinkEvent(e))));
                // A process without the shim has no job to record into: its link errors stay
                // in the agent's metrics.
                for (pid, r) in owned {
                    if let Some(o) = owned_by.iter().find(|o| o.pid == pid) {
                        by_job.entry(o.job.as_str()).or_default().push(r);
                    }
                }
                for (job, recs) in by_job {
                    sink(job.to_owned(), recs);
                }
                *shared.status.lock().unwrap_or_else(|p| p.into_inner()) = probes.status().clone();
            }
            _ = scan_tick.tick(), if opts.discover => {
                let (root, known, opt) = (opts.proc_root.clone(), probes.known_files.clone(), probes.programs());
                if let Ok(found) = tokio::task::spawn_blocking(move || scan(&root, &known, opt)).await {
                    probes.attach_found(found);
                }
            }
        }
    }
}
