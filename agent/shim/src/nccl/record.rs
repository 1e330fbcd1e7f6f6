//! Recording a call: its record, its in-flight slot and the CUDA events around it.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;

use commscope_wire::op::{Clock, Op, flags};
use commscope_wire::record::Call;
use commscope_wire::shm::in_flight_status;

use crate::cuda::{self, Handle};
use crate::state::{Guard, Shim, Slot, active, shielded};
use crate::tables::Dir;
use crate::util::now_mono;

use super::*;

/// A call being recorded.
pub(super) struct Rec {
    shim: &'static Shim,
    _guard: Guard,
    call: Call,
    comm: NComm,
    stream: Stream,
    slot: Slot,
    /// The pending slot whose start event was recorded.
    gpu: Option<usize>,
    grouped: bool,
}

pub use commscope_wire::op::nccl_count_is_per_rank as count_is_per_rank;

/// What a call is besides its op: a collective, a reducing one (with its `ncclRedOp_t`), or
/// one direction of a point-to-point exchange.
#[derive(Clone, Copy, Debug)]
pub(super) enum Role {
    Coll,
    Reduced(c_int),
    P2p(Dir),
}

#[inline]
#[allow(clippy::too_many_arguments)]
pub(super) fn begin(
    comm: NComm,
    op: Op,
    count: usize,
    dt: c_int,
    peer: i32,
    stream: Stream,
    role: Role,
) -> Option<Rec> {
    let p2p = match role {
        Role::P2p(d) => Some(d),
        _ => None,
    };
    let (shim, guard) = active()?;
    shielded(shim, || {
        let e = shim.nccl_comm(comm);
        let (esize, code) = dtype_info(dt);
        let n = e.map_or(0, |e| e.size.load(Ordering::Relaxed)).max(0) as u64;
        let count = count as u64;
        let per_rank = count_is_per_rank(op);
        let bytes = if per_rank {
            count * esize * n
        } else {
            count * esize
        };
        let mut call = Call {
            op: op as u8,
            peer,
            tag: -1,
            bytes,
            count: if per_rank { count * n } else { count },
            dtype: code,
            rank: shim.rank,
            clock: Clock::HostMono as u8,
            lib: library_code(),
            peer2: -1,
            tag2: -1,
            red_op: match role {
                Role::Reduced(o) => commscope_wire::op::red_op::from_nccl(o),
                _ => commscope_wire::op::red_op::UNKNOWN,
            },
            t_enter: now_mono(),
            ..Default::default()
        };
        if let Some(e) = e {
            e.stamp(&mut call);
            if p2p.is_none() {
                e.next_instance(&mut call, op);
            } else {
                call.seq = e.seq.load(Ordering::Relaxed);
            }
        }
        if let Some(dir) = p2p {
            call.tag = 0;
            shim.assign_p2p_seq(&mut call, dir);
        }
        let grouped = GROUP_DEPTH.with(Cell::get) > 0;
        if grouped {
            return (call, Slot::None, None, true);
        }
        let cu = cuda::get();
        if let Some(cu) = cu
            && cu.capturing(stream)
        {
            call.flags |= flags::GRAPH_CAPTURED;
        }
        let slot = shim.claim_owned(&call, in_flight_status::IN_CALL);
        let mut gpu = None;
        if let (Some(cu), Slot::Owned(s)) = (cu, slot)
            && call.flags & flags::GRAPH_CAPTURED == 0
        {
            gpu = start_events(shim, cu, s, stream);
        }
        (call, slot, gpu, false)
    })
    .map(|(call, slot, gpu, grouped)| Rec {
        shim,
        _guard: guard,
        call,
        comm,
        stream,
        slot,
        gpu,
        grouped,
    })
}

/// The context of a stream, cached per thread.
#[inline]
pub(super) fn ctx_of(cu: &cuda::Cuda, stream: Stream) -> Option<Handle> {
    let (s, c) = STREAM_CTX.with(Cell::get);
    if s == stream && c != 0 && !cuda::is_default_stream(stream) {
        return Some(c);
    }
    let c = cu.stream_ctx(stream)?;
    STREAM_CTX.with(|x| x.set((stream, c)));
    Some(c)
}

/// Makes sure pending slot `s` has events in the stream's context and records the start event.
#[inline]
pub(super) fn start_events(
    shim: &Shim,
    cu: &cuda::Cuda,
    s: usize,
    stream: Stream,
) -> Option<usize> {
    let ctx = ctx_of(cu, stream)?;
    let slot = shim.nccl.pending.get(s)?;
    // SAFETY: in-flight slot `s` is held by this thread, so its pending data is ours.
    let d = unsafe { &mut *slot.data.get() };
    if d.ctx != ctx || d.ev[0] == 0 || d.ev[1] == 0 {
        renew_events(cu, d, ctx)?;
    }
    if !cu.record(d.ev[0], stream) {
        // A stale context cache (a stream handle reused in another context), or events of a
        // context that was destroyed and whose address came back: forget both, so the next call
        // on this slot creates fresh events (the old handles are leaked, never reused).
        STREAM_CTX.with(|x| x.set((usize::MAX, 0)));
        d.ctx = 0;
        d.ev = [0, 0];
        return None;
    }
    Some(s)
}

#[cold]
pub(super) fn renew_events(cu: &cuda::Cuda, d: &mut PendingData, ctx: Handle) -> Option<()> {
    let old = (d.ctx, d.ev);
    let made = cu.in_ctx(ctx, || {
        if old.0 != 0 {
            let _ = cu.in_ctx(old.0, || {
                for e in old.1.into_iter().filter(|&e| e != 0) {
                    cu.destroy_event(e);
                }
            });
        }
        Some([cu.create_event()?, cu.create_event()?])
    })??;
    d.ctx = ctx;
    d.ev = made;
    Some(())
}

