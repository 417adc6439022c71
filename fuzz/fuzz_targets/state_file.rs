//! The state file as any bytes, decoded as `check` decodes `state.json`
//! (`selfheal_core::state::decode`): as a JSON value and as `check`'s real
//! `History`. Bad content must be an error that says what is wrong, never a
//! panic. A history that does decode is then used as `check` uses it — by
//! the judge and the healing ladder (recording the steps it takes), with
//! fixed evidence of a wedged agent — and must not make them panic either:
//! its times and counters are outside input too. Reading the file, setting
//! a bad one aside and saving are the store's, tested in the store's area.

#![no_main]

use std::{path::Path, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    config::{AgentConfig, Config},
    history::History,
    judge, ladder,
    state::decode,
};
use selfheal_fuzz::{report, wedged};

/// An agent whose ladder may climb every rung.
const CONFIG: &str = r#"
[[agent]]
name = "sol"
match = { pid = 100 }
upstream = [{ role = "control", addr = "10.0.0.1:7443" }]
heal = { signal = true, restart = ["systemctl", "restart", "sol.service"] }
"#;

/// `CLOCK_BOOTTIME` ms the judge and ladder are run at: just booted, and a
/// week up.
const NOWS: [u64; 2] = [1_000, 604_800_000];

/// The agent of [`CONFIG`], parsed once.
fn agent() -> &'static AgentConfig {
    static AGENT: OnceLock<AgentConfig> = OnceLock::new();
    AGENT.get_or_init(|| {
        let config = Config::parse(CONFIG, Path::new("/fuzz.toml")).expect("fixture config");
        config.agents[0].clone()
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = decode::<serde_json::Value>(data);
    let Ok((history, _saved)) = decode::<History>(data) else {
        return;
    };
    let agent = agent();
    let report = report();
    for record in history.agents.values() {
        for now_ms in NOWS {
            let (judgement, _next) = judge::judge(agent, &report, &[], &record.judge, now_ms);
            for j in [&judgement, &wedged()] {
                let mut heal = record.heal.clone();
                let decision = ladder::decide(&agent.heal, j, &report, &mut heal, now_ms);
                let _ = serde_json::to_string(&decision);
                // `check` records each step it takes.
                if let ladder::Decision::Act { steps } = decision {
                    for step in steps {
                        heal.record(now_ms, step, true, String::new());
                    }
                }
            }
        }
    }
});
