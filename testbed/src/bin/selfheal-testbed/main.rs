//! `selfheal-testbed`: the incident testbed's programs (dispatch server,
//! provider, runner, proxy: [`selfheal_testbed`]) and the demo that
//! narrates them. A binary of the testbed, not of the product: `selfheal`
//! runs as root in the helper and carries no test servers. The demo still
//! drives the real `selfheal` binary (helper, check, snapshots) as a user
//! would.

mod demo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The incident testbed: the 2026-07-23 outage replayed with real programs
/// in network namespaces, for `cargo xtask demo` and the tests.
#[derive(Parser)]
#[command(name = "selfheal-testbed", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Demo(demo::Args),
    #[command(flatten)]
    Role(selfheal_testbed::Role),
}

/// Exit code for usage errors (as `selfheal`'s).
const EXIT_USAGE: u8 = 3;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Role(role) => selfheal_testbed::run(role).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!(
                "selfheal-testbed: {}",
                selfheal_core::text::escape_lines(&format!("{e:#}"))
            );
            ExitCode::from(1)
        }
    }
}

/// Parses a duration like `500ms`, `2s`, `5m`.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("bad duration {s:?}: {e} (examples: 500ms, 2s, 5m)"))
}
