//! The MPI ABI as seen at run time: which flavour is loaded (Open MPI, or the MPICH ABI family),
//! its handle widths, constants and status layout, and the real `PMPI_*` functions.
//!
//! No MPI header is used: one library serves both flavours. Handles are passed through as
//! machine words (`usize`) — an MPICH `int` handle arrives in the low 32 bits of its register or
//! stack slot, and the callee reads only those, so forwarding the word unchanged is exact. When
//! commscope itself compares or hashes a handle it first [`Abi::norm`]alizes it.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::{AtomicU8, Ordering};

use commscope_wire::op::{dtype, red_op};

/// A handle as passed by value (`MPI_Comm`, `MPI_Datatype`, `MPI_Op`, `MPI_Request`, …).
pub type H = usize;

/// The MPI implementation family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// Open MPI: handles are pointers to predefined objects.
    OpenMpi,
    /// MPICH and its ABI family (Intel MPI, MVAPICH, Cray MPICH): handles are 32-bit ints.
    Mpich,
    /// No MPI in the process: an NCCL (or RCCL) job started by another launcher.
    None,
}

impl Flavour {
    /// The name recorded in trace headers.
    pub fn name(self) -> &'static str {
        match self {
            Flavour::OpenMpi => "openmpi",
            Flavour::Mpich => "mpich",
            Flavour::None => "nccl",
        }
    }
}

static FLAVOUR: AtomicU8 = AtomicU8::new(0);

use crate::resolve;

/// Declares the real (`PMPI_*`) functions: `pmpi!(fn PMPI_Send(a: T, …) -> c_int;)` makes a
/// function `PMPI_Send(a, …)` that calls the loaded MPI's, wherever that library was loaded.
/// An application's call is forwarded this way, and when no loaded library has the function the
/// process ends as the dynamic loader would have ended it ([`crate::resolve::undefined`]).
/// `pmpi!(own: fn …;)` declares functions the shim calls for itself (ranks, sizes, groups, type
/// sizes): missing, they return `MPI_ERR_OTHER` (reported once) — the shim's own queries must
/// never hurt the job.
macro_rules! pmpi {
    (@address forward $real:ident) => {
        $real.target()
    };
    (@address own $real:ident) => {
        match $real.get() {
            0 => {
                $crate::abi::missing($real.name());
                return $crate::abi::ERR_OTHER;
            }
            p => p,
        }
    };
    (@def $mode:ident $(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> c_int;)*) => {
        $(
            #[allow(non_snake_case, clippy::too_many_arguments, clippy::missing_safety_doc)]
            #[inline]
            pub unsafe fn $name($($arg: $ty),*) -> ::std::ffi::c_int {
                static REAL: $crate::resolve::Real = $crate::resolve::Real::new(
                    match ::std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                        Ok(s) => s,
                        Err(_) => panic!("symbol name"),
                    },
                );
                let p = $crate::abi::pmpi!(@address $mode REAL);
                // SAFETY: `p` is the address of the MPI library's function of this name, whose C
                // signature is the one declared here (handles as machine words).
                let f: unsafe extern "C" fn($($ty),*) -> ::std::ffi::c_int = unsafe { ::std::mem::transmute(p) };
                // SAFETY: the caller passes valid arguments (the application's own, or the shim's).
                unsafe { f($($arg),*) }
            }
        )*
    };
    (own: $($rest:tt)*) => {
        $crate::abi::pmpi!(@def own $($rest)*);
    };
    ($($rest:tt)*) => {
        $crate::abi::pmpi!(@def forward $($rest)*);
    };
}
pub(crate) use pmpi;

/// `MPI_ERR_OTHER` in both flavours' numbering is not the same (16 / 15); the value is only
/// seen by the shim's own queries, never by the application.
pub const ERR_OTHER: c_int = 15;

