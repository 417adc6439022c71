//! How a subcommand ends. Every subcommand returns `Result<Finished,
//! Error>` and prints no error itself; `main` alone turns the result into
//! the exit code and, for an error, one line on stderr ([`report`]).
//!
//! The exit codes (the design's contract, [`EXIT_CODES`]; `--help` shows
//! that table, and a test checks README says the same):
//!
//! - 0: done; `check`/`watch`: every agent healthy, idle or busy.
//! - 1: something failed (no such process or snapshot, a file that cannot
//!   be read or written, a refusal); `check`/`watch`: something degraded or
//!   healed, or a snapshot or the metrics file not written.
//! - 2: `check`/`watch`: something wedged, unresponsive or down, not healed.
//! - 3: usage or config error (the command line, the config, the helper's
//!   policy).
//!
//! A check's 1 or 2 is a result, not an error: [`Finished::Status`].

use std::path::PathBuf;

use selfheal::helper::ServerError;
use selfheal_core::{access::policy::PolicyError, config::ConfigError};

/// Done.
pub const EXIT_OK: u8 = 0;
/// Something failed (an [`Error`] that is not a usage or config error).
pub const EXIT_FAILED: u8 = 1;
/// `check`/`watch`: something wedged, unresponsive or down and not healed
/// (from [`selfheal_core::outcome::render::exit_code`]).
pub const EXIT_WEDGED: u8 = 2;
/// Usage or config error.
pub const EXIT_USAGE: u8 = 3;

/// Every exit code and what it means: `selfheal --help` prints this table;
/// README's is checked against it.
pub const EXIT_CODES: [(u8, &str); 4] = [
    (
        EXIT_OK,
        "done; check/watch: every agent healthy, idle or busy",
    ),
    (
        EXIT_FAILED,
        "failed (e.g. no such process); check/watch: something degraded or healed, or a \
         snapshot or the metrics file not written; scan: something suspect, connecting or \
         peer-closed",
    ),
    (
        EXIT_WEDGED,
        "check/watch: something wedged, unresponsive or down and not healed; scan --prove: \
         a connection proven dead",
    ),
    (
        EXIT_USAGE,
        "usage or config error (the config's errors name the file, line and key)",
    ),
];

/// [`EXIT_CODES`] as the text `--help` ends with.
pub fn exit_codes_help() -> String {
    let mut s = String::from("Exit codes:");
    for (code, what) in EXIT_CODES {
        s.push_str(&format!("\n  {code}  {what}"));
    }
    s
}

/// A subcommand that ran to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// Nothing to report beyond its output: exit 0.
    Done,
    /// It reports a status as its exit code: `check`/`watch` the worst
    /// verdict's ([`selfheal_core::outcome::render::exit_code`]: 0, 1 or 2), the demo
    /// whether its scenario went as told (0 or 1).
    Status(u8),
}

impl From<std::process::ExitCode> for Finished {
    /// A subcommand that still makes its own `ExitCode` (the demo): 0 is
    /// [`Finished::Done`], anything else a failed status (1).
    fn from(code: std::process::ExitCode) -> Finished {
        if code == std::process::ExitCode::SUCCESS {
            Finished::Done
        } else {
            Finished::Status(EXIT_FAILED)
        }
    }
}

