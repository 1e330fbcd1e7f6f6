//! Point-to-point: sends (standard, synchronous, buffered, ready), receives, nonblocking
//! sends and receives, send-receive, matched probes and their receives; wildcard receives
//! resolved from their status.

use std::ffi::c_int;

use commscope_wire::op::{Op, flags};
use commscope_wire::record::Call;
use commscope_wire::shm::{Counter, in_flight_status};

use super::{CP, P, cnt};
use crate::abi::{H, STATUS_MAX, pmpi};
use crate::state::{Begun, Shim, Slot, shielded};
use crate::tables::{Dir, Probed};

pmpi! {
    fn PMPI_Ibsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Irsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Isendrecv(sbuf: CP, scount: c_int, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: c_int, rt: H, src: c_int, rtag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Isendrecv_replace(buf: P, count: c_int, dt: H, dest: c_int, stag: c_int, src: c_int, rtag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Bsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Irecv(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Isend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Issend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P) -> c_int;
    fn PMPI_Recv(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Rsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Send(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
    fn PMPI_Sendrecv(sbuf: CP, scount: c_int, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: c_int, rt: H, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Sendrecv_replace(buf: P, count: c_int, dt: H, dest: c_int, stag: c_int, src: c_int, rtag: c_int, comm: H, status: P) -> c_int;
    fn PMPI_Ssend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H) -> c_int;
}

impl Shim {
    /// The status to give the real call: the application's, or `own` when it passes its
    /// "ignore" sentinel (the record needs the source, tag and count).
    fn status_or_own(&self, status: P, own: &mut [u8; STATUS_MAX]) -> P {
        if self.abi.is_status_ignore(status) {
            own.as_mut_ptr().cast()
        } else {
            status
        }
    }

    /// The entry record of a point-to-point call of `count` elements of `dt` to or from `peer`.
    pub(crate) fn typed_call(
        &self,
        op: Op,
        fl: u16,
        (count, dt): (i64, H),
        (peer, tag): (c_int, c_int),
        comm: H,
    ) -> Call {
        let c = cnt(count);
        let (size, code) = self.type_info(dt);
        self.p2p_call(comm, op, peer, tag, c * size, c, code, fl)
    }

    /// Records a blocking send.
    pub(crate) fn send(
        &self,
        fl: u16,
        buf_count: i64,
        dt: H,
        dest: c_int,
        tag: c_int,
        comm: H,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            self.begin_p2p(self.typed_call(Op::Send, fl, (buf_count, dt), (dest, tag), comm))
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.finish(b.call, b.slot, rc));
        }
        rc
    }

    /// Records a nonblocking send or receive.
    pub(crate) fn ip2p(
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
        let b = shielded(self, || {
            let fl = fl | flags::NONBLOCKING;
            self.begin_p2p(self.typed_call(op, fl, (count, dt), (peer, tag), comm))
        });
        let rc = real();
        if let Some(b) = b {
            let recv = op == Op::Recv;
            let later = recv && b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0;
            let recv_type = if recv { dt } else { 0 };
            shielded(self, || self.posted(b, rc, req, later, recv_type));
        }
        rc
    }

    /// Records a blocking receive around `real`, which gets the status to fill.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn recv(
        &self,
        count: i64,
        dt: H,
        src: c_int,
        tag: c_int,
        comm: H,
        status: P,
        real: impl FnOnce(P) -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            self.begin_p2p(self.typed_call(Op::Recv, 0, (count, dt), (src, tag), comm))
        });
        let mut own = [0u8; STATUS_MAX];
        let st = self.status_or_own(status, &mut own);
        let rc = real(st);
        if let Some(mut b) = b {
            shielded(self, || {
                let later = b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0;
                if rc == 0 {
                    // SAFETY: MPI filled `st`.
                    unsafe { self.complete_recv(&mut b.call, st as *const u8, later, dt) };
                }
                self.finish(b.call, b.slot, rc)
            });
        }
        rc
    }
}

wrap!(MPI_Send => PMPI_Send(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(0, count.into(), dt, dest, tag, comm, real));
wrap!(MPI_Ssend => PMPI_Ssend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(flags::SYNCHRONOUS, count.into(), dt, dest, tag, comm, real));
wrap!(MPI_Bsend => PMPI_Bsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(flags::BUFFERED, count.into(), dt, dest, tag, comm, real));
wrap!(MPI_Rsend => PMPI_Rsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H),
    |s, real| s.send(flags::READY, count.into(), dt, dest, tag, comm, real));
wrap!(MPI_Recv => PMPI_Recv(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, status: P),
    |s, real(status)| s.recv(count.into(), dt, src, tag, comm, status, real));
