//! Wrappers: communicator creation, split, shrink, finalize, destroy, abort, async errors.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;

use commscope_wire::nccl_hash::{self};
use commscope_wire::record::CommEvent;

use crate::state::{self, Shim, active, enter_hook, shielded};

use super::identity::{
    comm_device, config_name, current_device, ensure_active, hash_version, local_id,
};
use super::*;

/// Records a communicator made from a unique id (InitRank, InitRankConfig, InitRankScalable).
///
/// # Safety
/// `comm` and `config` are the application's arguments after the real call returned `rc`.
pub(super) unsafe fn after_init(
    comm: *mut NComm,
    nranks: c_int,
    rank: c_int,
    id: &UniqueId,
    config: CP,
    rc: c_int,
) {
    let hash = nccl_hash::init_comm_hash(hash_version(), &id.internal);
    ensure_active(rank, nranks, hash);
    let Some((shim, _g)) = active() else { return };
    // SAFETY: per the contract.
    let name = unsafe { config_name(config) };
    shielded(shim, || {
        // SAFETY: `comm` is the application's out-pointer, written by NCCL on success.
        let h = if comm.is_null() { 0 } else { unsafe { *comm } };
        if (rc == result::SUCCESS || rc == result::IN_PROGRESS) && h != 0 {
            let dev = if rc == result::SUCCESS && GROUP_DEPTH.with(Cell::get) == 0 {
                comm_device(h)
            } else {
                current_device()
            };
            shim.nccl_created(h, hash, 0, rank, nranks, false, name.as_deref(), dev);
        } else {
            shim.nccl_init_failed(hash, 0, rank, nranks, rc);
        }
    });
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NComm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> c_int {
    let Some(hook) = enter_hook() else {
        // SAFETY: pass-through of the caller's arguments.
        return unsafe { real::comm_init_rank(comm, nranks, id, rank) };
    };
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_init_rank(comm, nranks, id, rank) };
    drop(hook);
    // SAFETY: the arguments after the real call.
    unsafe { after_init(comm, nranks, rank, &id, std::ptr::null(), rc) };
    rc
}

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclCommInitRankConfig, [c"pncclCommInitRankConfig", c"ncclCommInitRankConfig"]:
    pub unsafe extern "C" fn wrapper(
        comm: *mut NComm,
        nranks: c_int,
        id: UniqueId,
        rank: c_int,
        config: P,
    ) -> c_int {
        let Some(hook) = enter_hook() else {
            // SAFETY: pass-through.
            return unsafe { real::comm_init_rank_config(comm, nranks, id, rank, config) };
        };
        // SAFETY: pass-through of the application's arguments.
        let rc = unsafe { real::comm_init_rank_config(comm, nranks, id, rank, config) };
        drop(hook);
        // SAFETY: the arguments after the real call.
        unsafe { after_init(comm, nranks, rank, &id, config, rc) };
        rc
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclCommInitRankScalable, [c"pncclCommInitRankScalable", c"ncclCommInitRankScalable"]:
    pub unsafe extern "C" fn wrapper(
        comm: *mut NComm,
        nranks: c_int,
        rank: c_int,
        nid: c_int,
        ids: *mut UniqueId,
        config: P,
    ) -> c_int {
        let Some(hook) = enter_hook() else {
            // SAFETY: pass-through.
            return unsafe { real::comm_init_rank_scalable(comm, nranks, rank, nid, ids, config) };
        };
        // SAFETY: pass-through of the application's arguments.
        let rc = unsafe { real::comm_init_rank_scalable(comm, nranks, rank, nid, ids, config) };
        drop(hook);
        if !ids.is_null() && nid > 0 {
            // SAFETY: NCCL hashes the first of the `nid` ids the caller passed.
            let first = unsafe { *ids };
            // SAFETY: the arguments after the real call.
            unsafe { after_init(comm, nranks, rank, &first, config, rc) };
        }
        rc
    }
);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> c_int {
    // SAFETY: pass-through of the caller's argument.
    let rc = unsafe { real::get_unique_id(id) };
    // Inside ncclCommInitAll (NCCL calls this export itself): keep the id it drew.
    if rc == result::SUCCESS && !id.is_null() && CAPTURING_INIT_ALL.with(Cell::get) {
        // SAFETY: NCCL just wrote the id.
        INIT_ALL_ID.with(|c| c.set(Some(unsafe { *id })));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut NComm,
    ndev: c_int,
    devlist: *const c_int,
) -> c_int {
    let Some(hook) = enter_hook() else {
        // SAFETY: pass-through.
        return unsafe { real::comm_init_all(comms, ndev, devlist) };
    };
    CAPTURING_INIT_ALL.with(|c| c.set(true));
    INIT_ALL_ID.with(|c| c.set(None));
    // SAFETY: pass-through of the application's arguments.
    let rc = unsafe { real::comm_init_all(comms, ndev, devlist) };
    CAPTURING_INIT_ALL.with(|c| c.set(false));
    drop(hook);
    let id = INIT_ALL_ID.with(Cell::take);
    let hash = id.map(|id| nccl_hash::init_comm_hash(hash_version(), &id.internal));
    ensure_active(0, ndev, hash.unwrap_or(0));
    let Some((shim, _g)) = active() else {
        return rc;
    };
    shielded(shim, || {
        if rc != result::SUCCESS || comms.is_null() {
            shim.nccl_init_failed(hash.unwrap_or(0), 0, -1, ndev, rc);
            return;
        }
        for i in 0..ndev.max(0) as usize {
            // SAFETY: NCCL filled `ndev` communicators.
            let h = unsafe { *comms.add(i) };
            if h == 0 {
                continue;
            }
            let mut r: c_int = i as c_int;
            // SAFETY: a valid out-pointer and an initialized communicator.
            unsafe { real::comm_user_rank(h, &mut r) };
            match hash {
                Some(x) => shim.nccl_created(h, x, 0, r, ndev, false, None, comm_device(h)),
                None => {
                    // The id NCCL drew was not seen: a process-local id, flagged.
                    let id = local_id(shim, h);
                    shim.nccl_created(h, id, 0, r, ndev, true, None, comm_device(h));
                }
            }
        }
    });
    rc
}

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclCommSplit, [c"pncclCommSplit", c"ncclCommSplit"]:
    pub unsafe extern "C" fn wrapper(
        comm: NComm,
        color: c_int,
        key: c_int,
        newcomm: *mut NComm,
        config: P,
    ) -> c_int {
        let Some((shim, _g)) = active() else {
            // SAFETY: pass-through.
            return unsafe { real::comm_split(comm, color, key, newcomm, config) };
        };
        // Every split call on a parent counts, NCCL_SPLIT_NOCOLOR included.
        let parent = shielded(shim, || {
            shim.nccl_comm(comm).map(|e| {
                let n = e.children.fetch_add(1, Ordering::Relaxed) + 1;
                (e.id.load(Ordering::Relaxed), n as i32)
            })
        })
        .flatten();
        // SAFETY: pass-through of the application's arguments (the guard stays held: NCCL's own
        // calls inside pass through).
        let rc = unsafe { real::comm_split(comm, color, key, newcomm, config) };
        // SAFETY: the application's config.
        let name = unsafe { config_name(config) };
        shielded(shim, || {
            let Some((pid, count)) = parent else { return };
            let id = nccl_hash::split_comm_hash(hash_version(), pid, count, color);
            let h = if newcomm.is_null() {
                0
            } else {
                // SAFETY: NCCL writes the new communicator (or NULL) on success.
                unsafe { *newcomm }
            };
            if rc != result::SUCCESS && rc != result::IN_PROGRESS {
                if color != SPLIT_NOCOLOR {
                    shim.nccl_init_failed(id, pid, -1, 0, rc);
                }
                return;
            }
            if color == SPLIT_NOCOLOR || h == 0 {
                return;
            }
            let (mut r, mut n) = (-1, 0);
            if rc == result::SUCCESS {
                // SAFETY: valid out-pointers, an initialized communicator.
                unsafe {
                    real::comm_user_rank(h, &mut r);
                    real::comm_count(h, &mut n);
                }
            }
            let dev = if rc == result::SUCCESS {
                comm_device(h)
            } else {
                current_device()
            };
            shim.nccl_created(h, id, pid, r, n, false, name.as_deref(), dev);
        });
        rc
    }
);