/// Reports, once per process, that one of the shim's own queries is missing from the library.
#[cold]
pub fn missing(name: &CStr) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        crate::util::warn(format_args!(
            "the MPI library has no {}; commscope records less about this process",
            name.to_string_lossy()
        ))
    });
}

/// Flavour-specific constants and layout.
#[derive(Debug)]
pub struct Abi {
    pub flavour: Flavour,
    pub comm_world: u64,
    pub comm_self: u64,
    pub comm_null: u64,
    pub request_null: u64,
    pub any_source: i32,
    pub any_tag: i32,
    pub proc_null: i32,
    pub root: i32,
    pub undefined: i32,
    pub in_place: usize,
    pub status_ignore: usize,
    /// Size of `MPI_Status` in bytes.
    pub status_size: usize,
    pub status_source: usize,
    pub status_tag: usize,
    pub status_error: usize,
    /// Size of a handle stored in memory (arrays, output arguments): 8 or 4.
    pub handle_size: usize,
    /// `MPI_Topo_test`'s answers for Cartesian and graph topologies (the flavours swap them;
    /// `MPI_DIST_GRAPH` is 3 in both).
    pub topo_cart: c_int,
    pub topo_graph: c_int,
    /// Predefined datatypes: (normalized handle, code).
    pub dtypes: Vec<(u64, u16)>,
    /// Predefined reduction operations: (normalized handle, [`red_op`] code).
    pub ops: Vec<(u64, u8)>,
    /// `MPI_OP_NULL`.
    pub op_null: u64,
}

/// The largest `MPI_Status` of the supported flavours, in bytes, with room to spare.
pub const STATUS_MAX: usize = 64;

