//! `comm-error`: the communication library reported an error.
//!
//! Measures calls that returned a non-zero status, communicators that could not be created,
//! and NCCL communicators reported broken asynchronously (`ncclCommGetAsyncError`). Fires at
//! the first one, one finding per communicator naming every rank that got an error on it, with
//! NCCL's error named and its own message (`ncclGetLastError`) when it gave one.

use std::collections::{BTreeMap, BTreeSet};

use commscope_wire::hash::format_comm_id;
use commscope_wire::op::{Op, flags, lib};
use commscope_wire::record::{Call, Comm};
use serde_json::json;

use crate::finding::{Class, Finding, Kind, State, finding_id, ranks_phrase};

/// Errors on one communicator.
#[derive(Debug)]
struct ErrInfo {
    ranks: BTreeSet<i32>,
    first_seq: u64,
    op: &'static str,
    status: i32,
    count: u64,
    first_s: f64,
    source: Source,
    /// The library's own words, when it gave them (NCCL's `ncclGetLastError`).
    message: String,
    /// The library that reported it (`commscope_wire::op::lib`).
    lib: u8,
}

/// Where a communicator's error came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Calls returned it.
    Call,
    /// Creating the communicator failed.
    Init,
    /// The library reported it asynchronously (`ncclCommGetAsyncError`).
    Async,
}

/// The comm-error detector.
#[derive(Debug, Default)]
pub struct CommErrors {
    errors: BTreeMap<u64, ErrInfo>,
}

impl CommErrors {
    /// A completed call, at `now` seconds: counted when it returned an error.
    pub fn call(&mut self, c: &Call, now: f64) {
        if c.status == 0 {
            return;
        }
        let e = self.errors.entry(c.comm_id).or_insert_with(|| ErrInfo {
            ranks: BTreeSet::new(),
            first_seq: c.seq,
            op: Op::from_code(c.op).name(),
            status: c.status,
            count: 0,
            first_s: now,
            source: Source::Call,
            message: String::new(),
            lib: c.lib,
        });
        e.ranks.insert(c.rank);
        e.count += 1;
        e.first_seq = e.first_seq.min(c.seq);
    }

    /// A communicator that could not be created, or that its library reported broken (a `comm`
    /// record with event `failed`), at `now` seconds.
    pub fn comm_failed(&mut self, c: &Comm, now: f64) {
        let source = if c.flags & flags::COMM_ASYNC_ERROR != 0 {
            Source::Async
        } else {
            Source::Init
        };
        let e = self.errors.entry(c.comm_id).or_insert_with(|| ErrInfo {
            ranks: BTreeSet::new(),
            first_seq: 0,
            op: "",
            status: c.status,
            count: 0,
            first_s: now,
            source,
            message: c.name().to_owned(),
            lib: if c.flags & flags::NCCL_COMM != 0 {
                lib::NCCL
            } else {
                lib::MPI
            },
        });
        e.ranks.insert(c.rank);
        e.count += 1;
    }

    /// One finding per communicator with errors.
    pub fn findings(
        &self,
        job: &str,
        node_of: impl Fn(i32) -> Option<String>,
        out: &mut Vec<Finding>,
    ) {
        for (comm, e) in &self.errors {
            let nodes: Vec<String> = e
                .ranks
                .iter()
                .filter_map(|r| node_of(*r))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let ranks: Vec<i32> = e.ranks.iter().copied().collect();
            out.push(Finding {
                id: finding_id(Kind::CommError, job, Some(*comm), &ranks, Some(e.first_seq)),
                kind: Kind::CommError,
                class: Class::CommunicationHang,
                state: State::Open,
                job: job.to_owned(),
                comm: Some(format_comm_id(*comm)),
                seq: Some(e.first_seq),
                ranks: ranks.clone(),
                nodes: nodes.clone(),
                link: None,
                opened_at: (e.first_s * 1e9) as u64,
                resolved_at: None,
                confidence: 0.99,
                summary: summary(e, &ranks, &nodes, *comm),
                evidence: json!({
                    "status": e.status,
                    "failed_calls": e.count,
                    "op": e.op,
                    "source": match e.source {
                        Source::Call => "call",
                        Source::Init => "init",
                        Source::Async => "async",
                    },
                    "library": lib::name(e.lib),
                    "message": e.message,
                }),
            });
        }
    }
}

