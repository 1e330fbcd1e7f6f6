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
    "Records the collector refused for good (malformed, or over a per-agent bound); counted as dropped.",
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
static NIC_COUNTER: Def = Def::counter(
    "commscope_agent_nic_counter_total",
    "NIC counters since the agent started, in units (bytes for data counters, else events; wraps and saturation handled), by class: traffic, congestion, loss, link-error, receiver, fatal, other.",
    &["node", "device", "port", "counter", "class"],
);
static NIC_SATURATED: Def = Def::gauge(
    "commscope_agent_nic_counter_saturated",
    "1 while a narrow NIC error counter is stuck at its maximum (its total is then a lower bound).",
    &["node", "device", "port", "counter"],
);
static NIC_PORT_UP: Def = Def::gauge(
    "commscope_agent_nic_port_up",
    "1 while an RDMA port is ACTIVE.",
    &["node", "device", "port"],
);
static NIC_PORT_RATE: Def = Def::gauge(
    "commscope_agent_nic_port_rate_bytes",
    "An RDMA port's link rate, bytes per second.",
    &["node", "device", "port"],
);
static NIC_UNREADABLE: Def = Def::gauge(
    "commscope_agent_nic_unreadable_files",
    "NIC counter files that could not be read at the last read (N/A, EINVAL, permissions).",
    N,
);

static EBPF_LOADED: Def = Def::gauge(
    "commscope_agent_ebpf_loaded",
    "1 when the eBPF programs are loaded (0: off, or not permitted; see the warnings).",
    N,
);
static EBPF_ATTACHED: Def = Def::gauge(
    "commscope_agent_ebpf_probes_attached",
    "Tracepoints and uprobes attached.",
    N,
);
static EBPF_WARNINGS: Def = Def::gauge(
    "commscope_agent_ebpf_warnings",
    "Distinct problems that left part of the transport view off (each logged once).",
    N,
);
static EBPF_EVENTS: Def = Def::counter(
    "commscope_agent_ebpf_events_total",
    "Events from the eBPF programs, by kind.",
    &["node", "kind"],
);
static EBPF_LOST: Def = Def::counter(
    "commscope_agent_ebpf_lost_total",
    "eBPF events or samples lost, by reason (ring_full, map_full, read_failed, undecodable, queue_full, link_errors_waiting).",
    &["node", "reason"],
);
static TCP_BYTES: Def = Def::counter(
    "commscope_agent_tcp_bytes_total",
    "TCP bytes of traced processes' flows, by remote address and direction (sent: acknowledged).",
    &["node", "peer", "direction"],
);
static TCP_RETRANS: Def = Def::counter(
    "commscope_agent_tcp_retransmits_total",
    "TCP retransmissions of traced processes' flows, by remote address.",
    &["node", "peer"],
);
static TCP_SRTT: Def = Def::gauge(
    "commscope_agent_tcp_srtt_seconds",
    "Mean smoothed RTT of traced processes' live flows, by remote address.",
    &["node", "peer"],
);
static TCP_FLOWS: Def = Def::gauge(
    "commscope_agent_tcp_flows",
    "Live TCP flows of traced processes, by remote address.",
    &["node", "peer"],
);
static RDMA_LINK_ERRORS: Def = Def::counter(
    "commscope_agent_rdma_link_errors_total",
    "Queue pairs moved to ERROR and fatal asynchronous events, by device.",
    &["node", "device"],
);
static RDMA_ASYNC: Def = Def::counter(
    "commscope_agent_rdma_async_events_total",
    "Asynchronous events from ibv_get_async_event, by device and event.",
    &["node", "device", "event"],
);
static RDMA_MR: Def = Def::counter(
    "commscope_agent_rdma_mr_registrations_total",
    "Memory registrations, by result (ok, failed).",
    &["node", "result"],
);
static RDMA_MR_SECONDS: Def = Def::counter(
    "commscope_agent_rdma_mr_registration_seconds_total",
    "Time spent in memory registration and deregistration calls.",
    N,
);
static NCCL_NET_BYTES: Def = Def::counter(
    "commscope_agent_nccl_net_bytes_total",
    "Bytes NCCL's network layer posted (isend/irecv), by transport (ib, socket) and side (send, recv).",
    &["node", "transport", "side"],
);
static ZERO_TOUCH: Def = Def::counter(
    "commscope_agent_zero_touch_total",
    "NCCL recording from uprobes for processes without the preload: processes adopted, communicators and calls recorded, calls on communicators never seen created (unknown_comm), records lost to a full ring (ring_full), processes that could not be adopted (failed).",
    &["node", "what"],
);

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
    &NIC_COUNTER,
    &NIC_SATURATED,
    &NIC_PORT_UP,
    &NIC_PORT_RATE,
    &NIC_UNREADABLE,
    &EBPF_LOADED,
    &EBPF_ATTACHED,
    &EBPF_WARNINGS,
    &EBPF_EVENTS,
    &EBPF_LOST,
    &TCP_BYTES,
    &TCP_RETRANS,
    &TCP_SRTT,
    &TCP_FLOWS,
    &RDMA_LINK_ERRORS,
    &RDMA_ASYNC,
    &RDMA_MR,
    &RDMA_MR_SECONDS,
    &NCCL_NET_BYTES,
    &ZERO_TOUCH,
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
    fill_nic(s, node, o);
    fill_transport(s, node, o);
}

