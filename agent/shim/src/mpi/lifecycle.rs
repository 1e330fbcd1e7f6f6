//! `MPI_Init`, `MPI_Init_thread` (activation), `MPI_Finalize`, `MPI_Abort`, and the
//! application's step marker `commscope_step`.

use std::ffi::{c_char, c_int};

use crate::abi::{H, pmpi};
use crate::ending::End;
use crate::state::{activate, active_mpi, life, shielded, shutdown};

pmpi! {
    fn PMPI_Abort(comm: H, code: c_int) -> c_int;
    fn PMPI_Finalize() -> c_int;
    fn PMPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int;
    fn PMPI_Init_thread(argc: *mut c_int, argv: *mut *mut *mut c_char, required: c_int, provided: *mut c_int) -> c_int;
}

/// `void commscope_step(unsigned long long step)`: the application marks the start of training
/// step `step`. Recorded as a `process` record (event `step`), so the analyzer uses the real step
/// period instead of inferring it. Programs declare it weak and call it only when it resolves:
/// `extern void commscope_step(unsigned long long) __attribute__((weak));`
/// `if (commscope_step) commscope_step(n);` — without the shim, nothing happens.
#[cfg_attr(not(test), unsafe(no_mangle))]
pub extern "C" fn commscope_step(step: u64) {
    let Some((shim, _guard)) = active_mpi() else {
        return;
    };
    shielded(shim, || shim.push_step(step));
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    // SAFETY: the application's arguments, passed through.
    let rc = unsafe { PMPI_Init(argc, argv) };
    if rc == 0 {
        activate();
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed through.
    let rc = unsafe { PMPI_Init_thread(argc, argv, required, provided) };
    if rc == 0 {
        activate();
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    if crate::state::life() == life::ACTIVE {
        let _ = std::panic::catch_unwind(|| shutdown(End::Clean));
    }
    // SAFETY: no arguments.
    unsafe { PMPI_Finalize() }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Abort(comm: H, code: c_int) -> c_int {
    if crate::state::life() == life::ACTIVE {
        let _ = std::panic::catch_unwind(|| shutdown(End::Aborted(code)));
    }
    // SAFETY: the application's arguments, passed through.
    unsafe { PMPI_Abort(comm, code) }
}
