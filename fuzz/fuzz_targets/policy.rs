//! The helper's policy file parser on any text: a policy or an error naming
//! file, line and key, never a panic. Asserted beyond that:
//!
//! - an error names the file and a line and column inside the text;
//! - a policy, written back as `[[grant]]` tables, parses to the same
//!   grants (nothing lost or invented);
//! - its rules decide as the module says: root reaches every uid, a caller
//!   its own and what it was granted, nothing else; querying a target needs
//!   every one of its uids reachable; acting needs that and never reaches
//!   pid 1, the helper itself or a kernel thread; a grant only ever adds
//!   access (the same rules under one more grant refuse nothing they
//!   allowed).

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    access::policy::{Policy, PolicyError, TargetProcess},
    protocol::Caller,
};

const PATH: &str = "/etc/selfheal/helper.toml";
const HELPER_PID: u32 = 7;

/// The policy's grants as a policy file.
fn render(policy: &Policy) -> String {
    let mut text = String::new();
    for (uid, uids) in &policy.grants {
        let list: Vec<String> = uids.iter().map(u32::to_string).collect();
        text.push_str(&format!(
            "[[grant]]\nuid = {uid}\nuids = [{}]\n",
            list.join(", ")
        ));
    }
    text
}

/// Uids worth asking about: root, the granted ones and their callers,
/// strangers.
fn uids(policy: &Policy) -> Vec<u32> {
    let mut uids = vec![0, 1, 1000, 1001, u32::MAX];
    for (caller, granted) in policy.grants.iter().take(4) {
        uids.push(*caller);
        uids.extend(granted.iter().take(4));
    }
    uids.sort_unstable();
    uids.dedup();
    uids
}

/// Asserts the rules of `policy` for every caller and target built of
/// `uids`; with `wider` (the same policy and one more grant), that it
/// allows at least as much.
fn check_rules(policy: &Policy, wider: &Policy, uids: &[u32]) {
    for &caller_uid in uids {
        let caller = Caller {
            uid: caller_uid,
            gid: caller_uid,
            pid: 4242,
        };
        for &uid in uids {
            let granted = policy
                .grants
                .get(&caller_uid)
                .is_some_and(|g| g.contains(&uid));
            let reach = policy.may_reach(caller_uid, uid);
            assert_eq!(
                reach,
                caller_uid == 0 || caller_uid == uid || granted,
                "may_reach({caller_uid}, {uid}) under {policy:?}"
            );
            assert!(
                !reach || wider.may_reach(caller_uid, uid),
                "a grant took access away"
            );
        }
        for (i, &a) in uids.iter().enumerate() {
            let b = uids[(i + 1) % uids.len()];
            for (pid, kernel_thread) in [(50, false), (1, false), (HELPER_PID, false), (51, true)] {
                let target = TargetProcess {
                    pid,
                    uids: [a, b, a],
                    kernel_thread,
                };
                let all = target.uids.iter().all(|u| policy.may_reach(caller_uid, *u));
                let query = policy.check_query(&caller, &target);
                assert_eq!(
                    query.is_ok(),
                    all,
                    "query {target:?} by {caller_uid}: {query:?}"
                );
                let act = policy.check_act(&caller, &target, HELPER_PID);
                let never = pid == 1 || pid == HELPER_PID || kernel_thread;
                assert_eq!(
                    act.is_ok(),
                    all && !never,
                    "act on {target:?} by {caller_uid}: {act:?}"
                );
                if let Err(why) = &act {
                    assert!(!why.is_empty());
                }
                assert!(
                    query.is_err() || wider.check_query(&caller, &target).is_ok(),
                    "a grant took a query away"
                );
                assert!(
                    act.is_err() || wider.check_act(&caller, &target, HELPER_PID).is_ok(),
                    "a grant took an action away"
                );
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Policy::parse(&text, Path::new(PATH)) {
        Err(PolicyError::Invalid {
            path,
            line,
            column,
            message,
        }) => {
            assert_eq!(path, Path::new(PATH));
            let lines = text.split('\n').count();
            assert!(
                (1..=lines).contains(&line) && column >= 1,
                "line {line} column {column} outside the text's {lines} lines: {message}"
            );
            assert!(!message.is_empty());
            let shown = PolicyError::Invalid {
                path,
                line,
                column,
                message,
            }
            .to_string();
            assert!(shown.starts_with(&format!("{PATH}:{line}: ")), "{shown}");
        }
        Err(e) => panic!("parsing text can only find it invalid: {e}"),
        Ok(policy) => {
            let _ = policy.describe();
            let again = Policy::parse(&render(&policy), Path::new(PATH))
                .unwrap_or_else(|e| panic!("the policy written back does not parse: {e}"));
            assert_eq!(again.grants, policy.grants, "grants lost or invented");
            let uids = uids(&policy);
            let mut wider = policy.clone();
            wider
                .grants
                .entry(uids[uids.len() / 2])
                .or_default()
                .insert(uids[uids.len() / 3]);
            check_rules(&policy, &wider, &uids);
        }
    }
});