wrap!(MPI_Isend => PMPI_Isend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, 0, count.into(), dt, dest, tag, comm, req, real));
wrap!(MPI_Issend => PMPI_Issend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, flags::SYNCHRONOUS, count.into(), dt, dest, tag, comm, req, real));
wrap!(MPI_Ibsend => PMPI_Ibsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, flags::BUFFERED, count.into(), dt, dest, tag, comm, req, real));
wrap!(MPI_Irsend => PMPI_Irsend(buf: CP, count: c_int, dt: H, dest: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Send, flags::READY, count.into(), dt, dest, tag, comm, req, real));
wrap!(MPI_Irecv => PMPI_Irecv(buf: P, count: c_int, dt: H, src: c_int, tag: c_int, comm: H, req: P),
    |s, real| s.ip2p(Op::Recv, 0, count.into(), dt, src, tag, comm, req, real));

impl Shim {
    /// Records a send-receive around `real`, which gets the status to fill.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sendrecv(
        &self,
        scount: i64,
        st: H,
        dest: c_int,
        stag: c_int,
        src: c_int,
        rtag: c_int,
        comm: H,
        status: P,
        real: impl FnOnce(P) -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            self.begin_sendrecv((scount, st), (dest, stag), (src, rtag), comm, 0)
        });
        let mut own = [0u8; STATUS_MAX];
        let stp = self.status_or_own(status, &mut own);
        let rc = real(stp);
        if let Some(mut b) = b {
            shielded(self, || {
                if rc == 0 {
                    // SAFETY: MPI filled the status.
                    unsafe { self.complete_sendrecv(&mut b.call, stp as *const u8) };
                }
                self.finish(b.call, b.slot, rc)
            });
        }
        rc
    }

    /// Records a nonblocking send-receive (`MPI_Isendrecv`, `MPI_Isendrecv_replace`), completed
    /// like any request. Its receive half is resolved when posted: MPICH 4.0 completes these
    /// requests with an empty status, so a wildcard source or tag is left unresolved (flagged
    /// `P2P_SEQ_UNKNOWN`, counted as a dropped p2p sequence) rather than taken from it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn isendrecv(
        &self,
        scount: i64,
        st: H,
        dest: c_int,
        stag: c_int,
        src: c_int,
        rtag: c_int,
        comm: H,
        req: P,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let fl = flags::NONBLOCKING;
            let mut b = self.begin_sendrecv((scount, st), (dest, stag), (src, rtag), comm, fl);
            if b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0 {
                b.call.flags |= flags::P2P_SEQ_UNKNOWN;
                self.shm.count(Counter::DroppedP2pSeq, 1);
            }
            b
        });
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.posted(b, rc, req, false, 0));
        }
        rc
    }

    /// Starts recording a send-receive. The send half's sequence is assigned now, and so is the
    /// receive half's when its source and tag are named (messages match in posting order); a
    /// wildcard's waits for the status ([`Shim::complete_sendrecv`]).
    fn begin_sendrecv(
        &self,
        (scount, st): (i64, H),
        (dest, stag): (c_int, c_int),
        (src, rtag): (c_int, c_int),
        comm: H,
        fl: u16,
    ) -> Begun {
        let call = self.typed_call(Op::Sendrecv, fl, (scount, st), (dest, stag), comm);
        let mut b = self.begin_p2p(call);
        b.call.peer2 = self.abi.rank_value(src);
        b.call.tag2 = rtag;
        if src == self.abi.any_source {
            b.call.flags |= flags::ANY_SOURCE;
        }
        if rtag == self.abi.any_tag {
            b.call.flags |= flags::ANY_TAG;
        }
        if b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) == 0 {
            self.assign_p2p_seq2(&mut b.call);
        }
        b
    }

    /// Resolves a blocking send-receive's wildcard receive half from its status: source, tag and
    /// sequence.
    ///
    /// # Safety
    /// `st` must point to a status of the loaded flavour.
    unsafe fn complete_sendrecv(&self, call: &mut Call, st: *const u8) {
        if call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) == 0 {
            return;
        }
        // SAFETY: per the contract.
        let (from, tag, _) = unsafe { self.abi.status_fields(st) };
        if call.flags & flags::ANY_SOURCE != 0 {
            call.peer2 = self.abi.rank_value(from);
        }
        if call.flags & flags::ANY_TAG != 0 {
            call.tag2 = tag;
        }
        self.assign_p2p_seq2(call);
    }
}

