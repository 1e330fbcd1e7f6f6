//! The CUDA driver API, loaded at run time with `dlopen("libcuda.so.1")`: no build-time CUDA
//! dependency, and a process without a GPU (or without a driver) simply gets no GPU timing. When
//! the collective library is RCCL the same entry points come from AMD's HIP runtime
//! (`libamdhip64.so`), whose functions used here have the same shapes and codes ([`Names`]).
//!
//! The shim uses it for one thing: timing NCCL work on the GPU with a pair of events recorded on
//! the call's stream. Events come from a pool owned by the pending-work slots (`nccl`), are
//! created lazily in the stream's context, and are never destroyed while a slot may reuse them.
//!
//! GPU event times are relative: `cuEventElapsedTime` gives milliseconds between two events of
//! one context. The poller maps them onto host `CLOCK_MONOTONIC` with an *anchor* per context: an
//! event recorded on a private, otherwise idle stream and waited for, bracketed by two host clock
//! reads (see [`Cuda::anchor`]).

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUcontext`, `CUstream`, `CUevent`: opaque pointers, kept as machine words.
pub type Handle = usize;

pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
pub const CAPTURE_NONE: c_int = 0;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
pub const CAPTURE_ACTIVE: c_int = 1;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
pub const CAPTURE_MODE_RELAXED: c_int = 2;
/// `CU_STREAM_NON_BLOCKING`.
const STREAM_NON_BLOCKING: c_uint = 1;
/// `CU_EVENT_DEFAULT` (timing enabled).
const EVENT_DEFAULT: c_uint = 0;

/// The legacy default stream (`0`/`CU_STREAM_LEGACY`) and the per-thread default stream
/// (`CU_STREAM_PER_THREAD`): handles that name no stream object, so their context is the
/// calling thread's current one.
pub fn is_default_stream(s: Handle) -> bool {
    s <= 2
}

type FnCtxGetCurrent = unsafe extern "C" fn(*mut Handle) -> CuResult;
type FnCtxSetCurrent = unsafe extern "C" fn(Handle) -> CuResult;
type FnCtxPush = unsafe extern "C" fn(Handle) -> CuResult;
type FnCtxPop = unsafe extern "C" fn(*mut Handle) -> CuResult;
type FnCtxGetDevice = unsafe extern "C" fn(*mut c_int) -> CuResult;
type FnStreamGetCtx = unsafe extern "C" fn(Handle, *mut Handle) -> CuResult;
type FnStreamIsCapturing = unsafe extern "C" fn(Handle, *mut c_int) -> CuResult;
type FnStreamCreate = unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult;
type FnEventCreate = unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult;
type FnEventRecord = unsafe extern "C" fn(Handle, Handle) -> CuResult;
type FnEventQuery = unsafe extern "C" fn(Handle) -> CuResult;
type FnEventSynchronize = unsafe extern "C" fn(Handle) -> CuResult;
type FnEventElapsed = unsafe extern "C" fn(*mut f32, Handle, Handle) -> CuResult;
type FnEventDestroy = unsafe extern "C" fn(Handle) -> CuResult;
type FnExchangeCaptureMode = unsafe extern "C" fn(*mut c_int) -> CuResult;
type FnInit = unsafe extern "C" fn(c_uint) -> CuResult;
/// `cuStreamGetCaptureInfo_v2(stream, *status, *id, *graph, *deps, *numDeps)`.
type FnCaptureInfo = unsafe extern "C" fn(
    Handle,
    *mut c_int,
    *mut u64,
    *mut Handle,
    *mut *const Handle,
    *mut usize,
) -> CuResult;

/// The driver entry points the shim uses.
#[derive(Debug)]
pub struct Cuda {
    ctx_get_current: FnCtxGetCurrent,
    ctx_set_current: FnCtxSetCurrent,
    ctx_push: FnCtxPush,
    ctx_pop: FnCtxPop,
    ctx_get_device: FnCtxGetDevice,
    /// `None` for HIP (see [`Names`]).
    stream_get_ctx: Option<FnStreamGetCtx>,
    stream_is_capturing: FnStreamIsCapturing,
    stream_create: FnStreamCreate,
    event_create: FnEventCreate,
    event_record: FnEventRecord,
    event_query: FnEventQuery,
    event_synchronize: FnEventSynchronize,
    event_elapsed: FnEventElapsed,
    event_destroy: FnEventDestroy,
    exchange_capture_mode: Option<FnExchangeCaptureMode>,
    capture_info: Option<FnCaptureInfo>,
    /// "CUDA" or "HIP".
    pub api: &'static str,
}

mod load {
    pub const UNTRIED: u8 = 0;
    pub const LOADED: u8 = 1;
    pub const UNAVAILABLE: u8 = 2;
}

static STATE: AtomicU8 = AtomicU8::new(load::UNTRIED);
static CUDA: AtomicPtr<Cuda> = AtomicPtr::new(std::ptr::null_mut());
static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The driver API, loaded on first use; `None` when no usable `libcuda.so.1` is present (or
/// `COMMSCOPE_GPU_TIMING=0`). Reported once.
#[inline]
pub fn get() -> Option<&'static Cuda> {
    match STATE.load(Ordering::Acquire) {
        // SAFETY: set to a leaked, never freed Box before LOADED is published.
        load::LOADED => unsafe { CUDA.load(Ordering::Acquire).as_ref() },
        load::UNAVAILABLE => None,
        _ => load_slow(),
    }
}

#[cold]
fn load_slow() -> Option<&'static Cuda> {
    let _g = LOADING.lock().unwrap_or_else(|p| p.into_inner());
    if STATE.load(Ordering::Acquire) != load::UNTRIED {
        drop(_g);
        return get();
    }
    if !crate::util::env_flag("COMMSCOPE_GPU_TIMING", true) {
        STATE.store(load::UNAVAILABLE, Ordering::Release);
        return None;
    }
    match Cuda::open() {
        Ok(c) => {
            let c: &'static Cuda = Box::leak(Box::new(c));
            CUDA.store(c as *const Cuda as *mut Cuda, Ordering::Release);
            STATE.store(load::LOADED, Ordering::Release);
            Some(c)
        }
        Err(why) => {
            STATE.store(load::UNAVAILABLE, Ordering::Release);
            crate::util::warn(format_args!(
                "no GPU timing: {why}; NCCL calls are recorded with host times only"
            ));
            None
        }
    }
}

fn sym(lib: *mut c_void, names: &[&CStr]) -> Option<*mut c_void> {
    names.iter().find_map(|n| {
        // SAFETY: a handle from dlopen and a NUL-terminated name.
        let p = unsafe { libc::dlsym(lib, n.as_ptr()) };
        (!p.is_null()).then_some(p)
    })
}

/// The entry points' names in one GPU API: NVIDIA's driver API, or AMD's HIP runtime (for RCCL),
/// whose functions used here have the same shapes, error codes (0 success, 600 not ready) and
/// capture constants. HIP has no `cuStreamGetCtx`: a stream is taken to be in the current
/// context (one device per process, as RCCL jobs run; a stream of another device makes the
/// event record fail, and the call is then timed on the host).
struct Names {
    libs: &'static [&'static CStr],
    api: &'static str,
    init: &'static CStr,
    ctx_get_current: &'static CStr,
    ctx_set_current: &'static CStr,
    ctx_push: &'static [&'static CStr],
    ctx_pop: &'static [&'static CStr],
    ctx_get_device: &'static CStr,
    stream_get_ctx: Option<&'static CStr>,
    stream_is_capturing: &'static CStr,
    stream_create: &'static [&'static CStr],
    event_create: &'static [&'static CStr],
    event_record: &'static CStr,
    event_query: &'static CStr,
    event_synchronize: &'static CStr,
    event_elapsed: &'static [&'static CStr],
    event_destroy: &'static [&'static CStr],
    exchange_capture_mode: &'static CStr,
    capture_info: &'static CStr,
}

const CUDA_NAMES: Names = Names {
    libs: &[c"libcuda.so.1"],
    api: "CUDA",
    init: c"cuInit",
    ctx_get_current: c"cuCtxGetCurrent",
    ctx_set_current: c"cuCtxSetCurrent",
    ctx_push: &[c"cuCtxPushCurrent_v2", c"cuCtxPushCurrent"],
    ctx_pop: &[c"cuCtxPopCurrent_v2", c"cuCtxPopCurrent"],
    ctx_get_device: c"cuCtxGetDevice",
    stream_get_ctx: Some(c"cuStreamGetCtx"),
    stream_is_capturing: c"cuStreamIsCapturing",
    stream_create: &[c"cuStreamCreate"],
    event_create: &[c"cuEventCreate"],
    event_record: c"cuEventRecord",
    event_query: c"cuEventQuery",
    event_synchronize: c"cuEventSynchronize",
    event_elapsed: &[c"cuEventElapsedTime", c"cuEventElapsedTime_v2"],
    event_destroy: &[c"cuEventDestroy_v2", c"cuEventDestroy"],
    exchange_capture_mode: c"cuThreadExchangeStreamCaptureMode",
    capture_info: c"cuStreamGetCaptureInfo_v2",
};

const HIP_NAMES: Names = Names {
    libs: &[c"libamdhip64.so", c"libamdhip64.so.6", c"libamdhip64.so.5"],
    api: "HIP",
    init: c"hipInit",
    ctx_get_current: c"hipCtxGetCurrent",
    ctx_set_current: c"hipCtxSetCurrent",
    ctx_push: &[c"hipCtxPushCurrent"],
    ctx_pop: &[c"hipCtxPopCurrent"],
    ctx_get_device: c"hipCtxGetDevice",
    stream_get_ctx: None,
    stream_is_capturing: c"hipStreamIsCapturing",
    stream_create: &[c"hipStreamCreateWithFlags"],
    event_create: &[c"hipEventCreateWithFlags"],
    event_record: c"hipEventRecord",
    event_query: c"hipEventQuery",
    event_synchronize: c"hipEventSynchronize",
    event_elapsed: &[c"hipEventElapsedTime"],
    event_destroy: &[c"hipEventDestroy"],
    exchange_capture_mode: c"hipThreadExchangeStreamCaptureMode",
    capture_info: c"hipStreamGetCaptureInfo_v2",
};

impl Cuda {
    /// NVIDIA's driver API, or HIP when the collective library is RCCL.
    fn open() -> Result<Cuda, String> {
        if crate::nccl::library_code() == commscope_wire::op::lib::RCCL {
            Cuda::open_with(&HIP_NAMES)
        } else {
            Cuda::open_with(&CUDA_NAMES)
        }
    }

    fn open_with(n: &Names) -> Result<Cuda, String> {
        let Some((lib, lib_name)) = n.libs.iter().find_map(|l| {
            // SAFETY: a NUL-terminated library name; RTLD_NOW resolves everything up front.
            let h = unsafe { libc::dlopen(l.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            (!h.is_null()).then(|| (h, l.to_string_lossy()))
        }) else {
            return Err(format!(
                "{} could not be loaded (no {} driver)",
                n.libs[0].to_string_lossy(),
                if n.api == "HIP" { "ROCm" } else { "NVIDIA" }
            ));
        };
        macro_rules! need {
            ($t:ty; $names:expr) => {
                match sym(lib, $names) {
                    // SAFETY: the API's function of that name has the declared C signature.
                    Some(p) => unsafe { std::mem::transmute::<*mut c_void, $t>(p) },
                    None => {
                        return Err(format!(
                            "{lib_name} lacks {}",
                            $names
                                .iter()
                                .map(|x| x.to_string_lossy())
                                .collect::<Vec<_>>()
                                .join(" or ")
                        ))
                    }
                }
            };
        }
        let init: FnInit = need!(FnInit; &[n.init]);
        // SAFETY: the init call is idempotent; the application has normally made it already.
        let rc = unsafe { init(0) };
        if rc != CUDA_SUCCESS {
            return Err(format!(
                "{} failed with {} error {rc}",
                n.init.to_string_lossy(),
                n.api
            ));
        }
        Ok(Cuda {
            ctx_get_current: need!(FnCtxGetCurrent; &[n.ctx_get_current]),
            ctx_set_current: need!(FnCtxSetCurrent; &[n.ctx_set_current]),
            ctx_push: need!(FnCtxPush; n.ctx_push),
            ctx_pop: need!(FnCtxPop; n.ctx_pop),
            ctx_get_device: need!(FnCtxGetDevice; &[n.ctx_get_device]),
            stream_get_ctx: match n.stream_get_ctx {
                Some(name) => Some(need!(FnStreamGetCtx; &[name])),
                None => None,
            },
            stream_is_capturing: need!(FnStreamIsCapturing; &[n.stream_is_capturing]),
            stream_create: need!(FnStreamCreate; n.stream_create),
            event_create: need!(FnEventCreate; n.event_create),
            event_record: need!(FnEventRecord; &[n.event_record]),
            event_query: need!(FnEventQuery; &[n.event_query]),
            event_synchronize: need!(FnEventSynchronize; &[n.event_synchronize]),
            event_elapsed: need!(FnEventElapsed; n.event_elapsed),
            event_destroy: need!(FnEventDestroy; n.event_destroy),
            exchange_capture_mode: sym(lib, &[n.exchange_capture_mode])
                // SAFETY: as above.
                .map(|p| unsafe { std::mem::transmute::<*mut c_void, FnExchangeCaptureMode>(p) }),
            capture_info: sym(lib, &[n.capture_info])
                // SAFETY: as above (the CUDA 11.3+ / HIP signature of that versioned name).
                .map(|p| unsafe { std::mem::transmute::<*mut c_void, FnCaptureInfo>(p) }),
            api: n.api,
        })
    }

    /// The context a stream belongs to (the current one for the default streams).
    #[inline]
    pub fn stream_ctx(&self, stream: Handle) -> Option<Handle> {
        let mut ctx: Handle = 0;
        // SAFETY: a valid out-pointer; the stream is the application's.
        let rc = unsafe {
            match self.stream_get_ctx {
                Some(f) if !is_default_stream(stream) => f(stream, &mut ctx),
                _ => (self.ctx_get_current)(&mut ctx),
            }
        };
        (rc == CUDA_SUCCESS && ctx != 0).then_some(ctx)
    }

    /// Whether work on `stream` is being captured into a graph. An error answers yes: events
    /// are then left out, which can never break a capture.
    #[inline]
    pub fn capturing(&self, stream: Handle) -> bool {
        let mut st: c_int = CAPTURE_NONE;
        // SAFETY: a valid out-pointer; querying capture state is allowed during capture.
        let rc = unsafe { (self.stream_is_capturing)(stream, &mut st) };
        rc != CUDA_SUCCESS || st != CAPTURE_NONE
    }

    /// The capture `stream` takes part in: the driver's unique capture id (every stream joined
    /// to one capture shares it), else — with a driver without `cuStreamGetCaptureInfo_v2` —
    /// the stream itself. `None` when it is not capturing.
    pub fn capture_key(&self, stream: Handle) -> Option<(bool, u64)> {
        let Some(info) = self.capture_info else {
            return self.capturing(stream).then_some((false, stream as u64));
        };
        let (mut st, mut id): (c_int, u64) = (CAPTURE_NONE, 0);
        // SAFETY: valid out-pointers; the optional ones are null, which the driver allows.
        let rc = unsafe {
            info(
                stream,
                &mut st,
                &mut id,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        (rc == CUDA_SUCCESS && st == CAPTURE_ACTIVE).then_some((true, id))
    }

    /// Records `event` on `stream`.
    #[inline]
    pub fn record(&self, event: Handle, stream: Handle) -> bool {
        // SAFETY: an event this module created in the stream's context.
        unsafe { (self.event_record)(event, stream) == CUDA_SUCCESS }
    }

    /// `Some(true)` when the event completed, `Some(false)` while pending, `None` on an error
    /// (the context is gone, or the work failed).
    #[inline]
    pub fn query(&self, event: Handle) -> Option<bool> {
        // SAFETY: an event this module created.
        match unsafe { (self.event_query)(event) } {
            CUDA_SUCCESS => Some(true),
            CUDA_ERROR_NOT_READY => Some(false),
            _ => None,
        }
    }

    /// Milliseconds from `a` to `b` (both completed, same context); may be negative.
    #[inline]
    pub fn elapsed_ms(&self, a: Handle, b: Handle) -> Option<f32> {
        let mut ms = 0f32;
        // SAFETY: a valid out-pointer and two events of one context.
        let rc = unsafe { (self.event_elapsed)(&mut ms, a, b) };
        (rc == CUDA_SUCCESS && ms.is_finite()).then_some(ms)
    }

    /// Runs `f` with `ctx` current on this thread and capture interaction relaxed (so creating
    /// objects while another thread captures a graph in global mode neither fails nor
    /// invalidates that capture); restores both.
    pub fn in_ctx<T>(&self, ctx: Handle, f: impl FnOnce() -> T) -> Option<T> {
        let mut cur: Handle = 0;
        // SAFETY: a valid out-pointer.
        unsafe { (self.ctx_get_current)(&mut cur) };
        let pushed = cur != ctx;
        // SAFETY: a context the driver gave us for a live stream.
        if pushed && unsafe { (self.ctx_push)(ctx) } != CUDA_SUCCESS {
            return None;
        }
        let mut mode = CAPTURE_MODE_RELAXED;
        if let Some(x) = self.exchange_capture_mode {
            // SAFETY: a valid in/out pointer.
            unsafe { x(&mut mode) };
        }
        let out = f();
        if let Some(x) = self.exchange_capture_mode {
            // SAFETY: restores the thread's previous mode.
            unsafe { x(&mut mode) };
        }
        if pushed {
            let mut popped: Handle = 0;
            // SAFETY: pops what we pushed.
            unsafe { (self.ctx_pop)(&mut popped) };
        }
        Some(out)
    }

    /// A timing event in the current context.
    pub fn create_event(&self) -> Option<Handle> {
        let mut e: Handle = 0;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.event_create)(&mut e, EVENT_DEFAULT) };
        (rc == CUDA_SUCCESS && e != 0).then_some(e)
    }

    /// Destroys an event.
    pub fn destroy_event(&self, e: Handle) {
        // SAFETY: an event this module created and no longer uses.
        unsafe { (self.event_destroy)(e) };
    }

    /// The device ordinal of the current context.
    pub fn current_device(&self) -> i32 {
        let mut d: c_int = -1;
        // SAFETY: a valid out-pointer.
        if unsafe { (self.ctx_get_device)(&mut d) } != CUDA_SUCCESS {
            return -1;
        }
        d
    }

    /// Makes `ctx` current on this thread (the poller's own thread) and relaxes its capture
    /// interaction mode for good.
    pub fn enter_poller_ctx(&self, ctx: Handle) -> bool {
        if let Some(x) = self.exchange_capture_mode {
            let mut mode = CAPTURE_MODE_RELAXED;
            // SAFETY: a valid in/out pointer; the poller thread stays relaxed.
            unsafe { x(&mut mode) };
        }
        // SAFETY: a context of a stream the application used.
        unsafe { (self.ctx_set_current)(ctx) == CUDA_SUCCESS }
    }

    /// A private non-blocking stream in the current context (for anchors).
    pub fn create_stream(&self) -> Option<Handle> {
        let mut s: Handle = 0;
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.stream_create)(&mut s, STREAM_NON_BLOCKING) };
        (rc == CUDA_SUCCESS && s != 0).then_some(s)
    }

    /// Records `event` on the private `stream` and waits for it, between two host clock reads.
    /// Returns the host-mono time the event stands for and the uncertainty (half the bracket).
    pub fn anchor(&self, event: Handle, stream: Handle) -> Option<(u64, u64)> {
        let t0 = crate::util::now_mono();
        if !self.record(event, stream) {
            return None;
        }
        // SAFETY: an event just recorded on our own idle stream: the wait is short.
        if unsafe { (self.event_synchronize)(event) } != CUDA_SUCCESS {
            return None;
        }
        let t1 = crate::util::now_mono();
        Some((t0 + (t1 - t0) / 2, (t1 - t0) / 2))
    }
}
