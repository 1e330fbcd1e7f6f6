//! The Fortran bindings (`use mpi`, `use mpi_f08`, `mpif.h`).
//!
//! Open MPI's Fortran layer (`libmpi_mpifh`) calls the C `PMPI_*` functions directly, so a
//! Fortran program on Open MPI never reaches the C wrappers: its calls are recorded here. Every
//! Fortran entry point is exported under the names Open MPI defines for it — `ompi_allreduce_f`
//! (which `use mpi_f08`'s `mpi_allreduce_f08_` calls) and the compilers' spellings
//! `mpi_allreduce`, `mpi_allreduce_`, `mpi_allreduce__`, `MPI_ALLREDUCE` — each only where a
//! loaded library defines that name ([`crate::resolve::optional_export`]), so a C program sees no
//! Fortran symbol it would not see without commscope. All of a library's spellings are aliases of
//! one function, so the wrapper forwards to the first it finds.
//!
//! MPICH's Fortran layer calls the C `MPI_*` functions, which record: there the Fortran wrappers
//! only forward, so nothing is counted twice.
//!
//! Fortran passes every argument by reference and handles as `MPI_Fint` integers; the wrappers
//! convert them with `MPI_*_f2c` and hand the C view to the same recording logic the C wrappers
//! use. Open MPI's Fortran status is its C `MPI_Status` (6 integers), and its `MPI_IN_PLACE` and
//! `MPI_STATUS(ES)_IGNORE` are the addresses of common blocks, recognised here.

#![allow(non_snake_case, non_upper_case_globals, clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use commscope_wire::op::{Op, flags};
use commscope_wire::record::CommEvent;

use super::collectives::{
    NO_DATA, alltoallv_info, bcast_info, gathered, gatherv_info, mixed_info, reduce_info,
    reduce_scatter_block_info, reduce_scatter_info, rooted_info, rooted_v_info,
};
use super::comms::Ctor;
use super::completion::{self, Requests, StatusArg};
use super::{CP, CollInfo, P};
use crate::abi::{Flavour, H};
use crate::resolve::Real;
use crate::state::{self, Guard, Shim, activate, active_mpi, life, shielded, shutdown};

/// `MPI_Fint *`: every Fortran argument that is not a buffer.
type F = *const c_int;
/// `MPI_Fint *` the library writes (request, new communicator, error code, flag, index).
type FM = *mut c_int;

// ----- the real functions and the exported names -------------------------------------------------

/// Resolves a Fortran function given as `ompi_<name>_f`: that name, else the compilers'
/// spellings of `mpi_<name>` (MPICH's), all aliases of one function in a library.
fn resolve_fortran(ompi: &'static CStr) -> *mut c_void {
    let p = crate::resolve::next(ompi);
    if !p.is_null() {
        return p;
    }
    let full = ompi.to_string_lossy();
    let Some(base) = full
        .strip_prefix("ompi_")
        .and_then(|s| s.strip_suffix("_f"))
    else {
        return p;
    };
    let spellings = [
        format!("mpi_{base}_"),
        format!("mpi_{base}"),
        format!("mpi_{base}__"),
        format!("MPI_{}", base.to_ascii_uppercase()),
    ];
    for name in spellings {
        let Ok(c) = CString::new(name) else { continue };
        let p = crate::resolve::next(&c);
        if !p.is_null() {
            return p;
        }
    }
    std::ptr::null_mut()
}

