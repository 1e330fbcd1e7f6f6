//! Communicator constructors, `MPI_Comm_free`/`MPI_Comm_disconnect` and names: the handle →
//! id map follows creation and release (MPI reuses handle values).

use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

use commscope_wire::hash::{self, domain};
use commscope_wire::record::CommEvent;
use commscope_wire::shm::Counter;

use super::{IP, P};
use crate::abi::{H, pmpi};
use crate::state::{Shim, shielded};
use crate::tables::{CommInfo, comm_flags};

pmpi! {
    fn PMPI_Cart_create(comm: H, ndims: c_int, dims: IP, periods: IP, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Cart_sub(comm: H, remain: IP, newcomm: P) -> c_int;
    fn PMPI_Comm_create(comm: H, group: H, newcomm: P) -> c_int;
    fn PMPI_Comm_create_group(comm: H, group: H, tag: c_int, newcomm: P) -> c_int;
    fn PMPI_Comm_disconnect(comm: P) -> c_int;
    fn PMPI_Comm_dup(comm: H, newcomm: P) -> c_int;
    fn PMPI_Comm_dup_with_info(comm: H, info: H, newcomm: P) -> c_int;
    fn PMPI_Comm_free(comm: P) -> c_int;
    fn PMPI_Comm_idup(comm: H, newcomm: P, req: P) -> c_int;
    fn PMPI_Comm_set_name(comm: H, name: *const c_char) -> c_int;
    fn PMPI_Comm_split(comm: H, color: c_int, key: c_int, newcomm: P) -> c_int;
    fn PMPI_Comm_split_type(comm: H, kind: c_int, key: c_int, info: H, newcomm: P) -> c_int;
    fn PMPI_Dist_graph_create(comm: H, n: c_int, sources: IP, degrees: IP, dests: IP, weights: IP, info: H, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Dist_graph_create_adjacent(comm: H, indeg: c_int, sources: IP, sweights: IP, outdeg: c_int, dests: IP, dweights: IP, info: H, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Graph_create(comm: H, nnodes: c_int, index: IP, edges: IP, reorder: c_int, newcomm: P) -> c_int;
    fn PMPI_Intercomm_create(local: H, local_leader: c_int, peer: H, remote_leader: c_int, tag: c_int, newcomm: P) -> c_int;
    fn PMPI_Intercomm_merge(inter: H, high: c_int, newcomm: P) -> c_int;
}

/// How a constructor relates the new communicator to its parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ctor {
    /// Collective over the whole parent (split, create, cart, graph, merge): every parent member
    /// advances the parent's creation counter, whether or not it joins.
    Collective,
    /// A duplicate: same members as the parent (used also before a nonblocking dup completes).
    Dup,
    /// Built from a group, collective over the group's members only (`Comm_create_group`).
    Group,
    /// An intercommunicator joining two groups (`Intercomm_create`).
    Inter,
}

impl Shim {
    pub(crate) fn comm_created(&self, parent: H, newcomm: P, kind: Ctor) {
        let parent_entry = self.comm(parent);
        let parent_id = parent_entry
            .map(|e| e.id.load(Ordering::Relaxed))
            .unwrap_or(0);
        let counter = match (kind, parent_entry) {
            (Ctor::Collective | Ctor::Dup, Some(e)) => {
                Some(e.children.fetch_add(1, Ordering::Relaxed))
            }
            _ => None,
        };
        if newcomm.is_null() {
            return;
        }
        // SAFETY: MPI wrote the new handle.
        let new = unsafe { self.abi.read_handle(newcomm) };
        if new == self.abi.comm_null {
            return;
        }
        let shape_of = if kind == Ctor::Dup { parent } else { new as H };
        let members = self.members(shape_of);
        let (inter, size, rank, remote) = self.comm_shape(shape_of);
        let id = match kind {
            Ctor::Collective | Ctor::Dup => {
                hash::derived_comm_id(domain::DERIVED, parent_id, counter.unwrap_or(0), &members)
            }
            Ctor::Group => hash::derived_comm_id(
                domain::GROUP,
                parent_id,
                self.set_counter(parent_id, &members),
                &members,
            ),
            Ctor::Inter => {
                hash::derived_comm_id(domain::GROUP, 0, self.set_counter(0, &members), &members)
            }
        };
        // Topologies (Cart, Graph, Dist_graph) and their duplicates and sub-grids.
        let (indegree, outdegree) = if inter {
            (0, 0)
        } else {
            self.degrees(shape_of)
        };
        let info = CommInfo {
            id,
            size,
            rank,
            remote_size: remote,
            flags: if inter { comm_flags::INTERCOMM } else { 0 },
            indegree,
            outdegree,
        };
        match self.comms.insert(new, info) {
            Some(e) => self.comm_record(CommEvent::Created, e, parent_id, None),
            None => self.shm.count(Counter::DroppedComms, 1),
        }
    }

    pub(crate) fn ctor(
        &self,
        parent: H,
        newcomm: P,
        kind: Ctor,
        real: impl FnOnce() -> c_int,
    ) -> c_int {
        let rc = real();
        if rc == 0 {
            shielded(self, || self.comm_created(parent, newcomm, kind));
        }
        rc
    }

    pub(crate) fn comm_gone(&self, h: u64) {
        if let Some(e) = self.comms.get(h) {
            self.comm_record(CommEvent::Freed, e, 0, None);
            self.comms.remove(h);
        }
    }
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_split(comm: H, color: c_int, key: c_int, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_split(comm, color, key, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Comm_split(comm, color, key, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_split_type(
    comm: H,
    kind: c_int,
    key: c_int,
    info: H,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_split_type(comm, kind, key, info, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Comm_split_type(comm, kind, key, info, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_dup(comm: H, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_dup(comm, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Dup, || unsafe {
        PMPI_Comm_dup(comm, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_dup_with_info(comm: H, info: H, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_dup_with_info(comm, info, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Dup, || unsafe {
        PMPI_Comm_dup_with_info(comm, info, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_idup(comm: H, newcomm: P, req: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_idup(comm, newcomm, req));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Dup, || unsafe {
        PMPI_Comm_idup(comm, newcomm, req)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_create(comm: H, group: H, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_create(comm, group, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Comm_create(comm, group, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_create_group(comm: H, group: H, tag: c_int, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_create_group(comm, group, tag, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Group, || unsafe {
        PMPI_Comm_create_group(comm, group, tag, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Cart_create(
    comm: H,
    ndims: c_int,
    dims: IP,
    periods: IP,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Cart_create(
        comm, ndims, dims, periods, reorder, newcomm
    ));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Cart_create(comm, ndims, dims, periods, reorder, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Cart_sub(comm: H, remain: IP, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Cart_sub(comm, remain, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Cart_sub(comm, remain, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Graph_create(
    comm: H,
    nnodes: c_int,
    index: IP,
    edges: IP,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Graph_create(
        comm, nnodes, index, edges, reorder, newcomm
    ));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Graph_create(comm, nnodes, index, edges, reorder, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Dist_graph_create(
    comm: H,
    n: c_int,
    sources: IP,
    degrees: IP,
    dests: IP,
    weights: IP,
    info: H,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Dist_graph_create(
        comm, n, sources, degrees, dests, weights, info, reorder, newcomm
    ));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Dist_graph_create(
            comm, n, sources, degrees, dests, weights, info, reorder, newcomm,
        )
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Dist_graph_create_adjacent(
    comm: H,
    indeg: c_int,
    sources: IP,
    sweights: IP,
    outdeg: c_int,
    dests: IP,
    dweights: IP,
    info: H,
    reorder: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Dist_graph_create_adjacent(
        comm, indeg, sources, sweights, outdeg, dests, dweights, info, reorder, newcomm
    ));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(comm, newcomm, Ctor::Collective, || unsafe {
        PMPI_Dist_graph_create_adjacent(
            comm, indeg, sources, sweights, outdeg, dests, dweights, info, reorder, newcomm,
        )
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Intercomm_create(
    local: H,
    local_leader: c_int,
    peer: H,
    remote_leader: c_int,
    tag: c_int,
    newcomm: P,
) -> c_int {
    let (s, _g) = real_or!(PMPI_Intercomm_create(
        local,
        local_leader,
        peer,
        remote_leader,
        tag,
        newcomm
    ));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(local, newcomm, Ctor::Inter, || unsafe {
        PMPI_Intercomm_create(local, local_leader, peer, remote_leader, tag, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Intercomm_merge(inter: H, high: c_int, newcomm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Intercomm_merge(inter, high, newcomm));
    // SAFETY: pass-through of the application's own arguments to the real function.
    s.ctor(inter, newcomm, Ctor::Collective, || unsafe {
        PMPI_Intercomm_merge(inter, high, newcomm)
    })
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_free(comm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_free(comm));
    let h = if comm.is_null() {
        0
    } else {
        // SAFETY: MPI requires a valid pointer to a communicator handle.
        unsafe { s.abi.read_handle(comm) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Comm_free(comm) };
    if rc == 0 && h != 0 {
        shielded(s, || s.comm_gone(h));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_disconnect(comm: P) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_disconnect(comm));
    let h = if comm.is_null() {
        0
    } else {
        // SAFETY: MPI requires a valid pointer to a communicator handle.
        unsafe { s.abi.read_handle(comm) }
    };
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Comm_disconnect(comm) };
    if rc == 0 && h != 0 {
        shielded(s, || s.comm_gone(h));
    }
    rc
}

#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn MPI_Comm_set_name(comm: H, name: *const c_char) -> c_int {
    let (s, _g) = real_or!(PMPI_Comm_set_name(comm, name));
    // SAFETY: pass-through.
    let rc = unsafe { PMPI_Comm_set_name(comm, name) };
    if rc == 0 && !name.is_null() {
        shielded(s, || {
            if let Some(e) = s.comm(comm) {
                // SAFETY: MPI requires a NUL-terminated name.
                let n = unsafe { std::ffi::CStr::from_ptr(name) };
                s.comm_record(CommEvent::Named, e, 0, Some(n.to_bytes()));
            }
        });
    }
    rc
}
