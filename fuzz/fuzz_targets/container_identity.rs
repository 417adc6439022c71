//! The container identity parsers on any input: `/proc/PID/cgroup` text and
//! cgroup paths (containers, and units with their managers), a Docker/Podman `/containers/json` answer (HTTP and JSON),
//! an OCI `config.json`'s annotations, and the glob of the `container`,
//! `image`, `pod` and `namespace` match keys. Never a panic; every id found
//! is 64 hex digits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    cgroup::{self, containers_in_path, containers_in_proc_cgroup},
    runtime::{self, Glob, bundle, docker},
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for c in containers_in_proc_cgroup(&text)
        .into_iter()
        .chain(containers_in_path(&text))
    {
        assert_eq!(c.id.len(), 64, "{c:?}");
        assert!(c.id.bytes().all(|b| b.is_ascii_hexdigit()), "{c:?}");
        if let Some(uid) = &c.pod_uid {
            // A UUID, or a static pod's 32-hex hash.
            assert!(matches!(uid.len(), 32 | 36), "{c:?}");
        }
    }
    // Units and their managers, from the root and from PID 1's path.
    let root = cgroup::manager_root(text.lines().next());
    for path in [&*text, text.lines().last().unwrap_or("")] {
        for r in ["/", root.as_str()] {
            if let Some(place) = cgroup::unit_of(path, r) {
                assert!(path.contains(place.unit), "{place:?}");
            }
        }
    }
    // An HTTP answer, or a bare body.
    let body = docker::parse_response(data).unwrap_or(data);
    if let Ok(list) = docker::parse_list(body) {
        for c in list {
            assert_eq!(c.id.len(), 64);
            assert!(c.name.is_none_or(|n| !n.starts_with('/')));
        }
    }
    let _ = docker::parse_state(body);
    let _ = docker::parse_answer(data, &[200, 204]);
    if let Ok(c) = bundle::parse_config(&"a".repeat(64), data) {
        // Only the CRI's pod, and taken only where the cgroup's uid is its.
        let _ = runtime::confirm_pod(&c.pod, text.lines().next());
    }
    // The first line as a pattern over the rest.
    if let Some((pattern, rest)) = text.split_once('\n') {
        let _ = Glob(pattern.to_string()).matches(rest);
    }
});
