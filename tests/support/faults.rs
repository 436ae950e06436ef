//! A TCP fault proxy for the fault-injection tests: it sits between the agent and a real
//! service (broker, REST catalog, S3, registry) on a loopback port and, on command,
//! refuses connections, drops the open ones, pauses traffic (each direction on its own)
//! or adds latency. Its HTTP mode also reads each request and can answer it with a
//! status of its choice (the catalog answering 503 for a minute, a 409 on a commit, a
//! canned body) instead of forwarding it: faults a real service cannot produce on demand.
//!
//! Plain threads and blocking sockets: it runs beside any runtime and stops on drop.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Which way bytes travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the client (the agent) to the service.
    Upstream,
    /// From the service back to the client.
    Downstream,
}

/// An HTTP answer the proxy gives instead of forwarding a matching request.
#[derive(Debug, Clone)]
pub struct HttpFault {
    /// Method to match (`None`: any).
    pub method: Option<String>,
    /// A substring of the request path (with the query) to match.
    pub path_contains: String,
    /// Status to answer.
    pub status: u16,
    /// Body to answer (JSON).
    pub body: String,
    /// Extra response headers, e.g. `("Retry-After", "1")`.
    pub headers: Vec<(String, String)>,
    /// How many requests it answers (`None`: until `until` or removed).
    pub times: Option<u32>,
    /// Until when it applies (`None`: until `times` runs out or removed).
    pub until: Option<Instant>,
    /// Instead of answering, hold the request until [`FaultProxy::clear`], then forward it.
    pub hold: bool,
    /// Only paths (without the query) ending with this.
    pub ending: Option<String>,
}

impl HttpFault {
    /// Answers every request whose path contains `path_contains` with `status`.
    pub fn status(path_contains: &str, status: u16) -> HttpFault {
        HttpFault {
            method: None,
            path_contains: path_contains.to_string(),
            status,
            body: format!(
                r#"{{"error":{{"message":"injected by the fault proxy","type":"FaultProxy","code":{status}}}}}"#
            ),
            headers: Vec::new(),
            times: None,
            until: None,
            hold: false,
            ending: None,
        }
    }

    /// Holds matching requests until [`FaultProxy::clear`], then forwards them.
    pub fn hold(path_contains: &str) -> HttpFault {
        HttpFault {
            hold: true,
            ..HttpFault::status(path_contains, 0)
        }
    }

    /// Only paths ending with `suffix` (the query left out).
    pub fn ending(mut self, suffix: &str) -> HttpFault {
        self.ending = Some(suffix.to_string());
        self
    }

    /// Only for requests with this method.
    pub fn method(mut self, method: &str) -> HttpFault {
        self.method = Some(method.to_string());
        self
    }

    /// Only the next `n` matching requests.
    pub fn times(mut self, n: u32) -> HttpFault {
        self.times = Some(n);
        self
    }

    /// Only for `d` from now.
    pub fn for_duration(mut self, d: Duration) -> HttpFault {
        self.until = Some(Instant::now() + d);
        self
    }

    /// With this body instead of an Iceberg error model.
    pub fn body(mut self, body: &str) -> HttpFault {
        self.body = body.to_string();
        self
    }

