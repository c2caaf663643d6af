//! The decode-cost model: predicted seconds for a sample from its descriptor, per codec,
//!
//! `seconds = c0 + c_px · decoded pixels + c_bits · compressed bits read + c_seek · frames
//! decoded and discarded`
//!
//! (features in megapixels, megabits and frames). Fitted online by non-negative weighted least
//! squares (each observation weighted by `1 / seconds`), with a prior of a few
//! pseudo-observations drawn from default coefficients that fades out as observations come, so
//! it predicts before the first observation. Plain Rust, no FFI; deterministic: the fit is a
//! function of the observations given in order (feed them sorted, e.g. by sample id, for
//! bit-identical results across runs).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sample::{frame_count, output_shape, Params, Ratio, Strategy};
use super::split::{self, FrameRange, Timing};
use crate::descriptor::{Codec, Descriptor, Modality};

/// Number of coefficients: c0, c_px, c_bits, c_seek.
pub const TERMS: usize = 4;

/// The model's features of one decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Features {
    /// Decoded pixels, in megapixels.
    pub mpixels: f64,
    /// Compressed bits read, in megabits.
    pub mbits: f64,
    /// Frames decoded and discarded.
    pub discarded: f64,
}

impl Features {
    fn row(&self) -> [f64; TERMS] {
        [1.0, self.mpixels, self.mbits, self.discarded]
    }

    /// Predicts the features of decoding `d` under `params` from its descriptor alone:
    /// [`Features::predict_range`] of the whole sample.
    pub fn predict(d: &Descriptor, params: &Params) -> Features {
        Features::predict_range(d, params, FrameRange::whole(output_shape(d, params).0))
    }

    /// Predicts the features of decoding only the targets `range` of `d` (a piece from
    /// [`split_targets`](super::split::split_targets)): seek to the predicted keyframe before the
    /// range's first target (none for a range starting at 0), decode up to its last target's
    /// frame, by the strategy [`Strategy::for_range`] picks. The whole range is
    /// [`Features::predict`]; the pieces of a split add up to no more than the whole plus the
    /// frames between each piece's keyframe and its first target. A range reaching past `F` is
    /// cut to `F`.
    pub fn predict_range(d: &Descriptor, params: &Params, range: FrameRange) -> Features {
        let px = d.width as f64 * d.height as f64;
        if d.modality == Modality::Image {
            return Features { mpixels: px / 1e6, mbits: d.bytes as f64 * 8.0 / 1e6, discarded: 0.0 };
        }
        let duration = duration(d);
        let f = frame_count(duration, params) as f64;
        let total = (d.frames as f64).max(1.0);
        let dur = duration.to_f64().max(1e-9);
        let fps = if d.fps_den > 0 && d.fps_num > 0 { d.fps() } else { total / dur };
        // The whole sample as the protocol counts it (1 target without a duration, where the
        // model's `f` assumes a second).
        let targets = output_shape(d, params).0;
        let end = range.end.min(targets);
        let start = range.start.min(end);
        if start == end {
            return Features::default();
        }
        let (n, last, first) = if start == 0 && end == targets {
            (f, f, 0.0)
        } else {
            // Frames before the piece's predicted keyframe are not decoded.
            let first = Timing::new(d, params).map_or(0.0, |t| t.piece_start(start) as f64);
            ((end - start) as f64, end as f64, first)
        };
        // A scan decodes up to the last target, t = (2·last − 1)/(2F) · d, plus one frame.
        let scan = (((2.0 * last - 1.0) / (2.0 * f) * dur * fps + 1.0).min(total) - first).max(1.0);
        let decoded = match Strategy::for_range(d, params, FrameRange { start, end }) {
            Strategy::Scan => scan,
            Strategy::Seek => (n * (d.keyint as f64 / 2.0 + 1.0)).min(scan),
        };
        Features::of_frames(d, decoded, n)
    }