/// Why a subcommand failed. The variant says what kind of failure it is
/// and so the exit code ([`Error::exit_code`]); the text is what `main`
/// prints after `selfheal: ` (escaped, URLs redacted).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line does not parse (clap's message, without its
    /// `error: ` and with its usage hint), or a subcommand's `--help` was
    /// asked for on stderr (a missing subcommand).
    #[error("{}", clap_text(.0))]
    Cli(clap::Error),
    /// The config cannot be located, read, trusted or parsed.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An agent name given on the command line is not in the config.
    #[error("no agent named {name:?} in {}; configured: {}", .path.display(), .configured.join(", "))]
    NoSuchAgent {
        name: String,
        path: PathBuf,
        configured: Vec<String>,
    },
    /// An `[auto]` agent's name that names no labelled container or
    /// `[auto]` unit found on this host now.
    #[error(
        "no [auto] agent named {name:?} on this host now (see {}); found: {}",
        .path.display(),
        if .found.is_empty() { "none".to_string() } else { .found.join(", ") }
    )]
    NoSuchAutoAgent {
        name: String,
        path: PathBuf,
        found: Vec<String>,
    },
    /// `selfheal helper` as a user other than root on the system socket.
    #[error(
        "refusing to run the helper as uid {euid} on the system socket {socket}: only root may \
         serve it (and only root can load eBPF and act on other users' processes). To run a \
         helper for your own processes, give --socket PATH."
    )]
    HelperNotRoot { euid: u32, socket: &'static str },
    /// The helper's policy file cannot be read, trusted or parsed.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The helper could not serve (its socket, socket activation, a thread).
    #[error(transparent)]
    Serve(#[from] ServerError),
    /// `watch --metrics-addr` with neither a token nor `--metrics-public`.
    #[error(
        "refusing to serve /metrics on {addr} with no token: every local user (and every host \
         that can reach the address) would read agent names, verdicts and reasons, which the \
         metrics file keeps to its owner and group. Give --metrics-token-file PATH (a file \
         only its owner and group may read; Prometheus sends it with `authorization: \
         {{type: Bearer, credentials_file: ...}}`), or --metrics-public to serve them to \
         anyone who can connect"
    )]
    MetricsUnprotected { addr: std::net::SocketAddr },
    /// `watch --metrics-token-file`: the token file is refused.
    #[error(transparent)]
    MetricsToken(#[from] selfheal::metrics_endpoint::TokenError),
    /// `inspect --pid`: no such process to inspect.
    #[error("pid {pid}: {problem}")]
    NoSuchProcess { pid: u32, problem: String },
    /// `snapshots show`: no snapshot with that id (`dir` as shown).
    #[error("no snapshot {id:?} in {dir}")]
    NoSuchSnapshot { id: String, dir: String },
    /// Anything else that failed: I/O, a refusal; the message is the whole
    /// context chain.
    #[error("{0:#}")]
    Failed(#[from] anyhow::Error),
}

/// clap's message, its leading `error: ` left out (main puts `selfheal: `
/// there), and no trailing line end.
fn clap_text(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    text.trim_end().to_string()
}

impl Error {
    /// The exit code: [`EXIT_USAGE`] for what the command line, the config
    /// or the policy got wrong, else [`EXIT_FAILED`].
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Cli(_)
            | Error::Config(_)
            | Error::NoSuchAgent { .. }
            | Error::NoSuchAutoAgent { .. }
            | Error::HelperNotRoot { .. }
            | Error::Policy(_)
            | Error::MetricsUnprotected { .. }
            | Error::MetricsToken(_) => EXIT_USAGE,
            Error::Serve(_)
            | Error::NoSuchProcess { .. }
            | Error::NoSuchSnapshot { .. }
            | Error::Failed(_) => EXIT_FAILED,
        }
    }

    /// A closed stdout (`selfheal inspect … | head`): not an error, and
    /// nothing is said.
    fn is_broken_pipe(&self) -> bool {
        let Error::Failed(e) = self else {
            return false;
        };
        e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        })
    }
}

