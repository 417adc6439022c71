//! The callers of a silent call: the testbed runners and the real SDKs
//! (Python and Node), started against a provider with their `[[agent]]`
//! blocks, and what their output says of their calls.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde::Serialize;

use super::{
    bed::{Bed, FAST, RunnerSpec},
    checks::Event,
};
use crate::runner::Mode;

/// Who makes the provider call that goes silent, and what it waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Caller {
    /// The testbed runner's blocking worker thread (a read on the socket).
    Blocking,
    /// The testbed runner's `--mode tokio` (an event loop in `epoll_wait`).
    Tokio,
    /// The official `openai` Python SDK (`tests/py/sdk_runner.py`).
    OpenAi,
    /// The official `anthropic` Python SDK, which enables SO_KEEPALIVE
    /// itself (60 s idle and interval, 5 probes).
    Anthropic,
    /// `openai.AsyncOpenAI` on asyncio (an event loop in `epoll_wait`).
    AsyncOpenAi,
    /// `anthropic.AsyncAnthropic` on asyncio (its own keepalive, as above).
    AsyncAnthropic,
    /// `litellm.acompletion` on its `openai/` route (what OpenHands and
    /// aider call), on asyncio.
    Litellm,
    /// The official `openai` Node SDK (`tests/node/sdk_runner.mjs`: undici
    /// under its fetch, on Node's event loop).
    NodeOpenAi,
    /// The official `@anthropic-ai/sdk` Node SDK, the same way.
    NodeAnthropic,
}

impl Caller {
    pub fn name(self) -> &'static str {
        match self {
            Caller::Blocking => "blocking",
            Caller::Tokio => "tokio",
            Caller::OpenAi => "openai",
            Caller::Anthropic => "anthropic",
            Caller::AsyncOpenAi => "openai_async",
            Caller::AsyncAnthropic => "anthropic_async",
            Caller::Litellm => "litellm",
            Caller::NodeOpenAi => "node_openai",
            Caller::NodeAnthropic => "node_anthropic",
        }
    }

    /// Whether it waits in an event loop's `epoll_wait`, where no thread
    /// is seen waiting on the socket of a call.
    pub fn event_loop(self) -> bool {
        matches!(
            self,
            Caller::Tokio
                | Caller::AsyncOpenAi
                | Caller::AsyncAnthropic
                | Caller::Litellm
                | Caller::NodeOpenAi
                | Caller::NodeAnthropic
        )
    }
}

/// A provider that never answers (thinks 600 s), for the testbed runners.
pub const NEVER: &str = "/v1/stream?first_ms=600000&gap_ms=100&tokens=20";
/// The same for the SDKs (the compatible APIs' pacing is the model name).
pub const NEVER_MODEL: &str = "think-600000-gap-100-tokens-20";
/// A model that answers at once: 5 tokens 20 ms apart.
pub const FAST_MODEL: &str = "think-100-gap-20-tokens-5";

/// The proof the silent-call scenarios configure: three probes a second
/// apart after a second of silence.
pub const PROOF: &str =
    "[agent.proof]\nkeepalive = true\nidle = \"1s\"\ninterval = \"1s\"\ncount = 3\n";

/// Where the SDK runners' status endpoints listen (runners' namespace).
pub(super) const SDK_STATUS_PORT: u16 = 9101;
/// Where the SDK callers' programs are, from the workspace root:
/// `py/` (the Python SDKs' runner, an HTTP/2 provider) and `node/` (the
/// Node SDKs' runner, beside the `node_modules` that `cargo xtask setup`
/// installs there).
pub const SDK_CALLERS: &str = "tests";

/// `rel` in [`SDK_CALLERS`] of this source tree.
pub(super) fn sdk_path(rel: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    root.parent().unwrap_or(root).join(SDK_CALLERS).join(rel)
}

