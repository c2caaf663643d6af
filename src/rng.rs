//! A small deterministic random stream (SplitMix64) for generators and synthetic workloads:
//! the same seed gives the same numbers on every machine and rank.

use crate::sampler::splitmix64;

/// SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let state = self.0;
        self.0 = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix64(state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An index drawn with the given weights.
    pub fn pick(&mut self, weights: impl Iterator<Item = f64> + Clone) -> usize {
        let total: f64 = weights.clone().sum();
        let mut x = self.uniform() * total;
        let mut last = 0;
        for (i, w) in weights.enumerate() {
            last = i;
            if x < w {
                return i;
            }
            x -= w;
        }
        last
    }

    /// Log-normal with this median and log-space sigma, clamped to `[min, max]`.
    pub fn lognormal(&mut self, median: f64, sigma: f64, min: f64, max: f64) -> f64 {
        (median.ln() + sigma * self.normal()).exp().clamp(min, max)
    }
}
