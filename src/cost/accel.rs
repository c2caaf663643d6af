//! The accelerator cost model: predicted step seconds of a rank's share of a batch,
//!
//! ```text
//! t = c0 + Σ_i (a · tokens_i + b · tokens_i²)
//! ```
//!
//! the emulated profile's form (`shared/bench/PROTOCOL.md`, "Emulated accelerator") and a common
//! first-order model of a transformer step: linear layers cost ∝ tokens, attention ∝ tokens².
//! The planner never reads the profile: it fits `(c0, a, b)` from measured step times by
//! least squares over the last observations, with a ridge prior towards its starting guess so
//! the fit is defined from the first step.
//!
//! ```
//! use datahelix::cost::accel::{AccelFit, AccelModel};
//!
//! let truth = AccelModel { c0: 0.05, a: 2e-5, b: 1e-9 };
//! let mut fit = AccelFit::new(AccelModel { c0: 0.01, a: 1e-5, b: 0.0 }, 256);
//! for k in 1..40u64 {
//!     let tokens = [1000 * k, 300 * (k % 7 + 1), 5000];
//!     fit.observe(&tokens, truth.step_seconds(&tokens));
//! }
//! let m = fit.model();
//! assert!((m.step_seconds(&[4000, 4000]) - truth.step_seconds(&[4000, 4000])).abs() < 1e-3);
//! ```
//!
//! Tokens of a sample follow the protocol (`text + ceil(F/2)·(H'/28)·(W'/28)`); for a video
//! generation model, latents (`frames/4 × H/8 × W/8`) are used instead ([`TokenFormula`]).

use serde::{Deserialize, Serialize};

/// `(c0, a, b)` of `t = c0 + Σ (a·tok + b·tok²)`, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccelModel {
    /// Per-step constant (seconds).
    pub c0: f64,
    /// Seconds per token.
    pub a: f64,
    /// Seconds per token squared (attention).
    pub b: f64,
}

impl AccelModel {
    /// Seconds one sample adds to its rank's step.
    pub fn sample_seconds(&self, tokens: u64) -> f64 {
        let t = tokens as f64;
        (self.a * t + self.b * t * t).max(0.0)
    }

    /// Predicted step seconds of a rank holding samples with these token counts.
    pub fn step_seconds(&self, tokens: &[u64]) -> f64 {
        self.c0.max(0.0) + tokens.iter().map(|&t| self.sample_seconds(t)).sum::<f64>()
    }
}

/// Which count of a sample the accelerator's cost follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenFormula {
    /// Vision-language tokens: `text + ceil(F/2)·(H'/28)·(W'/28)` (the protocol's).
    #[default]
    Tokens,
    /// Video-generation latents: `ceil(F/4)·(H'/8)·(W'/8)` (a 4×8×8 VAE), plus text tokens.
    Latents,
}

impl TokenFormula {
    /// `tokens` or `latents`.
    pub fn name(self) -> &'static str {
        match self {
            TokenFormula::Tokens => "tokens",
            TokenFormula::Latents => "latents",
        }
    }

    /// The count for a sample of `frames` frames of `height × width` output pixels.
    pub fn count(self, text_tokens: u32, frames: u32, height: u32, width: u32) -> u64 {
        let (f, h, w) = (frames as u64, height as u64, width as u64);
        match self {
            TokenFormula::Tokens => text_tokens as u64 + f.div_ceil(2) * (h / 28) * (w / 28),
            TokenFormula::Latents => text_tokens as u64 + f.div_ceil(4) * (h / 8) * (w / 8),
        }
    }
}

/// One step of one rank: its samples' token sums and the measured seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Observation {
    sum_tokens: f64,
    sum_tokens_sq: f64,
    seconds: f64,
}

/// Observations [`AccelFit::spread`] needs before it measures.
pub const MIN_SPREAD_OBSERVATIONS: usize = 8;
/// [`AccelFit::spread`] before it measures: steps 10% off the model.
pub const DEFAULT_STEP_SPREAD: f64 = 0.1;

