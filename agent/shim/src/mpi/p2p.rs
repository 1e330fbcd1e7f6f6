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
            let count = cnt(buf_count);
            let (size, code) = self.type_info(dt);
            self.begin_p2p(
                comm,
                Op::Send,
                dest,
                tag,
                count * size,
                count,
                code,
                fl,
                Dir::Send,
            )
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
        let dir = if op == Op::Recv { Dir::Recv } else { Dir::Send };
        let b = shielded(self, || {
            let count = cnt(count);
            let (size, code) = self.type_info(dt);
            self.begin_p2p(
                comm,
                op,
                peer,
                tag,
                count * size,
                count,
                code,
                fl | flags::NONBLOCKING,
                dir,
            )
        });
        let rc = real();
        if let Some(b) = b {
            let later =
                dir == Dir::Recv && b.call.flags & (flags::ANY_SOURCE | flags::ANY_TAG) != 0;
            let recv_type = if dir == Dir::Recv { dt } else { 0 };
            shielded(self, || self.posted(b, rc, req, later, recv_type));
        }
        rc
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Send(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Send(buf, count, dt, dest, tag, comm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.send(0, count.into(), dt, dest, tag, comm, || unsafe {
        PMPI_Send(buf, count, dt, dest, tag, comm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Ssend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Ssend(buf, count, dt, dest, tag, comm));
    s.send(
        flags::SYNCHRONOUS,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        // SAFETY: pass-through of the application's own arguments to the real function.
        || unsafe { PMPI_Ssend(buf, count, dt, dest, tag, comm) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Bsend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Bsend(buf, count, dt, dest, tag, comm));
    s.send(
        flags::BUFFERED,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        // SAFETY: pass-through of the application's own arguments to the real function.
        || unsafe { PMPI_Bsend(buf, count, dt, dest, tag, comm) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Rsend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Rsend(buf, count, dt, dest, tag, comm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.send(flags::READY, count.into(), dt, dest, tag, comm, || unsafe {
        PMPI_Rsend(buf, count, dt, dest, tag, comm)
    })
}

impl Shim {
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
            let c = cnt(count);
            let (size, code) = self.type_info(dt);
            self.begin_p2p(comm, Op::Recv, src, tag, c * size, c, code, 0, Dir::Recv)
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

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Recv(
    buf: P,
    count: c_int,
    dt: H,
    src: c_int,
    tag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Recv(buf, count, dt, src, tag, comm, status));
    // SAFETY: pass-through, with our own status buffer when the application ignores it.
    s.recv(count.into(), dt, src, tag, comm, status, |st| unsafe {
        PMPI_Recv(buf, count, dt, src, tag, comm, st)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Isend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
    req: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Isend(buf, count, dt, dest, tag, comm, req));
    s.ip2p(
        Op::Send,
        0,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        req,
        // SAFETY: pass-through of the application's own arguments to the real function.
        || unsafe { PMPI_Isend(buf, count, dt, dest, tag, comm, req) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Issend(
    buf: CP,
    count: c_int,
    dt: H,
    dest: c_int,
    tag: c_int,
    comm: H,
    req: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Issend(buf, count, dt, dest, tag, comm, req));
    s.ip2p(
        Op::Send,
        flags::SYNCHRONOUS,
        count.into(),
        dt,
        dest,
        tag,
        comm,
        req,
        // SAFETY: pass-through of the application's own arguments to the real function.
        || unsafe { PMPI_Issend(buf, count, dt, dest, tag, comm, req) },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Irecv(
    buf: P,
    count: c_int,
    dt: H,
    src: c_int,
    tag: c_int,
    comm: H,
    req: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Irecv(buf, count, dt, src, tag, comm, req));
    s.ip2p(
        Op::Recv,
        0,
        count.into(),
        dt,
        src,
        tag,
        comm,
        req,
        // SAFETY: pass-through of the application's own arguments to the real function.
        || unsafe { PMPI_Irecv(buf, count, dt, src, tag, comm, req) },
    )
}

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
            let c = cnt(scount);
            let (size, code) = self.type_info(st);
            let mut b = self.begin_p2p(
                comm,
                Op::Sendrecv,
                dest,
                stag,
                c * size,
                c,
                code,
                0,
                Dir::Send,
            );
            b.call.peer2 = self.abi.rank_value(src);
            b.call.tag2 = rtag;
            b
        });
        let mut own = [0u8; STATUS_MAX];
        let stp = self.status_or_own(status, &mut own);
        let rc = real(stp);
        if let Some(mut b) = b {
            shielded(self, || {
                if rc == 0 {
                    // SAFETY: MPI filled the status.
                    let (from, tag, _) = unsafe { self.abi.status_fields(stp as *const u8) };
                    b.call.peer2 = self.abi.rank_value(from);
                    b.call.tag2 = tag;
                    if src == self.abi.any_source {
                        b.call.flags |= flags::ANY_SOURCE;
                    }
                    if rtag == self.abi.any_tag {
                        b.call.flags |= flags::ANY_TAG;
                    }
                    if b.call.peer2 >= 0 {
                        match self
                            .p2p
                            .next(b.call.comm_id, b.call.peer2, b.call.tag2, Dir::Recv)
                        {
                            Some(q) => b.call.op_seq2 = q,
                            None => {
                                b.call.flags |= flags::P2P_SEQ_UNKNOWN;
                                self.shm.count(Counter::DroppedP2pSeq, 1);
                            }
                        }
                    }
                }
                self.finish(b.call, b.slot, rc)
            });
        }
        rc
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Sendrecv(
    sbuf: CP,
    scount: c_int,
    st: H,
    dest: c_int,
    stag: c_int,
    rbuf: P,
    rcount: c_int,
    rt: H,
    src: c_int,
    rtag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Sendrecv(
        sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, status
    ));
    // SAFETY: pass-through, with a real status buffer.
    s.sendrecv(
        scount.into(),
        st,
        dest,
        stag,
        src,
        rtag,
        comm,
        status,
        |stp| unsafe {
            PMPI_Sendrecv(
                sbuf, scount, st, dest, stag, rbuf, rcount, rt, src, rtag, comm, stp,
            )
        },
    )
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Sendrecv_replace(
    buf: P,
    count: c_int,
    dt: H,
    dest: c_int,
    stag: c_int,
    src: c_int,
    rtag: c_int,
    comm: H,
    status: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Sendrecv_replace(
        buf, count, dt, dest, stag, src, rtag, comm, status
    ));
    // SAFETY: pass-through, with a real status buffer.
    s.sendrecv(
        count.into(),
        dt,
        dest,
        stag,
        src,
        rtag,
        comm,
        status,
        |stp| unsafe { PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, stp) },
    )
}

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
            let call = self.p2p_call(comm, Op::Recv, src, tag, 0, 0, 0, 0, Dir::Recv);
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
        let c = cnt(count);
        let (size, code) = self.type_info(dt);
        let mut call = self.p2p_call(
            p.comm,
            Op::Recv,
            p.source,
            p.tag,
            c * size,
            c,
            code,
            fl | p.flags,
            Dir::Recv,
        );
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
