//! containerd's OCI bundles, parsed: the identity in a task's `config.json`
//! ([`parse_config`]): its annotations, and the container name and image
//! the kubelet's carry. Pure and fuzzed; finding and reading the bundles is
//! the edge's (`selfheal::runtime::bundle`).

use std::collections::BTreeMap;

use serde::Deserialize;

use super::ContainerInfo;

const CONTAINER_NAME: &[&str] = &[
    "io.kubernetes.container.name",
    "io.kubernetes.cri.container-name",
];
const IMAGE: &[&str] = &["io.kubernetes.cri.image-name"];

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
    use crate::fixture::assert_all_rejected;

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
        assert_all_rejected(
            &[
                b"",
                b"[]",
                b"{\"annotations\":5}",
                b"{\"annotations\":{\"a\":1}}",
            ],
            |bad| parse_config("x", bad),
        );
    }
}
