//! The `[auto]` agents of one check: what the table is read for before the
//! containers are known ([`reading`]), and the agents found in it
//! ([`agents`]): the core's `selfheal_core::auto` over the identities the
//! runtimes gave the table's containers.

use selfheal_core::config::{AgentConfig, Config};

use super::ProcessTable;

/// The rules the process table is read and the runtimes asked for, beside
/// the configured agents' ([`selfheal_core::auto::reading`]).
pub fn reading(config: &Config) -> Vec<AgentConfig> {
    selfheal_core::auto::reading(&config.auto, &config.agents)
}

/// The `[auto]` agents in `table` (read for [`reading`]'s rules, its
/// inventory from the runtimes): each labelled container its processes
/// are in, as the runtimes and the identity rules name it, and each unit.
pub fn agents(config: &Config, table: &ProcessTable) -> Vec<AgentConfig> {
    let identities = if config.auto.containers {
        let pids: Vec<u32> = table.entries().map(|e| e.pid).collect();
        table.identities(&pids)
    } else {
        Vec::new()
    };
    selfheal_core::auto::agents(&config.auto, &identities, &config.agents)
}
