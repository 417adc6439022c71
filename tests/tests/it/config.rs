//! The config file and agent discovery as a user meets them: every bad
//! config is refused with the file, line and key; good ones mean what they
//! say; upstreams classify remote addresses; match rules find real
//! processes and their descendants.

use std::{
    net::{SocketAddr, SocketAddrV6},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::Duration,
};

use selfheal::{
    agents::{self, ProcessTable},
    config,
};
use selfheal_core::config::{
    AgentConfig, Config, ConfigError, MatchRule, ProbeAuth, ProbeConfig, Redirects, Resolution,
    Role, SecretSource, Upstream, UpstreamAddr,
};
use tests::{TempDir, wait_for};

const PATH: &str = "/etc/selfheal/test-config.toml";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(PATH))
}

/// A valid agent head: two lines.
const HEAD: &str = "[[agent]]\nname = \"sol\"\n";

/// A valid agent head with its match rule: three lines.
const AGENT: &str = "[[agent]]\nname = \"sol\"\nmatch = { pid = 1 }\n";

fn with(prefix: &str, rest: &str) -> String {
    format!("{prefix}{rest}")
}

#[test]
fn bad_configs_name_file_line_and_key() {
    let _area = tests::area(module_path!());
    let upstream = |body: &str| with(AGENT, &format!("[[agent.upstream]]\n{body}"));
    let probe = |body: &str| with(AGENT, &format!("[[agent.probe]]\n{body}"));
    // (config text, line, a substring of the message)
    let cases: Vec<(String, usize, &str)> = vec![
        // Not TOML at all.
        ("[[agent]]\nname = \"a\n".into(), 2, "bad TOML"),
        (
            "[[agent]]\nname = \"a\"\nname = \"b\"\n".into(),
            3,
            "bad TOML: duplicate key `name`",
        ),
        ("\n\n[[agent]\n".into(), 3, "bad TOML"),
        ("x = = 1".into(), 1, "bad TOML"),
        // The top level.
        ("".into(), 1, "no agents: add an [[agent]] table"),
        ("# only a comment\n".into(), 1, "no agents"),
        (
            "agents = 1\n".into(),
            1,
            "key `agents`: unknown key (expected agent, auto)",
        ),
        ("\"a\\nb\" = 1\n".into(), 1, "key `\"a\\nb\"`: unknown key"),
        // The [auto] section.
        ("[auto]\ncontainers = false\n".into(), 1, "no agents"),
        ("[auto]\n".into(), 1, "no agents"),
        (
            "[auto]\ncontainers = 1\n".into(),
            2,
            "auto: key `containers`: expected true",
        ),
        (
            "[auto]\nunits = \"x\"\n".into(),
            2,
            "key `units`: expected an array",
        ),
        (
            "[auto]\nunits = [\"\"]\n".into(),
            2,
            "auto: key `units`: empty",
        ),
        (
            "[auto]\nunits = [\"a\", \"a.service\"]\n".into(),
            2,
            "named twice",
        ),
        (
            "[auto]\nunits = []\nlabel = 1\n".into(),
            3,
            "auto: key `label`: unknown",
        ),
        (
            "[auto]\n[auto.proof]\ncount = 0\n".into(),
            3,
            "auto proof: key `count`",
        ),
        (
            "[auto]\n[auto.thresholds]\nzombies = 0\n".into(),
            3,
            "auto thresholds",
        ),
        (
            "[auto]\nunits = [\"a b\"]\n".into(),
            2,
            "auto: key `units`: bad unit name \"a b\"",
        ),
        (
            with(
                AGENT,
                "[auto]\ncontainers = true\n[auto.heal]\nsignal = 1\n",
            ),
            7,
            "auto heal: key `signal`: expected true or false",
        ),
        (
            "[auto]\ncontainers = true\n[[agent]]\nname = \"auto.web\"\nmatch = { pid = 1 }\n"
                .into(),
            4,
            "names starting with \"auto.\" are the [auto] section's agents'",
        ),
        (
            with(AGENT, "[check]\nevery = \"30s\"\n"),
            4,
            "key `check`: unknown key (expected agent, auto)",
        ),
        (
            "agent = 1\n".into(),
            1,
            "key `agent`: expected an array of tables ([[agent]]), found integer",
        ),
        (
            "[agent]\nname = \"a\"\n".into(),
            1,
            "key `agent`: expected an array of tables",
        ),
        (
            "agent = [1]\n".into(),
            1,
            "key `agent`: expected an array of tables, found integer",
        ),
        // The agent.
        (
            with(AGENT, "nmae = \"x\"\n"),
            4,
            "agent \"sol\": key `nmae`: unknown key (expected name, match, upstream, probe, thresholds, heal, proof)",
        ),
        (
            "[[agent]]\nmatch = { pid = 1 }\n".into(),
            1,
            "agent 1: key `name`: missing",
        ),
        (
            "[[agent]]\nname = \"\"\nmatch = { pid = 1 }\n".into(),
            2,
            "agent 1: key `name`: empty name",
        ),
        (
            "[[agent]]\nname = \"a b\"\nmatch = { pid = 1 }\n".into(),
            2,
            "agent 1: key `name`: bad name \"a b\"",
        ),
        (
            "[[agent]]\nname = \"sol/1\"\nmatch = { pid = 1 }\n".into(),
            2,
            "bad name",
        ),
        (
            "[[agent]]\nname = 7\nmatch = { pid = 1 }\n".into(),
            2,
            "agent 1: key `name`: expected a string, found integer",
        ),
        (
            with(AGENT, AGENT),
            5,
            "agent 2: key `name`: duplicate agent name \"sol\" (first at line 2)",
        ),
        (
            with(
                AGENT,
                "[[agent]]\nname = \"x\"\nmatch = { pid = 1 }\n[[agent]]\nmatch = { pid = 2 }\n",
            ),
            7,
            "agent 3: key `name`: missing",
        ),
        // The match rule.
        (
            with(HEAD, "\n"),
            1,
            "agent \"sol\": key `match`: missing (one of pid, pidfile, cmdline, exe, unit, container, image, label, pod, namespace)",
        ),
        (
            with(HEAD, "match = {}\n"),
            3,
            "agent \"sol\": key `match`: no rule: give one of pid, pidfile, cmdline, exe, unit, container, image, label, pod, namespace",
        ),
        (
            with(HEAD, "match = { cmdline = \"x\", pid = 1 }\n"),
            3,
            "key `match`: more than one rule (cmdline, pid): give exactly one \
             (only container, image, label, pod, namespace may combine)",
        ),
        (
            with(HEAD, "[agent.match]\ncmdline = \"x\"\nunit = \"y\"\n"),
            5,
            "more than one rule (cmdline, unit)",
        ),
        (
            with(HEAD, "match = { cmd = \"x\" }\n"),
            3,
            "agent \"sol\" match: key `cmd`: unknown key (expected pid, pidfile, cmdline, exe, unit, container, image, label, pod, namespace, uid)",
        ),
        (
            with(HEAD, "match = { pid = 5, uid = 0 }\n"),
            3,
            "agent \"sol\" match: key `uid`: applies to cmdline, exe and unit rules only",
        ),
        (
            with(HEAD, "match = { unit = \"x\", uid = \"any\" }\n"),
            3,
            "agent \"sol\" match: key `uid`: a unit rule's uid names the user whose manager runs the unit: give a number",
        ),
        (
            with(HEAD, "match = { cmdline = \"x\", uid = -1 }\n"),
            3,
            "agent \"sol\" match: key `uid`: bad uid -1",
        ),
        (
            with(HEAD, "match = { cmdline = \"x\", uid = \"root\" }\n"),
            3,
            "agent \"sol\" match: key `uid`: expected a uid (a number) or \"any\"",
        ),
        (
            with(HEAD, "match = { uid = 7 }\n"),
            3,
            "no rule: give one of pid, pidfile, cmdline, exe, unit, container, image, label, pod, namespace",
        ),
        // Container rules: their keys combine with each other only.
        (
            with(
                HEAD,
                "match = { label = \"app=runner\", cmdline = \"x\" }\n",
            ),
            3,
            "key `match`: more than one rule (label, cmdline): give exactly one \
             (only container, image, label, pod, namespace may combine)",
        ),
        (
            with(HEAD, "match = { label = \"app\" }\n"),
            3,
            "agent \"sol\" match: key `label`: bad label \"app\": expected key=value",
        ),
        (
            with(HEAD, "match = { label = [\"a=b\", \"=c\"] }\n"),
            3,
            "agent \"sol\" match: key `label`: bad label \"=c\": expected key=value",
        ),
        (
            with(HEAD, "match = { label = [] }\n"),
            3,
            "agent \"sol\" match: key `label`: empty list",
        ),
        (
            with(HEAD, "match = { label = 5 }\n"),
            3,
            "agent \"sol\" match: key `label`: expected a \"key=value\" string or a list of them, found integer",
        ),
        (
            with(HEAD, "match = { label = [\"a=b\", 5] }\n"),
            3,
            "agent \"sol\" match: key `label`: expected a \"key=value\" string, found integer",
        ),
        (
            with(HEAD, "match = { container = \"\" }\n"),
            3,
            "agent \"sol\" match: key `container`: empty",
        ),
        (
            with(HEAD, "match = { pod = \"a\\nb\" }\n"),
            3,
            "agent \"sol\" match: key `pod`: \"a\\nb\" holds a control character",
        ),
        (
            with(HEAD, "match = { namespace = 7 }\n"),
            3,
            "agent \"sol\" match: key `namespace`: expected a string, found integer",
        ),
        (
            with(HEAD, "match = { image = \"x\", uid = 0 }\n"),
            3,
            "agent \"sol\" match: key `uid`: applies to cmdline, exe and unit rules only",
        ),
        (
            with(HEAD, "match = \"sol\"\n"),
            3,
            "agent \"sol\": key `match`: expected a table, found string",
        ),
        (
            with(HEAD, "match = { cmdline = \"sol(\" }\n"),
            3,
            "agent \"sol\" match: key `cmdline`: bad regex \"sol(\": unclosed group",
        ),
        (
            with(HEAD, "match = { cmdline = \"\" }\n"),
            3,
            "key `cmdline`: empty",
        ),
        (
            with(HEAD, "match = { cmdline = 5 }\n"),
            3,
            "key `cmdline`: expected a string, found integer",
        ),
        (
            with(HEAD, "match = { pid = 0 }\n"),
            3,
            "key `pid`: bad pid 0",
        ),
        (
            with(HEAD, "match = { pid = -4 }\n"),
            3,
            "key `pid`: bad pid -4",
        ),
        (
            with(HEAD, "match = { pid = 99999999999 }\n"),
            3,
            "key `pid`: bad pid 99999999999",
        ),
        (
            with(HEAD, "match = { pid = 99999999999999999999 }\n"),
            3,
            "key `pid`: integer out of range",
        ),
        (
            with(HEAD, "match = { pid = \"12\" }\n"),
            3,
            "key `pid`: expected an integer, found string",
        ),
        (
            with(HEAD, "match = { pid = 1.5 }\n"),
            3,
            "key `pid`: expected an integer, found float",
        ),
        (
            with(HEAD, "match = { pidfile = \"run/sol.pid\" }\n"),
            3,
            "key `pidfile`: \"run/sol.pid\" is not an absolute path",
        ),
        (
            with(HEAD, "match = { exe = \"sol\" }\n"),
            3,
            "key `exe`: \"sol\" is not an absolute path",
        ),
        (
            with(HEAD, "match = { unit = \"a/b.service\" }\n"),
            3,
            "key `unit`: bad unit name",
        ),
        // Upstreams.
        (
            upstream("role = \"control\"\nadr = \"127.0.0.1:1\"\n"),
            6,
            "agent \"sol\" upstream 1: key `adr`: unknown key (expected role, addr, heartbeat, suspect_after, max_silence, connect_timeout, stall_after)",
        ),
        (
            upstream("role = \"provider\"\naddr = \":443\"\nmax_silence = \"forever\"\n"),
            7,
            "key `max_silence`",
        ),
        (
            upstream("role = \"provider\"\naddr = \":443\"\nstall_after = \"never\"\n"),
            7,
            "key `stall_after`: bad duration \"never\"",
        ),
        (
            upstream("role = \"provider\"\naddr = \":443\"\nstall_after = \"0s\"\n"),
            7,
            "key `stall_after`: duration \"0s\" must be more than 0",
        ),
        (
            upstream("role = \"provider\"\naddr = \":443\"\nstall_after = 600\n"),
            7,
            "key `stall_after`",
        ),
        // The prove stage.
        (
            with(AGENT, "[agent.proof]\nidle = \"500ms\"\n"),
            5,
            "key `idle`: 500ms is not whole seconds from 1s to 32767s",
        ),
        (
            with(AGENT, "[agent.proof]\ninterval = \"10h\"\n"),
            5,
            "key `interval`: 36000s is not whole seconds from 1s to 32767s",
        ),
        (
            with(AGENT, "[agent.proof]\ncount = 0\n"),
            5,
            "key `count`: 0 is not a probe count from 1 to 127",
        ),
        (
            with(AGENT, "[agent.proof]\ncount = 128\n"),
            5,
            "key `count`: 128 is not a probe count from 1 to 127",
        ),
        (
            with(AGENT, "[agent.proof]\nkeepalive = \"yes\"\n"),
            5,
            "key `keepalive`",
        ),
        (
            with(AGENT, "[agent.proof]\nidel = \"1s\"\n"),
            5,
            "key `idel`: unknown key (expected keepalive, idle, interval, count)",
        ),
        (
            with(
                &upstream("role = \"control\"\naddr = \"127.0.0.1:1\"\n"),
                "[[agent.upstream]]\nrole = \"provider\"\naddr = \"x:1\"\nport = 2\n",
            ),
            10,
            "agent \"sol\" upstream 2: key `port`: unknown key",
        ),
        (
            upstream("role = \"control\"\naddr = \"127.0.0.1:7443\"\nheartbeat = \"10 parsecs\"\n"),
            7,
            "agent \"sol\" upstream 1: key `heartbeat`: bad duration \"10 parsecs\"",
        ),
        (
            upstream("role = \"control\"\naddr = \"127.0.0.1:7443\"\nheartbeat = 10\n"),
            7,
            "key `heartbeat`: expected a string, found integer",
        ),
        (
            upstream("role = \"control\"\naddr = \"127.0.0.1:7443\"\nheartbeat = \"0s\"\n"),
            7,
            "key `heartbeat`: duration \"0s\" must be more than 0",
        ),
        (
            upstream("role = \"provider\"\naddr = \"127.0.0.1:7443\"\nheartbeat = \"10s\"\n"),
            7,
            "key `heartbeat`: only a control upstream has a heartbeat (this one is provider)",
        ),
        (
            upstream("role = \"control\"\naddr = \"127.0.0.1\"\n"),
            6,
            "key `addr`: bad address \"127.0.0.1\": no port",
        ),
        (
            upstream("role = \"control\"\naddr = \"::1\"\n"),
            6,
            "no port (write [::1]:PORT",
        ),
        (
            upstream("role = \"control\"\naddr = \"host:99999\"\n"),
            6,
            "bad port \"99999\"",
        ),
        (
            upstream("role = \"control\"\naddr = \"10.0.0.0/33\"\n"),
            6,
            "bad CIDR \"10.0.0.0/33\": prefix must be 0 to 32",
        ),
        (
            upstream("role = \"control\"\naddr = \"\"\n"),
            6,
            "key `addr`: empty address",
        ),
        (
            upstream("role = \"control\"\naddr = \"a b:1\"\n"),
            6,
            "key `addr`: bad address",
        ),
        (
            upstream("role = \"control\"\n"),
            4,
            "agent \"sol\" upstream 1: key `addr`: missing",
        ),
        (
            upstream("addr = \"127.0.0.1:1\"\n"),
            4,
            "agent \"sol\" upstream 1: key `role`: missing",
        ),
        (
            upstream("role = \"server\"\naddr = \"127.0.0.1:1\"\n"),
            5,
            "key `role`: bad role \"server\" (expected control or provider)",
        ),
        (
            with(AGENT, "upstream = \"127.0.0.1:1\"\n"),
            4,
            "agent \"sol\": key `upstream`: expected an array of tables ([[agent.upstream]]), found string",
        ),
        // Probes.
        (
            probe("urll = \"http://x/\"\n"),
            5,
            "agent \"sol\" probe 1: key `urll`: unknown key (expected url, method, timeout, expect_status, fields, expect, health_file, max_age, auth, redirects, body_excerpt)",
        ),
        // Credentials never in the URL: refused, with what to do instead,
        // and without repeating them.
        (
            probe("url = \"http://user:hunter2@x/status?t=tok\"\n"),
            5,
            "key `url`: url \"http://REDACTED@x/status?t=REDACTED\" holds credentials (user:password@), which would show in every output: remove them, put the secret in a file readable only by selfheal's user and set auth = { bearer_file = \"/path/to/token\" }",
        ),
        (probe("url = \"https://tok@x/\"\n"), 5, "holds credentials"),
        (
            probe("url = \"ftp://x/?token=tok\"\n"),
            5,
            "key `url`: bad url \"ftp://x/?token=REDACTED\"",
        ),
        (
            probe("url = \"http://x/\"\nauth = { bearer_file = \"/a\", bearer_env = \"B\" }\n"),
            6,
            "agent \"sol\" probe 1 auth: key `bearer_env`: give either bearer_file or bearer_env, not both",
        ),
        (
            probe("url = \"http://x/\"\nauth = {}\n"),
            6,
            "agent \"sol\" probe 1 auth: give bearer_file = \"/path/to/token\" or bearer_env = \"VARIABLE\"",
        ),
        (
            probe("url = \"http://x/\"\nauth = { bearer_file = \"token\" }\n"),
            6,
            "key `bearer_file`: \"token\" is not an absolute path",
        ),
        (
            probe("url = \"http://x/\"\nauth = { bearer_env = \"1-A\" }\n"),
            6,
            "key `bearer_env`: \"1-A\" is not an environment variable name",
        ),
        (
            probe("url = \"http://x/\"\nauth = { bearer_env = \"A\", header = \"bad header\" }\n"),
            6,
            "key `header`: bad header name \"bad header\"",
        ),
        (
            probe("url = \"http://x/\"\nauth = { password = \"x\" }\n"),
            6,
            "agent \"sol\" probe 1 auth: key `password`: unknown key (expected bearer_file, bearer_env, header)",
        ),
        (
            probe("url = \"http://x/\"\nauth = \"Bearer x\"\n"),
            6,
            "key `auth`: expected a table, found string",
        ),
        (
            probe("url = \"http://x/\"\nredirects = \"any\"\n"),
            6,
            "key `redirects`: bad value \"any\" (expected \"same-origin\" or \"none\")",
        ),
        (
            probe("url = \"http://x/\"\nbody_excerpt = \"no\"\n"),
            6,
            "key `body_excerpt`: expected true or false, found string",
        ),
        (
            probe("health_file = \"/run/x\"\nmax_age = \"30s\"\nbody_excerpt = false\n"),
            7,
            "key `body_excerpt`: only with url, not health_file",
        ),
        (
            probe("url = \"http://x/\"\ntimeout = \"2 fortnights-ish\"\n"),
            6,
            "key `timeout`: bad duration",
        ),
        (
            probe("url = \"http://x/\"\nfields = { task = \"current_task\" }\n"),
            6,
            "agent \"sol\" probe 1: key `fields.task`: field \"task\": bad JSON pointer \"current_task\": must be empty or start with \"/\"",
        ),
        (
            probe("url = \"http://x/\"\nfields = { task = \"/a~2\" }\n"),
            6,
            "bad JSON pointer \"/a~2\"",
        ),
        (
            probe("url = \"http://x/\"\nfields = { task = 1 }\n"),
            6,
            "key `fields.task`: expected a string, found integer",
        ),
        (
            probe(
                "url = \"http://x/\"\nfields = { task = \"/task\" }\nexpect = { status = \"connected\" }\n",
            ),
            7,
            "key `expect.status`: field \"status\" is not declared in fields (declared: task)",
        ),
        (
            probe("url = \"http://x/\"\nexpect = { status = \"connected\" }\n"),
            6,
            "field \"status\" is not declared in fields (none are)",
        ),
        (
            probe("url = \"http://x/\"\n[agent.probe.expect]\nstatus = \"ok\"\n"),
            7,
            "key `expect.status`: field \"status\" is not declared",
        ),
        (
            probe("url = \"ftp://x/\"\n"),
            5,
            "key `url`: bad url \"ftp://x/\"",
        ),
        (probe("url = \"http:///path\"\n"), 5, "key `url`: bad url"),
        (
            probe("url = \"http://x/\"\nmethod = \"BREW\"\n"),
            6,
            "key `method`: bad method \"BREW\" (expected GET, HEAD, POST)",
        ),
        (
            probe("url = \"http://x/\"\nexpect_status = 700\n"),
            6,
            "key `expect_status`: bad HTTP status 700",
        ),
        (
            probe("url = \"http://x/\"\nmax_age = \"30s\"\n"),
            6,
            "key `max_age`: only with health_file, not url",
        ),
        (
            probe("health_file = \"/run/x\"\nmax_age = \"30s\"\nmethod = \"GET\"\n"),
            7,
            "key `method`: only with url, not health_file",
        ),
        (
            probe("health_file = \"/run/x\"\n"),
            4,
            "agent \"sol\" probe 1: key `max_age`: missing",
        ),
        (
            probe("health_file = \"run/x\"\nmax_age = \"1s\"\n"),
            5,
            "key `health_file`: \"run/x\" is not an absolute path",
        ),
        (
            probe("url = \"http://x/\"\nhealth_file = \"/run/x\"\n"),
            6,
            "key `health_file`: a probe has either url or health_file, not both",
        ),
        (
            probe("timeout = \"1s\"\n"),
            4,
            "agent \"sol\" probe 1: no url or health_file: give one",
        ),
    ];
    let mut failures = Vec::new();
    for (text, line, want) in &cases {
        match parse(text) {
            Ok(_) => failures.push(format!("accepted:\n{text}")),
            Err(e) => {
                let msg = e.to_string();
                let ok = msg.starts_with(&format!("{PATH}:{line}: "))
                    && msg.contains(want)
                    && e.line() == Some(*line)
                    && !msg.contains('\n');
                if !ok {
                    failures.push(format!(
                        "want line {line} and {want:?}\n got {msg}\n for:\n{text}"
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// A provider upstream at `addr` with the defaults: no heartbeat, no
/// threshold of its own.
fn provider(addr: UpstreamAddr) -> Upstream {
    Upstream {
        role: Role::Provider,
        addr,
        heartbeat: None,
        suspect_after: None,
        max_silence: selfheal_core::config::DEFAULT_MAX_SILENCE,
        connect_timeout: selfheal_core::config::DEFAULT_CONNECT_TIMEOUT,
        stall_after: Some(selfheal_core::config::DEFAULT_STALL_AFTER),
    }
}

#[test]
fn the_full_example_means_what_it_says() {
    let _area = tests::area(module_path!());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config/full.toml");
    let c = config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.path, path);
    let names: Vec<_> = c.agents.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["sol", "by-pid", "by-pidfile", "by.exe", "by_unit"]);

    let sol = c.agent("sol").unwrap();
    let MatchRule::Cmdline(re) = &sol.rule else {
        panic!("{:?}", sol.rule)
    };
    assert!(re.is_match("/usr/bin/sol-runner --config x --attach wss://d"));
    assert_eq!(sol.rule.to_string(), r#"cmdline = "sol-runner .*--attach""#);
    assert_eq!(
        sol.upstreams,
        [
            Upstream {
                role: Role::Control,
                addr: UpstreamAddr::Socket("127.0.0.1:7443".parse().unwrap()),
                heartbeat: Some(Duration::from_secs(10)),
                suspect_after: None,
                max_silence: selfheal_core::config::DEFAULT_MAX_SILENCE,
                connect_timeout: selfheal_core::config::DEFAULT_CONNECT_TIMEOUT,
                stall_after: None,
            },
            provider(UpstreamAddr::Host {
                host: "api.example.com".into(),
                port: 443
            }),
            provider(UpstreamAddr::Cidr("10.0.0.0".parse().unwrap(), 8)),
            provider(UpstreamAddr::Socket("[2001:db8::1]:443".parse().unwrap())),
            provider(UpstreamAddr::Port(8443)),
        ]
    );
    let shown: Vec<_> = sol.upstreams.iter().map(|u| u.addr.to_string()).collect();
    assert_eq!(
        shown,
        [
            "127.0.0.1:7443",
            "api.example.com:443",
            "10.0.0.0/8",
            "[2001:db8::1]:443",
            ":8443"
        ]
    );
    assert_eq!(
        sol.probes,
        [
            ProbeConfig::Http {
                url: "http://127.0.0.1:8080/status".into(),
                method: "GET".into(),
                timeout: Duration::from_millis(500),
                expect_status: Some(200),
                fields: [
                    ("current_task".to_string(), "/current_task".to_string()),
                    ("server_status".into(), "/status".into()),
                ]
                .into(),
                expect: [("server_status".to_string(), "connected".to_string())].into(),
                auth: None,
                redirects: Redirects::SameOrigin,
                body_excerpt: true,
            },
            ProbeConfig::HealthFile {
                path: "/run/sol.health".into(),
                max_age: Duration::from_secs(30),
            },
        ]
    );

    assert_eq!(c.agent("by-pid").unwrap().rule, MatchRule::Pid(4242));
    assert_eq!(c.agent("by-pid").unwrap().rule.to_string(), "pid = 4242");
    assert_eq!(
        c.agent("by-pidfile").unwrap().rule,
        MatchRule::Pidfile("/run/sol.pid".into())
    );
    let exe = c.agent("by.exe").unwrap();
    assert_eq!(exe.rule, MatchRule::Exe("/usr/bin/sol".into()));
    assert_eq!(
        exe.upstreams[0].addr,
        UpstreamAddr::Cidr("::1".parse().unwrap(), 128)
    );
    assert!(exe.probes.is_empty());
    // A unit without a type is a service, as with systemctl.
    assert_eq!(
        c.agent("by_unit").unwrap().rule,
        MatchRule::Unit("sol.service".into())
    );
    assert_eq!(c.agent("nope"), None);
}

/// Container keys combine; the rule reads back as written, and a label
/// value may hold quotes, `=` and control characters (compared exactly).
#[test]
fn container_rules_combine() {
    let _area = tests::area(module_path!());
    let c = parse(&with(
        HEAD,
        "match = { container = \"runner-*\", image = \"shtest:*\", \
         label = [\"app=runner\", \"q=a\\\"b=\\nc\"], pod = \"runner-?\", namespace = \"agents\" }\n",
    ))
    .expect("a container rule");
    let MatchRule::Container(rule) = &c.agents[0].rule else {
        panic!("not a container rule: {:?}", c.agents[0].rule);
    };
    assert_eq!(
        rule.labels,
        vec![
            ("app".to_string(), "runner".to_string()),
            ("q".to_string(), "a\"b=\nc".to_string())
        ]
    );
    assert_eq!(
        c.agents[0].rule.to_string(),
        "container = \"runner-*\", image = \"shtest:*\", pod = \"runner-?\", \
         namespace = \"agents\", label = [\"app=runner\", \"q=a\\\"b=\\nc\"]"
    );
    let one = parse(&with(HEAD, "match = { label = \"app=runner\" }\n")).unwrap();
    assert_eq!(one.agents[0].rule.to_string(), "label = \"app=runner\"");
    // No uid limit on a container rule: its processes run as any user.
    assert_eq!(one.agents[0].uid_filter(0), None);
}

/// A unit rule names the system's unit for root, the system's or the
/// user's own for a user, and with `uid` that user's manager's only.
#[test]
fn a_unit_rule_names_its_manager() {
    let _area = tests::area(module_path!());
    use selfheal_core::config::UnitOwner;
    let sys = parse(&with(HEAD, "match = { unit = \"runner\" }\n")).unwrap();
    assert_eq!(sys.agents[0].rule.to_string(), "unit = \"runner.service\"");
    assert_eq!(sys.agents[0].unit_owner(0), UnitOwner::System);
    assert_eq!(sys.agents[0].unit_owner(1000), UnitOwner::SystemOr(1000));
    let user = parse(&with(HEAD, "match = { unit = \"runner\", uid = 1000 }\n")).unwrap();
    assert_eq!(user.agents[0].unit_owner(0), UnitOwner::User(1000));
    assert_eq!(user.agents[0].unit_owner(1000), UnitOwner::User(1000));
    assert_eq!(
        user.agents[0].uid_filter(0),
        None,
        "not a process uid filter"
    );
}

#[test]
fn probe_defaults() {
    let _area = tests::area(module_path!());
    let c = parse(&with(
        AGENT,
        "[[agent.probe]]\nurl = \"https://h:1/s?x=1\"\nmethod = \"head\"\n",
    ))
    .unwrap();
    assert_eq!(
        c.agents[0].probes,
        [ProbeConfig::Http {
            url: "https://h:1/s?x=1".into(),
            method: "HEAD".into(),
            timeout: selfheal_core::config::DEFAULT_PROBE_TIMEOUT,
            expect_status: None,
            fields: Default::default(),
            expect: Default::default(),
            auth: None,
            redirects: Redirects::SameOrigin,
            body_excerpt: true,
        }]
    );
    assert_eq!(
        selfheal_core::config::DEFAULT_PROBE_TIMEOUT,
        Duration::from_secs(2)
    );
}

#[test]
fn probe_credentials_redirects_and_excerpt() {
    let _area = tests::area(module_path!());
    let c = parse(&with(
        AGENT,
        "[[agent.probe]]\nurl = \"http://h/s\"\nauth = { bearer_file = \"/etc/selfheal/token\" }\n\
         redirects = \"none\"\nbody_excerpt = false\n\
         [[agent.probe]]\nurl = \"http://h/t\"\nauth = { bearer_env = \"SOL_TOKEN\", header = \"X-Api-Key\" }\n\
         redirects = \"same-origin\"\n",
    ))
    .unwrap();
    let got: Vec<_> = c.agents[0]
        .probes
        .iter()
        .map(|p| match p {
            ProbeConfig::Http {
                auth,
                redirects,
                body_excerpt,
                ..
            } => (auth.clone(), *redirects, *body_excerpt),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                Some(ProbeAuth {
                    source: SecretSource::File("/etc/selfheal/token".into()),
                    header: None
                }),
                Redirects::None,
                false
            ),
            (
                Some(ProbeAuth {
                    source: SecretSource::Env("SOL_TOKEN".into()),
                    header: Some("X-Api-Key".into())
                }),
                Redirects::SameOrigin,
                true
            ),
        ]
    );
}

#[test]
fn role_serializes_lower_case() {
    let _area = tests::area(module_path!());
    assert_eq!(
        serde_json::to_string(&Role::Control).unwrap(),
        "\"control\""
    );
    assert_eq!(
        serde_json::to_string(&Role::Provider).unwrap(),
        "\"provider\""
    );
    assert_eq!(Role::Provider.to_string(), "provider");
}

/// An agent with these upstreams (`role addr` per line).
fn agent_with(upstreams: &[(&str, &str)]) -> AgentConfig {
    let mut text = AGENT.to_string();
    for (role, addr) in upstreams {
        text.push_str(&format!(
            "[[agent.upstream]]\nrole = \"{role}\"\naddr = \"{addr}\"\n"
        ));
    }
    parse(&text)
        .unwrap_or_else(|e| panic!("{e}"))
        .agents
        .remove(0)
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn role_of_classifies_remote_addresses() {
    let _area = tests::area(module_path!());
    let agent = agent_with(&[
        ("control", "127.0.0.1:7443"),
        ("control", "[::1]:7443"),
        ("provider", "api.example:443"),
        ("provider", "10.0.0.0/8"),
        ("provider", "fd00::/8"),
        ("provider", "down.example:443"),
        ("control", "::ffff:192.0.2.0/120"),
        ("provider", ":7443"),
        ("provider", "api.example:443"),
    ]);
    let mut lookups = Vec::new();
    let resolved = agent.resolve_upstreams_with(|host, port| {
        lookups.push(format!("{host}:{port}"));
        match host {
            "api.example" => Ok(vec![
                sa("203.0.113.5:443"),
                sa("[2001:db8::5]:443"),
                sa("203.0.113.5:443"),
            ]),
            _ => Err("no such host".into()),
        }
    });
    // Each host is looked up once.
    assert_eq!(lookups, ["api.example:443", "down.example:443"]);
    assert_eq!(
        resolved.upstreams[2].resolution,
        Resolution::Resolved(vec![sa("203.0.113.5:443"), sa("[2001:db8::5]:443")])
    );
    assert_eq!(
        resolved.upstreams[5].resolution,
        Resolution::Failed("no such host".into())
    );
    assert_eq!(resolved.upstreams[0].resolution, Resolution::Literal);

    use Role::{Control as C, Provider as P};
    let cases: &[(&str, Option<Role>)] = &[
        // Exact v4 and v6, and the same v4 address mapped into v6.
        ("127.0.0.1:7443", Some(C)),
        ("[::ffff:127.0.0.1]:7443", Some(C)),
        ("[::1]:7443", Some(C)),
        // Another port on an exact address: only `:7443`-style rules apply.
        ("127.0.0.1:7444", None),
        ("[::1]:7444", None),
        // ::1 is not 0.0.0.1, and 0.0.0.1 is not ::1.
        ("0.0.0.1:7444", None),
        ("[::0.0.0.1]:7444", None),
        // `:7443` takes any address on that port, after the exact rules.
        ("192.168.1.1:7443", Some(P)),
        ("[2001:db8::77]:7443", Some(P)),
        ("[::ffff:192.168.1.1]:7443", Some(P)),
        // Host names match the addresses they resolved to, any family.
        ("203.0.113.5:443", Some(P)),
        ("[::ffff:203.0.113.5]:443", Some(P)),
        ("[2001:db8::5]:443", Some(P)),
        ("203.0.113.5:80", None),
        ("203.0.113.6:443", None),
        // A host that did not resolve matches nothing.
        ("198.51.100.1:443", None),
        // CIDR: any port; v4 through the mapped form too.
        ("10.0.0.1:1", Some(P)),
        ("10.255.255.255:65535", Some(P)),
        ("[::ffff:10.1.2.3]:9", Some(P)),
        ("11.0.0.1:1", None),
        ("9.255.255.255:1", None),
        ("[fd12:3456::1]:5", Some(P)),
        ("[fe80::1]:5", None),
        // A CIDR written in mapped form is the v4 network it maps.
        ("192.0.2.77:1", Some(C)),
        ("[::ffff:192.0.2.77]:1", Some(C)),
        ("192.0.3.1:1", None),
    ];
    let mut wrong = Vec::new();
    for (remote, want) in cases {
        let got = resolved.role_of(sa(remote));
        if got != *want {
            wrong.push(format!("{remote}: want {want:?}, got {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // A v6 remote with a scope id or flow label is still its address.
    let scoped = SocketAddr::V6(SocketAddrV6::new("::1".parse().unwrap(), 7443, 7, 3));
    assert_eq!(resolved.role_of(scoped), Some(C));
    // The first match wins: which upstream it was.
    let u = resolved.upstream_of(sa("203.0.113.5:443")).unwrap();
    assert_eq!(u.upstream.addr.to_string(), "api.example:443");

    let notes = resolved.notes();
    assert_eq!(
        notes,
        [
            "api.example:443 resolves to 203.0.113.5:443, [2001:db8::5]:443",
            "down.example:443 does not resolve (no such host): it matches no socket",
            "api.example:443 resolves to 203.0.113.5:443, [2001:db8::5]:443",
        ]
    );
}

#[test]
fn no_upstreams_classify_nothing() {
    let _area = tests::area(module_path!());
    let agent = agent_with(&[]);
    let r = config::resolve_upstreams(&agent);
    assert_eq!(r.role_of(sa("127.0.0.1:1")), None);
    assert!(r.notes().is_empty());
}

#[test]
fn host_names_resolve_with_the_system_resolver() {
    let _area = tests::area(module_path!());
    // Only `localhost`, which /etc/hosts answers: tests send nothing to a DNS
    // server. Names that fail are covered with a fake resolver above.
    let agent = agent_with(&[("control", "localhost:7443")]);
    let r = config::resolve_upstreams(&agent);
    let Resolution::Resolved(addrs) = &r.upstreams[0].resolution else {
        panic!("localhost: {:?}", r.upstreams[0].resolution)
    };
    assert!(!addrs.is_empty());
    for a in addrs {
        assert!(a.ip().is_loopback() && a.port() == 7443, "{a}");
        assert_eq!(r.role_of(*a), Some(Role::Control));
    }
    assert_eq!(r.role_of(sa("127.0.0.1:7444")), None);
}

#[test]
fn where_the_config_is_looked_for() {
    let _area = tests::area(module_path!());
    use std::ffi::OsStr;
    let c = selfheal_core::config::candidates(Some(OsStr::new("/x")), Some(OsStr::new("/home/u")));
    assert_eq!(
        c,
        [
            PathBuf::from("/x/selfheal/config.toml"),
            "/etc/selfheal/config.toml".into()
        ]
    );
    let c = selfheal_core::config::candidates(None, Some(OsStr::new("/home/u")));
    assert_eq!(c[0], PathBuf::from("/home/u/.config/selfheal/config.toml"));
    // An empty or relative XDG_CONFIG_HOME is ignored, as the spec says.
    assert_eq!(
        selfheal_core::config::candidates(Some(OsStr::new("")), Some(OsStr::new("/h")))[0],
        PathBuf::from("/h/.config/selfheal/config.toml")
    );
    assert_eq!(
        selfheal_core::config::candidates(Some(OsStr::new("rel")), None),
        [PathBuf::from(selfheal_core::config::SYSTEM_CONFIG)]
    );

    let dir = TempDir::new("cfgtest-locate");
    let first = dir.0.join("a/selfheal/config.toml");
    let second = dir.write("b/config.toml", AGENT);
    let candidates = vec![first.clone(), second.clone()];
    assert_eq!(
        config::locate_among(None, candidates.clone()).unwrap(),
        second
    );
    dir.write("a/selfheal/config.toml", AGENT);
    assert_eq!(
        config::locate_among(None, candidates.clone()).unwrap(),
        first
    );

    // An explicit path wins, and must exist.
    assert_eq!(
        config::locate_among(Some(&second), candidates).unwrap(),
        second
    );
    let missing = dir.0.join("missing.toml");
    let e = config::locate_among(Some(&missing), vec![first]).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");

    // None there: every candidate tried is named.
    let nowhere = vec![dir.0.join("x.toml"), dir.0.join("y.toml")];
    let e = config::locate_among(None, nowhere.clone())
        .unwrap_err()
        .to_string();
    for p in &nowhere {
        assert!(e.contains(&*p.to_string_lossy()), "{e}");
    }
    assert!(e.starts_with("no config file: tried"), "{e}");
}

#[test]
fn load_reports_the_file() {
    let _area = tests::area(module_path!());
    let dir = TempDir::new("cfgtest-load");
    let good = dir.write("good.toml", AGENT);
    let c = config::load(&good).unwrap();
    assert_eq!((c.path.as_path(), c.agents.len()), (good.as_path(), 1));

    let bad = dir.write(
        "bad.toml",
        with(
            AGENT,
            "\n[[agent.upstream]]\nrole = \"control\"\naddr = \"1.2.3.4\"\n",
        ),
    );
    let e = config::load(&bad).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}:7: agent \"sol\" upstream 1: key `addr`",
            bad.display()
        )),
        "{e}"
    );

    // Not UTF-8: the line of the first bad byte.
    let latin1 = dir.write("latin1.toml", b"[[agent]]\nname = \"caf\xe9\"\n");
    let e = config::load(&latin1).unwrap_err();
    assert_eq!(e.line(), Some(2));
    assert!(e.to_string().contains("not UTF-8"), "{e}");

    // A missing file and a directory: the path and the OS error.
    for path in [dir.0.join("missing.toml"), dir.0.clone()] {
        let e = config::load(&path).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains(&*path.to_string_lossy()) && msg.contains("os error"),
            "{msg}"
        );
    }
}

/// Small deterministic PRNG (xorshift) for the mutation test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn mangled_configs_are_errors_not_panics() {
    let _area = tests::area(module_path!());
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/config/full.toml");
    let good = std::fs::read_to_string(path).unwrap();
    let pieces = [
        "\"",
        "'",
        "[",
        "]",
        "[[",
        "]]",
        "{",
        "}",
        "=",
        ",",
        "\n",
        "#",
        "\\",
        "/",
        ":",
        "::",
        "0",
        "-1",
        "99999999999999999999",
        "~",
        ".",
        " ",
        "agent",
        "match",
        "pid",
        "é",
        "\u{0}",
        "[[agent]]\n",
        "\"\\n\" = 1\n",
        "\"\\u0007\" = 1\n",
        "[[agent.upstream]]\n",
        "[[agent.probe]]\n",
        "\"\"\"",
        "inf",
        "1979-05-27",
    ];
    let mut rng = Rng(0x5e1f_4ea1);
    for _ in 0..3000 {
        let mut text: Vec<char> = good.chars().collect();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(text.len() + 1);
            match rng.below(3) {
                0 if at < text.len() => {
                    let end = (at + 1 + rng.below(12)).min(text.len());
                    text.drain(at..end);
                }
                1 => {
                    let p = pieces[rng.below(pieces.len())];
                    text.splice(at..at, p.chars());
                }
                _ => text.truncate(at),
            }
        }
        let text: String = text.into_iter().collect();
        if let Err(e) = parse(&text) {
            let msg = e.to_string();
            let line = e.line().expect("a parse error has a line");
            assert!(msg.starts_with(PATH) && !msg.contains('\n'), "{msg}");
            assert!(
                line >= 1 && line <= text.lines().count() + 1,
                "{msg}\n{text}"
            );
        }
    }
    // Deep nesting hits the parser's limit, not the stack.
    let deep = format!("x = {}1{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse(&deep).is_err());
    let deep = format!("x = {}", "{ a = ".repeat(50_000));
    assert!(parse(&deep).is_err());
}

/// A process group killed (and reaped) on drop.
struct Spawned(Child);

impl Spawned {
    fn new(cmd: &mut Command) -> Spawned {
        Spawned(cmd.process_group(0).spawn().expect("spawn"))
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the group is the child's own.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// Where `sleep` is, as written in PATH (maybe through a symlink such as
/// /bin → /usr/bin).
fn sleep_in_path() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("sleep"))
        .find(|p| p.is_file())
        .expect("sleep in PATH")
}

#[test]
fn rules_find_real_processes_and_descendants() {
    let _area = tests::area(module_path!());
    let marker = format!("selfheal-cfgtest-{}", std::process::id());
    let sleeper = Spawned::new(Command::new("sleep").arg("30"));
    let shell = Spawned::new(Command::new("sh").args(["-c", "sleep 30 & wait", &marker]));
    let (sleep_pid, sh_pid) = (sleeper.pid(), shell.pid());

    // Wait (bounded) until the shell has started its child.
    let (table, child_pid) = wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        let table = ProcessTable::read();
        let child = table
            .entries()
            .find(|e| e.ppid == sh_pid && e.cmdline.first().is_some_and(|a| a == "sleep"))?
            .pid;
        table.get(sleep_pid)?;
        Some((table, child))
    })
    .expect("sleep and sh's child sleep appear in the process table");

    let entry = table.get(sleep_pid).unwrap();
    assert_eq!(entry.cmdline, ["sleep", "30"]);
    assert_eq!(entry.comm, "sleep");
    assert_eq!(entry.ppid, std::process::id());
    // SAFETY: getuid has no preconditions.
    assert_eq!(entry.uid, Some(unsafe { libc::getuid() }));
    let sh = table.get(sh_pid).unwrap();
    assert_eq!(sh.cmdline.last(), Some(&marker));

    // pid: the process and its descendants.
    let m = agents::find(&MatchRule::Pid(sleep_pid), &table);
    assert_eq!(
        (m.roots, m.all, m.problem),
        (vec![sleep_pid], vec![sleep_pid], None)
    );
    let m = agents::find(&MatchRule::Pid(sh_pid), &table);
    assert_eq!(m.roots, [sh_pid]);
    assert_eq!(m.all, sorted(vec![sh_pid, child_pid]));

    // cmdline: a regex over the argv joined with spaces.
    let rule = |re: &str| {
        let text = format!("[[agent]]\nname = \"t\"\nmatch = {{ cmdline = '{re}' }}\n");
        parse(&text)
            .unwrap_or_else(|e| panic!("{e}"))
            .agents
            .remove(0)
            .rule
    };
    let m = agents::find(&rule(&format!("wait {marker}$")), &table);
    assert_eq!(m.roots, [sh_pid]);
    assert_eq!(m.all, sorted(vec![sh_pid, child_pid]));
    // Never selfheal's own process, nor an ancestor (this test's argv names
    // it, and so may a wrapper's, such as sudo's).
    let own = std::env::args().next().unwrap();
    let escaped: String = own
        .chars()
        .flat_map(|c| {
            c.is_ascii_punctuation()
                .then_some('\\')
                .into_iter()
                .chain([c])
        })
        .collect();
    let m = agents::find(&rule(&escaped), &table);
    assert!(!m.all.contains(&std::process::id()), "{m:?}");

    // pidfile: the pid in the file.
    let dir = TempDir::new("cfgtest-pidfile");
    let pidfile = dir.write("sh.pid", format!("{sh_pid}\n"));
    let m = agents::find(&MatchRule::Pidfile(pidfile.clone()), &table);
    assert_eq!((m.roots.clone(), m.problem.clone()), (vec![sh_pid], None));
    assert_eq!(m.all, sorted(vec![sh_pid, child_pid]));
    for garbage in ["", "abc", "-5", "123abc", "\u{0}\u{1}"] {
        let p = dir.write("garbage.pid", garbage);
        let m = agents::find(&MatchRule::Pidfile(p.clone()), &table);
        assert!(m.roots.is_empty() && m.all.is_empty());
        let problem = m.problem.unwrap();
        assert!(problem.contains(&*p.to_string_lossy()), "{problem}");
    }
    let missing = dir.0.join("missing.pid");
    let problem = agents::find(&MatchRule::Pidfile(missing.clone()), &table)
        .problem
        .unwrap();
    assert!(
        problem.starts_with(&format!("cannot read pidfile {}", missing.display())),
        "{problem}"
    );
    let problem = agents::find(&MatchRule::Pidfile(dir.0.clone()), &table)
        .problem
        .unwrap();
    assert!(problem.contains("not a regular file"), "{problem}");
    let gone = dir.write("gone.pid", "2147483646");
    let problem = agents::find(&MatchRule::Pidfile(gone), &table)
        .problem
        .unwrap();
    assert!(
        problem.ends_with("pid 2147483646 is not running"),
        "{problem}"
    );

    // exe: the executable, even when named through a symlink.
    let m = agents::find(&MatchRule::Exe(sleep_in_path()), &table);
    assert!(
        m.roots.contains(&sleep_pid) && m.roots.contains(&child_pid),
        "{m:?}"
    );
    assert!(!m.all.contains(&sh_pid));

    // unit: by the cgroup (when this host shows cgroups).
    match &entry.cgroup {
        Some(cg) => {
            let unit = cg.rsplit('/').next().unwrap().to_string();
            if !unit.is_empty() {
                let m = agents::find(&MatchRule::Unit(unit.clone()), &table);
                assert!(m.all.contains(&sleep_pid), "{unit}: {m:?}");
                assert!(!m.roots.contains(&std::process::id()), "{unit}: {m:?}");
            }
        }
        None => {
            let m = agents::find(&MatchRule::Unit("selfheal-none.service".into()), &table);
            assert!(m.problem.is_some());
        }
    }

    drop(shell);
    drop(sleeper);
    let after = ProcessTable::read();
    let m = agents::find(&MatchRule::Pid(sleep_pid), &after);
    assert_eq!(m.problem, Some(format!("pid {sleep_pid} is not running")));
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}
