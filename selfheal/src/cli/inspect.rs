//! `selfheal inspect`: kernel-level diagnosis of one agent (by its configured
//! name) or one process and its descendants (`--pid`), for a person at a
//! terminal or a script (`--json`).

use std::{io::Write as _, path::PathBuf, time::Duration};

use super::{Error, Finished};
use anyhow::Context as _;
use selfheal::{
    agents::{self, ProcessTable},
    config, inspect,
};
use selfheal_core::{
    config::{AgentConfig, MatchRule},
    ebpf::strategy::Strategy,
    text::escape,
};

/// Show an agent's processes, threads and the receive each is blocked in
/// (and for how long), its TCP sockets with their role, the kernel's
/// tcp_info and eBPF activity, zombies and the missing-init diagnosis, and
/// which eBPF attach strategy was used and why the others failed.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["name", "pid"])))]
pub struct Args {
    /// The agent to inspect: a configured name, or an `[auto]` agent's
    /// (`auto.RUNTIME.NAME.ID12`, `auto.unit.UNIT`) as `check` names it.
    name: Option<String>,
    /// Inspect this process and its descendants instead of a configured agent.
    #[arg(long)]
    pid: Option<u32>,
    /// The config file (for NAME). Default: $XDG_CONFIG_HOME/selfheal/config.toml,
    /// else /etc/selfheal/config.toml.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the tracer attached this long before reading it, so receives that
    /// start meanwhile are timed from their beginning (e.g. 2s).
    #[arg(long, value_parser = super::parse_duration, default_value = "0s")]
    wait: Duration,
    /// Try only this eBPF attach strategy (repeatable, tried in the order
    /// given): kprobe, fentry, tp_btf, tracepoint.
    #[arg(long = "ebpf-strategy", value_parser = parse_strategy)]
    strategies: Vec<Strategy>,
    /// Do not use eBPF: procfs and sock_diag only.
    #[arg(long)]
    no_ebpf: bool,
    /// Where `check` keeps its history (for NAME: the verdict is judged
    /// against it, read only). Default: $XDG_STATE_HOME/selfheal (or
    /// /var/lib/selfheal as root).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

fn parse_strategy(s: &str) -> Result<Strategy, String> {
    Strategy::from_name(s).ok_or_else(|| {
        let names: Vec<_> = Strategy::ALL.iter().map(|s| s.name()).collect();
        format!("unknown strategy {s:?}; one of {}", names.join(", "))
    })
}

pub fn run(args: Args) -> Result<Finished, Error> {
    let table = ProcessTable::read().with_own_pid(std::process::id());
    let mut agent_config = None;
    let target = match (&args.name, args.pid) {
        (_, Some(pid)) => {
            let matched = agents::find(&MatchRule::Pid(pid), &table);
            if let Some(problem) = matched.problem {
                return Err(Error::NoSuchProcess { pid, problem });
            }
            let sources = selfheal::runtime::Sources::from_env();
            let table = selfheal::agents::enrich(table, &matched.all, false, &sources);
            let containers = table.identities(&matched.all);
            let container_gaps = table.inventory().gaps(&containers, false);
            inspect::Target {
                agent: None,
                rule: format!("pid={pid}"),
                roots: matched.roots,
                pids: matched.all,
                problem: None,
                upstream_of: Box::new(|_| None),
                upstreams: Vec::new(),
                roles: selfheal_core::config::Roles::ByAddress,
                containers,
                container_gaps,
                unread_cmdlines: None,
            }
        }
        (Some(name), None) => {
            let config =
                config::locate(args.config.as_deref()).and_then(|path| config::load(&path))?;
            let sources = selfheal::runtime::Sources::from_env();
            let (agent, table) =
                if config.auto.is_on() && name.starts_with(selfheal_core::auto::PREFIX) {
                    auto_agent(&config, name, table, &sources)?
                } else {
                    let agent = super::configured_agent(&config, name)?;
                    let table = selfheal::agents::enrich_for(table, &[agent], &sources);
                    (agent.clone(), table)
                };
            let target = selfheal::check::pipeline::target(&agent, &table);
            agent_config = Some(agent);
            target
        }
        // clap's group requires one of the two already.
        (None, None) => {
            return Err(Error::Cli(clap::Error::raw(
                clap::error::ErrorKind::MissingRequiredArgument,
                "inspect needs an agent NAME or --pid PID",
            )));
        }
    };
    let opts = inspect::CollectOptions {
        no_ebpf: args.no_ebpf,
        detail: selfheal_core::proc::Detail::Full,
        no_ebpf_why: None,
        strategies: args.strategies,
        wait: args.wait,
        no_iterators: None,
        load_iterators: false,
    };
    let report = selfheal_core::inspect::build(&inspect::collect(&target, &opts));
    // A configured agent is judged, against check's history (read only).
    let diagnosis = agent_config.as_ref().map(|agent| {
        let history = history_of(&agent.name, args.state_dir.as_deref());
        selfheal::check::pipeline::diagnose(agent, &report, &history, selfheal::sys::clock::now())
    });
    // Stdout is line-buffered: a pretty JSON document of thousands of lines
    // would otherwise be thousands of writes.
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        let mut doc = serde_json::to_value(&report).context("cannot write the report")?;
        if let (Some(d), Some(map)) = (&diagnosis, doc.as_object_mut()) {
            let value = |v: Result<serde_json::Value, serde_json::Error>| {
                v.context("cannot write the report")
            };
            map.insert("verdict".into(), value(serde_json::to_value(d.verdict))?);
            map.insert("reasons".into(), value(serde_json::to_value(&d.reasons))?);
            map.insert("proofs".into(), value(serde_json::to_value(&d.proofs))?);
            map.insert("progress".into(), value(serde_json::to_value(&d.progress))?);
        }
        let text = serde_json::to_string_pretty(&doc).context("cannot write the report")?;
        // Still JSON, with DEL and C1 controls as \u escapes too.
        writeln!(out, "{}", selfheal_core::text::escape_json(&text))
            .context("cannot write the report")?;
    } else {
        out.write_all(selfheal_core::inspect::render(&report).as_bytes())
            .context("cannot write the report")?;
        if let Some(d) = &diagnosis {
            out.write_all(render_diagnosis(d).as_bytes())
                .context("cannot write the report")?;
        }
    }
    out.flush().context("cannot write the report")?;
    Ok(Finished::Done)
}