// Exported only where the loaded NCCL has it.
crate::resolve::optional_wrapper!(ncclCommShrink, [c"pncclCommShrink", c"ncclCommShrink"]:
    pub unsafe extern "C" fn wrapper(
        comm: NComm,
        exclude: *mut c_int,
        nexclude: c_int,
        newcomm: *mut NComm,
        config: P,
        shrink_flags: c_int,
    ) -> c_int {
        let Some((shim, _g)) = active() else {
            // SAFETY: pass-through.
            return unsafe {
                real::comm_shrink(comm, exclude, nexclude, newcomm, config, shrink_flags)
            };
        };
        let parent = shielded(shim, || {
            shim.nccl_comm(comm).map(|e| e.id.load(Ordering::Relaxed))
        })
        .flatten();
        // SAFETY: pass-through of the application's arguments.
        let rc =
            unsafe { real::comm_shrink(comm, exclude, nexclude, newcomm, config, shrink_flags) };
        // SAFETY: the application's config.
        let name = unsafe { config_name(config) };
        shielded(shim, || {
            let Some(pid) = parent else { return };
            let id = nccl_hash::shrink_comm_hash(pid);
            let h = if newcomm.is_null() {
                0
            } else {
                // SAFETY: NCCL writes the new communicator (or NULL) on success.
                unsafe { *newcomm }
            };
            if rc != result::SUCCESS && rc != result::IN_PROGRESS {
                shim.nccl_init_failed(id, pid, -1, 0, rc);
                return;
            }
            if h == 0 {
                return; // an excluded rank gets no communicator
            }
            let (mut r, mut n) = (-1, 0);
            if rc == result::SUCCESS {
                // SAFETY: valid out-pointers, an initialized communicator.
                unsafe {
                    real::comm_user_rank(h, &mut r);
                    real::comm_count(h, &mut n);
                }
            }
            shim.nccl_created(h, id, pid, r, n, false, name.as_deref(), comm_device(h));
        });
        rc
    }
);