wrap!(MPI_Sendrecv => PMPI_Sendrecv(sbuf: CP, scount: c_int, st: H, dest: c_int, stag: c_int,
        rbuf: P, rcount: c_int, rt: H, src: c_int, rtag: c_int, comm: H, status: P),
    |s, real(status)| s.sendrecv(scount.into(), st, dest, stag, src, rtag, comm, status, real));
wrap!(MPI_Sendrecv_replace => PMPI_Sendrecv_replace(buf: P, count: c_int, dt: H, dest: c_int,
        stag: c_int, src: c_int, rtag: c_int, comm: H, status: P),
    |s, real(status)| s.sendrecv(count.into(), dt, dest, stag, src, rtag, comm, status, real));
optional!(MPI_Isendrecv => PMPI_Isendrecv: wrap!(@local wrapper => PMPI_Isendrecv(sbuf: CP,
        scount: c_int, st: H, dest: c_int, stag: c_int, rbuf: P, rcount: c_int, rt: H, src: c_int,
        rtag: c_int, comm: H, req: P),
    |s, real| s.isendrecv(scount.into(), st, dest, stag, src, rtag, comm, req, real)););
optional!(MPI_Isendrecv_replace => PMPI_Isendrecv_replace: wrap!(@local wrapper =>
        PMPI_Isendrecv_replace(buf: P, count: c_int, dt: H, dest: c_int, stag: c_int, src: c_int,
        rtag: c_int, comm: H, req: P),
    |s, real| s.isendrecv(count.into(), dt, dest, stag, src, rtag, comm, req, real)););

// ----- matched probes ----------------------------------------------------------------------------
//
// `MPI_Mprobe`/`MPI_Improbe` match a message and hand back a message handle; `MPI_Mrecv` and
// `MPI_Imrecv` receive it by that handle alone (mpi4py's `comm.recv()` works this way). The
// probe is shown in flight while it blocks and notes the message's communicator, source and
// tag; the receive is recorded as a `recv` that waited from the probe's entry.

pmpi! {
    fn PMPI_Mprobe(src: c_int, tag: c_int, comm: H, message: P, status: P) -> c_int;
    fn PMPI_Improbe(src: c_int, tag: c_int, comm: H, flag: *mut c_int, message: P, status: P) -> c_int;
    fn PMPI_Mrecv(buf: P, count: c_int, dt: H, message: P, status: P) -> c_int;
    fn PMPI_Imrecv(buf: P, count: c_int, dt: H, message: P, req: P) -> c_int;
    fn PMPI_Mrecv_c(buf: P, count: i64, dt: H, message: P, status: P) -> c_int;
    fn PMPI_Imrecv_c(buf: P, count: i64, dt: H, message: P, req: P) -> c_int;
}

impl Shim {
    /// A probe matched a message (`st` its status): note it under its handle.
    fn matched(&self, call: &Call, comm: H, message: P, st: *const u8) {
        if message.is_null() {
            return;
        }
        // SAFETY: MPI wrote the message handle and the status.
        let (h, (source, tag, _)) =
            unsafe { (self.abi.read_handle(message), self.abi.status_fields(st)) };
        let p = Probed {
            comm,
            source,
            tag,
            flags: call.flags & (flags::ANY_SOURCE | flags::ANY_TAG),
            t_enter: call.t_enter,
        };
        if !self.probed.insert(h, p) {
            self.shm.count(Counter::DroppedRequests, 1);
        }
    }

