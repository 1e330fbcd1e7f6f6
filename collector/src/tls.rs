//! The collector's TLS listeners (`--tls-cert`, `--tls-key`, `--tls-ca`: docs/security.md):
//! connections are accepted and their handshakes done here, for gRPC (ALPN `h2`, client
//! certificates required with a CA) and HTTP (`http/1.1`), so that a refused handshake — a
//! client certificate no trusted CA signed, a client that does not speak TLS — is counted
//! (`commscope_collector_refused_total{reason="tls"}`) and logged like a refused token.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use crate::Shared;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connections accepted on `listener` until `stop`, each handshake on its own task.
pub(crate) fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
    what: &'static str,
    mut stop: watch::Receiver<bool>,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = stopped(&mut stop) => return,
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, shared) = (acceptor.clone(), tx.clone(), shared.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => refused(&shared, what, peer, &e.to_string()),
                    Err(_) => refused(&shared, what, peer, "no TLS handshake within 10 s"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// Resolves once a stop is requested (the watch guard is never held across an await).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await.map(|_| ());
}

fn refused(shared: &Shared, what: &str, peer: SocketAddr, why: &str) {
    crate::auth::refused(
        shared,
        "tls",
        what,
        Some(peer),
        &format!("TLS handshake failed: {why}"),
    );
}

/// Serves the HTTP side over TLS until `stop`.
pub(crate) async fn serve_https(
    listener: TcpListener,
    app: axum::Router,
    config: Arc<rustls::ServerConfig>,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    use tokio_stream::StreamExt;
    let mut conns = incoming(
        listener,
        config,
        shared,
        "an HTTPS connection",
        stop.clone(),
    );
    let mut stop = stop;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            s = conns.next() => match s {
                Some(Ok(s)) => s,
                Some(Err(_)) => continue,
                None => break,
            },
            _ = stopped(&mut stop) => break,
        };
        let peer = stream.get_ref().0.peer_addr().ok();
        let app = app.clone();
        tasks.spawn(async move {
            let svc = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    if let Some(p) = peer {
                        req.extensions_mut().insert(axum::extract::ConnectInfo(p));
                    }
                    let mut app = app.clone();
                    async move {
                        tower_service::Service::call(&mut app, req.map(axum::body::Body::new)).await
                    }
                },
            );
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
        });
        while tasks.try_join_next().is_some() {}
    }
    tasks.abort_all();
}