/// Takes a communicator off the async-error list before NCCL frees it.
pub(super) fn forget_live(shim: &Shim, comm: NComm) {
    let mut live = shim.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|l| l.handle != comm);
}

/// The end of a communicator: destroy or abort.
pub(super) fn comm_gone(comm: NComm, f: impl FnOnce() -> c_int) -> c_int {
    let Some((shim, _g)) = active() else {
        return f();
    };
    let _ = shielded(shim, || forget_live(shim, comm));
    let rc = f();
    if state::life() == state::life::ACTIVE {
        shielded(shim, || {
            if let Some(e) = shim.nccl.comms.get(comm as u64) {
                shim.nccl_comm_record(CommEvent::Freed, e, 0, None, -1, 0);
            }
            shim.nccl.comms.remove(comm as u64);
        });
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommDestroy(comm: NComm) -> c_int {
    // SAFETY: pass-through of the application's argument.
    comm_gone(comm, || unsafe { real::comm_destroy(comm) })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommAbort(comm: NComm) -> c_int {
    // SAFETY: pass-through of the application's argument.
    comm_gone(comm, || unsafe { real::comm_abort(comm) })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommFinalize(comm: NComm) -> c_int {
    // SAFETY: pass-through of the application's argument.
    unsafe { real::comm_finalize(comm) }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: NComm, err: *mut c_int) -> c_int {
    // SAFETY: pass-through of the caller's arguments.
    let rc = unsafe { real::comm_get_async_error(comm, err) };
    if rc == result::SUCCESS
        && !err.is_null()
        && let Some((shim, _g)) = active()
    {
        // SAFETY: NCCL wrote the state.
        let e = unsafe { *err };
        if e != result::SUCCESS && e != result::IN_PROGRESS {
            shielded(shim, || shim.nccl_async_error(comm, e));
        }
    }
    rc
}
