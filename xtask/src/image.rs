//! `cargo xtask image`: the container image of the Kubernetes DaemonSet
//! (`dist/kubernetes/daemonset.yaml`: `image: selfheal:VERSION`, the
//! container's `args` given to the binary), built locally, pushed nowhere:
//! a tarball `docker load -i` accepts.
//!
//! The image is one layer, no base image:
//! - `/usr/bin/selfheal` (its eBPF object embedded, as in the `.deb`), the
//!   entrypoint;
//! - the shared libraries `ldd` lists for it (libc, libgcc_s, the dynamic
//!   loader), copied from this machine (a static build would need the musl
//!   target and a musl build of the eBPF loader's dependencies: more set-up
//!   than three files);
//! - `/etc/selfheal/config.toml`, the package's commented example (the
//!   DaemonSet mounts its ConfigMap over it), and an empty `/tmp`.
//!
//! The tarball is both layouts at once, as `docker save` writes them since
//! Docker 25: the docker-archive `manifest.json` (what Debian 12's Docker
//! 20.10 reads) and the OCI image layout (`oci-layout`, `index.json`, the
//! manifest), over the same content-addressed `blobs/sha256/`. The three
//! small JSON documents are written with serde_json (already here): the
//! `oci-spec` crate's builders would add a dozen crates to the build for
//! them. Digests are sha256 (the `sha2` crate). Tar files come from GNU
//! tar, with sorted names, owner 0 and mtime 0, so the same inputs give the
//! same digests.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::{
    package::{BIN, BuildArgs, copy, output, version, write},
    run,
};

/// Builds the image tarball; returns its path and the image's name.
pub fn image(args: &BuildArgs) -> Result<(PathBuf, String)> {
    let (profile, bin) = args.selfheal()?;
    let version = version()?;
    let arch = oci_arch(std::env::consts::ARCH)?;
    let name = format!("selfheal:{version}");

    let stage = Path::new("target/image-stage");
    let _ = std::fs::remove_dir_all(stage);
    let rootfs = stage.join("rootfs");
    let staged_bin = rootfs.join(BIN.trim_start_matches('/'));
    copy(&bin, &staged_bin, 0o755)?;
    run(Command::new("strip").arg("--strip-debug").arg(&staged_bin))?;
    for lib in shared_libraries(&output(Command::new("ldd").arg(&bin))?)? {
        // The file itself (ldd names the symlink a program asks for).
        let real = std::fs::canonicalize(&lib)
            .with_context(|| format!("cannot resolve {}", lib.display()))?;
        copy(
            &real,
            &rootfs.join(lib.strip_prefix("/").unwrap_or(&lib)),
            0o755,
        )?;
    }
    copy(
        Path::new("dist/debian/config.toml"),
        &rootfs.join("etc/selfheal/config.toml"),
        0o644,
    )?;
    std::fs::create_dir_all(rootfs.join("tmp")).context("cannot create tmp")?;
    set_mode(&rootfs.join("tmp"), 0o1777)?;

    let blobs = stage.join("archive/blobs/sha256");
    std::fs::create_dir_all(&blobs).context("cannot create the blob directory")?;
    let layer_tar = stage.join("layer.tar");
    tar(&rootfs, &layer_tar)?;
    let layer = blob_file(&blobs, &layer_tar)?;
    let config = blob(
        &blobs,
        &json!({
            "architecture": arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {
                "Entrypoint": [BIN],
                "Cmd": ["--help"],
                "Env": ["PATH=/usr/bin:/bin"],
                "WorkingDir": "/",
                "Labels": {
                    "org.opencontainers.image.title": "selfheal",
                    "org.opencontainers.image.version": version,
                },
            },
            "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{}", layer.digest)] },
            "history": [{ "created": "1970-01-01T00:00:00Z", "created_by": "cargo xtask image" }],
        }),
    )?;
    let manifest = blob(
        &blobs,
        &json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": format!("sha256:{}", config.digest),
                "size": config.size,
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": format!("sha256:{}", layer.digest),
                "size": layer.size,
            }],
        }),
    )?;
    let archive = stage.join("archive");
    json_file(
        &archive.join("index.json"),
        &json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", manifest.digest),
                "size": manifest.size,
                "platform": { "architecture": arch, "os": "linux" },
                "annotations": {
                    "io.containerd.image.name": format!("docker.io/library/{name}"),
                    "org.opencontainers.image.ref.name": version,
                },
            }],
        }),
    )?;
    json_file(
        &archive.join("oci-layout"),
        &json!({ "imageLayoutVersion": "1.0.0" }),
    )?;
    json_file(
        &archive.join("manifest.json"),
        &json!([{
            "Config": format!("blobs/sha256/{}", config.digest),
            "RepoTags": [name],
            "Layers": [format!("blobs/sha256/{}", layer.digest)],
        }]),
    )?;

    let out = args.out_or("target/image");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let tarball = out.join(format!("selfheal_{version}_{arch}.oci.tar"));
    tar(&archive, &tarball)?;
    let _ = std::fs::remove_dir_all(stage);
    let len = std::fs::metadata(&tarball).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "xtask: built {} ({:.1} MiB, {profile} binary): image {name}, load it with `docker load -i {}`",
        tarball.display(),
        len as f64 / 1048576.0,
        tarball.display()
    );
    Ok((tarball, name))
}

