//! NCCL calls inside CUDA graphs. A call issued while its stream is captured only records work
//! into the graph (its record is flagged `GRAPH_CAPTURED`); the collective then runs at every
//! launch of the graph, where NCCL never sees it again. So the shim follows the graph:
//!
//! - a captured call is noted under its capture (the driver's capture id, shared by every stream
//!   joined to the capture; the stream itself with a driver without `cuStreamGetCaptureInfo_v2`);
//! - `cuStreamEndCapture`/`cudaStreamEndCapture` give the capture's graph those calls;
//! - `cu`/`cudaGraphInstantiate*` give the executable graph the graph's calls;
//! - `cu`/`cudaGraphLaunch` of an executable graph with calls is recorded like a group: one
//!   CUDA event pair around the launch on its stream, and at its end one record per captured
//!   call (new `seq`, flagged `GRAPH_CAPTURED | GRAPH_REPLAY`), in flight until the end event
//!   fires — so a replay whose collective never completes is a hang like any other;
//! - `cu`/`cudaGraphExecDestroy` and `cu`/`cudaGraphDestroy` forget them (handles are reused).
//!
//! The GPU interval of a replay is the whole graph's, compute kernels included: the detectors
//! use replays for order, mismatches and hangs, never for durations (the `GRAPH_CAPTURED` bit
//! makes them non-blocking, as for the capture itself).
//!
//! Runtime and driver handles are the same objects, so one table serves both APIs. The runtime
//! reaches the driver through `cuGetProcAddress`, never through these exports, so a runtime
//! launch is seen once. Tables are bounded: beyond [`MAX_GRAPHS`] graphs or [`MAX_CALLS`] calls
//! a graph, the rest are not followed (their capture records remain).

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use commscope_wire::record::Call;

use crate::cuda::Handle;
use crate::resolve::Real;
use crate::state;

/// Graphs (and executable graphs) followed at once.
const MAX_GRAPHS: usize = 4096;
/// Captured calls kept per graph.
const MAX_CALLS: usize = 256;

/// A captured NCCL call: its communicator handle and its record.
pub type Captured = (usize, Call);
/// What a capture, graph or executable graph holds: its captured NCCL calls, in capture order.
type Calls = Arc<Vec<Captured>>;

#[derive(Default)]
struct Tables {
    /// (keyed by capture id?, capture id or stream) → calls captured so far.
    captures: HashMap<(bool, u64), Vec<Captured>>,
    graphs: HashMap<Handle, Calls>,
    execs: HashMap<Handle, Calls>,
}

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);
/// Set once a captured NCCL call was noted: until then every wrapper only forwards (no lock, no
/// driver call), which is all a process without NCCL calls in graphs ever pays.
static FOLLOWING: AtomicBool = AtomicBool::new(false);

fn with<T>(f: impl FnOnce(&mut Tables) -> T) -> T {
    let mut g = TABLES.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(Tables::default))
}

/// Notes a call on communicator `comm` captured on `stream` (called by the NCCL wrappers after
/// NCCL accepted it).
pub fn captured(stream: Handle, comm: usize, call: &Call) {
    let Some(key) = crate::cuda::get().and_then(|cu| cu.capture_key(stream)) else {
        return;
    };
    with(|t| {
        if t.captures.len() >= MAX_GRAPHS && !t.captures.contains_key(&key) {
            return;
        }
        let v = t.captures.entry(key).or_default();
        if v.len() < MAX_CALLS {
            v.push((comm, *call));
        }
        FOLLOWING.store(true, Ordering::Release);
    });
}

/// Whether any capture, graph or executable graph is followed (cheap check for the wrappers).
fn following() -> bool {
    if !FOLLOWING.load(Ordering::Acquire) {
        return false;
    }
    TABLES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .is_some_and(|t| !t.captures.is_empty() || !t.graphs.is_empty() || !t.execs.is_empty())
}

fn end_capture(key: Option<(bool, u64)>, graph: Handle) {
    let Some(key) = key else { return };
    with(|t| {
        let Some(calls) = t.captures.remove(&key) else {
            return;
        };
        if graph != 0 && (t.graphs.len() < MAX_GRAPHS || t.graphs.contains_key(&graph)) {
            t.graphs.insert(graph, Arc::new(calls));
        }
    });
}

fn instantiated(exec: Handle, graph: Handle) {
    with(|t| {
        let calls = t.graphs.get(&graph).cloned();
        match calls {
            Some(c) if t.execs.len() < MAX_GRAPHS || t.execs.contains_key(&exec) => {
                t.execs.insert(exec, c);
            }
            // A reused handle must not keep another graph's calls.
            _ => {
                t.execs.remove(&exec);
            }
        }
    });
}

fn calls_of(exec: Handle) -> Option<Calls> {
    if exec == 0 || !FOLLOWING.load(Ordering::Acquire) {
        return None;
    }
    TABLES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()?
        .execs
        .get(&exec)
        .cloned()
}

/// The capture `stream` belongs to, asked before the capture ends; only while some capture
/// holds NCCL calls.
fn capture_key_before_end(stream: Handle) -> Option<(bool, u64)> {
    if !following() {
        return None;
    }
    let _g = state::enter_hook()?;
    std::panic::catch_unwind(|| crate::cuda::get().and_then(|cu| cu.capture_key(stream)))
        .ok()
        .flatten()
}

fn after_end(key: Option<(bool, u64)>, rc: c_int, graph: *mut Handle) {
    if key.is_none() {
        return;
    }
    let g = if rc == 0 && !graph.is_null() {
        // SAFETY: the caller's out-pointer, written by the real function on success.
        unsafe { *graph }
    } else {
        0
    };
    let _ = std::panic::catch_unwind(|| end_capture(key, g));
}

