//! Record batches: checked, handed to the store, then to the live state in the stream's order —
//! one process's (`records`) or several processes' of one node at once (`node_records`: a
//! collector's cost is per message far more than per record, so one message per node and turn
//! lets a large fleet deliver every second).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use commscope_wire::cst::Header;
use commscope_wire::grpc::{Attribution, RecordBatch};
use commscope_wire::parquet::ClockAlignment;
use commscope_wire::record::RECORD_LAYOUT_VERSION as LAYOUT_VERSION;
use commscope_wire::record::{RECORD_SIZE, RawRecord};

use super::{
    AckFuture, Finishing, MAX_BATCH_RECORDS, Peer, Work, ack, admitted, header_of, ready, refused,
};
use crate::Shared;
use crate::store::{Batch, Committed};

/// One process's records, checked: what the store and the live state take.
#[derive(Debug)]
pub(super) struct Checked {
    header: Header,
    clock: Option<ClockAlignment>,
    overrun: u64,
    attribution: Option<Attribution>,
    records: Vec<RawRecord>,
}

/// Checks one process's batch; on a final refusal (malformed, not admitted), says why (the
/// refusal's reason is counted).
pub(super) fn check(shared: &Shared, peer: &Peer, b: RecordBatch) -> Result<Checked, String> {
    let m = &shared.metrics;
    let process = admitted(shared, peer, b.process.as_ref(), "a record batch")?;
    if b.record_size as usize != RECORD_SIZE {
        m.refused("layout-version");
        return Err(format!(
            "records of {} bytes are not supported (layout version {LAYOUT_VERSION} has {RECORD_SIZE})",
            b.record_size
        ));
    }
    if b.records.is_empty() || !b.records.len().is_multiple_of(RECORD_SIZE) {
        m.refused("malformed");
        return Err(format!(
            "{} bytes of records are not whole records",
            b.records.len()
        ));
    }
    let n = b.records.len() / RECORD_SIZE;
    if n > MAX_BATCH_RECORDS {
        m.refused("oversized");
        return Err(format!(
            "{n} records in one batch; at most {MAX_BATCH_RECORDS}"
        ));
    }
    let records = b
        .records
        .chunks_exact(RECORD_SIZE)
        .map(|c| {
            let mut r = [0u8; RECORD_SIZE];
            r.copy_from_slice(c);
            r
        })
        .collect();
    Ok(Checked {
        header: header_of(process),
        clock: b.clock_offset_ns.map(|offset_ns| ClockAlignment {
            offset_ns,
            error_ns: b.clock_error_ns,
        }),
        overrun: b.dropped_overrun,
        attribution: process.attribution.clone(),
        records,
    })
}

/// The work of checked batches that came in one message: refused whole for now at the memory
/// bound or over the agent's rate; else each is handed to the store now, and to the live state in
/// order once stored. One acknowledgement answers them all, durable once every one is stored.
pub(super) fn take(
    shared: &Arc<Shared>,
    peer: &mut Peer,
    batches: Vec<Checked>,
    id: u64,
    recv_ns: u64,
    held: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Work {
    let m = &shared.metrics;
    let n: usize = batches.iter().map(|b| b.records.len()).sum();
    if !shared.memory.admit() {
        // At the memory bound: the agent keeps the batches and sends them again.
        m.refused("memory");
        shared.memory.refused(n as u64);
        return ready(refused(
            id,
            recv_ns,
            "the collector is at its memory bound; send again later".into(),
            crate::memory::RETRY_MS,
        ));
    }
    if let Err(wait) = peer.take(n, shared.config.max_agent_rate as f64) {
        m.refused("rate-limit");
        m.rate_limited.fetch_add(1, Ordering::Relaxed);
        return ready(refused(
            id,
            recv_ns,
            format!(
                "over the per-agent limit of {} records/s",
                shared.config.max_agent_rate
            ),
            wait,
        ));
    }
    let submitted: Vec<_> = batches
        .into_iter()
        .map(|b| {
            if let Some(c) = b.clock {
                shared.set_node_clock(&b.header.node, c);
            }
            m.records_in
                .fetch_add(b.records.len() as u64, Ordering::Relaxed);
            let commit = shared.store.submit(Batch {
                header: b.header.clone(),
                clock: b.clock,
                records: b.records,
            });
            (commit, b.header, b.clock, b.overrun, b.attribution)
        })
        .collect();
    let shared = shared.clone();
    Box::pin(async move {
        let mut applying = Vec::with_capacity(submitted.len());
        let mut failed = None;
        for (commit, header, clock, overrun, attribution) in submitted {
            match commit.await {
                Ok(c) => applying.push(apply(&shared, header, clock, overrun, attribution, c)),
                Err(e) => {
                    failed.get_or_insert_with(|| e.to_string());
                }
            }
        }
        Finishing(Box::pin(async move {
            for a in applying {
                a.await;
            }
            drop(held);
            match failed {
                None => ack(id, recv_ns),
                Some(e) => {
                    shared.metrics.refused("storage");
                    refused(id, recv_ns, format!("not stored: {e}"), 1000)
                }
            }
        }) as AckFuture)
    })
}

/// Hands one stored batch to its job's live state now (behind what was handed before), and
/// returns what finishes it once applied.
fn apply(
    shared: &Arc<Shared>,
    header: Header,
    clock: Option<ClockAlignment>,
    overrun: u64,
    attribution: Option<Attribution>,
    c: Committed,
) -> impl Future<Output = ()> + Send + 'static {
    let h = header.clone();
    let accepted = c.accepted;
    let applying = shared.state.dispatch(&header.job, move |st| {
        if overrun > 0 {
            st.set_overrun(&h, overrun);
        }
        let new = !st.has_process(&h);
        let ended = st.apply(&h, clock, &accepted);
        if let Some(a) = &attribution {
            st.attribute(&h, a);
        }
        (ended, new, st.heard_ns(&h))
    });
    let known = c.known;
    let shared = shared.clone();
    async move {
        let (ended, new) = match applying.await {
            Ok((ended, new, heard)) => {
                shared.arrived(&header.node, heard);
                (ended, new)
            }
            // Stored, not applied: the log says why; the agent need not resend.
            Err(_) => (false, false),
        };
        // Late records of a job that ended before this collector restarted (or released it): a
        // process stored earlier, new to the live state, of a job whose stored line says it
        // ended. Its exit is stored already and will not come again: the job ends again now, or
        // it would read as running with its ranks silent. (The history is asked outside the
        // state's lock, and only for a process new to it.)
        let late = new && known && !ended && shared.history.ended_on_disk(&header.job) && {
            let job = header.job.clone();
            shared
                .state
                .apply(&header.job, move |st| st.end_job(&job))
                .await
                .unwrap_or(false)
        };
        if late {
            tracing::info!(
                "records of job {} came after it ended (rank {} on {}, sent late): the job stays ended",
                header.job,
                header.rank,
                header.node
            );
        }
        if ended || late {
            shared.job_ended(&header.job).await;
        }
    }
}