/// The OCI name of a Rust target architecture.
fn oci_arch(rust: &str) -> Result<&'static str> {
    Ok(match rust {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "riscv64" => "riscv64",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        other => bail!("no OCI architecture known for {other}"),
    })
}

/// The absolute paths in `ldd`'s output: `libc.so.6 => /lib/…/libc.so.6
/// (0x…)` and the loader's `/lib64/ld-linux-x86-64.so.2 (0x…)`; the vDSO
/// has none. A library `ldd` could not find is an error.
fn shared_libraries(ldd: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in ldd.lines() {
        if line.contains("not found") {
            bail!("ldd: {}", line.trim());
        }
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    if libs.is_empty() {
        bail!("ldd listed no libraries: {ldd:?}");
    }
    Ok(libs)
}

/// A blob's name (hex sha256) and size.
struct Blob {
    digest: String,
    size: u64,
}

/// Writes `value` as a blob; its digest and size.
fn blob(dir: &Path, value: &serde_json::Value) -> Result<Blob> {
    let bytes = serde_json::to_vec(value).context("cannot serialize")?;
    let digest = hex(&Sha256::digest(&bytes));
    std::fs::write(dir.join(&digest), &bytes).context("cannot write a blob")?;
    Ok(Blob {
        digest,
        size: bytes.len() as u64,
    })
}

/// Moves `file` into the blobs, named by its digest.
fn blob_file(dir: &Path, file: &Path) -> Result<Blob> {
    let mut hasher = Sha256::new();
    let mut f =
        std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?;
    let size = std::io::copy(&mut f, &mut hasher)
        .with_context(|| format!("cannot read {}", file.display()))?;
    let digest = hex(&hasher.finalize());
    std::fs::rename(file, dir.join(&digest)).context("cannot move the layer into the blobs")?;
    Ok(Blob { digest, size })
}

fn json_file(path: &Path, value: &serde_json::Value) -> Result<()> {
    write(path, &serde_json::to_string(value)?, 0o644)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// A reproducible tar of `dir`'s contents.
fn tar(dir: &Path, to: &Path) -> Result<()> {
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--format=gnu",
            "-C",
        ])
        .arg(dir)
        .arg("-cf")
        .arg(to)
        .arg("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_the_files_to_copy() {
        let ldd = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f6f)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f6e)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f6f)\n";
        let libs = shared_libraries(ldd).unwrap();
        assert_eq!(
            libs,
            [
                "/lib/x86_64-linux-gnu/libgcc_s.so.1",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        assert!(shared_libraries("\tlibfoo.so => not found\n").is_err());
        assert!(shared_libraries("").is_err());
    }
}
