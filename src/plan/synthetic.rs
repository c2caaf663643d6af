//! Synthetic planning problems for `datahelix plan --synthetic KIND`, the quality report and the
//! planner benches: one global batch per step with token and decode costs drawn from a
//! distribution, a profile of a mid-size vision-language model, and ranks part-way through
//! their current step.

use super::{PlanInput, PlanOptions, RankState, SampleIn, TransferCost};
use crate::cost::accel::AccelModel;
use crate::rng::Rng;
use crate::sampler::splitmix64;

/// The token distribution of a synthetic batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Tokens uniform in [256, 4096].
    Uniform,
    /// Log-normal tokens (median 1024, σ = 0.9, clamped to [64, 32768]): a few huge clips.
    HeavyTail,
    /// 85% short samples (~512 tokens), 15% long ones (~8k tokens).
    Bimodal,
}

/// Seconds per token and per token² of the synthetic profile (an A100-class step of a 7B model,
/// order of magnitude), and the step constant.
pub const PROFILE: AccelModel = AccelModel { c0: 0.02, a: 2e-6, b: 2e-11 };

/// Bytes of decoded RGB per vision token: 2 frames × 28 × 28 pixels × 3 channels.
pub const BYTES_PER_TOKEN: u64 = 2 * 28 * 28 * 3;

/// A problem of `samples` per step over `ranks` ranks and `lookahead` steps.
pub fn synthetic(kind: Kind, samples: usize, ranks: usize, lookahead: usize, seed: u64) -> PlanInput {
    let mut rng = Rng(splitmix64(seed ^ 0xD47A_4E11));
    let mut out = Vec::with_capacity(samples * lookahead);
    for step in 0..lookahead.max(1) {
        for k in 0..samples {
            let tokens = match kind {
                Kind::Uniform => 256.0 + rng.uniform() * (4096.0 - 256.0),
                Kind::HeavyTail => rng.lognormal(1024.0, 0.9, 64.0, 32768.0),
                Kind::Bimodal => {
                    if rng.uniform() < 0.85 {
                        rng.lognormal(512.0, 0.3, 64.0, 4096.0)
                    } else {
                        rng.lognormal(8192.0, 0.3, 4096.0, 32768.0)
                    }
                }
            }
            .round() as u64;
            // Decode cost follows pixels (∝ tokens) with codec and bit-rate spread; on average a
            // rank's 4 workers need about half its accelerator window, so misses come from skew:
            // ranks that drew several decode-heavy samples.
            let decode_s = tokens as f64 * 2.5e-6 * rng.lognormal(1.0, 0.6, 0.2, 5.0);
            out.push(SampleIn {
                id: splitmix64(seed.wrapping_add((step * samples + k) as u64)),
                step: step as u32,
                tokens,
                decode_s,
                bytes: tokens * BYTES_PER_TOKEN,
            });
        }
    }
    let per_rank_work: f64 =
        out.iter().filter(|s| s.step == 0).map(|s| PROFILE.sample_seconds(s.tokens)).sum::<f64>()
            / ranks.max(1) as f64;
    let rank_states: Vec<RankState> = (0..ranks)
        .map(|_| RankState {
            workers: 4,
            accel_free_s: (PROFILE.c0 + per_rank_work) * (0.8 + 0.4 * rng.uniform()),
            // Some ranks' CPUs are still busy with earlier work (a long clip of the last step).
            queued_cpu_s: 4.0 * (PROFILE.c0 + per_rank_work) * 0.8 * rng.uniform().powi(3),
            mem_cap: 0,
        })
        .collect();
    PlanInput {
        first_step: 1,
        samples: out,
        accel: PROFILE,
        transfer: TransferCost::linear(20e-6, 10e9),
        options: PlanOptions::default(),
        pieces: Vec::new(),
        // As the loader's `ship_ahead`: tensors cross shortly before the first window ends.
        exchange_s: 0.9 * rank_states.iter().map(|r| r.accel_free_s).fold(f64::INFINITY, f64::min),
        decode_pace_s: 0.0,
        decode_pace_spread_s: 0.0,
        late_pieces: false,
        late_due_s: 0.0,
        ranks: rank_states,
    }
}
