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

/// How a binding names its requests and statuses, so one completion logic serves C and Fortran.
pub(crate) struct Requests {
    /// Number of requests in the array.
    pub n: c_int,
    /// The request array (C handles, or Fortran integers).
    pub reqs: CP,
    /// The C handle of a binding's request value at `p`.
    pub handle: unsafe fn(&Shim, CP) -> u64,
    /// Bytes from one request to the next.
    pub stride: usize,
    /// First index the binding reports (0 in C, 1 in Fortran).
    pub index_base: c_int,
}

impl Requests {
    /// A C request array.
    pub(crate) fn c(s: &Shim, n: c_int, reqs: CP) -> Requests {
        Requests {
            n,
            reqs,
            handle: c_handle,
            stride: s.abi.handle_size,
            index_base: 0,
        }
    }

    /// The C handle of request `i`.
    ///
    /// # Safety
    /// `i < n`, and the array holds `n` requests.
    unsafe fn at(&self, s: &Shim, i: usize) -> u64 {
        // SAFETY: per the contract.
        unsafe { (self.handle)(s, (self.reqs as *const u8).add(i * self.stride).cast()) }
    }
}

/// Reads a C request handle.
///
/// # Safety
/// `p` points to a request handle of the loaded flavour.
unsafe fn c_handle(s: &Shim, p: CP) -> u64 {
    // SAFETY: per the contract.
    unsafe { s.abi.read_handle(p) }
}

thread_local! {
    static HANDLES: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static STATUSES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Copies the handles of a request array; returns false (pass through) when none is pending.
fn snapshot(s: &Shim, r: &Requests, out: &mut Vec<u64>) -> bool {
    out.clear();
    if r.n <= 0 || r.reqs.is_null() {
        return false;
    }
    let mut any = false;
    for i in 0..r.n as usize {
        // SAFETY: MPI requires `n` request handles.
        let h = unsafe { r.at(s, i) };
        any |= s.requests.contains(h);
        out.push(h);
    }
    any
}

/// A status (or status array) argument as the application passed it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StatusArg {
    /// The pointer passed (possibly the binding's "ignore" sentinel).
    pub raw: P,
    /// Whether it is a real status the application reads (not a sentinel).
    pub given: bool,
}

impl StatusArg {
    /// The application's status when it has one, else `own`.
    fn or(self, own: P) -> P {
        if self.given { self.raw } else { own }
    }
}

