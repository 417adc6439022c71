//! The client's side of the helper protocol: `Response::parse` on any line a
//! (broken, old, newer or hostile) helper may send, then the typed results
//! the client reads out of it (`hello`, `watch`, `unwatch`,
//! `ebpf_snapshot`), never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use selfheal_core::protocol::{
    HelloResult, Response, SnapshotWire, UnwatchResult, WatchResult, filter_snapshot,
};

fuzz_target!(|data: &[u8]| {
    let Ok(response) = Response::parse(data) else {
        return;
    };
    let _ = response.to_line();
    let Some(result) = response.result else {
        return;
    };
    let _ = serde_json::from_value::<HelloResult>(result.clone());
    let _ = serde_json::from_value::<WatchResult>(result.clone());
    let _ = serde_json::from_value::<UnwatchResult>(result.clone());
    if let Ok(wire) = serde_json::from_value::<SnapshotWire>(result)
        && let Ok(snapshot) = wire.into_snapshot()
    {
        let mut pids: Vec<u32> = snapshot.blocked.iter().map(|b| b.tgid).collect();
        pids.sort_unstable();
        pids.dedup();
        pids.truncate(pids.len() / 2);
        let _ = serde_json::to_string(&filter_snapshot(snapshot, &pids));
    }
});
