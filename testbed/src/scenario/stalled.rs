//! Streams over TLS whose provider keeps them alive with keepalive pings:
//! a call stalled behind pings (the head and first event, then only
//! pings), which selfheal must end within its upstream's `stall_after`;
//! and calls it must leave alone, pings then an answer within the bound,
//! content that comes slowly, a silent thinking call.
//!
//! The provider sits behind a TLS edge (`selfheal-testbed proxy
//! --tls-cert`) in its own namespace, with a certificate of a CA made for
//! the bed by the `openssl` command; the SDK callers trust it through
//! their own environment (`SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`), so
//! selfheal sees what it sees of a real provider: sizes and times, never
//! content.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{
    bed::{Bed, Options},
    callers::{CallLine, Caller, read_calls, start_caller, wait_calls},
    checks::{Event, Report, begin, checks, count_ok, is_wedged, ms_since, proofs, set_up},
    sockets::connections_to,
};

/// Where the TLS edge listens, in the provider's namespace.
const EDGE_PORT: u16 = 9443;

/// A CA and a leaf certificate it signed for `ips`, made with the
/// `openssl` command in `dir`: (the CA's certificate, the leaf's, the
/// leaf's key), all PEM.
pub fn make_certs(dir: &Path, ips: &[IpAddr]) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let (ca, ca_key, leaf, key, csr, ext) = (
        path("ca.pem"),
        path("ca.key"),
        path("leaf.pem"),
        path("leaf.key"),
        path("leaf.csr"),
        path("leaf.ext"),
    );
    let san: Vec<String> = ips.iter().map(|ip| format!("IP:{ip}")).collect();
    std::fs::write(
        &ext,
        format!(
            "subjectAltName={}\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
             subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
            san.join(",")
        ),
    )
    .with_context(|| format!("cannot write {ext}"))?;
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    openssl(&format!(
        "req -x509 -days 2 {ec} -subj /CN=selfheal-testbed-CA \
         -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
         -keyout {ca_key} -out {ca}"
    ))?;
    openssl(&format!(
        "req -new {ec} -subj /CN=selfheal-testbed-provider -keyout {key} -out {csr}"
    ))?;
    openssl(&format!(
        "x509 -req -days 2 -in {csr} -CA {ca} -CAkey {ca_key} -CAcreateserial -extfile {ext} -out {leaf}"
    ))?;
    Ok((ca.into(), leaf.into(), key.into()))
}

