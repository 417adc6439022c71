//! The DaemonSet's container image: `cargo xtask image` builds
//! a tarball that a test-owned `dockerd` (Debian's Docker) loads as
//! `selfheal:VERSION`, the name `dist/kubernetes/daemonset.yaml` uses, and
//! the binary runs in it with the libraries it carries: `--version`, and
//! `config check` of the config the image ships.

use std::{process::Command, time::Instant};

use tests::{
    Scratch,
    runtimes::{docker, need_root_and, run_ok, start_dockerd, xtask_build},
};

#[test]
fn the_image_tarball_loads_into_docker_and_the_binary_runs_in_it() {
    let _area = tests::area(module_path!());
    const TEST: &str = "the_image_tarball_loads_into_docker_and_the_binary_runs_in_it";
    if !need_root_and(
        TEST,
        &["dockerd", "docker", "tar", "ldd", "strip"],
        "run `cargo xtask setup`: Debian docker.io",
    ) {
        return;
    }
    let scratch = Scratch::new("image");
    let t0 = Instant::now();
    let tarball = xtask_build("image", &scratch.join("image"), "tar");
    let build_s = t0.elapsed().as_secs_f64();

    // Both layouts in one archive.
    let listing = run_ok(Command::new("tar").arg("-tf").arg(&tarball)).expect("tar -t");
    for member in ["./manifest.json", "./index.json", "./oci-layout"] {
        assert!(listing.lines().any(|l| l == member), "{member}: {listing}");
    }

    let exec = std::path::PathBuf::from(format!("/run/shi-{}-d", std::process::id()));
    let _exec_dir = RemoveOnDrop(exec.clone());
    let (_dockerd, sock) = start_dockerd(&scratch, &exec).unwrap_or_else(|e| panic!("{e}"));
    let t1 = Instant::now();
    let loaded = run_ok(docker(&sock).arg("load").arg("-i").arg(&tarball))
        .unwrap_or_else(|e| panic!("docker load: {e}"));
    let load_s = t1.elapsed().as_secs_f64();
    let version = env!("CARGO_PKG_VERSION");
    let image = format!("selfheal:{version}");
    assert!(
        loaded.contains(&format!("Loaded image: {image}")),
        "{loaded}"
    );
    let entrypoint = run_ok(docker(&sock).args([
        "image",
        "inspect",
        "-f",
        "{{json .Config.Entrypoint}}",
        &image,
    ]))
    .expect("docker image inspect");
    assert_eq!(entrypoint, r#"["/usr/bin/selfheal"]"#);

    // The DaemonSet gives only `args`: the entrypoint is the binary.
    let run = |args: &[&str]| {
        run_ok(
            docker(&sock)
                .args(["run", "--rm", "--network", "none", &image])
                .args(args),
        )
        .unwrap_or_else(|e| panic!("docker run {image} {args:?}: {e}"))
    };
    let said = run(&["--version"]);
    assert!(said.starts_with("selfheal "), "{said}");
    assert!(said.contains(version), "{said}");
    let checked = run(&["config", "check"]);
    assert!(checked.contains("/etc/selfheal/config.toml"), "{checked}");
    eprintln!(
        "TIMING image: cargo xtask image (debug binary) {build_s:.1} s, {:.1} MiB, docker load {load_s:.1} s; in it: {said:?}; config check: {:?}",
        std::fs::metadata(&tarball).map(|m| m.len()).unwrap_or(0) as f64 / 1048576.0,
        checked.lines().next().unwrap_or_default()
    );
}

/// dockerd's exec root, removed on drop (outside the scratch dir:
/// containerd's socket path must stay short).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
