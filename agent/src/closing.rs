//! The records an observer writes for a traced process that ended: its final counters, the
//! calls it was inside, and how it ended. The agent sends them after the process's last
//! records; the trace keeper ([`crate::keeper`]) appends them to its trace file. Either way
//! they follow the ring's last record (`rec_seq` from `head + 1`), so they never collide with
//! the process's own.

use commscope_wire::op::{flags, lib};
use commscope_wire::record::{EXIT_STATUS_UNKNOWN, Heartbeat, Process, ProcessEvent, Record};
use commscope_wire::shm::{Counter, Shm, in_flight_status};

use crate::exits::Ending;

/// The process as its records name it.
#[derive(Clone, Copy, Debug)]
pub struct Who {
    pub pid: u32,
    pub start_time: u64,
    pub rank: i32,
    pub world_size: i32,
}

/// How and when the process ended, as the observer saw it.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// Exit status or signal, when the kernel said.
    pub ending: Option<Ending>,
    /// When it ended: realtime and monotonic ns.
    pub t_real: u64,
    pub t_mono: u64,
}

/// The heartbeat with the final counters (flag `AGENT_BEAT`), an `enter` record for each call
/// then in flight, and the observed exit record, numbered from the ring's head on.
pub fn closing_records(shm: &Shm, who: Who, seen: Seen, now: (u64, u64)) -> Vec<Record> {
    let head = shm.head();
    let mut out = Vec::new();
    // The final counters first (drops after the process's last heartbeat), then the exit.
    out.push(Record::Heartbeat(Heartbeat {
        rec_seq: head + 1,
        flags: flags::AGENT_BEAT,
        t_mono: now.1,
        t_real: now.0,
        in_flight: shm.in_flight_count() as u32,
        rank: who.rank,
        dropped_ring_full: shm.counter(Counter::DroppedRingFull),
        dropped_in_flight: shm.counter(Counter::DroppedInFlight),
        dropped_other: shm.counter(Counter::DroppedRequests)
            + shm.counter(Counter::DroppedP2pSeq)
            + shm.counter(Counter::DroppedComms)
            + shm.counter(Counter::DroppedInternal),
        produced: head,
    }));
    // What it was inside when it ended (the shim reports a call only after 100 ms in flight,
    // and its last reports may not have been written): record order for the detectors — the
    // rank the others were blocked waiting for died first.
    let mut rec_seq = head + 2;
    for (_, e) in shm.in_flight() {
        // Which library: GPU work is NCCL's (or RCCL's); the slot does not say more.
        let library = if matches!(
            e.status,
            in_flight_status::ON_GPU | in_flight_status::ISSUED
        ) {
            lib::NCCL
        } else {
            lib::MPI
        };
        let mut c = e.enter_record(who.rank, library);
        c.rec_seq = rec_seq;
        out.push(Record::Enter(c));
        rec_seq += 1;
    }
    let (status, signal, sender) = match seen.ending {
        Some(Ending::Exited(c)) => (c, 0, None),
        Some(Ending::Signaled(sig, by)) => (EXIT_STATUS_UNKNOWN, sig, by),
        None => (EXIT_STATUS_UNKNOWN, 0, None),
    };
    let sent = match sender {
        Some(s) if s.launcher => flags::SENDER_KNOWN | flags::SENT_BY_LAUNCHER,
        Some(_) => flags::SENDER_KNOWN,
        None => 0,
    };
    out.push(Record::Process(Process {
        rec_seq,
        event: ProcessEvent::Exit,
        flags: flags::OBSERVED | sent,
        t_mono: seen.t_mono,
        t_real: seen.t_real,
        pid: who.pid,
        exit_status: status,
        start_time: who.start_time,
        rank: who.rank,
        world_size: who.world_size,
        signal,
        step: sender.map_or(0, |s| u64::from(s.pid)),
    }));
    out
}
