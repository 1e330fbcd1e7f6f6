//! Finding the real functions the wrappers forward to, however the library that defines them
//! was loaded.
//!
//! The usual case is one `dlsym(RTLD_NEXT, …)`: the MPI or NCCL library is in the global scope,
//! after this preloaded library. Python and the frameworks built on it load native code with
//! `RTLD_LOCAL`, though: `mpi4py` `dlopen`s `libmpi.so.40` (or `.12`) privately, and a
//! framework's extension module brings `libnccl.so.2` in as its own dependency. Such a library
//! is invisible to `RTLD_NEXT` and `RTLD_DEFAULT`, yet the application's calls still reach this
//! library's wrappers (the global scope, where the preload sits, is searched first). So when the
//! scopes fail, [`next`] walks the loaded objects (`dl_iterate_phdr`) in load order, opens each
//! again without loading anything (`RTLD_NOLOAD`) and asks it, skipping any definition that is
//! this library's own wrapper. The handle is kept, so the library stays loaded while its
//! address is cached.
//!
//! A function that cannot be found anywhere could not have been called without the shim either:
//! the dynamic loader would have stopped the program with "symbol lookup error". [`Real::target`]
//! does the same ([`undefined`]) rather than fail the call with an error code the application
//! never expects from that function.

use std::ffi::{CStr, CString, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Looks up a function: the next definition after this library, else the first definition in
/// any loaded object that is not this library's wrapper. Null when none exists.
pub fn next(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a valid NUL-terminated name; RTLD_NEXT finds the definition after this
    // library, which is the real one when this library is preloaded.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if !p.is_null() && !is_ours(p) {
        return p;
    }
    in_loaded_objects(name)
}

/// Looks up a data object's canonical address. An executable that takes the address of a
/// library's data object (`&ompi_mpi_comm_world`) gets a copy relocation, and the copy in the
/// executable is the object everyone uses: the global scope finds it first. A library loaded
/// privately (`RTLD_LOCAL`) is found by the walk.
pub fn data(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with a valid NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if !p.is_null() && !is_ours(p) {
        return p;
    }
    in_loaded_objects(name)
}

/// The first definition of `name` among the loaded objects, in load order, that is not in this
/// library. Null when none exists.
pub fn in_loaded_objects(name: &CStr) -> *mut c_void {
    for path in loaded_objects() {
        // The main program ("") stands for the global scope: dlopen(NULL).
        let path_ptr = if path.as_bytes().is_empty() {
            std::ptr::null()
        } else {
            path.as_ptr()
        };
        // SAFETY: a NUL-terminated path (or NULL for the program); RTLD_NOLOAD never loads
        // anything, it only returns a handle (one more reference) to an object already loaded.
        let h = unsafe { libc::dlopen(path_ptr, libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            continue; // the vDSO, or an object being unloaded
        }
        // SAFETY: a handle from dlopen and a NUL-terminated name; searches that object and its
        // dependencies (its local scope).
        let p = unsafe { libc::dlsym(h, name.as_ptr()) };
        if !p.is_null() && !is_ours(p) {
            // The handle is kept: the object stays loaded as long as its address is cached.
            return p;
        }
        // SAFETY: releases the reference this dlopen took (it did not load anything).
        unsafe { libc::dlclose(h) };
    }
    std::ptr::null_mut()
}

/// The paths of the loaded objects, in load order ("" for the program itself).
fn loaded_objects() -> Vec<CString> {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        out: *mut c_void,
    ) -> c_int {
        // SAFETY: `out` is the vector passed below; `info` is the loader's entry for one object,
        // whose name is NUL-terminated (or null).
        unsafe {
            let out = &mut *(out as *mut Vec<CString>);
            let name = (*info).dlpi_name;
            let s = if name.is_null() {
                CString::default()
            } else {
                CStr::from_ptr(name).to_owned()
            };
            out.push(s);
        }
        0
    }
    let mut out: Vec<CString> = Vec::with_capacity(64);
    // Names are copied inside the callback and the objects opened only after the walk: dlopen
    // is not called while the loader's list is being iterated.
    // SAFETY: the callback matches dl_iterate_phdr's and only appends to `out`.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut out as *mut Vec<CString>).cast()) };
    out
}

