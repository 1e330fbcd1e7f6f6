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

// ----- optional exports --------------------------------------------------------------------------
//
// Some entry points exist only in some libraries: MPI-4's large-count `_c` calls and persistent
// collectives are in MPICH 4 but not in Open MPI 4.1, the Fortran bindings only where a Fortran
// MPI library is loaded, NCCL's `*Config` calls only from 2.32. Programs test for such functions
// with weak references (`if (MPI_Bcast_c) …`: mpi4py does so for hundreds of them), so a
// preloaded library that simply defines them changes what the program does. These wrappers are
// therefore exported as GNU indirect functions: the dynamic loader asks their resolver for the
// address when it binds a reference, and the resolver answers the wrapper only when a loaded
// library defines the real function, else 0 — to the program the function is defined exactly
// when it would be without commscope.

/// Defines an optional export of `$wrapper` (a GNU indirect function whose resolver is
/// [`optional`]):
/// - `optional_export!(NAME, wrapper, [probe, …])` exports `NAME`, bound to the wrapper when a
///   loaded object other than this library defines one of the probes (tried in order; the first
///   is the function the wrapper forwards to), else unresolved (a weak reference reads 0);
/// - `optional_export!(fn rust_name = "exported name", wrapper)` exports a name built by a
///   macro (`concat!`), bound when another object defines that very name.
macro_rules! optional_export {
    ($export:ident, $wrapper:path, [$($probe:expr),+ $(,)?]) => {
        $crate::resolve::optional_export!(@def $export, stringify!($export), $wrapper, [$($probe),+]);
    };
    (fn $rust:ident = $name:expr, $wrapper:path) => {
        $crate::resolve::optional_export!(@def $rust, $name, $wrapper, [
            match ::std::ffi::CStr::from_bytes_with_nul(concat!($name, "\0").as_bytes()) {
                Ok(s) => s,
                Err(_) => panic!("symbol name"),
            }
        ]);
    };
    (@def $rust:ident, $name:expr, $wrapper:path, [$($probe:expr),+]) => {
        /// The resolver of an optional export (GNU indirect function): see
        /// [`crate::resolve::optional`].
        #[cfg_attr(not(test), unsafe(export_name = $name))]
        pub extern "C" fn $rust() -> usize {
            $crate::resolve::optional($wrapper as *const () as usize, &[$($probe),+])
        }
        #[cfg(not(test))]
        ::std::arch::global_asm!(concat!(".type ", $name, ", @gnu_indirect_function"));
    };
}
pub(crate) use optional_export;

/// Defines `$name` as an optional export of the `pub unsafe extern "C" fn wrapper` that `$def`
/// defines (in a module of that name, so the wrapper needs no name of its own), bound when one
/// of the probes is defined elsewhere ([`optional_export`]).
macro_rules! optional_wrapper {
    ($name:ident, [$($probe:expr),+ $(,)?]: $($def:tt)*) => {
        #[allow(non_snake_case)]
        pub mod $name {
            #[allow(unused_imports)]
            use super::*;
            $($def)*
        }
        $crate::resolve::optional_export!($name, $name::wrapper, [$($probe),+]);
    };
}
pub(crate) use optional_wrapper;

/// The address an optional export binds to: `wrapper` when a loaded object other than this
/// library defines `probes[0]`; the real function itself when only a later probe is defined
/// (it is called unrecorded: the profiling twin is missing); else 0.
///
/// Runs inside the dynamic loader while it relocates an object, so it reads the loaded objects'
/// dynamic symbol tables itself: no `dl*` call, no allocation, no thread-local.
pub fn optional(wrapper: usize, probes: &[&CStr]) -> usize {
    for (i, name) in probes.iter().enumerate() {
        if let Some(addr) = elf::defined_elsewhere(name) {
            return if i == 0 { wrapper } else { addr };
        }
    }
    0
}

/// Reading the loaded objects' dynamic symbol tables (`DT_GNU_HASH`, else `DT_HASH`).
mod elf {
    use std::ffi::{CStr, c_int, c_void};

    const DT_NULL: i64 = 0;
    const DT_HASH: i64 = 4;
    const DT_STRTAB: i64 = 5;
    const DT_SYMTAB: i64 = 6;
    const DT_GNU_HASH: i64 = 0x6fff_fef5;
    const DT_VERSYM: i64 = 0x6fff_fff0;
    const STT_FUNC: u8 = 2;
    const STT_OBJECT: u8 = 1;
    const STT_GNU_IFUNC: u8 = 10;
    const STB_LOCAL: u8 = 0;

    #[repr(C)]
    struct Dyn {
        tag: i64,
        val: u64,
    }

