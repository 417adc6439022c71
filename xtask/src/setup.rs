//! Idempotent machine set-up: each step checks first and acts only when
//! something is missing, so running it on every `demo`/`test` costs little.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::run;

/// Debian packages the tests and the VM test use.
const DEBIAN_PACKAGES: &[&str] = &[
    "iproute2",        // ip netns / veth for network-namespace tests
    "nftables",        // dropping a peer's traffic to make half-open connections
    "qemu-system-x86", // booting a stock kernel for the kprobe/fentry strategies
    "busybox-static",  // the VM's userland
    "cpio",            // packing the VM's initramfs
    "python3-pip",     // the official LLM SDKs the silent-call scenarios drive
    "systemd",         // systemd-analyze: the units' verify and security tests
    "docker.io",       // a real dockerd for the container tests (tests/tests/it/containers.rs)
    "podman",          // Podman and its compatible API, beside Docker (same tests)
    "containerd",      // a real containerd running a task with the kubelet's labels
    // promtool and a real Prometheus for the alerting test
    "prometheus",
    // a real Alertmanager paging the alerting test's webhook
    "prometheus-alertmanager",
    "debootstrap", // the Debian root filesystem systemd runs in (tests/tests/it/deployment.rs)
    "binutils",    // strip: the binary in `cargo xtask package` and `cargo xtask image`
];

/// Services the packages above start on a systemd host that the tests do
/// not want: the alerting test starts its own Prometheus and Alertmanager
/// on loopback ports it picks, with scratch directories.
const UNWANTED_SERVICES: &[&str] = &["prometheus.service", "prometheus-alertmanager.service"];

const BPF_LINKER_VERSION: &str = "0.13.0";

/// The official LLM SDKs, and litellm (what OpenHands and aider call), the
/// silent-call scenarios drive the testbed's provider with
/// (`selfheal-testbed provider`, `testbed/`; the SDK side is
/// `tests/py/sdk_runner.py`), at the versions verified against it; and
/// `grpcio`, whose client and server hold the gRPC control stream of
/// `tests/py/grpc_control.py`.
const PYTHON_SDKS: &[&str] = &[
    "openai==3.57.0",
    "anthropic==2.14.0",
    "litellm==1.110.2",
    "grpcio==1.85.1",
];

pub fn all() -> Result<()> {
    debian_packages()?;
    stop_unwanted_services();
    nightly_rust_src()?;
    bpf_linker()?;
    tracefs()?;
    python_sdks()?;
    node_sdks()?;
    kubernetes_validate()?;
    Ok(())
}

/// `kubernetes-validate` (PyPI), which validates `dist/kubernetes/` against
/// the Kubernetes JSON schemas it bundles: no cluster, no network
/// (tests/tests/it/kubernetes.rs).
fn kubernetes_validate() -> Result<()> {
    let have = Command::new("kubernetes-validate")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        return Ok(());
    }
    eprintln!("setup: installing kubernetes-validate");
    let pip = || {
        let mut c = Command::new("python3");
        c.args(["-m", "pip", "install", "--quiet", "kubernetes-validate"]);
        c
    };
    if run(&mut pip()).is_ok() {
        return Ok(());
    }
    run(pip().env("PIP_BREAK_SYSTEM_PACKAGES", "1"))
}

/// The `openai`, `anthropic`, `litellm` and `grpcio` Python packages, for the
/// `python3` on PATH (the one the scenarios run). Installed with pip only
/// when one does not import.
fn python_sdks() -> Result<()> {
    let have = Command::new("python3")
        .args(["-c", "import openai, anthropic, litellm, grpc"])
        .output()
        .map(|o| o.status.success())
        .context("cannot run python3 (Debian package python3)")?;
    if have {
        return Ok(());
    }
    eprintln!("setup: installing the Python SDKs {PYTHON_SDKS:?}");
    let pip = || {
        let mut c = Command::new("python3");
        c.args(["-m", "pip", "install", "--quiet"])
            .args(PYTHON_SDKS);
        c
    };
    if run(&mut pip()).is_ok() {
        return Ok(());
    }
    // Debian's own python3 refuses pip installs (PEP 668, "externally
    // managed"); on a test machine the scenarios need them anyway.
    eprintln!("setup: pip refused; trying again past PEP 668 (a test machine's system Python)");
    run(pip().env("PIP_BREAK_SYSTEM_PACKAGES", "1"))
}

