//! The emulated accelerator of the benchmark protocol (`shared/bench/PROTOCOL.md`, "Emulated
//! accelerator"): where no accelerator exists, a rank's training step is a sleep whose length a
//! hidden model profile gives for the batch actually delivered,
//!
//! ```text
//! t = (c0 + Σ_i (a · tokens_i + b · tokens_i²)) × exp(σ · z(seed, step, rank))
//! ```
//!
//! with `z` a standard normal drawn from SplitMix64 exactly as the protocol spells it, so two
//! loaders following the protocol emulate identical step times. The planner never reads the
//! profile; it learns it from measured step times.
//!
//! ```
//! use datahelix::emu::Profile;
//!
//! let p: Profile = "0.05,2e-6,1e-11,0.1".parse().unwrap();
//! let t = p.step_seconds(&[1000, 5000], 7, 3, 1);
//! assert!(t > 0.0);
//! assert_eq!(t, p.step_seconds(&[1000, 5000], 7, 3, 1)); // same (seed, step, rank): same time
//! ```

use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::metrics::AccelTerms;
use crate::sampler::splitmix64;

/// A model profile `{c0, a, b, sigma}` in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Per-step constant.
    pub c0: f64,
    /// Seconds per token.
    pub a: f64,
    /// Seconds per token².
    pub b: f64,
    /// Log-normal noise.
    pub sigma: f64,
}

impl FromStr for Profile {
    type Err = String;

    /// Parses `c0,a,b,sigma`.
    fn from_str(s: &str) -> Result<Profile, String> {
        let v: Vec<f64> =
            s.split(',').map(|x| x.trim().parse::<f64>()).collect::<Result<_, _>>().map_err(|e| {
                format!("profile {s:?}: {e}; expected c0,a,b,sigma in seconds, e.g. 0.05,2e-6,1e-11,0.05")
            })?;
        match v[..] {
            [c0, a, b, sigma] if [c0, a, b, sigma].iter().all(|x| x.is_finite() && *x >= 0.0) => {
                Ok(Profile { c0, a, b, sigma })
            }
            _ => Err(format!("profile {s:?}: expected four non-negative numbers c0,a,b,sigma")),
        }
    }
}

/// The protocol's standard normal for (seed, step, rank).
pub fn z(seed: u64, step: u64, rank: u64) -> f64 {
    let s = splitmix64(splitmix64(splitmix64(seed) ^ step) ^ rank);
    let u1 = (splitmix64(s) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    let u2 = (splitmix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15)) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    (-2.0 * (1.0 - u1).ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

impl Profile {
    /// Noise-free seconds one sample adds.
    pub fn sample_seconds(&self, tokens: u64) -> f64 {
        let t = tokens as f64;
        self.a * t + self.b * t * t
    }

    /// The emulated step seconds of `rank` at `step` for the delivered samples' tokens.
    pub fn step_seconds(&self, tokens: &[u64], seed: u64, step: u64, rank: u64) -> f64 {
        let t = self.step_terms(tokens, seed, step, rank);
        (t.fixed_s + t.work_s) * t.noise
    }

    /// The terms of [`Profile::step_seconds`]: `c0`, the samples' noise-free seconds, the noise.
    pub fn step_terms(&self, tokens: &[u64], seed: u64, step: u64, rank: u64) -> AccelTerms {
        AccelTerms {
            fixed_s: self.c0,
            work_s: tokens.iter().map(|&t| self.sample_seconds(t)).sum(),
            noise: (self.sigma * z(seed, step, rank)).exp(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z_is_standard_normal_ish_and_deterministic() {
        let zs: Vec<f64> = (0..20_000).map(|s| z(42, s, 3)).collect();
        let mean = zs.iter().sum::<f64>() / zs.len() as f64;
        let var = zs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / zs.len() as f64;
        assert!(mean.abs() < 0.03, "mean {mean}");
        assert!((var - 1.0).abs() < 0.05, "variance {var}");
        assert_eq!(z(1, 2, 3), z(1, 2, 3));
        assert_ne!(z(1, 2, 3), z(1, 2, 4));
    }

    #[test]
    fn profiles_parse_or_say_why() {
        assert!("0.1,1e-6,0,0".parse::<Profile>().is_ok());
        assert!("0.1,1e-6,0".parse::<Profile>().unwrap_err().contains("four"));
        assert!("a,b,c,d".parse::<Profile>().unwrap_err().contains("c0,a,b,sigma"));
        assert!("0.1,-1,0,0".parse::<Profile>().is_err());
    }
}
