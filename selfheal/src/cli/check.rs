//! `selfheal check` (one shot, for a timer) and `selfheal watch` (a loop, for
//! a sidecar or a foreground run): the same pipeline, `check::run`, with the
//! history kept in the state file and snapshots in the snapshot log.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::{Error, Finished};
use anyhow::Context as _;
use selfheal::{
    check, config,
    snapshots::{self, SnapshotLog},
    store::{self, StateStore},
    sys::clock,
};
use selfheal_core::{
    config::Config,
    history::History,
    ladder, metrics,
    outcome::{Outcome, render},
};

/// What `check` and `watch` share.
#[derive(clap::Args)]
pub struct Common {
    /// The config file. Default: $XDG_CONFIG_HOME/selfheal/config.toml, else
    /// /etc/selfheal/config.toml.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print one JSON object per agent per line (agent, verdict, reasons,
    /// snapshot, probes, gaps, proofs: the proof keepalives armed and put
    /// back, and containers: the id, name, image, pod and namespace of each
    /// container it runs in) instead of text. Probe URLs and bodies are
    /// redacted.
    #[arg(long)]
    json: bool,
    /// Check only this agent (repeatable).
    #[arg(long = "agent", value_name = "NAME")]
    agents: Vec<String>,
    /// Where the history between runs is kept. Default:
    /// $XDG_STATE_HOME/selfheal (or /var/lib/selfheal as root).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Where forensic snapshots are written. Default:
    /// $XDG_STATE_HOME/selfheal (or /var/log/selfheal as root).
    #[arg(long, value_name = "DIR")]
    snapshot_dir: Option<PathBuf>,
    /// Write Prometheus metrics to this file (atomically, mode 0640 with
    /// its directory's group), for node_exporter's textfile collector. The
    /// directory must exist and pass the same rule as --state-dir. When it
    /// cannot be written (e.g. a full disk) the last good file stays, the
    /// error is logged and is a gap in each result, and the exit code is 1
    /// at least.
    #[arg(long, value_name = "PATH")]
    metrics_file: Option<PathBuf>,
    /// Decide healing steps and report them, but take none (and arm no
    /// proof keepalive).
    #[arg(long)]
    dry_run: bool,
    /// Read every process from procfs instead of the kernel's task
    /// iterators (which root's checks use where the kernel has them: the
    /// same evidence, read in one pass in the kernel). `inspect` and the
    /// snapshots say which reader read how many processes, and why procfs.
    #[arg(long)]
    no_iterators: bool,
    /// The privileged helper's socket. Without a helper there, `check` acts
    /// directly where it has the permission (its own uid's agents, or all as
    /// root). A socket served by anyone but root, this user or the uid in
    /// SELFHEAL_HELPER_UID is refused.
    #[arg(long, value_name = "PATH", default_value = selfheal::helper::server::listen::DEFAULT_SOCKET)]
    helper: PathBuf,
}

/// Judge every configured agent once (asking a silent call's peer with a
/// proof keepalive where the evidence alone cannot tell), heal what is
/// wedged, and exit with a code for the worst verdict: 0 all healthy/idle/busy, 1 something degraded (or a snapshot
/// or the metrics file could not be written), 2 something wedged/unresponsive/down, 3 usage or
/// config error.
#[derive(clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    common: Common,
}

