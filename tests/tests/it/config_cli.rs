//! `selfheal config check` as a user and a script see it: what a good config
//! matches on this host, exit code 3 with file, line and key for a bad one,
//! and where the config is looked for.

use std::process::{Command, Output};

use tests::fixtures::rethrow;
use tests::{TempDir, selfheal_bin};

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().expect("run selfheal");
    (
        status.code().expect("exit code"),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn check(config: &std::path::Path) -> (i32, String, String) {
    run(Command::new(selfheal_bin())
        .args(["config", "check", "--config"])
        .arg(config))
}

#[test]
fn a_good_config_shows_processes_and_upstreams() {
    let _area = tests::area(module_path!());
    let dir = TempDir::new("cfgcli-good");
    let me = std::process::id();
    let config = dir.write(
        "config.toml",
        format!(
            r#"
[[agent]]
name = "tester"
match = {{ pid = {me} }}
[[agent.upstream]]
role = "control"
addr = "127.0.0.1:7443"
heartbeat = "10s"
[[agent.upstream]]
role = "provider"
addr = "localhost:443"
[[agent.probe]]
url = "http://127.0.0.1:8080/status"

[[agent]]
name = "ghost"
match = {{ pidfile = "{}/none.pid" }}
"#,
            dir.0.display()
        ),
    );
    let (code, out, err) = check(&config);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.starts_with(&format!("config {}: ok, 2 agents", config.display())),
        "{out}"
    );
    assert!(out.contains("\nagent tester\n"), "{out}");
    assert!(out.contains(&format!("match      pid = {me}")), "{out}");
    assert!(out.contains(&format!("processes  pid {me} (")), "{out}");
    assert!(
        out.contains("upstream   control 127.0.0.1:7443 heartbeat 10s\n"),
        "{out}"
    );
    // Resolved through /etc/hosts: tests send nothing to a DNS server.
    assert!(
        out.contains("upstream   provider localhost:443 -> 127.0.0.1:443"),
        "{out}"
    );
    assert!(
        out.contains("probe      GET http://127.0.0.1:8080/status timeout 2s"),
        "{out}"
    );
    assert!(out.contains("\nagent ghost\n"), "{out}");
    assert!(
        out.contains(&format!(
            "processes  none (cannot read pidfile {}/none.pid",
            dir.0.display()
        )),
        "{out}"
    );
}

#[test]
fn a_bad_config_exits_3_naming_file_line_and_key() {
    let _area = tests::area(module_path!());
    let dir = TempDir::new("cfgcli-bad");
    let config = dir.write(
        "config.toml",
        "[[agent]]\nname = \"sol\"\nmatch = { pid = 1 }\n[[agent.upstream]]\nrole = \"control\"\nadr = \"127.0.0.1:1\"\n",
    );
    let (code, out, err) = check(&config);
    assert_eq!(code, 3, "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err.trim_end(),
        format!(
            "selfheal: {}:6: agent \"sol\" upstream 1: key `adr`: unknown key (expected role, addr, heartbeat, suspect_after, max_silence, connect_timeout, stall_after)",
            config.display()
        )
    );

    let missing = dir.0.join("missing.toml");
    let (code, _, err) = check(&missing);
    assert_eq!(code, 3);
    assert!(
        err.contains(&*missing.to_string_lossy()) && err.contains("os error"),
        "{err}"
    );
}

#[test]
fn the_config_is_found_under_xdg_config_home() {
    let _area = tests::area(module_path!());
    let dir = TempDir::new("cfgcli-xdg");
    dir.write(
        "selfheal/config.toml",
        "[[agent]]\nname = \"found\"\nmatch = { pid = 1 }\n",
    );
    let (code, out, err) = run(Command::new(selfheal_bin())
        .args(["config", "check"])
        .env("XDG_CONFIG_HOME", &dir.0));
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\nagent found\n"), "{out}");
}

#[test]
fn usage_errors_exit_3() {
    let _area = tests::area(module_path!());
    let (code, _, err) = run(Command::new(selfheal_bin()).args(["config"]));
    assert_eq!(code, 3, "{err}");
    let (code, _, err) = run(Command::new(selfheal_bin()).args(["config", "check", "--bogus"]));
    assert_eq!(code, 3, "{err}");
}

/// Another user's look-alike process is not this agent: a
/// `cmdline` rule matches only the processes of the uid that runs selfheal,
/// unless `match.uid` names another uid or `"any"`. Before, root's rule
/// took `nobody`'s process with the same command line as its agent, to be
/// judged and healed.
#[test]
fn a_cmdline_rule_matches_only_the_runners_processes_unless_told() {
    let _area = tests::area(module_path!());
    if !tests::need_root("cmdline_rule_uid") {
        return;
    }
    let marker = format!("lookalike-agent-{}", std::process::id());
    // The marker rides in argv[0] (`exec -a`); bash and setpriv exec in
    // place, so the pids are the look-alikes'.
    let start = |uid: Option<u32>| {
        let script = format!("exec -a {marker} sleep 60");
        let mut cmd = Command::new("setpriv");
        if let Some(uid) = uid {
            cmd.args([format!("--reuid={uid}"), format!("--regid={uid}")])
                .arg("--clear-groups");
        }
        cmd.args(["bash", "-c", &script])
            .spawn()
            .expect("start a look-alike")
    };
    let mut mine = start(None);
    let mut theirs = start(Some(65534));
    let dir = TempDir::new("cfgcli-uid");
    let run = |extra: &str| {
        let config = dir.write(
            "config.toml",
            format!("[[agent]]\nname = \"sol\"\nmatch = {{ cmdline = \"^{marker} \"{extra} }}\n"),
        );
        let (code, out, err) = check(&config);
        assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
        out.lines()
            .find(|l| l.trim_start().starts_with("processes"))
            .unwrap_or_default()
            .to_string()
    };
    let (me, them) = (mine.id(), theirs.id());
    std::thread::sleep(std::time::Duration::from_millis(300));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let default = run("");
        assert!(default.contains(&format!("pid {me} (")), "{default}");
        assert!(!default.contains(&them.to_string()), "{default}");
        let any = run(", uid = \"any\"");
        assert!(
            any.contains(&format!("pids {}, {} (", me.min(them), me.max(them))),
            "{any}"
        );
        let nobody = run(", uid = 65534");
        assert!(nobody.contains(&format!("pid {them} (")), "{nobody}");
    }));
    let _ = mine.kill();
    let _ = theirs.kill();
    let _ = mine.wait();
    let _ = theirs.wait();
    rethrow(result);
}

/// A config of `[auto]` alone is a config; `config check` lists each unit
/// it names as the agent `auto.unit.UNIT`, with what it matches now and
/// its one upstream, which every address is.
#[test]
fn an_auto_section_alone_lists_its_agents() {
    let _area = tests::area(module_path!());
    let dir = TempDir::new("cfgcli-auto");
    let unit = format!("cfgcli-auto-{}.service", std::process::id());
    let config = dir.write(
        "config.toml",
        format!("[auto]\nunits = [\"{unit}\"]\n[auto.heal]\nbackoff = \"1s\"\n"),
    );
    let (code, out, err) = check(&config);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    for want in [
        "ok, 1 agent".to_string(),
        format!("agent auto.unit.{unit}"),
        format!("unit = \"{unit}\""),
        "has no processes".into(),
        "provider ::/0".into(),
    ] {
        assert!(out.contains(&want), "{want:?} in:\n{out}");
    }
}
