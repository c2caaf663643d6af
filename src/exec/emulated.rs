//! The emulated accelerator of `shared/bench/PROTOCOL.md`: a step sleeps for the time a hidden
//! model profile gives the batch actually delivered. The accelerator runs asynchronously to the
//! CPUs, so [`Accelerator::launch`] returns at once and [`Accelerator::wait`] sleeps for the rest.
//!
//! ```
//! use datahelix::emu::Profile;
//! use datahelix::exec::emulated::EmulatedAccelerator;
//!
//! let accel = EmulatedAccelerator::new(Profile { c0: 0.05, a: 2e-5, b: 2e-9, sigma: 0.0 }, 0, 0);
//! assert_eq!(accel.last_seconds(), 0.0); // nothing ran yet
//! ```

use std::time::{Duration, Instant};

use super::loader::{Accelerator, Batch};
use crate::emu::Profile;
use crate::metrics::AccelTerms;

/// One rank's emulated accelerator.
#[derive(Clone, Debug)]
pub struct EmulatedAccelerator {
    profile: Profile,
    seed: u64,
    rank: u64,
    started: Option<Instant>,
    seconds: f64,
    terms: Option<AccelTerms>,
}

impl EmulatedAccelerator {
    /// The accelerator of `rank` under `profile`, noise drawn from `seed`.
    pub fn new(profile: Profile, seed: u64, rank: usize) -> EmulatedAccelerator {
        EmulatedAccelerator { profile, seed, rank: rank as u64, started: None, seconds: 0.0, terms: None }
    }

    /// The emulated seconds of the step launched last.
    pub fn last_seconds(&self) -> f64 {
        self.seconds
    }

    /// The terms of the step launched last (None before the first).
    pub fn last_terms(&self) -> Option<AccelTerms> {
        self.terms
    }

    /// The largest single sample's noise-free seconds in `batch`.
    pub fn max_sample_seconds(&self, batch: &Batch) -> f64 {
        self.sample_seconds(batch).into_iter().fold(0.0, f64::max)
    }

    /// Each sample's noise-free seconds in `batch`, in batch order.
    pub fn sample_seconds(&self, batch: &Batch) -> Vec<f64> {
        batch.samples.iter().map(|s| self.profile.sample_seconds(s.tokens)).collect()
    }
}

impl Accelerator for EmulatedAccelerator {
    fn launch(&mut self, batch: &Batch) -> Result<(), String> {
        let tokens: Vec<u64> = batch.samples.iter().map(|s| s.tokens).collect();
        let terms = self.profile.step_terms(&tokens, self.seed, batch.step, self.rank);
        self.seconds = (terms.fixed_s + terms.work_s) * terms.noise;
        self.terms = Some(terms);
        self.started = Some(Instant::now());
        Ok(())
    }

    fn seconds_left(&self) -> Option<f64> {
        let started = self.started?;
        Some((self.seconds - started.elapsed().as_secs_f64()).max(0.0))
    }

    fn wait(&mut self) -> Result<f64, String> {
        let started = self.started.take().ok_or("no step was launched")?;
        let end = started + Duration::from_secs_f64(self.seconds);
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        Ok(self.seconds)
    }
}
