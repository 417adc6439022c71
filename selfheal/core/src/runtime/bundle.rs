//! containerd's OCI bundles, parsed: the identity in a task's `config.json`
//! ([`parse_config`]). Pure and fuzzed; finding and reading the bundles is
//! the edge's (`selfheal::runtime::bundle`).
//!
//! **Whose words.** A bundle's annotations come from whoever made the
//! task. For a pod's container that is containerd's CRI, but not only: the
//! CRI first copies in the annotations of the pod (and of the container)
//! that the runtime handler's `pod_annotations` (`container_annotations`)
//! lets through, which the pod's author writes, and only then writes its
//! own keys over them (`DefaultCRIAnnotations`, containerd
//! `internal/cri/annotations`): `io.kubernetes.cri.container-type`,
//! `…sandbox-id`, `…sandbox-namespace`, `…sandbox-uid`, `…sandbox-name`,
//! and for a container (not the sandbox) `…container-name` and
//! `…image-name`. So a bundle with `io.kubernetes.cri.container-type` is
//! the CRI's, and only those keys are its word: the pod author's keys
//! (`io.kubernetes.pod.name`, `app=…`) are dropped, never a name, a pod or
//! a label. A bundle without it was made through containerd's own API
//! (`ctr`, `nerdctl`), by whoever holds containerd's socket, which is
//! root: its annotations are all labels.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ContainerInfo, PodClaim};

/// The key the CRI writes on every bundle it makes (`sandbox` or
/// `container`), after any pod author's.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// The keys the CRI writes on a pod's every bundle, over any pod author's.
const CRI_KEYS: &[&str] = &[
    CRI_CONTAINER_TYPE,
    "io.kubernetes.cri.sandbox-id",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-uid",
];
/// What the CRI adds for a container (not for a sandbox, whose bundle may
/// carry these keys from its pod's author).
const CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const IMAGE: &str = "io.kubernetes.cri.image-name";
/// A pod's namespace, name and uid, as the CRI writes them.
pub const CRI_POD: [&str; 3] = [
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-uid",
];

#[derive(Deserialize)]
struct Spec {
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

/// The identity in an OCI `config.json`: for a bundle the CRI made, its
/// own keys only (the container name, image and pod it wrote); for any
/// other, every annotation, and the pod its maker wrote under the CRI's
/// keys.
pub fn parse_config(id: &str, bytes: &[u8]) -> Result<ContainerInfo, String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not an OCI runtime spec: {e}"))?;
    if !value.is_object() {
        return Err("not an OCI runtime spec: not a JSON object".into());
    }
    let spec: Spec =
        serde_json::from_value(value).map_err(|e| format!("not an OCI runtime spec: {e}"))?;
    let mut labels = spec.annotations.unwrap_or_default();
    if let Some(kind) = labels.get(CRI_CONTAINER_TYPE) {
        let container = kind == "container";
        labels.retain(|k, _| {
            CRI_KEYS.contains(&k.as_str()) || (container && (k == CONTAINER_NAME || k == IMAGE))
        });
    }
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty()).cloned();
    Ok(ContainerInfo {
        id: id.to_string(),
        name: get(CONTAINER_NAME),
        image: get(IMAGE),
        pod: PodClaim::from_labels(&labels, CRI_POD),
        labels,
        init_pid: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::assert_all_rejected;

    const UID: &str = "5c1b4b8e-2f0e-4a57-9d7a-0d6a1c3e9b11";

    /// A tenant pod's container bundle as containerd's CRI writes it when
    /// the runtime handler passes pod annotations through: the pod's own
    /// annotations first, then the CRI's keys (honest: `tenant/evil-0`).
    fn tenant(kind: &str) -> String {
        format!(
            r#"{{"ociVersion":"1.0.2","annotations":{{
                "io.kubernetes.pod.namespace":"agents",
                "io.kubernetes.pod.name":"runner-1",
                "io.kubernetes.pod.uid":"0d6a1c3e-9b11-4a57-9d7a-5c1b4b8e2f0e",
                "io.kubernetes.container.name":"runner",
                "app":"runner",
                "io.kubernetes.cri.sandbox-log-directory":"/var/log/pods/x",
                "io.kubernetes.cri.container-type":"{kind}",
                "io.kubernetes.cri.sandbox-id":"{}",
                "io.kubernetes.cri.sandbox-namespace":"tenant",
                "io.kubernetes.cri.sandbox-name":"evil-0",
                "io.kubernetes.cri.sandbox-uid":"{UID}"{}}}}}"#,
            "e".repeat(64),
            if kind == "container" {
                r#","io.kubernetes.cri.container-name":"app","io.kubernetes.cri.image-name":"reg/app:1""#
            } else {
                r#","io.kubernetes.cri.container-name":"runner","io.kubernetes.cri.image-name":"reg/runner:1""#
            }
        )
    }

    /// Only the CRI's own keys of a CRI bundle are read: the pod author's
    /// `io.kubernetes.pod.*` and other annotations are neither its pod nor
    /// its labels.
    #[test]
    fn a_cri_bundle_is_read_from_the_cri_keys_only() {
        let c = parse_config("x", tenant("container").as_bytes()).unwrap();
        assert_eq!(c.name.as_deref(), Some("app"));
        assert_eq!(c.image.as_deref(), Some("reg/app:1"));
        assert_eq!(
            c.pod,
            PodClaim {
                namespace: Some("tenant".into()),
                name: Some("evil-0".into()),
                uid: Some(UID.into()),
            }
        );
        let keys: Vec<&str> = c.labels.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "io.kubernetes.cri.container-name",
                "io.kubernetes.cri.container-type",
                "io.kubernetes.cri.image-name",
                "io.kubernetes.cri.sandbox-id",
                "io.kubernetes.cri.sandbox-name",
                "io.kubernetes.cri.sandbox-namespace",
                "io.kubernetes.cri.sandbox-uid",
            ]
        );
        // A sandbox's bundle gets no container name or image from the CRI:
        // the ones there are its author's.
        let s = parse_config("x", tenant("sandbox").as_bytes()).unwrap();
        assert_eq!((s.name, s.image), (None, None));
        assert_eq!(s.pod.name.as_deref(), Some("evil-0"));
        assert_eq!(s.labels.len(), 5, "{:?}", s.labels);
    }

    /// A bundle made through containerd's own API (`ctr --label`, root's):
    /// every annotation is a label, and the pod is what its maker wrote
    /// under the CRI's keys (never `io.kubernetes.pod.*`).
    #[test]
    fn annotations() {
        let c = parse_config(
            "x",
            br#"{"ociVersion":"1.0.2","annotations":{"io.kubernetes.cri.container-name":"runner","io.kubernetes.pod.name":"runner-0","io.kubernetes.cri.sandbox-name":"runner-1","io.kubernetes.cri.image-name":"reg/runner:1"}}"#,
        )
        .unwrap();
        assert_eq!(c.name.as_deref(), Some("runner"));
        assert_eq!(c.image.as_deref(), Some("reg/runner:1"));
        assert_eq!(c.pod.name.as_deref(), Some("runner-1"));
        assert_eq!(c.labels.len(), 4);
        assert!(parse_config("x", b"{}").unwrap().labels.is_empty());
        assert!(parse_config("x", b"{}").unwrap().pod.is_empty());
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