impl Abi {
    /// Detects the loaded flavour. Returns `None` when no MPI is loaded.
    pub fn detect() -> Option<Abi> {
        let world = resolve::data(c"ompi_mpi_comm_world");
        let abi = if !world.is_null() {
            let sym = |n: &CStr| resolve::data(n) as u64;
            let dt = |n: &CStr, code: u16| (sym(n), code);
            let dtypes = vec![
                dt(c"ompi_mpi_byte", dtype::BYTE),
                dt(c"ompi_mpi_char", dtype::CHAR),
                dt(c"ompi_mpi_signed_char", dtype::SIGNED_CHAR),
                dt(c"ompi_mpi_unsigned_char", dtype::UNSIGNED_CHAR),
                dt(c"ompi_mpi_short", dtype::SHORT),
                dt(c"ompi_mpi_unsigned_short", dtype::UNSIGNED_SHORT),
                dt(c"ompi_mpi_int", dtype::INT),
                dt(c"ompi_mpi_unsigned", dtype::UNSIGNED),
                dt(c"ompi_mpi_long", dtype::LONG),
                dt(c"ompi_mpi_unsigned_long", dtype::UNSIGNED_LONG),
                dt(c"ompi_mpi_long_long_int", dtype::LONG_LONG),
                dt(c"ompi_mpi_unsigned_long_long", dtype::UNSIGNED_LONG_LONG),
                dt(c"ompi_mpi_float", dtype::FLOAT),
                dt(c"ompi_mpi_double", dtype::DOUBLE),
                dt(c"ompi_mpi_long_double", dtype::LONG_DOUBLE),
                dt(c"ompi_mpi_int8_t", dtype::INT8),
                dt(c"ompi_mpi_int16_t", dtype::INT16),
                dt(c"ompi_mpi_int32_t", dtype::INT32),
                dt(c"ompi_mpi_int64_t", dtype::INT64),
                dt(c"ompi_mpi_uint8_t", dtype::UINT8),
                dt(c"ompi_mpi_uint16_t", dtype::UINT16),
                dt(c"ompi_mpi_uint32_t", dtype::UINT32),
                dt(c"ompi_mpi_uint64_t", dtype::UINT64),
                dt(c"ompi_mpi_c_bool", dtype::C_BOOL),
                dt(c"ompi_mpi_packed", dtype::PACKED),
                dt(c"ompi_mpi_float_int", dtype::FLOAT_INT),
                dt(c"ompi_mpi_double_int", dtype::DOUBLE_INT),
                dt(c"ompi_mpi_long_int", dtype::LONG_INT),
                dt(c"ompi_mpi_2int", dtype::TWO_INT),
                // Fortran's types (`MPI_INTEGER`, `MPI_DOUBLE_PRECISION`, …) are objects of their own.
                dt(c"ompi_mpi_character", dtype::CHAR),
                dt(c"ompi_mpi_integer", dtype::INT32),
                dt(c"ompi_mpi_integer1", dtype::INT8),
                dt(c"ompi_mpi_integer2", dtype::INT16),
                dt(c"ompi_mpi_integer4", dtype::INT32),
                dt(c"ompi_mpi_integer8", dtype::INT64),
                dt(c"ompi_mpi_real", dtype::FLOAT),
                dt(c"ompi_mpi_real4", dtype::FLOAT),
                dt(c"ompi_mpi_dblprec", dtype::DOUBLE),
                dt(c"ompi_mpi_real8", dtype::DOUBLE),
            ];
            let op = |n: &CStr, code: u8| (sym(n), code);
            let ops = vec![
                op(c"ompi_mpi_op_sum", red_op::SUM),
                op(c"ompi_mpi_op_prod", red_op::PROD),
                op(c"ompi_mpi_op_max", red_op::MAX),
                op(c"ompi_mpi_op_min", red_op::MIN),
                op(c"ompi_mpi_op_land", red_op::LAND),
                op(c"ompi_mpi_op_band", red_op::BAND),
                op(c"ompi_mpi_op_lor", red_op::LOR),
                op(c"ompi_mpi_op_bor", red_op::BOR),
                op(c"ompi_mpi_op_lxor", red_op::LXOR),
                op(c"ompi_mpi_op_bxor", red_op::BXOR),
                op(c"ompi_mpi_op_minloc", red_op::MINLOC),
                op(c"ompi_mpi_op_maxloc", red_op::MAXLOC),
                op(c"ompi_mpi_op_replace", red_op::REPLACE),
                op(c"ompi_mpi_op_no_op", red_op::NO_OP),
            ];
            Abi {
                flavour: Flavour::OpenMpi,
                comm_world: world as u64,
                comm_self: sym(c"ompi_mpi_comm_self"),
                comm_null: sym(c"ompi_mpi_comm_null"),
                request_null: sym(c"ompi_request_null"),
                any_source: -1,
                any_tag: -1,
                proc_null: -2,
                root: -4,
                undefined: -32766,
                in_place: 1,
                status_ignore: 0,
                status_size: 24,
                status_source: 0,
                status_tag: 4,
                status_error: 8,
                handle_size: 8,
                topo_cart: 1,
                topo_graph: 2,
                dtypes: dtypes.into_iter().filter(|&(h, _)| h != 0).collect(),
                ops: ops.into_iter().filter(|&(h, _)| h != 0).collect(),
                op_null: sym(c"ompi_mpi_op_null"),
            }
        } else if !resolve::next(c"PMPI_Init").is_null() {
            let dtypes = vec![
                (0x4c00010d, dtype::BYTE),
                (0x4c000101, dtype::CHAR),
                (0x4c000118, dtype::SIGNED_CHAR),
                (0x4c000102, dtype::UNSIGNED_CHAR),
                (0x4c000203, dtype::SHORT),
                (0x4c000204, dtype::UNSIGNED_SHORT),
                (0x4c000405, dtype::INT),
                (0x4c000406, dtype::UNSIGNED),
                (0x4c000807, dtype::LONG),
                (0x4c000808, dtype::UNSIGNED_LONG),
                (0x4c000809, dtype::LONG_LONG),
                (0x4c000819, dtype::UNSIGNED_LONG_LONG),
                (0x4c00040a, dtype::FLOAT),
                (0x4c00080b, dtype::DOUBLE),
                (0x4c00100c, dtype::LONG_DOUBLE),
                (0x4c000137, dtype::INT8),
                (0x4c000238, dtype::INT16),
                (0x4c000439, dtype::INT32),
                (0x4c00083a, dtype::INT64),
                (0x4c00013b, dtype::UINT8),
                (0x4c00023c, dtype::UINT16),
                (0x4c00043d, dtype::UINT32),
                (0x4c00083e, dtype::UINT64),
                (0x4c00013f, dtype::C_BOOL),
                (0x4c00010f, dtype::PACKED),
                (0x8c000000, dtype::FLOAT_INT),
                (0x8c000001, dtype::DOUBLE_INT),
                (0x8c000002, dtype::LONG_INT),
                (0x4c000816, dtype::TWO_INT),
                // Fortran's types (mpif.h).
                (0x4c00011a, dtype::CHAR),
                (0x4c00041b, dtype::INT32),
                (0x4c00012d, dtype::INT8),
                (0x4c00022f, dtype::INT16),
                (0x4c000430, dtype::INT32),
                (0x4c000831, dtype::INT64),
                (0x4c00041c, dtype::FLOAT),
                (0x4c000427, dtype::FLOAT),
                (0x4c00081f, dtype::DOUBLE),
                (0x4c000829, dtype::DOUBLE),
            ];
            Abi {
                flavour: Flavour::Mpich,
                comm_world: 0x4400_0000,
                comm_self: 0x4400_0001,
                comm_null: 0x0400_0000,
                request_null: 0x2c00_0000,
                any_source: -2,
                any_tag: -1,
                proc_null: -1,
                root: -3,
                undefined: -32766,
                in_place: usize::MAX,
                status_ignore: 1,
                status_size: 20,
                status_source: 8,
                status_tag: 12,
                status_error: 16,
                handle_size: 4,
                topo_cart: 2,
                topo_graph: 1,
                dtypes,
                // mpi.h: MPI_MAX 0x58000001 … MPI_NO_OP 0x5800000e.
                ops: [
                    red_op::MAX,
                    red_op::MIN,
                    red_op::SUM,
                    red_op::PROD,
                    red_op::LAND,
                    red_op::BAND,
                    red_op::LOR,
                    red_op::BOR,
                    red_op::LXOR,
                    red_op::BXOR,
                    red_op::MINLOC,
                    red_op::MAXLOC,
                    red_op::REPLACE,
                    red_op::NO_OP,
                ]
                .iter()
                .zip(0x5800_0001u64..)
                .map(|(&code, h)| (h, code))
                .collect(),
                op_null: 0x1800_0000,
            }
        } else {
            return None;
        };
        FLAVOUR.store(abi.flavour as u8 + 1, Ordering::Relaxed);
        Some(abi)
    }