    /// With an extra response header.
    pub fn header(mut self, name: &str, value: &str) -> HttpFault {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    fn matches(&self, method: &str, path: &str) -> bool {
        self.method.as_deref().is_none_or(|m| m == method)
            && path.contains(&self.path_contains)
            && self
                .ending
                .as_deref()
                .is_none_or(|e| path.split('?').next().unwrap_or("").ends_with(e))
            && self.until.is_none_or(|u| Instant::now() < u)
            && self.times.is_none_or(|n| n > 0)
    }
}

#[derive(Default)]
struct State {
    stop: AtomicBool,
    refusing: AtomicBool,
    paused_up: AtomicBool,
    paused_down: AtomicBool,
    latency_up_ms: AtomicU64,
    latency_down_ms: AtomicU64,
    /// Open client and upstream sockets (clones), for dropping them all.
    open: Mutex<std::collections::HashMap<u64, TcpStream>>,
    next_id: AtomicU64,
    http: Option<Mutex<Vec<HttpFault>>>,
    /// Requests answered by a fault, and requests forwarded (HTTP mode).
    injected: AtomicU64,
    forwarded: AtomicU64,
    /// `METHOD path` of every request seen, with when (HTTP mode).
    log: Mutex<Vec<(Instant, String)>>,
    /// Requests being held (HTTP mode).
    held: AtomicU64,
    /// Bumped by `clear`: held requests go on.
    generation: AtomicU64,
}

/// A fault proxy on `127.0.0.1:PORT` in front of `upstream`, stopped on drop.
pub struct FaultProxy {
    /// `127.0.0.1:PORT` clients connect to.
    pub addr: SocketAddr,
    upstream: String,
    state: Arc<State>,
    listener: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl FaultProxy {
    /// A TCP proxy to `upstream` (`host:port`).
    pub fn tcp(upstream: &str) -> Result<FaultProxy> {
        FaultProxy::start(upstream, false)
    }

    /// An HTTP/1.1 proxy to `upstream` that can answer requests itself (see [`HttpFault`]).
    /// It forwards one request per upstream connection (`Connection: close`).
    pub fn http(upstream: &str) -> Result<FaultProxy> {
        FaultProxy::start(upstream, true)
    }

    fn start(upstream: &str, http: bool) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            http: http.then(|| Mutex::new(Vec::new())),
            ..State::default()
        });
        let proxy = FaultProxy {
            addr,
            upstream: upstream.to_string(),
            state,
            listener: Mutex::new(None),
        };
        proxy.listen(listener);
        Ok(proxy)
    }

    /// `host:port` of the proxy.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// `http://host:port` of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn listen(&self, listener: TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking");
        let state = self.state.clone();
        let upstream = self.upstream.clone();
        let handle = std::thread::spawn(move || {
            loop {
                if state.stop.load(Ordering::SeqCst) || state.refusing.load(Ordering::SeqCst) {
                    // Dropping the listener makes new connections fail with ECONNREFUSED.
                    return;
                }
                match listener.accept() {
                    Ok((client, _)) => {
                        let state = state.clone();
                        let upstream = upstream.clone();
                        std::thread::spawn(move || {
                            if state.http.is_some() {
                                serve_http(client, &upstream, &state);
                            } else {
                                serve_tcp(client, &upstream, &state);
                            }
                        });
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        *self.listener.lock().expect("listener") = Some(handle);
    }

    /// Refuses new connections (the port is closed) and drops the open ones, as a
    /// stopped service would.
    pub fn refuse(&self) {
        self.state.refusing.store(true, Ordering::SeqCst);
        if let Some(h) = self.listener.lock().expect("listener").take() {
            let _ = h.join();
        }
        self.drop_connections();
    }

    /// Accepts and forwards again (after [`FaultProxy::refuse`], pauses or latency).
    pub fn restore(&self) -> Result<()> {
        self.state.paused_up.store(false, Ordering::SeqCst);
        self.state.paused_down.store(false, Ordering::SeqCst);
        self.state.latency_up_ms.store(0, Ordering::SeqCst);
        self.state.latency_down_ms.store(0, Ordering::SeqCst);
        if self.state.refusing.swap(false, Ordering::SeqCst) {
            let deadline = Instant::now() + Duration::from_secs(10);
            let listener = loop {
                match TcpListener::bind(self.addr) {
                    Ok(l) => break l,
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => return Err(e).context("re-bind the fault proxy's port"),
                }
            };
            self.listen(listener);
        }
        Ok(())
    }

    /// Closes every open connection (both sides); new ones are accepted.
    pub fn drop_connections(&self) {
        for (_, s) in self.state.open.lock().expect("open").drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Holds the bytes travelling in `direction` until [`FaultProxy::restore`]
    /// (connections stay open: a stalled service).
    pub fn pause(&self, direction: Direction) {
        match direction {
            Direction::Upstream => self.state.paused_up.store(true, Ordering::SeqCst),
            Direction::Downstream => self.state.paused_down.store(true, Ordering::SeqCst),
        }
    }

    /// Delays every chunk travelling in `direction` by `latency`.
    pub fn latency(&self, direction: Direction, latency: Duration) {
        let ms = latency.as_millis() as u64;
        match direction {
            Direction::Upstream => self.state.latency_up_ms.store(ms, Ordering::SeqCst),
            Direction::Downstream => self.state.latency_down_ms.store(ms, Ordering::SeqCst),
        }
    }

    /// HTTP mode: answers matching requests with `fault` instead of forwarding them.
    pub fn inject(&self, fault: HttpFault) {
        self.state
            .http
            .as_ref()
            .expect("inject needs FaultProxy::http")
            .lock()
            .expect("faults")
            .push(fault);
    }

    /// HTTP mode: removes every fault; held requests are forwarded.
    pub fn clear(&self) {
        if let Some(f) = &self.state.http {
            f.lock().expect("faults").clear();
        }
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// HTTP mode: lets the requests held now go on (the faults stay).
    pub fn release(&self) {
        self.state.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// HTTP mode: requests held so far (see [`HttpFault::hold`]).
    pub fn held(&self) -> u64 {
        self.state.held.load(Ordering::SeqCst)
    }

    /// HTTP mode: requests answered by a fault so far.
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// HTTP mode: requests forwarded so far.
    pub fn forwarded(&self) -> u64 {
        self.state.forwarded.load(Ordering::SeqCst)
    }

    /// HTTP mode: `METHOD path` of every request seen so far.
    pub fn requests(&self) -> Vec<String> {
        self.state
            .log
            .lock()
            .expect("log")
            .iter()
            .map(|(_, r)| r.clone())
            .collect()
    }

    /// HTTP mode: requests containing `needle` with when they arrived (an injected
    /// answer is noted as ` -> injected STATUS`).
    pub fn timed_requests(&self, needle: &str) -> Vec<(Instant, String)> {
        self.state
            .log
            .lock()
            .expect("log")
            .iter()
            .filter(|(_, r)| r.contains(needle))
            .cloned()
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.listener.lock().expect("listener").take() {
            let _ = h.join();
        }
        self.drop_connections();
    }
}

/// Keeps a clone of an open socket until the returned guard is dropped.
fn remember<'a>(state: &'a State, s: &TcpStream) -> Open<'a> {
    let id = state.next_id.fetch_add(1, Ordering::SeqCst);
    if let Ok(c) = s.try_clone() {
        state.open.lock().expect("open").insert(id, c);
    }
    Open { state, id }
}

struct Open<'a> {
    state: &'a State,
    id: u64,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.state.open.lock().expect("open").remove(&self.id);
    }
}

fn serve_tcp(client: TcpStream, upstream: &str, state: &Arc<State>) {
    let Ok(server) = TcpStream::connect(upstream) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _c = remember(state, &client);
    let _s = remember(state, &server);
    let (c2, s2) = match (client.try_clone(), server.try_clone()) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return,
    };
    let st = state.clone();
    let up = std::thread::spawn(move || pump(client, server, &st, Direction::Upstream));
    pump(s2, c2, state, Direction::Downstream);
    let _ = up.join();
}

/// Copies `from` to `to` until either side closes, applying pauses and latency.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &State, direction: Direction) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if state.stop.load(Ordering::SeqCst) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if !hold(state, direction) {
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

/// Waits while `direction` is paused, then for its latency; false when stopping.
fn hold(state: &State, direction: Direction) -> bool {
    let (paused, latency) = match direction {
        Direction::Upstream => (&state.paused_up, &state.latency_up_ms),
        Direction::Downstream => (&state.paused_down, &state.latency_down_ms),
    };
    while paused.load(Ordering::SeqCst) {
        if state.stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let ms = latency.load(Ordering::SeqCst);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
    }
    true
}

/// Reads one HTTP/1.1 request head and body (Content-Length framing).
fn read_request(s: &mut TcpStream) -> Option<(String, String, Vec<String>, Vec<u8>)> {
    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = find(&data, b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let first = lines.next()?.to_string();
    let mut parts = first.split(' ');
    let method = parts.next()?.to_string();
    let path = parts.next()?.to_string();
    let headers: Vec<String> = lines.map(str::to_string).collect();
    let length = headers
        .iter()
        .find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = data[head_end + 4..].to_vec();
    while body.len() < length {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&buf[..n]);
    }
    Some((method, path, headers, body))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn serve_http(mut client: TcpStream, upstream: &str, state: &Arc<State>) {
    let _open = remember(state, &client);
    while let Some((method, path, headers, body)) = read_request(&mut client) {
        state
            .log
            .lock()
            .expect("log")
            .push((Instant::now(), format!("{method} {path}")));
        if !hold(state, Direction::Upstream) {
            return;
        }
        let fault = {
            let mut faults = state.http.as_ref().expect("http").lock().expect("faults");
            faults.retain(|f| f.until.is_none_or(|u| Instant::now() < u) && f.times != Some(0));
            faults
                .iter_mut()
                .find(|f| f.matches(&method, &path))
                .map(|f| {
                    if let Some(n) = &mut f.times {
                        *n -= 1;
                    }
                    f.clone()
                })
        };
        if fault.as_ref().is_some_and(|f| f.hold) {
            let generation = state.generation.load(Ordering::SeqCst);
            state.held.fetch_add(1, Ordering::SeqCst);
            while state.generation.load(Ordering::SeqCst) == generation {
                if state.stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        } else if let Some(f) = fault {
            state.injected.fetch_add(1, Ordering::SeqCst);
            if let Some(last) = state.log.lock().expect("log").last_mut() {
                last.1.push_str(&format!(" -> injected {}", f.status));
            }
            let mut out = format!(
                "HTTP/1.1 {} Injected\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
                f.status,
                f.body.len()
            );
            for (k, v) in &f.headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            let _ = client.write_all(out.as_bytes());
            if method != "HEAD" {
                let _ = client.write_all(f.body.as_bytes());
            }
            continue;
        }
        state.forwarded.fetch_add(1, Ordering::SeqCst);
        if !forward_http(
            &mut client,
            upstream,
            state,
            (&method, &path, &headers, &body),
        ) {
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
}

/// Forwards one request on a fresh upstream connection with `Connection: close` and
/// copies the answer back (marked `Connection: close` too). False if the client must
/// be closed.
fn forward_http(
    client: &mut TcpStream,
    upstream: &str,
    state: &Arc<State>,
    (method, path, headers, body): (&str, &str, &[String], &[u8]),
) -> bool {
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return false;
    };
    let _open = remember(state, &server);
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for h in headers {
        let name = h.split(':').next().unwrap_or("").trim();
        if !name.eq_ignore_ascii_case("connection") {
            head.push_str(h);
            head.push_str("\r\n");
        }
    }
    head.push_str("Connection: close\r\n\r\n");
    if server.write_all(head.as_bytes()).is_err() || server.write_all(body).is_err() {
        return false;
    }
    // The answer: its head gets `Connection: close`, then everything until EOF.
    let _ = server.set_read_timeout(Some(Duration::from_secs(120)));
    let mut data = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let head_end = loop {
        if let Some(i) = find(&data, b"\r\n\r\n") {
            break i;
        }
        match server.read(&mut buf) {
            Ok(0) | Err(_) => return false,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let mut out = String::new();
    for line in head.split("\r\n") {
        let name = line.split(':').next().unwrap_or("").trim();
        if !name.eq_ignore_ascii_case("connection") && !name.eq_ignore_ascii_case("keep-alive") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    if !hold(state, Direction::Downstream) || client.write_all(out.as_bytes()).is_err() {
        return false;
    }
    if client.write_all(&data[head_end + 4..]).is_err() {
        return false;
    }
    loop {
        match server.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if client.write_all(&buf[..n]).is_err() {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    let _ = client.flush();
    // The client was told the connection closes after this answer.
    false
}

/// moto (S3) on a loopback port with bucket [`Moto::BUCKET`], killed on drop.
pub struct Moto {
    child: std::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl Moto {
    /// Bucket created at start.
    pub const BUCKET: &'static str = "tansu";

    /// Starts moto and creates [`Moto::BUCKET`].
    pub fn start() -> Result<Moto> {
        let port = crate::free_port();
        let child = std::process::Command::new(crate::tool("FLOE_VENV").join("bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start moto")?;
        let moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        wait_listening(&format!("127.0.0.1:{port}"), Duration::from_secs(30))?;
        crate::rest::create_bucket(&format!("127.0.0.1:{port}"), Moto::BUCKET)?;
        Ok(moto)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_listening(addr: &str, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while TcpStream::connect(addr).is_err() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{addr} not listening after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A Tansu broker behind a [`FaultProxy`]: it advertises the proxy, so every client
/// connection (bootstrap and partition leaders) goes through it. With [`Moto`] its
/// data is kept in S3 and survives [`FaultyBroker::restart`].
pub struct FaultyBroker {
    child: Mutex<Option<std::process::Child>>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    port: u16,
    /// The proxy clients connect to.
    pub proxy: FaultProxy,
    dir: tempfile::TempDir,
}

impl FaultyBroker {
    /// Starts the broker (memory storage, or S3 on `moto`) and its proxy.
    pub fn start(moto: Option<&Moto>) -> Result<FaultyBroker> {
        let port = crate::free_port();
        let proxy = FaultProxy::tcp(&format!("127.0.0.1:{port}"))?;
        let advertised = format!("tcp://{}", proxy.address());
        let (storage, env) = match moto {
            None => ("memory://tansu/".to_string(), Vec::new()),
            Some(m) => (
                format!("s3://{}/", Moto::BUCKET),
                vec![
                    ("AWS_ENDPOINT".to_string(), m.endpoint.clone()),
                    ("AWS_ALLOW_HTTP".to_string(), "true".to_string()),
                    ("AWS_ACCESS_KEY_ID".to_string(), "test".to_string()),
                    ("AWS_SECRET_ACCESS_KEY".to_string(), "test".to_string()),
                    ("AWS_DEFAULT_REGION".to_string(), "us-east-1".to_string()),
                ],
            ),
        };
        let args = vec![
            "broker".to_string(),
            "--listener-url".to_string(),
            format!("tcp://127.0.0.1:{port}"),
            "--advertised-listener-url".to_string(),
            advertised,
            "--storage-engine".to_string(),
            storage,
        ];
        let broker = FaultyBroker {
            child: Mutex::new(None),
            args,
            env,
            port,
            proxy,
            dir: tempfile::tempdir()?,
        };
        broker.spawn()?;
        Ok(broker)
    }

    fn spawn(&self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))?;
        let mut cmd = std::process::Command::new(crate::tool("FLOE_TANSU"));
        cmd.args(&self.args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        *self.child.lock().expect("child") = Some(cmd.spawn().context("start tansu")?);
        wait_listening(&format!("127.0.0.1:{}", self.port), Duration::from_secs(20))
    }

    /// `host:port` clients bootstrap from (the proxy).
    pub fn bootstrap(&self) -> String {
        self.proxy.address()
    }

    /// SIGKILLs the broker, waits `down`, starts it again on the same port and storage.
    pub fn restart(&self, down: Duration) -> Result<()> {
        if let Some(mut c) = self.child.lock().expect("child").take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.proxy.drop_connections();
        std::thread::sleep(down);
        self.spawn()
    }

    /// Creates a topic with `partitions` partitions.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", self.bootstrap())
                .create()?;
        for r in admin
            .create_topics(
                &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await?
        {
            r.map_err(|(t, e)| anyhow::anyhow!("create topic {t}: {e}"))?;
        }
        Ok(())
    }

    /// Produces messages through the proxy.
    pub async fn produce(&self, topic: &str, messages: &[crate::Message]) -> Result<()> {
        Producer::new(&self.bootstrap())?
            .produce(topic, messages)
            .await
    }
}

impl Drop for FaultyBroker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().expect("child").take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An idempotent producer that waits out an unreachable broker (up to 5 minutes).
pub struct Producer {
    inner: rdkafka::producer::FutureProducer,
}

impl Producer {
    /// A producer for `bootstrap`.
    pub fn new(bootstrap: &str) -> Result<Producer> {
        Ok(Producer {
            inner: rdkafka::ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .set("enable.idempotence", "true")
                .set("linger.ms", "5")
                .set("message.timeout.ms", "300000")
                .create()?,
        })
    }

    /// Produces `messages` and waits for every delivery.
    pub async fn produce(&self, topic: &str, messages: &[crate::Message]) -> Result<()> {
        use rdkafka::producer::FutureRecord;
        let mut deliveries = Vec::with_capacity(messages.len());
        for (key, value) in messages {
            let mut record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
            if let Some(k) = key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = value {
                record = record.payload(v.as_slice());
            }
            loop {
                match self.inner.send_result(record) {
                    Ok(d) => break deliveries.push(d),
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        r,
                    )) => {
                        record = r;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err((e, _)) => anyhow::bail!("produce: {e}"),
                }
            }
        }
        for d in deliveries {
            d.await?
                .map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
        }
        Ok(())
    }
}

/// A small tmpfs (root only), to fill a disk on purpose; unmounted on drop.
pub struct SmallDisk {
    /// Where it is mounted.
    pub path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// Mounts a tmpfs of `bytes`; `None` where mounting is not allowed (not root).
    pub fn mount(bytes: u64) -> Result<Option<SmallDisk>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("disk");
        std::fs::create_dir(&path)?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            return Ok(None);
        }
        Ok(Some(SmallDisk { path, _dir: dir }))
    }

    /// Fills it up with a filler file until the device is full.
    pub fn fill(&self) -> Result<()> {
        let mut f = std::fs::File::create(self.path.join("filler"))?;
        let chunk = vec![0u8; 4096];
        loop {
            match f.write_all(&chunk).and_then(|()| f.sync_all()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Deletes the filler.
    pub fn free(&self) -> Result<()> {
        std::fs::remove_file(self.path.join("filler"))?;
        Ok(())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}