/// Runs `openssl` with `args` (split on spaces: no argument has one).
fn openssl(args: &str) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args(args.split(' ').filter(|a| !a.is_empty()))
        .output()
        .context("cannot run openssl (`cargo xtask setup` installs it)")?;
    if !out.status.success() {
        bail!(
            "openssl {args} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Starts the TLS edge before the bed's provider, in its namespace, with a
/// certificate of a CA made for the bed (also for 127.0.0.1); callers
/// started after trust the CA ([`Bed::tls_ca`]). Where the edge listens.
pub fn tls_edge(bed: &mut Bed) -> anyhow::Result<SocketAddr> {
    let ip = IpAddr::V4(bed.topo.provider_ip);
    let edge = SocketAddr::new(ip, EDGE_PORT);
    let (ca, cert, key) = make_certs(&bed.file("tls"), &[ip, IpAddr::from([127, 0, 0, 1])])?;
    let mut cmd = bed.topo.provider.command(&bed.opts.testbed);
    cmd.args(["proxy", "--listen"])
        .arg(edge.to_string())
        .arg("--upstream")
        .arg(bed.provider().to_string())
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key);
    bed.spawn("edge", cmd, None)?;
    bed.expect_line("edge", "listening", Duration::from_secs(10))?;
    bed.tls_ca = Some(ca);
    Ok(edge)
}

/// One streamed call over TLS: `caller` calls the provider through the TLS
/// edge with `model` (its pacing: [`Pacing`](crate::provider::Pacing)),
/// its provider upstream's `stall_after` is `stall_after` (`None`:
/// `"off"`), and checks run every `opts.check_every` from the call's start
/// until it ended and a later call (one that answers at once) completed,
/// for at most `limit`.
///
/// Facts: `first_failed_ms` and `first_failed_error`, or `first_done_ms`
/// and `first_tokens` (the first call, ms after its connection was first
/// seen established, `connected_ms` after its start line); `next_call_done_ms`;
/// `wedged` (the first wedged outcome; `detect_ms` when, after the start);
/// `proofs_armed`; `same_pid`.
pub fn stream(
    opts: &Options,
    caller: Caller,
    model: &str,
    stall_after: Option<Duration>,
    limit: Duration,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    stream_inspected(opts, caller, model, stall_after, limit, None, say)
}

/// [`stream`], with `selfheal inspect` of the caller run once, after the
/// first check at least `inspect_at` after the call's connection was up
/// and before any check found it wedged (never, when `None`).
///
/// Facts on top of [`stream`]'s: `inspect_ms` (when it ran),
/// `inspect_text` and `inspect_json` (what it printed).
pub fn stream_inspected(
    opts: &Options,
    caller: Caller,
    model: &str,
    stall_after: Option<Duration>,
    limit: Duration,
    inspect_at: Option<Duration>,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let plan = Plan {
        inspect_at,
        ..Plan::default()
    };
    stream_planned(opts, caller, model, stall_after, limit, &plan, say)
}

/// What a stream scenario varies beyond its caller, its first call's
/// model and its bound ([`stream_planned`]).
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// More keys of the caller's provider upstream (`suspect_after = "20s"\n`).
    pub upstream: String,
    /// The model of every call after the first (None: one that answers at
    /// once).
    pub then_model: Option<String>,
    /// Calls after the first that must be done before the checks stop
    /// (0 counts as 1).
    pub then_done: u32,
    /// When to run `selfheal inspect` ([`stream_inspected`]).
    pub inspect_at: Option<Duration>,
    /// The caller's name, its agent's (default `caller`): one no other
    /// scenario's caller has, where checks must find no process once it
    /// is gone (every bed's processes are in one pid namespace).
    pub name: Option<String>,
    /// Kill the caller (SIGKILL, then reaped as its parent would) at the
    /// first check this long after its call's connection was up; the
    /// checks stop [`AFTER_KILL`] checks later.
    pub kill_at: Option<Duration>,
}

/// Checks run after a [`Plan::kill_at`] kill.
pub const AFTER_KILL: u32 = 3;

