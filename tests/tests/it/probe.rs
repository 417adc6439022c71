//! Probes against real HTTP servers on loopback: each test starts its own
//! server on 127.0.0.1:0 (a std listener and threads writing raw HTTP/1.1),
//! bounded in connections and lifetime, stopped when the test drops it.
//! Health files are real files in a per-test temporary directory.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use selfheal::probe;
use selfheal_core::{
    config::{ProbeConfig, Redirects},
    probe::{EXCERPT_BYTES, MAX_REDIRECTS, ProbeError, ProbeKind, ProbeResult},
};

/// The memory test measures the process's peak RSS: it runs alone (write
/// lock), every other test shares the read lock.
static MEMORY: RwLock<()> = RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MEMORY.read().unwrap_or_else(|e| e.into_inner())
}

/// Longest a test server lives, whatever the test does.
const SERVER_LIFETIME: Duration = Duration::from_secs(30);
/// Most connections a test server accepts.
const MAX_CONNS: usize = 64;
/// Slack allowed over a probe's timeout (scheduling on a busy 2-core CI).
const MARGIN: Duration = Duration::from_millis(1000);

/// What a test server does with each request.
enum Reply {
    /// Writes these bytes, then closes.
    Bytes(Vec<u8>),
    /// Waits, then writes these bytes, then closes.
    Delayed(Duration, Vec<u8>),
    /// Answers nothing; holds the connection until the server stops.
    Silent,
    /// Writes `head`, then `total` body bytes in 64 KiB writes, stopping at
    /// the first write that fails (the client hung up).
    Stream { head: Vec<u8>, total: usize },
    /// Writes `head`, then one `chunk` every `every`, `count` times.
    Trickle {
        head: Vec<u8>,
        chunk: Vec<u8>,
        every: Duration,
        count: usize,
    },
}

/// A raw HTTP/1.1 server on 127.0.0.1:0, one thread per connection.
struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    /// Body bytes the `Stream` replies managed to write.
    streamed: Arc<AtomicUsize>,
    /// Every request head received, whole.
    heads: Arc<std::sync::Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

type Handler = dyn Fn(&str) -> Reply + Send + Sync;

impl Server {
    /// Starts a server answering each request (by its request line) with
    /// `reply(line)`.
    fn start(reply: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("local addr");
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let streamed = Arc::new(AtomicUsize::new(0));
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let reply: Arc<Handler> = Arc::new(reply);
        let thread = {
            let (stop, accepted, streamed, heads) = (
                stop.clone(),
                accepted.clone(),
                streamed.clone(),
                heads.clone(),
            );
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut conns = Vec::new();
                while !stop.load(Ordering::SeqCst) && start.elapsed() < SERVER_LIFETIME {
                    match listener.accept() {
                        Ok((stream, _)) if conns.len() < MAX_CONNS => {
                            accepted.fetch_add(1, Ordering::SeqCst);
                            let (stop, streamed, reply, heads) =
                                (stop.clone(), streamed.clone(), reply.clone(), heads.clone());
                            conns.push(std::thread::spawn(move || {
                                serve(stream, &*reply, &stop, &streamed, &heads)
                            }));
                        }
                        Ok(_) => {} // over the limit: dropped (closed)
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
                stop.store(true, Ordering::SeqCst);
                for c in conns {
                    let _ = c.join();
                }
            })
        };
        Server {
            addr,
            stop,
            accepted,
            streamed,
            heads,
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sleeps `d` in small steps; false if the server was stopped meanwhile.
fn pause(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5).min(end - Instant::now()));
    }
    !stop.load(Ordering::SeqCst)
}

