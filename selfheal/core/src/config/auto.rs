//! The `[auto]` section: labelled containers and named units watched
//! without an `[[agent]]` table, and the thresholds, healing and proof
//! settings they share (each table read as an agent's is).

use super::{
    AutoConfig, ConfigError, HealConfig, ProofConfig, Thresholds,
    agent::{heal, proof, thresholds, unit_name},
    walk::Fields,
};

/// What every `[auto]` agent's name starts with; a configured agent's
/// may not.
pub const PREFIX: &str = "auto.";

const AUTO_KEYS: &[&str] = &["containers", "units", "thresholds", "heal", "proof"];

/// The `[auto]` table `a`.
pub(super) fn auto(a: &Fields<'_, '_>) -> Result<AutoConfig, ConfigError> {
    a.only(AUTO_KEYS)?;
    let mut units: Vec<String> = Vec::new();
    if let Some((names, span)) = a.strings("units")? {
        for name in names {
            let unit = unit_name(&name).map_err(|e| a.key_error("units", span.clone(), e))?;
            if units.contains(&unit) {
                return Err(a.key_error("units", span, format!("{unit:?} is named twice")));
            }
            units.push(unit);
        }
    }
    Ok(AutoConfig {
        containers: a.boolean("containers")?.unwrap_or(false),
        units,
        thresholds: match a.table("thresholds", "auto thresholds".into())? {
            Some(t) => thresholds(&t)?,
            None => Thresholds::default(),
        },
        heal: match a.table("heal", "auto heal".into())? {
            Some(h) => heal(&h)?,
            None => HealConfig::default(),
        },
        proof: match a.table("proof", "auto proof".into())? {
            Some(p) => proof(&p)?,
            None => ProofConfig::default(),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::{path::Path, time::Duration};

    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("c.toml"))
    }

    #[test]
    fn auto_alone_is_a_config_and_its_tables_read_as_an_agents() {
        let c = parse(
            "[auto]\ncontainers = true\nunits = [\"sol\", \"x.service\"]\n\
             [auto.thresholds]\nsuspect_after = \"2s\"\n[auto.heal]\nbackoff = \"1s\"\n\
             [auto.proof]\ncount = 2\n",
        )
        .unwrap();
        assert!(c.agents.is_empty());
        assert!(c.auto.containers && c.auto.is_on());
        assert_eq!(c.auto.units, ["sol.service", "x.service"]);
        assert_eq!(c.auto.thresholds.suspect_after, Duration::from_secs(2));
        assert_eq!(
            c.auto.thresholds.dead_probes,
            Thresholds::default().dead_probes
        );
        assert_eq!(c.auto.heal.backoff, Duration::from_secs(1));
        assert!(c.auto.heal.sockets && !c.auto.heal.signal);
        assert_eq!(c.auto.proof.count, 2);
        let off = parse("[[agent]]\nname = \"a\"\nmatch = { pid = 1 }\n").unwrap();
        assert_eq!(off.auto, AutoConfig::default());
        assert!(!off.auto.is_on());
    }

    #[test]
    fn key_list_is_the_fields() {
        crate::config::walk::assert_keys_are_fields(
            &format!("{:?}", AutoConfig::default()),
            AUTO_KEYS,
            &[],
        );
    }
}
