//! `cargo xtask fuzz [--seconds N] [TARGET…]`: runs the cargo-fuzz targets
//! in `fuzz/` (each its own libFuzzer run on nightly, with AddressSanitizer
//! and debug assertions) for a bounded time, starting from the committed
//! seeds in `fuzz/corpus/<target>/`, and prints a table of what each did.
//! Fails when any target crashed (a panic, a sanitizer report, an input that
//! ran longer than [`INPUT_TIMEOUT_S`], or more memory than
//! [`RSS_LIMIT_MB`]), naming the input that did it.
//!
//! A target with a dictionary (`fuzz/dict/<target>.dict`: the tokens of its
//! input format and boundary numbers) runs with it.
//!
//! Inputs that once crashed a target (`fuzz/regressions/<target>/`) are
//! run first, every time, as part of its corpus.
//!
//! Inputs libFuzzer finds interesting are kept in
//! `fuzz/target/fuzz-corpus/<target>/` (so a later run goes on from them),
//! never added to the committed seeds; each run's whole libFuzzer output is
//! in `fuzz/target/fuzz-logs/<target>.log`; crashing inputs are in
//! `fuzz/artifacts/<target>/`.
//!
//! Installs cargo-fuzz when it is missing (idempotent, like `setup`); needs
//! the nightly toolchain `setup` relies on.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::run;

/// The cargo-fuzz installed when none is (builds with stable).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Memory a target may use before libFuzzer calls it a crash.
const RSS_LIMIT_MB: u32 = 2048;

/// Longest one input may take before libFuzzer calls it a hang.
const INPUT_TIMEOUT_S: u32 = 10;

const FUZZ_DIR: &str = "fuzz";

/// How the targets are built, for `build` and `run` alike (a difference
/// would rebuild them). By default cargo-fuzz's optimized build (debug
/// assertions, AddressSanitizer) with 16 codegen units instead of 1, as
/// cargo-fuzz suggests for faster builds; with `--dev`, unoptimized. Cold,
/// on this project's shared 2-core machine: 8.7 min with 1 codegen unit,
/// 7.3 min with 16, 4.0 min unoptimized — which then runs about 20 times
/// fewer inputs per second (`config`: 4,388 against 89,334 in 20 s).
fn build_flags(dev: bool) -> &'static [&'static str] {
    if dev {
        &["--dev"]
    } else {
        &["--codegen-units", "16"]
    }
}

#[derive(clap::Args, Debug)]
pub struct FuzzArgs {
    /// How long each target runs, in seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Build unoptimized: about half the cold build time, about a twentieth
    /// of the inputs per second. For CI's brief runs, where the build
    /// dominates; overflow checks and AddressSanitizer stay on.
    #[arg(long)]
    pub dev: bool,
    /// Targets to run (default: every target in fuzz/fuzz_targets/).
    pub targets: Vec<String>,
}

/// How one target's run ended.
struct Outcome {
    target: String,
    runs: Option<u64>,
    seconds: f64,
    result: String,
    /// The input that crashed it.
    artifact: Option<String>,
    log: PathBuf,
}

/// Runs the targets; the working directory is the workspace root.
pub fn fuzz(args: FuzzArgs) -> Result<()> {
    if args.seconds == 0 {
        bail!("--seconds must be at least 1");
    }
    let all = targets()?;
    let chosen = if args.targets.is_empty() {
        all
    } else {
        for t in &args.targets {
            if !all.contains(t) {
                bail!("no fuzz target {t:?}; the targets are {}", all.join(", "));
            }
        }
        args.targets.clone()
    };
    nightly()?;
    cargo_fuzz()?;

    // One build of every target up front: a compile error fails here, and the
    // runs below only link-check.
    eprintln!("fuzz: building the targets (nightly, AddressSanitizer)");
    let build_started = Instant::now();
    // The targets depend on selfheal-core only: no eBPF object to build.
    run(Command::new("cargo")
        .args(["+nightly", "fuzz", "build"])
        .args(build_flags(args.dev)))?;
    let build_seconds = build_started.elapsed().as_secs_f64();

    let work = Path::new(FUZZ_DIR).join("target");
    let mut outcomes = Vec::new();
    for target in &chosen {
        eprintln!("fuzz: {target} for {} s", args.seconds);
        let outcome = run_target(&work, target, args.seconds, args.dev)?;
        if outcome.result != "ok" {
            eprintln!("fuzz: {target} failed; from {}:", outcome.log.display());
            eprintln!("{}", report_of(&outcome.log));
        }
        outcomes.push(outcome);
    }

    print_table(&outcomes);
    let fuzzing: f64 = outcomes.iter().map(|o| o.seconds).sum();
    println!(
        "fuzz: {} targets; build {build_seconds:.0} s, runs {fuzzing:.0} s, total {:.0} s",
        outcomes.len(),
        build_seconds + fuzzing
    );
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.result != "ok").collect();
    if failed.is_empty() {
        return Ok(());
    }
    for o in &failed {
        match &o.artifact {
            Some(a) => eprintln!(
                "fuzz: {} {}: input {a}\n      reproduce: cargo +nightly fuzz run {} {a}",
                o.target, o.result, o.target
            ),
            None => eprintln!(
                "fuzz: {} {} (no input saved); see {}",
                o.target,
                o.result,
                o.log.display()
            ),
        }
    }
    bail!("{} of {} fuzz targets failed", failed.len(), outcomes.len())
}