    /// The features of decoding the targets `range` of `d` as a single-threaded decoder would
    /// if keyframes lay exactly every `keyint` frames: [`Features::predict_range`] with the
    /// frames counted target by target ([`split::decoded_frames`]) instead of on average — the
    /// simulator's truth, where the planner sees only the prediction. Images, and videos without
    /// a frame timing, are predicted.
    pub fn exact_range(d: &Descriptor, params: &Params, range: FrameRange) -> Features {
        let strategy = Strategy::for_range(d, params, range);
        match split::decoded_frames(d, params, range, strategy) {
            Some(decoded) if d.modality == Modality::Video && !range.is_empty() => {
                let decoded = (decoded as f64).min(d.frames.max(1) as f64).max(1.0);
                Features::of_frames(d, decoded, range.len() as f64)
            }
            _ => Features::predict_range(d, params, range),
        }
    }

    /// The features of the longest run of frames one target of `d` needs decoded in order, from
    /// its keyframe through its frame ([`split::longest_chain_frames`]): what one worker
    /// decodes before that target is out, whoever decodes it and however the sample is cut. An
    /// image's is its whole decode; `None` for a video without a frame timing.
    pub fn longest_chain(d: &Descriptor, params: &Params) -> Option<Features> {
        if d.modality == Modality::Image {
            return Some(Features::predict(d, params));
        }
        let frames = split::longest_chain_frames(d, params)?;
        Some(Features::of_frames(d, (frames as f64).min(d.frames.max(1) as f64).max(1.0), 1.0))
    }

    /// `decoded` stream frames of the video `d`, `kept` of them targets: the stream's bits in
    /// proportion (its bit rate over its duration, else its bytes).
    fn of_frames(d: &Descriptor, decoded: f64, kept: f64) -> Features {
        let px = d.width as f64 * d.height as f64;
        let total = (d.frames as f64).max(1.0);
        let bits = if d.bit_rate > 0 { d.bit_rate as f64 * duration_s(d) } else { d.bytes as f64 * 8.0 };
        Features {
            mpixels: decoded * px / 1e6,
            mbits: bits * (decoded / total).min(1.0) / 1e6,
            discarded: (decoded - kept).max(0.0),
        }
    }
}

/// The descriptor's duration, a second where it has none.
fn duration(d: &Descriptor) -> Ratio {
    Ratio::new(d.duration_ticks as i128 * d.time_base_num as i128, (d.time_base_den as i128).max(1))
        .filter(|r| r.num > 0)
        .unwrap_or(Ratio { num: 1, den: 1 })
}

/// [`duration`] in seconds.
fn duration_s(d: &Descriptor) -> f64 {
    duration(d).to_f64().max(1e-9)
}

/// Output bytes of a sample under `params`, from its descriptor (the pool's buffer size).
pub fn output_bytes(d: &Descriptor, params: &Params) -> u64 {
    let (f, h, w) = super::sample::output_shape(d, params);
    f as u64 * h as u64 * w as u64 * 3
}

/// Coefficients of one codec's model (seconds, seconds per megapixel, per megabit, per frame).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Coefficients {
    /// Fixed cost per sample (open, probe, decoder set-up).
    pub c0: f64,
    /// Seconds per decoded megapixel.
    pub c_px: f64,
    /// Seconds per compressed megabit read.
    pub c_bits: f64,
    /// Seconds per frame decoded and discarded.
    pub c_seek: f64,
}

impl Coefficients {
    fn from_array(a: [f64; TERMS]) -> Self {
        Coefficients { c0: a[0], c_px: a[1], c_bits: a[2], c_seek: a[3] }
    }

    fn to_array(self) -> [f64; TERMS] {
        [self.c0, self.c_px, self.c_bits, self.c_seek]
    }

    /// The prior for a codec: rough single-core figures for a current x86 core. (H.264's are
    /// rounded from `datahelix calibrate data/skewed` on the 2-core development machine,
    /// 1.8 ms/Mpixel and 11 ms/Mbit: entropy decoding dominates a high-bitrate clip.)
    pub fn prior(codec: Codec) -> Coefficients {
        let (c0, c_px, c_bits, c_seek) = match codec {
            Codec::H264 => (3e-3, 2e-3, 1e-2, 1e-4),
            Codec::Mpeg4 => (2e-3, 2.5e-3, 2e-3, 1e-4),
            Codec::Jpeg => (1e-3, 8e-3, 2e-3, 0.0),
            Codec::Png => (1e-3, 6e-3, 2e-2, 0.0),
            // Rounded from `datahelix calibrate` on scripts/specs/codecs.json on the same
            // machine (low-bitrate clips: more per bit than H.264; calibrate replaces them).
            Codec::Hevc => (2.5e-3, 1.5e-3, 3e-2, 1e-4),
            Codec::Vp9 => (3e-3, 1e-3, 2e-2, 1e-4),
            Codec::Av1 => (3e-3, 1.5e-3, 2.5e-2, 1e-4),
            _ => (5e-3, 6e-3, 4e-3, 2e-4),
        };
        Coefficients { c0, c_px, c_bits, c_seek }
    }

