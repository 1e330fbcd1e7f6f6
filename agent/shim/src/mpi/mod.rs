//! The MPI entry points commscope wraps. Each forwards to its `PMPI_*` twin; while recording,
//! it stamps the time, keeps the in-flight table current and writes one record.
//!
//! Data volume (`bytes`) per op follows nccl-tests' "size": the whole buffer for
//! allreduce/broadcast/reduce/scan, the gathered or scattered total (per-rank part × ranks) for
//! allgather/gather/scatter/alltoall/reducescatter, the sum of the counts for v-variants where this
//! rank knows them, and the bytes sent for point-to-point.

//!
//! One module per concern: [`lifecycle`] (init, finalize, abort, step markers), [`collectives`]
//! (blocking, nonblocking, neighbourhood), [`persistent`] (`*_init`, `MPI_Start*`) with
//! [`persistent_collectives`], [`p2p`],
//! [`completion`] (`MPI_Wait*`/`MPI_Test*`), [`comms`] (constructors, free, names),
//! [`large_count`] (MPI-4 `_c` variants), and [`fortran`] (Open MPI's Fortran bindings, which
//! call the C `PMPI_*` layer directly).

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use commscope_wire::op::flags;

use crate::abi::H;
use crate::state::Shim;
use crate::tables::{CommEntry, comm_flags};

pub(crate) type P = *mut c_void;
pub(crate) type CP = *const c_void;
pub(crate) type IP = *const c_int;

/// The recorder for an MPI wrapper, or — when not recording, or re-entered from inside the MPI
/// library — the real call's result, returned at once.
macro_rules! real_or {
    ($call:expr) => {
        match crate::state::active_mpi() {
            Some(x) => x,
            // SAFETY: pass-through of the application's arguments.
            None => return unsafe { $call },
        }
    };
}

/// A `&'static CStr` of an identifier's name.
macro_rules! cstr {
    ($i:ident) => {
        match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($i), "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => panic!("symbol name"),
        }
    };
}

/// Exports the wrapper `$def` defines (a `pub unsafe extern "C" fn wrapper`, written with a
/// defining macro's `@local` form) as `$name`, only where the loaded MPI has `$real` (or, without
/// its profiling twin, `$name` itself): [`crate::resolve::optional_wrapper`].
macro_rules! optional {
    ($name:ident => $real:ident: $($def:tt)*) => {
        $crate::resolve::optional_wrapper!($name, [cstr!($real), cstr!($name)]: $($def)*);
    };
}

