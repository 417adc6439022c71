//! `dist/kubernetes/`, checked without a cluster: every manifest of a
//! built-in kind validates against the Kubernetes JSON schemas that
//! `kubernetes-validate` bundles (strict: an unknown field fails), a broken
//! one fails, the ServiceMonitor selects the Service's metrics port, and the
//! ConfigMap's config passes `selfheal config check`, and each container's
//! privileges (capabilities, seccomp, AppArmor, mounts) are the ones
//! docs/capabilities.md's table gives, no more.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use tests::{Scratch, runtimes::have, selfheal_bin, skip_tool_missing};

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
    let _area = tests::area(module_path!());
    const TEST: &str = "the_manifests_validate_and_a_broken_one_does_not";
    if !have("kubernetes-validate") {
        return skip_tool_missing(
            TEST,
            "kubernetes-validate",
            "run `cargo xtask setup`: pip kubernetes-validate",
        );
    }
    let t = std::time::Instant::now();
    for name in [
        "namespace.yaml",
        "configmap.yaml",
        "daemonset.yaml",
        "service.yaml",
        "networkpolicy.yaml",
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
    let _area = tests::area(module_path!());
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
        "/sys/kernel/btf",
        "/run/containerd/io.containerd.runtime.v2.task",
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
    let config = tests::config_in(&scratch, block.join("\n"));
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

/// The manifest `name` as JSON values (one per YAML document), through
/// PyYAML (kubernetes-validate's own parser); `None` when there is none.
fn yaml(name: &str) -> Option<Vec<serde_json::Value>> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(dist().join(name))
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("python3 yaml: {}", String::from_utf8_lossy(&out.stderr));
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("PyYAML's JSON"))
}

/// docs/capabilities.md's per-container table (`| \`watch\` |
/// \`SYS_ADMIN\` | code path | without it |`): container → capabilities.
fn documented_capabilities() -> std::collections::BTreeMap<String, Vec<String>> {
    let doc = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/capabilities.md"),
    )
    .unwrap();
    let section = doc
        .split("### Each container's capabilities")
        .nth(1)
        .expect("docs/capabilities.md has the per-container table");
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in section.lines().skip_while(|l| !l.starts_with('|')) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let (Some(c), Some(cap)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let (Some(c), Some(cap)) = (
            c.strip_prefix('`').and_then(|c| c.strip_suffix('`')),
            cap.strip_prefix('`').and_then(|c| c.strip_suffix('`')),
        ) else {
            continue;
        };
        out.entry(c.into()).or_default().push(cap.into());
    }
    for caps in out.values_mut() {
        caps.sort();
    }
    out
}