/// A `&'static CStr` of a string literal expression.
macro_rules! cstr_lit {
    ($s:expr) => {
        match ::std::ffi::CStr::from_bytes_with_nul(concat!($s, "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => panic!("symbol name"),
        }
    };
}

/// Defines the Fortran entry point `$lower` under all its names, forwarding to the real one.
/// `|s, real| body` runs when recording on Open MPI (with `real()` making the real call),
/// `always |real| body` in every case.
macro_rules! fortran {
    ($lower:ident $upper:ident ($($a:ident: $t:ty),* $(,)?) |$s:ident, $real:ident| $body:expr) => {
        fortran!(@def $lower $upper ($($a: $t),*) |$real| match recorder() {
            None => $real(),
            Some(($s, _g)) => {
                let _ = $body;
            }
        });
    };
    ($lower:ident $upper:ident ($($a:ident: $t:ty),* $(,)?) always |$real:ident| $body:expr) => {
        fortran!(@def $lower $upper ($($a: $t),*) |$real| $body);
    };
    (@def $lower:ident $upper:ident ($($a:ident: $t:ty),*) |$real:ident| $body:expr) => {
        pub mod $lower {
            #[allow(unused_imports)]
            use super::*;

            static REAL: Real =
                Real::with(cstr_lit!(concat!("ompi_", stringify!($lower), "_f")), resolve_fortran);

            #[allow(clippy::too_many_arguments, unused_variables)]
            pub unsafe extern "C" fn wrapper($($a: $t),*) {
                let $real = || {
                    // SAFETY: the library's Fortran function of this name, whose C signature
                    // (every argument by reference) is the one declared here.
                    let f: unsafe extern "C" fn($($t),*) = unsafe { std::mem::transmute(REAL.target()) };
                    // SAFETY: the application's own arguments, passed through.
                    unsafe { f($($a),*) }
                };
                $body
            }

            $crate::resolve::optional_export!(fn ompi = concat!("ompi_", stringify!($lower), "_f"), wrapper);
            $crate::resolve::optional_export!(fn plain = concat!("mpi_", stringify!($lower)), wrapper);
            $crate::resolve::optional_export!(fn under = concat!("mpi_", stringify!($lower), "_"), wrapper);
            $crate::resolve::optional_export!(fn under2 = concat!("mpi_", stringify!($lower), "__"), wrapper);
            $crate::resolve::optional_export!(fn upper = concat!("MPI_", stringify!($upper)), wrapper);
        }
    };
}

/// `MPI_Comm_f2c`, `MPI_Type_f2c`, `MPI_Request_f2c` (the shim's own conversions).
macro_rules! f2c {
    ($($fn:ident = $name:literal;)*) => {
        $(
            fn $fn(s: &Shim, f: F) -> H {
                static R: Real = Real::new($name);
                let p = R.get();
                if p == 0 || f.is_null() {
                    return 0;
                }
                // SAFETY: `MPI_X MPI_X_f2c(MPI_Fint)` of the loaded library.
                let conv: unsafe extern "C" fn(c_int) -> H = unsafe { std::mem::transmute(p) };
                // SAFETY: `f` is the application's `MPI_Fint` argument.
                s.abi.norm(unsafe { conv(*f) }) as H
            }
        )*
    };
}

f2c! {
    comm_c = c"PMPI_Comm_f2c";
    type_c = c"PMPI_Type_f2c";
    op_c = c"PMPI_Op_f2c";
    request_c = c"PMPI_Request_f2c";
}

// ----- helpers -----------------------------------------------------------------------------------

/// The recorder, for a Fortran call on Open MPI (elsewhere the C wrappers record it).
fn recorder() -> Option<(&'static Shim, Guard)> {
    let s = state::shim()?;
    if s.abi.flavour != Flavour::OpenMpi {
        return None;
    }
    active_mpi()
}

/// An `MPI_Fint` argument's value (0 for a null pointer).
fn v(p: F) -> c_int {
    // SAFETY: Fortran passes every argument by reference; null only from broken callers.
    if p.is_null() { 0 } else { unsafe { *p } }
}

/// The error code the call left in `ierr`.
fn rc(ierr: FM) -> c_int {
    v(ierr)
}

/// Open MPI's Fortran sentinels: the addresses of its common blocks, under each compiler's
/// spelling.
struct Sentinels {
    names: [&'static CStr; 4],
    addrs: [AtomicUsize; 4],
}

impl Sentinels {
    const fn new(names: [&'static CStr; 4]) -> Self {
        Sentinels {
            names,
            addrs: [const { AtomicUsize::new(usize::MAX) }; 4],
        }
    }

    /// Whether `p` is one of them.
    fn is(&self, p: *const c_void) -> bool {
        let p = p as usize;
        if p == 0 {
            return false;
        }
        self.addrs.iter().zip(self.names).any(|(a, name)| {
            let mut v = a.load(Ordering::Relaxed);
            if v == usize::MAX {
                v = crate::resolve::data(name) as usize;
                a.store(v, Ordering::Relaxed);
            }
            v != 0 && v == p
        })
    }
}

static IN_PLACE: Sentinels = Sentinels::new([
    c"mpi_fortran_in_place_",
    c"mpi_fortran_in_place",
    c"mpi_fortran_in_place__",
    c"MPI_FORTRAN_IN_PLACE",
]);
static STATUS_IGNORE: Sentinels = Sentinels::new([
    c"mpi_fortran_status_ignore_",
    c"mpi_fortran_status_ignore",
    c"mpi_fortran_status_ignore__",
    c"MPI_FORTRAN_STATUS_IGNORE",
]);
static STATUSES_IGNORE: Sentinels = Sentinels::new([
    c"mpi_fortran_statuses_ignore_",
    c"mpi_fortran_statuses_ignore",
    c"mpi_fortran_statuses_ignore__",
    c"MPI_FORTRAN_STATUSES_IGNORE",
]);

/// A buffer argument as the C layer would see it: Fortran's `MPI_IN_PLACE` becomes C's.
fn place(s: &Shim, p: CP) -> CP {
    if IN_PLACE.is(p) {
        s.abi.in_place as CP
    } else {
        p
    }
}

fn status(p: FM) -> StatusArg {
    StatusArg {
        raw: p.cast(),
        given: !p.is_null() && !STATUS_IGNORE.is(p as *const c_void),
    }
}

fn statuses(p: FM) -> StatusArg {
    StatusArg {
        raw: p.cast(),
        given: !p.is_null() && !STATUSES_IGNORE.is(p as *const c_void),
    }
}

/// A C handle the wrappers fill after the real call (a new request or communicator), handed to
/// the recording logic where the C binding passes its output argument.
#[derive(Default)]
struct Out(std::cell::Cell<u64>);

impl Out {
    /// Where the recording logic reads the handle.
    fn ptr(&self) -> P {
        self.0.as_ptr().cast()
    }

    /// Makes the real Fortran call; when it succeeded, puts the C view of the handle it wrote
    /// (`convert`) in place. Returns the call's code.
    fn after(&self, real: impl FnOnce(), ierr: FM, convert: impl FnOnce() -> H) -> c_int {
        real();
        let r = rc(ierr);
        if r == 0 {
            self.0.set(convert() as u64);
        }
        r
    }
}

/// Records a blocking collective on the Fortran communicator `comm`.
fn coll(
    s: &Shim,
    comm: F,
    op: Op,
    info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
    real: impl FnOnce(),
    ierr: FM,
) {
    s.coll(comm_c(s, comm), op, info, || {
        real();
        rc(ierr)
    });
}

/// Records a nonblocking collective; `req` is the Fortran request the call writes.
fn icoll(
    s: &Shim,
    comm: F,
    op: Op,
    req: F,
    info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
    real: impl FnOnce(),
    ierr: FM,
) {
    let out = Out::default();
    s.icoll(comm_c(s, comm), op, out.ptr(), info, || {
        out.after(real, ierr, || request_c(s, req))
    });
}

/// Records a nonblocking send or receive.
#[allow(clippy::too_many_arguments)]
fn ip2p(
    s: &Shim,
    op: Op,
    fl: u16,
    (count, dt, peer, tag, comm): (F, F, F, F, F),
    req: F,
    real: impl FnOnce(),
    ierr: FM,
) {
    let out = Out::default();
    let t = type_c(s, dt);
    s.ip2p(
        op,
        fl,
        v(count).into(),
        t,
        v(peer),
        v(tag),
        comm_c(s, comm),
        out.ptr(),
        || out.after(real, ierr, || request_c(s, req)),
    );
}

/// Records a persistent send or receive's creation.
#[allow(clippy::too_many_arguments)]
fn persistent(
    s: &Shim,
    op: Op,
    fl: u16,
    (count, dt, peer, tag, comm): (F, F, F, F, F),
    req: F,
    real: impl FnOnce(),
    ierr: FM,
) {
    let out = Out::default();
    let t = type_c(s, dt);
    s.persistent_init(
        op,
        fl,
        v(count).into(),
        t,
        v(peer),
        v(tag),
        comm_c(s, comm),
        out.ptr(),
        || out.after(real, ierr, || request_c(s, req)),
    );
}

/// Records a communicator constructor; `newcomm` is the Fortran communicator it writes.
fn ctor(s: &Shim, parent: F, newcomm: F, kind: Ctor, real: impl FnOnce(), ierr: FM) {
    let out = Out::default();
    s.ctor(comm_c(s, parent), out.ptr(), kind, || {
        out.after(real, ierr, || comm_c(s, newcomm))
    });
}

/// A Fortran request array of `n` requests.
fn requests(n: F, reqs: F) -> Requests {
    /// # Safety
    /// `p` points to a Fortran request.
    unsafe fn handle(s: &Shim, p: CP) -> u64 {
        request_c(s, p.cast()) as u64
    }
    Requests {
        n: v(n),
        reqs: reqs.cast(),
        handle,
        stride: size_of::<c_int>(),
        index_base: 1,
    }
}

/// The C handle of a Fortran request, when it has a pending call.
fn pending(s: &Shim, req: F) -> Option<u64> {
    if s.requests.is_empty() {
        return None;
    }
    let h = request_c(s, req) as u64;
    (h != 0 && s.requests.contains(h)).then_some(h)
}

/// `alltoallw`'s size fields from Fortran count and datatype arrays.
fn alltoallw_info(
    s: &Shim,
    sbuf: CP,
    (scounts, sts): (F, F),
    (rcounts, rts): (F, F),
    n: u64,
) -> CollInfo {
    let fl = s.in_place(place(s, sbuf));
    let (counts, types) = if fl != 0 {
        (rcounts, rts)
    } else {
        (scounts, sts)
    };
    let counts = if types.is_null() {
        std::ptr::null()
    } else {
        counts
    };
    // SAFETY: MPI requires one count and one datatype per rank; `types.add(i)` stays inside.
    unsafe { mixed_info(s, counts, n, |i| type_c(s, types.wrapping_add(i)), fl) }
}

// ----- lifecycle ---------------------------------------------------------------------------------

fortran!(init INIT (ierr: FM) always |real| {
    real();
    // Open MPI's Fortran init calls PMPI_Init: activate here. MPICH's calls MPI_Init, which
    // already did.
    if rc(ierr) == 0 && life() == state::life::DORMANT {
        activate();
    }
});

fortran!(init_thread INIT_THREAD (required: F, provided: FM, ierr: FM) always |real| {
    real();
    if rc(ierr) == 0 && life() == state::life::DORMANT {
        activate();
    }
});

fortran!(finalize FINALIZE (ierr: FM) always |real| {
    if life() == state::life::ACTIVE {
        let _ = std::panic::catch_unwind(|| shutdown(crate::ending::End::Clean));
    }
    real();
});

fortran!(abort ABORT (comm: F, code: F, ierr: FM) always |real| {
    if life() == state::life::ACTIVE {
        let code = v(code);
        let _ = std::panic::catch_unwind(|| shutdown(crate::ending::End::Aborted(code)));
    }
    real();
});

// ----- collectives -------------------------------------------------------------------------------

fortran!(barrier BARRIER (comm: F, ierr: FM) |s, real|
    coll(s, comm, Op::Barrier, |_, _, _, _| NO_DATA, real, ierr));
fortran!(bcast BCAST (buf: P, count: F, dt: F, root: F, comm: F, ierr: FM) |s, real| {
    let t = type_c(s, dt);
    coll(s, comm, Op::Broadcast, |s, _, _, _| bcast_info(s, v(count), t, v(root)), real, ierr)
});
fortran!(reduce REDUCE (sbuf: CP, rbuf: P, count: F, dt: F, op: F, root: F, comm: F, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    coll(s, comm, Op::Reduce, |s, _, _, _| reduce_info(s, sb, v(count), t, o, s.root_value(v(root))), real, ierr)
});
fortran!(allreduce ALLREDUCE (sbuf: CP, rbuf: P, count: F, dt: F, op: F, comm: F, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    coll(s, comm, Op::Allreduce, |s, _, _, _| reduce_info(s, sb, v(count), t, o, -1), real, ierr)
});
fortran!(scan SCAN (sbuf: CP, rbuf: P, count: F, dt: F, op: F, comm: F, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    coll(s, comm, Op::Scan, |s, _, _, _| reduce_info(s, sb, v(count), t, o, -1), real, ierr)
});
fortran!(exscan EXSCAN (sbuf: CP, rbuf: P, count: F, dt: F, op: F, comm: F, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    coll(s, comm, Op::Exscan, |s, _, _, _| reduce_info(s, sb, v(count), t, o, -1), real, ierr)
});
fortran!(allgather ALLGATHER (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, comm: F, ierr: FM) |s, real| {
    let (t, sb) = (type_c(s, rt), place(s, sbuf));
    coll(s, comm, Op::Allgather, |s, n, _, _| gathered(s, sb, v(rcount), t, n), real, ierr)
});
fortran!(alltoall ALLTOALL (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, comm: F, ierr: FM) |s, real| {
    let (t, sb) = (type_c(s, rt), place(s, sbuf));
    coll(s, comm, Op::Alltoall, |s, n, _, _| gathered(s, sb, v(rcount), t, n), real, ierr)
});
fortran!(allgatherv ALLGATHERV (sbuf: CP, scount: F, st: F, rbuf: P, rcounts: F, displs: F, rt: F, comm: F, ierr: FM) |s, real| {
    let (t, sb) = (type_c(s, rt), place(s, sbuf));
    coll(s, comm, Op::Allgatherv, |s, n, _, _| gatherv_info(s, sb, rcounts, t, n), real, ierr)
});
fortran!(gather GATHER (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, root: F, comm: F, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, sbuf)));
    coll(s, comm, Op::Gather, |s, n, me, inter| rooted_info(s, v(root), me, inter, n, (v(rcount), tr), (v(scount), ts), fl), real, ierr)
});
fortran!(scatter SCATTER (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, root: F, comm: F, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, rbuf)));
    coll(s, comm, Op::Scatter, |s, n, me, inter| rooted_info(s, v(root), me, inter, n, (v(scount), ts), (v(rcount), tr), fl), real, ierr)
});
fortran!(gatherv GATHERV (sbuf: CP, scount: F, st: F, rbuf: P, rcounts: F, displs: F, rt: F, root: F, comm: F, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, sbuf)));
    coll(s, comm, Op::Gatherv, |s, n, me, inter| rooted_v_info(s, v(root), me, inter, n, rcounts, tr, (v(scount), ts), fl), real, ierr)
});
fortran!(scatterv SCATTERV (sbuf: CP, scounts: F, displs: F, st: F, rbuf: P, rcount: F, rt: F, root: F, comm: F, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, rbuf)));
    coll(s, comm, Op::Scatterv, |s, n, me, inter| rooted_v_info(s, v(root), me, inter, n, scounts, ts, (v(rcount), tr), fl), real, ierr)
});
fortran!(reduce_scatter REDUCE_SCATTER (sbuf: CP, rbuf: P, rcounts: F, dt: F, op: F, comm: F, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    coll(s, comm, Op::Reducescatter, |s, n, _, _| reduce_scatter_info(s, sb, rcounts, t, o, n), real, ierr)
});
fortran!(reduce_scatter_block REDUCE_SCATTER_BLOCK (sbuf: CP, rbuf: P, rcount: F, dt: F, op: F, comm: F, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    coll(s, comm, Op::Reducescatter, |s, n, _, _| reduce_scatter_block_info(s, sb, v(rcount), t, o, n), real, ierr)
});
fortran!(alltoallv ALLTOALLV (sbuf: CP, scounts: F, sdispls: F, st: F, rbuf: P, rcounts: F, rdispls: F, rt: F, comm: F, ierr: FM) |s, real| {
    let (ts, tr, sb) = (type_c(s, st), type_c(s, rt), place(s, sbuf));
    coll(s, comm, Op::Alltoallv, |s, n, _, _| alltoallv_info(s, sb, scounts, ts, rcounts, tr, n), real, ierr)
});
fortran!(alltoallw ALLTOALLW (sbuf: CP, scounts: F, sdispls: F, sts: F, rbuf: P, rcounts: F, rdispls: F, rts: F, comm: F, ierr: FM) |s, real|
    coll(s, comm, Op::Alltoallw, |s, n, _, _| alltoallw_info(s, sbuf, (scounts, sts), (rcounts, rts), n), real, ierr));

