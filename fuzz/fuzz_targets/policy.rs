//! The helper's policy file parser on any text: a policy or an error naming
//! file, line and key, never a panic.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    policy::{Policy, Target},
    protocol::Caller,
};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Policy::parse(&text, Path::new("/etc/selfheal/helper.toml")) {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(policy) => {
            let _ = policy.describe();
            // The rules over what it granted (pure).
            for uid in [0, 1, 1000, 1001, u32::MAX] {
                let caller = Caller {
                    uid,
                    gid: uid,
                    pid: 4242,
                };
                let target = Target {
                    pid: 50,
                    uids: [1001, 1001, 1002],
                    kernel_thread: false,
                };
                let _ = policy.may_reach(uid, 1001);
                let _ = policy.check_query(&caller, &target);
                let _ = policy.check_act(&caller, &target, 7);
            }
        }
    }
});