/// One connection: reads the request head, answers, closes gracefully.
fn serve(
    mut stream: TcpStream,
    reply: &Handler,
    stop: &AtomicBool,
    streamed: &AtomicUsize,
    heads: &std::sync::Mutex<Vec<String>>,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
    // The request head, bounded in size and time.
    let mut head = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if stop.load(Ordering::SeqCst) || Instant::now() > deadline || head.len() > 64 << 10 {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(_) => {} // read timeout: look at the flags again
        }
        // A TLS ClientHello (record type 0x16) is not HTTP: answered with a
        // 400, as plain HTTP servers do.
        if head.first() == Some(&0x16) {
            let _ = stream.write_all(&response(400, "", b"not http"));
            return;
        }
    }
    let text = String::from_utf8_lossy(&head);
    let line = text.lines().next().unwrap_or("").to_string();
    if let Ok(mut h) = heads.lock() {
        h.push(text.to_string());
    }
    match reply(&line) {
        Reply::Bytes(b) => {
            let _ = stream.write_all(&b);
        }
        Reply::Delayed(d, b) => {
            if pause(d, stop) {
                let _ = stream.write_all(&b);
            }
        }
        Reply::Silent => {
            pause(SERVER_LIFETIME, stop);
            return;
        }
        Reply::Stream { head, total } => {
            if stream.write_all(&head).is_err() {
                return;
            }
            let block = vec![b'x'; 64 << 10];
            let mut sent = 0;
            while sent < total && !stop.load(Ordering::SeqCst) {
                let n = block.len().min(total - sent);
                if stream.write_all(&block[..n]).is_err() {
                    break;
                }
                sent += n;
                streamed.fetch_add(n, Ordering::SeqCst);
            }
        }
        Reply::Trickle {
            head,
            chunk,
            every,
            count,
        } => {
            if stream.write_all(&head).is_err() {
                return;
            }
            for _ in 0..count {
                if !pause(every, stop) || stream.write_all(&chunk).is_err() {
                    return;
                }
            }
        }
    }
    // Close gracefully: FIN, then drain what the client still sends (so
    // the kernel does not answer it with a reset), bounded.
    let _ = stream.shutdown(Shutdown::Write);
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end && !stop.load(Ordering::SeqCst) {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => break,
        }
    }
}

