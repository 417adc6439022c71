//! `dist/kubernetes/`, checked without a cluster: every manifest of a
//! built-in kind validates against the Kubernetes JSON schemas that
//! `kubernetes-validate` bundles (strict: an unknown field fails), a broken
//! one fails, the ServiceMonitor selects the Service's metrics port, and the
//! ConfigMap's config passes `selfheal config check`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tests::{Scratch, runtimes::have, selfheal_bin, skip};

fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dist/kubernetes")
}

/// `kubernetes-validate --strict FILE`: success, and what it said.
fn validate(file: &Path) -> (bool, String) {
    let out = Command::new("kubernetes-validate")
        .arg("--strict")
        .arg(file)
        .output()
        .expect("run kubernetes-validate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dist().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn the_manifests_validate_and_a_broken_one_does_not() {
    const TEST: &str = "the_manifests_validate_and_a_broken_one_does_not";
    if !have("kubernetes-validate") {
        return skip(
            TEST,
            "no kubernetes-validate (run `cargo xtask setup`: pip kubernetes-validate)",
        );
    }
    let t = std::time::Instant::now();
    for name in [
        "namespace.yaml",
        "configmap.yaml",
        "daemonset.yaml",
        "service.yaml",
    ] {
        let (ok, said) = validate(&dist().join(name));
        assert!(ok, "{name}: {said}");
        assert!(said.contains("passed"), "{name}: {said}");
    }
    // A misspelt field, a wrong type: each fails.
    let scratch = Scratch::new("kubernetes");
    let ds = read("daemonset.yaml");
    for (from, to) in [
        ("runAsUser: 0", "runAsUsr: 0"),
        ("containerPort: 9464", "containerPort: \"nine\""),
        ("hostPID: true", "hostPid: true"),
    ] {
        assert!(ds.contains(from), "{from}");
        let bad = scratch.join("bad.yaml");
        std::fs::write(&bad, ds.replacen(from, to, 1)).unwrap();
        let (ok, said) = validate(&bad);
        assert!(!ok, "{to} passed: {said}");
        eprintln!("broken ({to}): {}", said.trim());
    }
    eprintln!(
        "kubernetes-validate of dist/kubernetes took {:?}",
        t.elapsed()
    );
}

#[test]
fn the_service_monitor_selects_the_metrics_port_and_the_config_checks() {
    // The ServiceMonitor (a CRD's kind: no bundled schema) by hand.
    let sm = read("servicemonitor.yaml");
    let svc = read("service.yaml");
    let ds = read("daemonset.yaml");
    assert!(sm.contains("kind: ServiceMonitor"));
    assert!(sm.contains("app.kubernetes.io/name: selfheal"));
    assert!(svc.contains("app.kubernetes.io/name: selfheal"));
    assert!(sm.contains("- port: metrics"), "{sm}");
    assert!(svc.contains("name: metrics, port: 9464"), "{svc}");
    assert!(ds.contains("name: metrics, containerPort: 9464"), "{ds}");
    assert!(ds.contains("--metrics-addr=0.0.0.0:9464"), "{ds}");
    for mount in [
        "/sys/fs/bpf",
        "/sys/kernel/btf",
        "/run/containerd",
        "hostPID: true",
    ] {
        assert!(ds.contains(mount), "{mount}");
    }

    // The ConfigMap's config.toml (the block under `config.toml: |`).
    let cm = read("configmap.yaml");
    let block: Vec<&str> = cm
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("config.toml: |"))
        .skip(1)
        .map(|l| l.strip_prefix("    ").unwrap_or(l.trim()))
        .collect();
    assert!(!block.is_empty(), "{cm}");
    let scratch = Scratch::new("kubernetes-config");
    let config = scratch.join("config.toml");
    std::fs::write(&config, block.join("\n")).unwrap();
    let out = Command::new(selfheal_bin())
        .args(["config", "check", "--config"])
        .arg(&config)
        .env("SELFHEAL_CONTAINERD_STATE", scratch.join("none"))
        .env(
            "DOCKER_HOST",
            format!("unix://{}", scratch.join("none.sock").display()),
        )
        .env(
            "CONTAINER_HOST",
            format!("unix://{}", scratch.join("none.sock").display()),
        )
        .output()
        .expect("selfheal config check");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("runner"), "{said}");
}
