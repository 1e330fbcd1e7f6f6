//! OTLP export: a real collector (`--otlp`) fed by `commscope simulate` exports to a receiver
//! built here on the `opentelemetry-proto` service definitions. It must get the metrics (the
//! same series as `/metrics`, with job, node and rank as resource attributes), a span for the
//! hang finding from its opening to its resolution, and spans of slow collective calls.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use commscope_tests::services::{Service, Services};
use commscope_tests::wait;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct Receiver {
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        r: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        self.metrics.lock().expect("lock").push(r.into_inner());
        Ok(Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        r: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        self.traces.lock().expect("lock").push(r.into_inner());
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

fn attr(kvs: &[KeyValue], key: &str) -> Option<String> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            any_value::Value::IntValue(i) => Some(i.to_string()),
            any_value::Value::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        })
}

/// Every span received so far, with its resource.
fn spans(rx: &Receiver) -> Vec<(Resource, Span)> {
    let mut out = Vec::new();
    for r in rx.traces.lock().expect("lock").iter() {
        for rs in &r.resource_spans {
            let res = rs.resource.clone().unwrap_or_default();
            for ss in &rs.scope_spans {
                for sp in &ss.spans {
                    out.push((res.clone(), sp.clone()));
                }
            }
        }
    }
    out
}

#[test]
fn metrics_finding_spans_and_slow_calls_reach_an_otlp_receiver() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let rx = Receiver::default();
    let server = tonic::transport::Server::builder()
        .add_service(MetricsServiceServer::new(rx.clone()))
        .add_service(TraceServiceServer::new(rx.clone()))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    rt.spawn(server);

    let otlp = format!("http://{addr}");
    let svc = Services::start(
        "node-otlp",
        &["--otlp", &otlp, "--otlp-interval", "1s"],
        &[],
    );
    // A job with a straggler (its peers' calls turn slow at its onset), then a job whose rank 5
    // never enters collective #20 and that ends after 25 s: the hang resolves when it ends.
    let run = |job: &str, fault: &str, seconds: &str| {
        let mut c = commscope_tests::commscope();
        c.args(["simulate", "--collector"])
            .arg(format!("http://{}", svc.grpc))
            .args(["--ranks", "16", "--duration", seconds, "--job-id", job])
            .args(["--fault", fault, "--slowdown", "4"]);
        Service::spawn(c, "simulate")
    };
    let _slow = run("otlp-slow", "straggler:3", "30");
    let mut hang = run("otlp-hang", "hang:5:20", "25");

    // Slow collective calls of the straggler job: spans whose resource is the waiting rank.
    let slow = wait("slow-call spans", Duration::from_secs(60), || {
        spans(&rx).into_iter().find(|(r, s)| {
            attr(&r.attributes, "commscope.job.id").as_deref() == Some("otlp-slow")
                && s.name.starts_with("allreduce #")
        })
    });
    let (res, span) = slow;
    assert!(attr(&res.attributes, "commscope.rank").is_some(), "{res:?}");
    assert!(
        attr(&res.attributes, "commscope.node").is_some_and(|n| n.starts_with("node-")),
        "{res:?}"
    );
    assert!(span.end_time_unix_nano > span.start_time_unix_nano);
    let usual: f64 = attr(&span.attributes, "commscope.usual_seconds")
        .and_then(|u| u.parse().ok())
        .expect("usual");
    let took = (span.end_time_unix_nano - span.start_time_unix_nano) as f64 / 1e9;
    assert!(took >= 4.0 * usual, "{took} s against a usual {usual} s");

    // The hang: opened, then resolved when the job ended; one span from one to the other.
    let _ = hang.child.wait();
    let finding = wait("the hang's span", Duration::from_secs(60), || {
        spans(&rx)
            .into_iter()
            .find(|(_, s)| s.name == "finding hang")
    });
    let (res, span) = finding;
    assert_eq!(
        attr(&res.attributes, "commscope.job.id").as_deref(),
        Some("otlp-hang")
    );
    assert_eq!(
        attr(&res.attributes, "commscope.rank").as_deref(),
        Some("5")
    );
    assert_eq!(
        attr(&res.attributes, "commscope.node").as_deref(),
        Some("node-000")
    );
    assert_eq!(
        attr(&res.attributes, "service.name").as_deref(),
        Some("commscope-collector")
    );
    assert_eq!(
        attr(&span.attributes, "commscope.finding.state").as_deref(),
        Some("resolved")
    );
    assert_eq!(
        attr(&span.attributes, "commscope.finding.ranks").as_deref(),
        Some("5")
    );
    assert_eq!(
        attr(&span.attributes, "commscope.seq").as_deref(),
        Some("20")
    );
    let summary = attr(&span.attributes, "commscope.finding.summary").expect("summary");
    assert!(
        summary.starts_with("rank 5 on node-000 has not entered"),
        "{summary}"
    );
    let (_, body) = svc.get("/api/v1/findings?job=otlp-hang");
    let api: serde_json::Value = serde_json::from_str(&body).expect("json");
    let f = &api["findings"][0];
    assert_eq!(
        span.start_time_unix_nano,
        f["opened_at"].as_u64().expect("opened")
    );
    assert_eq!(
        span.end_time_unix_nano,
        f["resolved_at"].as_u64().expect("resolved")
    );
    assert_eq!(
        span.status.as_ref().map(|s| s.code),
        Some(2),
        "a hang is an error span"
    );

    // The metrics: the job's series under the job's resource, a rank's under the rank's, the
    // histograms with their buckets.
    let m = rx.metrics.lock().expect("lock");
    assert!(!m.is_empty());
    let last_with = |job: &str, rank: Option<&str>, name: &str| {
        m.iter()
            .rev()
            .flat_map(|r| &r.resource_metrics)
            .filter(|rm| {
                let a = rm
                    .resource
                    .as_ref()
                    .map(|r| r.attributes.clone())
                    .unwrap_or_default();
                attr(&a, "commscope.job.id").as_deref() == Some(job)
                    && attr(&a, "commscope.rank").as_deref() == rank
            })
            .flat_map(|rm| rm.scope_metrics.iter().flat_map(|s| &s.metrics))
            .find(|x| x.name == name)
            .cloned()
    };
    let ranks = last_with("otlp-hang", None, "commscope_job_ranks").expect("job ranks");
    match ranks.data {
        Some(Data::Gauge(g)) => assert_eq!(
            g.data_points[0].value,
            Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(16.0))
        ),
        d => panic!("{d:?}"),
    }
    let calls = last_with("otlp-slow", Some("3"), "commscope_rank_calls_total").expect("rank 3");
    assert!(matches!(calls.data, Some(Data::Sum(ref s)) if s.is_monotonic));
    let hist = last_with("otlp-slow", None, "commscope_collective_duration_seconds")
        .expect("the duration histogram");
    match hist.data {
        Some(Data::Histogram(h)) => {
            let p = &h.data_points[0];
            assert_eq!(p.bucket_counts.len(), p.explicit_bounds.len() + 1);
            assert_eq!(p.bucket_counts.iter().sum::<u64>(), p.count);
            assert!(p.count > 0);
            assert!(attr(&p.attributes, "op").is_some() && attr(&p.attributes, "comm").is_some());
        }
        d => panic!("{d:?}"),
    }
    // The exporter's own counters say every export went through.
    let (_, metrics) = svc.get("/metrics");
    assert!(
        metrics.contains("commscope_collector_otlp_exports_total{signal=\"spans\",result=\"ok\"}"),
        "{metrics}"
    );
    assert!(!metrics.contains("result=\"error\""), "{metrics}");
}
