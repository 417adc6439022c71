//! The state file as any bytes, decoded as `check` decodes `state.json`
//! (`selfheal_core::state::decode`): as a JSON value and as `check`'s real
//! `History`. Bad content must be an error that says what is wrong, never a
//! panic: its words start as `check` words them after the file's name
//! (`is corrupt (…)`, `is from a newer selfheal (…)`, `does not fit this
//! build's state (…)`). A history that decodes, saved again as the store
//! saves it, decodes to the same history and save time (nothing lost). It
//! is then used as `check` uses it — by the judge and the healing ladder
//! (recording the steps it takes), with fixed evidence of a wedged agent —
//! and must not make them panic either (its times and counters are outside
//! input too), and every decision keeps the ladder's promises
//! (`selfheal_fuzz::check_decision`). Reading the file, setting
//! a bad one aside and saving are the store's, tested in the store's area.

#![no_main]

use std::{path::Path, sync::OnceLock};

use libfuzzer_sys::fuzz_target;
use selfheal_core::{
    config::{AgentConfig, Config},
    history::History,
    judge, ladder,
    state::{EnvelopeOut, FORMAT_VERSION, decode},
};
use selfheal_fuzz::{check_decision, report, wedged};

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

/// What a decoding error may say, after the file's name.
const ERROR_WORDS: [&str; 3] = [
    "is corrupt (",
    "is from a newer selfheal (",
    "does not fit this build's state (",
];

fuzz_target!(|data: &[u8]| {
    let _ = decode::<serde_json::Value>(data);
    let (history, saved) = match decode::<History>(data) {
        Ok(decoded) => decoded,
        Err(e) => {
            assert!(
                ERROR_WORDS.iter().any(|w| e.starts_with(w)),
                "an error that does not say what is wrong: {e:?}"
            );
            return;
        }
    };
    // Saved again as the store saves it, it reads back whole: nothing lost,
    // nothing changed.
    let saved_unix_ms = saved.unwrap_or(0);
    let again = serde_json::to_vec(&EnvelopeOut {
        version: FORMAT_VERSION,
        saved_unix_ms,
        data: &history,
    })
    .expect("a decoded history serializes");
    match decode::<History>(&again) {
        Ok((back, back_saved)) => {
            assert!(back == history, "the history changed in its round trip");
            assert_eq!(back_saved, Some(saved_unix_ms));
        }
        Err(e) => panic!("a decoded history, saved again, does not decode: {e}"),
    }
    let agent = agent();
    let report = report();
    for record in history.agents.values() {
        for now_ms in NOWS {
            let (judgement, _next) = judge::judge(agent, &report, &[], &record.judge, now_ms);
            for j in [&judgement, &wedged()] {
                let mut heal = record.heal.clone();
                let decision = ladder::decide(&agent.heal, j, &report, &mut heal, now_ms);
                check_decision(&agent.heal, j, &record.heal, &heal, &decision, now_ms);
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