/// Whether `p` lies in this library (one of its own wrappers).
fn is_ours(p: *const c_void) -> bool {
    let base = own_base();
    base != 0 && object_base(p) == base
}

/// The load address of the object holding `p` (0 when none).
fn object_base(p: *const c_void) -> usize {
    // SAFETY: an all-zero Dl_info is a valid out-parameter.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables.
    if unsafe { libc::dladdr(p, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

/// This library's load address.
fn own_base() -> usize {
    static BASE: AtomicUsize = AtomicUsize::new(0);
    let b = BASE.load(Ordering::Relaxed);
    if b != 0 {
        return b;
    }
    let b = object_base(own_base as *const c_void);
    BASE.store(b, Ordering::Relaxed);
    b
}

/// What the dynamic loader does when a program calls a function no loaded object defines:
/// reports it and ends the process with status 127.
#[cold]
pub fn undefined(name: &CStr) -> ! {
    let mut line = Vec::with_capacity(160);
    line.extend_from_slice(program().as_bytes());
    line.extend_from_slice(b": symbol lookup error: undefined symbol: ");
    line.extend_from_slice(name.to_bytes());
    line.extend_from_slice(b" (commscope found no loaded library that defines it)\n");
    // SAFETY: writing a buffer we own to stderr, then ending the process as the loader would.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
        libc::_exit(127)
    }
}

fn program() -> String {
    std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_else(|| "commscope".to_owned())
}

/// A lazily resolved real function, cached in an atomic.
#[derive(Debug)]
pub struct Real {
    name: &'static CStr,
    ptr: AtomicUsize,
    resolve: fn(&'static CStr) -> *mut c_void,
}

impl Real {
    /// A function named `name`, resolved on first use with [`next`].
    pub const fn new(name: &'static CStr) -> Self {
        Real::with(name, next)
    }

    /// A function named `name`, resolved on first use by `resolve` (which may try other names).
    pub const fn with(name: &'static CStr, resolve: fn(&'static CStr) -> *mut c_void) -> Self {
        Real {
            name,
            ptr: AtomicUsize::new(0),
            resolve,
        }
    }

    /// The function's address, or 0 when no loaded library has it (looked up again on the next
    /// call, so a library loaded later is found). For the shim's own optional queries.
    #[inline]
    pub fn get(&self) -> usize {
        let p = self.ptr.load(Ordering::Relaxed);
        if p != 0 {
            return p;
        }
        let p = (self.resolve)(self.name) as usize;
        self.ptr.store(p, Ordering::Relaxed);
        p
    }

    /// The function an application's call is forwarded to; when no loaded library has it, the
    /// process ends as the dynamic loader would have ended it ([`undefined`]).
    #[inline]
    pub fn target(&self) -> usize {
        match self.get() {
            0 => undefined(self.name),
            p => p,
        }
    }

    /// The symbol name.
    pub fn name(&self) -> &'static CStr {
        self.name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_of_a_library_in_the_global_scope_is_found() {
        let p = next(c"getpid");
        assert!(!p.is_null());
        assert!(!is_ours(p));
    }

    #[test]
    fn a_function_of_a_privately_loaded_library_is_found_by_the_walk() {
        // libm's `cbrt` is in no global scope of the test binary unless something linked libm;
        // load a library privately and look for one of its functions by walking.
        // SAFETY: loading a system library privately; it is never unloaded by this test.
        let h = unsafe { libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            eprintln!("libz.so.1 is not installed; nothing to check");
            return;
        }
        // SAFETY: dlsym on the global scope.
        let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"zlibVersion".as_ptr()) };
        let found = in_loaded_objects(c"zlibVersion");
        // SAFETY: dlsym on the library's own handle.
        let direct = unsafe { libc::dlsym(h, c"zlibVersion".as_ptr()) };
        assert!(!direct.is_null());
        assert_eq!(found, direct);
        if global.is_null() {
            assert_eq!(next(c"zlibVersion"), direct, "RTLD_NEXT cannot see it; the walk can");
        }
    }

    #[test]
    fn a_name_no_library_defines_is_null() {
        assert!(next(c"commscope_no_such_function_anywhere").is_null());
        assert!(data(c"commscope_no_such_object_anywhere").is_null());
    }
}