/// A complete response with a Content-Length, closing the connection.
fn response(status: u16, extra_headers: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n{extra_headers}\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn json_response(body: &str) -> Vec<u8> {
    response(200, "Content-Type: application/json\r\n", body.as_bytes())
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A GET probe.
fn http(url: String, timeout: Duration) -> ProbeConfig {
    http_method(url, "GET", timeout, None)
}

/// A probe with `method` that expects `expect_status` (`None`: any 2xx).
fn http_method(
    url: String,
    method: &str,
    timeout: Duration,
    expect_status: Option<u16>,
) -> ProbeConfig {
    ProbeConfig::Http {
        url,
        method: method.into(),
        timeout,
        expect_status,
        fields: BTreeMap::new(),
        expect: BTreeMap::new(),
        auth: None,
        redirects: Redirects::SameOrigin,
        body_excerpt: true,
    }
}

/// A GET probe with fields and expectations.
fn http_fields(url: String, fields: &[(&str, &str)], expect: &[(&str, &str)]) -> ProbeConfig {
    ProbeConfig::Http {
        url,
        method: "GET".into(),
        timeout: Duration::from_secs(2),
        expect_status: None,
        fields: map(fields),
        expect: map(expect),
        auth: None,
        redirects: Redirects::SameOrigin,
        body_excerpt: true,
    }
}

/// Runs one probe through [`probe::run_all`], with the time it took.
fn run_one(p: &ProbeConfig) -> (ProbeResult, Duration) {
    let start = Instant::now();
    let mut results = probe::run_all(&[p]);
    let took = start.elapsed();
    assert_eq!(results.len(), 1);
    (results.remove(0), took)
}

/// Asserts a failed result of kind `error`, and that it serializes with
/// that code.
fn assert_failed(r: &ProbeResult, error: ProbeError) {
    assert!(!r.ok, "{r:#?}");
    assert_eq!(r.error, Some(error), "{r:#?}");
    assert!(r.detail.is_some(), "{r:#?}");
    let v = serde_json::to_value(r).expect("result serializes");
    assert_eq!(v["error"], serde_json::json!(error.code()));
    assert_eq!(v["ok"], serde_json::json!(false));
}

#[test]
fn json_fields_met_and_unmet_expectations() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let body = r#"{"status":"connected","current_task":"t-42","last_seen":17,"meta":{"busy":true,"tags":["a","b"]}}"#;
    let server = Server::start(move |_| Reply::Bytes(json_response(body)));
    let fields = [
        ("server_status", "/status"),
        ("current_task", "/current_task"),
        ("last_seen", "/last_seen"),
        ("busy", "/meta/busy"),
        ("second_tag", "/meta/tags/1"),
        ("absent", "/no/such/field"),
    ];

    let met = http_fields(
        server.url("/status"),
        &fields,
        &[
            ("server_status", "connected"),
            ("last_seen", "17"),
            ("busy", "true"),
        ],
    );
    let (r, took) = run_one(&met);
    eprintln!("json probe, expectations met: {took:?}");
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.kind, ProbeKind::Http);
    assert_eq!(r.target, server.url("/status"));
    assert_eq!(r.status, Some(200));
    assert_eq!(r.error, None);
    assert!(r.latency_ms.is_some());
    assert_eq!(r.fields["server_status"], "connected");
    assert_eq!(r.fields["current_task"], "t-42");
    assert_eq!(r.fields["last_seen"], 17);
    assert_eq!(r.fields["busy"], true);
    assert_eq!(r.fields["second_tag"], "b");
    assert!(
        !r.fields.contains_key("absent"),
        "absent pointer is left out"
    );
    assert!(r.expectations.iter().all(|e| e.met), "{r:#?}");
    assert_eq!(r.body_excerpt.as_deref(), Some(body));

    let unmet = http_fields(
        server.url("/status"),
        &fields,
        &[
            ("server_status", "disconnected"),
            ("current_task", "t-42"),
            ("absent", "anything"),
        ],
    );
    let (r, _) = run_one(&unmet);
    // The agent answered: no error, but its story is not the expected one.
    assert!(!r.ok, "{r:#?}");
    assert_eq!(r.error, None, "{r:#?}");
    assert_eq!(r.status, Some(200));
    let by_field: BTreeMap<_, _> = r
        .expectations
        .iter()
        .map(|e| (e.field.as_str(), e))
        .collect();
    assert!(!by_field["server_status"].met);
    assert_eq!(
        by_field["server_status"].actual.as_deref(),
        Some("connected")
    );
    assert!(by_field["current_task"].met);
    assert!(!by_field["absent"].met);
    assert_eq!(by_field["absent"].actual, None);
    let detail = r.detail.as_deref().unwrap_or("");
    assert!(detail.contains("server_status"), "{detail}");
    assert!(detail.contains("absent"), "{detail}");
    // The fields are there all the same.
    assert_eq!(r.fields["server_status"], "connected");
}

#[test]
fn run_with_own_runtime_and_client() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|_| Reply::Bytes(json_response(r#"{"ok":1}"#)));
    let p = http_fields(server.url("/"), &[("ok", "/ok")], &[("ok", "1")]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let client = probe::client().expect("client");
    let r = rt.block_on(probe::run(&p, &client));
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.fields["ok"], 1);
}

#[test]
fn status_500_is_unexpected_and_expect_status_is_exact() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|line| {
        if line.starts_with("POST") {
            Reply::Bytes(response(503, "", b"draining"))
        } else {
            Reply::Bytes(response(500, "", b"internal error"))
        }
    });
    let (r, _) = run_one(&http(server.url("/status"), Duration::from_secs(2)));
    assert_failed(&r, ProbeError::UnexpectedStatus);
    assert_eq!(r.status, Some(500));
    assert_eq!(r.body_excerpt.as_deref(), Some("internal error"));
    assert_eq!(r.detail.as_deref(), Some("status 500, expected 2xx"));

    let want_503 = http_method(
        server.url("/drain"),
        "POST",
        Duration::from_secs(2),
        Some(503),
    );
    let (r, _) = run_one(&want_503);
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.status, Some(503));
}