    /// The ABI of a process without MPI (no MPI entry point is ever recorded there).
    pub fn absent() -> Abi {
        Abi {
            flavour: Flavour::None,
            comm_world: u64::MAX,
            comm_self: u64::MAX - 1,
            comm_null: 0,
            request_null: 0,
            any_source: -1,
            any_tag: -1,
            proc_null: -2,
            root: -4,
            undefined: -32766,
            in_place: 1,
            status_ignore: 1,
            status_size: 0,
            status_source: 0,
            status_tag: 0,
            status_error: 0,
            handle_size: 8,
            topo_cart: 1,
            topo_graph: 2,
            dtypes: Vec::new(),
            ops: Vec::new(),
            op_null: 0,
        }
    }

    /// A handle as commscope compares and hashes it: MPICH handles are 32-bit.
    #[inline]
    pub fn norm(&self, h: H) -> u64 {
        match self.flavour {
            Flavour::OpenMpi | Flavour::None => h as u64,
            Flavour::Mpich => h as u32 as u64,
        }
    }

    /// Reads the handle stored at `p` (an output argument or array element).
    ///
    /// # Safety
    /// `p` must point to a readable handle of this flavour.
    #[inline]
    pub unsafe fn read_handle(&self, p: *const c_void) -> u64 {
        // SAFETY: per the contract, `p` points to a handle of `handle_size` bytes.
        unsafe {
            if self.handle_size == 8 {
                (p as *const u64).read_unaligned()
            } else {
                u64::from((p as *const u32).read_unaligned())
            }
        }
    }

