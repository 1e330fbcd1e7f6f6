//! The collector's HTTP side: `/healthz`, `/readyz`, `/metrics`, `/api/v1/collector`,
//! `/api/v1/jobs`, `/api/v1/jobs/{job}`, `/api/v1/findings`. With `--peers`, the API answers for every
//! replica's jobs ([`crate::peers`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use commscope_wire::hash::format_comm_id;
use commscope_wire::op::Op;
use serde::Serialize;

use commscope_analyzer::Finding;

use crate::Shared;
use crate::state::{InFlightCall, JobAttribution, JobState};

/// The routes.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/collector", get(collector_status))
        .merge(api_routes())
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            crate::auth::http_check,
        ))
        .with_state(shared)
}

/// The JSON API's routes (also what another replica asks through the query service).
fn api_routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/api/v1/jobs", get(jobs))
        .route("/api/v1/jobs/{job}", get(job))
        .route("/api/v1/findings", get(findings))
}

/// Answers a JSON API request another replica forwarded (`path` with its query), from this
/// replica's jobs only: the status and the body.
pub async fn answer_local(shared: Arc<Shared>, path: &str) -> (u16, Vec<u8>) {
    if !path.starts_with("/api/v1/") {
        return (404, b"{\"error\":\"only /api/v1/ is forwarded\"}".to_vec());
    }
    let Ok(req) = axum::http::Request::builder()
        .uri(path)
        .header(crate::peers::LOCAL, "1")
        .body(axum::body::Body::empty())
    else {
        return (400, b"{\"error\":\"bad path\"}".to_vec());
    };
    let mut svc = api_routes().with_state(shared);
    let resp = match tower_service::Service::call(&mut svc, req).await {
        Ok(r) => r,
        Err(e) => match e {},
    };
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .map(|b| b.to_vec())
        .unwrap_or_default();
    (status, body)
}

/// Whether to ask the other replicas too: there are some, and the request is not from one.
fn fan_out(s: &Shared, headers: &HeaderMap) -> bool {
    !s.peers.is_empty() && !headers.contains_key(crate::peers::LOCAL)
}

/// Adds the other replicas' answers to `path`: the items of their `key` array whose `id`
/// field this replica's do not have. Returns the replicas that did not answer.
async fn merge_peers(
    s: &Shared,
    path: &str,
    key: &str,
    id: &str,
    into: &mut Vec<serde_json::Value>,
) -> Vec<serde_json::Value> {
    let mut seen: std::collections::HashSet<String> = into
        .iter()
        .filter_map(|v| v[id].as_str().map(str::to_owned))
        .collect();
    let mut unreachable = Vec::new();
    for (url, answer) in s.peers.api(path).await {
        match answer {
            Ok(mut v) => {
                if let serde_json::Value::Array(items) = v[key].take() {
                    for item in items {
                        if let Some(k) = item[id].as_str()
                            && seen.insert(k.to_owned())
                        {
                            into.push(item);
                        }
                    }
                }
            }
            Err(e) => unreachable.push(serde_json::json!({ "replica": url, "error": e })),
        }
    }
    unreachable
}

async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    }
}

/// This replica itself: its memory against its bound (overload), and how hard it samples.
async fn collector_status(State(s): State<Arc<Shared>>) -> Response {
    let (factor, budget, lag_divisor, offered) = {
        let p = s.sampling.lock().unwrap_or_else(|p| p.into_inner());
        (p.factor, p.budget, p.lag.divisor, p.offered)
    };
    axum::Json(serde_json::json!({
        "memory": s.memory.status(),
        "sampling": {
            "factor": factor.max(1),
            "offered_calls_per_s": offered.round(),
            "budget_calls_per_s": budget.round(),
            "lag_divisor": lag_divisor,
        },
        "uptime_s": s.started.elapsed().as_secs_f64(),
    }))
    .into_response()
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            commscope_telemetry::metrics::CONTENT_TYPE,
        )],
        crate::metrics::render(&s),
    )
        .into_response()
}

/// A job in the list.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct JobLine {
    pub job: String,
    /// `running` or `ended`.
    pub state: String,
    pub flavour: String,
    pub ranks: usize,
    pub world_size: i32,
    pub nodes: Vec<String>,
    pub records: u64,
    pub in_flight: usize,
    pub dropped: u64,
    pub first_seen_ns: u64,
    pub last_seen_ns: u64,
    /// Its Kubernetes namespace and owning workload, Slurm job, torchrun run (omitted when
    /// none is known).
    #[serde(default, skip_serializing_if = "JobAttribution::is_empty")]
    pub attribution: JobAttribution,
    /// While it runs: what the collector can see of it (how far behind it is judged, nodes
    /// behind or out of contact; `note` says it in a sentence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact: Option<serde_json::Value>,
}

/// Summary line of a job.
pub fn job_line(j: &JobState) -> JobLine {
    JobLine {
        job: j.job.clone(),
        state: j.state_name().into(),
        flavour: j.flavour.clone(),
        ranks: j.rank_count(),
        world_size: j.world_size,
        nodes: j.nodes(),
        records: j.records,
        in_flight: j.in_flight().len(),
        dropped: j.dropped(),
        first_seen_ns: j.first_seen_ns,
        last_seen_ns: j.last_seen_ns,
        attribution: j.attribution.clone(),
        contact: None,
    }
}