/// Online least-squares fit of an [`AccelModel`] over a sliding window of observations.
///
/// The solve is a 3×3 ridge-regularised normal-equations system, recomputed from the window in
/// observation order, so two fits fed the same observations hold bit-identical models.
#[derive(Clone, Debug)]
pub struct AccelFit {
    prior: AccelModel,
    window: usize,
    obs: std::collections::VecDeque<Observation>,
    model: AccelModel,
}

impl AccelFit {
    /// A fit starting from `prior`, remembering the last `window` observations.
    pub fn new(prior: AccelModel, window: usize) -> AccelFit {
        AccelFit { prior, window: window.max(1), obs: Default::default(), model: prior }
    }

    /// Adds one measured step of one rank (the token counts of the samples it ran).
    pub fn observe(&mut self, tokens: &[u64], seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let sum_tokens = tokens.iter().map(|&t| t as f64).sum();
        let sum_tokens_sq = tokens.iter().map(|&t| (t as f64) * (t as f64)).sum();
        self.observe_sums(sum_tokens, sum_tokens_sq, seconds);
    }

    /// Adds one observation given as sums (what the all-gathered step record carries).
    pub fn observe_sums(&mut self, sum_tokens: f64, sum_tokens_sq: f64, seconds: f64) {
        if !(seconds.is_finite() && sum_tokens.is_finite() && sum_tokens_sq.is_finite()) || seconds < 0.0 {
            return;
        }
        if self.obs.len() == self.window {
            self.obs.pop_front();
        }
        self.obs.push_back(Observation { sum_tokens, sum_tokens_sq, seconds });
        self.model = self.solve();
    }

    /// Adds one step's observations of every rank as `(Σ tokens, Σ tokens², seconds)`, then
    /// solves once (the cost of a solve is the window's length, not the number of ranks squared).
    pub fn observe_many(&mut self, obs: &[(f64, f64, f64)]) {
        let mut added = false;
        for &(sum_tokens, sum_tokens_sq, seconds) in obs {
            if !(seconds.is_finite() && sum_tokens.is_finite() && sum_tokens_sq.is_finite()) || seconds < 0.0
            {
                continue;
            }
            if self.obs.len() == self.window {
                self.obs.pop_front();
            }
            self.obs.push_back(Observation { sum_tokens, sum_tokens_sq, seconds });
            added = true;
        }
        if added {
            self.model = self.solve();
        }
    }

    /// The latest `k` observations (fewer where fewer are held), oldest first, as `(Σ tokens,
    /// Σ tokens², seconds)`: what a loader state keeps to resume the fit
    /// ([`AccelFit::observe_many`] of them gives a fresh fit the same model where the window
    /// held no more than `k`).
    pub fn recent(&self, k: usize) -> Vec<[f64; 3]> {
        let skip = self.obs.len().saturating_sub(k);
        self.obs.iter().skip(skip).map(|o| [o.sum_tokens, o.sum_tokens_sq, o.seconds]).collect()
    }

    /// Observations held.
    pub fn len(&self) -> usize {
        self.obs.len()
    }

    /// True before the first observation.
    pub fn is_empty(&self) -> bool {
        self.obs.is_empty()
    }

    /// The current model.
    pub fn model(&self) -> AccelModel {
        self.model
    }

    /// How far measured steps stray from the model: the RMS of `ln(measured / predicted)` over
    /// the window ([`DEFAULT_STEP_SPREAD`] before [`MIN_SPREAD_OBSERVATIONS`] are held). The
    /// time until a batch is due is a sum of predicted steps; planning against
    /// `exp(−spread)` of it keeps the decode plan on time when the steps run short.
    ///
    /// ```
    /// use datahelix::cost::accel::{AccelFit, AccelModel};
    ///
    /// let mut fit = AccelFit::new(AccelModel { c0: 0.1, a: 1e-6, b: 0.0 }, 64);
    /// for k in 0..32 {
    ///     let noise = if k % 2 == 0 { 1.1 } else { 1.0 / 1.1 };
    ///     fit.observe(&[1000 * (k % 4 + 1)], (0.5 + 1e-4 * (1000.0 * (k % 4 + 1) as f64)) * noise);
    /// }
    /// assert!((fit.spread() - 1.1f64.ln()).abs() < 0.02);
    /// ```
    pub fn spread(&self) -> f64 {
        if self.obs.len() < MIN_SPREAD_OBSERVATIONS {
            return DEFAULT_STEP_SPREAD;
        }
        let m = self.model;
        let (mut sq, mut n) = (0.0f64, 0usize);
        for o in &self.obs {
            let predicted = m.c0 + m.a * o.sum_tokens + m.b * o.sum_tokens_sq;
            if predicted > 0.0 && o.seconds > 0.0 {
                sq += (o.seconds / predicted).ln().powi(2);
                n += 1;
            }
        }
        if n == 0 {
            DEFAULT_STEP_SPREAD
        } else {
            (sq / n as f64).sqrt()
        }
    }