#[test]
fn server_that_never_answers_times_out() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|_| Reply::Silent);
    let timeout = Duration::from_millis(500);
    let (r, took) = run_one(&http(server.url("/status"), timeout));
    eprintln!("silent server, timeout {timeout:?}: {took:?}");
    assert_failed(&r, ProbeError::Timeout);
    assert_eq!(r.status, None);
    assert!(took >= timeout - Duration::from_millis(50), "{took:?}");
    assert!(took < timeout + MARGIN, "took {took:?}");
    let latency = r.latency_ms.expect("latency of a timed-out probe");
    assert!((450..1500).contains(&latency), "{latency}");
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
}

#[test]
fn closed_port_is_refused() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let (r, took) = run_one(&http(
        format!("http://127.0.0.1:{port}/status"),
        Duration::from_secs(2),
    ));
    eprintln!("closed port: {took:?}");
    assert_failed(&r, ProbeError::Refused);
    assert!(took < Duration::from_secs(1), "{took:?}");
    // A timeout too long to add to a clock is no panic.
    let (r, _) = run_one(&http(
        format!("http://127.0.0.1:{port}/status"),
        Duration::MAX,
    ));
    assert_failed(&r, ProbeError::Refused);
    // https goes through the TLS stack's setup and is refused the same way.
    let (r, _) = run_one(&http(
        format!("https://127.0.0.1:{port}/status"),
        Duration::from_secs(2),
    ));
    assert_failed(&r, ProbeError::Refused);
}

#[test]
fn https_to_a_plain_http_server_fails_to_connect() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|_| Reply::Bytes(response(200, "", b"plain")));
    let url = format!("https://{}/", server.addr);
    let (r, took) = run_one(&http(url, Duration::from_secs(2)));
    eprintln!(
        "tls handshake with a plain server: {took:?}: {:?}",
        r.detail
    );
    assert_failed(&r, ProbeError::Connect);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[test]
fn connection_closed_without_answer_is_io() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|_| Reply::Bytes(Vec::new()));
    let (r, _) = run_one(&http(server.url("/"), Duration::from_secs(2)));
    assert_failed(&r, ProbeError::Io);
}

#[test]
fn non_json_body_is_bad_json_only_when_fields_are_wanted() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|_| {
        Reply::Bytes(response(
            200,
            "Content-Type: text/html\r\n",
            b"<html>up</html>",
        ))
    });
    let wants = http_fields(server.url("/"), &[("status", "/status")], &[]);
    let (r, _) = run_one(&wants);
    assert_failed(&r, ProbeError::BadJson);
    assert_eq!(r.status, Some(200));
    assert!(r.fields.is_empty());
    assert!(
        r.detail
            .as_deref()
            .unwrap_or("")
            .starts_with("body is not json: "),
        "{r:#?}"
    );
    assert_eq!(r.body_excerpt.as_deref(), Some("<html>up</html>"));

    let (r, _) = run_one(&http(server.url("/"), Duration::from_secs(2)));
    assert!(r.ok, "no fields wanted: any body will do: {r:#?}");
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

