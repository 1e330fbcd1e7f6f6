//! The agent's `/metrics` (Prometheus text) and `/healthz`. Catalog in `docs/metrics.md`;
//! per-process series are bounded by the processes on this node.

use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::daemon::Stats;

/// The routes.
pub fn router(stats: Arc<Stats>, node: String) -> Router {
    let node = Arc::new(node);
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/metrics",
            get(move || {
                let stats = stats.clone();
                let node = node.clone();
                async move {
                    (
                        [(
                            header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        render(&stats, &node),
                    )
                        .into_response()
                }
            }),
        )
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Renders every series.
pub fn render(s: &Stats, node: &str) -> String {
    let mut o = String::new();
    let n = esc(node);
    let mut one = |name: &str, kind: &str, help: &str, v: String| {
        let _ = writeln!(
            o,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{node=\"{n}\"}} {v}"
        );
    };
    let c = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed).to_string();
    one(
        "commscope_agent_records_read_total",
        "counter",
        "Records read from the rings.",
        c(&s.records_read),
    );
    one(
        "commscope_agent_calls_sampled_out_total",
        "counter",
        "Calls consistent sampling left out (each counted in a skip record sent instead).",
        c(&s.calls_sampled_out),
    );
    one(
        "commscope_agent_records_acked_total",
        "counter",
        "Records the collector acknowledged as durable.",
        c(&s.records_acked),
    );
    one(
        "commscope_agent_records_spooled_total",
        "counter",
        "Records written to the spool while the collector was unreachable.",
        c(&s.records_spooled),
    );
    one(
        "commscope_agent_records_refused_total",
        "counter",
        "Records the collector refused for good (malformed); counted as dropped.",
        c(&s.records_refused),
    );
    one(
        "commscope_agent_batches_sent_total",
        "counter",
        "Record batches sent (including resends).",
        c(&s.batches_sent),
    );
    one(
        "commscope_agent_batches_retried_total",
        "counter",
        "Batches the collector asked to send again later (rate limit, storage).",
        c(&s.batches_resent),
    );
    one(
        "commscope_agent_batches_unacked",
        "gauge",
        "Batches sent and not yet acknowledged.",
        c(&s.unacked),
    );
    one(
        "commscope_agent_registrations_total",
        "counter",
        "Shim registrations accepted.",
        c(&s.registrations),
    );
    one(
        "commscope_agent_registrations_refused_total",
        "counter",
        "Shim registrations refused (bad message, credentials, version).",
        c(&s.registrations_refused),
    );
    one(
        "commscope_agent_process_exits_total",
        "counter",
        "Traced processes seen ending.",
        c(&s.exits),
    );
    one(
        "commscope_agent_spool_bytes",
        "gauge",
        "Bytes in the spool.",
        c(&s.spool_bytes),
    );
    one(
        "commscope_agent_spool_batches",
        "gauge",
        "Batches in the spool.",
        c(&s.spool_batches),
    );
    one(
        "commscope_agent_spool_errors_total",
        "counter",
        "Batches the spool could not take (full, or the disk failed).",
        c(&s.spool_errors),
    );
    one(
        "commscope_agent_collector_connected",
        "gauge",
        "1 while a stream to the collector is open.",
        u8::from(s.connected.load(Ordering::Relaxed)).to_string(),
    );
    one(
        "commscope_agent_collector_connects_total",
        "counter",
        "Streams opened to the collector.",
        c(&s.connects),
    );
    let clock = *s.clock.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((off, err)) = clock {
        one(
            "commscope_agent_clock_offset_seconds",
            "gauge",
            "Collector clock minus this node's clock (NTP-style estimate).",
            format!("{:.9}", off as f64 / 1e9),
        );
        one(
            "commscope_agent_clock_error_seconds",
            "gauge",
            "Bound on the clock offset's error.",
            format!("{:.9}", err as f64 / 1e9),
        );
    }
    let procs = s
        .processes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    one(
        "commscope_agent_processes",
        "gauge",
        "Traced processes registered now.",
        procs.len().to_string(),
    );
    let gone = *s.gone_drops.lock().unwrap_or_else(|p| p.into_inner());
    let _ = writeln!(
        o,
        "# HELP commscope_agent_records_dropped_total Records lost before the agent could read them, by reason (processes on this node, including ended ones).\n# TYPE commscope_agent_records_dropped_total counter"
    );
    for (i, reason) in ["ring_full", "in_flight_table", "other", "overrun"]
        .iter()
        .enumerate()
    {
        let v: u64 = gone[i] + procs.iter().map(|p| p.drops[i]).sum::<u64>();
        let _ = writeln!(
            o,
            "commscope_agent_records_dropped_total{{node=\"{n}\",reason=\"{reason}\"}} {v}"
        );
    }
    let refused = s.records_refused.load(Ordering::Relaxed);
    let _ = writeln!(
        o,
        "commscope_agent_records_dropped_total{{node=\"{n}\",reason=\"refused\"}} {refused}"
    );
    let _ = writeln!(
        o,
        "# HELP commscope_agent_ring_fill_ratio Share of a process's ring holding records the agent has not yet had acknowledged.\n# TYPE commscope_agent_ring_fill_ratio gauge"
    );
    for p in &procs {
        let _ = writeln!(
            o,
            "commscope_agent_ring_fill_ratio{{node=\"{n}\",job_id=\"{}\",rank=\"{}\",pid=\"{}\"}} {:.6}",
            esc(&p.job),
            p.rank,
            p.pid,
            p.fill
        );
    }
    let _ = writeln!(
        o,
        "# HELP commscope_agent_process_in_flight Calls in flight in a process (its in-flight table).\n# TYPE commscope_agent_process_in_flight gauge"
    );
    for p in &procs {
        let _ = writeln!(
            o,
            "commscope_agent_process_in_flight{{node=\"{n}\",job_id=\"{}\",rank=\"{}\",pid=\"{}\"}} {}",
            esc(&p.job),
            p.rank,
            p.pid,
            p.in_flight
        );
    }
    o
}