/// Finishes recording a call after the real function returned `rc`.
#[inline]
pub(super) fn end(mut r: Rec, rc: c_int) -> c_int {
    let shim = r.shim;
    let _ = shielded(shim, || {
        r.call.t_exit = now_mono();
        // `ncclInProgress` from a nonblocking communicator is not a failure; the work is
        // launched later, so events recorded now would not bracket it.
        r.call.status = if rc == result::IN_PROGRESS { 0 } else { rc };
        if r.grouped {
            GROUP.with(|g| {
                g.borrow_mut().push(Member {
                    call: r.call,
                    stream: r.stream,
                    comm: r.comm,
                })
            });
            return;
        }
        if r.call.flags & flags::GRAPH_CAPTURED != 0 && rc == result::SUCCESS {
            crate::graphs::captured(r.stream, r.comm, &r.call);
        }
        hand_over(
            shim,
            r.gpu.filter(|_| rc == result::SUCCESS),
            r.slot,
            r.stream,
            std::slice::from_ref(&r.call),
        );
    });
    rc
}

/// After the real call: hands `calls` to the poller with pending slot `gpu` (its start event
/// recorded; `None` when there is none or the launch failed), else frees in-flight `slot` and
/// writes them with host times.
pub(super) fn hand_over(
    shim: &Shim,
    gpu: Option<usize>,
    slot: Slot,
    stream: Stream,
    calls: &[Call],
) {
    if let Some(s) = gpu
        && submit(shim, s, stream, calls)
    {
        return;
    }
    shim.unclaim(slot);
    for c in calls {
        shim.push_call(c);
    }
}

/// Records the end event and hands pending slot `s` (holding `calls`) to the poller. False
/// when the event could not be recorded (the caller then writes the records itself).
pub(super) fn submit(shim: &Shim, s: usize, stream: Stream, calls: &[Call]) -> bool {
    let Some(cu) = cuda::get() else { return false };
    let Some(slot) = shim.nccl.pending.get(s) else {
        return false;
    };
    // SAFETY: in-flight slot `s` is held by this thread until `ready` is set below.
    let d = unsafe { &mut *slot.data.get() };
    if !cu.record(d.ev[1], stream) {
        return false;
    }
    d.calls.clear();
    d.calls.extend_from_slice(calls);
    if let Some(first) = calls.first()
        && let Some(mut e) = shim.shm.in_flight_read(s)
    {
        e.status = in_flight_status::ON_GPU;
        e.seq = first.seq;
        shim.shm.in_flight_write(s, &e);
    }
    shim.nccl.busy.fetch_add(1, Ordering::Relaxed);
    slot.ready.store(true, Ordering::Release);
    start_poller(shim);
    true
}

/// Records one launch of a CUDA graph on `stream` whose capture held `calls` (`launch` makes the
/// real launch): like a group, one event pair around the launch and one record per captured call
/// at its end, each with a new `seq` (the communicator's next) and flagged
/// `GRAPH_CAPTURED | GRAPH_REPLAY`. `op_seq` stays the capture's: NCCL's own per-function
/// counter does not move at a replay. A launch that fails, or is itself being captured, gives no
/// records.
pub fn replay(
    calls: &[crate::graphs::Captured],
    stream: Stream,
    launch: impl FnOnce() -> c_int,
) -> c_int {
    let Some((shim, guard)) = active() else {
        return launch();
    };
    let cu = cuda::get();
    if calls.is_empty() || cu.is_some_and(|c| c.capturing(stream)) {
        drop(guard);
        return launch();
    }
    let mut recs: Vec<Call> = Vec::with_capacity(calls.len());
    let mut slot = Slot::None;
    let mut gpu = None;
    let prepared = shielded(shim, || {
        let t = now_mono();
        for (h, tmpl) in calls {
            let mut c = *tmpl;
            c.flags |= flags::GRAPH_CAPTURED | flags::GRAPH_REPLAY;
            (c.t_enter, c.t_exit, c.status, c.gpu_start, c.gpu_end) = (t, 0, 0, 0, 0);
            let op = c.op();
            if op.is_p2p() {
                let dir = if op == Op::Send { Dir::Send } else { Dir::Recv };
                shim.assign_p2p_seq(&mut c, dir);
            } else if let Some(e) = shim.nccl.comms.get(*h as u64) {
                // A handle destroyed since the capture is not looked at (not adopted).
                c.seq = e.seq.load(Ordering::Relaxed);
                e.seq.store(c.seq + 1, Ordering::Relaxed);
            }
            recs.push(c);
        }
        slot = shim.claim_owned(&recs[0], in_flight_status::IN_CALL);
        if let (Some(cu), Slot::Owned(s)) = (cu, slot) {
            gpu = start_events(shim, cu, s, stream);
        }
    })
    .is_some();
    let rc = launch();
    if !prepared {
        return rc;
    }
    let _ = shielded(shim, || {
        let t = now_mono();
        for c in recs.iter_mut() {
            c.t_exit = t;
        }
        if rc != 0 {
            // Nothing ran; the seq numbers taken are a gap, as for a failed collective.
            shim.unclaim(slot);
            return;
        }
        hand_over(shim, gpu, slot, stream, &recs);
    });
    drop(guard);
    rc
}