fn fill_transport(s: &Stats, node: &str, o: &mut Sink) {
    use commscope_ebpf_common::net;
    let st = s
        .transport
        .status
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    o.value(&EBPF_LOADED, &[node], f64::from(u8::from(st.loaded)));
    o.value(&EBPF_ATTACHED, &[node], st.attached.len() as f64);
    o.value(&EBPF_WARNINGS, &[node], st.warnings.len() as f64);
    let v = s.transport.view.lock().unwrap_or_else(|p| p.into_inner());
    for (kind, n) in &v.events {
        o.value(&EBPF_EVENTS, &[node, kind], *n as f64);
    }
    for (i, reason) in ["ring_full", "map_full", "read_failed"]
        .into_iter()
        .enumerate()
    {
        o.value(&EBPF_LOST, &[node, reason], st.kernel_drops[i] as f64);
    }
    o.value(&EBPF_LOST, &[node, "undecodable"], v.undecodable as f64);
    o.value(
        &EBPF_LOST,
        &[node, "link_errors_waiting"],
        v.link_errors_dropped as f64,
    );
    o.value(
        &EBPF_LOST,
        &[node, "queue_full"],
        s.transport
            .records_dropped
            .load(std::sync::atomic::Ordering::Relaxed) as f64,
    );
    for (peer, t) in v.tcp_by_peer() {
        let peer = peer.to_string();
        o.value(&TCP_BYTES, &[node, &peer, "sent"], t.bytes_sent as f64);
        o.value(
            &TCP_BYTES,
            &[node, &peer, "received"],
            t.bytes_received as f64,
        );
        o.value(&TCP_RETRANS, &[node, &peer], t.retransmits as f64);
        o.value(&TCP_FLOWS, &[node, &peer], t.flows as f64);
        if let Some(us) = t.srtt_us {
            o.value(&TCP_SRTT, &[node, &peer], us / 1e6);
        }
    }
    let mut link_errors: std::collections::BTreeMap<&str, u64> = Default::default();
    for e in &v.link_errors {
        *link_errors.entry(e.device.as_str()).or_default() += 1;
    }
    for (device, n) in link_errors {
        o.value(&RDMA_LINK_ERRORS, &[node, device], n as f64);
    }
    for ((device, event), n) in &v.async_events {
        o.value(&RDMA_ASYNC, &[node, device, event], *n as f64);
    }
    let (ok, failed, ns) = v.mr.values().fold((0, 0, 0), |(a, b, c), m| {
        (a + m.registered, b + m.failed, c + m.latency_ns_sum)
    });
    o.value(&RDMA_MR, &[node, "ok"], ok as f64);
    o.value(&RDMA_MR, &[node, "failed"], failed as f64);
    o.value(&RDMA_MR_SECONDS, &[node], ns as f64 / 1e9);
    let mut net_bytes: std::collections::BTreeMap<(&str, &str), u64> = Default::default();
    for c in v.conns.values() {
        let t = if c.transport == net::IB {
            "ib"
        } else {
            "socket"
        };
        *net_bytes
            .entry((t, crate::transport::TransportView::side_name(c.side)))
            .or_default() += c.totals.bytes;
    }
    for ((t, side), b) in net_bytes {
        o.value(&NCCL_NET_BYTES, &[node, t, side], b as f64);
    }
    let z = *s
        .transport
        .zero_touch
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    for (what, n) in [
        ("processes", z.processes),
        ("comms", z.comms),
        ("calls", z.calls),
        ("unknown_comm", z.unknown_comm),
        ("ring_full", z.ring_full),
        ("failed", z.failed),
    ] {
        o.value(&ZERO_TOUCH, &[node, what], n as f64);
    }
}

