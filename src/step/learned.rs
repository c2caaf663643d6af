//! What the agreed state learned during a run — the decode and accelerator cost models and the
//! CPUs' recent pace — in the form a loader state keeps, so that a resumed run plans its first
//! steps as the run it continues would have, instead of from the priors.
//!
//! ```
//! use datahelix::step::{Agreed, AgreedConfig, Learned};
//!
//! let agreed = Agreed::new(AgreedConfig::for_tests(), &[1, 2, 3], 2);
//! let learned: Learned = agreed.learned();
//! assert!(learned.check().is_ok());
//! let text = serde_json::to_string(&learned).unwrap();
//! let back: Learned = serde_json::from_str(&text).unwrap();
//! assert_eq!(back, learned);
//! // A resumed run's state starts from it ([`Agreed::resume_from`]).
//! let mut resumed = Agreed::new(AgreedConfig::for_tests(), &[1, 2, 3], 2);
//! resumed.resume_from(back);
//! ```

use serde::{Deserialize, Serialize};

use super::agreed::PACE_STEPS;
use crate::decode::cost::SavedFit;

/// The accelerator observations a state keeps at most (the fit's window is `8 × ranks`: at
/// thousands of ranks the latest few steps' are plenty to start from, and the file stays small).
pub const MAX_ACCEL_OBSERVATIONS: usize = 128;

/// What a run learned (see the module docs). Every rank's is the same at the same point of its
/// calls.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Learned {
    /// The slowest decode worker's share of a core the decode models were measured at, in
    /// thousandths (0: the CPU budget was not enforced). A resumed run whose share differs starts
    /// its decode models from the priors: its workers decode at another speed.
    pub worker_millicores: u32,
    /// The decode-cost model's fit of each codec seen.
    pub decode: Vec<SavedFit>,
    /// The accelerator fit's latest observations, oldest first: `[Σ tokens, Σ tokens², seconds]`
    /// of one rank's step.
    pub accel: Vec<[f64; 3]>,
    /// The compression ratio and bytes/s the ranks measured for zstd (`[0, 0]`: never).
    pub zstd: [f64; 2],
    /// The latest planned steps' decode work spread over every worker (seconds), oldest first.
    pub paces: Vec<f64>,
    /// The same steps' samples' whole decodes, spread alike.
    pub wholes: Vec<f64>,
    /// The same steps' balanced accelerator seconds.
    pub balanced: Vec<f64>,
}

impl Learned {
    /// `Ok` when every figure is one the run could have learned; else which one is not (a state
    /// file is checked before anything of it is used).
    pub fn check(&self) -> Result<(), String> {
        let mut codecs = std::collections::BTreeSet::new();
        for fit in &self.decode {
            if !codecs.insert(fit.check()?) {
                return Err(format!("the decode model holds the {} codec twice", fit.codec));
            }
        }
        if self.accel.len() > MAX_ACCEL_OBSERVATIONS {
            return Err(format!(
                "{} accelerator observations (a state keeps at most {MAX_ACCEL_OBSERVATIONS})",
                self.accel.len()
            ));
        }
        if self.accel.iter().flatten().any(|x| !(x.is_finite() && *x >= 0.0)) {
            return Err("an accelerator observation is negative or not a number".into());
        }
        if self.zstd.iter().any(|x| !(x.is_finite() && *x >= 0.0)) {
            return Err("the zstd figures are negative or not numbers".into());
        }
        for (name, window) in [("paces", &self.paces), ("wholes", &self.wholes), ("balanced", &self.balanced)]
        {
            if window.len() > PACE_STEPS {
                return Err(format!("{} {name} (a state keeps at most {PACE_STEPS})", window.len()));
            }
            if window.iter().any(|x| !(x.is_finite() && *x >= 0.0)) {
                return Err(format!("a figure of {name} is negative or not a number"));
            }
        }
        Ok(())
    }

    /// A hash of the whole (the ranks compare theirs before using it).
    pub fn hash(&self) -> u64 {
        let bytes = serde_json::to_vec(self).expect("learned figures serialise");
        crate::sampler::words_hash(&bytes)
    }
}

/// Whether a run started from what a run before it learned ([`super::Agreed::resumed`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Resumed {
    /// Not resumed from a state that carries learned models.
    No,
    /// The models and paces were restored.
    Restored,
    /// The accelerator model and paces were restored; the decode models start from the priors,
    /// for the reason given.
    DecodePriors(String),
    /// Nothing was restored, for the reason given.
    Priors(String),
}