#[derive(Debug, serde::Deserialize)]
struct JobsQuery {
    state: Option<String>,
}

async fn jobs(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: Uri,
    Query(q): Query<JobsQuery>,
) -> Response {
    let mut v = all_jobs(&s);
    v.retain(|j| q.state.as_deref().is_none_or(|want| want == j.state));
    with_peers(&s, &headers, &uri, "jobs", "job", &v).await
}

/// `{key: items}` from this replica — and, unless the request came from another replica, the
/// other replicas' items whose `id` field is new, sorted by it, with `unreachable` naming the
/// replicas that did not answer.
async fn with_peers<T: Serialize>(
    s: &Shared,
    headers: &HeaderMap,
    uri: &Uri,
    key: &str,
    id: &str,
    local: &[T],
) -> Response {
    if !fan_out(s, headers) {
        return axum::Json(serde_json::json!({ key: local })).into_response();
    }
    let mut items: Vec<serde_json::Value> = local
        .iter()
        .filter_map(|x| serde_json::to_value(x).ok())
        .collect();
    let unreachable = merge_peers(s, &path_of(uri), key, id, &mut items).await;
    items.sort_by(|a, b| a[id].as_str().cmp(&b[id].as_str()));
    axum::Json(serde_json::json!({ key: items, "unreachable": unreachable })).into_response()
}

fn path_of(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned())
}

/// Every job: those in memory, and those on disk (ended, or from before a restart), by name.
pub fn all_jobs(s: &Shared) -> Vec<JobLine> {
    let mut v: Vec<JobLine> = s
        .state
        .iter()
        .flat_map(|st| st.jobs.values().map(job_line).collect::<Vec<_>>())
        .collect();
    for line in &mut v {
        line.contact = contact_of(s, &line.job);
    }
    let live: std::collections::HashSet<String> = v.iter().map(|j| j.job.clone()).collect();
    v.extend(s.history.jobs(&|j| live.contains(j)));
    v.sort_by(|a, b| a.job.cmp(&b.job));
    v
}

/// What the collector can see of a running job, as the API says it.
pub fn contact_of(s: &Shared, job: &str) -> Option<serde_json::Value> {
    let e = s.findings.lock().unwrap_or_else(|p| p.into_inner());
    let st = e.job_standing(job)?;
    let mut v = serde_json::to_value(st).ok()?;
    v["behind"] = serde_json::Value::Bool(st.behind());
    let mut note = st.phrase();
    drop(e);
    if let Some(o) = s.memory.overload() {
        note = format!("{}; {note}", s.memory.note());
        v["overload"] = o;
    }
    v["note"] = serde_json::Value::String(note);
    Some(v)
}

/// Every finding: the live engine's, and those stored for jobs no longer in memory.
pub fn all_findings(s: &Shared, job: Option<&str>) -> Vec<Finding> {
    let (live_jobs, mut v): (std::collections::HashSet<String>, Vec<Finding>) = {
        let live = s.state.job_names().into_iter().collect();
        let e = s.findings.lock().unwrap_or_else(|p| p.into_inner());
        let v = e
            .tracker
            .all()
            .into_iter()
            .filter(|f| job.is_none_or(|j| j == f.job))
            .collect();
        (live, v)
    };
    let known: std::collections::HashSet<String> = v.iter().map(|f| f.id.clone()).collect();
    v.extend(
        s.history
            .findings(job, &|j| live_jobs.contains(j))
            .into_iter()
            .filter(|f| !known.contains(&f.id)),
    );
    v.sort_by(|a, b| (a.opened_at, &a.id).cmp(&(b.opened_at, &b.id)));
    v
}

/// One communicator in a job's detail.
#[derive(Debug, Serialize)]
pub struct CommDetail {
    pub comm_id: String,
    pub size: i32,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Global ranks seen on it.
    pub ranks: Vec<i32>,
    /// Calls per op, one per rank per call (like `trace summary`).
    pub ops: BTreeMap<String, u64>,
    pub bytes: BTreeMap<String, u64>,
    /// Per global rank: collectives completed (highest completed `seq` + 1).
    pub progress: BTreeMap<i32, u64>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub local_id: bool,
}

/// One process in a job's detail.
#[derive(Debug, Serialize)]
pub struct ProcessDetail {
    pub rank: i32,
    pub node: String,
    pub pid: u32,
    /// Its Kubernetes pod and container (omitted when unknown).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container: String,
    pub state: &'static str,
    /// It shut down cleanly (MPI_Finalize) before it ended.
    pub finalized: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub records: u64,
    pub calls: u64,
    pub last_seen_ns: u64,
    pub dropped: u64,
    /// `dropped` by reason (omitted when nothing was dropped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_by_reason: Option<BTreeMap<&'static str, u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_offset_ns: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_error_ns: Option<u64>,
}