    struct Query<'a> {
        name: &'a CStr,
        hash_gnu: u32,
        hash_sysv: u32,
        own: usize,
        found: Option<usize>,
    }

    /// The address of the first definition of `name` in a loaded object other than this library
    /// (for an indirect function, its resolver's address: non-zero is what matters).
    pub fn defined_elsewhere(name: &CStr) -> Option<usize> {
        let mut q = Query {
            name,
            hash_gnu: gnu_hash(name.to_bytes()),
            hash_sysv: sysv_hash(name.to_bytes()),
            own: defined_elsewhere as *const () as usize,
            found: None,
        };
        // SAFETY: the callback matches dl_iterate_phdr's and only reads the entry it is given
        // and the query it is passed.
        unsafe { libc::dl_iterate_phdr(Some(each), (&mut q as *mut Query<'_>).cast()) };
        q.found
    }

    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        q: *mut c_void,
    ) -> c_int {
        // SAFETY: `q` is the query passed by `defined_elsewhere`; `info` the loader's entry for
        // one loaded object, whose program headers and dynamic section are mapped.
        unsafe {
            let q = &mut *(q as *mut Query<'_>);
            let info = &*info;
            if info.dlpi_phdr.is_null() || contains(info, q.own) {
                return 0;
            }
            if let Some(a) = lookup(info, q) {
                q.found = Some(a);
                return 1;
            }
        }
        0
    }

    /// Whether one of the object's loaded segments holds `addr`.
    ///
    /// # Safety
    /// `info` must be a loader entry with valid program headers.
    unsafe fn contains(info: &libc::dl_phdr_info, addr: usize) -> bool {
        // SAFETY: per the contract.
        let phdrs =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let base = info.dlpi_addr as usize;
        phdrs.iter().any(|p| {
            p.p_type == libc::PT_LOAD && {
                let start = base.wrapping_add(p.p_vaddr as usize);
                addr >= start && addr < start.wrapping_add(p.p_memsz as usize)
            }
        })
    }

    /// The object's definition of the queried name, if any.
    ///
    /// # Safety
    /// `info` must be a loader entry of a mapped object.
    unsafe fn lookup(info: &libc::dl_phdr_info, q: &Query<'_>) -> Option<usize> {
        // SAFETY: per the contract; every table address comes from the object's own dynamic
        // section, which the loader mapped.
        unsafe {
            let base = info.dlpi_addr as usize;
            let phdrs = std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum));
            let dynamic = phdrs.iter().find(|p| p.p_type == libc::PT_DYNAMIC)?;
            // The loader rewrites these addresses in place for the objects it relocated; the vDSO
            // (and an object it did not) keeps link-time values, relative to the base.
            let fix = |v: u64| {
                let v = v as usize;
                if v < base { v.wrapping_add(base) } else { v }
            };
            let (mut symtab, mut strtab, mut gnu, mut sysv, mut versym) = (0, 0, 0, 0, 0);
            let mut d = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
            for _ in 0..4096 {
                let e = &*d;
                match e.tag {
                    DT_NULL => break,
                    DT_SYMTAB => symtab = fix(e.val),
                    DT_STRTAB => strtab = fix(e.val),
                    DT_GNU_HASH => gnu = fix(e.val),
                    DT_HASH => sysv = fix(e.val),
                    DT_VERSYM => versym = fix(e.val),
                    _ => {}
                }
                d = d.add(1);
            }
            if symtab == 0 || strtab == 0 {
                return None;
            }
            let tables = Tables {
                base,
                symtab,
                strtab,
                versym,
            };
            if gnu != 0 {
                tables.gnu_lookup(gnu, q)
            } else if sysv != 0 {
                tables.sysv_lookup(sysv, q)
            } else {
                None
            }
        }
    }

    struct Tables {
        base: usize,
        symtab: usize,
        strtab: usize,
        versym: usize,
    }

    impl Tables {
        /// Symbol `i` if it is a visible definition of `name`: its address.
        ///
        /// # Safety
        /// `i` must index the object's symbol table.
        unsafe fn matches(&self, i: usize, name: &CStr) -> Option<usize> {
            // SAFETY: per the contract; names are NUL-terminated in the string table.
            unsafe {
                let sym = &*(self.symtab as *const libc::Elf64_Sym).add(i);
                let kind = sym.st_info & 0xf;
                let bind = sym.st_info >> 4;
                if sym.st_shndx == 0
                    || bind == STB_LOCAL
                    || !matches!(kind, STT_FUNC | STT_OBJECT | STT_GNU_IFUNC)
                {
                    return None;
                }
                if self.versym != 0 && *(self.versym as *const u16).add(i) & 0x8000 != 0 {
                    return None; // a hidden (non-default) version
                }
                let n = CStr::from_ptr((self.strtab + sym.st_name as usize) as *const libc::c_char);
                (n == name).then(|| self.base.wrapping_add(sym.st_value as usize))
            }
        }

        /// # Safety
        /// `table` must be the object's `DT_GNU_HASH` table.
        unsafe fn gnu_lookup(&self, table: usize, q: &Query<'_>) -> Option<usize> {
            // SAFETY: per the contract: header, bloom words, buckets, then the chain.
            unsafe {
                let hdr = table as *const u32;
                let (nbuckets, symoffset, bloom_size) = (*hdr, *hdr.add(1), *hdr.add(2));
                if nbuckets == 0 {
                    return None;
                }
                let buckets = (table + 16 + bloom_size as usize * 8) as *const u32;
                let chain = buckets.add(nbuckets as usize);
                let h = q.hash_gnu;
                let mut i = *buckets.add((h % nbuckets) as usize);
                if i == 0 || i < symoffset {
                    return None;
                }
                loop {
                    let c = *chain.add((i - symoffset) as usize);
                    if (c | 1) == (h | 1)
                        && let Some(a) = self.matches(i as usize, q.name)
                    {
                        return Some(a);
                    }
                    if c & 1 != 0 {
                        return None;
                    }
                    i += 1;
                }
            }
        }

        /// # Safety
        /// `table` must be the object's `DT_HASH` table.
        unsafe fn sysv_lookup(&self, table: usize, q: &Query<'_>) -> Option<usize> {
            // SAFETY: per the contract: nbucket, nchain, buckets, chains.
            unsafe {
                let hdr = table as *const u32;
                let (nbucket, nchain) = (*hdr, *hdr.add(1));
                if nbucket == 0 {
                    return None;
                }
                let buckets = hdr.add(2);
                let chains = buckets.add(nbucket as usize);
                let mut i = *buckets.add((q.hash_sysv % nbucket) as usize);
                let mut steps = 0;
                while i != 0 && i < nchain && steps < nchain {
                    if let Some(a) = self.matches(i as usize, q.name) {
                        return Some(a);
                    }
                    i = *chains.add(i as usize);
                    steps += 1;
                }
                None
            }
        }
    }

    fn gnu_hash(name: &[u8]) -> u32 {
        name.iter().fold(5381u32, |h, &c| {
            h.wrapping_mul(33).wrapping_add(u32::from(c))
        })
    }

    fn sysv_hash(name: &[u8]) -> u32 {
        let mut h: u32 = 0;
        for &c in name {
            h = (h << 4).wrapping_add(u32::from(c));
            let g = h & 0xf000_0000;
            if g != 0 {
                h ^= g >> 24;
            }
            h &= !g;
        }
        h
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_hash_functions_match_the_elf_specifications() {
            // Values from the ELF gABI (SysV) and the GNU hash's reference implementation.
            assert_eq!(gnu_hash(b""), 5381);
            assert_eq!(gnu_hash(b"printf"), 0x156b_2bb8);
            assert_eq!(sysv_hash(b"printf"), 0x0779_05a6);
        }

        #[test]
        fn a_libc_function_is_found_at_the_address_dlsym_gives() {
            // SAFETY: dlsym on the global scope.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) } as usize;
            assert_eq!(defined_elsewhere(c"getpid"), Some(p));
        }

        #[test]
        fn a_privately_loaded_librarys_function_is_found() {
            // SAFETY: loading a system library privately; never unloaded by this test.
            let h =
                unsafe { libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if h.is_null() {
                eprintln!("libz.so.1 is not installed; nothing to check");
                return;
            }
            // SAFETY: dlsym on the library's own handle.
            let p = unsafe { libc::dlsym(h, c"zlibVersion".as_ptr()) } as usize;
            assert_eq!(defined_elsewhere(c"zlibVersion"), Some(p));
        }

        #[test]
        fn a_name_nobody_defines_is_not_found() {
            assert_eq!(
                defined_elsewhere(c"commscope_no_such_symbol_anywhere"),
                None
            );
            assert_eq!(defined_elsewhere(c"getpi"), None);
        }
    }
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
            assert_eq!(
                next(c"zlibVersion"),
                direct,
                "RTLD_NEXT cannot see it; the walk can"
            );
        }
    }

    #[test]
    fn a_name_no_library_defines_is_null() {
        assert!(next(c"commscope_no_such_function_anywhere").is_null());
        assert!(data(c"commscope_no_such_object_anywhere").is_null());
    }
}