/// Check every configured agent in a loop. Logs transitions (into and out of
/// each verdict), not one line per agent per check.
#[derive(clap::Args)]
pub struct WatchArgs {
    #[command(flatten)]
    common: Common,
    /// Time between checks.
    #[arg(long, value_parser = super::parse_duration, default_value = "10s")]
    interval: Duration,
    /// Serve the metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464): the
    /// last complete check's (never one half done); empty before the first
    /// check ends. It needs --metrics-token-file (the metrics name agents,
    /// verdicts and reasons, which the metrics file keeps to its owner and
    /// group; on 127.0.0.1 every local user could read them), or
    /// --metrics-public to serve them to anyone who can connect: without
    /// either, `watch` does not start (exit 3). http://ADDR/healthz
    /// answers "ok" (no token, reads nothing: for liveness probes). A request head must arrive within
    /// 1 s; at most 256 connections wait for theirs (128 from one address,
    /// its oldest dropped for its newest), and at most 64 are answered at
    /// once (4 for one address). See dist/prometheus/ for alert rules.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Require this bearer token on /metrics (`Authorization: Bearer
    /// TOKEN`): the file's content, white space around it dropped. Refused
    /// at start if missing, empty, not printable ASCII, or readable or
    /// writable by other users (mode 0600 or 0640). A scrape without it
    /// gets 401 and a log line naming its address, never the token. The
    /// file is looked at again every 5 s: a new token in it (a Kubernetes
    /// Secret updated) replaces the old one; a file that no longer passes
    /// is logged and the last good token kept.
    #[arg(long, value_name = "PATH", requires = "metrics_addr")]
    metrics_token_file: Option<PathBuf>,
    /// Serve /metrics without a token, to every local user (and, on an
    /// address other hosts can reach, to them too): for a host where
    /// everyone who can connect may read every agent's verdicts and
    /// reasons.
    #[arg(long, requires = "metrics_addr", conflicts_with = "metrics_token_file")]
    metrics_public: bool,
    /// Stop after this many checks (default: run until killed).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

/// The helper if one answers at `path` (healing through it, and its
/// tracer's evidence, on one connection), else this process itself and no
/// eBPF evidence.
pub(super) fn executor(
    path: &Path,
) -> (
    Box<dyn selfheal::heal::Executor>,
    Option<selfheal::check::through_helper::HelperTracer>,
) {
    match selfheal::helper::client::HelperClient::connect(path) {
        Ok(client) => {
            tracing::debug!("healing through the helper at {}", path.display());
            let shared = std::sync::Arc::new(std::sync::Mutex::new(client));
            (
                Box::new(selfheal::heal::helper::HelperExecutor::shared(
                    shared.clone(),
                )),
                Some(selfheal::check::through_helper::HelperTracer(shared)),
            )
        }
        Err(e @ selfheal::helper::client::ClientError::Untrusted { .. }) => {
            tracing::error!("{e}; acting directly where permitted");
            (
                Box::new(selfheal::heal::direct::DirectExecutor::default()),
                None,
            )
        }
        Err(e) => {
            tracing::info!("{e}; acting directly where permitted");
            (
                Box::new(selfheal::heal::direct::DirectExecutor::default()),
                None,
            )
        }
    }
}

/// Everything one check needs that outlives it.
struct Session {
    config: Config,
    executor: Box<dyn selfheal::heal::Executor>,
    /// The helper's tracer, when a helper answers.
    tracer: Option<selfheal::check::through_helper::HelperTracer>,
    store: Option<StateStore>,
    history: History,
    log: Option<SnapshotLog>,
    /// Why there is no snapshot log (and so no healing), until one opens.
    log_error: Option<String>,
    snapshot_dir: PathBuf,
    opts: check::Options,
}

/// Opens the snapshot log in `dir`, or in a fallback when `dir` is the
/// default and was refused.
fn open_snapshot_log(
    dir: &Path,
    is_default: bool,
) -> Result<SnapshotLog, selfheal::fs::StoreError> {
    with_fallback(dir, is_default, "snapshot", |d| {
        SnapshotLog::open(d, snapshots::DEFAULT_MAX_BYTES, snapshots::DEFAULT_KEEP)
    })
}

/// `open(dir)`; when that is refused and `dir` is the default (not given),
/// the first of [`store::fallback_state_dirs`] that opens, saying so and
/// what to do. A directory given on the command line is used or refused,
/// never replaced.
fn with_fallback<T>(
    dir: &Path,
    is_default: bool,
    what: &str,
    open: impl Fn(&Path) -> Result<T, selfheal::fs::StoreError>,
) -> Result<T, selfheal::fs::StoreError> {
    let first = match open(dir) {
        Ok(t) => return Ok(t),
        Err(e @ selfheal::fs::StoreError::Locked { .. }) => return Err(e),
        Err(e) if !is_default => return Err(e),
        Err(e) => e,
    };
    for alt in store::fallback_state_dirs(selfheal::sys::creds::euid()) {
        if alt == dir {
            continue;
        }
        match open(&alt) {
            Ok(t) => {
                tracing::warn!(
                    "{what} directory: {first}; using {} instead; {}",
                    alt.display(),
                    store::refused_default_advice(dir)
                );
                return Ok(t);
            }
            Err(e) => tracing::debug!("{what} directory fallback {}: {e}", alt.display()),
        }
    }
    Err(first)
}

impl Session {
    fn open(c: &Common) -> Result<Session, Error> {
        let config = config::locate(c.config.as_deref()).and_then(|p| config::load(&p))?;
        // An `[auto]` agent is found by each check, not named in the file.
        for name in &c.agents {
            if !(config.auto.is_on() && name.starts_with(selfheal_core::auto::PREFIX)) {
                super::configured_agent(&config, name)?;
            }
        }
        let state_dir = c.state_dir.clone().unwrap_or_else(store::default_state_dir);
        let opened = with_fallback(&state_dir, c.state_dir.is_none(), "state", |d| {
            StateStore::open(d)
        });
        let (store, history) = match opened {
            Ok(store) => {
                let loaded = store.load::<History>();
                if let Some(note) = &loaded.note {
                    tracing::info!("state: {note}");
                }
                (Some(store), loaded.value)
            }
            Err(e) => {
                tracing::error!("state unavailable, judging without history: {e}");
                (None, History::default())
            }
        };
        let snapshot_dir = c
            .snapshot_dir
            .clone()
            .unwrap_or_else(snapshots::default_snapshot_dir);
        let (log, log_error) = match open_snapshot_log(&snapshot_dir, c.snapshot_dir.is_none()) {
            Ok(log) => (Some(log), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let opts = check::Options {
            dry_run: c.dry_run,
            only: c.agents.clone(),
            // A one-shot check attaches no tracer: receives that began before
            // it would be invisible, and their threads' last run times them.
            // The tracer's evidence comes from a helper started with
            // --tracer.
            collect: selfheal::inspect::CollectOptions {
                no_ebpf: true,
                no_ebpf_why: Some(
                    "no helper answered: check does not load eBPF itself (run `selfheal helper`)"
                        .into(),
                ),
                detail: selfheal_core::proc::Detail::Minimal,
                no_iterators: c.no_iterators.then(|| "disabled by --no-iterators".into()),
                ..Default::default()
            },
        };
        let (executor, tracer) = executor(&c.helper);
        Ok(Session {
            executor,
            tracer,
            config,
            store,
            history,
            log,
            log_error,
            snapshot_dir,
            opts,
        })
    }

    /// One check: judge, save the history, print, log transitions; its
    /// exit code, and its metrics where `metrics` asks for them (empty
    /// otherwise; rendered anyway where a metrics file is written).
    fn once(&mut self, c: &Common, metrics: bool) -> anyhow::Result<(u8, String)> {
        // A snapshot log that could not be opened is tried again on every
        // check (`watch` recovers once the directory is fixed); until then
        // every check says healing is off.
        if self.log.is_none() {
            match open_snapshot_log(&self.snapshot_dir, c.snapshot_dir.is_none()) {
                Ok(log) => {
                    tracing::info!(
                        "snapshot log: {} opened; healing is on",
                        log.dir().display()
                    );
                    self.log = Some(log);
                    self.log_error = None;
                }
                Err(e) => self.log_error = Some(e.to_string()),
            }
        }
        let disabled = self.log_error.as_ref().map(|e| {
            format!(
                "healing disabled: no snapshot dir ({e}); no healing step is taken without a \
                 snapshot: fix that directory or give --snapshot-dir DIR (a directory of yours \
                 that only you can write)"
            )
        });
        if let Some(gap) = &disabled {
            tracing::error!("{gap}");
        }
        let started = Instant::now();
        let mut tracer = self.tracer.as_mut().map(|t| Answered {
            inner: t,
            ok: false,
        });
        let mut outcomes = check::run(
            &self.config,
            &mut self.history,
            self.log.as_ref(),
            Some(self.executor.as_ref()),
            tracer.as_mut().map(|t| t as &mut dyn check::TracerSource),
            &self.opts,
            clock::now(),
        );
        let helper_up = tracer.is_some_and(|t| t.ok);
        if let Some(gap) = &disabled {
            for o in &mut outcomes {
                o.gaps.push(gap.clone());
            }
        }
        if let Some(store) = &self.store
            && let Err(e) = store.save(&self.history)
        {
            tracing::error!("cannot save the state: {e}");
        }
        let metrics = if metrics || c.metrics_file.is_some() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let info = metrics::CheckInfo::from_outcomes(
                &outcomes,
                selfheal::ebpf::BUILT_IN,
                helper_up,
                now,
                started.elapsed().as_secs_f64(),
            );
            metrics::render(&outcomes, &self.history, &info)
        } else {
            String::new()
        };
        // A metrics file that cannot be written (a full disk, a removed
        // directory) keeps its last good content (the write is atomic); the
        // failure is logged, a gap in every agent's result, and exit code 1
        // at least.
        let mut metrics_failed = false;
        if let Some(path) = &c.metrics_file
            && let Err(e) = selfheal::fs::safedir::write_file_atomically(
                path,
                metrics.as_bytes(),
                selfheal::fs::safedir::METRICS_FILE_MODE,
            )
        {
            metrics_failed = true;
            let gap = format!(
                "metrics file not written (its last good content stays): {}: {}",
                selfheal_core::text::escape(&path.display().to_string()),
                selfheal_core::text::escape(&e.to_string())
            );
            tracing::error!("{gap}");
            for o in &mut outcomes {
                o.gaps.push(gap.clone());
            }
        }
        report(&outcomes, c.json)?;
        let code = render::exit_code(&outcomes).max(u8::from(metrics_failed));
        Ok((code, metrics))
    }
}

/// The helper's tracer, noting whether the helper answered this check
/// (the `selfheal_helper_up` metric): a refusal is an answer, as from a
/// helper running no tracer.
struct Answered<'a> {
    inner: &'a mut selfheal::check::through_helper::HelperTracer,
    ok: bool,
}

impl check::TracerSource for Answered<'_> {
    fn snapshot(
        &mut self,
        pids: &[u32],
    ) -> Result<(selfheal_core::ebpf::TracerSnapshot, Option<u64>), selfheal::helper::ClientError>
    {
        let got = self.inner.read(pids);
        self.ok = match &got {
            Ok(_) => true,
            Err(e) => e.code().is_some(),
        };
        got
    }

