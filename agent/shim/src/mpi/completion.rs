//! Completion of nonblocking and persistent requests: every `MPI_Wait*`/`MPI_Test*` and
//! `MPI_Request_free`.

use std::cell::RefCell;
use std::ffi::c_int;

use commscope_wire::op::{Op, flags};
use commscope_wire::shm::Counter;

use super::{CP, P};
use crate::abi::{H, STATUS_MAX, pmpi};
use crate::state::{Begun, Shim, shielded};
use crate::tables::Pending;

pmpi! {
    fn PMPI_Request_free(req: P) -> c_int;
    fn PMPI_Test(req: P, flag: *mut c_int, status: P) -> c_int;
    fn PMPI_Testall(n: c_int, reqs: P, flag: *mut c_int, statuses: P) -> c_int;
    fn PMPI_Testany(n: c_int, reqs: P, index: *mut c_int, flag: *mut c_int, status: P) -> c_int;
    fn PMPI_Testsome(n: c_int, reqs: P, outcount: *mut c_int, indices: *mut c_int, statuses: P) -> c_int;
    fn PMPI_Wait(req: P, status: P) -> c_int;
    fn PMPI_Waitall(n: c_int, reqs: P, statuses: P) -> c_int;
    fn PMPI_Waitany(n: c_int, reqs: P, index: *mut c_int, status: P) -> c_int;
    fn PMPI_Waitsome(n: c_int, reqs: P, outcount: *mut c_int, indices: *mut c_int, statuses: P) -> c_int;
}

impl Shim {
    /// A nonblocking call was posted: remember it under its request handle.
    pub(crate) fn posted(&self, b: Begun, rc: c_int, req: P, seq_at_completion: bool, dt: H) {
        if rc != 0 || req.is_null() {
            self.finish(b.call, b.slot, rc);
            return;
        }
        // SAFETY: MPI wrote the request handle to `req`.
        let h = unsafe { self.abi.read_handle(req) };
        self.mark_posted(&b);
        let p = Pending {
            call: b.call,
            slot: b.slot,
            seq_at_completion,
            comm: 0,
            dtype: dt as u64,
        };
        if !self.requests.insert(h, p) {
            self.shm.count(Counter::DroppedRequests, 1);
            let mut c = p.call;
            c.flags |= flags::UNTRACKED;
            self.finish(c, p.slot, 0);
        }
    }

    /// A request completed: write its record. `st` is its status (or null).
    pub(crate) fn completed(&self, h: u64, st: *const u8, rc: c_int) {
        let Some(p) = self.requests.take(h) else {
            return;
        };
        let mut call = p.call;
        let op = Op::from_code(call.op);
        if op == Op::Recv && !st.is_null() {
            // SAFETY: `st` is a status of the loaded flavour written by MPI.
            unsafe { self.complete_recv(&mut call, st, p.seq_at_completion, p.dtype as H) };
        }
        self.finish(call, p.slot, rc);
    }
}

