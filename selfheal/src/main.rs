//! The `selfheal` command. `main` owns exit codes and prints the error chain;
//! each subcommand lives in its own file under `cli/`.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Finds wedged AI-agent processes from outside, proves the wedge with kernel
/// evidence, and heals them with the gentlest action that works.
#[derive(Parser)]
#[command(name = "selfheal", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Check(cli::check::CheckArgs),
    Watch(cli::check::WatchArgs),
    Inspect(cli::inspect::Args),
    Config(cli::config::Args),
    Snapshots(cli::snapshots::Args),
    Install(cli::install::Args),
    Helper(cli::helper::Args),
}

/// Exit code for usage and configuration errors.
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
    // The log stream: transitions, snapshots, problems; on stderr, so that
    // stdout stays the report. RUST_LOG overrides the level.
    // Every log line passes through `text::redact_urls_in` and
    // `text::escape_lines` on its way out (`EscapedStderr`): a name or a body in a message cannot drive the
    // terminal. So no colours either: they are escape sequences too.
    tracing_subscriber::fmt()
        .with_writer(|| EscapedStderr)
        .with_ansi(false)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match cli.command {
        Command::Check(args) => cli::check::check(args),
        Command::Watch(args) => cli::check::watch(args),
        Command::Inspect(args) => cli::inspect::run(args),
        Command::Config(args) => cli::config::run(args),
        Command::Snapshots(args) => cli::snapshots::run(args),
        Command::Install(args) => cli::install::run(args),
        Command::Helper(args) => cli::helper::run(
            args,
            std::sync::Arc::new(selfheal::healer::ActionsExecutor::default()),
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "selfheal: {}",
                selfheal::text::escape_lines(&selfheal::text::redact_urls_in(&format!("{e:#}")))
            );
            ExitCode::from(1)
        }
    }
}

/// Standard error, each write's text passed through
/// [`selfheal::text::redact_urls_in`] (a library's debug line may name a
/// probe URL with its token) and [`selfheal::text::escape_lines`] (the log
/// stream writes one event per `write`; its own line ends stay).
struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        std::io::stderr().lock().write_all(
            selfheal::text::escape_lines(&selfheal::text::redact_urls_in(&text)).as_bytes(),
        )?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// A closed stdout (`selfheal inspect … | head`) is not an error.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
