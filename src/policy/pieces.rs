//! Which samples DataHelix offers the planner in pieces: a sample one decode worker may not finish
//! before its batch is due is split at keyframes ([`crate::decode::split`]) into as many pieces
//! as that takes — more than there are ranks where it must (a rank's workers decode several
//! pieces of one sample at once: Ego-Exo4D's 3-minute 4K clips need 16) — so that placement may
//! decode them on several workers and ranks at once. The loader and the
//! simulator both ask here, so they split alike.
//!
//! ```no_run
//! # use datahelix::{decode::{cost::CostModel, sample::Params}, descriptor::Descriptor};
//! # fn f(d: &Descriptor) {
//! use datahelix::policy::pieces::offer_pieces;
//!
//! let model = CostModel::default();
//! // 7.6 s of decode for a batch due in 4 s: two pieces where the clip has two GOPs.
//! let pieces = offer_pieces(d, &Params::default(), &model, 7.6, 4.0, 4, None);
//! assert!(pieces.is_empty() || pieces.len() >= 2);
//! # }
//! ```

use crate::cost::accel::TokenFormula;
use crate::decode::cost::{output_bytes, CostModel, Features};
use crate::decode::sample::{output_shape, Params};
use crate::decode::split::{split_targets, FrameRange, MAX_PARTS};
use crate::descriptor::Descriptor;
use crate::plan::{PieceIn, SampleIn};

/// Decodes shorter than this (predicted seconds on one worker) are never split: a piece costs a
/// seek, a keyframe and a message, which only a long decode repays.
pub const MIN_SPLIT_S: f64 = 0.25;

/// A sample is offered in pieces once its predicted decode exceeds this share of the time to its
/// batch's deadline: predictions of heavy clips are off by tens of percent, and the planner
/// keeps pieces on the owner (at the cost of one more keyframe) when moving them does not pay.
pub const SPLIT_SHARE: f64 = 0.5;

/// One offered piece: its frames, predicted decode seconds on one worker, and decoded bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Offered {
    /// The sampled frames it decodes.
    pub frames: FrameRange,
    /// Predicted decode seconds on one worker.
    pub decode_s: f64,
    /// Decoded bytes.
    pub bytes: u64,
}

/// The pieces to offer for a sample predicted to take `decode_s` on one worker (with the model's
/// planning margin, [`CostModel::planning_factor`], as every offered time) when its batch is
/// due in `due_s`, among `ranks` ranks; empty when it is decoded whole (it takes less than
/// [`SPLIT_SHARE`] of the time to the deadline, it is shorter
/// than [`MIN_SPLIT_S`], there is one rank, or the stream has no keyframe between its sampled
/// frames). With `split_above_s`, every sample predicted longer than that is offered in as many
/// pieces as ranks, late or not (to exercise the path; tests use 0).
pub fn offer_pieces(
    d: &Descriptor,
    params: &Params,
    model: &CostModel,
    decode_s: f64,
    due_s: f64,
    ranks: usize,
    split_above_s: Option<f64>,
) -> Vec<Offered> {
    // False for a deadline already past and for NaN times as well.
    let late_and_long = due_s > 0.0 && decode_s > SPLIT_SHARE * due_s && decode_s >= MIN_SPLIT_S;
    let parts = match split_above_s {
        _ if ranks < 2 => return Vec::new(),
        Some(above) if decode_s > above => ranks as u32,
        Some(_) => return Vec::new(),
        None if !late_and_long => return Vec::new(),
        None => (decode_s / (SPLIT_SHARE * due_s)).ceil().clamp(2.0, MAX_PARTS as f64) as u32,
    };
    let ranges = split_targets(d, params, parts);
    if ranges.len() < 2 {
        return Vec::new();
    }
    let (_, h, w) = output_shape(d, params);
    ranges
        .into_iter()
        .map(|frames| Offered {
            frames,
            decode_s: model.predict_features(d.codec, &Features::predict_range(d, params, frames)).max(0.0)
                * model.planning_factor(d.codec),
            bytes: frames.len() as u64 * h as u64 * w as u64 * 3,
        })
        .collect()
}

/// What decides a step's offer, besides its samples' descriptors.
#[derive(Clone, Copy, Debug)]
pub struct OfferContext<'a> {
    /// Preprocessing.
    pub params: &'a Params,
    /// Tokens or latents of a decoded sample.
    pub formula: &'a TokenFormula,
    /// The decode-cost model every rank holds.
    pub model: &'a CostModel,
    /// Seconds until the step's batches are due.
    pub due_s: f64,
    /// Ranks.
    pub ranks: usize,
    /// See [`offer_pieces`].
    pub split_above_s: Option<f64>,
}

/// A step's usable samples as the planner sees them, the pieces offered, and each piece's frames.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOffer {
    /// Per sample, in batch order.
    pub samples: Vec<SampleIn>,
    /// Pieces of the samples offered split (`PlanInput::pieces`).
    pub pieces: Vec<PieceIn>,
    /// Per piece: its sampled frames.
    pub piece_frames: Vec<FrameRange>,
    /// Per sample: its number of sampled frames.
    pub frames: Vec<u32>,
    /// Σ of the samples' predicted decode seconds on one worker, without the planning margin
    /// (`SampleIn::decode_s` counts on a run one spread long): what the step's decoding is
    /// expected to take, for the CPUs' pace.
    pub expected_decode_s: f64,
}