/// [`stream`] as `plan` says.
///
/// Facts on top of [`stream_inspected`]'s: `local_ports` (the local ports
/// of the caller's connections to the edge, each once, as the checks
/// found them), `then_done` (later calls done), `then_tokens` (their
/// tokens); with a kill, `killed_ms`, `after_kill` (each later check's
/// verdict and reason codes), `heals_after_kill` and
/// `progress_before_kill` and `progress_after_kill` (the caller's
/// progress records in the checks' history at the kill and after the
/// last check).
pub fn stream_planned(
    opts: &Options,
    caller: Caller,
    model: &str,
    stall_after: Option<Duration>,
    limit: Duration,
    plan: &Plan,
    say: &mut dyn FnMut(Event),
) -> anyhow::Result<Report> {
    let inspect_at = plan.inspect_at;
    let name = plan.name.as_deref().unwrap_or("caller");
    let scenario = format!("stream_{}_{model}", caller.name());
    let (mut report, mut bed) = begin(opts, &scenario, "stl", Duration::from_millis(500))?;
    let edge = tls_edge(&mut bed)?;
    let bound = match stall_after {
        Some(d) => format!("{}ms", d.as_millis()),
        None => "off".into(),
    };
    let mut extra = Vec::new();
    if let Some(m) = &plan.then_model {
        extra.extend(["--then-model", m.as_str()]);
    }
    start_caller(
        &mut bed,
        name,
        caller,
        edge,
        &format!("stall_after = \"{bound}\"\n{}", plan.upstream),
        Some(vec![model.into()]),
        &extra,
    )?;
    set_up(
        &bed,
        say,
        format!(
            "caller {} calls the provider through a TLS edge {edge} with model {model}; stall_after {bound}, suspect after 2 s",
            caller.name()
        ),
    );
    let pid = bed.pid(name)?;
    let mut lines: Vec<CallLine> = Vec::new();
    wait_calls(&bed, "the first call", name, &mut lines, say, |l| {
        l.iter().any(CallLine::is_start)
    })?;
    // The call's connection up: its request and the first event follow
    // at once (some clients, litellm, take seconds from their start line
    // to their connect). Times are from here.
    let said = Instant::now();
    bed.wait_connections(
        "the call's connection",
        Duration::from_secs(30),
        pid,
        edge,
        1,
    )?;
    let start = Instant::now();
    report.fact("connected_ms", ms_since(said));
    let first = lines.iter().find_map(|l| match l {
        CallLine::Start(id) => Some(id.clone()),
        _ => None,
    });
    report.fact("stall_after", bound);
    let mut armed = 0;
    let mut first_ended = false;
    let mut next_done = false;
    let want = plan.then_done.max(1);
    let (mut then_done, mut then_tokens) = (0u32, Vec::new());
    let mut ports: Vec<u16> = Vec::new();
    let mut kill_due = false;
    checks(&bed, &mut report, say, limit, |bed, run, report, say| {
        report.detect(run, name, "wedged", ms_since(start), is_wedged);
        for c in connections_to(pid, edge) {
            if !ports.contains(&c.local.port()) {
                ports.push(c.local.port());
            }
        }
        if plan.kill_at.is_some_and(|at| start.elapsed() >= at) {
            kill_due = true;
            return Ok(true);
        }
        let due = inspect_at.is_some_and(|at| start.elapsed() >= at);
        if due && report.detect_ms.is_none() && !report.facts.contains_key("inspect_ms") {
            let at = ms_since(start);
            let (text, doc) = bed.inspect(name)?;
            report.fact("inspect_ms", at);
            report.fact("inspect_text", text);
            report.fact("inspect_json", doc);
        }
        armed += count_ok(&proofs(run, name), "arm");
        let seen = read_calls(bed, name, &mut lines, say);
        for l in &lines[seen..] {
            match l {
                CallLine::Failed(id, e) if Some(id) == first.as_ref() => {
                    first_ended = true;
                    report.fact("first_failed_ms", ms_since(start));
                    report.fact("first_failed_error", e.clone());
                }
                CallLine::Done(id, tokens) if Some(id) == first.as_ref() => {
                    first_ended = true;
                    report.fact("first_done_ms", ms_since(start));
                    report.fact("first_tokens", *tokens);
                }
                CallLine::Done(_, tokens) if first_ended => {
                    if !next_done {
                        next_done = true;
                        report.next_call_done(ms_since(start));
                    }
                    then_done += 1;
                    then_tokens.push(*tokens);
                }
                _ => {}
            }
        }
        Ok(plan.kill_at.is_none() && first_ended && then_done >= want)
    })?;
    report.fact("local_ports", ports);
    report.fact("then_done", then_done);
    report.fact("then_tokens", then_tokens);
    // The caller's progress records in the checks' history.
    let records = |bed: &Bed| -> anyhow::Result<usize> {
        let state = std::fs::read_to_string(bed.file("state").join("state.json"))
            .context("cannot read the checks' history")?;
        let state: Value = serde_json::from_str(&state).context("the history is not JSON")?;
        Ok(state["data"]["agents"][name]["judge"]["progress"]
            .as_object()
            .map_or(0, |m| m.len()))
    };
    if kill_due {
        report.fact("progress_before_kill", records(&bed)?);
        bed.kill(name)?;
        report.fact("killed_ms", ms_since(start));
        let heals_before_kill = report.heals.len();
        let mut after_kill = Vec::new();
        checks(&bed, &mut report, say, limit, |_, run, _, _| {
            if let Some(o) = run.of(name) {
                let codes: Vec<Value> = o["reasons"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| r["code"].clone())
                    .collect();
                after_kill.push(serde_json::json!({"verdict": o["verdict"], "codes": codes}));
            }
            Ok(after_kill.len() as u32 >= AFTER_KILL)
        })?;
        report.fact("after_kill", after_kill);
        report.fact("heals_after_kill", report.heals.len() - heals_before_kill);
        report.fact("progress_after_kill", records(&bed)?);
    }
    report.fact("proofs_armed", armed);
    report.fact("pid", pid);
    report.fact("same_pid", bed.still_runs(name, pid)?);
    report.fact("ran_ms", ms_since(start));
    Ok(report)
}