    /// Every coefficient times `k`.
    pub fn scaled(self, k: f64) -> Coefficients {
        Coefficients::from_array(self.to_array().map(|c| c * k))
    }

    /// Predicted seconds (never below 0.1 ms).
    pub fn predict(&self, f: &Features) -> f64 {
        let c = self.to_array();
        f.row().iter().zip(c).map(|(x, c)| x * c).sum::<f64>().max(1e-4)
    }
}

/// Weighted least squares with a prior, for one codec.
#[derive(Clone, Debug)]
pub struct OnlineFit {
    /// The observations' weighted normal equations.
    ata: [[f64; TERMS]; TERMS],
    atb: [f64; TERMS],
    /// The prior's pseudo-observations', kept apart: they fade out over the first
    /// [`PRIOR_FADE`] observations. (Kept in, they pin the model's shape — e.g. its fixed cost at
    /// the prior's tiny image — and where the measured scale differs from the prior's, as on a
    /// rank with a fraction of a core, they hold predictions several times too low for good.)
    prior_ata: [[f64; TERMS]; TERMS],
    prior_atb: [f64; TERMS],
    n: u64,
    forget: f64,
    coef: Coefficients,
    /// Exponentially weighted Σ of squared log-residuals `ln(actual / predicted)`, each
    /// predicted before its observation was fitted (out of sample), and Σ of the weights
    /// (recent residuals count, early ones of a fit still learning fade: [`RESIDUAL_DECAY`]).
    log_sq: f64,
    log_weight: f64,
    residuals: u64,
}

/// Typical feature rows the prior's pseudo-observations sit at: an image, a small clip, a 720p
/// clip, a 1080p clip with discarded frames.
const PRIOR_POINTS: [Features; 4] = [
    Features { mpixels: 0.3, mbits: 0.4, discarded: 0.0 },
    Features { mpixels: 4.0, mbits: 1.0, discarded: 40.0 },
    Features { mpixels: 60.0, mbits: 8.0, discarded: 60.0 },
    Features { mpixels: 250.0, mbits: 30.0, discarded: 110.0 },
];

impl OnlineFit {
    /// A fit that starts from `prior`, worth `strength` observations, forgetting old
    /// observations by `forget` per new one (1.0 = keep all: plain least squares).
    pub fn new(prior: Coefficients, strength: f64, forget: f64) -> OnlineFit {
        let mut fit = OnlineFit {
            ata: [[0.0; TERMS]; TERMS],
            atb: [0.0; TERMS],
            prior_ata: [[0.0; TERMS]; TERMS],
            prior_atb: [0.0; TERMS],
            n: 0,
            forget,
            coef: prior,
            log_sq: 0.0,
            log_weight: 0.0,
            residuals: 0,
        };
        let w = strength / PRIOR_POINTS.len() as f64;
        for p in &PRIOR_POINTS {
            accumulate(&mut fit.prior_ata, &mut fit.prior_atb, p, prior.predict(p), w);
        }
        // A small ridge keeps the system solvable whatever the data.
        for k in 0..TERMS {
            fit.ata[k][k] += 1e-9;
        }
        fit
    }

    fn solve_now(&self) -> Option<[f64; TERMS]> {
        let fade = (1.0 - self.n as f64 / PRIOR_FADE as f64).max(0.0);
        let (mut a, mut b) = (self.ata, self.atb);
        for ((row, prior_row), (bi, prior_bi)) in
            a.iter_mut().zip(&self.prior_ata).zip(b.iter_mut().zip(&self.prior_atb))
        {
            for (x, p) in row.iter_mut().zip(prior_row) {
                *x += fade * p;
            }
            *bi += fade * prior_bi;
        }
        // Every term of a decode's cost is a cost: pixels, bits and discarded frames grow
        // together in most datasets, and an unconstrained fit trades a large coefficient against
        // a negative one, predicting ~0 s for heavy samples.
        crate::cost::lsq::nonnegative(&a, &b)
    }

