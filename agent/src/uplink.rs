//! The stream to a collector: connect (TLS and token as configured), say hello, relay the
//! acknowledgements, and reconnect with backoff when it ends. The agent and the simulator's
//! agents both stream through it.

use std::time::Duration;

use commscope_wire::grpc::ingest_client::IngestClient;
use commscope_wire::grpc::ingest_request::Payload;
use commscope_wire::grpc::{AgentHello, IngestAck, IngestRequest};
use commscope_wire::record::RECORD_LAYOUT_VERSION;
use tokio::sync::{mpsc, watch};

use crate::daemon::{now_real, stop_requested, stopped};

/// What a stream to replica `.0` did.
#[derive(Debug)]
pub enum Link {
    /// It opened (the hello sent, at `.2`, realtime ns): requests go through this sender until
    /// it ends.
    Connected(usize, mpsc::Sender<IngestRequest>, u64),
    /// The collector answered a request (and when the answer came, realtime ns).
    Ack(usize, IngestAck, u64),
    /// It ended, or could not be opened: why.
    Disconnected(usize, String),
}

/// An error with its causes, as one line (tonic's transport errors say little by themselves).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// Whether an error is TLS refusing a certificate (either side's), not the network failing.
fn is_tls_refusal(why: &str) -> bool {
    let w = why.to_ascii_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "alert",
        "unknownca",
        "unknown ca",
    ]
    .iter()
    .any(|k| w.contains(k))
}

/// How a refusal of the agent's credentials (its token, its TLS certificate) begins.
pub const AUTH_REFUSED: &str = "the collector refused this agent's credentials";

/// Whom a stream is to and as whom.
#[derive(Clone, Debug)]
pub struct Target {
    /// The index its [`Link`] events carry (the replica, or the simulated node).
    pub replica: usize,
    pub url: String,
    /// The node it speaks for (in its hello).
    pub node: String,
    pub token: Option<commscope_wire::auth::Token>,
    pub tls: commscope_wire::tls::TlsFiles,
    /// Log each distinct failure to connect once.
    pub log_failures: bool,
}

/// Keeps one stream to the collector open, reconnecting with backoff: each stream it opens
/// (the hello sent) goes to `events` as [`Link::Connected`], with every acknowledgement and its
/// end. What to send, and to send again after a reconnect, is the caller's.
pub async fn run<E: From<Link> + Send + 'static>(
    target: Target,
    events: mpsc::Sender<E>,
    mut stop: watch::Receiver<bool>,
) {
    let Target {
        replica,
        url,
        node,
        token,
        tls,
        log_failures,
    } = target;
    let mut backoff = Duration::from_millis(100);
    // Failures to connect since the last success, each logged once (it retries every few
    // seconds).
    let mut logged: std::collections::HashSet<String> = Default::default();
    loop {
        if stop_requested(&stop) {
            return;
        }
        let attempt = async {
            let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
                .map_err(|e| format!("bad collector address {url}: {e}"))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                // Pings on the connection: a collector cut off is noticed within seconds (the
                // batches then go to the spool).
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(10))
                .keep_alive_while_idle(true);
            let endpoint = tls
                .endpoint(endpoint, &url)
                .map_err(|e| format!("{AUTH_REFUSED}: {e}"))?;
            let channel = endpoint.connect().await.map_err(|e| {
                let why = error_chain(&e);
                // A TLS refusal (a certificate either side does not trust) is a
                // credentials problem, not the network's.
                if is_tls_refusal(&why) {
                    format!("{AUTH_REFUSED}: TLS to {url}: {why}")
                } else {
                    format!("cannot reach the collector at {url}: {why}")
                }
            })?;
            let mut client = IngestClient::with_interceptor(
                channel,
                commscope_wire::auth::Token::interceptor(token.clone()),
            )
            .max_decoding_message_size(16 << 20)
            .max_encoding_message_size(64 << 20);
            let (tx, rx) = mpsc::channel::<IngestRequest>(1024);
            let hello_ns = now_real();
            tx.send(IngestRequest {
                batch_id: 0,
                agent_send_ns: hello_ns,
                payload: Some(Payload::Hello(AgentHello {
                    node: node.clone(),
                    agent_version: env!("CARGO_PKG_VERSION").into(),
                    layout_version: RECORD_LAYOUT_VERSION,
                })),
            })
            .await
            .map_err(|_| "stream closed".to_string())?;
            let resp = client
                .stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(|e| {
                    let mut why = e.message().to_owned();
                    if let Some(src) = std::error::Error::source(&e) {
                        let rest = error_chain(src);
                        why = if rest.starts_with(&why) {
                            rest
                        } else {
                            format!("{why}: {rest}")
                        };
                    }
                    if e.code() == tonic::Code::Unauthenticated || is_tls_refusal(&why) {
                        format!("{AUTH_REFUSED}: {why}")
                    } else {
                        format!("the collector refused the stream: {why}")
                    }
                })?;
            Ok::<_, String>((tx, resp.into_inner(), hello_ns))
        };
        let (tx, mut acks, hello_ns) = match attempt.await {
            Ok(x) => x,
            Err(e) => {
                // Each distinct failure once (it retries every few seconds): a refusal of the
                // agent's credentials as an error, anything else as a warning.
                if log_failures && logged.len() < 16 && logged.insert(e.clone()) {
                    if e.starts_with(AUTH_REFUSED) {
                        tracing::error!(
                            "{e}; records wait in the rings and the spool until the credentials are right (--auth-token-file, --tls-cert)"
                        );
                    } else {
                        tracing::warn!("{e}; retrying");
                    }
                }
                let _ = events.send(E::from(Link::Disconnected(replica, e))).await;
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped(&mut stop) => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        logged.clear();
        if events
            .send(E::from(Link::Connected(replica, tx, hello_ns)))
            .await
            .is_err()
        {
            return;
        }
        let reason = loop {
            tokio::select! {
                m = acks.message() => match m {
                    Ok(Some(a)) => {
                        if events.send(E::from(Link::Ack(replica, a, now_real()))).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => break "the collector closed the stream".to_string(),
                    Err(e) => break format!("the collector stream failed: {}", e.message()),
                },
                _ = stopped(&mut stop) => return,
            }
        };
        let _ = events
            .send(E::from(Link::Disconnected(replica, reason)))
            .await;
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stopped(&mut stop) => return,
        }
    }
}
