//! What the `selfheal` binary prints and answers, pinned byte for byte:
//! `check --json`, the text of `check`, the metrics file, the snapshot of a
//! wedge (`snapshots show`, `snapshots list --json`), `inspect --json` and
//! its text, and the helper's answers to a recorded list of request
//! lines, each for one small situation this test builds on loopback (agents
//! whose control connection went silent, a provider call in flight, a
//! process without sockets, one that is not running, a status endpoint).
//!
//! The outputs are recorded under `tests/golden/` with what varies from one
//! run to the next masked (`‹name›`): pids, ports, inodes, start times,
//! socket cookies, ages and durations, snapshot ids and times, the
//! kernel's stack and wait channel, round-trip times. JSON values are
//! masked by key name on the raw text, so key order, spacing and every
//! other byte are compared as printed. Each case is compared as text; a
//! difference fails naming the case and showing the first line that
//! differs, recorded and now.
//!
//! `SELFHEAL_RECORD_GOLDEN=1 cargo test -p tests --test it -- compat::` rewrites
//! the files from today's binary (each case run five times first, and
//! recorded only when the five agree). Record only for a change of output
//! that is meant, and review the diff of `tests/golden/` as the change.
//!
//! Needs root (the outputs recorded are root's view: kernel stacks, every
//! socket's owner); skips otherwise. Self-contained: its own servers,
//! processes and masking, and only `tests::` fixtures.

use std::{
    io::Write as _,
    net::{TcpListener, TcpStream},
    os::unix::{fs::PermissionsExt as _, net::UnixStream},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use tests::fixtures::{LineConn, Reaped};
use tests::{Peer, Ready, Scratch, need_root, selfheal_bin, status_server, wait_for};

const RECORD: &str = "SELFHEAL_RECORD_GOLDEN";
/// Runs that must agree before a case is recorded.
const RECORD_RUNS: usize = 5;
const SEC: Duration = Duration::from_secs(1);
/// How long the silent connections have been silent when the check runs:
/// past 3 × the control heartbeat (1 s), far from every other threshold.
const SILENCE: Duration = Duration::from_millis(4500);
/// A pid no process is expected to hold (near the top of the 2^22 pids a
/// kernel allows; the other tests' ghost too).
const GHOST_PID: u32 = 4_194_000;

// ---------------------------------------------------------------------------
// Golden files.

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn recording() -> bool {
    std::env::var(RECORD).as_deref() == Ok("1")
}

/// Compares `now` with the golden file `name`, or records it.
fn golden(name: &str, now: &str) {
    let path = golden_dir().join(name);
    if recording() {
        std::fs::create_dir_all(golden_dir()).expect("create tests/golden");
        std::fs::write(&path, now).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        eprintln!("recorded {}", path.display());
        return;
    }
    let recorded = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (record it with {RECORD}=1, see the top of this file)",
            path.display()
        )
    });
    if recorded == now {
        return;
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (recorded.lines().collect(), now.lines().collect());
    let at = (0..old.len().max(new.len()))
        .find(|&i| old.get(i) != new.get(i))
        .unwrap_or(0);
    panic!(
        "{name} differs from its recording at line {}:\n  recorded: {}\n  now:      {}\n\
         --- recorded ---\n{recorded}\n--- now ---\n{now}",
        at + 1,
        old.get(at).copied().unwrap_or("(end)"),
        new.get(at).copied().unwrap_or("(end)"),
    );
}

/// Runs `case` once, or when recording [`RECORD_RUNS`] times, and checks
/// the runs agree before the first is recorded.
fn stable(what: &str, mut case: impl FnMut() -> Vec<(String, String)>) -> Vec<(String, String)> {
    let first = case();
    if recording() {
        for run in 2..=RECORD_RUNS {
            let again = case();
            for ((name, a), (_, b)) in first.iter().zip(&again) {
                assert_eq!(a, b, "{what}: {name} differs on run {run} of {RECORD_RUNS}");
            }
        }
    }
    first
}

// ---------------------------------------------------------------------------
// Masking.

