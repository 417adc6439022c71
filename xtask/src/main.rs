//! Project tasks, run as `cargo xtask <task>`. Owns the machine set-up that
//! the README's two commands rely on (`setup`), and the entry points for the
//! demo, the full test run, the VM kernel test, fuzzing, the benchmarks and
//! the soak.
//!
//! Every set-up step is idempotent: it checks before it installs.

mod fuzz;
mod image;
mod package;
mod setup;
mod skips;
mod vm;

use std::process::Command;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "selfheal project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need (idempotent): Debian packages,
    /// nightly rust-src, bpf-linker linked to nightly's libLLVM, tracefs.
    Setup,
    /// Set up, build, and run the demo (the incident replayed in network
    /// namespaces, then an asyncio agent's call cut while its provider
    /// thinks, narrated: `selfheal-testbed demo`, driving the real
    /// `selfheal` binary's helper and checks); arguments after `--` go to
    /// it, e.g. `-- --json`.
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then run every test, with the eBPF object required.
    Test {
        /// Skip the VM kernel test (kprobe/fentry strategies on Debian's 6.1,
        /// the procfs fallback on a kernel without BTF): its tests are listed
        /// as dropped.
        #[arg(long)]
        no_vm: bool,
        /// CI's run (`.ci/run`): sets `SELFHEAL_CI=1`, under which a test
        /// that skips for what CI's machine has (root, the kernel, a tool
        /// the set-up installs) fails, and so does this run.
        #[arg(long)]
        ci: bool,
    },
    /// Build the Debian package (`target/debian/selfheal_VERSION_ARCH.deb`):
    /// the binary with its eBPF object embedded, the systemd units, a
    /// commented /etc/selfheal/config.toml (a conffile), the docs, and
    /// scripts that enable the helper socket on install and stop it on
    /// removal. Install it with `apt install ./target/debian/selfheal_*.deb`.
    Package(package::BuildArgs),
    /// Build the DaemonSet's container image locally, pushed nowhere
    /// (`target/image/selfheal_VERSION_ARCH.oci.tar`, image
    /// `selfheal:VERSION`, entrypoint `/usr/bin/selfheal`): the binary, the
    /// libraries it links and a commented config, as a tarball that
    /// `docker load -i` accepts (docker-archive and OCI layout in one).
    Image(package::BuildArgs),
    /// Boot Debian's stock kernel under qemu (TCG) and run the eBPF
    /// integration tests there, once per attach strategy it should support.
    VmTest(vm::VmArgs),
    /// Fuzz the parsers of outside input (cargo-fuzz on nightly; installs
    /// cargo-fuzz if missing). Fails on any crash, naming the input.
    Fuzz(fuzz::FuzzArgs),
    /// Run the benchmarks (needs root): the tracer's receive-path overhead
    /// (`recv-bench`; arguments after `--` go to it, e.g.
    /// `-- --bytes 268435456 --rounds 3`) and `inspect` of a big agent
    /// against `ps` + `ss` (`inspect-bench`), `check` over 100 agents
    /// against `ps -eLo` + `ss -tinp`, a C floor (each thread's stat and
    /// wchan, one sock_diag dump), a curl loop and the progress evidence
    /// on against off (talking, idle, calls in flight) (`check-bench`), and
    /// how `check` grows with 1k-10k sockets and 200-2000 threads, and the
    /// prove stage's added cost on 1,000 suspect sockets (`scale-bench`),
    /// and one pass of the kernel's task iterator against each thread's
    /// procfs reads (`iter-bench`).
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Soak (needs root): `selfheal watch` healing through `selfheal helper`
    /// while agents start, wedge (half-open connections in network
    /// namespaces), heal and exit; fails on RSS growth of 1 MiB or more
    /// after warm-up, fd growth, or a lost snapshot. Prints a summary table.
    /// With `--fleet`: real SDK agents calling a TLS provider whose every
    /// call's fate is random (quick, thinking, pings then the answer, slow
    /// content, cut, stalled behind pings); fails on a false heal, a cut or
    /// stall not failed within its bound, an agent's pid lost, or the same
    /// growth.
    Soak {
        /// How long to churn, in seconds.
        #[arg(long, default_value_t = 600)]
        seconds: u64,
        /// The fleet soak of SDK calls instead of the churn.
        #[arg(long)]
        fleet: bool,
        /// More arguments for the `soak` program (`--slots N`,
        /// `--interval-ms MS`, `--warmup SECONDS`; with `--fleet`,
        /// `--per-sdk N`, `--seed S`, `--stall-after-ms MS`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // Paths below are relative to the workspace root, wherever we were started.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask lives inside the workspace")?;
    std::env::set_current_dir(root).with_context(|| format!("cannot enter {}", root.display()))?;
    match cli.task {
        Task::Setup => setup::all(),
        Task::Demo { args } => {
            setup::all()?;
            // The product binary, and the testbed's (its own crate: the
            // privileged `selfheal` carries no test servers).
            cargo_env(
                &[
                    "build",
                    "--release",
                    "-p",
                    "selfheal",
                    "--bin",
                    "selfheal",
                    "-p",
                    "selfheal-testbed",
                    "--bin",
                    "selfheal-testbed",
                ],
                &[("SELFHEAL_REQUIRE_EBPF", "1")],
            )?;
            run(Command::new("target/release/selfheal-testbed")
                .arg("demo")
                .args(args)
                .env("SELFHEAL_BIN", "target/release/selfheal"))
        }
        Task::Test { no_vm, ci } => {
            setup::all()?;
            let ci = ci || std::env::var("SELFHEAL_CI").as_deref() == Ok("1");
            let ebpf_required = [("SELFHEAL_REQUIRE_EBPF", "1")];
            cargo_env(
                &[
                    "clippy",
                    "--workspace",
                    "--exclude",
                    "selfheal-ebpf",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ],
                &ebpf_required,
            )?;
            // The fuzz targets build their own fixtures of the core's
            // types: a field they miss must fail here, not after the suite.
            cargo_env(
                &[
                    "clippy",
                    "--manifest-path",
                    "fuzz/Cargo.toml",
                    "--bins",
                    "--",
                    "-D",
                    "warnings",
                ],
                &[],
            )?;
            // The library's docs: a link to a function that no longer
            // exists is a warning, and warnings fail.
            cargo_env(
                &["doc", "-p", "selfheal", "-p", "selfheal-core", "--no-deps"],
                &[
                    ("SELFHEAL_REQUIRE_EBPF", "1"),
                    ("RUSTDOCFLAGS", "-D warnings"),
                ],
            )?;
            // The whole workspace's tests, with the eBPF object required:
            // a missing toolchain must fail here, not skip.
            let _ = std::fs::remove_dir_all(SCENARIO_REPORTS);
            let _ = std::fs::remove_dir_all(SKIPS);
            let tested = cargo_env(
                &["test", "--workspace", "--exclude", "selfheal-ebpf"],
                &[
                    ("SELFHEAL_REQUIRE_EBPF", "1"),
                    ("SELFHEAL_CI", if ci { "1" } else { "0" }),
                ],
            );
            let skips = skips::read(std::path::Path::new(SKIPS));
            skips::print(&skips, no_vm);
            tested?;
            print_scenarios();
            skips::judge(&skips, ci, no_vm)?;
            if no_vm {
                eprintln!(
                    "xtask: --no-vm given: the kprobe/fentry strategies were not tested on a stock kernel"
                );
                Ok(())
            } else {
                vm::vm_test(vm::VmArgs::default())
            }
        }
        Task::Fuzz(args) => {
            setup::all()?;
            fuzz::fuzz(args)
        }
        Task::Package(args) => package::package(&args).map(|_| ()),
        Task::Image(args) => image::image(&args).map(|_| ()),
        Task::VmTest(args) => {
            setup::all()?;
            vm::vm_test(args)
        }
        Task::Soak {
            seconds,
            fleet,
            args,
        } => {
            setup::all()?;
            build_release()?;
            run(Command::new("target/release/soak")
                .arg("--seconds")
                .arg(seconds.to_string())
                .args(fleet.then_some("--fleet"))
                .args(args)
                .env("SELFHEAL_BIN", "target/release/selfheal"))
        }
        Task::Bench { args } => {
            setup::all()?;
            build_release()?;
            run(Command::new("target/release/recv-bench").args(args))?;
            for bench in ["inspect-bench", "check-bench", "scale-bench", "iter-bench"] {
                run(Command::new(format!("target/release/{bench}"))
                    .env("SELFHEAL_BIN", "target/release/selfheal"))?;
            }
            Ok(())
        }
    }
}

