//! `selfheal config check`: validates the config file and shows what it
//! means on this host now: each agent's processes and its upstreams'
//! addresses.

use std::{fmt::Write as _, io::Write as _, path::PathBuf};

use super::{Error, Finished};
use anyhow::Context as _;
use selfheal::{
    agents::{self, Matched, ProcessTable},
    config, runtime,
};
use selfheal_core::config::{
    AgentConfig, Config, MatchRule, ProbeConfig, Redirects, Resolution, ResolvedUpstreams,
    SecretSource,
};
use selfheal_core::runtime::Identity;

/// Check the config file.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Validate the config (exit 3 on an error, which names the file, line
    /// and key) and show, per agent, the processes its match rule finds now
    /// and the addresses its upstreams resolve to.
    Check(CheckArgs),
}

#[derive(clap::Args)]
struct CheckArgs {
    /// The config file. Default: $XDG_CONFIG_HOME/selfheal/config.toml (or
    /// ~/.config/selfheal/config.toml), else /etc/selfheal/config.toml.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
}

/// Most root pids listed per agent.
const MAX_ROOTS_SHOWN: usize = 10;

pub fn run(args: Args) -> Result<Finished, Error> {
    match args.command {
        Command::Check(args) => check(args),
    }
}

fn check(args: CheckArgs) -> Result<Finished, Error> {
    let config = config::locate(args.config.as_deref()).and_then(|path| config::load(&path))?;
    let table = ProcessTable::read();
    let reading = selfheal::agents::auto::reading(&config);
    let all: Vec<_> = config.agents.iter().chain(&reading).collect();
    let table = selfheal::agents::enrich_for(table, &all, &runtime::Sources::from_env());
    let auto = selfheal::agents::auto::agents(&config, &table);
    let listed: Vec<&AgentConfig> = config.agents.iter().chain(&auto).collect();
    let agents: Vec<_> = listed
        .iter()
        .map(|a| {
            (
                agents::find_for(a, selfheal::sys::creds::euid(), &table),
                config::resolve_upstreams(a),
            )
        })
        .collect();
    let containers: Vec<(Vec<Identity>, Vec<String>)> = listed
        .iter()
        .zip(&agents)
        .map(|(a, (m, _))| {
            let ids = table.identities(&m.all);
            let mut gaps = table
                .inventory()
                .gaps(&ids, matches!(a.rule, MatchRule::Container(_)));
            gaps.extend(table.refusals(&m.all));
            gaps.extend(table.cmdline_gap(a, selfheal::sys::creds::euid()));
            (ids, gaps)
        })
        .collect();
    std::io::stdout()
        .lock()
        .write_all(
            selfheal_core::text::escape_lines(&render(&config, &listed, &agents, &containers))
                .as_bytes(),
        )
        .context("cannot write the report")?;
    Ok(Finished::Done)
}