/// What varies between runs, and the name each is shown as.
#[derive(Default)]
struct Masks {
    /// Exact values (pids, ports, inodes, start times), word-bounded.
    values: Vec<(String, String)>,
    /// Durations left as they are: configured, not measured.
    durations: Vec<&'static str>,
}

impl Masks {
    fn value(&mut self, value: impl ToString, name: &str) {
        let v = value.to_string();
        assert!(v.len() >= 3, "{name} = {v:?} is too short to mask safely");
        let name = format!("‹{name}›");
        if let Some(had) = self.values.iter().find(|(had, _)| *had == v) {
            assert_eq!(
                had.1, name,
                "{v} is both {} and {name}: two values that vary coincide in this run (run again)",
                had.1
            );
            return;
        }
        self.values.push((v, name));
    }
}

/// JSON keys whose scalar values vary between runs (in an array: each of
/// its scalars).
const VOLATILE_KEYS: &[&str] = &[
    "age_ms",
    "cookie",
    "cpu_ticks",
    "idle_ms",
    "inode",
    "last_ack_recv_ms",
    "last_data_recv_ms",
    "last_data_sent_ms",
    "latency_ms",
    "pid",
    "ppid",
    "recv_blocked_ms",
    "recv_inode",
    "roots",
    "rto_us",
    "rtt_us",
    "snapshot",
    "sockets",
    "start_ticks",
    "tid",
    "wchan",
    "helper_pid",
    "exited_after_ms",
    "watched_ms",
    "elapsed_ms",
    "took_ms",
    "silent_ms",
    "user_timeout_ms",
    "time",
    "unix_ms",
];

/// JSON keys whose whole value (an array's length too) differs between
/// machines: the kernel's stack.
const WHOLE_KEYS: &[&str] = &["kstack"];

