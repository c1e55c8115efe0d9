//! Serving the API over HTTP/1.1 with the bounds an internet-facing listener
//! needs: a cap on open connections, a deadline for a request's headers
//! (slowloris), and an idle timeout between kept-alive requests.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::tls::Acceptor as TlsAcceptor;
use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::config::TrustedProxies;
use tower::ServiceExt as _;

/// Limits of the HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Accepts until `stop` flips; each connection is served until it closes,
/// idles out, or the server stops (in-flight requests finish first).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    proxies: Arc<TrustedProxies>,
    mut stop: watch::Receiver<bool>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => {
                    // EMFILE and friends: back off, keep serving.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            metrics::counter!("mpush_http_connections_refused_total").increment(1);
            drop(stream);
            continue;
        };
        let app = app.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        let proxies = proxies.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = stream.set_nodelay(true);
            match tls {
                None => connection(stream, peer, app, limits, proxies, stop).await,
                // The TLS handshake within the header deadline (slowloris).
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_timeout, acceptor.accept(stream)).await
                    {
                        Ok(Ok(s)) => connection(s, peer, app, limits, proxies, stop).await,
                        _ => {
                            metrics::counter!("mpush_tls_handshake_errors_total").increment(1);
                        }
                    }
                }
            }
        });
    }
}

async fn connection<S>(
    stream: S,
    peer: SocketAddr,
    app: Router,
    limits: HttpLimits,
    proxies: Arc<TrustedProxies>,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(AtomicU64::new(0));
    let started = tokio::time::Instant::now();
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
        started,
    });
    let svc = app.map_request(move |mut req: axum::extract::Request<_>| {
        // The client's address: the peer, or (from a trusted proxy) the one
        // it forwarded for; `Forwarded` also says if the client used TLS.
        let f = proxies.resolve(
            peer.ip(),
            &crate::forwarded::ForwardingHeaders::from_headers(req.headers()),
        );
        // An unknown client (malformed forwarding) is `[::]:0`: never loopback.
        let client = if f.client == crate::forwarded::ClientIp::Known(peer.ip().to_canonical()) {
            peer
        } else {
            SocketAddr::new(f.ip(), 0)
        };
        req.extensions_mut().insert(ConnectInfo(client));
        req.extensions_mut().insert(f);
        req
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true)
        .serve_connection(io, TowerToHyperService::new(svc));
    tokio::pin!(conn);
    let tick = (limits.idle_timeout / 4).max(Duration::from_millis(25));
    let mut closing = false;
    loop {
        tokio::select! {
            _ = &mut conn => return,
            _ = stop.changed(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tokio::time::sleep(tick), if !closing => {
                let last = Duration::from_millis(activity.load(Ordering::Relaxed));
                if started.elapsed().saturating_sub(last) >= limits.idle_timeout {
                    metrics::counter!("mpush_http_idle_closed_total").increment(1);
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A socket that notes when it last moved bytes.
struct Watched<S> {
    inner: S,
    activity: Arc<AtomicU64>,
    started: tokio::time::Instant,
}

impl<S> Watched<S> {
    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.activity.store(ms, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