/// The official `openai` and `@anthropic-ai/sdk` Node packages, at the
/// versions `tests/node/package-lock.json` pins, for the Node SDK runner
/// (`tests/node/sdk_runner.mjs`), with the machine's Node.js and npm.
/// `npm ci` only when either is missing.
fn node_sdks() -> Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("tests")
        .join("node");
    let modules = dir.join("node_modules");
    if modules.join("openai").exists() && modules.join("@anthropic-ai").join("sdk").exists() {
        return Ok(());
    }
    eprintln!(
        "setup: installing the Node SDKs (npm ci in {})",
        dir.display()
    );
    run(Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir))
    .context("npm ci for the Node SDKs (Node.js and npm come with the machine)")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions. (xtask keeps to std + anyhow.)
    unsafe extern "C" {
        fn geteuid() -> u32;
    }
    unsafe { geteuid() == 0 }
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
                .unwrap_or(false)
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "missing Debian packages {missing:?}; run `cargo xtask setup` as root or install them"
        );
    }
    eprintln!("setup: installing {missing:?}");
    run(Command::new("apt-get").args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// Stops and disables [`UNWANTED_SERVICES`] where systemd runs them (a
/// machine without systemd as PID 1 never started them).
fn stop_unwanted_services() {
    for unit in UNWANTED_SERVICES {
        let active = Command::new("systemctl")
            .args(["is-enabled", "--quiet", unit])
            .status()
            .is_ok_and(|s| s.success());
        if active && is_root() {
            eprintln!("setup: disabling {unit} (the tests run their own)");
            let _ = Command::new("systemctl")
                .args(["disable", "--now", "--quiet", unit])
                .status();
        }
    }
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = Command::new("rustc")
        .args(["+nightly", "--print", "sysroot"])
        .output()
        .context("cannot run `rustc +nightly`")?;
    if !out.status.success() {
        bail!(
            "no nightly toolchain (`rustc +nightly` failed: {}); the eBPF programs need nightly",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn nightly_rust_src() -> Result<()> {
    let sysroot = nightly_sysroot()?;
    if sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    eprintln!("setup: adding rust-src to nightly");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
}

fn bpf_linker() -> Result<()> {
    let have = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false);
    if have {
        return Ok(());
    }
    // bpf-linker needs a libLLVM of the same major version as nightly's own
    // LLVM: link nightly's libLLVM.so into a prefix it can find.
    let lib = nightly_sysroot()?.join("lib");
    let so = fs::read_dir(&lib)
        .with_context(|| format!("cannot read {}", lib.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("libLLVM.so.") || (n.starts_with("libLLVM-") && n.ends_with(".so")))
        .with_context(|| format!("no libLLVM in {}", lib.display()))?;
    let major = llvm_major(&so).with_context(|| format!("cannot tell LLVM's version from {so}"))?;
    let prefix = Path::new("/opt/rllvm/lib");
    fs::create_dir_all(prefix).with_context(|| format!("cannot create {}", prefix.display()))?;
    for name in ["libLLVM.so", so.as_str()] {
        let link = prefix.join(name);
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(lib.join(&so), &link)
            .with_context(|| format!("cannot link {}", link.display()))?;
    }
    eprintln!("setup: installing bpf-linker {BPF_LINKER_VERSION} against {so} (about 100 s)");
    run(Command::new("cargo")
        .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION])
        .args([
            "--no-default-features",
            "--features",
            &format!("llvm-{major}"),
        ])
        .env("LLVM_PREFIX", "/opt/rllvm"))
}

/// `libLLVM.so.22.1-rust-1.97.0-nightly` or `libLLVM-22-rust-….so` → 22.
fn llvm_major(so: &str) -> Option<u32> {
    let rest = so
        .strip_prefix("libLLVM.so.")
        .or_else(|| so.strip_prefix("libLLVM-"))?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").is_dir() || !is_root() {
        return Ok(());
    }
    eprintln!("setup: mounting tracefs at /sys/kernel/tracing");
    run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
}