/// `s` (JSON text, one or more documents) with the scalar values of
/// [`VOLATILE_KEYS`] replaced by `‹key›` (null, true and false are kept)
/// and the values of [`WHOLE_KEYS`] by `"‹key›"`, every other byte kept.
fn mask_json(s: &str) -> String {
    struct Frame {
        object: bool,
        key: Option<String>,
    }
    let mut out = String::with_capacity(s.len());
    let mut stack: Vec<Frame> = Vec::new();
    let mut pending: Option<String> = None;
    let mut expect_key = false;
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    // The key a value at this point sits under.
    let key_here = |stack: &[Frame], pending: &Option<String>| match stack.last() {
        Some(f) if f.object => pending.clone(),
        Some(f) => f.key.clone(),
        None => None,
    };
    let volatile = |k: &Option<String>| k.as_deref().is_some_and(|k| VOLATILE_KEYS.contains(&k));
    while i < chars.len() {
        let c = chars[i];
        let whole = key_here(&stack, &pending)
            .filter(|k| WHOLE_KEYS.contains(&k.as_str()) && (c == '[' || c == '{'));
        if let Some(key) = whole {
            // Skip the value, strings and nesting included.
            let mut depth = 0usize;
            let mut in_string = false;
            while i < chars.len() {
                let ch = chars[i];
                i += 1;
                match ch {
                    '\\' if in_string => i += 1,
                    '"' => in_string = !in_string,
                    '[' | '{' if !in_string => depth += 1,
                    ']' | '}' if !in_string => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
            }
            pending = None;
            out.push_str(&format!("\"‹{key}›\""));
            continue;
        }
        match c {
            '{' | '[' => {
                let key = key_here(&stack, &pending);
                pending = None;
                stack.push(Frame {
                    object: c == '{',
                    key,
                });
                expect_key = c == '{';
                out.push(c);
                i += 1;
            }
            '}' | ']' => {
                stack.pop();
                expect_key = false;
                out.push(c);
                i += 1;
            }
            ',' => {
                expect_key = stack.last().is_some_and(|f| f.object);
                out.push(c);
                i += 1;
            }
            '"' => {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                let raw: String = chars[start..i.min(chars.len())].iter().collect();
                if expect_key {
                    pending = Some(raw.trim_matches('"').to_string());
                    expect_key = false;
                    out.push_str(&raw);
                } else {
                    let key = key_here(&stack, &pending);
                    if stack.last().is_some_and(|f| f.object) {
                        pending = None;
                    }
                    if volatile(&key) {
                        out.push_str(&format!("\"‹{}›\"", key.unwrap_or_default()));
                    } else {
                        out.push_str(&raw);
                    }
                }
            }
            c if c.is_whitespace() || c == ':' => {
                out.push(c);
                i += 1;
            }
            _ => {
                let start = i;
                while i < chars.len() && !",}] \n\r\t".contains(chars[i]) {
                    i += 1;
                }
                let token: String = chars[start..i].iter().collect();
                let key = key_here(&stack, &pending);
                if stack.last().is_some_and(|f| f.object) {
                    pending = None;
                }
                if volatile(&key) && !matches!(token.as_str(), "null" | "true" | "false") {
                    out.push_str(&format!("‹{}›", key.unwrap_or_default()));
                } else {
                    out.push_str(&token);
                }
            }
        }
    }
    out
}

/// Whether `c` continues a number or a word next to a masked value.
fn joins(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `s` with each of `masks.values` replaced where it stands alone (not part
/// of a longer number or word), longest first.
fn mask_values(s: &str, masks: &Masks) -> String {
    let mut values: Vec<&(String, String)> = masks.values.iter().collect();
    values.sort_by_key(|(v, _)| std::cmp::Reverse(v.len()));
    let mut s = s.to_string();
    for (v, name) in values {
        let mut out = String::with_capacity(s.len());
        let mut rest = s.as_str();
        while let Some(at) = rest.find(v.as_str()) {
            let before = rest[..at].chars().next_back();
            let after = rest[at + v.len()..].chars().next();
            out.push_str(&rest[..at]);
            if joins(before) || joins(after) {
                out.push_str(v);
            } else {
                out.push_str(name);
            }
            rest = &rest[at + v.len()..];
        }
        out.push_str(rest);
        s = out;
    }
    s
}

/// `s` with every duration written as text (`8.2s`, `120ms`, `1m`) but
/// those in `masks.durations` replaced by `‹dur›`.
fn mask_durations(s: &str, masks: &Masks) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        let prev = i.checked_sub(1).map(|p| chars[p]);
        if chars[i].is_ascii_digit() && !joins(prev) && prev != Some('.') {
            let start = i;
            while i < chars.len() && chars[i].is_ascii_digit() {
                i += 1;
            }
            if i + 1 < chars.len() && chars[i] == '.' && chars[i + 1].is_ascii_digit() {
                i += 1;
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let unit = ["ms", "us", "s", "m", "h"].into_iter().find(|u| {
                let end = i + u.len();
                end <= chars.len()
                    && chars[i..end].iter().copied().eq(u.chars())
                    && !joins(chars.get(end).copied())
            });
            let token: String = chars[start..i + unit.map_or(0, str::len)].iter().collect();
            match unit {
                Some(u) if !masks.durations.contains(&token.as_str()) => {
                    out.push_str("‹dur›");
                    i += u.len();
                }
                Some(u) => {
                    out.push_str(&token);
                    i += u.len();
                }
                None => out.push_str(&token),
            }
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// `s` with each snapshot id (`20261202T034243Z-agent-c2de-0`) replaced by
/// `‹snapshot›`.
fn mask_snapshot_ids(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let is_id_at = |i: usize| {
        let d = |k: usize| chars.get(i + k).is_some_and(char::is_ascii_digit);
        (0..8).all(d)
            && chars.get(i + 8) == Some(&'T')
            && (9..15).all(d)
            && chars.get(i + 15) == Some(&'Z')
            && chars.get(i + 16) == Some(&'-')
    };
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        if is_id_at(i) && (i == 0 || !joins(Some(chars[i - 1]))) {
            out.push_str("‹snapshot›");
            while i < chars.len() && !" \"\n]},".contains(chars[i]) {
                i += 1;
            }
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// Runs of spaces next to a mask become one space (but a line's indent):
/// a column padded to a value's width moves with the width.
fn collapse_around_masks(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for line in s.split_inclusive('\n') {
        let body = line.trim_start_matches(' ');
        out.push_str(&line[..line.len() - body.len()]);
        let mut l = body.to_string();
        while l.contains("  ‹") {
            l = l.replace("  ‹", " ‹");
        }
        while l.contains("›  ") {
            l = l.replace("›  ", "› ");
        }
        out.push_str(&l);
    }
    out
}

/// `s` with each socket cookie written in hex (`cookie 0x9d387`) replaced
/// by `cookie ‹cookie›`.
fn mask_cookies(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("cookie 0x") {
        let after = &rest[at + "cookie 0x".len()..];
        let hex = after
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(after.len());
        out.push_str(&rest[..at]);
        out.push_str("cookie ‹cookie›");
        rest = &after[hex..];
    }
    out.push_str(rest);
    out
}

/// Everything masked in text output.
fn mask_text(s: &str, masks: &Masks) -> String {
    let s = mask_cookies(&mask_snapshot_ids(s));
    let s = mask_values(&s, masks);
    let s = mask_durations(&s, masks);
    collapse_around_masks(&s)
}

/// Everything masked in JSON output.
fn mask_json_text(s: &str, masks: &Masks) -> String {
    mask_text(&mask_json(s), masks)
}

/// Metrics that are measured, not counted: their values are masked.
const MEASURED_METRICS: &[&str] = &[
    "selfheal_check_duration_seconds",
    "selfheal_last_check_timestamp_seconds",
    "selfheal_probe_latency_seconds",
];

fn mask_metrics(s: &str, masks: &Masks) -> String {
    let lines: String = s
        .split_inclusive('\n')
        .map(|line| {
            let measured = MEASURED_METRICS.iter().any(|m| {
                line.strip_prefix(m)
                    .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
            });
            match line.rsplit_once(' ') {
                Some((name, _)) if measured => format!("{name} ‹value›\n"),
                _ => line.to_string(),
            }
        })
        .collect();
    mask_text(&lines, masks)
}

// ---------------------------------------------------------------------------
// The situation.

/// A loopback server that accepts and never sends.
struct Silent {
    listener: TcpListener,
    held: Vec<TcpStream>,
}

impl Silent {
    fn new() -> Silent {
        Silent {
            listener: TcpListener::bind("127.0.0.1:0").expect("bind loopback"),
            held: Vec::new(),
        }
    }

    fn addr(&self) -> String {
        self.listener.local_addr().expect("local addr").to_string()
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().expect("local addr").port()
    }

    /// A `recv-peer client` connected here, blocked in its first read.
    fn client(&mut self) -> (Peer, Ready) {
        let mut peer = Peer::recv_peer(&["client", &self.addr()]);
        let ready = peer.ready();
        let (s, _) = self.listener.accept().expect("accept the peer");
        self.held.push(s);
        peer.tell("go");
        (peer, ready)
    }
}

/// `sleep 3600` (ignoring SIGTERM when `stubborn`), started.
fn sleeper(stubborn: bool) -> Reaped {
    let script = if stubborn {
        "trap '' TERM; exec sleep 3600"
    } else {
        "exec sleep 3600"
    };
    let child = Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep");
    let pid = child.id();
    wait_for(5 * SEC, Duration::from_millis(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .filter(|c| c.trim() == "sleep")
    })
    .expect("sleep started");
    Reaped(child)
}

/// A process's start time in clock ticks after boot (`/proc/PID/stat`
/// field 22).
fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let (_, rest) = stat.rsplit_once(") ").expect("a stat line");
    rest.split(' ')
        .nth(19)
        .and_then(|t| t.parse().ok())
        .expect("start time in stat")
}

fn run(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(selfheal_bin())
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .expect("run selfheal")
}

fn exit_line(out: &Output) -> String {
    format!("exit {}\n", out.status.code().unwrap_or(-1))
}

/// One run of the situation: a fresh set of processes and connections,
/// checked and inspected; the masked outputs by golden file name.
fn check_situation(run_no: usize) -> Vec<(String, String)> {
    let scratch = Scratch::new(&format!("compat-check-{run_no}"));
    let mut control = Silent::new();
    let mut provider = Silent::new();
    let (_wedging, w) = control.client();
    let (_thinking, t) = provider.client();
    let quiet = sleeper(false);
    let status = status_server(
        r#"{"status": "connected", "current_task": "WI-7", "load": 0.25}"#,
        100,
    );
    let began = Instant::now();

    let mut masks = Masks {
        durations: vec!["1s", "1.0s", "60s", "2s"],
        ..Masks::default()
    };
    masks.value(w.pid, "pid:wedging");
    masks.value(t.pid, "pid:thinking");
    masks.value(quiet.0.id(), "pid:quiet");
    masks.value(std::process::id(), "pid:test");
    masks.value(w.inode, "inode:wedging");
    masks.value(t.inode, "inode:thinking");
    masks.value(start_ticks(w.pid), "ticks");
    masks.value(start_ticks(t.pid), "ticks");
    masks.value(start_ticks(quiet.0.id()), "ticks");
    masks.value(control.port(), "port:control");
    masks.value(provider.port(), "port:provider");
    masks.value(status.port(), "port:status");
    for r in [&w, &t] {
        let port = r.local.rsplit_once(':').expect("local address").1;
        masks.value(port, "port:local");
    }
    masks.value(scratch.0.display(), "scratch");

    let config = tests::config_in(
        &scratch,
        format!(
            "[[agent]]\nname = \"wedging\"\nmatch = {{ pid = {wp} }}\n\
             [[agent.upstream]]\nrole = \"control\"\naddr = \"{control}\"\nheartbeat = \"1s\"\n\
             [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"2s\"\n\
             fields = {{ server_status = \"/status\", current_task = \"/current_task\" }}\n\
             expect = {{ server_status = \"connected\" }}\n\
             [[agent]]\nname = \"thinking\"\nmatch = {{ pid = {tp} }}\n\
             [[agent.upstream]]\nrole = \"provider\"\naddr = \"{provider}\"\n\
             [agent.thresholds]\nsuspect_after = \"60s\"\n\
             [[agent]]\nname = \"quiet\"\nmatch = {{ pid = {qp} }}\n\
             [[agent]]\nname = \"ghost\"\nmatch = {{ pid = {GHOST_PID} }}\n",
            wp = w.pid,
            tp = t.pid,
            qp = quiet.0.id(),
            control = control.addr(),
            provider = provider.addr(),
        ),
    );
    if let Some(left) = SILENCE.checked_sub(began.elapsed()) {
        std::thread::sleep(left);
    }

    let helper = scratch.join("no-helper.sock");
    let mut outputs = Vec::new();
    let check = |tag: &str, json: bool| {
        let state = scratch.join(&format!("{tag}-state"));
        let snaps = scratch.join(&format!("{tag}-snaps"));
        let metrics = scratch.join(&format!("{tag}.prom"));
        let mut args: Vec<&std::ffi::OsStr> = vec!["check".as_ref(), "--dry-run".as_ref()];
        if json {
            args.push("--json".as_ref());
        }
        args.extend([
            "--config".as_ref(),
            config.as_os_str(),
            "--state-dir".as_ref(),
            state.as_os_str(),
            "--snapshot-dir".as_ref(),
            snaps.as_os_str(),
            "--helper".as_ref(),
            helper.as_os_str(),
            "--metrics-file".as_ref(),
            metrics.as_os_str(),
            // Procfs alone: the eBPF metrics would otherwise depend on
            // whether this host holds pinned task iterators.
            "--no-iterators".as_ref(),
        ]);
        let out = run(&args);
        let prom = std::fs::read_to_string(&metrics).unwrap_or_default();
        (out, prom)
    };
    let (out, prom) = check("json", true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    outputs.push((
        "check.json".to_string(),
        exit_line(&out) + &mask_json_text(&stdout, &masks),
    ));
    outputs.push(("check.prom".to_string(), mask_metrics(&prom, &masks)));
    // The snapshot the wedge left, as `snapshots` shows it.
    let id = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["agent"] == "wedging")
        .and_then(|r| r["snapshot"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no snapshot of the wedge in {stdout}"));
    let snaps = scratch.join("json-snaps");
    let show = run(&[
        "snapshots".as_ref(),
        "show".as_ref(),
        id.as_ref(),
        "--dir".as_ref(),
        snaps.as_os_str(),
    ]);
    outputs.push((
        "snapshot-show.json".to_string(),
        exit_line(&show) + &mask_json_text(&String::from_utf8_lossy(&show.stdout), &masks),
    ));
    let list = run(&[
        "snapshots".as_ref(),
        "list".as_ref(),
        "--json".as_ref(),
        "--dir".as_ref(),
        snaps.as_os_str(),
    ]);
    outputs.push((
        "snapshot-list.json".to_string(),
        exit_line(&list) + &mask_json_text(&String::from_utf8_lossy(&list.stdout), &masks),
    ));
    let (out, _) = check("text", false);
    outputs.push((
        "check.txt".to_string(),
        exit_line(&out) + &mask_text(&String::from_utf8_lossy(&out.stdout), &masks),
    ));

    let state = scratch.join("inspect-state");
    for (file, json) in [("inspect.json", true), ("inspect.txt", false)] {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "inspect".as_ref(),
            "wedging".as_ref(),
            "--no-ebpf".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--state-dir".as_ref(),
            state.as_os_str(),
        ];
        if json {
            args.push("--json".as_ref());
        }
        let out = run(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        if json {
            // The wait channels the kernel names, masked in the text too.
            let doc: serde_json::Value = serde_json::from_str(&stdout)
                .unwrap_or_else(|e| panic!("inspect --json: {e}: {stdout}"));
            let mut wchans = Vec::new();
            strings_under(&doc, "wchan", &mut wchans);
            wchans.sort();
            wchans.dedup();
            for w in wchans.into_iter().filter(|w| w.len() >= 3) {
                masks.value(w, "wchan");
            }
        }
        let text = if json {
            mask_json_text(&stdout, &masks)
        } else {
            mask_kernel_text(&mask_text(&stdout, &masks))
        };
        outputs.push((file.to_string(), exit_line(&out) + &text));
    }
    outputs
}

/// The kernel's stack in `inspect`'s text (it differs between kernels)
/// masked.
fn mask_kernel_text(s: &str) -> String {
    s.split_inclusive('\n')
        .map(|line| {
            let trimmed = line.trim_start();
            if trimmed.starts_with("kernel: ") {
                let indent = &line[..line.len() - trimmed.len()];
                format!("{indent}kernel: ‹kstack›\n")
            } else {
                line.to_string()
            }
        })
        .collect()
}

/// Every string under key `key` in JSON `v`.
fn strings_under(v: &serde_json::Value, key: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match x {
                    serde_json::Value::String(s) if k == key => out.push(s.clone()),
                    _ => strings_under(x, key, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| strings_under(x, key, out)),
        _ => {}
    }
}

#[test]
fn check_and_inspect_print_what_they_printed() {
    let _area = tests::area(module_path!());
    if !need_root("compat check and inspect") {
        return;
    }
    let mut n = 0;
    let outputs = stable("check situation", || {
        n += 1;
        check_situation(n)
    });
    for (name, text) in &outputs {
        golden(name, text);
    }
}

// ---------------------------------------------------------------------------
// The helper.

/// `selfheal helper --no-ebpf` on a socket in `scratch`, killed on drop.
fn start_helper(scratch: &Scratch) -> (Reaped, PathBuf) {
    let socket = scratch.join("helper.sock");
    let policy = scratch.join("helper.toml");
    std::fs::write(&policy, "").expect("write policy");
    std::fs::set_permissions(&policy, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let child = Command::new(selfheal_bin())
        .arg("helper")
        .arg("--no-ebpf")
        .arg("--socket")
        .arg(&socket)
        .arg("--policy")
        .arg(&policy)
        .arg("--subuid")
        .arg(scratch.join("no-subuid"))
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the helper");
    let helper = Reaped(child);
    wait_for(10 * SEC, Duration::from_millis(20), || {
        UnixStream::connect(&socket).ok()
    })
    .expect("the helper listens");
    (helper, socket)
}

/// A line-level helper client.
struct Raw(LineConn);

impl Raw {
    fn connect(path: &Path) -> Raw {
        Raw(LineConn::connect(path))
    }

    /// Sends `line` (and `\n`); the answer line, or `(closed)`.
    fn ask(&mut self, line: &str) -> String {
        let _ = self.0.stream.write_all(format!("{line}\n").as_bytes());
        self.recv()
    }

    fn recv(&mut self) -> String {
        match self.0.read_line() {
            Ok(Some(answer)) => answer,
            Ok(None) | Err(_) => "(closed)\n".to_string(),
        }
    }
}

/// One run of the helper's replay: the request lines sent and the answers,
/// masked.
fn helper_replay(run_no: usize) -> Vec<(String, String)> {
    let scratch = Scratch::new(&format!("compat-helper-{run_no}"));
    let (helper, socket) = start_helper(&scratch);
    let mut server = Silent::new();
    let (_a, a) = server.client();
    let (_b, b) = server.client();
    let (_c, c) = server.client();
    let quiet = sleeper(false);
    let stubborn = sleeper(true);

    let mut masks = Masks::default();
    masks.value(helper.0.id(), "pid:helper");
    masks.value(std::process::id(), "pid:test");
    masks.value(server.port(), "port:server");
    for (r, n) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        masks.value(r.pid, &format!("pid:{n}"));
        masks.value(r.inode, &format!("inode:{n}"));
        let port = r.local.rsplit_once(':').expect("local address").1;
        masks.value(port, &format!("port:{n}"));
    }
    masks.value(a.inode + 1, "inode:wrong");
    masks.value(quiet.0.id(), "pid:quiet");
    masks.value(stubborn.0.id(), "pid:stubborn");
    // Processes started within one tick share a start time: one name for
    // all of them.
    for pid in [
        a.pid,
        b.pid,
        c.pid,
        quiet.0.id(),
        stubborn.0.id(),
        helper.0.id(),
    ] {
        masks.value(start_ticks(pid), "ticks");
    }
    masks.value(start_ticks(quiet.0.id()) + 1, "ticks");
    masks.value(scratch.0.display(), "scratch");

    let act = |action: &str, r: &Ready, rest: &str| {
        format!(
            r#"{{"v":1,"id":{{ID}},"op":"act","action":"{action}","pid":{},"start_ticks":{},"fd":3,"inode":{},"agent":"compat"{rest}}}"#,
            r.pid,
            start_ticks(r.pid),
            r.inode
        )
    };
    let proof = r#","params":{"idle_s":1,"interval_s":1,"count":3,"hold_ms":120000}"#;
    let on = |action: &str, pid: u32, rest: &str| {
        format!(
            r#"{{"v":1,"id":{{ID}},"op":"act","action":"{action}","pid":{pid},"start_ticks":{},"agent":"compat"{rest}}}"#,
            start_ticks(pid)
        )
    };
    let mut wrong_ticks = on("signal", quiet.0.id(), "");
    wrong_ticks = wrong_ticks.replace(
        &format!("\"start_ticks\":{}", start_ticks(quiet.0.id())),
        &format!("\"start_ticks\":{}", start_ticks(quiet.0.id()) + 1),
    );
    let mut wrong_inode = act("arm_keepalive", &a, "");
    wrong_inode = wrong_inode.replace(
        &format!("\"inode\":{}", a.inode),
        &format!("\"inode\":{}", a.inode + 1),
    );
    let lines: Vec<String> = vec![
        r#"{"v":1,"id":{ID},"op":"hello"}"#.into(),
        format!(r#"{{"v":1,"id":{{ID}},"op":"watch","pids":[{}]}}"#, a.pid),
        format!(r#"{{"v":1,"id":{{ID}},"op":"unwatch","pids":[{}]}}"#, a.pid),
        format!(
            r#"{{"v":1,"id":{{ID}},"op":"ebpf_snapshot","pids":[{}]}}"#,
            a.pid
        ),
        format!(r#"{{"v":1,"id":{{ID}},"op":"iterate","pids":[{}]}}"#, a.pid),
        on("signal", 1, ""),
        on("restart", helper.0.id(), ""),
        wrong_ticks,
        format!(
            r#"{{"v":1,"id":{{ID}},"op":"act","action":"signal","pid":{GHOST_PID},"start_ticks":1}}"#
        ),
        wrong_inode,
        on("arm_keepalive", quiet.0.id(), r#","fd":0,"inode":1"#),
        act("arm_keepalive", &a, ""),
        act("prove_keepalive", &a, proof),
        act("restore_keepalive", &a, ""),
        act("restore_keepalive", &a, ""),
        act("prove_keepalive", &b, proof),
        act("expire_keepalive", &b, ""),
        act("destroy_socket", &c, ""),
        on("signal", stubborn.0.id(), r#","params":{"grace_ms":300}"#),
        on("signal", quiet.0.id(), r#","params":{"grace_ms":120001}"#),
        "{not json".into(),
        r#"{"v":2,"id":{ID},"op":"hello"}"#.into(),
        r#"{"v":1,"id":{ID},"op":"reboot"}"#.into(),
        r#"{"v":1,"id":{ID},"op":"act","action":"signal","pid":5}"#.into(),
        "".into(),
    ];
    let mut conn = Raw::connect(&socket);
    let mut transcript = String::new();
    for (i, line) in lines.iter().enumerate() {
        let line = line.replace("{ID}", &(i + 1).to_string());
        let answer = conn.ask(&line);
        transcript.push_str(&format!("> {line}\n< {answer}"));
    }
    // An oversized line: answered, then the connection is closed.
    let mut big = r#"{"v":1,"id":99,"op":"hello","pad":""#.to_string();
    big.push_str(&"x".repeat(100 * 1024));
    big.push_str("\"}");
    let mut huge = Raw::connect(&socket);
    let answer = huge.ask(&big);
    let after = huge.recv();
    transcript.push_str(&format!(
        "> (a hello padded to {} bytes)\n< {answer}< {after}",
        big.len()
    ));
    vec![(
        "helper.txt".to_string(),
        mask_json_text(&transcript, &masks),
    )]
}

#[test]
fn the_helper_answers_what_it_answered() {
    let _area = tests::area(module_path!());
    if !need_root("compat helper") {
        return;
    }
    // The socket actions are done on the test's own loopback peers, and
    // `signal` on its own sleepers.
    let mut n = 0;
    let outputs = stable("helper replay", || {
        n += 1;
        helper_replay(n)
    });
    for (name, text) in &outputs {
        golden(name, text);
    }
}

/// The masking itself, on fixed text.
#[test]
fn masking_keeps_everything_but_what_varies() {
    let _area = tests::area(module_path!());
    let mut masks = Masks {
        durations: vec!["1.0s"],
        ..Masks::default()
    };
    masks.value(14774, "pid:a");
    masks.value(35357, "port:c");
    let json = r#"{"agent":"a","kstack":["x","y]"],"pid":14774,"roots":[14774,14775],"fd":3,"age_ms":null,"snapshot":"20261202T034243Z-a-c2de-0","m":"pid 14774 on 127.0.0.1:35357 silent 8.2s, heartbeat 1.0s, pid 147740"}"#;
    assert_eq!(
        mask_json_text(json, &masks),
        r#"{"agent":"a","kstack":"‹kstack›","pid":‹pid›,"roots":[‹roots›,‹roots›],"fd":3,"age_ms":null,"snapshot":"‹snapshot›","m":"pid ‹pid:a› on 127.0.0.1:‹port:c› silent ‹dur›, heartbeat 1.0s, pid 147740"}"#
    );
    let text = "  thread   14774 recv-peer S wait_woken   blocked 30.5s in recvfrom\n";
    assert_eq!(
        mask_text(text, &masks),
        "  thread ‹pid:a› recv-peer S wait_woken   blocked ‹dur› in recvfrom\n"
    );
    let prom =
        "selfheal_check_duration_seconds 0.188473\nselfheal_agent_processes{agent=\"a\"} 1\n";
    assert_eq!(
        mask_metrics(prom, &masks),
        "selfheal_check_duration_seconds ‹value›\nselfheal_agent_processes{agent=\"a\"} 1\n"
    );
}
