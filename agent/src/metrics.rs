//! The agent's `/metrics` and `/healthz`. Its families are filled from [`Stats`] at each scrape
//! (see `commscope_telemetry::metrics`); the catalog is in `docs/metrics.md`, kept the same by a
//! test. Every series carries `node`; per-process series are bounded by the processes on this
//! node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use commscope_telemetry::metrics::{Def, Sink};

use crate::daemon::Stats;

const N: &[&str] = &["node"];
const PROC: &[&str] = &["node", "job_id", "rank", "pid"];

static RECORDS_READ: Def = Def::counter(
    "commscope_agent_records_read_total",
    "Records read from the rings.",
    N,
);
static SAMPLED_OUT: Def = Def::counter(
    "commscope_agent_calls_sampled_out_total",
    "Calls consistent sampling left out (each counted in a skip record sent instead).",
    N,
);
static ACKED: Def = Def::counter(
    "commscope_agent_records_acked_total",
    "Records the collector acknowledged as durable.",
    N,
);
static SPOOLED: Def = Def::counter(
    "commscope_agent_records_spooled_total",
    "Records written to the spool while the collector was unreachable.",
    N,
);
static REFUSED: Def = Def::counter(
    "commscope_agent_records_refused_total",
    "Records the collector refused for good (malformed); counted as dropped.",
    N,
);
static DROPPED: Def = Def::counter(
    "commscope_agent_records_dropped_total",
    "Records lost before the agent could read them or refused after, by reason (processes on this node, including ended ones).",
    &["node", "reason"],
);
static SENT: Def = Def::counter(
    "commscope_agent_batches_sent_total",
    "Record batches sent (including resends).",
    N,
);
static RETRIED: Def = Def::counter(
    "commscope_agent_batches_retried_total",
    "Batches the collector asked to send again later (rate limit, storage).",
    N,
);
static UNACKED: Def = Def::gauge(
    "commscope_agent_batches_unacked",
    "Batches sent and not yet acknowledged.",
    N,
);
static REGISTRATIONS: Def = Def::counter(
    "commscope_agent_registrations_total",
    "Shim registrations accepted.",
    N,
);
static REGISTRATIONS_REFUSED: Def = Def::counter(
    "commscope_agent_registrations_refused_total",
    "Shim registrations refused (bad message, credentials, version).",
    N,
);
static EXITS: Def = Def::counter(
    "commscope_agent_process_exits_total",
    "Traced processes seen ending.",
    N,
);
static PROCESSES: Def = Def::gauge(
    "commscope_agent_processes",
    "Traced processes registered now.",
    N,
);
static SPOOL_BYTES: Def = Def::gauge("commscope_agent_spool_bytes", "Bytes in the spool.", N);
static SPOOL_BATCHES: Def = Def::gauge("commscope_agent_spool_batches", "Batches in the spool.", N);
static SPOOL_ERRORS: Def = Def::counter(
    "commscope_agent_spool_errors_total",
    "Batches the spool could not take (full, or the disk failed).",
    N,
);
static CONNECTED: Def = Def::gauge(
    "commscope_agent_collector_connected",
    "1 while a stream to the collector is open.",
    N,
);
static CONNECTS: Def = Def::counter(
    "commscope_agent_collector_connects_total",
    "Streams opened to the collector.",
    N,
);
static CLOCK_OFFSET: Def = Def::gauge(
    "commscope_agent_clock_offset_seconds",
    "Collector clock minus this node's clock (NTP-style estimate).",
    N,
);
static CLOCK_ERROR: Def = Def::gauge(
    "commscope_agent_clock_error_seconds",
    "Bound on the clock offset's error.",
    N,
);
static RING_FILL: Def = Def::gauge(
    "commscope_agent_ring_fill_ratio",
    "Share of a process's ring holding records the agent has not yet had acknowledged.",
    PROC,
);
static PROCESS_IN_FLIGHT: Def = Def::gauge(
    "commscope_agent_process_in_flight",
    "Calls in flight in a process (its in-flight table).",
    PROC,
);

