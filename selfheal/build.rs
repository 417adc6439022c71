//! Builds the eBPF object from `selfheal-ebpf` with aya-build when the eBPF
//! toolchain (nightly with rust-src, bpf-linker) is present, and sets
//! `cfg(selfheal_ebpf)`. Without it the build still succeeds and the binary
//! reports at run time that eBPF was not built in — unless
//! `SELFHEAL_REQUIRE_EBPF=1` (CI, `cargo xtask test`), which makes a missing
//! toolchain an error. `SELFHEAL_SKIP_EBPF=1` skips the eBPF object on
//! purpose (the fuzz build, which exercises parsers, not the loader).

use std::{path::PathBuf, process::Command};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(selfheal_ebpf)");
    println!("cargo::rerun-if-env-changed=SELFHEAL_REQUIRE_EBPF");
    println!("cargo::rerun-if-env-changed=SELFHEAL_SKIP_EBPF");
    let required = std::env::var("SELFHEAL_REQUIRE_EBPF").is_ok_and(|v| v == "1");
    if std::env::var("SELFHEAL_SKIP_EBPF").is_ok_and(|v| v == "1") {
        if required {
            panic!("SELFHEAL_REQUIRE_EBPF=1 and SELFHEAL_SKIP_EBPF=1 contradict each other");
        }
        println!("cargo::warning=eBPF not built in (SELFHEAL_SKIP_EBPF=1)");
        return;
    }
    // Rebuild once bpf-linker appears (or changes): a build made before
    // `cargo xtask setup` must not stay without eBPF. A path that does not
    // exist yet makes cargo rerun this script on every build until it does.
    println!("cargo::rerun-if-changed={}", bpf_linker_path().display());
    match toolchain_missing() {
        None => {}
        Some(why) if required => panic!(
            "SELFHEAL_REQUIRE_EBPF=1 but the eBPF toolchain is missing: {why}; run `cargo xtask setup`"
        ),
        Some(why) => {
            println!(
                "cargo::warning=eBPF not built in ({why}); run `cargo xtask setup` to install the toolchain"
            );
            return;
        }
    }
    let root =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
            .join("../selfheal-ebpf");
    let root = root.to_str().expect("workspace path is UTF-8");
    let package = aya_build::Package {
        name: "selfheal-ebpf",
        root_dir: root,
        ..Default::default()
    };
    // aya-build forwards every line of the eBPF build's stderr as a
    // `cargo::warning`, so a newcomer's first build showed dozens of
    // "warning: selfheal@0.1.0: Compiling …" lines. A quiet inner cargo
    // prints no status lines; the compiler's own warnings and errors still
    // come through (aya-build renders them from its JSON messages), and a
    // failed build still fails with cargo's error.
    // SAFETY: the build script is single-threaded here; nothing else reads
    // the environment concurrently.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    match aya_build::build_ebpf([package], aya_build::Toolchain::default()) {
        Ok(()) => {
            println!("cargo::rustc-cfg=selfheal_ebpf");
            println!(
                "cargo::rustc-env=SELFHEAL_EBPF_OBJECT_HASH={:016x}",
                object_hash()
            );
        }
        Err(e) if required => panic!("building the eBPF object failed: {e:#}"),
        Err(e) => {
            println!("cargo::warning=eBPF not built in: building the eBPF object failed: {e:#}")
        }
    }
}

/// FNV-1a (64 bits) of the eBPF object aya-build wrote: the name of this
/// build's pin directory (`iter-HASH`), computed once here instead of on
/// every check.
fn object_hash() -> u64 {
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    let object = std::fs::read(PathBuf::from(out).join("selfheal"))
        .expect("aya-build wrote the eBPF object to OUT_DIR/selfheal");
    object.iter().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where bpf-linker is, or where `cargo install` puts it.
fn bpf_linker_path() -> PathBuf {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("bpf-linker"))
            .find(|p| p.is_file())
    });
    on_path.unwrap_or_else(|| {
        let cargo_home = std::env::var_os("CARGO_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
            .unwrap_or_default();
        cargo_home.join("bin/bpf-linker")
    })
}

/// Why the eBPF toolchain is unusable, or `None` when it is there.
fn toolchain_missing() -> Option<String> {
    match Command::new("bpf-linker").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => return Some("bpf-linker is not on PATH".into()),
    }
    let sysroot = match Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    {
        Ok(o) if o.status.success() => PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()),
        _ => return Some("no nightly toolchain".into()),
    };
    if !sysroot.join("lib/rustlib/src/rust/library/core").is_dir() {
        return Some("nightly has no rust-src component".into());
    }
    None
}
