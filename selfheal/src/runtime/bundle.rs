//! containerd's tasks, from their OCI bundles: `config.json` under
//! `STATE/io.containerd.runtime.v2.task/NAMESPACE/ID/`, whose annotations
//! hold what the kubelet (through CRI) or `ctr --label/--annotation` gave
//! the container: `io.kubernetes.pod.name`, `…pod.namespace`, `…pod.uid`,
//! `io.kubernetes.cri.sandbox-name`, `…container-name`, `…image-name`.
//!
//! Files on the runtime's state tmpfs, read without the containerd API
//! (gRPC): what a node agent needs is there, read-only, and a containerd
//! that hangs cannot hold the check (ARCHITECTURE.md says more). The parser
//! ([`parse_config`]) is pure and fuzzed.

use std::{collections::BTreeMap, io::Read as _, path::Path};

use serde::Deserialize;

use super::ContainerInfo;

/// Largest `config.json` read (an OCI spec is a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Most namespaces looked in (`default`, `k8s.io`, `moby`, …).
const MAX_NAMESPACES: usize = 64;

const CONTAINER_NAME: &[&str] = &[
    "io.kubernetes.container.name",
    "io.kubernetes.cri.container-name",
];
const IMAGE: &[&str] = &["io.kubernetes.cri.image-name"];

/// The containers among `ids` whose bundles are under `state`, and what
/// could not be read (each with whether the state directory is absent).
pub fn read(state: &Path, ids: &[&str]) -> (Vec<ContainerInfo>, Vec<(String, bool)>) {
    let tasks = state.join("io.containerd.runtime.v2.task");
    let namespaces: Vec<_> = match std::fs::read_dir(&tasks) {
        Ok(dir) => dir
            .filter_map(|e| e.ok())
            .take(MAX_NAMESPACES)
            .map(|e| e.path())
            .collect(),
        Err(e) => {
            let absent = e.kind() == std::io::ErrorKind::NotFound;
            return (
                Vec::new(),
                vec![(format!("cannot read {}: {e}", tasks.display()), absent)],
            );
        }
    };
    let mut found = Vec::new();
    let mut errors = Vec::new();
    for id in ids {
        // Never a path out of the state directory: ids are 64 hex digits.
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        for ns in &namespaces {
            let path = ns.join(id).join("config.json");
            let mut bytes = Vec::new();
            match std::fs::File::open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => errors.push((format!("cannot read {}: {e}", path.display()), false)),
                Ok(f) => match f.take(MAX_CONFIG_BYTES).read_to_end(&mut bytes) {
                    Err(e) => errors.push((format!("cannot read {}: {e}", path.display()), false)),
                    Ok(_) => match parse_config(id, &bytes) {
                        Ok(mut c) => {
                            c.init_pid = std::fs::read_to_string(ns.join(id).join("init.pid"))
                                .ok()
                                .and_then(|s| s.trim().parse().ok())
                                .filter(|p| *p > 0);
                            found.push(c);
                        }
                        Err(e) => errors.push((format!("{}: {e}", path.display()), false)),
                    },
                },
            }
            break;
        }
    }
    (found, errors)
}

#[derive(Deserialize)]
struct Spec {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

/// The identity in an OCI `config.json`: its annotations, the container
/// name and image the kubelet's carry.
pub fn parse_config(id: &str, bytes: &[u8]) -> Result<ContainerInfo, String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not an OCI runtime spec: {e}"))?;
    if !value.is_object() {
        return Err("not an OCI runtime spec: not a JSON object".into());
    }
    let spec: Spec =
        serde_json::from_value(value).map_err(|e| format!("not an OCI runtime spec: {e}"))?;
    let labels = spec.annotations.unwrap_or_default();
    let get = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| labels.get(*k))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    Ok(ContainerInfo {
        id: id.to_string(),
        name: get(CONTAINER_NAME),
        image: get(IMAGE),
        labels,
        init_pid: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations() {
        let c = parse_config(
            "x",
            br#"{"ociVersion":"1.0.2","annotations":{"io.kubernetes.cri.container-name":"runner","io.kubernetes.pod.name":"runner-0","io.kubernetes.cri.image-name":"reg/runner:1"}}"#,
        )
        .unwrap();
        assert_eq!(c.name.as_deref(), Some("runner"));
        assert_eq!(c.image.as_deref(), Some("reg/runner:1"));
        assert_eq!(c.labels.len(), 3);
        assert!(parse_config("x", b"{}").unwrap().labels.is_empty());
        for bad in [
            &b""[..],
            b"[]",
            b"{\"annotations\":5}",
            b"{\"annotations\":{\"a\":1}}",
        ] {
            assert!(
                parse_config("x", bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn absent_state() {
        let (found, errors) = read(Path::new("/nonexistent/selfheal"), &[&"a".repeat(64)]);
        assert!(found.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].1, "{errors:?}");
    }
}
