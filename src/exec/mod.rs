//! The per-rank executor: [`loader::Loader`] yields each step's batch; [`cgroup`] enforces the
//! per-rank CPU budget; [`exchange`] moves decoded tensors between ranks and [`links`] measures
//! what that costs; [`emulated`] is the protocol's emulated accelerator.

pub mod cgroup;
pub(crate) mod driver;
pub mod emulated;
pub mod exchange;
mod fault;
pub mod fingerprint;
pub mod links;
pub mod loader;
pub mod replica;
pub(crate) mod sample_meta;
pub mod state;
