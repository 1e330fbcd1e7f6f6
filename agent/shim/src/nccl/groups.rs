//! Wrappers: `ncclGroupStart`/`ncclGroupEnd` (one event pair per stream around the group end).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::cell::Cell;
use std::ffi::c_int;

use commscope_wire::op::flags;
use commscope_wire::record::Call;
use commscope_wire::shm::in_flight_status;

use crate::cuda::{self};
use crate::state::{Guard, Shim, Slot, active, in_hook, shielded};
use crate::util::now_mono;

use super::record::{hand_over, start_events};
use super::*;

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGroupStart() -> c_int {
    if !in_hook() {
        GROUP_DEPTH.with(|d| d.set(d.get() + 1));
    }
    // SAFETY: no arguments.
    unsafe { real::group_start() }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGroupEnd() -> c_int {
    if in_hook() {
        // SAFETY: no arguments.
        return unsafe { real::group_end() };
    }
    let depth = GROUP_DEPTH.with(Cell::get);
    if depth == 0 {
        // Unbalanced: NCCL reports it.
        // SAFETY: no arguments.
        return unsafe { real::group_end() };
    }
    GROUP_DEPTH.with(|d| d.set(depth - 1));
    if depth > 1 {
        // SAFETY: no arguments.
        return unsafe { real::group_end() };
    }
    let mut members = GROUP.with(|g| std::mem::take(&mut *g.borrow_mut()));
    let rc = match active() {
        Some((shim, guard)) if !members.is_empty() => group_end_recorded(shim, guard, &mut members),
        // SAFETY: no arguments.
        _ => unsafe { real::group_end() },
    };
    members.clear();
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.capacity() < members.capacity() {
            *g = members;
        }
    });
    rc
}

/// Streams of one group that get their own event pair (more are recorded with host times).
pub(super) const GROUP_STREAMS_MAX: usize = 16;

pub(super) fn group_end_recorded(
    shim: &'static Shim,
    guard: Guard,
    members: &mut [Member],
) -> c_int {
    // (stream, in-flight slot, pending slot with a start event)
    let mut streams: Vec<(Stream, Slot, Option<usize>)> = Vec::new();
    let prepared = shielded(shim, || {
        let cu = cuda::get();
        for m in members.iter_mut() {
            if streams.iter().any(|s| s.0 == m.stream) {
                continue;
            }
            if streams.len() >= GROUP_STREAMS_MAX {
                break;
            }
            let captured = cu.is_some_and(|c| c.capturing(m.stream));
            let slot = shim.claim_owned(&m.call, in_flight_status::IN_CALL);
            let gpu = match (cu, slot) {
                (Some(c), Slot::Owned(s)) if !captured => start_events(shim, c, s, m.stream),
                _ => None,
            };
            streams.push((m.stream, slot, gpu));
        }
        for m in members.iter_mut() {
            if cu.is_some_and(|c| c.capturing(m.stream)) {
                m.call.flags |= flags::GRAPH_CAPTURED;
            }
        }
    })
    .is_some();
    // SAFETY: no arguments.
    let rc = unsafe { real::group_end() };
    if !prepared {
        return rc;
    }
    let _ = shielded(shim, || {
        let t = now_mono();
        for m in members.iter_mut() {
            // The group's operations are handed to the GPU at its end.
            m.call.t_exit = t;
            if rc != result::SUCCESS && rc != result::IN_PROGRESS && m.call.status == 0 {
                m.call.status = rc;
            }
        }
        if rc == result::SUCCESS {
            for m in members
                .iter()
                .filter(|m| m.call.flags & flags::GRAPH_CAPTURED != 0)
            {
                crate::graphs::captured(m.stream, m.comm, &m.call);
            }
        }
        let mut calls: Vec<Call> = Vec::new();
        for (stream, slot, gpu) in &streams {
            calls.clear();
            calls.extend(
                members
                    .iter()
                    .filter(|m| m.stream == *stream)
                    .map(|m| m.call),
            );
            hand_over(
                shim,
                gpu.filter(|_| rc == result::SUCCESS),
                *slot,
                *stream,
                &calls,
            );
        }
        // Streams past the limit.
        for m in members
            .iter()
            .filter(|m| !streams.iter().any(|s| s.0 == m.stream))
        {
            shim.push_call(&m.call);
        }
    });
    drop(guard);
    rc
}
