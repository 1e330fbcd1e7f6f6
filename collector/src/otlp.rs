//! OTLP export (`--otlp URL`, gRPC): every `--otlp-interval` the collector sends
//!
//! - **metrics**: the registry's families (the very series `/metrics` serves), translated to OTLP
//!   — gauges as gauges, counters as cumulative monotonic sums, histograms as cumulative
//!   explicit-bucket histograms. The labels `job_id`, `node` and `rank` become *resource*
//!   attributes (`commscope.job.id`, `commscope.node`, `commscope.rank`), so each job, node and
//!   rank is a resource of its own, and so do the attribution labels (below); the other labels
//!   stay on the data points;
//! - **spans**: one per finding, from when it opened to when it resolved (findings still open
//!   when the collector stops end then, with `commscope.finding.state = open`), and one per
//!   sampled slow collective call ([`crate::state::SlowCall`]: four times its communicator's
//!   usual or more). The spans of one collective instance share a trace; a finding's resource
//!   is its first root rank.
//!
//! Spans go through `opentelemetry-otlp`'s span exporter, its resource set per group. Metrics go
//! through `opentelemetry-proto`'s metrics client: the SDK's metric pipeline aggregates its own
//! instruments and cannot take families computed elsewhere, nor more than one resource.
//!
//! A job's attribution joins its resources: `k8s.namespace.name`, `k8s.pod.name` (a rank's pod),
//! the workload owner as `commscope.owner` ("Kind/name") and, for the kinds OpenTelemetry names,
//! `k8s.job.name`, `k8s.deployment.name`, …, and `commscope.slurm.job.id`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use commscope_analyzer::Finding;
use commscope_wire::hash::{Hasher, format_comm_id};
use commscope_wire::op::Op;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::common::v1 as pc;
use opentelemetry_proto::tonic::metrics::v1 as pm;
use opentelemetry_proto::tonic::resource::v1::Resource as PResource;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use prometheus::proto::{MetricFamily, MetricType};

use crate::Shared;
use crate::state::{SlowCall, now_ns};

/// Findings that resolved, kept for the next export, at most.
const MAX_QUEUED: usize = 10_000;

/// A resource: its attributes after `service.name`, in [`RESOURCE_ORDER`] (so that equal sets
/// group together).
type ResourceKey = Vec<(&'static str, String)>;

/// Resource attributes in the order they are listed.
const RESOURCE_ORDER: &[&str] = &[
    "commscope.job.id",
    "commscope.node",
    "commscope.rank",
    "k8s.namespace.name",
    "k8s.pod.name",
    "commscope.owner",
    "k8s.job.name",
    "k8s.cronjob.name",
    "k8s.deployment.name",
    "k8s.statefulset.name",
    "k8s.daemonset.name",
    "k8s.replicaset.name",
    "commscope.slurm.job.id",
];

/// The resource attribute a metric label becomes, when it names a resource: the job, node and
/// rank (commscope's own), and the job's attribution, Kubernetes' in OpenTelemetry's `k8s.*`
/// conventions.
fn resource_label(label: &str) -> Option<&'static str> {
    Some(match label {
        "job_id" => "commscope.job.id",
        "node" => "commscope.node",
        "rank" => "commscope.rank",
        "namespace" => "k8s.namespace.name",
        "pod" => "k8s.pod.name",
        "owner" => "commscope.owner",
        "slurm_job_id" => "commscope.slurm.job.id",
        _ => return None,
    })
}