#[test]
fn ten_mib_body_is_too_large_and_not_buffered() {
    let _area = tests::area(module_path!());
    let _g = MEMORY.write().unwrap_or_else(|e| e.into_inner());
    const TEN_MIB: usize = 10 << 20;
    let server = Server::start(|line| {
        if line.contains("/declared") {
            // Content-Length says 10 MiB: refused before reading.
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {TEN_MIB}\r\n\r\n");
            Reply::Stream {
                head: head.into_bytes(),
                total: TEN_MIB,
            }
        } else {
            // No length, the body ends with the connection: read until the
            // cap, then dropped.
            Reply::Stream {
                head: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_vec(),
                total: TEN_MIB,
            }
        }
    });
    // Warm up (runtime, client, TLS roots) so the peak below is the bodies'.
    let _ = run_one(&http(server.url("/declared"), Duration::from_secs(5)));
    // The peak so far is this process's, other areas' tests included:
    // start it again from the resident set of now (`5`, since Linux 4.0).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = peak_rss_kib();
    for path in ["/declared", "/streamed"] {
        let p = http_fields(server.url(path), &[("a", "/a")], &[]);
        let (r, took) = run_one(&p);
        eprintln!("10 MiB body at {path}: {took:?}: {:?}", r.detail);
        assert_failed(&r, ProbeError::TooLarge);
        assert_eq!(r.status, Some(200));
        let excerpt = r.body_excerpt.as_deref().unwrap_or("");
        assert!(excerpt.len() <= EXCERPT_BYTES, "{}", excerpt.len());
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
    let grown = peak_rss_kib().saturating_sub(before);
    eprintln!(
        "peak RSS grew {grown} KiB over two 10 MiB bodies; server wrote {} bytes",
        server.streamed.load(Ordering::SeqCst)
    );
    // Buffering one body whole would take 10 MiB; the cap is 1 MiB.
    assert!(grown < 6 << 10, "peak RSS grew {grown} KiB");
}

#[test]
fn redirect_loop_and_long_chains_stop() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let server = Server::start(|line| {
        let path = line.split(' ').nth(1).unwrap_or("/");
        if path == "/form" {
            // Post/redirect/get to the same URL is no loop.
            if line.starts_with("POST") {
                Reply::Bytes(response(303, "Location: /form\r\n", b""))
            } else {
                Reply::Bytes(response(200, "", b"done"))
            }
        } else if path == "/loop" {
            Reply::Bytes(response(302, "Location: /loop\r\n", b""))
        } else if let Some(n) = path.strip_prefix("/chain/") {
            let n: u32 = n.parse().unwrap_or(0);
            Reply::Bytes(response(
                302,
                &format!("Location: /chain/{}\r\n", n + 1),
                b"",
            ))
        } else if let Some(n) = path.strip_prefix("/short/") {
            let n: u32 = n.parse().unwrap_or(0);
            if n < 3 {
                Reply::Bytes(response(
                    301,
                    &format!("Location: /short/{}\r\n", n + 1),
                    b"",
                ))
            } else {
                Reply::Bytes(json_response(r#"{"status":"connected"}"#))
            }
        } else {
            Reply::Bytes(response(404, "", b"no"))
        }
    });

    let (r, took) = run_one(&http(server.url("/loop"), Duration::from_secs(2)));
    eprintln!("redirect loop: {took:?}: {:?}", r.detail);
    assert_failed(&r, ProbeError::RedirectLoop);
    let after_loop = server.accepted.load(Ordering::SeqCst);
    assert_eq!(
        after_loop,
        MAX_REDIRECTS + 1,
        "the first request and {MAX_REDIRECTS} redirects"
    );
    assert!(
        r.detail.as_deref().unwrap_or("").contains("redirect loop"),
        "{r:#?}"
    );

    let (r, _) = run_one(&http(server.url("/chain/0"), Duration::from_secs(2)));
    assert_failed(&r, ProbeError::RedirectLoop);
    let chain = server.accepted.load(Ordering::SeqCst) - after_loop;
    assert_eq!(
        chain,
        MAX_REDIRECTS + 1,
        "the first request and {MAX_REDIRECTS} redirects"
    );

    let p = http_fields(
        server.url("/short/0"),
        &[("s", "/status")],
        &[("s", "connected")],
    );
    let (r, _) = run_one(&p);
    assert!(r.ok, "three redirects are followed: {r:#?}");
    assert_eq!(r.status, Some(200));
    assert_eq!(r.target, server.url("/short/0"));

    let post = http_method(server.url("/form"), "POST", Duration::from_secs(2), None);
    let (r, _) = run_one(&post);
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.body_excerpt.as_deref(), Some("done"));
}

/// A status endpoint that answers 302 to another
/// origin (here another port of loopback; on a cloud host, the metadata
/// service) is not followed, and no request ever carries a Referer.
#[test]
fn redirects_stay_on_their_origin_and_send_no_referer() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let elsewhere = Server::start(|_| {
        Reply::Bytes(json_response(
            r#"{"status":"connected","AccessKeyId":"ASIAMETADATA0000"}"#,
        ))
    });
    let away = format!("http://{}/latest/meta-data/?token=x", elsewhere.addr);
    let server = Server::start(move |line| {
        let path = line.split(' ').nth(1).unwrap_or("/");
        if path.starts_with("/away") {
            Reply::Bytes(response(302, &format!("Location: {away}\r\n"), b""))
        } else if path.starts_with("/same") {
            Reply::Bytes(response(302, "Location: /here?next=1\r\n", b""))
        } else if path.starts_with("/here") {
            Reply::Bytes(json_response(r#"{"status":"connected"}"#))
        } else {
            Reply::Bytes(response(404, "", b"no"))
        }
    });
    let with = |path: &str, redirects: Redirects| {
        let mut p = http_fields(server.url(path), &[("s", "/status")], &[("s", "connected")]);
        if let ProbeConfig::Http { redirects: r, .. } = &mut p {
            *r = redirects;
        }
        p
    };

    // Cross-origin: refused, reported, and the other server asked nothing.
    let (r, _) = run_one(&with("/away?token=SECRETquery", Redirects::SameOrigin));
    eprintln!("cross-origin: {:?}", r.detail);
    assert_failed(&r, ProbeError::RedirectRefused);
    let detail = r.detail.as_deref().unwrap_or("");
    assert!(detail.contains("another origin"), "{detail}");
    assert!(detail.contains(&elsewhere.addr.to_string()), "{detail}");
    assert!(!detail.contains("SECRETquery"), "{detail}");
    assert_eq!(r.fields.get("s"), None, "nothing judged from elsewhere");
    assert_eq!(elsewhere.accepted.load(Ordering::SeqCst), 0);
    // Refused even with redirects off entirely: then the 302 is the answer.
    let (r, _) = run_one(&with("/away", Redirects::None));
    assert_failed(&r, ProbeError::UnexpectedStatus);
    assert_eq!(r.status, Some(302));
    let detail = r.detail.as_deref().unwrap_or("");
    assert!(detail.contains("not followed"), "{detail}");
    assert_eq!(elsewhere.accepted.load(Ordering::SeqCst), 0);

    // Same origin: followed by default, not with redirects = "none".
    let (r, _) = run_one(&with("/same?token=SECRETquery", Redirects::SameOrigin));
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.status, Some(200));
    assert_eq!(
        r.target,
        format!("http://{}/same?token=REDACTED", server.addr)
    );
    let (r, _) = run_one(&with("/same", Redirects::None));
    assert_failed(&r, ProbeError::UnexpectedStatus);
    assert_eq!(r.status, Some(302));

    let heads = server.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 5, "{heads:#?}");
    for h in &heads {
        assert!(!h.to_ascii_lowercase().contains("\nreferer:"), "{h}");
    }
}