/// The Python interpreter with the SDKs, and `tests/py/sdk_runner.py`
/// (`SELFHEAL_SDK_RUNNER` overrides where the script is).
pub fn sdk_runner() -> anyhow::Result<(PathBuf, PathBuf)> {
    let script = std::env::var_os("SELFHEAL_SDK_RUNNER")
        .map(PathBuf::from)
        .unwrap_or_else(|| sdk_path("py/sdk_runner.py"));
    if !script.exists() {
        bail!(
            "no SDK runner at {} (set SELFHEAL_SDK_RUNNER)",
            script.display()
        );
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, openai, anthropic, litellm; print(sys.executable)",
        ])
        .output()
        .context("cannot run python3")?;
    if !out.status.success() {
        bail!(
            "python3 cannot import the openai and anthropic SDKs and litellm (`cargo xtask setup` installs them): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()),
        script,
    ))
}

/// `node` and `tests/node/sdk_runner.mjs`, with the Node SDKs installed
/// beside it (`cargo xtask setup` runs `npm ci` there).
pub fn node_sdk_runner() -> anyhow::Result<(PathBuf, PathBuf)> {
    let dir = sdk_path("node");
    for package in ["openai", "@anthropic-ai/sdk"] {
        if !dir.join("node_modules").join(package).exists() {
            bail!(
                "the Node SDK {package} is not installed in {} (`cargo xtask setup` installs it)",
                dir.display()
            );
        }
    }
    let node = Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .context("cannot look for node")?;
    if !node.status.success() {
        bail!("no node on PATH (`cargo xtask setup` installs Debian's nodejs)");
    }
    Ok((
        PathBuf::from(String::from_utf8_lossy(&node.stdout).trim()),
        dir.join("sdk_runner.mjs"),
    ))
}

/// One call's milestone in a caller's output: the SDK runner's `call N
/// start|done tokens=K|failed: E`, or a testbed runner's `working W`,
/// `done W tokens=K`, `provider call for W failed: E`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallLine {
    Start(String),
    Done(String, u64),
    Failed(String, String),
}

impl CallLine {
    pub(super) fn is_start(&self) -> bool {
        matches!(self, CallLine::Start(_))
    }

    pub(super) fn is_done(&self) -> bool {
        matches!(self, CallLine::Done(..))
    }

    pub(super) fn is_failed(&self) -> bool {
        matches!(self, CallLine::Failed(..))
    }

    pub fn parse(line: &str) -> Option<CallLine> {
        if let Some(rest) = line.strip_prefix("call ") {
            let (n, what) = rest.split_once(' ')?;
            if what == "start" {
                return Some(CallLine::Start(n.into()));
            }
            if let Some(t) = what.strip_prefix("done tokens=") {
                return Some(CallLine::Done(n.into(), t.parse().ok()?));
            }
            return what
                .strip_prefix("failed: ")
                .map(|e| CallLine::Failed(n.into(), e.into()));
        }
        if let Some(id) = line.strip_prefix("working ") {
            return Some(CallLine::Start(id.into()));
        }
        if let Some(rest) = line.strip_prefix("provider call for ") {
            let (id, e) = rest.split_once(" failed: ")?;
            return Some(CallLine::Failed(id.into(), e.into()));
        }
        let (id, t) = line.strip_prefix("done ")?.split_once(" tokens=")?;
        Some(CallLine::Done(id.into(), t.parse().ok()?))
    }
}

/// What a caller's calls did, from its output.
#[derive(Debug, Default)]
pub(super) struct Calls {
    /// The call in flight when the flow was cut.
    pub(super) cut: Option<String>,
    pub(super) started: Vec<String>,
    pub(super) failed: Option<(String, String, u64)>,
    pub(super) next_started: Option<(String, u64)>,
    pub(super) next_done: Option<(String, u64, u64)>,
    /// Calls done and failed, all told.
    pub(super) done: u64,
    pub(super) failed_total: u64,
}