/// A resource from (attribute, value) pairs: empty values left out, a workload owner
/// ("Kind/name") also under its kind's `k8s.<kind>.name` where OpenTelemetry names one, in
/// [`RESOURCE_ORDER`].
fn resource(pairs: impl IntoIterator<Item = (&'static str, String)>) -> ResourceKey {
    let mut key: ResourceKey = Vec::new();
    for (k, v) in pairs {
        if v.is_empty() {
            continue;
        }
        if k == "commscope.owner"
            && let Some(kind_attr) = owner_kind_attr(&v)
        {
            let name = v.split_once('/').map_or("", |(_, n)| n).to_owned();
            key.push((kind_attr, name));
        }
        key.push((k, v));
    }
    key.sort_by_key(|(k, _)| RESOURCE_ORDER.iter().position(|o| o == k));
    key.dedup_by(|a, b| a.0 == b.0);
    key
}

/// `k8s.<kind>.name` for the workload kinds OpenTelemetry's conventions name.
fn owner_kind_attr(owner: &str) -> Option<&'static str> {
    let (kind, name) = owner.split_once('/')?;
    if name.is_empty() {
        return None;
    }
    Some(match kind {
        "Job" => "k8s.job.name",
        "CronJob" => "k8s.cronjob.name",
        "Deployment" => "k8s.deployment.name",
        "StatefulSet" => "k8s.statefulset.name",
        "DaemonSet" => "k8s.daemonset.name",
        "ReplicaSet" => "k8s.replicaset.name",
        _ => return None,
    })
}

/// A job's attribution as resource attributes: its namespace, owner and Slurm job, and the pod
/// of the rank the resource is about.
fn attribution_attrs(
    attribution: &crate::state::JobAttribution,
    pod: Option<&str>,
) -> Vec<(&'static str, String)> {
    vec![
        ("k8s.namespace.name", attribution.namespace.clone()),
        ("k8s.pod.name", pod.unwrap_or_default().to_owned()),
        ("commscope.owner", attribution.owner.clone()),
        ("commscope.slurm.job.id", attribution.slurm_job_id.clone()),
    ]
}

fn resource_attrs(key: &ResourceKey) -> Vec<(&'static str, String)> {
    let mut v = vec![("service.name", "commscope-collector".to_owned())];
    v.extend(key.iter().cloned());
    v
}

fn text(v: impl Into<String>) -> pc::AnyValue {
    pc::AnyValue {
        value: Some(pc::any_value::Value::StringValue(v.into())),
    }
}

fn pkv(k: &str, v: impl Into<String>) -> pc::KeyValue {
    pc::KeyValue {
        key: k.to_owned(),
        value: Some(text(v)),
        ..Default::default()
    }
}