#[test]
fn slow_servers_against_a_300ms_timeout() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let timeout = Duration::from_millis(300);
    let server = Server::start(|line| {
        if line.contains("/late") {
            Reply::Delayed(Duration::from_secs(1), json_response("{}"))
        } else if line.contains("/trickle") {
            Reply::Trickle {
                head: b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n".to_vec(),
                chunk: b"x".to_vec(),
                every: Duration::from_millis(100),
                count: 20,
            }
        } else {
            Reply::Delayed(Duration::from_millis(100), json_response("{}"))
        }
    });

    let (r, took) = run_one(&http(server.url("/late"), timeout));
    eprintln!("answer after 1s, timeout 300ms: {took:?}");
    assert_failed(&r, ProbeError::Timeout);
    assert!(took < timeout + MARGIN, "{took:?}");

    let (r, took) = run_one(&http(server.url("/trickle"), timeout));
    eprintln!(
        "body trickling 1 byte/100ms, timeout 300ms: {took:?}: {:?}",
        r.detail
    );
    assert_failed(&r, ProbeError::Timeout);
    assert_eq!(r.status, Some(200), "the head came in time");
    assert!(took < timeout + MARGIN, "{took:?}");

    let (r, took) = run_one(&http(server.url("/prompt"), timeout));
    eprintln!("answer after 100ms, timeout 300ms: {took:?}");
    assert!(r.ok, "{r:#?}");
    let latency = r.latency_ms.expect("latency");
    assert!(latency >= 90, "{latency}");
}

