//! Collective backends: the MPI backend ([`mpi::MpiWorld`], default) and the one-rank
//! [`LocalWorld`] used when no launcher started the process.
//!
//! | backend | status |
//! |---|---|
//! | `mpi` | works: host buffers, every collective under a watchdog |
//! | `local` | works: world size 1, no launcher |
//! | `hccl` | feature `hccl`: `hccl::HcclCollective`, HCCL on ACL device buffers, MPI bootstrap (docs/hccl.md) |
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

#[cfg(feature = "hccl")]
pub mod hccl;
pub mod launcher;
pub mod mpi;
pub mod watchdog;

/// Exit status of a job the watchdog (or a failed collective) aborted.
pub const EXIT_ABORTED: i32 = 3;

/// Writes `message` and a newline to stderr in one write: a launcher that tags or merges the
/// ranks' output (`mpirun --tag-output`, a cluster's log collector) cuts a message written in
/// pieces — `eprintln!` writes each formatted piece on its own — wherever another rank's output
/// comes between them. For the last words before an abort, which someone has to read whole.
pub(crate) fn say_whole(message: &str) {
    use std::io::Write;
    let mut line = String::with_capacity(message.len() + 1);
    line.push_str(message);
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

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
            c.timeout = Duration::try_from_secs_f64(secs).map_err(|_| ConfigError {
                var: "DATAHELIX_COLLECTIVE_TIMEOUT",
                value: v.clone(),
                what: "too many seconds to be a timeout",
            })?;
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
    /// HCCL on Ascend devices (or the emulator), bootstrapped with MPI.
    #[cfg(feature = "hccl")]
    Hccl(hccl::HcclCollective),
}

impl World {
    /// The collectives of this world.
    pub fn collective(&self) -> &dyn Collective {
        match self {
            World::Local(w) => w,
            World::Mpi(w) => w,
            #[cfg(feature = "hccl")]
            World::Hccl(w) => w,
        }
    }

    /// The MPI world underneath, if any (the MPI backend, or the HCCL backend's bootstrap).
    pub fn mpi_world(&self) -> Option<&mpi::MpiWorld> {
        match self {
            World::Local(_) => None,
            World::Mpi(w) => Some(w),
            #[cfg(feature = "hccl")]
            World::Hccl(w) => w.mpi(),
        }
    }
}

/// The collective backends of `shared/CLI.md`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Host buffers over MPI (default).
    #[default]
    Mpi,
    /// HCCL on device buffers (feature `hccl`).
    Hccl,
}

impl Backend {
    /// The name on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Mpi => "mpi",
            Backend::Hccl => "hccl",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mpi" => Ok(Backend::Mpi),
            "hccl" => Ok(Backend::Hccl),
            _ => Err(format!("unknown backend {s:?}: expected mpi or hccl")),
        }
    }
}

/// A backend could not be started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The MPI backend.
    #[error(transparent)]
    Mpi(#[from] mpi::InitError),
    /// The HCCL backend.
    #[cfg(feature = "hccl")]
    #[error(transparent)]
    Hccl(#[from] hccl::InitError),
    /// This build does not contain the backend.
    #[error(
        "this build has no {0} backend: rebuild with its feature (`cargo build --features {0}`; the Python \
         package: MATURIN_PEP517_ARGS=\"--features {0}\" pip install ./python)"
    )]
    NotBuilt(&'static str),
    /// The environment says the job has more processes than the world has ranks
    /// ([`launcher::mismatch`]).
    #[error("{0}")]
    Launcher(String),
}

/// Opens the world of `backend`: for `mpi` as [`init`]; for `hccl` an HCCL world (one rank
/// without a launcher).
pub fn init_backend(config: Config, backend: Backend) -> Result<World, InitError> {
    match backend {
        Backend::Mpi => init(config),
        #[cfg(feature = "hccl")]
        Backend::Hccl => {
            let world = World::Hccl(hccl::HcclCollective::init(config)?);
            launcher::check(world.collective().size()).map_err(InitError::Launcher)?;
            Ok(world)
        }
        #[cfg(not(feature = "hccl"))]
        Backend::Hccl => Err(InitError::NotBuilt("hccl")),
    }
}

/// The world of `backend` on the ranks of `mpi` (a caller's communicator): `mpi` itself, or an
/// HCCL world bootstrapped over it. Collective over `mpi`.
pub fn over_mpi(mpi: mpi::MpiWorld, backend: Backend) -> Result<World, InitError> {
    match backend {
        Backend::Mpi => Ok(World::Mpi(mpi)),
        #[cfg(feature = "hccl")]
        Backend::Hccl => {
            let config = mpi.config().clone();
            Ok(World::Hccl(hccl::HcclCollective::over(Some(mpi), config)?))
        }
        #[cfg(not(feature = "hccl"))]
        Backend::Hccl => Err(InitError::NotBuilt("hccl")),
    }
}

/// Opens the world: MPI when a launcher started the process, a one-rank local world otherwise.
/// Refuses a world smaller than the environment says the job is (torchrun, srun without PMI:
/// [`launcher::mismatch`]).
pub fn init(config: Config) -> Result<World, InitError> {
    let world = if launched_by_mpi() {
        World::Mpi(mpi::MpiWorld::init(config)?)
    } else {
        World::Local(LocalWorld::new())
    };
    launcher::check(world.collective().size()).map_err(InitError::Launcher)?;
    Ok(world)
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
