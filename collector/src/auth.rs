//! The collector's side of the shared token (`--auth-token-file`, docs/security.md): with one
//! configured, every gRPC request (agent streams, the query service) and every HTTP request but
//! the health checks must carry it. Each refusal is counted
//! (`commscope_collector_refused_total{reason="auth"}`) and logged, once a minute per client
//! address and kind of request at most (an agent with a wrong token retries every few seconds).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request as HttpRequest, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::{Request, Status};

use crate::Shared;

/// How often a refused client's address is logged again.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Counts (under `reason`) and, once a minute per client address at most, logs one refused
/// request or connection.
pub(crate) fn refused(
    shared: &Shared,
    reason: &'static str,
    what: &str,
    peer: Option<SocketAddr>,
    why: &str,
) {
    shared.metrics.refused(reason);
    let now = Instant::now();
    let log = match peer {
        Some(p) => {
            let mut seen = shared
                .metrics
                .auth_logged
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let key = (p.ip(), what.to_owned());
            let due = seen
                .get(&key)
                .is_none_or(|t| now.duration_since(*t) >= LOG_EVERY);
            if due {
                seen.insert(key, now);
            }
            due
        }
        None => true,
    };
    if log {
        tracing::warn!(
            "refused {what} from {}: {why}",
            peer.map_or_else(|| "an unknown address".to_owned(), |p| p.to_string())
        );
    }
}

/// The gRPC services' interceptor: the token, when one is configured.
pub(crate) fn grpc_check(
    shared: Arc<Shared>,
    what: &'static str,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let Some(token) = &shared.config.auth_token else {
            return Ok(req);
        };
        match token.check(&req) {
            Ok(()) => Ok(req),
            Err(status) => {
                refused(&shared, "auth", what, req.remote_addr(), status.message());
                Err(status)
            }
        }
    }
}

/// The HTTP side's middleware: the token on everything but `/healthz` and `/readyz` (which
/// orchestrators probe without credentials, and which say nothing about jobs).
pub(crate) async fn http_check(
    State(shared): State<Arc<Shared>>,
    req: HttpRequest,
    next: Next,
) -> Response {
    let Some(token) = &shared.config.auth_token else {
        return next.run(req).await;
    };
    if matches!(req.uri().path(), "/healthz" | "/readyz") {
        return next.run(req).await;
    }
    let given = req.headers().get(header::AUTHORIZATION);
    if token.accepts(given.map(|v| v.as_bytes())) {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let why = if given.is_none() {
        "no token"
    } else {
        "a wrong token"
    };
    refused(&shared, "auth", "an HTTP request", peer, why);
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this collector requires a token: send `Authorization: Bearer <token>`\n",
    )
        .into_response()
}