    /// Adds one observation and refits.
    pub fn observe(&mut self, f: &Features, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let predicted = self.predict(f);
        if predicted > 0.0 && self.n >= RESIDUALS_AFTER {
            self.log_sq = RESIDUAL_DECAY * self.log_sq + (seconds / predicted).ln().powi(2);
            self.log_weight = RESIDUAL_DECAY * self.log_weight + 1.0;
            self.residuals += 1;
        }
        if self.forget < 1.0 {
            for i in 0..TERMS {
                for j in 0..TERMS {
                    self.ata[i][j] *= self.forget;
                }
                self.atb[i] *= self.forget;
            }
        }
        accumulate(&mut self.ata, &mut self.atb, f, seconds, 1.0);
        self.n += 1;
        if let Some(c) = self.solve_now() {
            self.coef = Coefficients::from_array(c);
        }
    }

    /// Current coefficients.
    pub fn coefficients(&self) -> Coefficients {
        self.coef
    }

    /// Observations so far.
    pub fn observations(&self) -> u64 {
        self.n
    }

    /// Predicted seconds.
    pub fn predict(&self, f: &Features) -> f64 {
        self.coef.predict(f)
    }

    /// The spread of actual decode times around the predictions: the root-mean-square
    /// log-residual of recent observations (each against the prediction made before it was
    /// fitted), or [`DEFAULT_SPREAD`] before [`MIN_RESIDUALS`] of them.
    pub fn spread(&self) -> f64 {
        if self.residuals < MIN_RESIDUALS {
            DEFAULT_SPREAD
        } else {
            (self.log_sq / self.log_weight).sqrt()
        }
    }
}

/// Adds an observation of `seconds` at `f`, weighted by `weight / seconds`, to normal equations:
/// each squared error counts relative to the decode's size. (Relative error alone, `1 /
/// seconds²`, let the many light samples set the model and left the few heavy ones — 5% of the
/// demo's samples, 60% of its decode time, the ones a plan hinges on — predicted at half their
/// time; absolute error would do the opposite to the light ones.)
fn accumulate(
    ata: &mut [[f64; TERMS]; TERMS],
    atb: &mut [f64; TERMS],
    f: &Features,
    seconds: f64,
    weight: f64,
) {
    let x = f.row();
    let w = weight / seconds.max(1e-6);
    for i in 0..TERMS {
        for j in 0..TERMS {
            ata[i][j] += w * x[i] * x[j];
        }
        atb[i] += w * x[i] * seconds;
    }
}

/// Observations over which the prior fades out.
const PRIOR_FADE: u64 = 16;
/// Observations fitted before residuals count (the first predictions are the prior's).
const RESIDUALS_AFTER: u64 = 8;
/// Weight of a residual one observation older than the next (about the last 32 count).
const RESIDUAL_DECAY: f64 = 0.97;
/// Residuals needed before the measured spread replaces [`DEFAULT_SPREAD`].
pub const MIN_RESIDUALS: u64 = 8;
/// The spread assumed before enough residuals are measured (a 30% typical error).
pub const DEFAULT_SPREAD: f64 = 0.3;

/// The per-codec decode-cost model.
#[derive(Clone, Debug)]
pub struct CostModel {
    fits: BTreeMap<Codec, OnlineFit>,
    /// Prior strength in observations.
    pub prior_strength: f64,
    /// Forgetting factor per observation (1.0 = none).
    pub forget: f64,
    /// The priors' figures are for a whole core; a worker with a fraction `k` of one takes
    /// `1 / k` times as long ([`CostModel::for_worker_cores`]).
    prior_scale: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel { fits: BTreeMap::new(), prior_strength: 2.0, forget: 1.0, prior_scale: 1.0 }
    }
}

