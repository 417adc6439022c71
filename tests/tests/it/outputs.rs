//! What selfheal prints and stores, read back as an attacker would and
//! as a terminal would:
//!
//! - secrets planted in the watched processes' argv and environment, in
//!   probe URLs and in probe bodies reach no output at all: stdout, the log
//!   stream, `--json`, snapshots, the state directory, the metrics file and
//!   the `/metrics` endpoint (except the body text the config asks for);
//! - no control character from a process name, a thread name, an argv, a
//!   probe body or a path reaches a terminal through a text output.
//!
//! Every test runs the real binary against real processes and a real HTTP
//! server on loopback, bounded in time, in a scratch directory removed on
//! drop.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Command, Output, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tests::fixtures::{Places, Reaped};
use tests::{Scratch, selfheal_bin};

/// Longest a test server lives, whatever the test does.
const SERVER_LIFETIME: Duration = Duration::from_secs(60);
/// Most requests a test server answers.
const MAX_REQUESTS: usize = 200;

/// A loopback HTTP/1.1 server answering each request from its path with
/// `reply(path)` (status, body; a 302's "body" is its `Location`),
/// recording every request head.
struct Server {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(reply: impl Fn(&str) -> (u16, Vec<u8>) + Send + 'static) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("local addr");
        let heads = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (heads, stop) = (heads.clone(), stop.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut served = 0;
                while !stop.load(Ordering::SeqCst)
                    && start.elapsed() < SERVER_LIFETIME
                    && served < MAX_REQUESTS
                {
                    let Ok((s, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    served += 1;
                    let head = read_head(&s);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                    heads.lock().unwrap().push(head);
                    let (status, body) = reply(&path);
                    let mut s = s;
                    if status == 302 {
                        let _ = write!(
                            s,
                            "HTTP/1.1 302 X\r\nLocation: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                            String::from_utf8_lossy(&body)
                        );
                        continue;
                    }
                    let _ = write!(
                        s,
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(&body);
                }
            })
        };
        Server {
            addr,
            heads,
            stop,
            thread: Some(thread),
        }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
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

/// A request head, bounded in size and time.
fn read_head(s: &TcpStream) -> String {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + Duration::from_secs(3);
    let mut s = s;
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && Instant::now() < end && head.len() < 65536 {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    run_with(args, &[])
}

/// [`run`], with `env` on top of this process's environment.
fn run_with(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> Output {
    Command::new(selfheal_bin())
        .args(args)
        .env("RUST_LOG", "debug")
        .envs(env.iter().copied())
        .output()
        .expect("run selfheal")
}

/// Every file under `dir`, with its text (lossy), recursively (bounded).
fn files_under(dir: &Path, out: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten().take(1000) {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, out);
        } else if let Ok(bytes) = std::fs::read(&p) {
            out.push((
                p.display().to_string(),
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
    }
}

/// A free loopback port (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// `GET /metrics` from `port`, the whole answer (bounded).
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = Vec::new();
    let _ = s.take(1 << 20).read_to_end(&mut text);
    Some(String::from_utf8_lossy(&text).into_owned())
}

/// `--config CONFIG`, the arguments of `places`, and `--dry-run`: what
/// every command of a run here is given.
fn dry_run_args<'a>(
    config: &'a Path,
    places: &'a [std::ffi::OsString],
) -> Vec<&'a std::ffi::OsStr> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["--config".as_ref(), config.as_os_str()];
    args.extend(places.iter().map(|a| a.as_os_str()));
    args.push("--dry-run".as_ref());
    args
}

/// Runs `check` (text, then `--json` with a metrics file) and `watch` with
/// a metrics endpoint for a bounded time against `config`, and returns every
/// output with where it came from. Each runs with `env` on top of this
/// process's environment.
fn every_output(
    scratch: &Scratch,
    config: &Path,
    tag: &str,
    env: &[(&str, &str)],
) -> Vec<(String, String)> {
    let state = scratch.join(&format!("{tag}-state"));
    let snaps = scratch.join(&format!("{tag}-snaps"));
    let metrics = scratch.join(&format!("{tag}.prom"));
    let places = Places::new(&state, &snaps)
        .helper(scratch.join("no-helper.sock"))
        .args();
    let common = dry_run_args(config, &places);
    let mut outputs = Vec::new();
    let mut text_args = vec!["check".as_ref()];
    text_args.extend(&common);
    let text = run_with(&text_args, env);
    outputs.push(("check stdout".into(), lossy(&text.stdout)));
    outputs.push(("check stderr".into(), lossy(&text.stderr)));

    let mut json_args = vec!["check".as_ref(), "--json".as_ref()];
    json_args.extend(&common);
    json_args.extend(["--metrics-file".as_ref(), metrics.as_os_str()]);
    let json = run_with(&json_args, env);
    outputs.push(("check --json stdout".into(), lossy(&json.stdout)));
    outputs.push(("check --json stderr".into(), lossy(&json.stderr)));

    // watch: three checks a second apart, scraped while it runs.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut watch_args: Vec<&std::ffi::OsStr> = vec![
        "watch".as_ref(),
        "--interval".as_ref(),
        "1s".as_ref(),
        "--count".as_ref(),
        "3".as_ref(),
        "--metrics-public".as_ref(),
        "--metrics-addr".as_ref(),
        addr.as_ref(),
    ];
    watch_args.extend(&common);
    let child = Command::new(selfheal_bin())
        .args(&watch_args)
        .env("RUST_LOG", "debug")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn watch");
    let mut child = Reaped(child);
    let mut scraped = None;
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if let Some(text) = scrape(port)
            && text.contains("selfheal_probe_latency_seconds{")
        {
            scraped = Some(text);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let scraped = scraped.expect("watch serves probe latencies on /metrics within 20 s");
    outputs.push(("watch /metrics".into(), scraped));
    let end = Instant::now() + Duration::from_secs(30);
    while child.0.try_wait().ok().flatten().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.0.kill();
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.0.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    if let Some(mut s) = child.0.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    outputs.push(("watch stdout".into(), out));
    outputs.push(("watch stderr".into(), err));

    for f in [&metrics] {
        if let Ok(t) = std::fs::read_to_string(f) {
            outputs.push((f.display().to_string(), t));
        }
    }
    files_under(&state, &mut outputs);
    files_under(&snaps, &mut outputs);
    let snapshot_files = outputs
        .iter()
        .filter(|(w, _)| w.starts_with(&snaps.display().to_string()))
        .count();
    assert!(snapshot_files > 0, "no snapshot written: {outputs:#?}");
    assert!(
        outputs
            .iter()
            .any(|(w, _)| w.contains(&state.display().to_string())),
        "no state written"
    );
    outputs
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every (secret, output) pair where the secret shows.
fn leaks(outputs: &[(String, String)], secrets: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (where_, text) in outputs {
        for s in secrets {
            if text.contains(s) {
                found.push(format!("{s:?} in {where_}"));
            }
        }
    }
    found
}

const ARGV_SECRET: &str = "argvSECRET7f3a9c";
const ENV_SECRET: &str = "envSECRET41d2e8";
const QUERY_SECRET: &str = "querySECRETc0ffee";
const USERINFO_SECRET: &str = "userinfoSECRET5b5b";
const HOP_SECRET: &str = "hopSECRETbeef42";
const BEARER_FILE_SECRET: &str = "bearerfileSECRET0a1b2c";
const BEARER_ENV_SECRET: &str = "bearerenvSECRET3d4e5f";
/// In a body whose excerpt the config turns off: no pattern would catch it.
const PLAIN_BODY_SECRET: &str = "plainbodySECRET9e9e";
/// Secrets in a body that the excerpt keeps: each in a known shape.
const BODY_SECRETS: &[&str] = &[
    "apikeySECRET91xx",
    "bearerSECRET0123456789",
    "sk-skSECRET0123456789abcdef",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJqd3RTRUNSRVQifQ.c2lnbmF0dXJlU0VDUkVU",
    "AKIABODYSECRET123456",
    "pwSECRET77hunter2",
];
/// Body text that is no secret: the config asks for the excerpt, so it shows.
const BODY_VISIBLE: &str = "visibleBODYmarker";

fn secret_body() -> Vec<u8> {
    format!(
        r#"{{"status":"draining","note":"{BODY_VISIBLE}","api_key":"{}","auth":"Bearer {}","openai":"{}","jwt":"{}","aws":"{}","password":"{}"}}"#,
        BODY_SECRETS[0],
        BODY_SECRETS[1],
        BODY_SECRETS[2],
        BODY_SECRETS[3],
        BODY_SECRETS[4],
        BODY_SECRETS[5]
    )
    .into_bytes()
}

/// Secrets planted in argv, environment, probe
/// URLs and probe bodies are found in no output.
#[test]
fn no_secret_reaches_any_output() {
    let _area = tests::area(module_path!());
    let scratch = Scratch::new("outputs-secrets");
    let server = Server::start(|path| {
        if path.starts_with("/hop") {
            // A same-origin redirect to a URL with another token: followed,
            // and named in reqwest's debug log line.
            (302, format!("/status?next={HOP_SECRET}").into_bytes())
        } else if path.starts_with("/quiet") {
            (
                503,
                format!(r#"{{"status":"{PLAIN_BODY_SECRET}"}}"#).into_bytes(),
            )
        } else {
            (503, secret_body())
        }
    });
    // The watched agent: a shell whose argv and environment hold secrets.
    let agent = Command::new("sh")
        .args(["-c", "sleep 60", "sh", &format!("--token={ARGV_SECRET}")])
        .env("AGENT_API_KEY", ENV_SECRET)
        .spawn()
        .expect("spawn the agent");
    let agent = Reaped(agent);
    let pid = agent.0.id();

    // Part 1: a probe URL with a token in its query, a body full of secrets.
    let config = scratch.join("query.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"leaky\"\nmatch = {{ pid = {pid} }}\n\
             [[agent.probe]]\nurl = \"http://{0}/status?access_token={QUERY_SECRET}&v=1\"\ntimeout = \"1s\"\n\
             [[agent.probe]]\nurl = \"http://{0}/hop?access_token={QUERY_SECRET}\"\ntimeout = \"1s\"\n",
            server.addr
        ),
    )
    .unwrap();
    let outputs = every_output(&scratch, &config, "query", &[]);
    let mut secrets = vec![ARGV_SECRET, ENV_SECRET, QUERY_SECRET, HOP_SECRET];
    secrets.extend(BODY_SECRETS);
    let found = leaks(&outputs, &secrets);
    assert!(
        found.is_empty(),
        "secrets in outputs:\n  {}",
        found.join("\n  ")
    );
    // The grep above is meaningful: the excerpt the config asks for is
    // there, and the probe reached the server with its token.
    assert!(
        outputs
            .iter()
            .any(|(w, t)| w.contains("snaps") && t.contains(BODY_VISIBLE)),
        "the body excerpt should be in the snapshot"
    );
    assert!(
        server.heads().iter().any(|h| h.contains(QUERY_SECRET))
            && server.heads().iter().any(|h| h.contains(HOP_SECRET)),
        "the probe sends its token, and follows the same-origin redirect"
    );

    // Part 2: userinfo is refused, with a message that does not repeat it.
    let userinfo = scratch.join("userinfo.toml");
    std::fs::write(
        &userinfo,
        format!(
            "[[agent]]\nname = \"leaky\"\nmatch = {{ pid = {pid} }}\n\
             [[agent.probe]]\nurl = \"http://user:{USERINFO_SECRET}@{}/status\"\n",
            server.addr
        ),
    )
    .unwrap();
    for sub in [&["check"][..], &["config", "check"][..]] {
        let mut args: Vec<&std::ffi::OsStr> = sub.iter().map(|s| s.as_ref()).collect();
        args.extend(["--config".as_ref(), userinfo.as_os_str()]);
        let out = run(&args);
        let err = lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{sub:?}: {err}");
        assert!(
            err.contains("bearer_file"),
            "{sub:?}: says what to do: {err}"
        );
        let all = format!("{err}{}", lossy(&out.stdout));
        assert!(!all.contains(USERINFO_SECRET), "{sub:?}: {all}");
    }

    // Part 3: credentials from a file and the environment, and a body the
    // config keeps out of every output.
    let token = scratch.join("token");
    std::fs::write(&token, format!("{BEARER_FILE_SECRET}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = scratch.join("auth.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"authed\"\nmatch = {{ pid = {pid} }}\n\
             [[agent.probe]]\nurl = \"http://{0}/quiet/file\"\ntimeout = \"1s\"\n\
             auth = {{ bearer_file = \"{1}\" }}\nbody_excerpt = false\n\
             [[agent.probe]]\nurl = \"http://{0}/quiet/env\"\ntimeout = \"1s\"\n\
             auth = {{ bearer_env = \"SELFHEAL_TEST_PROBE_TOKEN\" }}\nbody_excerpt = false\n",
            server.addr,
            token.display()
        ),
    )
    .unwrap();
    let outputs = every_output(
        &scratch,
        &config,
        "auth",
        &[("SELFHEAL_TEST_PROBE_TOKEN", BEARER_ENV_SECRET)],
    );
    let found = leaks(
        &outputs,
        &[
            ARGV_SECRET,
            ENV_SECRET,
            BEARER_FILE_SECRET,
            BEARER_ENV_SECRET,
            PLAIN_BODY_SECRET,
        ],
    );
    assert!(
        found.is_empty(),
        "secrets in outputs:\n  {}",
        found.join("\n  ")
    );
    let heads = server.heads();
    for secret in [BEARER_FILE_SECRET, BEARER_ENV_SECRET] {
        assert!(
            heads
                .iter()
                .any(|h| h.contains(&format!("authorization: Bearer {secret}"))),
            "the probe sends its bearer token: {heads:#?}"
        );
    }
    drop(agent);
}

/// Whether `bytes` holds a byte a terminal acts on: C0 controls but `\n`
/// and `\t`, DEL, and the C1 controls (U+0080..U+009F, as UTF-8).
fn terminal_controls(bytes: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let text = String::from_utf8_lossy(bytes);
    for (i, c) in text.char_indices() {
        let bad = (c < ' ' && c != '\n' && c != '\t') || ('\u{7f}'..='\u{9f}').contains(&c);
        if bad {
            let from = text[..i].char_indices().rev().nth(30).map_or(0, |(j, _)| j);
            found.push(format!("{:?} after {:?}", c, &text[from..i]));
        }
    }
    found
}

/// A process whose names and argv carry ESC, BEL and CSI
/// sequences, a probe body full of them and a directory named with them
/// reach no terminal through `check`, `inspect`, `snapshots` or
/// `config check`.
#[test]
fn no_control_character_reaches_a_terminal() {
    let _area = tests::area(module_path!());
    let scratch = Scratch::new("outputs-escape");
    // A directory named with an OSC title sequence and a CSI clear screen.
    let dir = scratch.join("d\u{1b}]0;owned\u{7}\u{1b}[2J");
    std::fs::create_dir_all(&dir).unwrap();
    let server = Server::start(|_| {
        (
            503,
            "{\"status\":\"\\u001b[2Jbad\",\"current_task\":\"t\u{1b}]0;x\u{7}\",\"raw\":\"\u{7f}\u{9b}31m\u{85}\"}"
                .as_bytes()
                .to_vec(),
        )
    });
    // comm and a thread's name set with prctl(PR_SET_NAME) to escape
    // sequences (15 bytes at most each); argv with more of them.
    let script = "import ctypes,threading,time\n\
        libc=ctypes.CDLL(None)\n\
        libc.prctl(15,b'\\x1b]0;p\\x07\\x1b[2J\\xc2\\x9b1m',0,0,0)\n\
        def t():\n    libc.prctl(15,b'\\x1b[31mthr\\x07\\x7f',0,0,0)\n    time.sleep(60)\n\
        threading.Thread(target=t,daemon=True).start()\n\
        print('ready',flush=True)\n\
        time.sleep(60)\n";
    let Ok(child) = Command::new("python3")
        .args(["-c", script, "\u{1b}]2;argv\u{7}", "\u{1b}[6n"])
        .stdout(Stdio::piped())
        .spawn()
    else {
        return tests::skip("no_control_character", "no python3 here");
    };
    let mut child = Reaped(child);
    let mut line = [0u8; 6];
    let _ = child.0.stdout.as_mut().unwrap().read_exact(&mut line);
    let pid = child.0.id();
    // Both names are set once the thread runs: wait for them (bounded).
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end {
        let names = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten()
                    .filter_map(|t| std::fs::read(t.path().join("comm")).ok())
                    .filter(|c| c.contains(&0x1b))
                    .count()
            })
            .unwrap_or(0);
        if names >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    let config = tests::config_in(
        &dir,
        format!(
            "[[agent]]\nname = \"esc\"\nmatch = {{ pid = {pid} }}\n\
             [[agent.probe]]\nurl = \"http://{}/status\"\ntimeout = \"1s\"\n\
             fields = {{ status = \"/status\", current_task = \"/current_task\" }}\n\
             expect = {{ status = \"ok\" }}\n",
            server.addr
        ),
    );
    let state = dir.join("state");
    let snaps = dir.join("snaps");
    let cfg = config.as_os_str();
    let places = Places::new(&state, &snaps)
        .helper(dir.join("none.sock"))
        .args();
    let common = dry_run_args(&config, &places);
    let mut runs: Vec<(String, Output)> = Vec::new();
    let mut check = vec!["check".as_ref()];
    check.extend(&common);
    runs.push(("check".into(), run(&check)));
    let mut watch = vec![
        "watch".as_ref(),
        "--count".as_ref(),
        "1".as_ref(),
        "--interval".as_ref(),
        "1s".as_ref(),
    ];
    watch.extend(&common);
    runs.push(("watch".into(), run(&watch)));
    let pid_text = pid.to_string();
    runs.push((
        "inspect --pid".into(),
        run(&[
            "inspect".as_ref(),
            "--pid".as_ref(),
            pid_text.as_ref(),
            "--no-ebpf".as_ref(),
        ]),
    ));
    runs.push((
        "inspect NAME".into(),
        run(&[
            "inspect".as_ref(),
            "esc".as_ref(),
            "--config".as_ref(),
            cfg,
            "--state-dir".as_ref(),
            state.as_os_str(),
            "--no-ebpf".as_ref(),
        ]),
    ));
    runs.push((
        "config check".into(),
        run(&[
            "config".as_ref(),
            "check".as_ref(),
            "--config".as_ref(),
            cfg,
        ]),
    ));
    runs.push((
        "snapshots list".into(),
        run(&[
            "snapshots".as_ref(),
            "list".as_ref(),
            "--dir".as_ref(),
            snaps.as_os_str(),
        ]),
    ));
    let empty = dir.join("empty");
    runs.push((
        "snapshots list (empty)".into(),
        run(&[
            "snapshots".as_ref(),
            "list".as_ref(),
            "--dir".as_ref(),
            empty.as_os_str(),
        ]),
    ));
    let listed = run(&[
        "snapshots".as_ref(),
        "list".as_ref(),
        "--json".as_ref(),
        "--dir".as_ref(),
        snaps.as_os_str(),
    ]);
    let id = lossy(&listed.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["id"].as_str().map(str::to_string))
        .expect("check wrote a snapshot");
    runs.push((
        "snapshots show".into(),
        run(&[
            "snapshots".as_ref(),
            "show".as_ref(),
            id.as_ref(),
            "--dir".as_ref(),
            snaps.as_os_str(),
        ]),
    ));

    let mut found = Vec::new();
    for (what, out) in &runs {
        for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            for c in terminal_controls(bytes) {
                found.push(format!("{what} {stream}: {c}"));
            }
        }
    }
    // The inputs did reach the outputs (escaped): the test saw them.
    let inspect = lossy(&runs[2].1.stdout);
    assert!(
        inspect.contains("\\u{1b}"),
        "inspect shows the escaped names: {inspect}"
    );
    assert!(
        found.is_empty(),
        "control characters reached a terminal:\n  {}",
        found.join("\n  ")
    );
}