/// Appends the call lines `name` printed since the last read to `lines`,
/// narrating each; where the new ones start.
pub(super) fn read_calls(
    bed: &Bed,
    name: &str,
    lines: &mut Vec<CallLine>,
    say: &mut dyn FnMut(Event),
) -> usize {
    let seen = lines.len();
    for line in bed.lines(name).unwrap_or_default() {
        if let Some(c) = CallLine::parse(&line) {
            say(Event::Note {
                at_ms: bed.at_ms(),
                text: format!("{name}: {line}"),
            });
            lines.push(c);
        }
    }
    seen
}

/// Reads `name`'s call lines into `lines` until `enough` of them (every
/// 100 ms, for at most 30 s).
pub(super) fn wait_calls(
    bed: &Bed,
    what: &str,
    name: &str,
    lines: &mut Vec<CallLine>,
    say: &mut dyn FnMut(Event),
    mut enough: impl FnMut(&[CallLine]) -> bool,
) -> anyhow::Result<()> {
    bed.wait(what, Duration::from_secs(30), || {
        read_calls(bed, name, lines, say);
        Ok(enough(lines).then_some(()))
    })
}

/// How many of `lines` are `kind` (`CallLine::is_done`, …).
pub(super) fn count(lines: &[CallLine], kind: fn(&CallLine) -> bool) -> usize {
    lines.iter().filter(|l| kind(l)).count()
}

impl Calls {
    /// Reads what `name` printed; `since` is the cut (None before it).
    pub(super) fn read(
        &mut self,
        bed: &Bed,
        name: &str,
        since: Option<Instant>,
        say: &mut dyn FnMut(Event),
    ) {
        for line in bed.lines(name).unwrap_or_default() {
            let Some(c) = CallLine::parse(&line) else {
                continue;
            };
            let at = since.map_or(0, |t| t.elapsed().as_millis() as u64);
            say(Event::Note {
                at_ms: bed.at_ms(),
                text: format!("{name}: {line}"),
            });
            match &c {
                CallLine::Done(..) => self.done += 1,
                CallLine::Failed(..) => self.failed_total += 1,
                CallLine::Start(_) => {}
            }
            match c {
                CallLine::Start(id) => {
                    if since.is_some()
                        && self.next_started.is_none()
                        && self.cut.as_ref() != Some(&id)
                    {
                        self.next_started = Some((id.clone(), at));
                    }
                    self.started.push(id);
                }
                CallLine::Failed(id, e) if since.is_some() && self.cut.as_ref() == Some(&id) => {
                    self.failed.get_or_insert((id, e, at));
                }
                CallLine::Done(id, tokens)
                    if self.next_started.as_ref().is_some_and(|(n, _)| *n == id) =>
                {
                    self.next_done.get_or_insert((id, tokens, at));
                }
                _ => {}
            }
        }
    }
}

/// An `[[agent]]` block for an SDK runner named `name` calling `upstream`.
/// The config block of an SDK runner. With `claims`, its status probe reads
/// the agent's `current_task`; without, the probe only says it answers,
/// and whether a call is in flight rests on the kernel alone.
pub(super) fn sdk_agent(
    name: &str,
    script: &str,
    upstream: SocketAddr,
    status: SocketAddr,
    provider_extra: &str,
    claims: bool,
) -> String {
    let fields = if claims {
        "fields = { current_task = \"/current_task\" }\n"
    } else {
        ""
    };
    format!(
        "[[agent]]\nname = \"{name}\"\nmatch = {{ cmdline = \"{script} --name {name} \" }}\n\
         [[agent.upstream]]\nrole = \"provider\"\naddr = \"{upstream}\"\n{provider_extra}\
         [[agent.probe]]\nurl = \"http://{status}/status\"\ntimeout = \"1s\"\n{fields}\
         [agent.thresholds]\nsuspect_after = \"2s\"\nrecv_blocked = \"2s\"\n\
         [agent.heal]\nstep_window = \"5s\"\nbackoff = \"1s\"\n{PROOF}"
    )
}

