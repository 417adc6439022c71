//! The client's side of the helper protocol: `Response::parse` on any line a
//! (broken, old, newer or hostile) helper may send, then the typed results
//! the client reads out of it (`hello`, `watch`, `unwatch`,
//! `ebpf_snapshot`), never a panic. Asserted beyond that:
//!
//! - a response that parses is well formed (this protocol version, exactly
//!   one of `result` and `error`), and written back as a line it parses to
//!   the same response (`selfheal_fuzz::same_json` for its result);
//! - each typed result the client reads survives its own round trip, and
//!   reads the same out of the written-back line;
//! - a snapshot filtered to some pids keeps exactly the blocked readers and
//!   sockets of those pids and refuses no other pid; filtered to all its
//!   pids it keeps everything; filtering again changes nothing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use selfheal_core::protocol::{
    HelloResult, PROTOCOL_VERSION, Response, SnapshotWire, UnwatchResult, WatchResult,
    filter_snapshot,
};
use selfheal_fuzz::same_json;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// A typed result read out of `result` and out of `again` (the same
/// response written back and parsed) is the same, and survives its own
/// round trip.
fn typed<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(
    result: &Value,
    again: &Value,
) {
    let Ok(read) = serde_json::from_value::<T>(result.clone()) else {
        return;
    };
    let reread = serde_json::from_value::<T>(again.clone());
    assert!(
        reread.as_ref().is_ok_and(|r| *r == read),
        "{read:?} read back as {reread:?}"
    );
    let value = serde_json::to_value(&read).expect("a typed result serializes");
    let back = serde_json::from_value::<T>(value);
    assert!(
        back.as_ref().is_ok_and(|b| *b == read),
        "{read:?} round-tripped to {back:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(response) = Response::parse(data) else {
        return;
    };
    assert_eq!(response.v, PROTOCOL_VERSION);
    assert!(response.ok == response.result.is_some() && response.ok != response.error.is_some());
    let line = response.to_line();
    assert_eq!(line.last(), Some(&b'\n'), "a line ends with a newline");
    assert_eq!(
        line.iter().filter(|b| **b == b'\n').count(),
        1,
        "one line: {:?}",
        String::from_utf8_lossy(&line)
    );
    let again = Response::parse(&line)
        .unwrap_or_else(|e| panic!("{response:?} written back does not parse: {e}"));
    assert_eq!(
        (again.v, again.id, again.ok, &again.error),
        (response.v, response.id, response.ok, &response.error)
    );
    let Some(result) = response.result else {
        return;
    };
    let reread = again.result.expect("the result written back");
    assert!(
        same_json(&result, &reread),
        "{result} read back as {reread}"
    );

    typed::<HelloResult>(&result, &reread);
    typed::<WatchResult>(&result, &reread);
    typed::<UnwatchResult>(&result, &reread);
    if let Ok(wire) = serde_json::from_value::<SnapshotWire>(result)
        && let Ok(snapshot) = wire.into_snapshot()
    {
        let mut all: Vec<u32> = snapshot.blocked.iter().map(|b| b.tgid).collect();
        all.extend(snapshot.sockets.iter().map(|s| s.tgid));
        all.sort_unstable();
        all.dedup();
        let pids: Vec<u32> = all.iter().copied().take(all.len() / 2).collect();
        let kept = filter_snapshot(snapshot.clone(), &pids);
        let of = |pid: u32| pids.binary_search(&pid).is_ok();
        assert_eq!(
            kept.blocked.len(),
            snapshot.blocked.iter().filter(|b| of(b.tgid)).count(),
            "not exactly the blocked readers of those pids"
        );
        assert!(
            kept.blocked.iter().all(|b| of(b.tgid)),
            "another pid's reader kept"
        );
        assert_eq!(
            kept.sockets.len(),
            snapshot.sockets.iter().filter(|s| of(s.tgid)).count(),
            "not exactly the sockets of those pids"
        );
        assert!(
            kept.sockets.iter().all(|s| of(s.tgid)),
            "another pid's socket kept"
        );
        assert!(kept.refused.iter().all(|p| of(*p)) && kept.shares.is_empty());
        let whole = filter_snapshot(snapshot.clone(), &all);
        assert_eq!(
            (whole.blocked.len(), whole.sockets.len()),
            (snapshot.blocked.len(), snapshot.sockets.len()),
            "filtered to all its pids, the snapshot lost some"
        );
        let twice = filter_snapshot(kept.clone(), &pids);
        assert!(twice == kept, "filtering twice changed it");
    }
});
