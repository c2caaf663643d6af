//! Cost models the planner predicts with. Plain Rust, deterministic: every rank feeds the same
//! all-gathered observations in the same order and so holds bit-identical parameters.
//!
//! - [`accel`]: accelerator seconds of a rank's share, `c0 + Σ (a·tokens + b·tokens²)`, fitted
//!   online from measured step times.
//! - [`lsq`]: the small least-squares solves both fits use.
//! - Decode seconds live with the decoder (`decode::cost`); transfer seconds with the collectives.

pub mod accel;
pub mod lsq;