fn after_instantiate(rc: c_int, exec: *mut Handle, graph: Handle) {
    if rc != 0 || exec.is_null() || !FOLLOWING.load(Ordering::Acquire) {
        return;
    }
    // SAFETY: the caller's out-pointer, written by the real function on success.
    let e = unsafe { *exec };
    let _ = std::panic::catch_unwind(|| instantiated(e, graph));
}

fn forget(graph: Option<Handle>, exec: Option<Handle>) {
    if !FOLLOWING.load(Ordering::Acquire) {
        return;
    }
    let _ = std::panic::catch_unwind(|| {
        with(|t| {
            if let Some(g) = graph {
                t.graphs.remove(&g);
            }
            if let Some(e) = exec {
                t.execs.remove(&e);
            }
        })
    });
}

/// Launches `exec` on `stream` through `launch`, recording its captured NCCL calls.
fn launch(exec: Handle, stream: Handle, launch: impl FnOnce() -> c_int) -> c_int {
    match calls_of(exec) {
        Some(calls) if state::life() == state::life::ACTIVE => {
            crate::nccl::replay(&calls, stream, launch)
        }
        _ => launch(),
    }
}

// ----- the exported wrappers ---------------------------------------------------------------------

type EndCaptureFn = unsafe extern "C" fn(Handle, *mut Handle) -> c_int;
/// Every instantiate variant takes (exec out-pointer, graph) and then one to three integer or
/// pointer arguments, which differ between CUDA versions (`cudaGraphInstantiate` took five
/// arguments before CUDA 12, three since): the wrappers take and pass on three such words
/// whatever the variant, which the C calling convention makes right for all of them.
type InstFn = unsafe extern "C" fn(*mut Handle, Handle, usize, usize, usize) -> c_int;
type LaunchFn = unsafe extern "C" fn(Handle, Handle) -> c_int;
type DestroyFn = unsafe extern "C" fn(Handle) -> c_int;

macro_rules! real {
    ($name:literal, $t:ty) => {{
        static R: Real = Real::new($name);
        // SAFETY: the real definition of that name has the declared C signature.
        unsafe { std::mem::transmute::<usize, $t>(R.target()) }
    }};
}

macro_rules! end_capture_fn {
    ($export:ident, $name:literal) => {
        /// # Safety
        /// The CUDA API's contract for this function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $export(stream: Handle, graph: *mut Handle) -> c_int {
            let f = real!($name, EndCaptureFn);
            let key = capture_key_before_end(stream);
            // SAFETY: forwarded unchanged.
            let rc = unsafe { f(stream, graph) };
            after_end(key, rc, graph);
            rc
        }
    };
}

end_capture_fn!(cuStreamEndCapture, c"cuStreamEndCapture");
end_capture_fn!(cudaStreamEndCapture, c"cudaStreamEndCapture");

macro_rules! instantiate_fn {
    ($export:ident, $name:literal) => {
        /// # Safety
        /// The CUDA API's contract for this function (see [`InstFn`] for its arguments).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $export(
            exec: *mut Handle,
            graph: Handle,
            a: usize,
            b: usize,
            c: usize,
        ) -> c_int {
            let f = real!($name, InstFn);
            // SAFETY: forwarded unchanged.
            let rc = unsafe { f(exec, graph, a, b, c) };
            after_instantiate(rc, exec, graph);
            rc
        }
    };
}

instantiate_fn!(cuGraphInstantiateWithFlags, c"cuGraphInstantiateWithFlags");
instantiate_fn!(
    cuGraphInstantiateWithParams,
    c"cuGraphInstantiateWithParams"
);
instantiate_fn!(cuGraphInstantiate_v2, c"cuGraphInstantiate_v2");
instantiate_fn!(cuGraphInstantiate, c"cuGraphInstantiate");
instantiate_fn!(cudaGraphInstantiate, c"cudaGraphInstantiate");
instantiate_fn!(
    cudaGraphInstantiateWithFlags,
    c"cudaGraphInstantiateWithFlags"
);
instantiate_fn!(
    cudaGraphInstantiateWithParams,
    c"cudaGraphInstantiateWithParams"
);

macro_rules! launch_fn {
    ($export:ident, $name:literal) => {
        /// # Safety
        /// The CUDA API's contract for this function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $export(exec: Handle, stream: Handle) -> c_int {
            let f = real!($name, LaunchFn);
            // SAFETY: forwarded unchanged.
            launch(exec, stream, || unsafe { f(exec, stream) })
        }
    };
}

launch_fn!(cuGraphLaunch, c"cuGraphLaunch");
launch_fn!(cuGraphLaunch_ptsz, c"cuGraphLaunch_ptsz");
launch_fn!(cudaGraphLaunch, c"cudaGraphLaunch");
launch_fn!(cudaGraphLaunch_ptsz, c"cudaGraphLaunch_ptsz");

macro_rules! destroy_fn {
    ($export:ident, $name:literal, $graph:literal) => {
        /// # Safety
        /// The CUDA API's contract for this function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $export(h: Handle) -> c_int {
            let f = real!($name, DestroyFn);
            // Forgotten first: once destroyed, the handle may come back for another graph.
            if $graph {
                forget(Some(h), None);
            } else {
                forget(None, Some(h));
            }
            // SAFETY: forwarded unchanged.
            unsafe { f(h) }
        }
    };
}

destroy_fn!(cuGraphDestroy, c"cuGraphDestroy", true);
destroy_fn!(cudaGraphDestroy, c"cudaGraphDestroy", true);
destroy_fn!(cuGraphExecDestroy, c"cuGraphExecDestroy", false);
destroy_fn!(cudaGraphExecDestroy, c"cudaGraphExecDestroy", false);
