//! A fleet's view (issue 14): the metrics pass `promtool check metrics`;
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
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use tests::{need_root, selfheal_bin, skip};

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
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("selfheal-alerting-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `selfheal check` writing `metrics`: its exit code and stderr.
fn check_writing(dir: &Path, config: &Path, metrics: &Path) -> (i32, String) {
    let out = Command::new(selfheal_bin())
        .args(["check", "--json", "--config"])
        .arg(config)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--snapshot-dir")
        .arg(dir.join("snapshots"))
        .arg("--metrics-file")
        .arg(metrics)
        .arg("--helper")
        .arg(dir.join("helper.sock"))
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
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[[agent]]\nname = \"my.agent-1_x\"\nmatch = {{ pid = {} }}\n\
             [[agent]]\nname = \"gone\"\nmatch = {{ cmdline = \"no-such-program-selfheal-alerting\" }}\n",
            std::process::id()
        ),
    )
    .expect("write config");
    config
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
    let t = Instant::now();
    let out = run_ok(promtool().arg("check").arg("rules").arg(rules_dir().join("selfheal-rules.yml")));
    println!("{out}");
    let out = run_ok(
        promtool()
            .current_dir(rules_dir())
            .args(["test", "rules", "selfheal-rules.test.yml"]),
    );
    println!("{out}");
    println!("promtool check + test rules: {} ms", t.elapsed().as_millis());
}

#[test]
fn the_metrics_pass_promtool_and_the_dashboard_names_only_them() {
    let s = Scratch::new("lint");
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
    lint.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = lint.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("selfheal_agent_verdict{agent=\"my.agent-1_x\",verdict=\"healthy\"} 1"));
    assert!(text.contains("selfheal_agent_reasons_total{agent=\"gone\",reason=\"no_process\"} 1\n"));
    assert!(text.contains("selfheal_agent_not_ok_checks_total{agent=\"gone\"} 2\n"));
    assert!(text.contains("selfheal_agent_last_snapshot_info{agent=\"gone\",snapshot=\""));
    assert!(text.contains("selfheal_helper_up 0\n"));
    assert!(text.contains("selfheal_ebpf_strategy_info{strategy=\"none\",why_none=\""));

    let mut known = families(&text);
    // Exported only where an agent runs in a container (issue 13).
    known.insert("selfheal_agent_container_info".into());
    for name in dashboard_metrics() {
        assert!(known.contains(&name), "the dashboard names {name}, not exported: {known:?}");
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
    assert!(d["title"].is_string() && d["uid"].is_string(), "not a dashboard");
    let panels = d["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut out = Vec::new();
    for p in panels {
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("no targets: {p}"));
        assert!(!targets.is_empty(), "a panel without queries: {p}");
        for t in targets {
            out.push(t["expr"].as_str().unwrap_or_else(|| panic!("no expr: {t}")).to_string());
        }
    }
    out
}

fn dashboard_metrics() -> BTreeSet<String> {
    let all: BTreeSet<String> = dashboard_queries().iter().flat_map(|q| metric_names(q)).collect();
    assert!(all.len() >= 10, "{all:?}");
    all
}

/// A metrics file on a full disk: the check says so (a gap, exit ≥ 1) and
/// the last good file stays, whole.
#[test]
fn a_metrics_file_on_a_full_disk_keeps_its_last_good_content() {
    if !need_root("metrics_full_disk") {
        return;
    }
    let s = Scratch::new("full");
    let mnt = s.0.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::set_permissions(&mnt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    run_ok(Command::new("mount").args(["-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs"]).arg(&mnt));
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
    let out = Command::new(selfheal_bin())
        .args(["check", "--json", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(s.0.join("state"))
        .arg("--snapshot-dir")
        .arg(s.0.join("snapshots"))
        .arg("--metrics-file")
        .arg(&prom)
        .arg("--helper")
        .arg(s.0.join("helper.sock"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("full disk: exit {:?}; {stderr}", out.status.code());
    assert!(stderr.contains("metrics file not written"), "{stderr}");
    assert!(stdout.contains("metrics file not written"), "{stdout}");
    assert_eq!(std::fs::read_to_string(&prom).unwrap(), good, "the last good file changed");
    assert!(!mnt.join("selfheal.prom.tmp").exists(), "a temp file left behind");
    // A healthy-only config exits 1, not 0: the file was asked for.
    let me = s.0.join("me.toml");
    std::fs::write(&me, format!("[[agent]]\nname = \"me\"\nmatch = {{ pid = {} }}\n", std::process::id())).unwrap();
    let (code, err) = check_writing(&s.0, &me, &prom);
    assert_eq!(code, 1, "{err}");
    // Room again: written again.
    std::fs::remove_file(mnt.join("fill")).unwrap();
    let (code, err) = check_writing(&s.0, &me, &prom);
    assert_eq!(code, 0, "{err}");
    assert_ne!(std::fs::read_to_string(&prom).unwrap(), good);
}