impl CostModel {
    /// A model whose priors predict seconds on a worker with `cores` of a core (a CPU budget's
    /// share; 1 or more: the priors as they are). The measurements then correct them as usual.
    ///
    /// ```
    /// use datahelix::decode::cost::{CostModel, Features};
    /// use datahelix::descriptor::Codec;
    ///
    /// let f = Features { mpixels: 30.0, mbits: 80.0, discarded: 28.0 };
    /// let whole = CostModel::default().predict_features(Codec::H264, &f);
    /// let half = CostModel::for_worker_cores(0.5).predict_features(Codec::H264, &f);
    /// assert!((half / whole - 2.0).abs() < 1e-9);
    /// ```
    pub fn for_worker_cores(cores: f64) -> CostModel {
        let prior_scale = if cores > 0.0 && cores < 1.0 { 1.0 / cores } else { 1.0 };
        CostModel { prior_scale, ..CostModel::default() }
    }

    fn prior(&self, codec: Codec) -> Coefficients {
        Coefficients::prior(codec).scaled(self.prior_scale)
    }

    fn fit(&mut self, codec: Codec) -> &mut OnlineFit {
        let (s, f, prior) = (self.prior_strength, self.forget, self.prior(codec));
        self.fits.entry(codec).or_insert_with(|| OnlineFit::new(prior, s, f))
    }

    /// Predicted decode seconds of a sample.
    pub fn predict(&self, d: &Descriptor, params: &Params) -> f64 {
        self.predict_features(d.codec, &Features::predict(d, params))
    }

    /// Predicted decode seconds of a decode given as the model's features (e.g. one piece of a
    /// split sample).
    pub fn predict_features(&self, codec: Codec, f: &Features) -> f64 {
        match self.fits.get(&codec) {
            Some(fit) => fit.predict(f),
            None => self.prior(codec).predict(f),
        }
    }

    /// A decode time the planner may count on: the prediction scaled by one spread of the
    /// codec's residuals, `exp(spread)` (a sample takes longer about one time in six). Planning
    /// on the mean would leave every batch whose samples run long a few hundred milliseconds
    /// late; planning on this, the slack goes where the errors are.
    pub fn planning_factor(&self, codec: Codec) -> f64 {
        self.fits.get(&codec).map_or(DEFAULT_SPREAD, OnlineFit::spread).exp()
    }

    /// Records that decoding `d` took `seconds`.
    pub fn observe(&mut self, d: &Descriptor, params: &Params, seconds: f64) {
        let f = Features::predict(d, params);
        self.fit(d.codec).observe(&f, seconds);
    }

    /// Records a decode given as the model's features (what the all-gathered step record
    /// carries, so every rank fits the same observations).
    pub fn observe_features(&mut self, codec: Codec, f: &Features, seconds: f64) {
        self.fit(codec).observe(f, seconds);
    }

    /// The fitted codecs and their coefficients and observation counts.
    pub fn codecs(&self) -> impl Iterator<Item = (Codec, Coefficients, u64)> + '_ {
        self.fits.iter().map(|(c, f)| (*c, f.coefficients(), f.observations()))
    }
}

/// The most observations a restored fit counts as ([`CostModel::restored`]).
pub const RESTORED_OBSERVATIONS: u64 = 256;

/// One codec's fit as a loader state keeps it ([`CostModel::saved`]): the normal equations, the
/// prior's, the coefficients and the residuals' running sums, so that a resumed run predicts
/// exactly as the run it continues did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedFit {
    /// The codec's name ([`Codec::name`]).
    pub codec: String,
    /// The observations' weighted normal equations, `AᵀWA` row by row, then `AᵀWb`.
    pub ata: [[f64; TERMS]; TERMS],
    /// See `ata`.
    pub atb: [f64; TERMS],
    /// The prior's pseudo-observations' normal equations.
    pub prior_ata: [[f64; TERMS]; TERMS],
    /// See `prior_ata`.
    pub prior_atb: [f64; TERMS],
    /// Observations fitted.
    pub observations: u64,
    /// c0, c_px, c_bits, c_seek.
    pub coefficients: [f64; TERMS],
    /// The residuals' decayed Σ of squared log-residuals, Σ of weights, and count.
    pub log_sq: f64,
    /// See `log_sq`.
    pub log_weight: f64,
    /// See `log_sq`.
    pub residuals: u64,
}