/// A job's detail (`GET /api/v1/jobs/{job}`).
#[derive(Debug, Serialize)]
pub struct JobDetail {
    #[serde(flatten)]
    pub line: JobLine,
    pub comms: Vec<CommDetail>,
    pub p2p: BTreeMap<&'static str, u64>,
    pub in_flight: Vec<InFlightCall>,
    pub processes: Vec<ProcessDetail>,
    /// Communicators seen but not kept (over the per-job limit).
    pub comms_not_kept: u64,
}

/// The detail of a job.
pub fn job_detail(j: &JobState) -> JobDetail {
    let mut comms: Vec<CommDetail> = j
        .comms
        .iter()
        .map(|(id, c)| {
            let mut ops = BTreeMap::new();
            let mut bytes = BTreeMap::new();
            for (op, s) in &c.ops {
                let name = Op::from_code(*op).name().to_owned();
                *ops.entry(name.clone()).or_insert(0) += s.calls;
                *bytes.entry(name).or_insert(0) += s.bytes;
            }
            CommDetail {
                comm_id: format_comm_id(*id),
                size: c.size,
                name: c.name.clone(),
                ranks: c.progress.keys().copied().collect(),
                ops,
                bytes,
                progress: c.progress.clone(),
                local_id: c.local_id,
            }
        })
        .collect();
    comms.sort_by(|a, b| (b.size, &a.comm_id).cmp(&(a.size, &b.comm_id)));
    let mut p2p = BTreeMap::new();
    p2p.insert("send", j.comms.values().map(|c| c.p2p_sends).sum());
    p2p.insert("recv", j.comms.values().map(|c| c.p2p_recvs).sum());
    let mut processes: Vec<ProcessDetail> = j
        .ranks
        .values()
        .map(|r| ProcessDetail {
            rank: r.rank,
            node: r.node.clone(),
            pid: r.pid,
            pod: r.pod.clone(),
            container: r.container.clone(),
            state: r.status.name(),
            finalized: r.finalized,
            exit_status: r.exit_status,
            signal: r.signal,
            records: r.records,
            calls: r.calls,
            last_seen_ns: r.last_seen_ns,
            dropped: r.dropped(),
            dropped_by_reason: (r.dropped() > 0).then(|| {
                BTreeMap::from([
                    ("ring_full", r.dropped_ring_full),
                    ("in_flight_table", r.dropped_in_flight),
                    ("other", r.dropped_other),
                    ("overrun", r.dropped_overrun),
                ])
            }),
            clock_offset_ns: r.clock.map(|c| c.offset_ns),
            clock_error_ns: r.clock.map(|c| c.error_ns),
        })
        .collect();
    processes.sort_by_key(|p| (p.rank, p.pid));
    JobDetail {
        line: job_line(j),
        comms,
        p2p,
        in_flight: j.in_flight(),
        processes,
        comms_not_kept: j.comms_dropped,
    }
}

async fn job(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: Uri,
    Path(name): Path<String>,
) -> Response {
    let here = s.state.of(&name).jobs.contains_key(&name);
    // Not in this replica's memory: the replica that holds it live answers first.
    if !here && fan_out(&s, &headers) {
        for (_, answer) in s.peers.api(&path_of(&uri)).await {
            if let Ok(v) = answer {
                return axum::Json(v).into_response();
            }
        }
    }
    let live = {
        let st = s.state.of(&name);
        st.jobs.get(&name).map(job_detail)
    };
    let findings = all_findings(&s, Some(&name));
    if let Some(mut d) = live {
        d.line.contact = contact_of(&s, &name);
        let mut v = serde_json::to_value(d).unwrap_or_default();
        v["findings"] = serde_json::to_value(findings).unwrap_or_default();
        return axum::Json(v).into_response();
    }
    match s.history.job(&name) {
        // Released from memory, or from before a restart: its summary and findings, and where
        // its trace is (`commscope analyze` reads it).
        Some(line) => {
            let mut v = serde_json::to_value(line).unwrap_or_default();
            v["findings"] = serde_json::to_value(findings).unwrap_or_default();
            v["trace"] = serde_json::Value::String(
                s.config
                    .trace_dir
                    .join(commscope_wire::cst::sanitize(&name))
                    .display()
                    .to_string(),
            );
            axum::Json(v).into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({
                "error": format!("no job {name:?} is known to this collector, in memory or on disk")
            })),
        )
            .into_response(),
    }
}

#[derive(Debug, serde::Deserialize)]
struct FindingsQuery {
    job: Option<String>,
    state: Option<String>,
}

/// `GET /api/v1/findings[?job=&state=open|resolved]`.
async fn findings(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    uri: Uri,
    Query(q): Query<FindingsQuery>,
) -> Response {
    let mut v = all_findings(&s, q.job.as_deref());
    v.retain(|f| {
        q.state.as_deref().is_none_or(|w| match f.state {
            commscope_analyzer::finding::State::Open => w == "open",
            commscope_analyzer::finding::State::Resolved => w == "resolved",
        })
    });
    with_peers(&s, &headers, &uri, "findings", "id", &v).await
}
