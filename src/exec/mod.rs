//! The per-rank executor: [`loader::Loader`] yields each step's batch; [`cgroup`] enforces the
//! per-rank CPU budget; [`exchange`] moves decoded tensors between ranks.

pub mod cgroup;
pub mod exchange;
pub mod loader;