impl SavedFit {
    /// `Ok` when every figure is one a fit can hold (finite; weights, sums of squares and
    /// coefficients not negative); else what is wrong, naming the codec and the field.
    pub fn check(&self) -> Result<Codec, String> {
        let codec = Codec::from_name(&self.codec).filter(|c| *c != Codec::Unknown).ok_or_else(|| {
            format!("the decode model names an unknown codec {:?}", crate::text::clipped(&self.codec, 40))
        })?;
        let bad = |field: &str| {
            Err(format!("the {} decode model's {field} is not a value a fit holds", self.codec))
        };
        let finite = |v: &[f64]| v.iter().all(|x| x.is_finite());
        if !finite(&self.ata.concat())
            || !finite(&self.atb)
            || self.ata.iter().enumerate().any(|(k, r)| r[k] < 0.0)
        {
            return bad("ata/atb");
        }
        if !finite(&self.prior_ata.concat())
            || !finite(&self.prior_atb)
            || self.prior_ata.iter().enumerate().any(|(k, r)| r[k] < 0.0)
        {
            return bad("prior_ata/prior_atb");
        }
        if !finite(&self.coefficients) || self.coefficients.iter().any(|&c| c < 0.0) {
            return bad("coefficients");
        }
        if !(self.log_sq.is_finite()
            && self.log_sq >= 0.0
            && self.log_weight.is_finite()
            && self.log_weight >= 0.0)
        {
            return bad("log_sq/log_weight");
        }
        Ok(codec)
    }
}

impl CostModel {
    /// Every codec's fit, in codec order, to resume from ([`CostModel::restored`]).
    pub fn saved(&self) -> Vec<SavedFit> {
        self.fits
            .iter()
            .map(|(codec, f)| SavedFit {
                codec: codec.name().into(),
                ata: f.ata,
                atb: f.atb,
                prior_ata: f.prior_ata,
                prior_atb: f.prior_atb,
                observations: f.n,
                coefficients: f.coef.to_array(),
                log_sq: f.log_sq,
                log_weight: f.log_weight,
                residuals: f.residuals,
            })
            .collect()
    }

    /// A model for workers of `cores` of a core ([`CostModel::for_worker_cores`]) holding the
    /// `saved` fits: it predicts as the model that saved them did. A fit of more than
    /// [`RESTORED_OBSERVATIONS`] observations counts as that many (its normal equations scaled
    /// down alike, which keeps its coefficients): a run resumed on slower or faster machines
    /// moves to their speed within a few hundred decodes, not as slowly as its whole history
    /// would let it. A fit that fails [`SavedFit::check`], or a codec saved twice, is refused.
    ///
    /// ```
    /// use datahelix::decode::cost::{CostModel, Features};
    /// use datahelix::descriptor::Codec;
    ///
    /// let mut m = CostModel::for_worker_cores(0.4);
    /// let f = Features { mpixels: 30.0, mbits: 80.0, discarded: 28.0 };
    /// for k in 1..40 {
    ///     m.observe_features(Codec::H264, &Features { mpixels: k as f64, ..f }, 0.05 * k as f64);
    /// }
    /// let back = CostModel::restored(0.4, &m.saved()).unwrap();
    /// assert_eq!(back.predict_features(Codec::H264, &f), m.predict_features(Codec::H264, &f));
    /// assert_eq!(back.planning_factor(Codec::H264), m.planning_factor(Codec::H264));
    /// ```
    pub fn restored(cores: f64, saved: &[SavedFit]) -> Result<CostModel, String> {
        let mut model = CostModel::for_worker_cores(cores);
        for s in saved {
            let codec = s.check()?;
            let (mut ata, mut atb, mut n) = (s.ata, s.atb, s.observations);
            if n > RESTORED_OBSERVATIONS {
                let k = RESTORED_OBSERVATIONS as f64 / n as f64;
                ata.iter_mut().flatten().chain(atb.iter_mut()).for_each(|x| *x *= k);
                n = RESTORED_OBSERVATIONS;
            }
            let fit = OnlineFit {
                ata,
                atb,
                prior_ata: s.prior_ata,
                prior_atb: s.prior_atb,
                n,
                forget: model.forget,
                coef: Coefficients::from_array(s.coefficients),
                log_sq: s.log_sq,
                log_weight: s.log_weight,
                residuals: s.residuals,
            };
            if model.fits.insert(codec, fit).is_some() {
                return Err(format!("the decode model holds the {} codec twice", s.codec));
            }
        }
        Ok(model)
    }
}