/// Every family the agent exports (besides the process collector's `process_*`).
pub static CATALOG: &[&Def] = &[
    &RECORDS_READ,
    &SAMPLED_OUT,
    &ACKED,
    &SPOOLED,
    &REFUSED,
    &DROPPED,
    &SENT,
    &RETRIED,
    &UNACKED,
    &REGISTRATIONS,
    &REGISTRATIONS_REFUSED,
    &EXITS,
    &PROCESSES,
    &SPOOL_BYTES,
    &SPOOL_BATCHES,
    &SPOOL_ERRORS,
    &CONNECTED,
    &CONNECTS,
    &CLOCK_OFFSET,
    &CLOCK_ERROR,
    &RING_FILL,
    &PROCESS_IN_FLIGHT,
];

/// The agent's registry: the process collector and [`CATALOG`], filled from `stats`.
pub fn registry(stats: Arc<Stats>, node: String) -> prometheus::Result<prometheus::Registry> {
    commscope_telemetry::metrics::registry(CATALOG, move |sink| fill(&stats, &node, sink))
}

/// The routes.
pub fn router(registry: prometheus::Registry) -> Router {
    let registry = Arc::new(registry);
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            commscope_telemetry::metrics::CONTENT_TYPE,
                        )],
                        commscope_telemetry::metrics::encode(&registry),
                    )
                        .into_response()
                }
            }),
        )
}

fn fill(s: &Stats, node: &str, o: &mut Sink) {
    let n = [node];
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    for (def, v) in [
        (&RECORDS_READ, &s.records_read),
        (&SAMPLED_OUT, &s.calls_sampled_out),
        (&ACKED, &s.records_acked),
        (&SPOOLED, &s.records_spooled),
        (&REFUSED, &s.records_refused),
        (&SENT, &s.batches_sent),
        (&RETRIED, &s.batches_resent),
        (&UNACKED, &s.unacked),
        (&REGISTRATIONS, &s.registrations),
        (&REGISTRATIONS_REFUSED, &s.registrations_refused),
        (&EXITS, &s.exits),
        (&SPOOL_BYTES, &s.spool_bytes),
        (&SPOOL_BATCHES, &s.spool_batches),
        (&SPOOL_ERRORS, &s.spool_errors),
        (&CONNECTS, &s.connects),
    ] {
        o.value(def, &n, c(v));
    }
    o.value(
        &CONNECTED,
        &n,
        f64::from(u8::from(s.connected.load(Ordering::Relaxed))),
    );
    let clock = *s.clock.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((off, err)) = clock {
        o.value(&CLOCK_OFFSET, &n, off as f64 / 1e9);
        o.value(&CLOCK_ERROR, &n, err as f64 / 1e9);
    }
    let procs = s
        .processes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    o.value(&PROCESSES, &n, procs.len() as f64);
    let gone = *s.gone_drops.lock().unwrap_or_else(|p| p.into_inner());
    for (i, reason) in ["ring_full", "in_flight_table", "other", "overrun"]
        .into_iter()
        .enumerate()
    {
        let v: u64 = gone[i] + procs.iter().map(|p| p.drops[i]).sum::<u64>();
        o.value(&DROPPED, &[node, reason], v as f64);
    }
    o.value(&DROPPED, &[node, "refused"], c(&s.records_refused));
    for p in &procs {
        let (rank, pid) = (p.rank.to_string(), p.pid.to_string());
        let l = [node, p.job.as_str(), rank.as_str(), pid.as_str()];
        o.value(&RING_FILL, &l, p.fill);
        o.value(&PROCESS_IN_FLIGHT, &l, p.in_flight as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docs_metrics_md_matches_the_registry() {
        let doc = include_str!("../../docs/metrics.md");
        let problems = commscope_telemetry::metrics::check_doc(doc, "Agent", CATALOG);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn every_counter_of_a_fresh_agent_is_exported_with_its_node() {
        let r = registry(Arc::new(Stats::default()), "n\"1".into()).expect("a valid catalog");
        let text = commscope_telemetry::metrics::encode(&r);
        assert!(
            text.contains("commscope_agent_records_read_total{node=\"n\\\"1\"} 0"),
            "{text}"
        );
        assert!(text.contains(
            "commscope_agent_records_dropped_total{node=\"n\\\"1\",reason=\"refused\"} 0"
        ));
        // No clock estimate yet: no clock series.
        assert!(!text.contains("commscope_agent_clock_offset_seconds{"));
    }
}