    /// Reads element `i` of a handle array.
    ///
    /// # Safety
    /// `base` must point to at least `i + 1` handles of this flavour.
    #[inline]
    pub unsafe fn read_handle_at(&self, base: *const c_void, i: usize) -> u64 {
        // SAFETY: in bounds per the contract.
        unsafe { self.read_handle((base as *const u8).add(i * self.handle_size) as *const c_void) }
    }

    /// The source, tag and error fields of a status.
    ///
    /// # Safety
    /// `st` must point to a status of this flavour.
    #[inline]
    pub unsafe fn status_fields(&self, st: *const u8) -> (i32, i32, i32) {
        // SAFETY: offsets are within the flavour's status struct.
        unsafe {
            (
                (st.add(self.status_source) as *const i32).read_unaligned(),
                (st.add(self.status_tag) as *const i32).read_unaligned(),
                (st.add(self.status_error) as *const i32).read_unaligned(),
            )
        }
    }

    /// Whether a status pointer is one of the "ignore" sentinels (or null).
    #[inline]
    pub fn is_status_ignore(&self, st: *mut c_void) -> bool {
        st.is_null() || st as usize == self.status_ignore
    }

    /// The datatype code of a predefined type, else [`dtype::DERIVED`].
    #[inline]
    pub fn dtype_code(&self, h: u64) -> u16 {
        for &(k, code) in &self.dtypes {
            if k == h {
                return code;
            }
        }
        dtype::DERIVED
    }

    /// The [`red_op`] code of a reduction operation: a predefined one's, else user-defined
    /// ([`red_op::UNKNOWN`] for `MPI_OP_NULL`).
    #[inline]
    pub fn red_op_code(&self, h: H) -> u8 {
        let h = self.norm(h);
        if h == self.op_null {
            return red_op::UNKNOWN;
        }
        self.ops
            .iter()
            .find(|&&(k, _)| k == h)
            .map_or(red_op::USER, |&(_, code)| code)
    }

    /// Contract value for special ranks: -1 none, -2 `MPI_PROC_NULL`, -3 `MPI_ANY_SOURCE`
    /// (unresolved), -4 `MPI_ROOT`; real ranks unchanged.
    #[inline]
    pub fn rank_value(&self, r: i32) -> i32 {
        if r >= 0 {
            r
        } else if r == self.proc_null {
            -2
        } else if r == self.any_source {
            -3
        } else if r == self.root {
            -4
        } else {
            -1
        }
    }
}

/// The library's version string, from `MPI_Get_library_version`.
pub fn library_version() -> String {
    pmpi! { own:
        fn PMPI_Get_library_version(buf: *mut c_char, len: *mut c_int) -> c_int;
    }
    // MPICH's MPI_MAX_LIBRARY_VERSION_STRING is 8192, Open MPI's 256.
    let mut buf = vec![0 as c_char; 8192];
    let mut len: c_int = 0;
    // SAFETY: the buffer is as large as either flavour's maximum.
    if unsafe { PMPI_Get_library_version(buf.as_mut_ptr(), &mut len) } != 0 {
        return String::new();
    }
    // SAFETY: the library NUL-terminates within the buffer; the last byte is still 0.
    let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy();
    s.lines().next().unwrap_or_default().trim().to_owned()
}
