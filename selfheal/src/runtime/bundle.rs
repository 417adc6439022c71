//! containerd's tasks, from their OCI bundles: `config.json` under
//! `STATE/io.containerd.runtime.v2.task/NAMESPACE/ID/`, whose annotations
//! hold what containerd's CRI (`io.kubernetes.cri.sandbox-name`,
//! `…sandbox-namespace`, `…sandbox-uid`, `…container-name`, `…image-name`)
//! or `ctr --label/--annotation` gave the container. Of a bundle the CRI
//! made only the CRI's own keys are read: the rest may be its pod's
//! author's ([`selfheal_core::runtime::bundle`] says why).
//!
//! Files on the runtime's state tmpfs, read without the containerd API
//! (gRPC): what a node agent needs is there, read-only, and a containerd
//! that hangs cannot hold the check (ARCHITECTURE.md says more). The parser
//! of a bundle's `config.json` is pure, in
//! [`selfheal_core::runtime::bundle`], and fuzzed.

use std::{io::Read as _, path::Path};

use selfheal_core::runtime::{ContainerInfo, bundle::parse_config};

/// Largest `config.json` read (an OCI spec is a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;
/// Most namespaces looked in (`default`, `k8s.io`, `moby`, …).
const MAX_NAMESPACES: usize = 64;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_state() {
        let (found, errors) = read(Path::new("/nonexistent/selfheal"), &[&"a".repeat(64)]);
        assert!(found.is_empty());
        assert_eq!(errors.len(), 1);
        assert!(errors[0].1, "{errors:?}");
    }
}