/// The sentence of a `comm-error` finding.
fn summary(e: &ErrInfo, ranks: &[i32], nodes: &[String], comm: u64) -> String {
    let who = ranks_phrase(ranks);
    let on = if nodes.is_empty() {
        "an unknown node".to_owned()
    } else {
        nodes.join(", ")
    };
    let those = if nodes.len() == 1 {
        "that node"
    } else {
        "those nodes"
    };
    let nccl = e.lib != lib::MPI;
    let mut error = if nccl {
        format!("{}, {}", e.status, nccl_error_name(e.status))
    } else {
        e.status.to_string()
    };
    if !e.message.is_empty() {
        error = format!("{error} (\"{}\")", e.message);
    }
    match e.source {
        Source::Init if nccl => format!(
            "{who} on {on} could not create NCCL communicator {}: error {error} — the job cannot communicate; rerun with NCCL_DEBUG=WARN and read its log on {those} (network interfaces, NCCL_SOCKET_IFNAME, GPU visibility)",
            format_comm_id(comm)
        ),
        Source::Init => format!(
            "{who} on {on} could not create communicator {}: error {error} — read the library's error log on {those}",
            format_comm_id(comm)
        ),
        Source::Async => format!(
            "{who} on {on} reported asynchronous error {error} on NCCL communicator {} — the communicator is broken and its pending collectives will not finish: read the NCCL log on {those} and restart the job",
            format_comm_id(comm)
        ),
        Source::Call => format!(
            "{who} on {on} got error {error} from {} on communicator {} ({} failed call{} from #{}) — the communicator is broken: read the library's error log on {those} and restart the job",
            e.op,
            format_comm_id(comm),
            e.count,
            if e.count == 1 { "" } else { "s" },
            e.first_seq,
        ),
    }
}

/// The name and meaning of an `ncclResult_t`.
fn nccl_error_name(status: i32) -> &'static str {
    match status {
        1 => "ncclUnhandledCudaError: a CUDA call failed",
        2 => "ncclSystemError: a system call failed (sockets, memory, shared memory)",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError: a peer process exited or the network failed",
        8 => "ncclTimeout",
        _ => "an unknown NCCL error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_wire::record::CommEvent;

    fn failed(rank: i32, seq: u64, status: i32, lib: u8) -> Call {
        Call {
            op: Op::Allreduce as u8,
            comm_id: 0x77,
            seq,
            rank,
            status,
            lib,
            ..Default::default()
        }
    }

    fn node(r: i32) -> Option<String> {
        Some(format!("n{}", r / 2))
    }

    fn run(e: &CommErrors) -> Vec<Finding> {
        let mut out = vec![];
        e.findings("j", node, &mut out);
        out
    }

    #[test]
    fn calls_that_succeed_are_no_finding() {
        let mut e = CommErrors::default();
        e.call(&failed(0, 1, 0, lib::MPI), 1.0);
        assert!(run(&e).is_empty());
    }

    #[test]
    fn failed_calls_on_one_communicator_are_one_finding_from_the_first() {
        let mut e = CommErrors::default();
        e.call(&failed(3, 9, 15, lib::MPI), 2.0);
        e.call(&failed(2, 7, 15, lib::MPI), 2.5);
        e.call(&failed(3, 10, 15, lib::MPI), 3.0);
        let f = run(&e);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].ranks, [2, 3]);
        assert_eq!(f[0].nodes, ["n1"]);
        assert_eq!(f[0].seq, Some(7));
        assert_eq!(f[0].evidence["failed_calls"], 3);
        assert!(
            f[0].summary.contains("3 failed calls from #7"),
            "{}",
            f[0].summary
        );
    }

    #[test]
    fn nccl_errors_are_named_with_the_library_words() {
        let mut e = CommErrors::default();
        e.call(&failed(0, 4, 6, lib::NCCL), 1.0);
        assert!(run(&e)[0].summary.contains("ncclRemoteError"));
        let mut e = CommErrors::default();
        let mut c = Comm::new(CommEvent::Failed, 0x88, 0, 0, 1, 1, 4, 0);
        c.flags = flags::NCCL_COMM | flags::COMM_ASYNC_ERROR;
        c.status = 6;
        c.set_name(b"NET/IB : Got completion with error 12");
        e.comm_failed(&c, 1.0);
        let f = run(&e);
        assert_eq!(f[0].ranks, [1]);
        assert_eq!(f[0].evidence["source"], "async");
        assert!(
            f[0].summary.contains("Got completion with error 12"),
            "{}",
            f[0].summary
        );
        assert!(
            f[0].summary.contains("asynchronous error 6"),
            "{}",
            f[0].summary
        );
    }
}
