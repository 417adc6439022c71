//! The `selfheal` command. Each subcommand lives in its own file under
//! `cli/` and returns `Result<cli::Finished, cli::Error>`, printing no
//! error; `main` alone maps that to the exit code and says the error, once
//! (`cli::error::report`).

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cli::{Error, Finished};

/// Finds wedged AI-agent processes from outside, proves the wedge with kernel
/// evidence, and heals them with the gentlest action that works.
#[derive(Parser)]
#[command(name = "selfheal", version, after_help = cli::error::exit_codes_help())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Scan(cli::scan::Args),
    Check(cli::check::CheckArgs),
    Watch(cli::check::WatchArgs),
    Inspect(cli::inspect::Args),
    Config(cli::config::Args),
    Snapshots(cli::snapshots::Args),
    Install(cli::install::Args),
    Helper(cli::helper::Args),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version: on stdout, exit 0.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return exit(Err(Error::Cli(e))),
    };
    // The log stream: transitions, snapshots, problems; on stderr, so that
    // stdout stays the report. RUST_LOG overrides the level.
    // Every log line passes through `text::redact_urls_in` and
    // `text::escape_lines` on its way out (`EscapedStderr`): a name or a body in a message cannot drive the
    // terminal. So no colours either: they are escape sequences too.
    // `scan` prints nothing but its answer unless logs are asked for;
    // `inspect`, a person's command too, only its warnings beside it.
    let default_level = match cli.command {
        Command::Scan(_) => "off",
        Command::Inspect(_) => "warn",
        _ => "info",
    };
    tracing_subscriber::fmt()
        .with_writer(|| EscapedStderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .init();
    let result: Result<Finished, Error> = match cli.command {
        Command::Scan(args) => cli::scan::run(args),
        Command::Check(args) => cli::check::check(args),
        Command::Watch(args) => cli::check::watch(args),
        Command::Inspect(args) => cli::inspect::run(args),
        Command::Config(args) => cli::config::run(args),
        Command::Snapshots(args) => cli::snapshots::run(args),
        Command::Install(args) => cli::install::run(args),
        Command::Helper(args) => cli::helper::run(
            args,
            std::sync::Arc::new(selfheal::helper::server::performer::ActionsPerformer::default()),
        ),
    };
    exit(result)
}

/// The one place a run's result becomes its exit code and its error is
/// said (`selfheal: …`, escaped, on stderr).
fn exit(result: Result<Finished, Error>) -> ExitCode {
    let (code, text) = cli::error::report(&result);
    if let Some(text) = text {
        eprintln!("{text}");
    }
    ExitCode::from(code)
}

/// Standard error, each write's text passed through
/// [`selfheal_core::text::redact_urls_in`] (a library's debug line may name a
/// probe URL with its token) and [`selfheal_core::text::escape_lines`] (the log
/// stream writes one event per `write`; its own line ends stay).
struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().lock().write_all(
            selfheal_core::text::escape_lines(&selfheal_core::text::redact_urls_in(&text))
                .as_bytes(),
        )?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