/// The release build the benchmarks and the soak run: selfheal (with its
/// eBPF object required) and every helper program.
fn build_release() -> Result<()> {
    cargo_env(
        &[
            "build",
            "--release",
            "-p",
            "selfheal",
            "-p",
            "selfheal-testbed",
            "-p",
            "tests",
            "-p",
            "bench",
            "--bins",
        ],
        &[("SELFHEAL_REQUIRE_EBPF", "1")],
    )
}

/// Where the tests record their skips, one file each
/// (`tests::skips_dir`).
const SKIPS: &str = "target/tmp/skips";

/// Where the incident scenarios' tests leave their reports
/// (`CARGO_TARGET_TMPDIR/scenarios`).
const SCENARIO_REPORTS: &str = "target/tmp/scenarios";

/// The scenarios' measured times, one line each (a passing test's own
/// output is hidden by libtest).
fn print_scenarios() {
    let Ok(dir) = std::fs::read_dir(SCENARIO_REPORTS) else {
        eprintln!("xtask: no scenario reports in {SCENARIO_REPORTS} (the scenarios were skipped?)");
        return;
    };
    let mut paths: Vec<_> = dir.flatten().map(|e| e.path()).collect();
    paths.sort();
    eprintln!("\nincident scenarios (times from the fault):");
    for path in paths {
        let Ok(v) = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()))
        else {
            continue;
        };
        let ms = |k: &str| {
            v[k].as_u64()
                .map_or("-".to_string(), |m| format!("{:.1} s", m as f64 / 1000.0))
        };
        eprintln!(
            "  {:<20} detect {:>7}  recover {:>7}  {:>3} checks  heals {}",
            v["test"].as_str().unwrap_or("?"),
            ms("detect_ms"),
            ms("recover_ms"),
            v["checks"],
            v["heals"]
        );
    }
}

/// Runs cargo with `args` from the workspace root.
pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_env(args, &[])
}

/// Runs cargo with `args` and extra environment variables.
pub fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> Result<()> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// Runs `cmd`, failing with its command line when it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}