/// Defines a blocking collective wrapper: the C signature, the communicator argument, the op, and
/// how to compute the record's size fields from the arguments (`|shim, ranks, my rank, intercomm|`).
/// `@local` defines it without exporting it (for [`optional!`]).
macro_rules! collective {
    (@local $name:ident => $($rest:tt)*) => { collective!(@def [] $name => $($rest)*); };
    ($name:ident => $($rest:tt)*) => {
        collective!(@def [#[cfg_attr(not(test), unsafe(no_mangle))]] $name => $($rest)*);
    };
    (@def [$($attr:tt)*] $name:ident => $real:ident($($a:ident: $t:ty),* $(,)?), $comm:ident, $op:expr, |$s:ident, $n:pat_param, $me:pat_param, $inter:pat_param| $info:expr) => {
        $($attr)*
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let (s, _g) = real_or!($real($($a),*));
            // SAFETY: pass-through of the application's arguments.
            s.coll($comm, $op, |$s, $n, $me, $inter| $info, || unsafe { $real($($a),*) })
        }
    };
}

/// Defines a wrapper from the C signature, then `|shim, real|` and the call that records it:
/// `real()` calls the real function with the application's arguments, `real(status)` (naming a
/// status argument) with the status the shim passes instead. `@local` defines it without
/// exporting it (for [`optional!`]).
macro_rules! wrap {
    (@local $name:ident => $($rest:tt)*) => { wrap!(@def [] $name => $($rest)*); };
    ($name:ident => $($rest:tt)*) => {
        wrap!(@def [#[cfg_attr(not(test), unsafe(no_mangle))]] $name => $($rest)*);
    };
    (@def [$($attr:tt)*] $name:ident => $real:ident($($a:ident: $t:ty),* $(,)?), |$s:ident, $f:ident $(($st:ident))?| $body:expr) => {
        $($attr)*
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let ($s, _g) = real_or!($real($($a),*));
            // SAFETY: pass-through of the application's arguments (and a status to fill).
            let $f = |$($st: P)?| unsafe { $real($($a),*) };
            $body
        }
    };
}

/// Defines a nonblocking collective wrapper, like [`collective!`] plus the request argument.
macro_rules! icollective {
    (@local $name:ident => $($rest:tt)*) => { icollective!(@def [] $name => $($rest)*); };
    ($name:ident => $($rest:tt)*) => {
        icollective!(@def [#[cfg_attr(not(test), unsafe(no_mangle))]] $name => $($rest)*);
    };
    (@def [$($attr:tt)*] $name:ident => $real:ident($($a:ident: $t:ty),* $(,)?), $comm:ident, $req:ident, $op:expr, |$s:ident, $n:pat_param, $me:pat_param, $inter:pat_param| $info:expr) => {
        $($attr)*
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            let (s, _g) = real_or!($real($($a),*));
            // SAFETY: pass-through of the application's arguments.
            s.icoll($comm, $op, $req, |$s, $n, $me, $inter| $info, || unsafe { $real($($a),*) })
        }
    };
}

#[macro_use]
pub mod persistent;
pub mod collectives;
pub mod comms;
pub mod completion;
pub mod fortran;
pub mod large_count;
pub mod lifecycle;
pub mod p2p;
pub mod persistent_collectives;

/// (size, rank, intercomm) of a communicator entry.
pub(crate) fn shape(e: Option<&CommEntry>) -> (u64, i32, bool) {
    match e {
        Some(e) => {
            let inter = e.flags.load(Ordering::Relaxed) & comm_flags::INTERCOMM != 0;
            let n = if inter {
                e.remote_size.load(Ordering::Relaxed)
            } else {
                e.size.load(Ordering::Relaxed)
            };
            (n.max(0) as u64, e.rank.load(Ordering::Relaxed), inter)
        }
        None => (0, -1, false),
    }
}

/// What a wrapper tells the recorder about a collective.
pub(crate) struct CollInfo {
    pub bytes: u64,
    pub count: u64,
    pub dtype: u16,
    pub root: i32,
    pub flags: u16,
    /// The reduction ([`commscope_wire::op::red_op`]) of a reducing collective, else 0.
    pub red_op: u8,
}

impl CollInfo {
    /// The same call, reducing with MPI operation `op`.
    pub(crate) fn reducing(self, s: &Shim, op: H) -> CollInfo {
        CollInfo {
            red_op: s.red_op_code(op),
            ..self
        }
    }

    /// `count` elements of datatype `t`.
    pub(crate) fn typed(s: &Shim, count: u64, t: H, root: i32, flags: u16) -> CollInfo {
        let (size, code) = s.type_info(t);
        CollInfo {
            bytes: count * size,
            count,
            dtype: code,
            root,
            flags,
            red_op: 0,
        }
    }
}

impl Shim {
    pub(crate) fn in_place(&self, p: CP) -> u16 {
        if p as usize == self.abi.in_place {
            flags::IN_PLACE
        } else {
            0
        }
    }
    pub(crate) fn root_is_me(&self, root: c_int, me: i32, inter: bool) -> bool {
        if inter {
            root == self.abi.root
        } else {
            root == me
        }
    }
    pub(crate) fn root_value(&self, root: c_int) -> i32 {
        self.abi.rank_value(root)
    }
}

/// Sum of `n` counts (0 when the array is absent).
///
/// # Safety
/// `counts` must be null or point to `n` counts.
pub(crate) unsafe fn sum<T: Copy + Into<i64>>(counts: *const T, n: u64) -> u64 {
    if counts.is_null() {
        return 0;
    }
    // SAFETY: per the contract.
    (0..n as usize)
        .map(|i| cnt(unsafe { *counts.add(i) }))
        .sum()
}

/// A count (`int`, or `MPI_Count` in the large-count `_c` calls) as an unsigned size.
pub(crate) fn cnt(c: impl Into<i64>) -> u64 {
    c.into().max(0) as u64
}