/// The registry's families as one OTLP metrics request: a resource per (job, node, rank).
pub fn metrics_request(
    families: &[MetricFamily],
    start_ns: u64,
    now_ns: u64,
) -> ExportMetricsServiceRequest {
    let mut by_resource: BTreeMap<ResourceKey, BTreeMap<String, pm::Metric>> = BTreeMap::new();
    for f in families {
        for m in f.get_metric() {
            let mut pairs = Vec::new();
            let mut attributes = Vec::new();
            for l in m.get_label() {
                match resource_label(l.name()) {
                    Some(k) => pairs.push((k, l.value().to_owned())),
                    None => attributes.push(pkv(l.name(), l.value())),
                }
            }
            let metric = by_resource
                .entry(resource(pairs))
                .or_default()
                .entry(f.name().to_owned())
                .or_insert_with(|| empty_metric(f));
            add_point(metric, f.get_field_type(), m, attributes, start_ns, now_ns);
        }
    }
    let scope = pc::InstrumentationScope {
        name: "commscope".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: by_resource
            .into_iter()
            .map(|(key, metrics)| pm::ResourceMetrics {
                resource: Some(PResource {
                    attributes: resource_attrs(&key)
                        .into_iter()
                        .map(|(k, v)| pkv(k, v))
                        .collect(),
                    ..Default::default()
                }),
                scope_metrics: vec![pm::ScopeMetrics {
                    scope: Some(scope.clone()),
                    metrics: metrics.into_values().collect(),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect(),
    }
}

fn empty_metric(f: &MetricFamily) -> pm::Metric {
    let data = match f.get_field_type() {
        MetricType::COUNTER => pm::metric::Data::Sum(pm::Sum {
            data_points: Vec::new(),
            aggregation_temporality: pm::AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        }),
        MetricType::HISTOGRAM => pm::metric::Data::Histogram(pm::Histogram {
            data_points: Vec::new(),
            aggregation_temporality: pm::AggregationTemporality::Cumulative as i32,
        }),
        _ => pm::metric::Data::Gauge(pm::Gauge {
            data_points: Vec::new(),
        }),
    };
    pm::Metric {
        name: f.name().to_owned(),
        description: f.help().to_owned(),
        data: Some(data),
        ..Default::default()
    }
}

fn add_point(
    metric: &mut pm::Metric,
    kind: MetricType,
    m: &prometheus::proto::Metric,
    attributes: Vec<pc::KeyValue>,
    start_ns: u64,
    now_ns: u64,
) {
    let number = |v: f64| pm::NumberDataPoint {
        attributes: attributes.clone(),
        start_time_unix_nano: start_ns,
        time_unix_nano: now_ns,
        value: Some(pm::number_data_point::Value::AsDouble(v)),
        ..Default::default()
    };
    match (&mut metric.data, kind) {
        (Some(pm::metric::Data::Sum(s)), MetricType::COUNTER) => {
            s.data_points.push(number(m.get_counter().get_value()))
        }
        (Some(pm::metric::Data::Gauge(g)), _) => {
            g.data_points.push(number(m.get_gauge().get_value()))
        }
        (Some(pm::metric::Data::Histogram(h)), MetricType::HISTOGRAM) => {
            let ph = m.get_histogram();
            let buckets = ph.get_bucket();
            let mut counts = Vec::with_capacity(buckets.len() + 1);
            let mut below = 0u64;
            for b in buckets {
                counts.push(b.cumulative_count().saturating_sub(below));
                below = b.cumulative_count();
            }
            counts.push(ph.get_sample_count().saturating_sub(below));
            h.data_points.push(pm::HistogramDataPoint {
                attributes,
                start_time_unix_nano: start_ns,
                time_unix_nano: now_ns,
                count: ph.get_sample_count(),
                sum: Some(ph.get_sample_sum()),
                bucket_counts: counts,
                explicit_bounds: buckets.iter().map(|b| b.upper_bound()).collect(),
                ..Default::default()
            });
        }
        _ => {}
    }
}

/// 16 bytes of two differently seeded hashes of what `feed` writes.
fn hash16(feed: impl Fn(Hasher) -> Hasher) -> [u8; 16] {
    let a = feed(Hasher::new()).finish();
    let b = feed(Hasher::new().str("commscope-trace")).finish();
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_be_bytes());
    out[8..].copy_from_slice(&b.to_be_bytes());
    out
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn span(
    name: String,
    trace: [u8; 16],
    span_id: [u8; 8],
    (start, end): (u64, u64),
    attributes: Vec<KeyValue>,
    status: Status,
) -> SpanData {
    SpanData {
        span_context: SpanContext::new(
            TraceId::from_bytes(trace),
            SpanId::from_bytes(span_id),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: SpanId::INVALID,
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: name.into(),
        start_time: time(start),
        end_time: time(end.max(start)),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status,
        instrumentation_scope: InstrumentationScope::builder("commscope")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

/// A finding's span, from its opening to its resolution (or `end_ns` while open).
pub fn finding_span(f: &Finding, end_ns: u64) -> (ResourceKey, SpanData) {
    let id = hash16(|h| h.str(&f.id));
    let mut span_id = [0u8; 8];
    span_id.copy_from_slice(&id[8..]);
    let state = match f.state {
        commscope_analyzer::finding::State::Open => "open",
        commscope_analyzer::finding::State::Resolved => "resolved",
    };
    let join = |v: &[String]| v.join(",");
    let mut attrs = vec![
        KeyValue::new("commscope.finding.id", f.id.clone()),
        KeyValue::new("commscope.finding.kind", f.kind.name()),
        KeyValue::new("commscope.finding.state", state),
        KeyValue::new("commscope.finding.summary", f.summary.clone()),
        KeyValue::new("commscope.finding.confidence", f.confidence),
        KeyValue::new(
            "commscope.finding.ranks",
            join(&f.ranks.iter().map(|r| r.to_string()).collect::<Vec<_>>()),
        ),
        KeyValue::new("commscope.finding.nodes", join(&f.nodes)),
        KeyValue::new("commscope.finding.evidence", f.evidence.to_string()),
    ];
    if let Some(c) = &f.comm {
        attrs.push(KeyValue::new("commscope.comm", c.clone()));
    }
    if let Some(s) = f.seq {
        attrs.push(KeyValue::new("commscope.seq", s as i64));
    }
    let hangs = matches!(
        f.kind,
        commscope_analyzer::Kind::Hang
            | commscope_analyzer::Kind::DeadRank
            | commscope_analyzer::Kind::Mismatch
            | commscope_analyzer::Kind::CommError
    );
    let status = if hangs {
        Status::error(f.summary.clone())
    } else {
        Status::Unset
    };
    // The job's attribution as the collector attached it ([`crate::findings`]), with the pod
    // of the rank the span is about.
    let a = &f.evidence["attribution"];
    let attribution: crate::state::JobAttribution =
        serde_json::from_value(a.clone()).unwrap_or_default();
    let rank = f.ranks.first().map(|r| r.to_string());
    let pod = rank.as_ref().and_then(|r| a["pods"][r.as_str()].as_str());
    let key = resource(
        [
            ("commscope.job.id", f.job.clone()),
            (
                "commscope.node",
                f.nodes.first().cloned().unwrap_or_default(),
            ),
            ("commscope.rank", rank.clone().unwrap_or_default()),
        ]
        .into_iter()
        .chain(attribution_attrs(&attribution, pod)),
    );
    let end = f.resolved_at.unwrap_or(end_ns);
    (
        key,
        span(
            format!("finding {}", f.kind.name()),
            id,
            span_id,
            (f.opened_at, end),
            attrs,
            status,
        ),
    )
}

/// A slow collective call's span; the calls of one instance share a trace.
/// `attribution`: the job's, as resource attributes ([`attribution_attrs`]).
pub fn slow_call_span(
    job: &str,
    c: &SlowCall,
    attribution: Vec<(&'static str, String)>,
) -> (ResourceKey, SpanData) {
    let trace = hash16(|h| h.str(job).word(c.comm_id).word(c.seq));
    let mut span_id = [0u8; 8];
    span_id.copy_from_slice(
        &hash16(|h| h.str(job).word(c.comm_id).word(c.seq).word(c.rank as u64))[..8],
    );
    let op = Op::from_code(c.op).name();
    let attrs = vec![
        KeyValue::new("commscope.comm", format_comm_id(c.comm_id)),
        KeyValue::new("commscope.seq", c.seq as i64),
        KeyValue::new("commscope.op", op),
        KeyValue::new("commscope.bytes", c.bytes as i64),
        KeyValue::new("commscope.usual_seconds", c.usual_s),
    ];
    let key = resource(
        [
            ("commscope.job.id", job.to_owned()),
            ("commscope.node", c.node.clone()),
            ("commscope.rank", c.rank.to_string()),
        ]
        .into_iter()
        .chain(attribution),
    );
    (
        key,
        span(
            format!("{op} #{}", c.seq),
            trace,
            span_id,
            (c.start_ns, c.end_ns),
            attrs,
            Status::Unset,
        ),
    )
}

/// The exporter's state between rounds.
struct Exporter {
    shared: Arc<Shared>,
    metrics: Option<MetricsServiceClient<tonic::transport::Channel>>,
    spans: Option<opentelemetry_otlp::SpanExporter>,
    url: String,
    start_ns: u64,
    /// Findings open at the last round, to end them if the collector stops first.
    open: HashMap<String, Finding>,
}

impl Exporter {
    async fn round(&mut self, last: bool) {
        let now = now_ns();
        let m = &self.shared.metrics;
        if let Some(reg) = self.shared.registry.get() {
            let req = metrics_request(&reg.gather(), self.start_ns, now);
            if let Some(c) = self.metrics.as_mut() {
                match c.export(req).await {
                    Ok(_) => m.otlp_exported("metrics", "ok"),
                    Err(e) => {
                        m.otlp_exported("metrics", "error");
                        tracing::warn!("OTLP metrics to {}: {}", self.url, e.message());
                    }
                }
            }
        }
        let mut spans: BTreeMap<ResourceKey, Vec<SpanData>> = BTreeMap::new();
        let resolved: Vec<Finding> = std::mem::take(
            &mut *self
                .shared
                .otlp_findings
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for f in &resolved {
            self.open.remove(&f.id);
            let (k, s) = finding_span(f, now);
            spans.entry(k).or_default().push(s);
        }
        {
            let e = self
                .shared
                .findings
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.open = e
                .tracker
                .open
                .values()
                .map(|f| (f.id.clone(), f.clone()))
                .collect();
        }
        if last {
            for f in self.open.values() {
                let (k, s) = finding_span(f, now);
                spans.entry(k).or_default().push(s);
            }
        }
        for mut st in self.shared.state.iter() {
            for j in st.jobs.values_mut() {
                for c in std::mem::take(&mut j.slow_calls) {
                    let pod = j
                        .ranks
                        .values()
                        .filter(|r| r.rank == c.rank && !r.pod.is_empty())
                        .max_by_key(|r| r.last_heard_ns)
                        .map(|r| r.pod.as_str());
                    let (k, s) = slow_call_span(&j.job, &c, attribution_attrs(&j.attribution, pod));
                    spans.entry(k).or_default().push(s);
                }
                if j.slow_calls_dropped > 0 {
                    m.otlp_spans_dropped
                        .fetch_add(j.slow_calls_dropped, Ordering::Relaxed);
                    j.slow_calls_dropped = 0;
                }
            }
        }
        let Some(exp) = self.spans.as_mut() else {
            return;
        };
        for (key, batch) in spans {
            let r = Resource::builder_empty()
                .with_attributes(
                    resource_attrs(&key)
                        .into_iter()
                        .map(|(k, v)| KeyValue::new(k, v)),
                )
                .build();
            exp.set_resource(&r);
            match exp.export(batch).await {
                Ok(()) => m.otlp_exported("spans", "ok"),
                Err(e) => {
                    m.otlp_exported("spans", "error");
                    tracing::warn!("OTLP spans to {}: {e}", self.url);
                }
            }
        }
    }
}

/// Queues a resolved finding for the next round (bounded).
pub fn finding_resolved(shared: &Shared, f: &Finding) {
    if shared.config.otlp.is_none() {
        return;
    }
    let mut q = shared
        .otlp_findings
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if q.len() < MAX_QUEUED {
        q.push(f.clone());
    } else {
        shared
            .metrics
            .otlp_spans_dropped
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Exports every `every` until `stop`, then once more (open findings end then).
pub async fn run(
    shared: Arc<Shared>,
    url: String,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let metrics = tonic::transport::Endpoint::from_shared(url.clone())
        .map(|e| {
            e.connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(10))
                .connect_lazy()
        })
        .map(MetricsServiceClient::new);
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(url.clone())
        .with_timeout(Duration::from_secs(10))
        .build();
    let mut x = Exporter {
        metrics: metrics
            .map_err(|e| tracing::warn!("--otlp {url}: {e}; no metrics are exported"))
            .ok(),
        spans: spans
            .map_err(|e| tracing::warn!("--otlp {url}: {e}; no spans are exported"))
            .ok(),
        url,
        start_ns: now_ns(),
        open: HashMap::new(),
        shared,
    };
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(every) => false,
            _ = stop.wait_for(|s| *s) => true,
        };
        x.round(stopping).await;
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use commscope_telemetry::metrics::{Def, registry};

    static G: Def = Def::gauge("t_ranks", "Ranks.", &["job_id"]);
    static C: Def = Def::counter("t_calls_total", "Calls.", &["job_id", "rank", "node", "op"]);
    static H: Def = Def::histogram("t_dur_seconds", "Duration.", &["job_id", "op"]);

    /// The test families (`t_…`) of a registry as one OTLP request.
    fn request_of(r: &prometheus::Registry) -> ExportMetricsServiceRequest {
        let fams: Vec<MetricFamily> = r
            .gather()
            .into_iter()
            .filter(|f| f.name().starts_with("t_"))
            .collect();
        metrics_request(&fams, 1, 2)
    }

    /// A resource's attributes as (key, text value).
    fn resource_pairs(rm: &pm::ResourceMetrics) -> Vec<(String, String)> {
        rm.resource
            .as_ref()
            .map(|r| {
                r.attributes
                    .iter()
                    .map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(pc::any_value::Value::StringValue(s)) => s.clone(),
                            _ => String::new(),
                        };
                        (kv.key.clone(), v)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn labels_job_node_rank_become_resources_and_histograms_are_per_bucket() {
        let r = registry(&[&G, &C, &H], |s| {
            s.value(&G, &["j1"], 4.0);
            s.value(&C, &["j1", "3", "n1", "allreduce"], 10.0);
            s.histogram(&H, &["j1", "allreduce"], &[0.1, 1.0], &[2, 5], 6, 3.5);
        })
        .expect("valid");
        let req = request_of(&r);
        assert_eq!(req.resource_metrics.len(), 2, "{req:#?}");
        let attrs = resource_pairs;
        let job = req
            .resource_metrics
            .iter()
            .find(|rm| attrs(rm).len() == 2)
            .expect("the job's resource");
        assert_eq!(
            attrs(job),
            [
                ("service.name".to_owned(), "commscope-collector".to_owned()),
                ("commscope.job.id".to_owned(), "j1".to_owned())
            ]
        );
        let ms = &job.scope_metrics[0].metrics;
        let hist = ms
            .iter()
            .find(|m| m.name == "t_dur_seconds")
            .expect("histogram");
        match &hist.data {
            Some(pm::metric::Data::Histogram(h)) => {
                assert_eq!(h.data_points[0].bucket_counts, [2, 3, 1]);
                assert_eq!(h.data_points[0].explicit_bounds, [0.1, 1.0]);
                assert_eq!(h.data_points[0].count, 6);
            }
            d => panic!("{d:?}"),
        }
        let rank = req
            .resource_metrics
            .iter()
            .find(|rm| attrs(rm).len() == 4)
            .expect("the rank's resource");
        assert!(attrs(rank).contains(&("commscope.rank".to_owned(), "3".to_owned())));
        let calls = &rank.scope_metrics[0].metrics[0];
        match &calls.data {
            Some(pm::metric::Data::Sum(s)) => {
                assert!(s.is_monotonic);
                assert_eq!(
                    s.data_points[0].attributes.len(),
                    1,
                    "op stays on the point"
                );
            }
            d => panic!("{d:?}"),
        }
    }

    static R: Def = Def::gauge(
        "t_rank_seconds",
        "Per rank.",
        &[
            "job_id",
            "namespace",
            "owner",
            "slurm_job_id",
            "rank",
            "node",
            "pod",
        ],
    );

    fn pairs(key: &ResourceKey) -> Vec<(&str, &str)> {
        key.iter().map(|(k, v)| (*k, v.as_str())).collect()
    }

    #[test]
    fn attribution_labels_become_kubernetes_resource_attributes() {
        let r = registry(&[&R], |s| {
            s.value(
                &R,
                &[
                    "j1",
                    "team-a",
                    "Job/train-7",
                    "",
                    "3",
                    "n1",
                    "train-7-worker-1",
                ],
                1.0,
            );
            // Outside Kubernetes: a Slurm job, no pod.
            s.value(&R, &["j2", "", "", "4242", "0", "n2", ""], 1.0);
        })
        .expect("valid");
        let req = request_of(&r);
        let mut resources: Vec<Vec<(String, String)>> =
            req.resource_metrics.iter().map(resource_pairs).collect();
        resources.sort();
        let s = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect()
        };
        assert_eq!(
            resources,
            [
                s(&[
                    ("service.name", "commscope-collector"),
                    ("commscope.job.id", "j1"),
                    ("commscope.node", "n1"),
                    ("commscope.rank", "3"),
                    ("k8s.namespace.name", "team-a"),
                    ("k8s.pod.name", "train-7-worker-1"),
                    ("commscope.owner", "Job/train-7"),
                    ("k8s.job.name", "train-7"),
                ]),
                s(&[
                    ("service.name", "commscope-collector"),
                    ("commscope.job.id", "j2"),
                    ("commscope.node", "n2"),
                    ("commscope.rank", "0"),
                    ("commscope.slurm.job.id", "4242"),
                ]),
            ]
        );
        // Every label was a resource's: nothing is left on the point.
        for rm in &req.resource_metrics {
            match &rm.scope_metrics[0].metrics[0].data {
                Some(pm::metric::Data::Gauge(g)) => assert!(g.data_points[0].attributes.is_empty()),
                d => panic!("{d:?}"),
            }
        }
    }

    #[test]
    fn a_finding_span_carries_its_rank_s_pod_and_its_job_s_owner() {
        let f = Finding {
            id: "f1".into(),
            kind: commscope_analyzer::Kind::DeadRank,
            class: commscope_analyzer::finding::Class::CommunicationHang,
            state: commscope_analyzer::finding::State::Open,
            job: "j1".into(),
            comm: None,
            seq: None,
            ranks: vec![5],
            nodes: vec!["n2".into()],
            link: None,
            opened_at: 10,
            resolved_at: None,
            confidence: 0.9,
            summary: "rank 5 died".into(),
            evidence: serde_json::json!({"attribution": {
                "namespace": "team-a",
                "owner": "PyTorchJob/llm",
                "pods": {"5": "llm-worker-2"},
            }}),
        };
        let (key, _) = finding_span(&f, 20);
        assert_eq!(
            pairs(&key),
            [
                ("commscope.job.id", "j1"),
                ("commscope.node", "n2"),
                ("commscope.rank", "5"),
                ("k8s.namespace.name", "team-a"),
                ("k8s.pod.name", "llm-worker-2"),
                ("commscope.owner", "PyTorchJob/llm"),
            ]
        );
        let c = SlowCall {
            rank: 1,
            node: "n1".into(),
            comm_id: 7,
            seq: 3,
            op: 0,
            bytes: 8,
            start_ns: 1,
            end_ns: 2,
            usual_s: 0.1,
        };
        let a = crate::state::JobAttribution {
            namespace: "team-a".into(),
            owner: "Deployment/x".into(),
            ..Default::default()
        };
        let (key, _) = slow_call_span("j1", &c, attribution_attrs(&a, None));
        assert_eq!(
            pairs(&key),
            [
                ("commscope.job.id", "j1"),
                ("commscope.node", "n1"),
                ("commscope.rank", "1"),
                ("k8s.namespace.name", "team-a"),
                ("commscope.owner", "Deployment/x"),
                ("k8s.deployment.name", "x"),
            ]
        );
    }
}
