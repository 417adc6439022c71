//! `cargo xtask package`: a Debian package of selfheal, built with Debian's
//! own `dpkg-deb --build` from a staging tree filled here (no cargo-deb:
//! one more `cargo install` per CI run for what a dozen lines of file
//! copying do; `dpkg-deb` is on every Debian machine).
//!
//! The package holds:
//! - `/usr/bin/selfheal`, built with `SELFHEAL_REQUIRE_EBPF=1`: its eBPF
//!   object is embedded in the binary (`include_bytes_aligned!` in
//!   `selfheal/src/ebpf/loader.rs`), nothing else to install;
//! - the helper's socket and service in `/lib/systemd/system` and the
//!   user's timer and service (and the `selfheal watch` service, the
//!   timer's alternative) in `/usr/lib/systemd/user`, from
//!   `dist/systemd` with `@BIN@` set to `/usr/bin/selfheal`;
//! - `/etc/selfheal/config.toml` (`dist/debian/config.toml`, a commented
//!   example), a conffile;
//! - the docs in `/usr/share/doc/selfheal`;
//! - `dist/debian/{postinst,prerm,postrm}`: the postinst enables and starts
//!   the helper socket (recorded only, without a running systemd), prerm
//!   stops socket and helper on removal (not on upgrade), postrm forgets
//!   the enablement; snapshots and logs are kept.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{cargo_env, run};

/// Which build of `selfheal` the package (or the image) holds, and where
/// it is written.
#[derive(clap::Args, Default)]
pub struct BuildArgs {
    /// Take the debug build (`target/debug/selfheal`, which the tests
    /// already built) instead of building the release one.
    #[arg(long)]
    pub debug: bool,
    /// Where to write the `.deb` (default `target/debian`) or the image
    /// tarball (default `target/image`).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

impl BuildArgs {
    /// Builds `selfheal` (the release build unless `--debug`, with the eBPF
    /// object required): the profile's name and the binary's path.
    pub fn selfheal(&self) -> Result<(&'static str, PathBuf)> {
        let profile = if self.debug { "debug" } else { "release" };
        let mut build = vec!["build", "-p", "selfheal", "--bin", "selfheal"];
        if !self.debug {
            build.push("--release");
        }
        cargo_env(&build, &[("SELFHEAL_REQUIRE_EBPF", "1")])?;
        Ok((profile, Path::new("target").join(profile).join("selfheal")))
    }

    /// `--out`, or `default`.
    pub fn out_or(&self, default: &str) -> PathBuf {
        self.out.clone().unwrap_or_else(|| PathBuf::from(default))
    }
}

/// Where the binary goes, in the package and in the image.
pub const BIN: &str = "/usr/bin/selfheal";

/// The docs shipped in `/usr/share/doc/selfheal`.
const DOCS: &[(&str, &str)] = &[
    ("README.md", "README.md"),
    ("ARCHITECTURE.md", "ARCHITECTURE.md"),
    ("RELIABILITY.md", "RELIABILITY.md"),
    ("docs/capabilities.md", "capabilities.md"),
];

/// Units: source in `dist/systemd`, destination directory in the package.
const UNITS: &[(&str, &str)] = &[
    ("selfheal-helper.socket", "lib/systemd/system"),
    ("selfheal-helper.service", "lib/systemd/system"),
    ("selfheal.service", "usr/lib/systemd/user"),
    ("selfheal.timer", "usr/lib/systemd/user"),
    ("selfheal-watch.service", "usr/lib/systemd/user"),
];

/// Builds the package; returns its path.
pub fn package(args: &BuildArgs) -> Result<PathBuf> {
    let (profile, bin) = args.selfheal()?;

    let version = version()?;
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let name = format!("selfheal_{version}_{arch}");
    let out = args.out_or("target/debian");
    let stage = Path::new("target/debian-stage").join(&name);
    let _ = std::fs::remove_dir_all(&stage);

    let staged_bin = stage.join(BIN.trim_start_matches('/'));
    copy(&bin, &staged_bin, 0o755)?;
    // Debug info out (the embedded eBPF object is data, and stays).
    run(Command::new("strip").arg("--strip-debug").arg(&staged_bin))?;
    for (unit, dir) in UNITS {
        let text = read(&Path::new("dist/systemd").join(unit))?.replace("@BIN@", BIN);
        write(&stage.join(dir).join(unit), &text, 0o644)?;
    }
    copy(
        Path::new("dist/debian/config.toml"),
        &stage.join("etc/selfheal/config.toml"),
        0o644,
    )?;
    let doc = stage.join("usr/share/doc/selfheal");
    for (from, to) in DOCS {
        copy(Path::new(from), &doc.join(to), 0o644)?;
    }
    write(
        &doc.join("copyright"),
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: selfheal\n\nFiles: *\nLicense: MIT OR Apache-2.0\n",
        0o644,
    )?;

    let debian = stage.join("DEBIAN");
    for script in ["postinst", "prerm", "postrm"] {
        copy(
            &Path::new("dist/debian").join(script),
            &debian.join(script),
            0o755,
        )?;
    }
    write(
        &debian.join("conffiles"),
        "/etc/selfheal/config.toml\n",
        0o644,
    )?;
    let size_kib = du_kib(&stage)?;
    write(
        &debian.join("control"),
        &format!(
            "Package: selfheal\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: selfheal developers <selfheal@localhost>\n\
             Installed-Size: {size_kib}\n\
             Depends: libc6, systemd\n\
             Section: admin\n\
             Priority: optional\n\
             Description: finds, proves and heals wedged AI-agent processes\n \
             A host agent that finds wedged AI-agent processes from outside,\n \
             proves the wedge with kernel evidence (eBPF, TCP state), snapshots\n \
             it and heals it, gentlest step first. Ships the socket-activated\n \
             privileged helper (enabled) and a per-user timer.\n"
        ),
        0o644,
    )?;

    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let deb = out.join(format!("{name}.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&deb))?;
    let len = std::fs::metadata(&deb).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "xtask: built {} ({:.1} MiB, {profile} binary)",
        deb.display(),
        len as f64 / 1048576.0
    );
    Ok(deb)
}

/// selfheal's version, from its manifest.
pub(crate) fn version() -> Result<String> {
    let manifest = read(Path::new("selfheal/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|l| {
            let v = l.strip_prefix("version")?.trim_start().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
        .filter(|v| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".+-~".contains(c))
        })
        .context("no usable version in selfheal/Cargo.toml")
}

pub(crate) fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

pub(crate) fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    put(path, mode, |p| std::fs::write(p, text))
}

pub(crate) fn copy(from: &Path, to: &Path, mode: u32) -> Result<()> {
    put(to, mode, |p| std::fs::copy(from, p).map(|_| ()))
        .with_context(|| format!("cannot copy {}", from.display()))
}

fn put(path: &Path, mode: u32, f: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    f(path).with_context(|| format!("cannot write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// The staged files' size in KiB (the control file's Installed-Size).
fn du_kib(dir: &Path) -> Result<u64> {
    let text = output(Command::new("du").args(["-sk"]).arg(dir))?;
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du printed no size")
}