/// The targets: `fuzz/fuzz_targets/*.rs`, sorted.
fn targets() -> Result<Vec<String>> {
    let dir = Path::new(FUZZ_DIR).join("fuzz_targets");
    let mut out: Vec<String> = fs::read_dir(&dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".rs")
                .map(str::to_string)
        })
        .collect();
    out.sort();
    if out.is_empty() {
        bail!("no fuzz targets in {}", dir.display());
    }
    Ok(out)
}

fn nightly() -> Result<()> {
    let ok = Command::new("rustc")
        .args(["+nightly", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        bail!("no nightly toolchain (`rustc +nightly` failed): cargo fuzz needs nightly");
    }
    Ok(())
}

/// Installs cargo-fuzz unless `cargo fuzz` already works.
fn cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        return Ok(());
    }
    eprintln!("fuzz: installing cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)");
    run(Command::new("cargo").args([
        "install",
        "cargo-fuzz",
        "--locked",
        "--version",
        CARGO_FUZZ_VERSION,
    ]))
}

/// One bounded libFuzzer run of `target`.
fn run_target(work: &Path, target: &str, seconds: u64, dev: bool) -> Result<Outcome> {
    // New inputs go to the first corpus directory: a scratch one, so the
    // committed seeds (read from the second) stay as they are.
    let scratch = work.join("fuzz-corpus").join(target);
    let seeds = Path::new(FUZZ_DIR).join("corpus").join(target);
    let regressions = Path::new(FUZZ_DIR).join("regressions").join(target);
    let logs = work.join("fuzz-logs");
    for d in [&scratch, &seeds, &logs] {
        fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    // Tokens the target's input format is made of, when it has a dictionary.
    let dict = Path::new(FUZZ_DIR)
        .join("dict")
        .join(format!("{target}.dict"));
    let log_path = logs.join(format!("{target}.log"));
    let log = fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let err = log.try_clone()?;
    let artifacts = Path::new(FUZZ_DIR).join("artifacts").join(target);
    fs::create_dir_all(&artifacts)
        .with_context(|| format!("cannot create {}", artifacts.display()))?;
    // The binary `cargo fuzz build` made, run directly: `cargo fuzz run`
    // would check the build again (twice) per target. Its environment and
    // artifact prefix are the ones `cargo fuzz run` gives.
    let binary = work
        .join(host_triple()?)
        .join(if dev { "debug" } else { "release" })
        .join(target);
    let mut prefix = artifacts.into_os_string();
    prefix.push("/");
    let started = Instant::now();
    let status = Command::new(&binary)
        .env("ASAN_OPTIONS", asan_options())
        .arg({
            let mut a = std::ffi::OsString::from("-artifact_prefix=");
            a.push(&prefix);
            a
        })
        .arg(&scratch)
        .arg(&seeds)
        .args(regressions.is_dir().then_some(&regressions))
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_S}"))
        .arg("-print_final_stats=1")
        .args(dict.is_file().then(|| format!("-dict={}", dict.display())))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .status()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&fs::read(&log_path)?).into_owned();
    let artifact = artifact_of(&text);
    let result = match (&artifact, status.success()) {
        (None, true) => "ok".to_string(),
        (Some(a), true) if kind_of(a) == "slow input" && clock_jumped(&text, seconds) => {
            // libFuzzer times units by the wall clock: a unit "slower" than
            // the whole run by the monotonic clock is a clock step (another
            // process set the time), not a slow input.
            "ok (slow unit reported: the wall clock jumped)".to_string()
        }
        (Some(a), _) => kind_of(a).to_string(),
        (None, false) => format!("error ({status})"),
    };
    Ok(Outcome {
        target: target.to_string(),
        runs: runs_of(&text),
        seconds,
        result,
        artifact,
        log: log_path,
    })
}