/// The `[auto]` agent `name` as `check` finds it: the table enriched for
/// `[auto]`'s rules, the runtimes asked for the labelled containers, the
/// agent among those found now (a container's label read from its
/// runtime, never from what its processes say).
fn auto_agent(
    config: &selfheal_core::config::Config,
    name: &str,
    table: ProcessTable,
    sources: &selfheal::runtime::Sources,
) -> Result<(AgentConfig, ProcessTable), Error> {
    let reading = agents::auto::reading(config);
    let rules: Vec<&AgentConfig> = reading.iter().collect();
    let table = agents::enrich_for(table, &rules, sources);
    let found = agents::auto::agents(config, &table);
    match found.iter().find(|a| a.name == name) {
        Some(agent) => Ok((agent.clone(), table)),
        None => Err(Error::NoSuchAutoAgent {
            name: name.to_string(),
            path: config.path.clone(),
            found: found.into_iter().map(|a| a.name).collect(),
        }),
    }
}

/// The history `check` keeps for agent `name`, or none (said on stderr)
/// when it cannot be read: the verdict is then judged without it.
fn history_of(name: &str, dir: Option<&std::path::Path>) -> selfheal_core::judge::AgentHistory {
    let dir = dir.map_or_else(selfheal::store::default_state_dir, |d| d.to_path_buf());
    // A running check holds the lock for its whole run: wait a little.
    match selfheal::store::StateStore::open_with_timeout(&dir, Duration::from_secs(3)) {
        Ok(store) => {
            let loaded = store.load::<selfheal_core::history::History>();
            if loaded.value.boot_id != selfheal::check::boot_id() {
                return Default::default();
            }
            loaded
                .value
                .agents
                .get(name)
                .map(|r| r.judge.clone())
                .unwrap_or_default()
        }
        // A warning in the log stream (escaped there), not an error.
        Err(e) => {
            tracing::warn!("judging without check's history: {e}");
            Default::default()
        }
    }
}