fortran!(ibarrier IBARRIER (comm: F, req: FM, ierr: FM) |s, real|
    icoll(s, comm, Op::Barrier, req, |_, _, _, _| NO_DATA, real, ierr));
fortran!(ibcast IBCAST (buf: P, count: F, dt: F, root: F, comm: F, req: FM, ierr: FM) |s, real| {
    let t = type_c(s, dt);
    icoll(s, comm, Op::Broadcast, req, |s, _, _, _| bcast_info(s, v(count), t, v(root)), real, ierr)
});
fortran!(ireduce IREDUCE (sbuf: CP, rbuf: P, count: F, dt: F, op: F, root: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    icoll(s, comm, Op::Reduce, req, |s, _, _, _| reduce_info(s, sb, v(count), t, o, s.root_value(v(root))), real, ierr)
});
fortran!(iallreduce IALLREDUCE (sbuf: CP, rbuf: P, count: F, dt: F, op: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    icoll(s, comm, Op::Allreduce, req, |s, _, _, _| reduce_info(s, sb, v(count), t, o, -1), real, ierr)
});
fortran!(iscan ISCAN (sbuf: CP, rbuf: P, count: F, dt: F, op: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    icoll(s, comm, Op::Scan, req, |s, _, _, _| reduce_info(s, sb, v(count), t, o, -1), real, ierr)
});
fortran!(iexscan IEXSCAN (sbuf: CP, rbuf: P, count: F, dt: F, op: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    icoll(s, comm, Op::Exscan, req, |s, _, _, _| reduce_info(s, sb, v(count), t, o, -1), real, ierr)
});
fortran!(iallgather IALLGATHER (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb) = (type_c(s, rt), place(s, sbuf));
    icoll(s, comm, Op::Allgather, req, |s, n, _, _| gathered(s, sb, v(rcount), t, n), real, ierr)
});
fortran!(ialltoall IALLTOALL (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb) = (type_c(s, rt), place(s, sbuf));
    icoll(s, comm, Op::Alltoall, req, |s, n, _, _| gathered(s, sb, v(rcount), t, n), real, ierr)
});
fortran!(iallgatherv IALLGATHERV (sbuf: CP, scount: F, st: F, rbuf: P, rcounts: F, displs: F, rt: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb) = (type_c(s, rt), place(s, sbuf));
    icoll(s, comm, Op::Allgatherv, req, |s, n, _, _| gatherv_info(s, sb, rcounts, t, n), real, ierr)
});
fortran!(igather IGATHER (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, root: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, sbuf)));
    icoll(s, comm, Op::Gather, req, |s, n, me, inter| rooted_info(s, v(root), me, inter, n, (v(rcount), tr), (v(scount), ts), fl), real, ierr)
});
fortran!(iscatter ISCATTER (sbuf: CP, scount: F, st: F, rbuf: P, rcount: F, rt: F, root: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, rbuf)));
    icoll(s, comm, Op::Scatter, req, |s, n, me, inter| rooted_info(s, v(root), me, inter, n, (v(scount), ts), (v(rcount), tr), fl), real, ierr)
});
fortran!(igatherv IGATHERV (sbuf: CP, scount: F, st: F, rbuf: P, rcounts: F, displs: F, rt: F, root: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, sbuf)));
    icoll(s, comm, Op::Gatherv, req, |s, n, me, inter| rooted_v_info(s, v(root), me, inter, n, rcounts, tr, (v(scount), ts), fl), real, ierr)
});
fortran!(iscatterv ISCATTERV (sbuf: CP, scounts: F, displs: F, st: F, rbuf: P, rcount: F, rt: F, root: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (ts, tr, fl) = (type_c(s, st), type_c(s, rt), s.in_place(place(s, rbuf)));
    icoll(s, comm, Op::Scatterv, req, |s, n, me, inter| rooted_v_info(s, v(root), me, inter, n, scounts, ts, (v(rcount), tr), fl), real, ierr)
});
fortran!(ireduce_scatter IREDUCE_SCATTER (sbuf: CP, rbuf: P, rcounts: F, dt: F, op: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    icoll(s, comm, Op::Reducescatter, req, |s, n, _, _| reduce_scatter_info(s, sb, rcounts, t, o, n), real, ierr)
});
fortran!(ireduce_scatter_block IREDUCE_SCATTER_BLOCK (sbuf: CP, rbuf: P, rcount: F, dt: F, op: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (t, sb, o) = (type_c(s, dt), place(s, sbuf), op_c(s, op));
    icoll(s, comm, Op::Reducescatter, req, |s, n, _, _| reduce_scatter_block_info(s, sb, v(rcount), t, o, n), real, ierr)
});
fortran!(ialltoallv IALLTOALLV (sbuf: CP, scounts: F, sdispls: F, st: F, rbuf: P, rcounts: F, rdispls: F, rt: F, comm: F, req: FM, ierr: FM) |s, real| {
    let (ts, tr, sb) = (type_c(s, st), type_c(s, rt), place(s, sbuf));
    icoll(s, comm, Op::Alltoallv, req, |s, n, _, _| alltoallv_info(s, sb, scounts, ts, rcounts, tr, n), real, ierr)
});
fortran!(ialltoallw IALLTOALLW (sbuf: CP, scounts: F, sdispls: F, sts: F, rbuf: P, rcounts: F, rdispls: F, rts: F, comm: F, req: FM, ierr: FM) |s, real|
    icoll(s, comm, Op::Alltoallw, req, |s, n, _, _| alltoallw_info(s, sbuf, (scounts, sts), (rcounts, rts), n), real, ierr));