/// Starts caller `name` of kind `caller` against `upstream` (the
/// provider, or a proxy before it): its first call never answers, later
/// ones answer at once. `models` (SDK callers only) overrides the first
/// calls' models, one thread per model; `extra` are more arguments for an
/// SDK runner (`tests/py/sdk_runner.py`: `--pause-ms`, `--whole`,
/// `--then-model`, which replaces the one that answers at once).
pub(super) fn start_caller(
    bed: &mut Bed,
    name: &str,
    caller: Caller,
    upstream: SocketAddr,
    provider_extra: &str,
    models: Option<Vec<String>>,
    extra: &[&str],
) -> anyhow::Result<()> {
    let sdk = match caller {
        Caller::Blocking | Caller::Tokio => {
            let mut spec = RunnerSpec::new(
                name,
                if caller == Caller::Blocking {
                    Mode::Blocking
                } else {
                    Mode::Tokio
                },
            );
            spec.provider_path = NEVER.into();
            spec.then_path = Some(FAST.into());
            spec.extra = PROOF.into();
            return bed.add_runner(spec);
        }
        Caller::OpenAi => "openai",
        Caller::Anthropic => "anthropic",
        Caller::AsyncOpenAi => "openai-async",
        Caller::AsyncAnthropic => "anthropic-async",
        Caller::Litellm => "litellm",
        Caller::NodeOpenAi => "openai",
        Caller::NodeAnthropic => "anthropic",
    };
    let node = matches!(caller, Caller::NodeOpenAi | Caller::NodeAnthropic);
    let (program, script) = if node {
        node_sdk_runner()?
    } else {
        sdk_runner()?
    };
    let status = SocketAddr::from(([127, 0, 0, 1], SDK_STATUS_PORT));
    let scheme = if bed.tls_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let base = match caller {
        Caller::Anthropic | Caller::AsyncAnthropic | Caller::NodeAnthropic => {
            format!("{scheme}://{upstream}")
        }
        _ => format!("{scheme}://{upstream}/v1"),
    };
    let mut cmd = bed.topo.runners.command(&program);
    // Over TLS, the client trusts the bed's CA through its own
    // environment, as an operator's would: httpx's and Node's variables.
    if let Some(ca) = &bed.tls_ca {
        cmd.env("SSL_CERT_FILE", ca).env("NODE_EXTRA_CA_CERTS", ca);
    }
    cmd.arg(&script)
        .args([
            "--name",
            name,
            "--sdk",
            sdk,
            "--base-url",
            &base,
            "--status",
        ])
        .arg(status.to_string());
    // OpenAI's API sends the response head with the first token, Anthropic's
    // at once: the first call's head comes as each provider's would. The
    // event-loop clients get the hard case: the head and the first event
    // (role chunk, `message_start`) 300 ms after the request (so the last
    // thing on the socket is plainly a receive), then the thinking.
    let models = models.unwrap_or_else(|| match caller {
        Caller::OpenAi => vec![format!("{NEVER_MODEL}-head-late")],
        Caller::AsyncOpenAi
        | Caller::AsyncAnthropic
        | Caller::Litellm
        | Caller::NodeOpenAi
        | Caller::NodeAnthropic => vec![format!("{NEVER_MODEL}-first-early-lag-300")],
        _ => vec![NEVER_MODEL.into()],
    });
    cmd.args(extra);
    if models.len() > 1 {
        cmd.args(["--threads", &models.len().to_string()]);
    } else if !extra.contains(&"--then-model") {
        cmd.args(["--then-model", FAST_MODEL]);
    }
    for m in &models {
        cmd.args(["--model", m]);
    }
    // The event-loop SDKs' agents tell nothing of their calls: the hard
    // case, where only the kernel's evidence and the proof can tell.
    let script_name = script
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let block = sdk_agent(
        name,
        &script_name,
        upstream,
        status,
        provider_extra,
        !caller.event_loop(),
    );
    bed.spawn(name, cmd, Some(block))?;
    bed.expect_line(name, "ready", Duration::from_secs(30))?;
    Ok(())
}
