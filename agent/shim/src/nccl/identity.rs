//! Communicator ids (NCCL's own `commHash`) and activation of a process without MPI.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CStr, c_char, c_int};

use commscope_wire::nccl_hash::Version;
use commscope_wire::op::flags;
use commscope_wire::record::{Call, Comm as CommRec, CommEvent, RECORD_SIZE, encode_call, kind};

use crate::cuda::{self};
use crate::state::{self, Shim, Slot};
use crate::tables::{CommEntry, CommInfo, comm_flags};
use crate::util::now_mono;

use super::real::last_error;
use super::*;

pub(super) fn hash_version() -> Version {
    Version(version())
}

/// Activates recording for an NCCL-only process (no MPI): rank and size from the launcher's
/// environment, else from the first communicator; the job id from the environment, else from
/// that communicator's `commHash` (which every rank shares).
pub(super) fn ensure_active(rank: i32, size: i32, first_comm: u64) {
    if state::life() == state::life::DORMANT {
        state::activate_nccl(rank, size, first_comm);
    }
}

/// Reads `ncclConfig_t.commName` (NCCL 2.27 and later) when the struct is initialized and new
/// enough to have it.
///
/// # Safety
/// `config` is null or the application's `ncclConfig_t`.
pub(super) unsafe fn config_name(config: CP) -> Option<Vec<u8>> {
    if config.is_null() {
        return None;
    }
    let b = config as *const u8;
    // SAFETY: every ncclConfig_t starts with size (size_t), magic and version (unsigned).
    let (size, magic, ver) = unsafe {
        (
            std::ptr::read_unaligned(b as *const usize),
            std::ptr::read_unaligned(b.add(8) as *const u32),
            std::ptr::read_unaligned(b.add(12) as *const u32),
        )
    };
    if magic != CONFIG_MAGIC || ver < 22700 || size < 56 {
        return None;
    }
    // SAFETY: `commName` is the `const char*` at offset 48 from 2.27 on (size checked above).
    let p = unsafe { std::ptr::read_unaligned(b.add(48) as *const *const c_char) };
    if p.is_null() || p as usize == usize::MAX {
        return None;
    }
    // SAFETY: the application's NUL-terminated name.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
}

impl Shim {
    /// Enters a new NCCL communicator and writes its `comm` record.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn nccl_created(
        &self,
        handle: NComm,
        id: u64,
        parent: u64,
        rank: i32,
        size: i32,
        local_id: bool,
        name: Option<&[u8]>,
        device: i32,
    ) {
        let flags = if local_id { comm_flags::LOCAL_ID } else { 0 };
        let info = CommInfo {
            id,
            size,
            rank,
            remote_size: 0,
            flags,
            ..Default::default()
        };
        let Some(e) = self.nccl.comms.insert(handle as u64, info) else {
            self.shm
                .count(commscope_wire::shm::Counter::DroppedComms, 1);
            return;
        };
        self.nccl_comm_record(CommEvent::Created, e, parent, name, device, 0);
        {
            let mut w = self.nccl.wrapped.lock().unwrap_or_else(|p| p.into_inner());
            if w.len() < 1 << 16 {
                w.insert(id);
            }
        }
        {
            let mut live = self.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
            live.retain(|l| l.handle != handle);
            live.push(Live {
                handle,
                id,
                rank,
                size,
                reported: false,
            });
        }
        crate::nccl::start_poller(self);
    }

    pub(super) fn nccl_comm_record(
        &self,
        event: CommEvent,
        e: &CommEntry,
        parent: u64,
        name: Option<&[u8]>,
        device: i32,
        status: i32,
    ) {
        let mut c = self.comm_of(event, e, parent);
        c.flags |= flags::NCCL_COMM;
        c.device = device;
        c.status = status;
        if let Some(n) = name {
            c.set_name(n);
        }
        self.push_comm(c);
    }

    /// A communicator that could not be created: a `comm` record with event `failed`, whose
    /// name field carries NCCL's own message (`ncclGetLastError`).
    pub(super) fn nccl_init_failed(&self, id: u64, parent: u64, rank: i32, size: i32, status: i32) {
        let mut c = CommRec::new(
            CommEvent::Failed,
            id,
            parent,
            now_mono(),
            self.rank,
            rank,
            size,
            0,
        );
        c.flags = flags::NCCL_COMM;
        c.status = status;
        c.device = current_device();
        c.set_name(&last_error(0));
        self.push_comm(c);
    }

    /// An asynchronous error on a live communicator, reported once.
    pub(super) fn nccl_async_error(&self, handle: NComm, err: i32) {
        let mut live = self.nccl.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = live.iter_mut().find(|l| l.handle == handle && !l.reported) {
            l.reported = true;
            let mut c = CommRec::new(
                CommEvent::Failed,
                l.id,
                0,
                now_mono(),
                self.rank,
                l.rank,
                l.size,
                0,
            );
            c.flags = flags::NCCL_COMM | flags::COMM_ASYNC_ERROR;
            c.status = err;
            drop(live);
            c.set_name(&last_error(handle));
            self.push_comm(c);
        }
    }

    /// The entry of a communicator handle; one created before recording started gets a
    /// process-local id, flagged as such.
    #[inline]
    pub(super) fn nccl_comm(&self, h: NComm) -> Option<&CommEntry> {
        if let Some(e) = self.nccl.comms.get(h as u64) {
            return Some(e);
        }
        self.adopt_nccl_comm(h)
    }

    #[cold]
    pub(super) fn adopt_nccl_comm(&self, h: NComm) -> Option<&CommEntry> {
        if h == 0 {
            return None;
        }
        let (mut rank, mut size, mut dev) = (-1, 0, -1);
        // SAFETY: valid out-pointers; `h` is a communicator the application passed.
        unsafe {
            real::comm_user_rank(h, &mut rank);
            real::comm_count(h, &mut size);
            real::comm_cu_device(h, &mut dev);
        }
        let id = local_id(self, h);
        self.nccl_created(h, id, 0, rank, size, true, None, dev);
        self.nccl.comms.get(h as u64)
    }

    /// Claims an in-flight slot of its own for a call (never the thread's home slot: NCCL work
    /// outlives the call).
    #[inline]
    pub(super) fn claim_owned(&self, call: &Call, status: u8) -> Slot {
        self.claim_in(call, status, true)
    }

    /// Writes a call record as it stands.
    #[inline]
    pub(super) fn push_call(&self, call: &Call) {
        let mut raw = [0u8; RECORD_SIZE];
        encode_call(&mut raw, kind::CALL, call);
        self.shm.push(&raw);
    }
}

pub(super) fn local_id(shim: &Shim, h: NComm) -> u64 {
    shim.local_comm_id(h as u64)
}

pub(super) fn current_device() -> i32 {
    cuda::get().map_or(-1, |c| c.current_device())
}

pub(super) fn comm_device(h: NComm) -> i32 {
    let mut d: c_int = -1;
    // SAFETY: a valid out-pointer; `h` is an initialized communicator.
    if unsafe { real::comm_cu_device(h, &mut d) } != result::SUCCESS {
        return current_device();
    }
    d
}