// ----- point-to-point ----------------------------------------------------------------------------

fortran!(send SEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, ierr: FM) |s, real|
    s.send(0, v(count).into(), type_c(s, dt), v(dest), v(tag), comm_c(s, comm), || { real(); rc(ierr) }));
fortran!(ssend SSEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, ierr: FM) |s, real|
    s.send(flags::SYNCHRONOUS, v(count).into(), type_c(s, dt), v(dest), v(tag), comm_c(s, comm), || { real(); rc(ierr) }));
fortran!(bsend BSEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, ierr: FM) |s, real|
    s.send(flags::BUFFERED, v(count).into(), type_c(s, dt), v(dest), v(tag), comm_c(s, comm), || { real(); rc(ierr) }));
fortran!(rsend RSEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, ierr: FM) |s, real|
    s.send(flags::READY, v(count).into(), type_c(s, dt), v(dest), v(tag), comm_c(s, comm), || { real(); rc(ierr) }));

fortran!(recv RECV (buf: P, count: F, dt: F, src: F, tag: F, comm: F, st: FM, ierr: FM) |s, real| {
    // The real call writes the status the wrapper was given, so the application's ignore
    // sentinel is replaced by our own buffer only through `recv`'s status argument.
    let sa = status(st);
    let given = if sa.given { sa.raw } else { std::ptr::null_mut() };
    let f = REAL.target();
    s.recv(v(count).into(), type_c(s, dt), v(src), v(tag), comm_c(s, comm), given, |stp| {
        // SAFETY: the real Fortran receive, with a status buffer of at least 6 integers.
        let f: unsafe extern "C" fn(P, F, F, F, F, F, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's arguments and a real status.
        unsafe { f(buf, count, dt, src, tag, comm, stp.cast(), ierr) };
        rc(ierr)
    });
});

fortran!(isend ISEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    ip2p(s, Op::Send, 0, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(issend ISSEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    ip2p(s, Op::Send, flags::SYNCHRONOUS, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(ibsend IBSEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    ip2p(s, Op::Send, flags::BUFFERED, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(irsend IRSEND (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    ip2p(s, Op::Send, flags::READY, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(irecv IRECV (buf: P, count: F, dt: F, src: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    ip2p(s, Op::Recv, 0, (count, dt, src, tag, comm), req, real, ierr));

fortran!(sendrecv SENDRECV (sbuf: CP, scount: F, st: F, dest: F, stag: F, rbuf: P, rcount: F, rt: F, src: F, rtag: F, comm: F, status_: FM, ierr: FM) |s, real| {
    let sa = status(status_);
    let given = if sa.given { sa.raw } else { std::ptr::null_mut() };
    let f = REAL.target();
    s.sendrecv(v(scount).into(), type_c(s, st), v(dest), v(stag), v(src), v(rtag), comm_c(s, comm), given, |stp| {
        // SAFETY: the real Fortran send-receive, with a status buffer of at least 6 integers.
        let f: unsafe extern "C" fn(CP, F, F, F, F, P, F, F, F, F, F, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's arguments and a real status.
        unsafe { f(sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, stp.cast(), ierr) };
        rc(ierr)
    });
});

fortran!(sendrecv_replace SENDRECV_REPLACE (buf: P, count: F, dt: F, dest: F, stag: F, src: F, rtag: F, comm: F, status_: FM, ierr: FM) |s, real| {
    let sa = status(status_);
    let given = if sa.given { sa.raw } else { std::ptr::null_mut() };
    let f = REAL.target();
    s.sendrecv(v(count).into(), type_c(s, dt), v(dest), v(stag), v(src), v(rtag), comm_c(s, comm), given, |stp| {
        // SAFETY: the real Fortran send-receive-replace, with a status buffer of 6 integers.
        let f: unsafe extern "C" fn(P, F, F, F, F, F, F, F, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's arguments and a real status.
        unsafe { f(buf, count, dt, dest, stag, src, rtag, comm, stp.cast(), ierr) };
        rc(ierr)
    });
});

// ----- persistent requests -----------------------------------------------------------------------

fortran!(send_init SEND_INIT (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    persistent(s, Op::Send, 0, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(ssend_init SSEND_INIT (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    persistent(s, Op::Send, flags::SYNCHRONOUS, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(bsend_init BSEND_INIT (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    persistent(s, Op::Send, flags::BUFFERED, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(rsend_init RSEND_INIT (buf: CP, count: F, dt: F, dest: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    persistent(s, Op::Send, flags::READY, (count, dt, dest, tag, comm), req, real, ierr));
fortran!(recv_init RECV_INIT (buf: P, count: F, dt: F, src: F, tag: F, comm: F, req: FM, ierr: FM) |s, real|
    persistent(s, Op::Recv, 0, (count, dt, src, tag, comm), req, real, ierr));

fortran!(start START (req: FM, ierr: FM) |s, real| {
    let h = if s.persistent.is_empty() { 0 } else { request_c(s, req) as u64 };
    real();
    if rc(ierr) == 0 && h != 0 {
        shielded(s, || s.started(h));
    }
});

fortran!(startall STARTALL (n: F, reqs: FM, ierr: FM) |s, real| {
    real();
    if rc(ierr) == 0 && !s.persistent.is_empty() && !reqs.is_null() {
        shielded(s, || {
            for i in 0..v(n).max(0) as usize {
                // SAFETY: MPI requires `n` requests.
                let h = request_c(s, unsafe { reqs.add(i) }) as u64;
                s.started(h);
            }
        });
    }
});

// ----- completion --------------------------------------------------------------------------------

fortran!(wait WAIT (req: FM, st: FM, ierr: FM) |s, real| {
    match pending(s, req) {
        None => real(),
        Some(h) => {
            let f = REAL.target();
            completion::one(s, h, status(st), std::ptr::null(), |stp| {
                // SAFETY: the real Fortran wait, with a status buffer of 6 integers.
                let f: unsafe extern "C" fn(FM, FM, FM) = unsafe { std::mem::transmute(f) };
                // SAFETY: the application's request and a real status.
                unsafe { f(req, stp.cast(), ierr) };
                rc(ierr)
            });
        }
    }
});

fortran!(test TEST (req: FM, flag: FM, st: FM, ierr: FM) |s, real| {
    match pending(s, req) {
        None => real(),
        Some(h) => {
            let f = REAL.target();
            completion::one(s, h, status(st), flag, |stp| {
                // SAFETY: the real Fortran test, with a status buffer of 6 integers.
                let f: unsafe extern "C" fn(FM, FM, FM, FM) = unsafe { std::mem::transmute(f) };
                // SAFETY: the application's request and flag, and a real status.
                unsafe { f(req, flag, stp.cast(), ierr) };
                rc(ierr)
            });
        }
    }
});

fortran!(waitall WAITALL (n: F, reqs: FM, sts: FM, ierr: FM) |s, real| {
    let f = REAL.target();
    completion::all(s, &requests(n, reqs), statuses(sts), std::ptr::null(), |stp| {
        // SAFETY: the real Fortran waitall, with a status array of `n` entries.
        let f: unsafe extern "C" fn(F, FM, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's requests and a real status array.
        unsafe { f(n, reqs, stp.cast(), ierr) };
        rc(ierr)
    });
});

fortran!(testall TESTALL (n: F, reqs: FM, flag: FM, sts: FM, ierr: FM) |s, real| {
    let f = REAL.target();
    completion::all(s, &requests(n, reqs), statuses(sts), flag, |stp| {
        // SAFETY: the real Fortran testall, with a status array of `n` entries.
        let f: unsafe extern "C" fn(F, FM, FM, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's requests and flag, and a real status array.
        unsafe { f(n, reqs, flag, stp.cast(), ierr) };
        rc(ierr)
    });
});

fortran!(waitany WAITANY (n: F, reqs: FM, index: FM, st: FM, ierr: FM) |s, real| {
    let f = REAL.target();
    completion::any(s, &requests(n, reqs), index, std::ptr::null(), status(st), |stp| {
        // SAFETY: the real Fortran waitany, with a status buffer of 6 integers.
        let f: unsafe extern "C" fn(F, FM, FM, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's requests and index, and a real status.
        unsafe { f(n, reqs, index, stp.cast(), ierr) };
        rc(ierr)
    });
});

fortran!(testany TESTANY (n: F, reqs: FM, index: FM, flag: FM, st: FM, ierr: FM) |s, real| {
    let f = REAL.target();
    completion::any(s, &requests(n, reqs), index, flag, status(st), |stp| {
        // SAFETY: the real Fortran testany, with a status buffer of 6 integers.
        let f: unsafe extern "C" fn(F, FM, FM, FM, FM, FM) = unsafe { std::mem::transmute(f) };
        // SAFETY: the application's requests, index and flag, and a real status.
        unsafe { f(n, reqs, index, flag, stp.cast(), ierr) };
        rc(ierr)
    });
});

/// Waitsome/Testsome (the same arguments): `f` is the real function.
fn some(s: &Shim, f: usize, (n, reqs, outcount, indices, sts): (F, FM, FM, FM, FM), ierr: FM) {
    completion::some(
        s,
        &requests(n, reqs),
        outcount,
        indices,
        statuses(sts),
        |stp| {
            // SAFETY: the real Fortran waitsome or testsome, with a status array of `n` entries.
            let f: unsafe extern "C" fn(F, FM, FM, FM, FM, FM) = unsafe { std::mem::transmute(f) };
            // SAFETY: the application's arguments and a real status array.
            unsafe { f(n, reqs, outcount, indices, stp.cast(), ierr) };
            rc(ierr)
        },
    );
}

fortran!(waitsome WAITSOME (n: F, reqs: FM, outcount: FM, indices: FM, sts: FM, ierr: FM) |s, real|
    some(s, REAL.target(), (n, reqs, outcount, indices, sts), ierr));

fortran!(testsome TESTSOME (n: F, reqs: FM, outcount: FM, indices: FM, sts: FM, ierr: FM) |s, real|
    some(s, REAL.target(), (n, reqs, outcount, indices, sts), ierr));

fortran!(request_free REQUEST_FREE (req: FM, ierr: FM) |s, real| {
    let h = if s.requests.is_empty() && s.persistent.is_empty() {
        0
    } else {
        request_c(s, req) as u64
    };
    real();
    if h != 0 && rc(ierr) == 0 {
        shielded(s, || s.request_freed(h));
    }
});

// ----- communicators -----------------------------------------------------------------------------

fortran!(comm_split COMM_SPLIT (comm: F, color: F, key: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(comm_split_type COMM_SPLIT_TYPE (comm: F, kind: F, key: F, info: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(comm_dup COMM_DUP (comm: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Dup, real, ierr));
fortran!(comm_dup_with_info COMM_DUP_WITH_INFO (comm: F, info: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Dup, real, ierr));
fortran!(comm_idup COMM_IDUP (comm: F, newcomm: FM, req: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Dup, real, ierr));
fortran!(comm_create COMM_CREATE (comm: F, group: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(comm_create_group COMM_CREATE_GROUP (comm: F, group: F, tag: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Group, real, ierr));
fortran!(cart_create CART_CREATE (comm: F, ndims: F, dims: F, periods: F, reorder: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(cart_sub CART_SUB (comm: F, remain: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(graph_create GRAPH_CREATE (comm: F, nnodes: F, index: F, edges: F, reorder: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(dist_graph_create DIST_GRAPH_CREATE (comm: F, n: F, sources: F, degrees: F, dests: F, weights: F, info: F, reorder: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(dist_graph_create_adjacent DIST_GRAPH_CREATE_ADJACENT (comm: F, indeg: F, sources: F, sweights: F, outdeg: F, dests: F, dweights: F, info: F, reorder: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, comm, newcomm, Ctor::Collective, real, ierr));
fortran!(intercomm_create INTERCOMM_CREATE (local: F, local_leader: F, peer: F, remote_leader: F, tag: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, local, newcomm, Ctor::Inter, real, ierr));
fortran!(intercomm_merge INTERCOMM_MERGE (inter: F, high: F, newcomm: FM, ierr: FM) |s, real|
    ctor(s, inter, newcomm, Ctor::Collective, real, ierr));

fortran!(comm_free COMM_FREE (comm: FM, ierr: FM) |s, real| {
    let h = comm_c(s, comm) as u64;
    real();
    if rc(ierr) == 0 && h != 0 {
        shielded(s, || s.comm_gone(h));
    }
});
fortran!(comm_disconnect COMM_DISCONNECT (comm: FM, ierr: FM) |s, real| {
    let h = comm_c(s, comm) as u64;
    real();
    if rc(ierr) == 0 && h != 0 {
        shielded(s, || s.comm_gone(h));
    }
});

// `name` is a Fortran CHARACTER: not NUL-terminated, its length a hidden last argument, padded
// with blanks.
fortran!(comm_set_name COMM_SET_NAME (comm: F, name: *const c_char, ierr: FM, len: usize) |s, real| {
    real();
    if rc(ierr) == 0 && !name.is_null() {
        shielded(s, || {
            if let Some(e) = s.comm(comm_c(s, comm)) {
                // SAFETY: Fortran passes `len` characters at `name`.
                let bytes = unsafe { std::slice::from_raw_parts(name.cast::<u8>(), len.min(4096)) };
                let end = bytes.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
                s.comm_record(CommEvent::Named, e, 0, Some(&bytes[..end]));
            }
        });
    }
});
