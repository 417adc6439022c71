//! A fleet's view: the metrics pass `promtool check metrics`;
//! the alert rules pass `promtool check rules` and their unit tests; the
//! Grafana dashboard parses and names only metrics selfheal exports; a
//! metrics file on a full disk keeps its last good content; and, end to
//! end, the incident run under `selfheal watch --metrics-addr`, scraped by a
//! real Prometheus with the rules loaded, paged through a real Alertmanager
//! to a webhook receiver this test runs: the wedge alert (agent, reason,
//! host, snapshot id), then its resolution after the heal, with the times.

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use tests::fixtures::{Places, Reaped, check_cmd};
use tests::{Scratch, need_root, selfheal_bin};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rules_dir() -> PathBuf {
    repo().join("dist/prometheus")
}

fn dashboard() -> PathBuf {
    repo().join("dist/grafana/selfheal-fleet.json")
}

/// `promtool`, or a failure saying how to get it (the set-up installs it).
fn promtool() -> Command {
    assert!(
        Command::new("promtool").arg("--version").output().is_ok(),
        "no promtool: run `cargo xtask setup` (Debian package prometheus)"
    );
    Command::new("promtool")
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

/// One `selfheal check` writing `metrics`: its exit code and stderr.
fn check_writing(dir: &Path, config: &Path, metrics: &Path) -> (i32, String) {
    // Procfs alone: otherwise whether this host holds pinned task
    // iterators (which give eBPF evidence with no helper) decides the
    // eBPF metrics.
    let out = check_cmd(
        config,
        &Places::under(dir)
            .metrics(metrics)
            .helper(dir.join("helper.sock")),
    )
    .arg("--no-iterators")
    .output()
    .expect("run selfheal check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A config of two agents: this test process (healthy) and one that is
/// down, names with the characters a name may have beside letters.
fn two_agents(dir: &Path) -> PathBuf {
    tests::config_in(
        dir,
        format!(
            "[[agent]]\nname = \"my.agent-1_x\"\nmatch = {{ pid = {} }}\n\
             [[agent]]\nname = \"gone\"\nmatch = {{ cmdline = \"no-such-program-selfheal-alerting\" }}\n",
            std::process::id()
        ),
    )
}

/// The metric families a text names in its `# TYPE` lines.
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_rules_pass_promtool_check_and_their_unit_tests() {
    let _area = tests::area(module_path!());
    let t = Instant::now();
    let out = run_ok(
        promtool()
            .arg("check")
            .arg("rules")
            .arg(rules_dir().join("selfheal-rules.yml")),
    );
    println!("{out}");
    let out = run_ok(promtool().current_dir(rules_dir()).args([
        "test",
        "rules",
        "selfheal-rules.test.yml",
    ]));
    println!("{out}");
    println!(
        "promtool check + test rules: {} ms",
        t.elapsed().as_millis()
    );
}

#[test]
fn the_metrics_pass_promtool_and_the_dashboard_names_only_them() {
    let _area = tests::area(module_path!());
    let s = Scratch::new("alerting-lint");
    let config = two_agents(&s.0);
    let prom = s.0.join("selfheal.prom");
    // Twice: the second check's counters come from the history.
    for _ in 0..2 {
        let (code, err) = check_writing(&s.0, &config, &prom);
        assert_eq!(code, 2, "the down agent gives 2: {err}");
    }
    let text = std::fs::read_to_string(&prom).expect("metrics written");
    let mut lint = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool check metrics");
    lint.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("selfheal_agent_verdict{agent=\"my.agent-1_x\",verdict=\"healthy\"} 1"));
    assert!(
        text.contains("selfheal_agent_reasons_total{agent=\"gone\",reason=\"no_process\"} 1\n")
    );
    assert!(text.contains("selfheal_agent_not_ok_checks_total{agent=\"gone\"} 2\n"));
    assert!(text.contains("selfheal_agent_last_snapshot_info{agent=\"gone\",snapshot=\""));
    assert!(text.contains("selfheal_helper_up 0\n"));
    assert!(text.contains("selfheal_ebpf_strategy_info{strategy=\"none\",why_none=\""));

    let mut known = families(&text);
    // Exported only where an agent runs in a container.
    known.insert("selfheal_agent_container_info".into());
    for name in dashboard_metrics() {
        assert!(
            known.contains(&name),
            "the dashboard names {name}, not exported: {known:?}"
        );
    }
    // And the rules.
    let rules = std::fs::read_to_string(rules_dir().join("selfheal-rules.yml")).unwrap();
    for name in metric_names(&rules) {
        assert!(known.contains(&name), "the rules name {name}, not exported");
    }
}

/// Every `selfheal_…` name in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("selfheal_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        // `selfheal_agent_…` names, not words like selfheal_rules.
        if name.contains('_') && !name.ends_with('_') && name != "selfheal_rules" {
            out.insert(name.to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The dashboard's queries, parsed.
fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(dashboard()).expect("read the dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    assert!(
        d["title"].is_string() && d["uid"].is_string(),
        "not a dashboard"
    );
    let panels = d["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut out = Vec::new();
    for p in panels {
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("no targets: {p}"));
        assert!(!targets.is_empty(), "a panel without queries: {p}");
        for t in targets {
            out.push(
                t["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("no expr: {t}"))
                    .to_string(),
            );
        }
    }
    out
}

fn dashboard_metrics() -> BTreeSet<String> {
    let all: BTreeSet<String> = dashboard_queries()
        .iter()
        .flat_map(|q| metric_names(q))
        .collect();
    assert!(all.len() >= 10, "{all:?}");
    all
}

/// A metrics file on a full disk: the check says so (a gap, exit ≥ 1) and
/// the last good file stays, whole.
#[test]
fn a_metrics_file_on_a_full_disk_keeps_its_last_good_content() {
    let _area = tests::area(module_path!());
    if !need_root("metrics_full_disk") {
        return;
    }
    let s = Scratch::new("alerting-full");
    let mnt = s.0.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::set_permissions(&mnt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    run_ok(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs"])
            .arg(&mnt),
    );
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.clone());
    let config = two_agents(&s.0);
    let prom = mnt.join("selfheal.prom");
    let (code, err) = check_writing(&s.0, &config, &prom);
    assert_eq!(code, 2, "{err}");
    let good = std::fs::read_to_string(&prom).expect("first metrics written");
    assert!(good.ends_with('\n') && good.contains("selfheal_last_check_timestamp_seconds"));
    // Fill the disk.
    let mut f = std::fs::File::create(mnt.join("fill")).unwrap();
    let chunk = vec![0u8; 4096];
    for _ in 0..1000 {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    drop(f);
    // The JSON results carry the gap; exit code at least 1 (2 here: down).
    let out = check_cmd(
        &config,
        &Places::under(&s.0)
            .metrics(&prom)
            .helper(s.0.join("helper.sock")),
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("full disk: exit {:?}; {stderr}", out.status.code());
    assert!(stderr.contains("metrics file not written"), "{stderr}");
    assert!(stdout.contains("metrics file not written"), "{stdout}");
    assert_eq!(
        std::fs::read_to_string(&prom).unwrap(),
        good,
        "the last good file changed"
    );
    assert!(
        !mnt.join("selfheal.prom.tmp").exists(),
        "a temp file left behind"
    );
    // A healthy-only config exits 1, not 0: the file was asked for.
    let me = s.0.join("me.toml");
    tests::own_agent_config(&me);
    let (code, err) = check_writing(&s.0, &me, &prom);
    assert_eq!(code, 1, "{err}");
    // Room again: written again.
    std::fs::remove_file(mnt.join("fill")).unwrap();
    let (code, err) = check_writing(&s.0, &me, &prom);
    assert_eq!(code, 0, "{err}");
    assert_ne!(std::fs::read_to_string(&prom).unwrap(), good);
}

/// A free port on the loopback of the namespace `ns`.
fn free_port(ns: &selfheal_testbed::topology::Netns) -> u16 {
    ns.enter(|| {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
    })
    .expect("enter the namespace")
    .expect("bind a free port")
}

/// `GET path` on `addr` (HTTP/1.0, so the server closes): status and body.
/// Bounded by 5 s.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.take(16 << 20).read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// Percent-encodes a query parameter.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// An instant query on Prometheus at `prom`, from inside `ns`: the `data`.
fn query(
    ns: &selfheal_testbed::topology::Netns,
    prom: SocketAddr,
    q: &str,
) -> Result<serde_json::Value, String> {
    let path = format!("/api/v1/query?query={}", encode(q));
    let (code, body) = ns
        .enter(|| http_get(prom, &path))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{code}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{q}: {body}"));
    }
    Ok(v["data"].clone())
}

/// The webhook receiver: each POST's JSON body on the channel. Runs until
/// `until` (a thread, bounded).
fn webhook(listener: TcpListener, until: Instant) -> mpsc::Receiver<serde_json::Value> {
    let (tx, rx) = mpsc::channel();
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        while Instant::now() < until {
            let mut s = match listener.accept() {
                Ok((s, _)) => s,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            let _ = s.set_nonblocking(false);
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let mut r = BufReader::new(match s.try_clone() {
                Ok(c) => c,
                Err(_) => continue,
            });
            let mut len = 0usize;
            for _ in 0..100 {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut body = vec![0u8; len.min(1 << 20)];
            if r.read_exact(&mut body).is_err() {
                continue;
            }
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            if let Ok(v) = serde_json::from_slice(&body)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    rx
}

/// Waits (at most `limit`) for a notification of `alertname` for `agent`
/// with `status` (`firing` or `resolved`): the alert.
fn wait_alert(
    rx: &mpsc::Receiver<serde_json::Value>,
    alertname: &str,
    agent: &str,
    status: &str,
    limit: Duration,
    seen: &mut Vec<serde_json::Value>,
) -> Option<serde_json::Value> {
    let deadline = Instant::now() + limit;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Ok(msg) = rx.recv_timeout(left) else {
            return None;
        };
        seen.push(msg.clone());
        if let Some(a) = msg["alerts"].as_array().into_iter().flatten().find(|a| {
            a["labels"]["alertname"] == alertname
                && a["labels"]["agent"] == agent
                && a["status"] == status
        }) {
            return Some(a.clone());
        }
    }
    None
}

/// Test timing (documented in RELIABILITY.md): checks every 1 s, scrape and
/// rule evaluation every 1 s, the wedge rule's `for:` 2 s (two evaluations:
/// one scrape alone does not page), Alertmanager `group_wait` and
/// `group_interval` 1 s, Prometheus's resend delay 1 s.
const TEST_FOR: &str = "2s";

#[test]
fn the_wedge_pages_through_prometheus_and_alertmanager_and_resolves_after_the_heal() {
    let _area = tests::area(module_path!());
    use selfheal_testbed::{runner::Mode, scenario};
    if !need_root("alerting_e2e") {
        return;
    }
    for p in ["prometheus", "prometheus-alertmanager"] {
        if Command::new(p).arg("--version").output().is_err() {
            panic!(
                "no {p}: run `cargo xtask setup` (Debian packages prometheus, prometheus-alertmanager)"
            );
        }
    }
    let started = Instant::now();
    let s = Scratch::new("alerting-e2e");
    let opts = scenario::Options {
        selfheal: selfheal_bin(),
        testbed: tests::testbed_bin(),
        heartbeat: Duration::from_secs(1),
        check_every: Duration::from_secs(1),
        net: ((std::process::id() % 25) as u8) * 10 + 10,
        keep_snapshots: None,
        env: Vec::new(),
        check_args: Vec::new(),
    };
    let mut bed = scenario::Bed::new(&opts, "alrt", Duration::from_secs(1)).expect("the testbed");
    bed.add_runner(scenario::RunnerSpec::new("runner", Mode::Blocking))
        .expect("the runner");
    let row = bed.wait_working("runner", 1).expect("the runner works");
    let ns = &bed.topo.runners;
    let (metrics_port, prom_port, am_port) = (free_port(ns), free_port(ns), free_port(ns));
    let hook = ns
        .enter(|| TcpListener::bind("127.0.0.1:0"))
        .expect("enter")
        .expect("bind the webhook");
    let hook_port = hook.local_addr().unwrap().port();
    let rx = webhook(hook, Instant::now() + Duration::from_secs(400));
    let mut seen = Vec::new();

    // selfheal watch, in dry-run: it watches and pages; the heal is a
    // `selfheal check` of the timer's, after the page is out (a watch that
    // healed at once would clear the wedge before any page: see
    // RELIABILITY.md).
    let watch = |dry_run: bool, tag: &str| {
        let mut cmd = ns.command(&opts.selfheal);
        cmd.args([
            "watch",
            "--interval",
            "1s",
            "--metrics-public",
            "--metrics-addr",
        ])
        .arg(format!("127.0.0.1:{metrics_port}"))
        .arg("--config")
        .arg(bed.config_file())
        .args(Places::under(&s.0).helper(bed.helper_socket_path()).args())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.0.join(format!("watch-{tag}.log"))).unwrap());
        if dry_run {
            cmd.arg("--dry-run");
        }
        Reaped(cmd.spawn().expect("run selfheal watch"))
    };
    let mut watching = watch(true, "dry");

    // Alertmanager and Prometheus, scratch dirs, loopback ports picked above.
    let am_dir = s.0.join("alertmanager");
    std::fs::create_dir_all(&am_dir).unwrap();
    std::fs::write(
        am_dir.join("alertmanager.yml"),
        format!(
            "route:\n  receiver: hook\n  group_by: [alertname, instance, agent]\n  group_wait: 1s\n  \
             group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n      \
             - url: http://127.0.0.1:{hook_port}/hook\n        send_resolved: true\n"
        ),
    )
    .unwrap();
    let mut cmd = ns.command(Path::new("prometheus-alertmanager"));
    cmd.arg(format!(
        "--config.file={}",
        am_dir.join("alertmanager.yml").display()
    ))
    .arg(format!("--storage.path={}", am_dir.join("data").display()))
    .arg(format!("--web.listen-address=127.0.0.1:{am_port}"))
    .arg("--cluster.listen-address=")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(s.0.join("alertmanager.log")).unwrap());
    let _am = Reaped(cmd.spawn().expect("run alertmanager"));

    let prom_dir = s.0.join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let rules = std::fs::read_to_string(rules_dir().join("selfheal-rules.yml")).unwrap();
    let (head, tail) = rules
        .split_once("- alert: SelfhealAgentWedged")
        .expect("the wedge rule");
    let tail = tail.replacen("for: 1m", &format!("for: {TEST_FOR}"), 1);
    std::fs::write(
        prom_dir.join("rules.yml"),
        format!("{head}- alert: SelfhealAgentWedged{tail}"),
    )
    .unwrap();
    std::fs::write(
        prom_dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [rules.yml]\n\
             alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am_port}']\n\
             scrape_configs:\n  - job_name: selfheal\n    static_configs:\n      - targets: ['127.0.0.1:{metrics_port}']\n"
        ),
    )
    .unwrap();
    let mut cmd = ns.command(Path::new("prometheus"));
    cmd.arg(format!(
        "--config.file={}",
        prom_dir.join("prometheus.yml").display()
    ))
    .arg(format!(
        "--storage.tsdb.path={}",
        prom_dir.join("data").display()
    ))
    .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
    .arg("--rules.alert.resend-delay=1s")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(s.0.join("prometheus.log")).unwrap());
    let mut prom_child = Reaped(cmd.spawn().expect("run prometheus"));
    let prom = SocketAddr::from(([127, 0, 0, 1], prom_port));
    let logs = || {
        ["watch-dry.log", "prometheus.log", "alertmanager.log"]
            .iter()
            .map(|f| {
                let t = std::fs::read_to_string(s.0.join(f)).unwrap_or_default();
                let t: String = t
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                format!("--- {f}\n{t}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // Prometheus has scraped the runner healthy.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = query(
            ns,
            prom,
            "selfheal_agent_verdict{agent=\"runner\",verdict=~\"healthy|idle|busy\"} == 1",
        );
        if got.is_ok_and(|d| d["result"].as_array().is_some_and(|r| !r.is_empty())) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw the runner ok:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("set-up: {} ms", started.elapsed().as_millis());

    // The fault: the attach flow dropped both ways, no FIN, no RST.
    let peer: SocketAddr = row["peer"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("the peer");
    bed.topo.drop_flow(peer).expect("drop the flow");
    let fault = Instant::now();
    let firing = wait_alert(
        &rx,
        "SelfhealAgentWedged",
        "runner",
        "firing",
        Duration::from_secs(120),
        &mut seen,
    )
    .unwrap_or_else(|| panic!("no firing wedge alert; notifications {seen:#?}\n{}", logs()));
    let fault_to_firing = fault.elapsed();
    println!(
        "fault -> firing notification: {} ms",
        fault_to_firing.as_millis()
    );
    println!("firing: {firing:#}");
    assert_eq!(
        firing["labels"]["instance"],
        format!("127.0.0.1:{metrics_port}")
    );
    assert_eq!(firing["labels"]["job"], "selfheal");
    let description = firing["annotations"]["description"]
        .as_str()
        .unwrap_or_default();
    let snap = query(
        ns,
        prom,
        "selfheal_agent_last_snapshot_info{agent=\"runner\"}",
    )
    .expect("snapshot info");
    let id = snap["result"][0]["metric"]["snapshot"]
        .as_str()
        .expect("a snapshot id")
        .to_string();
    assert!(
        description.contains(&format!("selfheal snapshots show {id}")),
        "{description}"
    );
    assert!(
        description.contains("selfheal inspect runner"),
        "{description}"
    );
    let reasons = query(ns, prom, "selfheal_agent_reason{agent=\"runner\"}").expect("reasons");
    let reason = reasons["result"][0]["metric"]["reason"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    assert!(
        description.contains(&format!("reasons: {reason}")) || description.contains(&reason),
        "{description}"
    );
    tests::output_ok(
        Command::new(&opts.selfheal)
            .args(["snapshots", "show", &id, "--dir"])
            .arg(s.0.join("snapshots")),
    );

    // The heal: one `selfheal check` as the timer runs it, healing on,
    // through the bed's root helper, on the watch's state (the watch keeps
    // watching, in dry-run: its metrics never stop, so what resolves the
    // alert is the runner's recovery, not a scrape gap).
    let heal = Instant::now();
    let out = ns
        .command(&opts.selfheal)
        .args(["check", "--json", "--config"])
        .arg(bed.config_file())
        .args(Places::under(&s.0).helper(bed.helper_socket_path()).args())
        .output()
        .expect("run selfheal check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let healed: serde_json::Value = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|o| o["agent"] == "runner")
        .unwrap_or_else(|| panic!("no result for runner: {stdout}"));
    assert_eq!(healed["verdict"], "wedged", "{healed:#}");
    let steps = healed["heal"]["actions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        steps.iter().any(|a| a["ok"] == true),
        "the check took no healing step: {healed:#}"
    );
    println!(
        "healed: {}",
        steps
            .iter()
            .map(|a| a["detail"].to_string())
            .collect::<Vec<_>>()
            .join("; ")
    );
    let resolved = wait_alert(
        &rx,
        "SelfhealAgentWedged",
        "runner",
        "resolved",
        Duration::from_secs(120),
        &mut seen,
    )
    .unwrap_or_else(|| {
        panic!(
            "no resolved notification; notifications {seen:#?}\n{}",
            logs()
        )
    });
    let heal_to_resolved = heal.elapsed();
    println!(
        "heal -> resolved notification: {} ms",
        heal_to_resolved.as_millis()
    );
    println!("resolved: {resolved:#}");
    // Resolved by the verdict leaving wedged, not by a gap: the wedged
    // series is there and 0, and no scrape failed. (Right after the heal
    // the verdict may pass through another not-ok one on the way back.)
    let now =
        query(ns, prom, "selfheal_agent_verdict{agent=\"runner\"} == 1").expect("the verdict now");
    println!(
        "verdict at resolution: {}",
        now["result"][0]["metric"]["verdict"]
    );
    let cleared = query(
        ns,
        prom,
        "selfheal_agent_verdict{agent=\"runner\",verdict=\"wedged\"} == 0",
    )
    .expect("the wedged series");
    assert!(
        cleared["result"].as_array().is_some_and(|r| !r.is_empty()),
        "resolved, but the wedged series is not there at 0: {cleared}"
    );
    let gaps = query(ns, prom, "min_over_time(up{job=\"selfheal\"}[2m]) < 1").expect("up");
    assert!(
        gaps["result"].as_array().is_some_and(|r| r.is_empty()),
        "a scrape failed: {gaps}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = query(
            ns,
            prom,
            "selfheal_agent_verdict{agent=\"runner\",verdict=~\"healthy|idle|busy\"} == 1",
        )
        .expect("the verdict");
        if ok["result"].as_array().is_some_and(|r| !r.is_empty()) {
            println!(
                "heal -> runner ok in Prometheus: {} ms",
                heal.elapsed().as_millis()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the runner never came back ok:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Every dashboard query runs on the real Prometheus; every metric it
    // names is one Prometheus has (or a family with no sample yet here).
    let names = ns
        .enter(|| http_get(prom, "/api/v1/label/__name__/values"))
        .unwrap()
        .unwrap()
        .1;
    let names: serde_json::Value = serde_json::from_str(&names).unwrap();
    let names: BTreeSet<String> = names["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let no_sample_yet: BTreeSet<&str> = [
        "selfheal_agent_container_info",
        "selfheal_proof_keepalives_total",
        "selfheal_heals_total",
    ]
    .into();
    for name in dashboard_metrics() {
        assert!(
            names.contains(&name) || no_sample_yet.contains(name.as_str()),
            "the dashboard names {name}; Prometheus has {names:?}"
        );
        if !names.contains(&name) {
            println!("dashboard metric {name}: no sample in this scenario");
        }
    }
    for q in dashboard_queries() {
        let q = q
            .replace("$__rate_interval", "1m")
            .replace("$instance", ".*");
        query(ns, prom, &q).unwrap_or_else(|e| panic!("dashboard query fails: {e}"));
    }

    // Prometheus down: selfheal does not care.
    drop(std::mem::replace(
        &mut prom_child,
        Reaped(Command::new("true").spawn().unwrap()),
    ));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        matches!(watching.0.try_wait(), Ok(None)),
        "watch exited when Prometheus went away"
    );
    let (code, body) = ns
        .enter(|| http_get(SocketAddr::from(([127, 0, 0, 1], metrics_port)), "/metrics"))
        .unwrap()
        .expect("metrics still served");
    assert_eq!(code, 200);
    assert!(body.contains("selfheal_agent_verdict{agent=\"runner\""));
    // The watch's own transitions, for the record of where the time went.
    let log = std::fs::read_to_string(s.0.join("watch-dry.log")).unwrap_or_default();
    for l in log.lines().filter(|l| l.contains("runner")) {
        println!("watch: {l}");
    }
    println!(
        "alerting e2e: fault->firing {} ms, heal->resolved {} ms, total {} ms",
        fault_to_firing.as_millis(),
        heal_to_resolved.as_millis(),
        started.elapsed().as_millis()
    );
}

/// A scrape during a check gets the last complete check's text, never a
/// half-rendered one: checks made slow (a probe answering after 300 ms),
/// scraped every 20 ms throughout.
#[test]
fn a_scrape_during_a_check_gets_the_last_complete_one() {
    let _area = tests::area(module_path!());
    let s = Scratch::new("alerting-during");
    let slow = TcpListener::bind("127.0.0.1:0").expect("bind");
    let slow_addr = slow.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in slow.incoming().take(100).flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(1)));
            let _ = c.read(&mut [0u8; 2048]);
            std::thread::sleep(Duration::from_millis(300));
            let body = r#"{"status":"ok"}"#;
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let config = tests::config_in(
        &s.0,
        format!(
            "[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n[[agent.probe]]\nurl = \"http://{slow_addr}/status\"\ntimeout = \"2s\"\n",
            std::process::id()
        ),
    );
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let child = Command::new(selfheal_bin())
        .args([
            "watch",
            "--interval",
            "50ms",
            "--count",
            "8",
            "--metrics-public",
            "--metrics-addr",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(&config)
        .args(Places::under(&s.0).helper(s.0.join("helper.sock")).args())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run selfheal watch");
    let mut watch = Reaped(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (mut complete, mut empty, mut stamps) = (0, 0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline && matches!(watch.0.try_wait(), Ok(None)) {
        if let Ok((200, body)) = http_get(addr, "/metrics") {
            if body.is_empty() {
                empty += 1;
            } else {
                let last = body.lines().last().unwrap_or_default();
                assert!(
                    body.ends_with('\n')
                        && last.starts_with("selfheal_last_check_timestamp_seconds ")
                        && body.contains(
                            "selfheal_agent_verdict{agent=\"me\",verdict=\"healthy\"} 1\n"
                        )
                        && body.contains("selfheal_check_duration_seconds "),
                    "a partial rendering: {body}"
                );
                stamps.push(
                    last.split(' ')
                        .nth(1)
                        .unwrap_or_default()
                        .parse::<f64>()
                        .unwrap(),
                );
                complete += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let distinct = {
        let mut d = stamps.clone();
        d.dedup();
        d.len()
    };
    println!(
        "scrapes: {complete} complete ({distinct} distinct checks), {empty} empty (before the first check)"
    );
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "time went back: {stamps:?}"
    );
    assert!(distinct >= 3, "too few checks seen: {stamps:?}");
    assert!(complete > distinct, "no scrape landed during a check");
}
