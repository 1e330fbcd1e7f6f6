//! Persistent requests: `*_init` keeps a template under the request handle, every
//! `MPI_Start`/`MPI_Startall` makes it a pending call like a nonblocking one.

use std::ffi::c_int;
use std::sync::atomic::Ordering;

use commscope_wire::op::{Op, flags};
use commscope_wire::shm::{Counter, in_flight_status};

use super::{CP, CollInfo, P};
use crate::abi::{H, pmpi};
use crate::state::{Shim, Slot, shielded};
use crate::tables::{Dir, Pending};
use crate::util::now_mono;

pmpi! {
    fn PMPI_Send_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Ssend_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Bsend_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Rsend_init(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Recv_init(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Start(req: P) -> c_int;
    fn PMPI_Startall(n: c_int, reqs: P) -> c_int;
}

impl Shim {
    /// A persistent send or receive was created: keep its template under the request handle.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn persistent_init(
        &self,
        op: Op,
        fl: u16,
        count: i64,
        dt: H,
        peer: c_int,
        tag: c_int,
        comm: H,
        req: P,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        self.keep_template(req, real, || {
            let fl = fl | flags::PERSISTENT | flags::NONBLOCKING;
            let call = self.typed_call(op, fl, (count, dt), (peer, tag), comm);
            let recv = op == Op::Recv;
            Pending {
                call,
                slot: Slot::None,
                seq_at_completion: recv && call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0,
                comm: self.abi.norm(comm),
                dtype: if recv { dt as u64 } else { 0 },
            }
        })
    }

    /// A persistent collective was created (`MPI_*_init`, Open MPI's `MPIX_*_init`): keep its
    /// template under the request handle; each start is one instance.
    pub(crate) fn persistent_coll(
        &self,
        comm: H,
        op: Op,
        req: P,
        info: impl FnOnce(&Shim, u64, i32, bool) -> CollInfo,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        self.keep_template(req, real, || {
            let fl = flags::PERSISTENT | flags::NONBLOCKING;
            let (call, _) = self.sized_coll(comm, op, fl, info);
            Pending {
                call,
                slot: Slot::None,
                seq_at_completion: false,
                comm: self.abi.norm(comm),
                dtype: 0,
            }
        })
    }

    /// Calls `real`, which creates a persistent request at `req`, and keeps the request's
    /// template (counted when the table is full).
    fn keep_template(
        &self,
        req: P,
        real: impl FnOnce() -> c_int,
        template: impl FnOnce() -> Pending,
    ) -> c_int {
        let rc = real();
        if rc != 0 || req.is_null() {
            return rc;
        }
        shielded(self, || {
            // SAFETY: MPI wrote the request handle.
            let h = unsafe { self.abi.read_handle(req) };
            if !self.persistent.insert(h, template()) {
                self.shm.count(Counter::DroppedRequests, 1);
            }
        });
        rc
    }

    /// A persistent request was started: it becomes a pending call like any nonblocking one.
    pub(crate) fn started(&self, h: u64) {
        let Some(t) = self.persistent.get(h) else {
            return;
        };
        let mut call = t.call;
        call.t_enter = now_mono();
        let op = Op::from_code(call.op);
        if let Some(e) = self.comms.get(t.comm) {
            if op.is_p2p() {
                call.seq = e.seq.load(Ordering::Relaxed);
            } else {
                // Each start of a persistent collective is a new instance on its communicator.
                e.next_instance(&mut call, op);
            }
        }
        if op.is_p2p() && !t.seq_at_completion {
            self.assign_p2p_seq(&mut call, Dir::of(op));
        }
        let slot = self.claim(&call, in_flight_status::POSTED);
        let p = Pending { call, slot, ..t };
        if !self.requests.insert(h, p) {
            self.shm.count(Counter::DroppedRequests, 1);
            let mut c = p.call;
            c.flags |= flags::UNTRACKED;
            self.finish(c, p.slot, 0);
        }
    }
}

/// Defines the persistent collective `*_init` wrappers of one collective under each of its names
/// (MPI-4's `MPI_X_init` in MPICH 4, Open MPI 4's `MPIX_X_init`: the same signature; or one
/// name, the large-count `MPI_X_init_c`), each exported where the library has it: like
/// [`icollective!`] with the `info` argument before the request.
macro_rules! pcollective {
    ($name:ident => $real:ident: $($rest:tt)*) => {
        pcollective!(@one $name => $real: $($rest)*);
    };
    ($name:ident => $real:ident, $xname:ident => $xreal:ident: $($rest:tt)*) => {
        pcollective!(@one $name => $real: $($rest)*);
        pcollective!(@one $xname => $xreal: $($rest)*);
    };
    (@one $name:ident => $real:ident: ($($a:ident: $t:ty),* $(,)?), $comm:ident, $req:ident, $op:expr, |$s:ident, $n:pat_param, $me:pat_param, $inter:pat_param| $info:expr) => {
        $crate::abi::pmpi! {
            fn $real($($a: $t),*) -> c_int;
        }
        optional!($name => $real:
            pub unsafe extern "C" fn wrapper($($a: $t),*) -> c_int {
                let (s, _g) = real_or!($real($($a),*));
                // SAFETY: pass-through of the application's arguments.
                s.persistent_coll($comm, $op, $req, |$s, $n, $me, $inter| $info, || unsafe { $real($($a),*) })
            }
        );
    };
}

/// Defines a persistent point-to-point `*_init` wrapper (`@local`: not exported, for
/// [`optional!`]).
macro_rules! persistent_init {
    ($name:ident, $real:ident, $op:expr, $fl:expr, $buf:ty) => {
        persistent_init!(@def [#[cfg_attr(not(test), unsafe(no_mangle))]] $name, $real, $op, $fl, $buf, c_int);
    };
    (@local $name:ident, $real:ident, $op:expr, $fl:expr, $buf:ty, $count:ty) => {
        persistent_init!(@def [] $name, $real, $op, $fl, $buf, $count);
    };
    (@def [$($attr:tt)*] $name:ident, $real:ident, $op:expr, $fl:expr, $buf:ty, $count:ty) => {
        $($attr)*
        pub unsafe extern "C" fn $name(
            buf: $buf,
            count: $count,
            dt: H,
            peer: c_int,
            tag: c_int,
            comm: H,
            req: P,
        ) -> c_int {
            let (s, _g) = real_or!($real(buf, count, dt, peer, tag, comm, req));
            // SAFETY: pass-through of the application's arguments.
            s.persistent_init(
                $op,
                $fl,
                count.into(),
                dt,
                peer,
                tag,
                comm,
                req,
                // SAFETY: pass-through of the application's own arguments to the real function.
                || unsafe { $real(buf, count, dt, peer, tag, comm, req) },
            )
        }
    };
}

persistent_init!(MPI_Send_init, PMPI_Send_init, Op::Send, 0, CP);
persistent_init!(
    MPI_Ssend_init,
    PMPI_Ssend_init,
    Op::Send,
    flags::SYNCHRONOUS,
    CP
);
persistent_init!(
    MPI_Bsend_init,
    PMPI_Bsend_init,
    Op::Send,
    flags::BUFFERED,
    CP
);
persistent_init!(MPI_Rsend_init, PMPI_Rsend_init, Op::Send, flags::READY, CP);
persistent_init!(MPI_Recv_init, PMPI_Recv_init, Op::Recv, 0, P);

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Start(req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Start(req));
    let h = if s.persistent.is_empty() || req.is_null() {
        0
    } else {
        // SAFETY: MPI requires a valid request pointer.
        unsafe { s.abi.read_handle(req) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Start(req) };
    if rc == 0 && h != 0 {
        shielded(s, || s.started(h));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Startall(n: c_int, reqs: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Startall(n, reqs));
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Startall(n, reqs) };
    if rc == 0 && !s.persistent.is_empty() && !reqs.is_null() {
        shielded(s, || {
            for i in 0..n.max(0) as usize {
                // SAFETY: MPI requires `n` request handles.
                let h = unsafe { s.abi.read_handle_at(reqs, i) };
                s.started(h);
            }
        });
    }
    rc
}
