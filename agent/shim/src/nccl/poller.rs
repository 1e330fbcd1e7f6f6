//! The GPU poller thread: completes calls whose end event fired, polls async errors.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_int;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::cuda::{self, Handle};
use crate::state::{self, Shim};
use crate::util::{self, now_mono};

use super::*;

/// Starts the poller thread once.
pub fn start_poller(shim: &Shim) {
    if shim.nccl.poller_started.swap(true, Ordering::AcqRel) {
        return;
    }
    let Some(shim) = state::shim() else { return };
    let spawned = std::thread::Builder::new()
        .name("commscope-gpu".into())
        .spawn(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| poller(shim)));
            shim.nccl.poller_done.store(true, Ordering::Release);
        });
    if spawned.is_err() {
        shim.nccl.poller_done.store(true, Ordering::Release);
        util::warn(format_args!(
            "cannot start the GPU poller thread; NCCL calls are recorded without GPU times"
        ));
    }
}

/// Per-context mapping of GPU event time onto host `CLOCK_MONOTONIC`.
#[derive(Debug)]
pub(super) struct Anchor {
    stream: Handle,
    event: Handle,
    /// Host-mono time of the anchor event; 0 until one was taken.
    host_ns: u64,
    taken_at: u64,
}

/// Re-anchor this often (`cuEventElapsedTime` is a float of milliseconds: keeping the distance
/// to the anchor short keeps it precise to well under a microsecond).
pub(super) const ANCHOR_EVERY_NS: u64 = 2_000_000_000;
/// An anchor bracketed this tightly is taken at once; else the best of a few tries.
pub(super) const ANCHOR_GOOD_NS: u64 = 20_000;
pub(super) const ANCHOR_TRIES: usize = 4;

pub(super) fn poller(shim: &'static Shim) {
    let busy_wait = Duration::from_micros(util::env_u64("COMMSCOPE_GPU_POLL_US", 500, 50, 100_000));
    let idle_wait = Duration::from_millis(5);
    let mut anchors: Vec<(Handle, Anchor)> = Vec::new();
    let mut current_ctx: Handle = 0;
    let mut last_async = 0u64;
    loop {
        let stopping = shim.stop.load(Ordering::Acquire) || state::life() != state::life::ACTIVE;
        let mut waiting = false;
        if let Some(cu) = cuda::get().filter(|_| shim.nccl.busy.load(Ordering::Relaxed) > 0) {
            for (i, slot) in shim.nccl.pending.iter().enumerate() {
                if !slot.ready.load(Ordering::Acquire) {
                    continue;
                }
                if !complete(shim, cu, i, slot, &mut anchors, &mut current_ctx) {
                    waiting = true;
                }
            }
        }
        let now = now_mono();
        if now.saturating_sub(last_async) >= 1_000_000_000 || stopping {
            last_async = now;
            poll_async_errors(shim);
            crate::profiler::sweep(now);
        }
        if stopping {
            return;
        }
        std::thread::sleep(if waiting { busy_wait } else { idle_wait });
    }
}

/// Completes pending slot `i` if its end event fired (or failed). False while it is pending.
pub(super) fn complete(
    shim: &Shim,
    cu: &cuda::Cuda,
    i: usize,
    slot: &PendingSlot,
    anchors: &mut Vec<(Handle, Anchor)>,
    current_ctx: &mut Handle,
) -> bool {
    // SAFETY: `ready` was set with release ordering by the holder, who no longer touches it.
    let d = unsafe { &mut *slot.data.get() };
    if *current_ctx != d.ctx {
        if !cu.enter_poller_ctx(d.ctx) {
            return false;
        }
        *current_ctx = d.ctx;
    }
    let times = match cu.query(d.ev[1]) {
        Some(false) => return false,
        Some(true) => gpu_times(cu, d, anchors),
        // The work failed or the context is gone: the records keep their host times.
        None => None,
    };
    for c in d.calls.iter_mut() {
        if let Some((a, b)) = times {
            c.gpu_start = a;
            c.gpu_end = b;
        }
        shim.push_call(c);
    }
    d.calls.clear();
    slot.ready.store(false, Ordering::Release);
    shim.nccl.busy.fetch_sub(1, Ordering::Relaxed);
    shim.shm.in_flight_release(i);
    true
}

/// (start, end) of a completed event pair on the host-mono clock.
pub(super) fn gpu_times(
    cu: &cuda::Cuda,
    d: &PendingData,
    anchors: &mut Vec<(Handle, Anchor)>,
) -> Option<(u64, u64)> {
    let now = now_mono();
    let pos = match anchors.iter().position(|(c, _)| *c == d.ctx) {
        Some(p) => p,
        None => {
            let stream = cu.create_stream()?;
            let event = cu.create_event()?;
            anchors.push((
                d.ctx,
                Anchor {
                    stream,
                    event,
                    host_ns: 0,
                    taken_at: 0,
                },
            ));
            anchors.len() - 1
        }
    };
    let a = &mut anchors[pos].1;
    if a.host_ns == 0 || now.saturating_sub(a.taken_at) >= ANCHOR_EVERY_NS {
        // The tightest of a few brackets: a preempted poller would widen one.
        let mut best: Option<(u64, u64)> = None;
        for _ in 0..ANCHOR_TRIES {
            if let Some((t, err)) = cu.anchor(a.event, a.stream)
                && best.is_none_or(|b| err < b.1)
            {
                best = Some((t, err));
            }
            if best.is_some_and(|b| b.1 <= ANCHOR_GOOD_NS) {
                break;
            }
        }
        let (t, _) = best?;
        a.host_ns = t;
        a.taken_at = now;
    }
    let to_start = cu.elapsed_ms(a.event, d.ev[0])?;
    let dur = cu.elapsed_ms(d.ev[0], d.ev[1])?.max(0.0);
    let start = a.host_ns as i128 + (f64::from(to_start) * 1e6) as i128;
    let start = start.max(1) as u64;
    Some((start, start + (f64::from(dur) * 1e6) as u64))
}

pub(super) fn poll_async_errors(shim: &Shim) {
    let mut found = Vec::new();
    {
        // Held across the queries: a communicator is taken off this list (under the lock)
        // before the application's destroy or abort reaches NCCL.
        let live = shim.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
        for l in live.iter().filter(|l| !l.reported) {
            let mut err: c_int = 0;
            // SAFETY: a live communicator (see above); a valid out-pointer.
            let rc = unsafe { real::poll_async_error(l.handle, &mut err) };
            if rc == result::SUCCESS && err != result::SUCCESS && err != result::IN_PROGRESS {
                found.push((l.handle, err));
            }
        }
    }
    for (h, err) in found {
        shim.nccl_async_error(h, err);
    }
}

/// Stops the poller at shutdown, letting it write what completed; waits at most `wait`.
pub fn stop(shim: &Shim, wait: Duration) {
    if !shim.nccl.poller_started.load(Ordering::Acquire) {
        return;
    }
    let deadline = std::time::Instant::now() + wait;
    while !shim.nccl.poller_done.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}