thread_local! {
    static HANDLES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static STATUSES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Copies the handles of a request array; returns false (pass through) when none is pending.
fn snapshot(s: &Shim, n: c_int, reqs: CP, out: &mut Vec<u64>) -> bool {
    out.clear();
    if n <= 0 || reqs.is_null() {
        return false;
    }
    let mut any = false;
    for i in 0..n as usize {
        // SAFETY: MPI requires `n` request handles.
        let h = unsafe { s.abi.read_handle_at(reqs, i) };
        any |= s.requests.contains(h);
        out.push(h);
    }
    any
}

/// A status array to use: the application's, or scratch space when it ignores statuses.
fn statuses(s: &Shim, n: c_int, given: P, scratch: &mut Vec<u8>) -> P {
    if !s.abi.is_status_ignore(given) {
        return given;
    }
    scratch.clear();
    scratch.resize(n.max(1) as usize * s.abi.status_size, 0);
    scratch.as_mut_ptr().cast()
}

fn status_at(s: &Shim, base: P, i: usize) -> *const u8 {
    (base as *const u8).wrapping_add(i * s.abi.status_size)
}

/// The code for request `i` of a multiple completion: the call's, or the status' error field.
fn rc_at(s: &Shim, rc: c_int, st: *const u8) -> c_int {
    if rc == 0 {
        return 0;
    }
    // SAFETY: `st` points into a status array MPI wrote.
    let (_, _, err) = unsafe { s.abi.status_fields(st) };
    err
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Wait(req: P, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Wait(req, status));
    // SAFETY: MPI requires a valid request pointer.
    let h = if s.requests.is_empty() || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    if h == 0 || !s.requests.contains(h) {
        // SAFETY: pass-through.
        return unsafe { PMPI_Wait(req, status) };
    }
    let mut own = [0u8; STATUS_MAX];
    let st: P = if s.abi.is_status_ignore(status) {
        own.as_mut_ptr().cast()
    } else {
        status
    };
    // SAFETY: pass-through with a real status buffer.
    let rc = unsafe { PMPI_Wait(req, st) };
    shielded(s, || s.completed(h, st as *const u8, rc));
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Test(req: P, flag: *mut c_int, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Test(req, flag, status));
    // SAFETY: MPI requires a valid request pointer.
    let h = if s.requests.is_empty() || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    if h == 0 || !s.requests.contains(h) {
        // SAFETY: pass-through.
        return unsafe { PMPI_Test(req, flag, status) };
    }
    let mut own = [0u8; STATUS_MAX];
    let st: P = if s.abi.is_status_ignore(status) {
        own.as_mut_ptr().cast()
    } else {
        status
    };
    // SAFETY: pass-through with a real status buffer.
    let rc = unsafe { PMPI_Test(req, flag, st) };
    // SAFETY: MPI wrote `flag`.
    if !flag.is_null() && unsafe { *flag } != 0 {
        shielded(s, || s.completed(h, st as *const u8, rc));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Waitall(n: c_int, reqs: P, sts: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Waitall(n, reqs, sts));
    if s.requests.is_empty() {
        // SAFETY: pass-through.
        return unsafe { PMPI_Waitall(n, reqs, sts) };
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                // SAFETY: pass-through.
                return unsafe { PMPI_Waitall(n, reqs, sts) };
            };
            if !snapshot(s, n, reqs, &mut hs) {
                // SAFETY: pass-through.
                return unsafe { PMPI_Waitall(n, reqs, sts) };
            }
            let st = statuses(s, n, sts, &mut scratch);
            // SAFETY: pass-through with a real status array of `n` entries.
            let rc = unsafe { PMPI_Waitall(n, reqs, st) };
            shielded(s, || {
                for (i, &h) in hs.iter().enumerate() {
                    let sp = status_at(s, st, i);
                    s.completed(h, sp, rc_at(s, rc, sp));
                }
            });
            rc
        })
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Testall(n: c_int, reqs: P, flag: *mut c_int, sts: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Testall(n, reqs, flag, sts));
    if s.requests.is_empty() {
        // SAFETY: pass-through.
        return unsafe { PMPI_Testall(n, reqs, flag, sts) };
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                // SAFETY: pass-through.
                return unsafe { PMPI_Testall(n, reqs, flag, sts) };
            };
            if !snapshot(s, n, reqs, &mut hs) {
                // SAFETY: pass-through.
                return unsafe { PMPI_Testall(n, reqs, flag, sts) };
            }
            let st = statuses(s, n, sts, &mut scratch);
            // SAFETY: pass-through with a real status array of `n` entries.
            let rc = unsafe { PMPI_Testall(n, reqs, flag, st) };
            // SAFETY: MPI wrote `flag`.
            if !flag.is_null() && unsafe { *flag } != 0 {
                shielded(s, || {
                    for (i, &h) in hs.iter().enumerate() {
                        let sp = status_at(s, st, i);
                        s.completed(h, sp, rc_at(s, rc, sp));
                    }
                });
            }
            rc
        })
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Waitany(n: c_int, reqs: P, index: *mut c_int, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Waitany(n, reqs, index, status));
    any_completion(
        s,
        n,
        reqs,
        index,
        std::ptr::null_mut(),
        status,
        |st| unsafe { PMPI_Waitany(n, reqs, index, st) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Testany(
    n: c_int,
    reqs: P,
    index: *mut c_int,
    flag: *mut c_int,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Testany(n, reqs, index, flag, status));
    any_completion(s, n, reqs, index, flag, status, |st| unsafe {
        PMPI_Testany(n, reqs, index, flag, st)
    })
}

/// Waitany/Testany: one request (at `*index`) completed when `flag` (if given) is set.
fn any_completion(
    s: &Shim,
    n: c_int,
    reqs: P,
    index: *mut c_int,
    flag: *mut c_int,
    status: P,
    real: impl Fn(P) -> c_int,
) -> c_int {
    if s.requests.is_empty() {
        return real(status);
    }
    HANDLES.with(|hc| {
        let Ok(mut hs) = hc.try_borrow_mut() else {
            return real(status);
        };
        if !snapshot(s, n, reqs, &mut hs) {
            return real(status);
        }
        let mut own = [0u8; STATUS_MAX];
        let st: P = if s.abi.is_status_ignore(status) {
            own.as_mut_ptr().cast()
        } else {
            status
        };
        let rc = real(st);
        // SAFETY: MPI wrote `flag` and `index`.
        let done = flag.is_null() || unsafe { *flag } != 0;
        // SAFETY: as above.
        let i = if index.is_null() {
            -1
        } else {
            unsafe { *index }
        };
        if done && i >= 0 && (i as usize) < hs.len() {
            let h = hs[i as usize];
            shielded(s, || s.completed(h, st as *const u8, rc));
        }
        rc
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Waitsome(
    n: c_int,
    reqs: P,
    outcount: *mut c_int,
    indices: *mut c_int,
    sts: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Waitsome(n, reqs, outcount, indices, sts));
    some_completion(s, n, reqs, outcount, indices, sts, |st| unsafe {
        PMPI_Waitsome(n, reqs, outcount, indices, st)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Testsome(
    n: c_int,
    reqs: P,
    outcount: *mut c_int,
    indices: *mut c_int,
    sts: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Testsome(n, reqs, outcount, indices, sts));
    some_completion(s, n, reqs, outcount, indices, sts, |st| unsafe {
        PMPI_Testsome(n, reqs, outcount, indices, st)
    })
}

/// Waitsome/Testsome: the requests at `indices[..*outcount]` completed, with statuses in order.
fn some_completion(
    s: &Shim,
    n: c_int,
    reqs: P,
    outcount: *mut c_int,
    indices: *mut c_int,
    sts: P,
    real: impl Fn(P) -> c_int,
) -> c_int {
    if s.requests.is_empty() {
        return real(sts);
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                return real(sts);
            };
            if !snapshot(s, n, reqs, &mut hs) {
                return real(sts);
            }
            let st = statuses(s, n, sts, &mut scratch);
            let rc = real(st);
            // SAFETY: MPI wrote `outcount`.
            let k = if outcount.is_null() {
                0
            } else {
                unsafe { *outcount }
            };
            if k > 0 && k != s.abi.undefined && !indices.is_null() {
                shielded(s, || {
                    for j in 0..k.min(n) as usize {
                        // SAFETY: MPI wrote `k` indices.
                        let i = unsafe { *indices.add(j) };
                        if i >= 0 && (i as usize) < hs.len() {
                            let sp = status_at(s, st, j);
                            s.completed(hs[i as usize], sp, rc_at(s, rc, sp));
                        }
                    }
                });
            }
            rc
        })
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Request_free(req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Request_free(req));
    // SAFETY: MPI requires a valid request pointer.
    let h = if (s.requests.is_empty() && s.persistent.is_empty()) || req.is_null() {
        0
    } else {
        unsafe { s.abi.read_handle(req) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Request_free(req) };
    if h != 0 && rc == 0 {
        shielded(s, || {
            s.persistent.take(h);
            if let Some(p) = s.requests.take(h) {
                let mut c = p.call;
                c.flags |= flags::REQUEST_FREED;
                s.finish(c, p.slot, 0);
            }
        });
    }
    rc
}