/// A status array to use: the application's, or scratch space when it ignores statuses.
fn statuses(s: &Shim, n: c_int, given: StatusArg, scratch: &mut Vec<u8>) -> P {
    if given.given {
        return given.raw;
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

/// Whether a completion call says its requests completed: no flag (wait), or a set flag (test).
fn done(flag: *const c_int) -> bool {
    // SAFETY: MPI wrote `flag` when it is given.
    flag.is_null() || unsafe { *flag } != 0
}

/// Wait/Test on one request whose C handle is `h`: `status` is the application's (`None` when
/// it ignores it), `real` gets the status to fill, `flag` is Test's.
pub(crate) fn one(
    s: &Shim,
    h: u64,
    status: StatusArg,
    flag: *const c_int,
    real: impl FnOnce(P) -> c_int,
) -> c_int {
    let mut own = [0u8; STATUS_MAX];
    let st: P = status.or(own.as_mut_ptr().cast());
    let rc = real(st);
    if done(flag) {
        shielded(s, || s.completed(h, st as *const u8, rc));
    }
    rc
}

/// A completion call on several requests with a status array: `real` gets the array to fill (the
/// application's, or scratch space), then `after` sees the requests' handles as they were before
/// the call, the array and the call's code. Passes straight through when none is pending.
fn with_statuses(
    s: &Shim,
    r: &Requests,
    sts: StatusArg,
    real: impl Fn(P) -> c_int,
    after: impl FnOnce(&[u64], P, c_int),
) -> c_int {
    if s.requests.is_empty() {
        return real(sts.raw);
    }
    HANDLES.with(|hc| {
        STATUSES.with(|sc| {
            let (Ok(mut hs), Ok(mut scratch)) = (hc.try_borrow_mut(), sc.try_borrow_mut()) else {
                return real(sts.raw);
            };
            if !snapshot(s, r, &mut hs) {
                return real(sts.raw);
            }
            let st = statuses(s, r.n, sts, &mut scratch);
            let rc = real(st);
            after(&hs, st, rc);
            rc
        })
    })
}

/// Waitall/Testall.
pub(crate) fn all(
    s: &Shim,
    r: &Requests,
    sts: StatusArg,
    flag: *const c_int,
    real: impl Fn(P) -> c_int,
) -> c_int {
    with_statuses(s, r, sts, real, |hs, st, rc| {
        if done(flag) {
            shielded(s, || {
                for (i, &h) in hs.iter().enumerate() {
                    let sp = status_at(s, st, i);
                    s.completed(h, sp, rc_at(s, rc, sp));
                }
            });
        }
    })
}

/// Waitany/Testany: one request (at `*index`, counted from the binding's base) completed when
/// `flag` (if given) is set.
pub(crate) fn any(
    s: &Shim,
    r: &Requests,
    index: *const c_int,
    flag: *const c_int,
    status: StatusArg,
    real: impl Fn(P) -> c_int,
) -> c_int {
    if s.requests.is_empty() {
        return real(status.raw);
    }
    HANDLES.with(|hc| {
        let Ok(mut hs) = hc.try_borrow_mut() else {
            return real(status.raw);
        };
        if !snapshot(s, r, &mut hs) {
            return real(status.raw);
        }
        let mut own = [0u8; STATUS_MAX];
        let st: P = status.or(own.as_mut_ptr().cast());
        let rc = real(st);
        let i = if index.is_null() {
            -1
        } else {
            // SAFETY: MPI wrote `index`.
            (unsafe { *index }) - r.index_base
        };
        if done(flag) && i >= 0 && (i as usize) < hs.len() {
            let h = hs[i as usize];
            shielded(s, || s.completed(h, st as *const u8, rc));
        }
        rc
    })
}

/// Waitsome/Testsome: the requests at `indices[..*outcount]` (counted from the binding's base)
/// completed, with statuses in order.
pub(crate) fn some(
    s: &Shim,
    r: &Requests,
    outcount: *const c_int,
    indices: *const c_int,
    sts: StatusArg,
    real: impl Fn(P) -> c_int,
) -> c_int {
    with_statuses(s, r, sts, real, |hs, st, rc| {
        let k = if outcount.is_null() {
            0
        } else {
            // SAFETY: MPI wrote `outcount`.
            unsafe { *outcount }
        };
        if k > 0 && k != s.abi.undefined && !indices.is_null() {
            shielded(s, || {
                for j in 0..k.min(r.n) as usize {
                    // SAFETY: MPI wrote `k` indices.
                    let i = (unsafe { *indices.add(j) }) - r.index_base;
                    if i >= 0 && (i as usize) < hs.len() {
                        let sp = status_at(s, st, j);
                        s.completed(hs[i as usize], sp, rc_at(s, rc, sp));
                    }
                }
            });
        }
    })
}

impl Shim {
    /// A request was released with `MPI_Request_free`: a persistent template is forgotten, a
    /// pending call is written as freed.
    pub(crate) fn request_freed(&self, h: u64) {
        self.persistent.take(h);
        if let Some(p) = self.requests.take(h) {
            let mut c = p.call;
            c.flags |= flags::REQUEST_FREED;
            self.finish(c, p.slot, 0);
        }
    }

    /// A C status argument.
    pub(crate) fn given_status(&self, status: P) -> StatusArg {
        StatusArg {
            raw: status,
            given: !self.abi.is_status_ignore(status),
        }
    }

    /// Whether a request handle (read at `req`) has a pending call.
    fn pending_at(&self, req: P) -> Option<u64> {
        if self.requests.is_empty() || req.is_null() {
            return None;
        }
        // SAFETY: MPI requires a valid request pointer.
        let h = unsafe { self.abi.read_handle(req) };
        self.requests.contains(h).then_some(h)
    }
}

wrap!(MPI_Wait => PMPI_Wait(req: P, status: P), |s, real(status)| match s.pending_at(req) {
    None => real(status),
    Some(h) => one(s, h, s.given_status(status), std::ptr::null(), real),
});
wrap!(MPI_Test => PMPI_Test(req: P, flag: *mut c_int, status: P), |s, real(status)|
match s.pending_at(req) {
    None => real(status),
    Some(h) => one(s, h, s.given_status(status), flag, real),
});
wrap!(MPI_Waitall => PMPI_Waitall(n: c_int, reqs: P, sts: P), |s, real(sts)|
    all(s, &Requests::c(s, n, reqs), s.given_status(sts), std::ptr::null(), real));
wrap!(MPI_Testall => PMPI_Testall(n: c_int, reqs: P, flag: *mut c_int, sts: P), |s, real(sts)|
    all(s, &Requests::c(s, n, reqs), s.given_status(sts), flag, real));
wrap!(MPI_Waitany => PMPI_Waitany(n: c_int, reqs: P, index: *mut c_int, status: P), |s, real(status)|
    any(s, &Requests::c(s, n, reqs), index, std::ptr::null(), s.given_status(status), real));
wrap!(MPI_Testany => PMPI_Testany(n: c_int, reqs: P, index: *mut c_int, flag: *mut c_int, status: P),
    |s, real(status)| any(s, &Requests::c(s, n, reqs), index, flag, s.given_status(status), real));
wrap!(MPI_Waitsome => PMPI_Waitsome(n: c_int, reqs: P, outcount: *mut c_int, indices: *mut c_int, sts: P),
    |s, real(sts)| some(s, &Requests::c(s, n, reqs), outcount, indices, s.given_status(sts), real));
wrap!(MPI_Testsome => PMPI_Testsome(n: c_int, reqs: P, outcount: *mut c_int, indices: *mut c_int, sts: P),
    |s, real(sts)| some(s, &Requests::c(s, n, reqs), outcount, indices, s.given_status(sts), real));

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Request_free(req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Request_free(req));
    let h = if (s.requests.is_empty() && s.persistent.is_empty()) || req.is_null() {
        0
    } else {
        // SAFETY: MPI requires a valid request pointer.
        unsafe { s.abi.read_handle(req) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Request_free(req) };
    if h != 0 && rc == 0 {
        shielded(s, || s.request_freed(h));
    }
    rc
}
