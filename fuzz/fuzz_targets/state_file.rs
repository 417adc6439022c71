//! The state file as any bytes: written to `state.json` in a temp dir, then
//! `StateStore::load` as a JSON value and as `check`'s real `History`. A
//! corrupt file must be set aside with a note, never a panic. A history
//! that does load is then used as `check` uses it — by the judge and the
//! healing ladder (recording the steps it takes), with fixed evidence of a
//! wedged agent — and must not make them panic either: its times and
//! counters are outside input too.
//!
//! One temp dir (on tmpfs when there is one) and one open store per process.

#![no_main]

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use libfuzzer_sys::fuzz_target;
use selfheal::{
    check::History,
    judge, ladder,
    store::{STATE_FILE, StateStore},
};
use selfheal_core::config::{AgentConfig, Config};
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

const DIR_PREFIX: &str = "selfheal-fuzz-state-";

/// Removes the dirs of fuzzing processes that are gone (libFuzzer exits
/// without running destructors, so each run leaves its dir behind).
fn remove_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

struct Fixture {
    store: StateStore,
    path: PathBuf,
    agent: AgentConfig,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        remove_stale(&base);
        let dir = base.join(format!("{DIR_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = StateStore::open(&dir).expect("open the fuzz state dir");
        let path = store.path();
        assert!(path.ends_with(STATE_FILE));
        let config = Config::parse(CONFIG, Path::new("/fuzz.toml")).expect("fixture config");
        Fixture {
            store,
            path,
            agent: config.agents[0].clone(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    // A bad file is moved aside by each load: write it again for the next.
    std::fs::write(&f.path, data).expect("write state.json");
    let _ = f.store.load::<serde_json::Value>();
    std::fs::write(&f.path, data).expect("write state.json");
    let loaded = f.store.load::<History>();
    if loaded.note.is_some() {
        return;
    }
    let history = loaded.value;
    let report = report();
    for record in history.agents.values() {
        for now_ms in NOWS {
            let (judgement, _next) = judge::judge(&f.agent, &report, &[], &record.judge, now_ms);
            for j in [&judgement, &wedged()] {
                let mut heal = record.heal.clone();
                let decision = ladder::decide(&f.agent.heal, j, &report, &mut heal, now_ms);
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