impl StepOffer {
    /// Builds the offer of a step's usable samples (the loader's and the simulator's planning
    /// input, one function so that they plan alike).
    pub fn new<'d>(
        descriptors: impl IntoIterator<Item = &'d Descriptor>,
        cx: &OfferContext<'_>,
    ) -> StepOffer {
        let mut o = StepOffer::default();
        for (i, d) in descriptors.into_iter().enumerate() {
            let (f, h, w) = output_shape(d, cx.params);
            let margin = cx.model.planning_factor(d.codec);
            let expected = cx.model.predict(d, cx.params).max(0.0);
            o.expected_decode_s += expected;
            let decode_s = expected * margin;
            o.samples.push(SampleIn {
                id: d.id,
                step: 0,
                tokens: cx.formula.count(d.text_tokens, f, h, w),
                decode_s,
                bytes: output_bytes(d, cx.params),
            });
            o.frames.push(f);
            for piece in offer_pieces(d, cx.params, cx.model, decode_s, cx.due_s, cx.ranks, cx.split_above_s)
            {
                o.pieces.push(PieceIn { sample: i as u32, decode_s: piece.decode_s, bytes: piece.bytes });
                o.piece_frames.push(piece.frames);
            }
        }
        o
    }

    /// The work of each of a plan's `jobs` decode jobs: jobs `0..n` are the samples (whole, or
    /// a split one's first piece), the later pieces follow (`plan::Plan::jobs`). A plan that kept
    /// no pieces (a policy without placement) decodes every sample whole.
    pub fn job_work(&self, jobs: usize) -> Vec<JobWork> {
        let mut out: Vec<JobWork> = (0..self.samples.len())
            .map(|i| JobWork {
                frames: FrameRange::whole(self.frames[i]),
                decode_s: self.samples[i].decode_s,
            })
            .collect();
        if jobs > out.len() {
            for (q, p) in self.pieces.iter().enumerate() {
                let work = JobWork { frames: self.piece_frames[q], decode_s: p.decode_s };
                if q == 0 || self.pieces[q - 1].sample != p.sample {
                    out[p.sample as usize] = work;
                } else {
                    out.push(work);
                }
            }
        }
        out
    }
}

/// One decode job of a plan: the frames it decodes and its predicted seconds on one worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct JobWork {
    /// The sampled frames.
    pub frames: FrameRange,
    /// Predicted decode seconds on one worker.
    pub decode_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{Codec, Modality};

    /// A 4-s 720p H.264 clip at 30 fps with a keyframe every 60 frames (two GOPs).
    fn clip() -> Descriptor {
        Descriptor {
            modality: Modality::Video,
            codec: Codec::H264,
            width: 1280,
            height: 720,
            frames: 120,
            fps_num: 30,
            fps_den: 1,
            duration_ticks: 4000,
            time_base_num: 1,
            time_base_den: 1000,
            bit_rate: 80_000_000,
            keyint: 60,
            ..Descriptor::default()
        }
    }

    #[test]
    fn only_samples_that_may_be_late_are_split_into_pieces_covering_them() {
        let (d, p, m) = (clip(), Params::default(), CostModel::default());
        let pieces = offer_pieces(&d, &p, &m, 7.0, 4.0, 4, None);
        assert_eq!(pieces.len(), 2, "two GOPs, two pieces: {pieces:?}");
        assert_eq!((pieces[0].frames.start, pieces[1].frames.end), (0, output_shape(&d, &p).0));
        assert_eq!(pieces[0].frames.end, pieces[1].frames.start);
        let bytes: u64 = pieces.iter().map(|x| x.bytes).sum();
        assert_eq!(bytes, crate::decode::cost::output_bytes(&d, &p));
        assert!(pieces.iter().all(|x| x.decode_s > 0.0));

        assert!(offer_pieces(&d, &p, &m, 1.0, 4.0, 4, None).is_empty(), "fits: whole");
        assert!(offer_pieces(&d, &p, &m, 7.0, 4.0, 1, None).is_empty(), "one rank: whole");
        assert!(offer_pieces(&d, &p, &m, 0.2, 0.0, 4, None).is_empty(), "too short: whole");
        assert!(offer_pieces(&Descriptor { keyint: 0, ..d }, &p, &m, 7.0, 4.0, 4, None).is_empty());
        assert_eq!(offer_pieces(&d, &p, &m, 0.01, 4.0, 4, Some(0.0)).len(), 2, "forced");
    }

    #[test]
    fn a_long_late_clip_gets_as_many_pieces_as_its_deadline_needs_not_as_ranks() {
        // 3 minutes at 30 fps, a keyframe every 250 frames: 16 targets, each in a GOP of its
        // own. 16 s of decode due in 2 s needs pieces of ≤ 1 s: all 16, on 2 ranks' workers.
        let d = Descriptor { frames: 5400, duration_ticks: 180_000, keyint: 250, ..clip() };
        let pieces = offer_pieces(&d, &Params::default(), &CostModel::default(), 16.0, 2.0, 2, None);
        assert_eq!(pieces.len(), 16, "{pieces:?}");
        // Due in 8 s: pieces of ≤ 4 s, four of them.
        assert_eq!(offer_pieces(&d, &Params::default(), &CostModel::default(), 16.0, 8.0, 2, None).len(), 4);
    }

    #[test]
    fn a_clip_whose_keyframe_is_a_targets_frame_still_splits() {
        // data/skewed's videos/000040.mp4: 101 frames at 30 fps, keyframes 0 and 59; target 3
        // (1.964 s) takes keyframe 59 (1.967 s), so the second piece starts at target 4 and both
        // decode frame 59.
        let d = Descriptor { frames: 101, duration_ticks: 101, time_base_den: 30, keyint: 59, ..clip() };
        let pieces = offer_pieces(&d, &Params::default(), &CostModel::default(), 6.0, 4.0, 4, None);
        let ranges: Vec<(u32, u32)> = pieces.iter().map(|x| (x.frames.start, x.frames.end)).collect();
        assert_eq!(ranges, [(0, 4), (4, 6)]);
    }
}