fn fill_nic(s: &Stats, node: &str, o: &mut Sink) {
    let nic = s.nic.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (w, t) in &nic.counters {
        let (class, units, saturated) = (t.class, t.units, t.saturated);
        let port = w.port.to_string();
        let at = [node, w.device.as_str(), port.as_str(), w.counter.as_str()];
        o.value(
            &NIC_COUNTER,
            &[at[0], at[1], at[2], at[3], class.name()],
            units as f64,
        );
        if saturated {
            o.value(&NIC_SATURATED, &at, 1.0);
        }
    }
    for ((device, port), (up, rate)) in &nic.ports {
        let port = port.to_string();
        let l = [node, device.as_str(), port.as_str()];
        o.value(&NIC_PORT_UP, &l, f64::from(u8::from(*up)));
        if let Some(r) = rate {
            o.value(&NIC_PORT_RATE, &l, *r as f64);
        }
    }
    o.value(&NIC_UNREADABLE, &[node], nic.unreadable as f64);
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
        // No NIC read yet: only the unreadable-files gauge.
        assert!(text.contains("commscope_agent_nic_unreadable_files{node=\"n\\\"1\"} 0"));
        assert!(!text.contains("commscope_agent_nic_counter_total{"));
    }

    #[test]
    fn nic_counters_are_exported_by_device_port_counter_and_class() {
        use crate::nic::{Class, Total, Totals, Where};
        let stats = Stats::default();
        {
            let mut t = stats.nic.lock().expect("lock");
            *t = Totals {
                counters: [
                    (
                        ("mlx5_0", 1, "port_xmit_data"),
                        Total::new(Class::Traffic, 4096, false),
                    ),
                    (
                        ("mlx5_0", 1, "symbol_error"),
                        Total::new(Class::LinkError, 65_535, true),
                    ),
                ]
                .into_iter()
                .map(|((d, p, c), v)| {
                    (
                        Where {
                            device: d.into(),
                            port: p,
                            counter: c.into(),
                        },
                        v,
                    )
                })
                .collect(),
                ports: [(("mlx5_0".to_owned(), 1), (true, Some(12_500_000_000)))].into(),
                unreadable: 2,
            };
        }
        let r = registry(Arc::new(stats), "n1".into()).expect("a valid catalog");
        let text = commscope_telemetry::metrics::encode(&r);
        for want in [
            "commscope_agent_nic_counter_total{node=\"n1\",device=\"mlx5_0\",port=\"1\",counter=\"port_xmit_data\",class=\"traffic\"} 4096",
            "commscope_agent_nic_counter_total{node=\"n1\",device=\"mlx5_0\",port=\"1\",counter=\"symbol_error\",class=\"link-error\"} 65535",
            "commscope_agent_nic_counter_saturated{node=\"n1\",device=\"mlx5_0\",port=\"1\",counter=\"symbol_error\"} 1",
            "commscope_agent_nic_port_up{node=\"n1\",device=\"mlx5_0\",port=\"1\"} 1",
            "commscope_agent_nic_port_rate_bytes{node=\"n1\",device=\"mlx5_0\",port=\"1\"} 12500000000",
            "commscope_agent_nic_unreadable_files{node=\"n1\"} 2",
        ] {
            assert!(text.contains(want), "{want} not in\n{text}");
        }
        assert!(!text.contains("counter=\"port_xmit_data\"} 1"));
    }
}