/// What `main` does with a subcommand's result: the exit code, and the
/// text to print on stderr (none for a success or a closed stdout).
/// Every error is said the same way: `selfheal: MESSAGE`, URLs redacted
/// and control characters escaped ([`selfheal_core::text`]), on one line; only
/// a command-line error adds clap's usage hint on the lines after it.
pub fn report(result: &Result<Finished, Error>) -> (u8, Option<String>) {
    match result {
        Ok(Finished::Done) => (EXIT_OK, None),
        Ok(Finished::Status(code)) => (*code, None),
        Err(e) if e.is_broken_pipe() => (EXIT_OK, None),
        Err(e) => {
            let text = selfheal_core::text::redact_urls_in(&e.to_string());
            let text = match e {
                // clap's hint lines ("Usage: …", "For more information …")
                // stay lines; its help text (a missing subcommand) is shown
                // as clap wrote it.
                Error::Cli(c) => {
                    let escaped = selfheal_core::text::escape_lines(&text);
                    if c.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                    {
                        escaped
                    } else {
                        format!("selfheal: {escaped}")
                    }
                }
                _ => format!("selfheal: {}", selfheal_core::text::escape(&text)),
            };
            (e.exit_code(), Some(text))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli_error(args: &[&str]) -> clap::Error {
        #[derive(clap::Parser, Debug)]
        struct Cli {
            #[arg(long)]
            pid: u32,
        }
        <Cli as clap::Parser>::try_parse_from(args).unwrap_err()
    }

    /// Every variant, its exit code and the line `main` prints.
    #[test]
    fn every_variant_maps_to_its_documented_code_and_one_line() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let cases: Vec<(Error, u8, &str)> = vec![
            (
                Error::Cli(cli_error(&["x", "--pid", "nope"])),
                3,
                "selfheal: invalid value 'nope' for '--pid <PID>'",
            ),
            (
                Error::Config(ConfigError::Invalid {
                    path: "/c.toml".into(),
                    line: 6,
                    column: 1,
                    message: "key `adr`: unknown key".into(),
                }),
                3,
                "selfheal: /c.toml:6: key `adr`: unknown key",
            ),
            (
                Error::Config(ConfigError::NotFound {
                    tried: vec!["/a".into(), "/b".into()],
                }),
                3,
                "selfheal: no config file: tried /a, /b",
            ),
            (
                Error::NoSuchAgent {
                    name: "luna".into(),
                    path: "/c.toml".into(),
                    configured: vec!["sol".into(), "terra".into()],
                },
                3,
                "selfheal: no agent named \"luna\" in /c.toml; configured: sol, terra",
            ),
            (
                Error::NoSuchAutoAgent {
                    name: "auto.docker.web.0123456789ab".into(),
                    path: "/c.toml".into(),
                    found: vec!["auto.unit.runner.service".into()],
                },
                3,
                "selfheal: no [auto] agent named \"auto.docker.web.0123456789ab\" on this host now \
                 (see /c.toml); found: auto.unit.runner.service",
            ),
            (
                Error::NoSuchAutoAgent {
                    name: "auto.unit.x".into(),
                    path: "/c.toml".into(),
                    found: Vec::new(),
                },
                3,
                "selfheal: no [auto] agent named \"auto.unit.x\" on this host now (see /c.toml); \
                 found: none",
            ),
            (
                Error::HelperNotRoot {
                    euid: 1000,
                    socket: "/run/selfheal/helper.sock",
                },
                3,
                "selfheal: refusing to run the helper as uid 1000 on the system socket",
            ),
            (
                Error::Policy(PolicyError::Untrusted {
                    path: "/p.toml".into(),
                    reason: "mode 0666".into(),
                }),
                3,
                "selfheal: refusing policy /p.toml: mode 0666",
            ),
            (
                Error::Serve(ServerError::AlreadyRunning {
                    path: "/s.sock".into(),
                }),
                1,
                "selfheal: another helper already listens on /s.sock",
            ),
            (
                Error::NoSuchProcess {
                    pid: 4194303,
                    problem: "pid 4194303 is not running".into(),
                },
                1,
                "selfheal: pid 4194303: pid 4194303 is not running",
            ),
            (
                Error::NoSuchSnapshot {
                    id: "x".into(),
                    dir: "/snaps".into(),
                },
                1,
                "selfheal: no snapshot \"x\" in /snaps",
            ),
            (
                Error::Failed(anyhow::Error::new(io()).context("cannot write /u")),
                1,
                "selfheal: cannot write /u: entity not found",
            ),
        ];
        for (e, code, starts) in cases {
            assert_eq!(e.exit_code(), code, "{e:?}");
            let (got, line) = report(&Err(e));
            assert_eq!(got, code);
            let line = line.expect("an error is said");
            assert!(line.starts_with(starts), "{line:?} should start {starts:?}");
            if !starts.contains("--pid") {
                assert_eq!(line.lines().count(), 1, "{line:?}");
            }
        }
    }

    #[test]
    fn results_are_exit_codes_and_say_nothing() {
        assert_eq!(report(&Ok(Finished::Done)), (0, None));
        for code in [0, 1, 2] {
            assert_eq!(report(&Ok(Finished::Status(code))), (code, None));
        }
        let broken = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("cannot write the report");
        assert_eq!(report(&Err(Error::Failed(broken))), (0, None));
        assert_eq!(
            Finished::from(std::process::ExitCode::SUCCESS),
            Finished::Done
        );
        assert_eq!(
            Finished::from(std::process::ExitCode::from(1)),
            Finished::Status(1)
        );
    }

    /// Control characters never reach the terminal, a message's newline
    /// included (one error, one line), and a URL's secrets are redacted.
    #[test]
    fn the_line_is_escaped_and_redacted() {
        let e = Error::Failed(anyhow::anyhow!(
            "bad \u{1b}[31mname\rand\nmore at http://h/x?token=s3cret"
        ));
        let (_, line) = report(&Err(e));
        let line = line.unwrap();
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(line.contains("\\u{1b}[31mname\\rand\\nmore"), "{line:?}");
        assert!(!line.contains("s3cret"), "{line:?}");

        let (code, line) = report(&Err(Error::Cli(cli_error(&["x", "--pid", "1\r\u{7}X"]))));
        assert_eq!(code, 3);
        let line = line.unwrap();
        assert!(
            !line.chars().any(|c| c.is_control() && c != '\n'),
            "{line:?}"
        );
        assert!(
            line.starts_with("selfheal: invalid value '1\\r"),
            "{line:?}"
        );
    }

    /// ARCHITECTURE.md's invariant: only `main` says an error or makes an
    /// exit code; a subcommand returns an [`Error`].
    #[test]
    fn no_subcommand_prints_an_error_or_makes_an_exit_code() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files: Vec<_> = std::fs::read_dir(src.join("cli"))
            .unwrap()
            .map(|e| e.unwrap().path())
            // error.rs is this module; demo.rs leaves with the testbed.
            .filter(|p| !p.ends_with("error.rs") && !p.ends_with("demo.rs"))
            .collect();
        files.sort();
        assert!(files.len() >= 7, "{files:?}");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            for banned in [
                "eprintln!",
                "eprint!",
                "ExitCode",
                "process::exit",
                "std::process::abort",
            ] {
                assert!(
                    !text.contains(banned),
                    "{} uses {banned}: return a cli::Error instead",
                    path.display()
                );
            }
        }
        let main = std::fs::read_to_string(src.join("main.rs")).unwrap();
        assert_eq!(
            main.matches("eprintln!").count(),
            1,
            "main says errors in one place"
        );
        assert!(!main.contains("process::exit"));
    }

    /// The table `--help` prints is the documented one.
    #[test]
    fn help_lists_every_code_and_readme_says_the_same() {
        let help = exit_codes_help();
        for code in [EXIT_OK, EXIT_FAILED, EXIT_WEDGED, EXIT_USAGE] {
            assert!(help.contains(&format!("\n  {code}  ")), "{help}");
        }
        let readme = include_str!("../../../README.md");
        assert!(
            readme.contains(&help),
            "README.md must hold `selfheal --help`'s exit-code table verbatim:\n{help}"
        );
    }
}