/// The report: `found[i]` is what agent `i` matched and resolved to, and
/// `containers[i]` the containers those processes are in (with what the
/// runtimes could not tell).
fn render(
    config: &Config,
    listed: &[&AgentConfig],
    found: &[(Matched, ResolvedUpstreams)],
    containers: &[(Vec<Identity>, Vec<String>)],
) -> String {
    let mut out = String::new();
    let n = listed.len();
    let _ = writeln!(
        out,
        "config {}: ok, {n} agent{}",
        config.path.display(),
        if n == 1 { "" } else { "s" }
    );
    for (i, (agent, (matched, upstreams))) in listed.iter().zip(found).enumerate() {
        let _ = writeln!(out, "\nagent {}", agent.name);
        let euid = selfheal::sys::creds::euid();
        let _ = match (agent.uid_filter(euid), &agent.rule) {
            (Some(uid), _) => writeln!(out, "  match      {} (uid {uid}'s processes)", agent.rule),
            (None, MatchRule::Unit(_)) => writeln!(
                out,
                "  match      {} ({})",
                agent.rule,
                agent.unit_owner(euid)
            ),
            (None, _) => writeln!(out, "  match      {}", agent.rule),
        };
        let _ = writeln!(out, "  processes  {}", processes(matched));
        if let MatchRule::Unit(unit) = &agent.rule {
            for (manager, state) in selfheal::check::heal::unit_states(unit, &matched.roots) {
                let _ = match state {
                    Some((load, active)) => {
                        writeln!(out, "  unit       {unit} of {manager}: {load}, {active}")
                    }
                    None => writeln!(out, "  unit       {unit} of {manager}: cannot be asked"),
                };
            }
        }
        if let Some((ids, gaps)) = containers.get(i) {
            for c in ids {
                let _ = writeln!(out, "  container  {}", c.describe());
            }
            for g in gaps {
                let _ = writeln!(out, "  gap        {g}");
            }
        }
        if upstreams.upstreams.is_empty() {
            let _ = writeln!(out, "  upstreams  none (every socket is \"other\")");
        }
        for u in &upstreams.upstreams {
            let mut line = format!("{} {}", u.upstream.role, u.upstream.addr);
            if let Some(hb) = u.upstream.heartbeat {
                let _ = write!(line, " heartbeat {}", humantime::format_duration(hb));
            }
            match &u.resolution {
                Resolution::Literal => {}
                Resolution::Resolved(addrs) => {
                    let list: Vec<_> = addrs.iter().map(ToString::to_string).collect();
                    let _ = write!(line, " -> {}", list.join(", "));
                }
                Resolution::Failed(e) => {
                    let _ = write!(line, " -> does not resolve ({e}): matches nothing");
                }
            }
            let _ = writeln!(out, "  upstream   {line}");
        }
        for p in &agent.probes {
            let _ = writeln!(out, "  probe      {}", probe(p));
        }
    }
    out
}

fn processes(m: &Matched) -> String {
    if m.roots.is_empty() {
        return format!(
            "none ({})",
            m.problem.as_deref().unwrap_or("no process matches")
        );
    }
    let mut shown: Vec<_> = m
        .roots
        .iter()
        .take(MAX_ROOTS_SHOWN)
        .map(ToString::to_string)
        .collect();
    if m.roots.len() > MAX_ROOTS_SHOWN {
        shown.push(format!("and {} more", m.roots.len() - MAX_ROOTS_SHOWN));
    }
    let mut s = format!(
        "{} {} ({} in all with descendants)",
        if m.roots.len() == 1 { "pid" } else { "pids" },
        shown.join(", "),
        m.all.len()
    );
    if let Some(p) = &m.problem {
        let _ = write!(s, "; {p}");
    }
    s
}

fn probe(p: &ProbeConfig) -> String {
    match p {
        ProbeConfig::Http {
            url,
            method,
            timeout,
            expect_status,
            fields,
            expect,
            auth,
            redirects,
            body_excerpt,
        } => {
            let mut s = format!(
                "{method} {} timeout {}",
                selfheal_core::text::redact_url(url),
                humantime::format_duration(*timeout)
            );
            if let Some(a) = auth {
                let header = a.header.as_deref().unwrap_or("Authorization: Bearer");
                let _ = match &a.source {
                    SecretSource::File(path) => {
                        write!(s, ", auth {header} from file {}", path.display())
                    }
                    SecretSource::Env(name) => write!(s, ", auth {header} from ${name}"),
                };
                // Whether it can be read now; never the secret itself.
                if let Err(e) = selfheal::probe::read_secret(&a.source) {
                    let _ = write!(s, " (WARNING: {e})");
                }
            }
            if *redirects == Redirects::None {
                let _ = write!(s, ", redirects not followed");
            }
            if !body_excerpt {
                let _ = write!(s, ", no body excerpt");
            }
            if let Some(status) = expect_status {
                let _ = write!(s, " expect status {status}");
            }
            for (name, pointer) in fields {
                let _ = write!(s, ", {name} at {pointer:?}");
                if let Some(want) = expect.get(name) {
                    let _ = write!(s, " = {want:?}");
                }
            }
            s
        }
        ProbeConfig::HealthFile { path, max_age } => format!(
            "health file {} at most {} old",
            path.display(),
            humantime::format_duration(*max_age)
        ),
    }
}