/// The judge's verdict, its reasons and the prove stage's state, for a
/// person (every text escaped).
fn render_diagnosis(d: &selfheal::check::pipeline::Diagnosis) -> String {
    use std::fmt::Write as _;
    let esc = escape;
    let mut o = String::new();
    let _ = writeln!(o, "\nverdict: {}", d.verdict);
    for r in &d.reasons {
        let _ = writeln!(o, "  {} ({}): {}", r.code, r.verdict, esc(&r.message));
    }
    if !d.proofs.is_empty() {
        let _ = writeln!(o, "proof:");
        for p in &d.proofs {
            let _ = writeln!(
                o,
                "  socket {} to {}: {}",
                p.inode,
                esc(&p.remote),
                esc(&p.detail)
            );
        }
    }
    if !d.progress.is_empty() {
        let _ = writeln!(o, "progress:");
        for p in &d.progress {
            let _ = writeln!(
                o,
                "  socket {} to {}: {}",
                p.inode,
                esc(&p.remote),
                closeness(&p.closeness)
            );
        }
    }
    o
}

/// A connection's keepalive-only arrivals against its bound, in words:
/// "only keepalive for 12.0s: 3 arrival(s) of 42 bytes about 5.0s apart,
/// the last 1.0s ago; stall_after 20.0s, 8.0s left", the time counted
/// being time awake ("only keepalive for 12.0s, not counting 1h00m
/// suspended: …"). Only numbers.
fn closeness(c: &selfheal_core::progress::Closeness) -> String {
    let human = selfheal_core::inspect::human_ms;
    let sizes = if c.keepalive_bytes_min == c.keepalive_bytes_max {
        format!("{} bytes", c.keepalive_bytes_min)
    } else {
        format!("{}-{} bytes", c.keepalive_bytes_min, c.keepalive_bytes_max)
    };
    let spacing = c
        .keepalive_spacing_ms
        .map_or(String::new(), |ms| format!(" about {} apart", human(ms)));
    let left = if c.stalled {
        "past it: stalled".to_string()
    } else if c.left_ms == 0 {
        format!(
            "past it, but fewer than {} keepalives: not stalled yet",
            selfheal_core::progress::MIN_KEEPALIVES
        )
    } else {
        format!("{} left", human(c.left_ms))
    };
    let suspended = if c.suspended_ms > 0 {
        format!(", not counting {} suspended", human(c.suspended_ms))
    } else {
        String::new()
    };
    format!(
        "only keepalive for {}{suspended}: {} arrival(s) of {sizes}{spacing}, the last {} ago; stall_after {}, {left}",
        human(c.only_keepalive_ms),
        c.keepalives,
        human(c.last_keepalive_ago_ms),
        human(c.stall_after_ms),
    )
}

#[cfg(test)]
mod tests {
    use selfheal_core::progress::Progress;

    /// The words of a connection's count towards its bound: the time
    /// counted is time awake, and a suspend within it is named, not
    /// counted; without one, nothing is said of it.
    #[test]
    fn a_suspend_not_counted_is_named_in_the_words() {
        // Three 42-byte pings from 5 s to 15 s, an hour suspended since.
        let p = Progress {
            since_ms: 5_000,
            checked_ms: 3_616_000,
            suspended_ms: 3_600_000,
            keepalives: 3,
            keepalive_bytes: 126,
            smallest: Some(42),
            largest: 42,
            first_at_ms: Some(5_000),
            last_at_ms: 15_000,
            ..Progress::default()
        };
        let c = p.closeness(3_616_000, 20_000).expect("pings counted");
        assert_eq!(
            super::closeness(&c),
            "only keepalive for 11.0s, not counting 1h00m suspended: 3 arrival(s) of 42 bytes about 5.0s apart, the last 1.0s ago; stall_after 20.0s, 9.0s left"
        );
        let awake = Progress {
            checked_ms: 16_000,
            suspended_ms: 0,
            ..p
        };
        let c = awake.closeness(16_000, 20_000).expect("pings counted");
        assert_eq!(
            super::closeness(&c),
            "only keepalive for 11.0s: 3 arrival(s) of 42 bytes about 5.0s apart, the last 1.0s ago; stall_after 20.0s, 9.0s left"
        );
    }
}