    fn solve(&self) -> AccelModel {
        // Columns are scaled to comparable magnitudes before solving: tokens ~1e4, tokens² ~1e9.
        let s1 = self.obs.iter().map(|o| o.sum_tokens).fold(1.0f64, f64::max);
        let s2 = self.obs.iter().map(|o| o.sum_tokens_sq).fold(1.0f64, f64::max);
        let p = [self.prior.c0, self.prior.a * s1, self.prior.b * s2];
        // Ridge towards the prior: a pull of one millionth of the data, enough to define the solve
        // before three independent observations exist.
        let lambda = 1e-6 * (self.obs.len() as f64).max(1.0);
        let mut m = [[0.0f64; 3]; 3];
        let mut v = [0.0f64; 3];
        for i in 0..3 {
            m[i][i] = lambda;
            v[i] = lambda * p[i];
        }
        for o in &self.obs {
            let x = [1.0, o.sum_tokens / s1, o.sum_tokens_sq / s2];
            for i in 0..3 {
                for j in 0..3 {
                    m[i][j] += x[i] * x[j];
                }
                v[i] += x[i] * o.seconds;
            }
        }
        match super::lsq::nonnegative(&m, &v) {
            Some(c) => {
                let model = AccelModel { c0: c[0], a: c[1] / s1, b: c[2] / s2 };
                if model.c0.is_finite() && model.a.is_finite() && model.b.is_finite() {
                    model
                } else {
                    self.prior
                }
            }
            None => self.prior,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_formulas() {
        assert_eq!(TokenFormula::Tokens.count(10, 16, 448, 448), 10 + 8 * 16 * 16);
        assert_eq!(TokenFormula::Tokens.count(0, 1, 28, 56), 2);
        assert_eq!(TokenFormula::Latents.count(0, 17, 448, 448), 5 * 56 * 56);
    }

    #[test]
    fn fit_recovers_the_profile_and_is_deterministic() {
        let truth = AccelModel { c0: 0.08, a: 3e-5, b: 2e-9 };
        let mut f1 = AccelFit::new(AccelModel { c0: 0.0, a: 1e-5, b: 0.0 }, 64);
        let mut f2 = f1.clone();
        for k in 0..200u64 {
            let toks = [(k * 7919) % 9000 + 100, (k * 104729) % 3000 + 50, (k % 5) * 2000];
            let noise = 1.0 + 0.01 * (((k * 2654435761) % 100) as f64 / 100.0 - 0.5);
            f1.observe(&toks, truth.step_seconds(&toks) * noise);
            f2.observe(&toks, truth.step_seconds(&toks) * noise);
        }
        assert_eq!(f1.model(), f2.model());
        let m = f1.model();
        for toks in [[500u64, 500, 500], [9000, 100, 0], [4000, 4000, 4000]] {
            let (p, t) = (m.step_seconds(&toks), truth.step_seconds(&toks));
            assert!((p - t).abs() / t < 0.02, "predicted {p} vs {t}");
        }
    }

    #[test]
    fn the_prior_holds_before_any_observation_and_bad_ones_are_ignored() {
        let prior = AccelModel { c0: 0.1, a: 1e-5, b: 1e-10 };
        let mut f = AccelFit::new(prior, 8);
        assert_eq!(f.model(), prior);
        f.observe(&[100], f64::NAN);
        f.observe(&[100], -1.0);
        assert!(f.is_empty());
    }
}