impl Resumed {
    /// How a result file says it: `null`, `"restored"`, `"decode models from the priors: WHY"`
    /// or `"priors: WHY"`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Resumed::No => serde_json::Value::Null,
            Resumed::Restored => "restored".into(),
            Resumed::DecodePriors(why) => format!("decode models from the priors: {why}").into(),
            Resumed::Priors(why) => format!("priors: {why}").into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::cost::Features;
    use crate::descriptor::Codec;
    use crate::plan::record::{DecodeObservation, StepRecord};
    use crate::step::{Agreed, AgreedConfig};

    /// Round `round`'s records of 2 ranks whose workers have `millicores` of a core: measured
    /// steps and decodes of H.264 and MPEG-4 that vary with the round.
    fn records(round: u64, millicores: u32) -> Vec<StepRecord> {
        (0..2u32)
            .map(|rank| {
                let k = (round * 2 + rank as u64 + 1) as f64;
                let obs = |codec: Codec, j: f64| DecodeObservation {
                    codec: codec.to_byte(),
                    mpixels: 3.0 * k + j,
                    mbits: 1.5 + k / 3.0,
                    discarded: (k * j) % 7.0,
                    seconds: 0.01 * k + 0.02 * j,
                };
                StepRecord {
                    rank,
                    step: round,
                    workers: 2,
                    gpu_s: 0.2 + 0.01 * k,
                    sum_tokens: 900.0 * k,
                    sum_tokens_sq: 4e5 * k * k,
                    samples: 4,
                    observations: vec![obs(Codec::H264, 1.0), obs(Codec::H264, 2.0), obs(Codec::Mpeg4, 1.0)],
                    zstd_ratio: 2.0 + k / 10.0,
                    zstd_bps: 1e8,
                    worker_millicores: millicores,
                    ..StepRecord::default()
                }
            })
            .collect()
    }

    fn ran(rounds: u64, millicores: u32) -> Agreed {
        let mut a = Agreed::new(AgreedConfig::for_tests(), &[1, 2, 3, 4], 2);
        for round in 0..rounds {
            a.absorb(round, round, &records(round, millicores));
        }
        a
    }

    fn predictions(a: &Agreed) -> Vec<f64> {
        let f = Features { mpixels: 40.0, mbits: 6.0, discarded: 3.0 };
        [Codec::H264, Codec::Mpeg4]
            .iter()
            .flat_map(|&c| [a.decode_model().predict_features(c, &f), a.decode_model().planning_factor(c)])
            .collect()
    }

    #[test]
    fn a_resumed_state_predicts_as_the_run_it_continues() {
        let before = ran(12, 400);
        let saved: Learned =
            serde_json::from_str(&serde_json::to_string(&before.learned()).unwrap()).unwrap();
        let cold = ran(1, 400);
        let mut resumed = Agreed::new(AgreedConfig::for_tests(), &[1, 2, 3, 4], 2);
        resumed.resume_from(saved.clone());
        assert_eq!(resumed.accel_model(), before.accel_model(), "restored before any round");
        // Its first round's records (no decodes measured yet) keep the decode models.
        let first =
            records(0, 400).into_iter().map(|r| StepRecord { observations: vec![], ..r }).collect::<Vec<_>>();
        resumed.absorb(0, 12, &first);
        assert_eq!(resumed.resumed(), &Resumed::Restored);
        assert_eq!(predictions(&resumed), predictions(&before));
        assert_ne!(
            predictions(&cold),
            predictions(&before),
            "the test would not tell a restore from the priors"
        );
        assert_eq!(resumed.learned().decode, saved.decode);
        // Workers of another share start the decode models from the priors (the accelerator's stay).
        let mut other = Agreed::new(AgreedConfig::for_tests(), &[1, 2, 3, 4], 2);
        other.resume_from(saved);
        assert_eq!(other.accel_model(), before.accel_model());
        other.absorb(0, 12, &records(0, 250));
        let fresh = ran(1, 250);
        assert_eq!(predictions(&other), predictions(&fresh));
        let Resumed::DecodePriors(why) = other.resumed() else { panic!("{:?}", other.resumed()) };
        assert!(why.contains("0.400 of a core") && why.contains("0.250 of a core"), "{why}");
    }
}
