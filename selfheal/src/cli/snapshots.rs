//! `selfheal snapshots list|show`: reads the forensic snapshot log written
//! before every healing step. Owns the listing table, the `--since` syntax
//! and the output formats; the log itself is [`selfheal::snapshots`].

use std::{
    fmt::Write as _,
    io::Write as _,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use super::{Error, Finished};
use anyhow::Context as _;
use selfheal::snapshots::{self, SnapshotLog, SnapshotMeta};
use selfheal_core::text::{escape, escape_json};

/// List and show forensic snapshots (the evidence recorded before each
/// healing step).
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// List snapshots, oldest first: id, time, agent, verdict.
    List(ListArgs),
    /// Show one snapshot in full (pretty JSON; --json for one line).
    Show(ShowArgs),
}

#[derive(clap::Args)]
struct ListArgs {
    /// Only this agent's snapshots.
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    /// Only snapshots this recent: a duration (`90s`, `1h`, `2d`) or an
    /// RFC 3339 time (`2026-11-29T23:00:00Z`).
    #[arg(long, value_name = "WHEN", value_parser = parse_since)]
    since: Option<u64>,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct ShowArgs {
    /// The snapshot id (as `list` prints it).
    id: String,
    #[command(flatten)]
    common: Common,
}

#[derive(clap::Args)]
struct Common {
    /// The snapshot directory. Default: /var/log/selfheal as root, else
    /// $XDG_STATE_HOME/selfheal (or ~/.local/state/selfheal).
    #[arg(long, value_name = "PATH")]
    dir: Option<PathBuf>,
    /// Rotated files to read besides the current one.
    #[arg(long, value_name = "N", default_value_t = snapshots::DEFAULT_KEEP)]
    keep: usize,
    /// Machine output: `list` prints one JSON object per line, `show` the
    /// record on one line.
    #[arg(long)]
    json: bool,
}

impl Common {
    fn log(&self) -> SnapshotLog {
        let dir = self
            .dir
            .clone()
            .unwrap_or_else(snapshots::default_snapshot_dir);
        SnapshotLog::open_read(&dir, self.keep)
    }
}

/// `--since`: a duration back from now, or an RFC 3339 time; as Unix ms.
fn parse_since(s: &str) -> Result<u64, String> {
    let at = match humantime::parse_duration(s) {
        Ok(ago) => SystemTime::now()
            .checked_sub(ago)
            .unwrap_or(SystemTime::UNIX_EPOCH),
        Err(_) => humantime::parse_rfc3339_weak(s).map_err(|_| {
            format!("bad time {s:?}: give a duration (90s, 1h, 2d) or an RFC 3339 time (2026-11-29T23:00:00Z)")
        })?,
    };
    Ok(at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis()
        .try_into()
        .unwrap_or(u64::MAX))
}

pub fn run(args: Args) -> Result<Finished, Error> {
    match args.command {
        Command::List(args) => list(args),
        Command::Show(args) => show(args),
    }
}

fn list(args: ListArgs) -> Result<Finished, Error> {
    let log = args.common.log();
    let listing = log
        .list(args.agent.as_deref(), args.since)
        .context("cannot list snapshots")?;
    // Notes in the log stream (escaped there), not errors.
    if listing.skipped > 0 {
        tracing::warn!(
            "skipped {} malformed line{} in {}",
            listing.skipped,
            if listing.skipped == 1 { "" } else { "s" },
            log.dir().display()
        );
    }
    let out = if args.common.json {
        let mut out = String::new();
        for m in &listing.entries {
            out.push_str(&escape_json(
                &serde_json::to_string(m).context("cannot format a snapshot")?,
            ));
            out.push('\n');
        }
        out
    } else {
        if listing.entries.is_empty() {
            tracing::info!("no snapshots in {}", log.dir().display());
        }
        table(&listing.entries)
    };
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .context("cannot write the list")?;
    Ok(Finished::Done)
}

/// Aligned columns; nothing at all for no entries.
fn table(entries: &[SnapshotMeta]) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|m| [&m.id, &m.time, &m.agent, &m.verdict].map(|s| printable(s)))
        .collect();
    let header = ["ID", "TIME", "AGENT", "VERDICT"].map(String::from);
    let mut width = [0usize; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = width[0],
            w1 = width[1],
            w2 = width[2],
        );
    }
    out
}

/// A field from the file, safe for a terminal (control characters
/// escaped).
fn printable(s: &str) -> String {
    escape(s)
}

fn show(args: ShowArgs) -> Result<Finished, Error> {
    let log = args.common.log();
    let Some(record) = log
        .show(&args.id)
        .with_context(|| format!("cannot read snapshot {}", args.id))?
    else {
        return Err(Error::NoSuchSnapshot {
            id: args.id,
            dir: shown_dir(log.dir()),
        });
    };
    let text = if args.common.json {
        serde_json::to_string(&record)
    } else {
        serde_json::to_string_pretty(&record)
    }
    .context("cannot format the snapshot")?;
    // Still JSON, with DEL and C1 controls as \u escapes too.
    let mut text = escape_json(&text);
    text.push('\n');
    std::io::stdout()
        .lock()
        .write_all(text.as_bytes())
        .context("cannot write the snapshot")?;
    Ok(Finished::Done)
}

/// `dir` as an error names it (escaped by `main`, with the rest).
fn shown_dir(dir: &Path) -> String {
    let shown = dir.display().to_string();
    if dir.exists() {
        shown
    } else {
        format!("{shown} (no such directory)")
    }
}