fn strs(v: &serde_json::Value) -> Vec<String> {
    let mut out: Vec<String> = v
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The host paths a container may write: its history and its snapshots.
const WRITABLE_HOST_PATHS: [&str; 2] = ["/var/lib/selfheal", "/var/log/selfheal"];

#[test]
fn each_container_holds_only_the_documented_privileges() {
    let _area = tests::area(module_path!());
    const TEST: &str = "each_container_holds_only_the_documented_privileges";
    let Some(docs) = yaml("daemonset.yaml") else {
        return skip_tool_missing(
            TEST,
            "python3 with PyYAML",
            "kubernetes-validate's parser: `cargo xtask setup`",
        );
    };
    let table = documented_capabilities();
    eprintln!("docs/capabilities.md: {table:?}");
    let ds = &docs[0];
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(pod["hostNetwork"].is_null(), "no hostNetwork");
    let volumes: std::collections::BTreeMap<&str, &serde_json::Value> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    // No host path is the containerd socket's directory or above it, and no
    // bpffs (nothing is pinned).
    for (name, v) in &volumes {
        if let Some(path) = v["hostPath"]["path"].as_str() {
            for sock in [
                "/run/containerd/containerd.sock",
                "/var/run/containerd/containerd.sock",
            ] {
                assert!(
                    !sock.starts_with(&format!("{}/", path.trim_end_matches('/'))),
                    "volume {name} ({path}) holds {sock}"
                );
            }
            assert!(!path.starts_with("/sys/fs/bpf"), "volume {name}: bpffs");
        }
    }
    let containers = pod["containers"].as_array().unwrap();
    let names: Vec<String> = containers
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        table.keys().cloned().collect::<Vec<_>>(),
        "every container is in the table"
    );
    for c in containers {
        let name = c["name"].as_str().unwrap();
        let sc = &c["securityContext"];
        assert_eq!(strs(&sc["capabilities"]["drop"]), ["ALL"], "{name}");
        assert_eq!(
            strs(&sc["capabilities"]["add"]),
            table[name],
            "{name}: the capabilities added are docs/capabilities.md's"
        );
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        assert_eq!(sc["appArmorProfile"]["type"], "RuntimeDefault", "{name}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert!(
            sc["privileged"].is_null() || sc["privileged"] == false,
            "{name}"
        );
        for m in c["volumeMounts"].as_array().unwrap() {
            let vol = volumes[m["name"].as_str().unwrap()];
            let read_only = m["readOnly"] == true;
            if let Some(path) = vol["hostPath"]["path"].as_str() {
                assert!(
                    read_only || WRITABLE_HOST_PATHS.contains(&path),
                    "{name}: host path {path} mounted writable"
                );
                if path.contains("containerd") {
                    assert_eq!(
                        path, "/run/containerd/io.containerd.runtime.v2.task",
                        "{name}: only containerd's task state"
                    );
                    assert_eq!(m["recursiveReadOnly"], "Enabled", "{name}: {m}");
                }
            }
            if vol["secret"].is_object() {
                assert!(read_only, "{name}: {m}");
                let mode = vol["secret"]["defaultMode"].as_u64().unwrap_or(0o644);
                assert_eq!(mode & 0o077, 0, "{name}: secret mode {mode:o}");
            }
        }
    }
    // The watch container: the token, the liveness probe on /healthz.
    let watch = containers.iter().find(|c| c["name"] == "watch").unwrap();
    let args = strs(&watch["args"]);
    let token_arg = args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-token-file="))
        .expect("watch requires a metrics token");
    assert!(
        !args.iter().any(|a| a.starts_with("--metrics-public")),
        "the DaemonSet serves /metrics to anyone: {args:?}"
    );
    let token_mount = watch["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| token_arg.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
        .max_by_key(|m| m["mountPath"].as_str().unwrap().len())
        .expect("the token file is in a mount");
    let secret = &volumes[token_mount["name"].as_str().unwrap()]["secret"];
    assert_eq!(watch["livenessProbe"]["httpGet"]["path"], "/healthz");

    // The ServiceMonitor sends that Secret's key as the bearer token.
    let sm = &yaml("servicemonitor.yaml").unwrap()[0];
    let auth = &sm["spec"]["endpoints"][0]["authorization"];
    assert_eq!(auth["type"], "Bearer", "{sm}");
    assert_eq!(auth["credentials"]["name"], secret["secretName"], "{sm}");
    assert!(
        token_arg.ends_with(&format!(
            "/{}",
            auth["credentials"]["key"].as_str().unwrap()
        )),
        "{token_arg} {auth}"
    );

    // The NetworkPolicy: the selfheal pods, ingress only from Prometheus,
    // only on the metrics port.
    let np = &yaml("networkpolicy.yaml").unwrap()[0];
    assert_eq!(np["kind"], "NetworkPolicy");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        ds["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(strs(&np["spec"]["policyTypes"]), ["Ingress"]);
    let rules = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{np}");
    assert_eq!(
        rules[0]["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 9464}])
    );
    for peer in rules[0]["from"].as_array().unwrap() {
        assert!(peer["ipBlock"].is_null(), "{peer}");
        assert!(
            peer["namespaceSelector"]["matchLabels"].is_object()
                && peer["podSelector"]["matchLabels"].is_object(),
            "both a namespace and a pod selector: {peer}"
        );
    }
}

/// The DaemonSet's helper gets its task iterators with the manifests' own
/// settings: its args as `daemonset.yaml` gives them, its `run` volume an
/// `emptyDir` of medium Memory (a tmpfs whose root is 0777, as the kubelet
/// makes it) at the mountPath the manifest gives, and no bpffs at
/// `/sys/fs/bpf` (a container's read-only sysfs has none). The helper pins
/// them in a 0700 bpffs it mounts at `/run/selfheal/bpf` inside that 0777
/// directory; they open under a check's rule and walk a process, and its
/// `iterate` (what the `watch` container asks for) answers. Staged in a
/// mount namespace of the helper's own, gone with it.
#[test]
fn the_daemonsets_helper_pins_its_iterators() {
    let _area = tests::area(module_path!());
    const TEST: &str = "kubernetes::the_daemonsets_helper_pins_its_iterators";
    if !tests::need_ebpf(TEST) {
        return;
    }
    let Some(docs) = yaml("daemonset.yaml") else {
        return skip_tool_missing(
            TEST,
            "python3 with PyYAML",
            "kubernetes-validate's parser: `cargo xtask setup`",
        );
    };
    let pod = &docs[0]["spec"]["template"]["spec"];
    let helper = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "helper")
        .expect("a helper container");
    let args: Vec<String> = helper["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let run_mount = helper["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/run/selfheal")
        .expect("the helper mounts a volume at /run/selfheal");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == run_mount["name"])
        .expect("the volume exists");
    assert_eq!(volume["emptyDir"]["medium"], "Memory", "{volume}");
    assert!(
        !helper["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["mountPath"].as_str().unwrap().starts_with("/sys/fs/bpf")),
        "the test stages no bpffs: the manifest must mount none"
    );
    let scratch = Scratch::new("daemonset-helper");
    let setup = "mount -t tmpfs -o mode=0755 tmpfs /run\n\
                 mkdir /run/selfheal\n\
                 mount -t tmpfs -o mode=0777 tmpfs /run/selfheal\n\
                 mount -t tmpfs -o ro,mode=0555 tmpfs /sys/fs/bpf\n\
                 stat -c 'emptyDir: %a %U' /run/selfheal >&2";
    eprintln!("the manifest's helper: {args:?}, /run/selfheal: {volume}");
    let h = tests::HelperInOwnMounts::start(
        setup,
        &args,
        scratch.join("helper.log"),
        std::time::Duration::from_secs(60),
    );
    let log = h.log_text();
    eprintln!("the helper's log:\n{log}");
    assert!(log.contains("emptyDir: 777 root"), "{log}");
    let dir = tests::pinned_by(&h);
    assert!(dir.starts_with("/run/selfheal/bpf/iter-"), "{dir}");
    let ids = tests::pins_work(&h, &dir);
    let took = tests::pins_go_with(h, &ids, std::time::Duration::from_secs(20));
    eprintln!("pins in {dir} work (programs {ids:?}); gone {took:?} after the helper stopped");
}