    /// Records `MPI_Mprobe` (in flight while it blocks) or `MPI_Improbe` (`flag`): notes the
    /// message a successful probe matched.
    fn probe(
        &self,
        (src, tag, comm): (c_int, c_int, H),
        message: P,
        status: P,
        flag: *const c_int,
        real: impl FnOnce(P) -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            let call = self.p2p_call(comm, Op::Recv, src, tag, 0, 0, 0, 0);
            // Only the blocking probe waits; a nonblocking one, often polled in a loop, is never
            // in flight.
            let slot = if flag.is_null() {
                self.claim(&call, in_flight_status::IN_CALL)
            } else {
                Slot::None
            };
            (call, slot)
        });
        let mut own = [0u8; STATUS_MAX];
        let st = self.status_or_own(status, &mut own);
        let rc = real(st);
        if let Some((call, slot)) = b {
            shielded(self, || {
                self.unclaim(slot);
                // SAFETY: MPI wrote `flag` when it is given.
                if rc == 0 && (flag.is_null() || unsafe { *flag } != 0) {
                    self.matched(&call, comm, message, st as *const u8);
                }
            });
        }
        rc
    }

    /// The record of a receive of a matched message (`None`: not matched by a probe seen here).
    fn matched_recv(&self, message: P, count: i64, dt: H, fl: u16) -> Option<Call> {
        if message.is_null() {
            return None;
        }
        // SAFETY: MPI requires a valid message handle pointer.
        let h = unsafe { self.abi.read_handle(message) };
        let p = self.probed.take(h)?;
        let fl = fl | p.flags;
        let mut call = self.typed_call(Op::Recv, fl, (count, dt), (p.source, p.tag), p.comm);
        call.t_enter = p.t_enter;
        self.assign_p2p_seq(&mut call, Dir::Recv);
        Some(call)
    }

    /// Records `MPI_Mrecv`.
    fn mrecv(
        &self,
        message: P,
        count: i64,
        dt: H,
        status: P,
        real: impl FnOnce(P) -> c_int,
    ) -> c_int {
        let b = shielded(self, || {
            self.matched_recv(message, count, dt, 0).map(|call| {
                let slot = self.claim(&call, in_flight_status::IN_CALL);
                Begun { call, slot }
            })
        })
        .flatten();
        let mut own = [0u8; STATUS_MAX];
        let st = self.status_or_own(status, &mut own);
        let rc = real(st);
        if let Some(mut b) = b {
            shielded(self, || {
                if rc == 0 {
                    // SAFETY: MPI filled `st`.
                    unsafe { self.complete_recv(&mut b.call, st as *const u8, false, dt) };
                }
                self.finish(b.call, b.slot, rc)
            });
        }
        rc
    }

    /// Records `MPI_Imrecv`.
    fn imrecv(&self, message: P, count: i64, dt: H, req: P, real: impl FnOnce() -> c_int) -> c_int {
        let b = shielded(self, || {
            self.matched_recv(message, count, dt, flags::NONBLOCKING)
                .map(|call| {
                    let slot = self.claim(&call, in_flight_status::IN_CALL);
                    Begun { call, slot }
                })
        })
        .flatten();
        let rc = real();
        if let Some(b) = b {
            shielded(self, || self.posted(b, rc, req, false, dt));
        }
        rc
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Mprobe(
    src: c_int,
    tag: c_int,
    comm: H,
    message: P,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Mprobe(src, tag, comm, message, status));
    // SAFETY: pass-through, with our own status buffer when the application ignores it.
    s.probe(
        (src, tag, comm),
        message,
        status,
        std::ptr::null(),
        |st| unsafe { PMPI_Mprobe(src, tag, comm, message, st) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Improbe(
    src: c_int,
    tag: c_int,
    comm: H,
    flag: *mut c_int,
    message: P,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Improbe(src, tag, comm, flag, message, status));
    // SAFETY: pass-through, with our own status buffer when the application ignores it.
    s.probe((src, tag, comm), message, status, flag, |st| unsafe {
        PMPI_Improbe(src, tag, comm, flag, message, st)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Mrecv(buf: P, count: c_int, dt: H, message: P, status: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Mrecv(buf, count, dt, message, status));
    // SAFETY: pass-through, with our own status buffer when the application ignores it.
    s.mrecv(message, count.into(), dt, status, |st| unsafe {
        PMPI_Mrecv(buf, count, dt, message, st)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Imrecv(buf: P, count: c_int, dt: H, message: P, req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Imrecv(buf, count, dt, message, req));
    // SAFETY: pass-through of the application's arguments.
    s.imrecv(message, count.into(), dt, req, || unsafe {
        PMPI_Imrecv(buf, count, dt, message, req)
    })
}

optional!(MPI_Mrecv_c => PMPI_Mrecv_c:
    pub unsafe extern "C" fn wrapper(buf: P, count: i64, dt: H, message: P, status: P) -> c_int {
        let (s, _g) = real_or!(PMPI_Mrecv_c(buf, count, dt, message, status));
        // SAFETY: pass-through, with our own status buffer when the application ignores it.
        s.mrecv(message, count, dt, status, |st| unsafe {
            PMPI_Mrecv_c(buf, count, dt, message, st)
        })
    }
);

optional!(MPI_Imrecv_c => PMPI_Imrecv_c:
    pub unsafe extern "C" fn wrapper(buf: P, count: i64, dt: H, message: P, req: P) -> c_int {
        let (s, _g) = real_or!(PMPI_Imrecv_c(buf, count, dt, message, req));
        // SAFETY: pass-through of the application's arguments.
        s.imrecv(message, count, dt, req, || unsafe {
            PMPI_Imrecv_c(buf, count, dt, message, req)
        })
    }
);

// MPI-4 nonblocking send-receives (MPICH 4; not Open MPI 4.1).
