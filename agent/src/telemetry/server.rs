//! The metrics listener: `/metrics` (Prometheus text), `/healthz` (the process answers)
//! and `/readyz` ([`super::health`]), on hyper's HTTP/1 server, in a thread of its own.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Path of the Prometheus scrape endpoint.
pub const METRICS_PATH: &str = "/metrics";
/// Path of the liveness endpoint.
pub const HEALTHZ_PATH: &str = "/healthz";
/// Path of the readiness endpoint.
pub const READYZ_PATH: &str = "/readyz";

/// What the endpoints need.
#[derive(Clone)]
pub(crate) struct State {
    pub(crate) handle: PrometheusHandle,
    pub(crate) ready_commit_intervals: u32,
}

/// Bounds on what clients of the listener can hold: it may be bound to every interface,
/// and a client that opens connections and sends nothing must not take the process's
/// file descriptors (which Kafka, Parquet and the catalog need).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections served at once; more are closed as soon as they are accepted.
    pub(crate) max_connections: usize,
    /// Time a client has to send a request's headers.
    pub(crate) header_timeout: Duration,
    /// Time a connection is kept at most (a keep-alive scraper simply reconnects).
    pub(crate) lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            header_timeout: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Serves connections accepted on `listener`, forever, within `limits`.
async fn serve(listener: TcpListener, state: State, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(
                max = limits.max_connections,
                "metrics listener: too many connections, closing a new one"
            );
            drop(stream);
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req| respond(state.clone(), req));
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.lifetime, connection).await {
                Ok(Err(e)) => tracing::debug!(error = %e, "metrics listener: connection error"),
                Ok(Ok(())) => {}
                Err(_) => tracing::debug!("metrics listener: connection closed after its lifetime"),
            }
        });
    }
}

/// Binds `addr` and serves it from a thread of its own (with its own small runtime), so
/// scrapes and probes are answered even while the pipelines keep every worker of the
/// agent's runtime busy. Returns the bound address.
pub(crate) fn spawn(addr: SocketAddr, state: State) -> std::io::Result<SocketAddr> {
    spawn_with(addr, state, Limits::default())
}

/// [`spawn`] with explicit limits.
pub(crate) fn spawn_with(
    addr: SocketAddr,
    state: State,
    limits: Limits,
) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("floe-metrics-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => serve(listener, state, limits).await,
                    Err(e) => {
                        tracing::error!(error = %e, "metrics listener: cannot register the socket")
                    }
                }
            })
        })?;
    Ok(local)
}

async fn respond(
    state: State,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(text(
            StatusCode::METHOD_NOT_ALLOWED,
            "only GET and HEAD\n".into(),
            "text/plain; charset=utf-8",
        ));
    }
    Ok(match req.uri().path() {
        METRICS_PATH => {
            let handle = state.handle.clone();
            let body = tokio::task::spawn_blocking(move || {
                super::process().collect();
                handle.render()
            })
            .await
            .unwrap_or_default();
            text(
                StatusCode::OK,
                body,
                "text/plain; version=0.0.4; charset=utf-8",
            )
        }
        HEALTHZ_PATH => text(StatusCode::OK, "ok\n".into(), "text/plain; charset=utf-8"),
        READYZ_PATH => {
            let readiness = super::health::readiness(state.ready_commit_intervals);
            let status = if readiness.is_ready() {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            text(status, readiness.to_string(), "text/plain; charset=utf-8")
        }
        _ => text(
            StatusCode::NOT_FOUND,
            format!("not found: try {METRICS_PATH}, {HEALTHZ_PATH} or {READYZ_PATH}\n"),
            "text/plain; charset=utf-8",
        ),
    })
}

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        let status = out[9..12].parse().expect("status");
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        (status, body)
    }

    #[test]
    fn serves_the_three_endpoints() {
        let recorder = crate::telemetry::builder().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            crate::telemetry::records_in("server-test", 7);
        });
        let addr = spawn(
            "127.0.0.1:0".parse().expect("addr"),
            State {
                handle,
                ready_commit_intervals: 3,
            },
        )
        .expect("bind");
        let metrics = get(addr, "/metrics");
        let health = get(addr, "/healthz");
        let missing = get(addr, "/nope");
        assert_eq!((metrics.0, health.0, missing.0), (200, 200, 404));
        assert!(
            metrics
                .1
                .contains("floe_records_in_total{pipeline=\"server-test\"} 7"),
            "{}",
            metrics.1
        );
        assert_eq!(health.1, "ok\n");
        // /readyz reflects the global registry, which other tests of this binary change:
        // its logic is tested in `health`; here only that it answers with a verdict.
        let ready = get(addr, "/readyz");
        assert!(ready.0 == 200 || ready.0 == 503, "{ready:?}");
        assert!(ready.1.starts_with("ready\n") || ready.1.starts_with("not ready\n"));
    }

    /// Idle connections cannot exhaust the process: past the cap new ones are closed at
    /// once, idle ones are closed after the header timeout, and the endpoints answer
    /// again afterwards.
    #[test]
    fn idle_connections_are_capped_and_timed_out() {
        let recorder = crate::telemetry::builder().build_recorder();
        let limits = Limits {
            max_connections: 8,
            header_timeout: Duration::from_secs(2),
            lifetime: Duration::from_secs(30),
        };
        let addr = spawn_with(
            "127.0.0.1:0".parse().expect("addr"),
            State {
                handle: recorder.handle(),
                ready_commit_intervals: 3,
            },
            limits,
        )
        .expect("bind");
        // Closed (or answered and closed) by the server within `d`; a read timeout is not.
        let closed_within = |s: &mut std::net::TcpStream, d: Duration| {
            s.set_read_timeout(Some(d)).unwrap();
            let mut buf = [0u8; 64];
            match s.read(&mut buf) {
                Ok(_answered_or_closed) => true,
                Err(e) => !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ),
            }
        };
        let mut idle: Vec<std::net::TcpStream> = (0..8)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut extra = std::net::TcpStream::connect(addr).unwrap();
        assert!(
            closed_within(&mut extra, Duration::from_secs(1)),
            "a connection past the cap is closed at once"
        );
        for s in &mut idle {
            assert!(
                closed_within(s, Duration::from_secs(5)),
                "an idle connection is closed after the header timeout"
            );
        }
        assert_eq!(get(addr, "/healthz").0, 200, "answers again");
    }
}