/// Mean and 95th-percentile relative error `|pred − actual| / actual`.
pub fn relative_errors(pairs: &[(f64, f64)]) -> (f64, f64) {
    if pairs.is_empty() {
        return (0.0, 0.0);
    }
    let mut e: Vec<f64> = pairs.iter().map(|&(p, a)| (p - a).abs() / a.max(1e-12)).collect();
    e.sort_by(f64::total_cmp);
    let mean = e.iter().sum::<f64>() / e.len() as f64;
    let idx = ((e.len() as f64 * 0.95).ceil() as usize).clamp(1, e.len()) - 1;
    (mean, e[idx])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_known_coefficients_from_exact_data() {
        let truth = Coefficients { c0: 0.004, c_px: 0.003, c_bits: 0.01, c_seek: 0.0005 };
        let mut fit = OnlineFit::new(Coefficients::prior(Codec::H264), 2.0, 1.0);
        for i in 0..200u32 {
            let f = Features {
                mpixels: 1.0 + (i * 37 % 101) as f64,
                mbits: 0.1 + (i * 13 % 17) as f64,
                discarded: (i * 7 % 29) as f64,
            };
            fit.observe(&f, truth.predict(&f));
        }
        // The prior still pulls c0 a little (the data say little about it: every row has many
        // pixels); predictions are what must be right.
        let c = fit.coefficients();
        assert!((c.c_px - truth.c_px).abs() / truth.c_px < 0.05, "{c:?}");
        let f = Features { mpixels: 50.0, mbits: 5.0, discarded: 10.0 };
        assert!((fit.predict(&f) - truth.predict(&f)).abs() / truth.predict(&f) < 0.02, "{c:?}");
    }

    fn clip_720p() -> Descriptor {
        Descriptor {
            modality: Modality::Video,
            codec: Codec::H264,
            width: 1280,
            height: 720,
            frames: 240,
            fps_num: 24,
            fps_den: 1,
            duration_ticks: 10,
            time_base_num: 1,
            time_base_den: 1,
            bit_rate: 2_000_000,
            keyint: 12,
            ..Descriptor::default()
        }
    }

    #[test]
    fn the_whole_range_is_the_whole_prediction() {
        let p = Params::default();
        let d = clip_720p();
        let cases = [
            d,
            // Seek chosen for the whole: gaps between targets far above the GOP.
            Descriptor { frames: 3600, duration_ticks: 150, keyint: 30, ..d },
            Descriptor { keyint: 0, ..d },
            // No duration: the model assumes a second, the protocol one target.
            Descriptor { duration_ticks: 0, ..d },
            Descriptor { modality: Modality::Image, codec: Codec::Jpeg, frames: 1, bytes: 90_000, ..d },
        ];
        for d in cases {
            let f = crate::decode::sample::output_shape(&d, &p).0;
            assert_eq!(
                Features::predict_range(&d, &p, FrameRange::whole(f)),
                Features::predict(&d, &p),
                "{d:?}"
            );
            // A range reaching past F is cut to F.
            assert_eq!(
                Features::predict_range(&d, &p, FrameRange { start: 0, end: f + 5 }),
                Features::predict(&d, &p)
            );
        }
        assert_eq!(Features::predict_range(&d, &p, FrameRange { start: 3, end: 3 }), Features::default());
        // The second half of a split predicts about half the whole's work.
        let half = Features::predict_range(&d, &p, FrameRange { start: 8, end: 16 });
        let whole = Features::predict(&d, &p);
        assert!(half.mpixels < 0.6 * whole.mpixels, "{half:?} vs {whole:?}");
    }

    proptest::proptest! {
        #[test]
        fn pieces_add_up_to_no_more_than_the_whole_plus_keyframes(
            seconds_x10 in 10u32..600, fps in 1u32..61, keyint in 1u32..200, max_frames in 1u32..40,
            parts in 2u32..8, bit_rate in 0u64..10_000_000,
        ) {
            let d = Descriptor {
                frames: seconds_x10 * fps / 10,
                fps_num: fps,
                duration_ticks: seconds_x10 as i64,
                time_base_den: 10,
                keyint,
                bit_rate,
                bytes: 1_000_000,
                ..clip_720p()
            };
            let p = Params { max_frames, ..Params::default() };
            let whole = Features::predict(&d, &p);
            let ranges = crate::decode::split::split_targets(&d, &p, parts);
            let pieces: Vec<Features> = ranges.iter().map(|&r| Features::predict_range(&d, &p, r)).collect();
            let sum = |g: fn(&Features) -> f64| pieces.iter().map(g).sum::<f64>();
            // Each extra piece may add up to a GOP and its keyframe (a seek that lands early).
            let extra = (ranges.len() - 1) as f64 * (keyint as f64 + 1.0);
            let px = d.width as f64 * d.height as f64 / 1e6;
            let total = d.frames.max(1) as f64;
            let bits = if bit_rate > 0 { bit_rate as f64 * d.duration_s() } else { d.bytes as f64 * 8.0 } / 1e6;
            let tol = 1e-9 * (1.0 + whole.mpixels + whole.mbits + whole.discarded);
            proptest::prop_assert!(sum(|f| f.mpixels) <= whole.mpixels + extra * px + tol, "{:?} {:?} {:?}", ranges, pieces, whole);
            proptest::prop_assert!(sum(|f| f.mbits) <= whole.mbits + extra / total * bits + tol, "{:?} {:?}", pieces, whole);
            proptest::prop_assert!(sum(|f| f.discarded) <= whole.discarded + extra + tol, "{:?} {:?}", pieces, whole);
        }
    }

    #[test]
    fn predicts_before_any_observation_and_is_deterministic() {
        let d = Descriptor { keyint: 0, ..clip_720p() };
        let p = Params::default();
        let m = CostModel::default();
        assert!(m.predict(&d, &p) > 0.0);
        let run = || {
            let mut m = CostModel::default();
            for k in 1..20 {
                m.observe(&Descriptor { frames: 24 * k, duration_ticks: k as i64, ..d }, &p, 0.01 * k as f64);
            }
            m.predict(&d, &p)
        };
        assert_eq!(run().to_bits(), run().to_bits());
        let (mean, p95) = relative_errors(&[(1.1, 1.0), (0.9, 1.0), (1.5, 1.0)]);
        assert!((mean - 0.7 / 3.0).abs() < 1e-12 && (p95 - 0.5).abs() < 1e-12);
    }

    #[test]
    fn a_long_history_restored_counts_as_a_few_hundred_decodes() {
        let f = |k: u32| Features {
            mpixels: 5.0 + (k % 17) as f64,
            mbits: 1.0 + (k % 5) as f64,
            discarded: (k % 3) as f64,
        };
        let secs = |x: &Features| 0.002 + 0.003 * x.mpixels + 0.01 * x.mbits;
        let mut long = CostModel::for_worker_cores(0.5);
        for k in 0..5000 {
            long.observe_features(Codec::H264, &f(k), secs(&f(k)));
        }
        let mut back = CostModel::restored(0.5, &long.saved()).unwrap();
        let probe = Features { mpixels: 20.0, mbits: 3.0, discarded: 1.0 };
        let (a, b) = (long.predict_features(Codec::H264, &probe), back.predict_features(Codec::H264, &probe));
        assert!((a - b).abs() <= 1e-9 * a, "{a} against {b}");
        assert_eq!(back.codecs().next().unwrap().2, RESTORED_OBSERVATIONS);
        // Resumed on machines half as fast, after 256 decodes there: the restored model predicts
        // 4/3 of the old time (the new decodes weigh half as much, by 1 / seconds), the whole
        // history 1.025 of it.
        for k in 0..256 {
            long.observe_features(Codec::H264, &f(k), 2.0 * secs(&f(k)));
            back.observe_features(Codec::H264, &f(k), 2.0 * secs(&f(k)));
        }
        let truth = 2.0 * secs(&probe);
        let (a, b) = (long.predict_features(Codec::H264, &probe), back.predict_features(Codec::H264, &probe));
        assert!(b > 0.62 * truth && a < 0.55 * truth, "restored {b}, uninterrupted {a}, truth {truth}");
    }
}