/// libFuzzer's count of inputs run: its final stats, else its `Done` line,
/// else the last status line (`#1234\t...`).
fn runs_of(log: &str) -> Option<u64> {
    let stat = log.lines().rev().find_map(|l| {
        l.strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
    });
    let done = || {
        log.lines().rev().find_map(|l| {
            l.strip_prefix("Done ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    };
    let status = || {
        log.lines().rev().find_map(|l| {
            l.strip_prefix('#')?
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
    };
    stat.or_else(done).or_else(status)
}

/// The host's target triple (`rustc -vV`), under which cargo-fuzz puts
/// its binaries.
fn host_triple() -> Result<String> {
    let out = Command::new("rustc")
        .args(["+nightly", "-vV"])
        .output()
        .context("cannot run rustc +nightly -vV")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(|h| h.trim().to_string())
        .context("rustc -vV names no host")
}

/// AddressSanitizer's options as `cargo fuzz run` sets them (the caller's
/// first).
fn asan_options() -> String {
    let mut opts = std::env::var("ASAN_OPTIONS").unwrap_or_default();
    if !opts.is_empty() {
        opts.push(':');
    }
    opts.push_str("detect_odr_violation=0");
    opts
}

/// Whether libFuzzer's slowest unit (`stat::slowest_unit_time_sec`, wall
/// clock) took longer than the whole run did by the monotonic clock.
fn clock_jumped(log: &str, run_seconds: f64) -> bool {
    log.lines()
        .rev()
        .find_map(|l| {
            l.strip_prefix("stat::slowest_unit_time_sec:")
                .and_then(|n| n.trim().parse::<f64>().ok())
        })
        .is_some_and(|slowest| slowest > run_seconds)
}

/// The input libFuzzer saved for a crash: `Test unit written to PATH`.
fn artifact_of(log: &str) -> Option<String> {
    log.lines().find_map(|l| {
        let (_, path) = l.split_once("Test unit written to ")?;
        Some(path.trim().to_string())
    })
}

/// What an artifact's name says happened (`crash-…`, `timeout-…`, `oom-…`,
/// `leak-…`).
fn kind_of(artifact: &str) -> &'static str {
    let name = Path::new(artifact)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    for kind in ["crash", "timeout", "oom", "leak", "slow-unit"] {
        if name.starts_with(kind) {
            return match kind {
                "crash" => "crash",
                "timeout" => "timeout",
                "oom" => "out of memory",
                "leak" => "leak",
                _ => "slow input",
            };
        }
    }
    "failed"
}

/// What a failed run's log says went wrong: from the first panic or
/// sanitizer/libFuzzer error on (at most [`REPORT_LINES`] lines), else its
/// last lines.
fn report_of(path: &Path) -> String {
    let text = fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| {
            l.contains("panicked at")
                || l.contains("ERROR: AddressSanitizer")
                || l.contains("ERROR: LeakSanitizer")
                || l.contains("ERROR: libFuzzer")
                || l.contains("ALARM: working on the last Unit")
        })
        .unwrap_or(lines.len().saturating_sub(REPORT_LINES));
    // A panic's backtrace goes on into libFuzzer: stop at the target.
    let end = lines[start..]
        .iter()
        .position(|l| l.contains("rust_fuzzer_test_input"))
        .map_or(lines.len(), |i| start + i);
    let mut out: Vec<&str> = lines[start..end]
        .iter()
        .take(REPORT_LINES)
        .copied()
        .collect();
    if let Some(saved) = lines.iter().find(|l| l.contains("Test unit written to "))
        && !out.contains(saved)
    {
        out.push("...");
        out.push(saved);
    }
    out.join("\n")
}

/// Lines of a failed run's log shown.
const REPORT_LINES: usize = 40;

fn print_table(outcomes: &[Outcome]) {
    let width = outcomes
        .iter()
        .map(|o| o.target.len())
        .max()
        .unwrap_or(0)
        .max("target".len());
    println!(
        "{:<width$}  {:>12}  {:>8}  result",
        "target", "runs", "seconds"
    );
    for o in outcomes {
        let runs = o.runs.map_or("?".to_string(), |r| r.to_string());
        let result = match &o.artifact {
            Some(a) => format!("{} ({a})", o.result),
            None => o.result.clone(),
        };
        println!(
            "{:<width$}  {runs:>12}  {:>8.1}  {result}",
            o.target, o.seconds
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libfuzzer_output() {
        let done = "#2\tINITED cov: 10 ft: 10 corp: 1/1b exec/s: 0 rss: 30Mb\n\
                    #524288\tpulse  cov: 10 ft: 10 corp: 1/1b\n\
                    Done 612345 runs in 31 second(s)\n\
                    stat::number_of_executed_units: 612345\n";
        assert_eq!(runs_of(done), Some(612345));
        assert_eq!(artifact_of(done), None);
        let crash = "#1000\tNEW    cov: 20 ft: 30 corp: 3/9b\n\
                     thread '<unnamed>' panicked at src/x.rs:1:1:\n\
                     ==1234== ERROR: libFuzzer: deadly signal\n\
                     artifact_prefix='/w/fuzz/artifacts/config/'; Test unit written to /w/fuzz/artifacts/config/crash-abc\n";
        assert_eq!(runs_of(crash), Some(1000));
        let a = artifact_of(crash).unwrap();
        assert_eq!(a, "/w/fuzz/artifacts/config/crash-abc");
        assert_eq!(kind_of(&a), "crash");
        assert_eq!(kind_of("fuzz/artifacts/x/timeout-1"), "timeout");
        assert_eq!(runs_of("nothing"), None);
    }

    #[test]
    fn a_slow_unit_longer_than_the_run_is_a_clock_jump() {
        let log = "Done 167035 runs in 10817 second(s)\n\
                   stat::slowest_unit_time_sec:    10800\n";
        assert!(clock_jumped(log, 18.6), "3 h in an 18.6 s run");
        assert!(!clock_jumped("stat::slowest_unit_time_sec: 12\n", 30.0));
        assert!(!clock_jumped("no stats", 30.0));
    }
}