#[test]
fn ten_probes_run_concurrently_in_about_one_timeout() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let silent = Server::start(|_| Reply::Silent);
    let timeout = Duration::from_millis(400);
    let dir = tests::Scratch::new("probe-concurrent");
    let fresh = dir.join("alive");
    std::fs::write(&fresh, b"").expect("write health file");

    let mut probes: Vec<ProbeConfig> = (0..10)
        .map(|i| http(silent.url(&format!("/p{i}")), timeout))
        .collect();
    probes.insert(
        5,
        ProbeConfig::HealthFile {
            path: fresh.clone(),
            max_age: Duration::from_secs(60),
        },
    );
    let refs: Vec<&ProbeConfig> = probes.iter().collect();
    let start = Instant::now();
    let results = probe::run_all(&refs);
    let took = start.elapsed();
    eprintln!("10 silent probes (timeout {timeout:?}) + 1 health file: {took:?}");
    assert_eq!(results.len(), 11);
    assert!(
        took < 3 * timeout,
        "took {took:?}, sequential would be 10 × {timeout:?}"
    );
    for (i, r) in results.iter().enumerate() {
        if i == 5 {
            assert_eq!(r.kind, ProbeKind::HealthFile);
            assert_eq!(r.target, fresh.display().to_string());
            assert!(r.ok, "{r:#?}");
        } else {
            let n = if i < 5 { i } else { i - 1 };
            assert_eq!(
                r.target,
                silent.url(&format!("/p{n}")),
                "results in input order"
            );
            assert_failed(r, ProbeError::Timeout);
        }
    }
    assert_eq!(silent.accepted.load(Ordering::SeqCst), 10);
    assert!(probe::run_all(&[]).is_empty());
}

#[test]
fn health_file_fresh_stale_missing() {
    let _area = tests::area(module_path!());
    let _g = shared();
    let dir = tests::Scratch::new("probe-health");
    let max_age = Duration::from_secs(30);
    let fresh = dir.join("fresh");
    std::fs::write(&fresh, b"").expect("write");
    let stale = dir.join("stale");
    let f = std::fs::File::create(&stale).expect("create");
    f.set_modified(SystemTime::now() - Duration::from_secs(120))
        .expect("set mtime");
    drop(f);
    let missing = dir.join("missing");

    let probes: Vec<ProbeConfig> = [&fresh, &stale, &missing]
        .into_iter()
        .map(|p| ProbeConfig::HealthFile {
            path: p.clone(),
            max_age,
        })
        .collect();
    let refs: Vec<&ProbeConfig> = probes.iter().collect();
    let results = probe::run_all(&refs);

    let r = &results[0];
    assert!(r.ok, "{r:#?}");
    assert_eq!(r.kind, ProbeKind::HealthFile);
    assert!(r.age_ms.expect("age") < 10_000, "{r:#?}");
    assert_eq!(r.latency_ms, None);

    let r = &results[1];
    assert_failed(r, ProbeError::Stale);
    let age = r.age_ms.expect("age");
    assert!((119_000..130_000).contains(&age), "{age}");
    assert!(
        r.detail.as_deref().unwrap_or("").contains("max age 30s"),
        "{r:#?}"
    );

    let r = &results[2];
    assert_failed(r, ProbeError::Missing);
    assert_eq!(r.age_ms, None);
    assert_eq!(r.target, missing.display().to_string());

    // The blocking form agrees.
    assert!(probe::check_health_file(&fresh, max_age).ok);
    assert_eq!(
        probe::check_health_file(&stale, max_age).error,
        Some(ProbeError::Stale)
    );
    assert_eq!(
        probe::check_health_file(&missing, max_age).error,
        Some(ProbeError::Missing)
    );
}
