//! `selfheal scan`: with no config, every TCP connection on the host that
//! a thread waits on, that is still connecting, or whose peer has closed,
//! with a passive verdict, for a person (a table, most severe first) or a
//! script (`--json`: JSON Lines).

use std::{io::Write as _, time::Duration};

use super::{Error, Finished};
use anyhow::Context as _;
use selfheal_core::scan;

/// Census of every process on the host (root; else your own) waiting on a
/// TCP peer: each connection a thread waits on, or that is connecting or
/// peer-closed, with a verdict: suspect (no data either way for
/// --silent-for while a thread waits on it), connecting (SYN-SENT that
/// long), peer_closed (CLOSE-WAIT still held) or alive. Reads only; needs
/// no config. Exit 0 when nothing is suspect, connecting or peer-closed,
/// 1 when something is.
#[derive(clap::Args)]
pub struct Args {
    /// How long a waited-on connection may carry no data before it is
    /// suspect, and a connect may last before it is listed (e.g. 30s).
    #[arg(long, value_parser = super::parse_duration, default_value = "30s")]
    silent_for: Duration,
    /// Print one JSON object per finding, one per line, instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<Finished, Error> {
    let silent_for_ms = u64::try_from(args.silent_for.as_millis()).unwrap_or(u64::MAX);
    let read = selfheal::scan::scan(selfheal::sys::creds::euid());
    let findings = scan::census(&read.connections, silent_for_ms);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if args.json {
        for f in &findings {
            let line = serde_json::to_string(f).context("cannot write the census")?;
            // Still JSON, with DEL and C1 controls as \u escapes too.
            writeln!(out, "{}", selfheal_core::text::escape_json(&line))
                .context("cannot write the census")?;
        }
    } else {
        out.write_all(scan::render(&findings, &read.coverage, silent_for_ms).as_bytes())
            .context("cannot write the census")?;
    }
    out.flush().context("cannot write the census")?;
    Ok(match scan::exit_code(&findings) {
        0 => Finished::Done,
        code => Finished::Status(code),
    })
}
