//! Collective backends: the MPI backend ([`mpi::MpiWorld`], default) and the one-rank
//! [`LocalWorld`](crate::collective::LocalWorld) used when no launcher started the process.
//!
//! | backend | status |
//! |---|---|
//! | `mpi` | works: host buffers, every collective under a watchdog |
//! | `local` | works: world size 1, no launcher |
//! | `hccl` | not yet (feature-gated, see `hccl-sys`) |
//!
//! ```no_run
//! use datahelix::collective::Collective;
//! let world = datahelix::comm::init(datahelix::comm::Config::from_env()?)?;
//! let c = world.collective();
//! println!("rank {} of {}", c.rank(), c.size());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::time::Duration;

use crate::collective::{Collective, LocalWorld};

pub mod mpi;
pub mod watchdog;

/// Exit status of a job the watchdog (or a failed collective) aborted.
pub const EXIT_ABORTED: i32 = 3;

/// Default watchdog timeout: generous, so that only a dead or stuck job trips it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Default largest single MPI message (bytes); larger transfers are split.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 30;

/// Backend settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// How long a collective may wait before the job is aborted with a report.
    pub timeout: Duration,
    /// Largest MPI message in bytes (at most `i32::MAX`); larger transfers are chunked.
    pub max_message_bytes: usize,
    /// Install the SIGTERM reporter (see [`watchdog::install_sigterm_reporter`]).
    pub report_sigterm: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { timeout: DEFAULT_TIMEOUT, max_message_bytes: DEFAULT_MAX_MESSAGE, report_sigterm: true }
    }
}

/// A setting in the environment could not be used.
#[derive(Debug, thiserror::Error)]
#[error("environment variable {var}={value:?}: {what}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong and what is expected.
    pub what: &'static str,
}

impl Config {
    /// Defaults, overridden by `DATAHELIX_COLLECTIVE_TIMEOUT` (seconds, may be fractional) and
    /// `DATAHELIX_MPI_MAX_MESSAGE` (bytes).
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut c = Config::default();
        if let Ok(v) = std::env::var("DATAHELIX_COLLECTIVE_TIMEOUT") {
            let secs: f64 = v.trim().parse().map_err(|_| ConfigError {
                var: "DATAHELIX_COLLECTIVE_TIMEOUT",
                value: v.clone(),
                what: "expected seconds, e.g. 300 or 2.5",
            })?;
            if !(secs.is_finite() && secs > 0.0) {
                return Err(ConfigError {
                    var: "DATAHELIX_COLLECTIVE_TIMEOUT",
                    value: v,
                    what: "must be a positive number of seconds",
                });
            }
            c.timeout = Duration::from_secs_f64(secs);
        }
        if let Ok(v) = std::env::var("DATAHELIX_MPI_MAX_MESSAGE") {
            c.max_message_bytes =
                v.trim().parse::<usize>().ok().filter(|&n| n > 0 && n <= i32::MAX as usize).ok_or(
                    ConfigError {
                        var: "DATAHELIX_MPI_MAX_MESSAGE",
                        value: v,
                        what: "expected bytes in 1..=2147483647",
                    },
                )?;
        }
        Ok(c)
    }
}

/// Whether an MPI launcher started this process (Open MPI, MPICH/Hydra, PMIx, Slurm PMI).
pub fn launched_by_mpi() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The world this process runs in.
pub enum World {
    /// One rank, no launcher.
    Local(LocalWorld),
    /// Started by `mpirun`.
    Mpi(mpi::MpiWorld),
}

impl World {
    /// The collectives of this world.
    pub fn collective(&self) -> &dyn Collective {
        match self {
            World::Local(w) => w,
            World::Mpi(w) => w,
        }
    }
}

/// Opens the world: MPI when a launcher started the process, a one-rank local world otherwise.
pub fn init(config: Config) -> Result<World, mpi::InitError> {
    if launched_by_mpi() {
        mpi::MpiWorld::init(config).map(World::Mpi)
    } else {
        Ok(World::Local(LocalWorld::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_generous() {
        let c = Config::default();
        assert_eq!(c.timeout, Duration::from_secs(300));
        assert!(c.max_message_bytes <= i32::MAX as usize);
    }
}