    fn passes(&self) -> Option<Box<dyn selfheal::inspect::HelperReads>> {
        self.inner.passes()
    }
}

fn report(outcomes: &[Outcome], json: bool) -> anyhow::Result<()> {
    for o in outcomes {
        if let Some(line) = render::transition_line(o) {
            if o.verdict.is_ok() {
                tracing::info!("{line}");
            } else {
                tracing::warn!("{line}");
            }
        }
        for a in o.heal.iter().flat_map(|h| &h.actions) {
            let what = a.step.words();
            if a.ok {
                tracing::warn!("agent {}: healed: {what}: {}", o.agent, a.detail);
            } else {
                tracing::error!(
                    "agent {}: healing step failed: {what}: {}",
                    o.agent,
                    a.detail
                );
            }
        }
        if let Some(ladder::Decision::GaveUp { why }) = o
            .heal
            .as_ref()
            .filter(|h| h.newly_gave_up)
            .map(|h| &h.decision)
        {
            tracing::error!("agent {}: healing gave up: {why}", o.agent);
        }
        if let Some(e) = &o.snapshot_error {
            tracing::error!(
                "agent {}: {} but its snapshot was NOT written: {e}",
                o.agent,
                o.verdict
            );
        }
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for o in outcomes {
        if json {
            let line = serde_json::to_string(o).context("cannot format the result")?;
            writeln!(out, "{}", selfheal_core::text::escape_json(&line))
                .context("cannot write the result")?;
        } else {
            writeln!(out, "{}", render::summary_line(o)).context("cannot write the result")?;
        }
    }
    out.flush().context("cannot write the result")
}

pub fn check(args: CheckArgs) -> Result<Finished, Error> {
    let mut session = Session::open(&args.common)?;
    let (code, _) = session.once(&args.common, false)?;
    Ok(Finished::Status(code))
}

pub fn watch(args: WatchArgs) -> Result<Finished, Error> {
    // An endpoint nothing guards is refused unless asked for, and a bad
    // token file, before anything else is opened.
    if let Some(addr) = args.metrics_addr
        && args.metrics_token_file.is_none()
        && !args.metrics_public
    {
        return Err(Error::MetricsUnprotected { addr });
    }
    let token = args
        .metrics_token_file
        .as_deref()
        .map(selfheal::metrics_endpoint::TokenFile::open)
        .transpose()?;
    let mut session = Session::open(&args.common)?;
    // A long-running watch loads the kernel's task iterators once, on its
    // first check, when no helper pinned them.
    session.opts.collect.load_iterators = true;
    let metrics = Arc::new(Mutex::new(String::new()));
    if let Some(addr) = args.metrics_addr {
        serve_metrics(addr, Arc::clone(&metrics), token)
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
    }
    let mut n = 0u64;
    loop {
        let started = Instant::now();
        let (code, text) = session.once(&args.common, true)?;
        if let Ok(mut m) = metrics.lock() {
            *m = text;
        }
        n += 1;
        if args.count.is_some_and(|max| n >= max) {
            return Ok(Finished::Status(code));
        }
        std::thread::sleep(args.interval.saturating_sub(started.elapsed()));
    }
}

/// Binds `addr` and serves the metrics there ([`selfheal::metrics_endpoint`]).
/// Says in the log when no token guards it (`--metrics-public`): a warning
/// where other hosts can reach it.
fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: Arc<Mutex<String>>,
    token: Option<selfheal::metrics_endpoint::TokenFile>,
) -> std::io::Result<()> {
    let listener = std::net::TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let guarded = if token.is_some() {
        "a bearer token required"
    } else {
        "no token required (--metrics-public): every local user may read them"
    };
    if addr.ip().is_loopback() || token.is_some() {
        tracing::info!("serving metrics at http://{bound}/metrics ({guarded})");
    } else {
        tracing::warn!(
            "serving metrics at http://{bound}/metrics, reachable from other hosts, with no \
             authentication (--metrics-public: anyone who can reach it reads agent names, \
             verdicts and reasons): give --metrics-token-file instead unless a firewall or a \
             NetworkPolicy guards it"
        );
    }
    selfheal::metrics_endpoint::serve(listener, metrics, token)
}
