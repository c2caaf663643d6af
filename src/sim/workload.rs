//! Workload files (TOML): a dataset mixture in the generator spec's vocabulary
//! ([`crate::gen::Spec`]: modalities, codecs, resolutions, frame rates, durations, text tokens —
//! plus bit rates and image file sizes, which the generator gets from its encoder), a model
//! profile (token or latent formula and the emulated accelerator's constants), the run (global
//! batch, ranks, workers per rank) and the cluster's links. Decode times come from a decode-cost
//! calibration made on real decoding (`datahelix calibrate --json`), with its residual spread.
//!
//! ```
//! let text = r#"
//! name = "example"
//! follows = "nothing in particular"
//! [model]
//! formula = "tokens"
//! c0 = 0.05
//! a = 2e-5
//! b = 0.0
//! sigma = 0.05
//! [run]
//! global_batch = 16
//! ranks = 2
//! workers_per_rank = 2
//! [dataset]
//! count = 100
//! [[dataset.components]]
//! weight = 1
//! modality = "image"
//! codec = "jpeg"
//! resolutions = [{ size = [640, 480], weight = 1 }]
//! file_kb = { median = 80, sigma = 0.3, min = 10, max = 400 }
//! text_tokens = { median = 32, sigma = 0.5, min = 4, max = 256 }
//! "#;
//! let w = datahelix::sim::workload::Workload::parse(text, "example.toml").unwrap();
//! assert_eq!(w.run.ranks, 2);
//! let d = w.descriptors();
//! assert_eq!(d.len(), 100);
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cost::accel::TokenFormula;
use crate::decode::cost::{Coefficients, Features};
use crate::decode::sample::{output_shape, Params};
use crate::decode::FrameRange;
use crate::descriptor::{Codec, Container, Descriptor, Modality, Status};
use crate::emu::Profile;
use crate::gen::{LogNormal, Weighted, WeightedValue};
use crate::plan::TransferCost;
use crate::rng::Rng;
use crate::sampler::splitmix64;

use super::engine::Links;

/// A whole workload file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Name in reports.
    pub name: String,
    /// Which public dataset's and model's published statistics it follows.
    pub follows: String,
    /// What is approximated, honestly.
    #[serde(default)]
    pub approximations: String,
    /// The regime it stands for, the suite's grouping (`sim --suite` reports each regime beside
    /// the whole): e.g. `mild`, `latents`, `interleaved`, `long segments`, `camera originals`,
    /// `high frame rates`, `few samples a rank`. Files without it are [`DEFAULT_REGIME`].
    #[serde(default = "default_regime")]
    pub regime: String,
    /// Decode-cost calibration (`datahelix calibrate --json` output), relative to the file.
    #[serde(default = "default_calibration")]
    pub calibration: String,
    /// The model.
    pub model: Model,
    /// The run.
    pub run: Run,
    /// The cluster's links.
    #[serde(default)]
    pub cluster: Cluster,
    /// Preprocessing (the protocol's defaults unless given).
    #[serde(default)]
    pub preprocess: Preprocess,
    /// The data.
    pub dataset: Dataset,
    /// Where it was read from (set by [`Workload::load`]).
    #[serde(skip)]
    pub path: PathBuf,
}

fn default_calibration() -> String {
    "calibration.json".into()
}

/// The regime of a workload file that names none (files written before regimes existed load as
/// this).
pub const DEFAULT_REGIME: &str = "mild";

fn default_regime() -> String {
    DEFAULT_REGIME.into()
}

/// The model: token formula and emulated accelerator.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// Public model whose formula this is.
    #[serde(default)]
    pub name: String,
    /// `tokens` or `latents`.
    pub formula: TokenFormula,
    /// Per-step seconds.
    pub c0: f64,
    /// Seconds per token.
    pub a: f64,
    /// Seconds per token².
    pub b: f64,
    /// Log-normal step noise.
    pub sigma: f64,
}

impl Model {
    /// The emulated accelerator's profile.
    pub fn profile(&self) -> Profile {
        Profile { c0: self.c0, a: self.a, b: self.b, sigma: self.sigma }
    }
}

/// The run's shape.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Run {
    /// Samples per global batch (at `ranks`; scaled with ranks when `--ranks` changes them).
    pub global_batch: usize,
    /// Ranks.
    pub ranks: usize,
    /// Decode workers per rank.
    pub workers_per_rank: usize,
    /// Cores per rank the workers share (default: one per worker).
    #[serde(default)]
    pub cores_per_rank: Option<f64>,
    /// The CPU budget as a share of the accelerator (instead of `cores_per_rank`): cores per rank
    /// such that the workload's mean decode CPU-seconds of a step, over all ranks' cores, take
    /// this share of the mean accelerator step of a balanced batch. Below 1 the budget suffices in
    /// aggregate; whether it suffices on every rank is what the policies differ in.
    #[serde(default)]
    pub cpu_per_accel: Option<f64>,
    /// Steps, warm-up included.
    #[serde(default = "default_steps")]
    pub steps: u64,
    /// Warm-up steps (not measured).
    #[serde(default = "default_warmup")]
    pub warmup: u64,
    /// Steps decoded ahead.
    #[serde(default = "default_lookahead")]
    pub lookahead: usize,
    /// Seed of the sampler, the step noise and the decode-time residuals.
    #[serde(default)]
    pub seed: u64,
}

fn default_steps() -> u64 {
    60
}
fn default_warmup() -> u64 {
    5
}
fn default_lookahead() -> usize {
    crate::exec::loader::DEFAULT_LOOKAHEAD
}

/// Links: `α` seconds and `β` bytes per second within and between nodes.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    /// Ranks per node.
    pub ranks_per_node: usize,
    /// Intra-node latency, seconds.
    pub intra_alpha_s: f64,
    /// Intra-node bandwidth, bytes per second.
    pub intra_beta: f64,
    /// Inter-node latency, seconds.
    pub inter_alpha_s: f64,
    /// Inter-node bandwidth, bytes per second.
    pub inter_beta: f64,
}

impl Default for Cluster {
    /// 8 ranks a node; host-memory staging within a node (5 µs, 20 GB/s) and one 200 Gb/s NIC
    /// port per rank between nodes (20 µs, 25 GB/s).
    fn default() -> Self {
        Cluster {
            ranks_per_node: 8,
            intra_alpha_s: 5e-6,
            intra_beta: 2e10,
            inter_alpha_s: 2e-5,
            inter_beta: 2.5e10,
        }
    }
}

impl Cluster {
    /// The links.
    pub fn links(&self) -> Links {
        Links {
            ranks_per_node: self.ranks_per_node.max(1),
            intra: TransferCost::linear(self.intra_alpha_s, self.intra_beta),
            inter: TransferCost::linear(self.inter_alpha_s, self.inter_beta),
        }
    }
}

/// Preprocessing parameters (the protocol's defaults).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preprocess {
    /// Frames sampled per second.
    pub sample_fps: u32,
    /// Most frames per sample.
    pub max_frames: u32,
    /// Most output pixels per frame.
    pub max_pixels: u64,
}

impl Default for Preprocess {
    fn default() -> Self {
        let p = Params::default();
        Preprocess { sample_fps: p.sample_fps.0, max_frames: p.max_frames, max_pixels: p.max_pixels }
    }
}

impl Preprocess {
    /// As the decoder's parameters.
    pub fn params(&self) -> Params {
        Params { sample_fps: (self.sample_fps, 1), max_frames: self.max_frames, max_pixels: self.max_pixels }
    }
}

/// The dataset: a weighted mixture.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dataset {
    /// Samples (the sampler wraps around them).
    pub count: usize,
    /// Seed of the descriptors.
    #[serde(default)]
    pub seed: u64,
    /// Share of samples that fail (missing, corrupt), skipped by every policy.
    #[serde(default)]
    pub failure_rate: f64,
    /// The mixture.
    pub components: Vec<Component>,
}

/// One kind of sample (the generator spec's fields, plus bit rate and image size).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    /// What this component stands for.
    #[serde(default)]
    pub label: String,
    /// Relative weight.
    pub weight: f64,
    /// `video` or `image`.
    pub modality: String,
    /// `h264`, `mpeg4`, `hevc`, `vp9`, `av1` (video); `jpeg`, `png` (image) — the decoded codecs.
    pub codec: String,
    /// Frame sizes.
    pub resolutions: Vec<Weighted<[u32; 2]>>,
    /// Frame rates (video).
    #[serde(default)]
    pub fps: Vec<WeightedValue>,
    /// Duration, seconds (video).
    #[serde(default)]
    pub duration_s: Option<LogNormal>,
    /// Keyframe interval, frames (video; 0: unknown).
    #[serde(default)]
    pub gop: Option<u32>,
    /// Bit rate, Mb/s (video).
    #[serde(default)]
    pub bit_rate_mbps: Option<LogNormal>,
    /// File size, KB (image).
    #[serde(default)]
    pub file_kb: Option<LogNormal>,
    /// Text tokens.
    pub text_tokens: LogNormal,
}

/// One codec's calibrated decode cost and residual spread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecCost {
    /// Fitted coefficients.
    pub coefficients: Coefficients,
    /// Log-normal σ of the residual (from the calibration's mean relative error).
    pub sigma: f64,
}

/// The decode-cost calibration: per codec, coefficients and residual.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// By codec.
    pub codecs: BTreeMap<Codec, CodecCost>,
    /// Where it came from.
    pub source: String,
}

#[derive(Deserialize)]
struct CalJson {
    models: BTreeMap<String, CalModel>,
}
#[derive(Deserialize)]
struct CalModel {
    coefficients: CalCoef,
    mean_rel_error: f64,
}
#[derive(Deserialize)]
struct CalCoef {
    c0: f64,
    c_px: f64,
    c_bits: f64,
    c_seek: f64,
}

impl Calibration {
    /// Reads `datahelix calibrate --json` output.
    pub fn load(path: &Path) -> Result<Calibration, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read calibration {}: {e}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses `datahelix calibrate --json` output; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Calibration, String> {
        let doc: CalJson = serde_json::from_str(text).map_err(|e| format!("calibration {source}: {e}"))?;
        let mut codecs = BTreeMap::new();
        for (name, m) in doc.models {
            let codec = Codec::from_name(&name)
                .ok_or_else(|| format!("calibration {source}: models.{name}: unknown codec"))?;
            let c = m.coefficients;
            if ![c.c0, c.c_px, c.c_bits, c.c_seek, m.mean_rel_error].iter().all(|x| x.is_finite()) {
                return Err(format!("calibration {source}: models.{name}: coefficients must be finite"));
            }
            // For log-normal noise, E|e^{σz} − 1| ≈ σ·√(2/π) (small σ).
            let sigma = (m.mean_rel_error.max(0.0) * (std::f64::consts::PI / 2.0).sqrt()).min(1.0);
            codecs.insert(
                codec,
                CodecCost {
                    coefficients: Coefficients { c0: c.c0, c_px: c.c_px, c_bits: c.c_bits, c_seek: c.c_seek },
                    sigma,
                },
            );
        }
        if codecs.is_empty() {
            return Err(format!("calibration {source}: no models"));
        }
        Ok(Calibration { codecs, source: source.into() })
    }

    /// The true decode CPU seconds of `d`: the calibrated cost of the frames a decoder decodes
    /// ([`Features::exact_range`] of the whole sample) times a log-normal residual drawn from
    /// `(seed, id)` (the same sample costs the same whenever it is decoded).
    pub fn decode_s(&self, d: &Descriptor, params: &Params, seed: u64) -> Result<f64, String> {
        let cost = self.codecs.get(&d.codec).ok_or_else(|| {
            format!("calibration {} has no model for codec {}", self.source, d.codec.name())
        })?;
        let base = cost.coefficients.predict(&Features::exact_range(d, params, whole(d, params)));
        let mut rng = Rng(splitmix64(seed ^ 0x5EED_DEC0_DE00_0000) ^ d.id);
        let z = rng.normal();
        Ok(base * (cost.sigma * z - cost.sigma * cost.sigma / 2.0).exp())
    }

    /// The true CPU seconds of decoding only the targets `range` of `d`, whose whole decode
    /// takes `whole_s` ([`Calibration::decode_s`]): the same residual, on the calibrated cost
    /// of the range's frames. A codec the calibration lacks costs its share of the frames.
    pub fn part_s(&self, d: &Descriptor, params: &Params, whole_s: f64, range: FrameRange) -> f64 {
        if range == whole(d, params) {
            return whole_s;
        }
        let Some(cost) = self.codecs.get(&d.codec) else {
            return whole_s * range.len() as f64 / whole(d, params).len().max(1) as f64;
        };
        let c = &cost.coefficients;
        whole_s * c.predict(&Features::exact_range(d, params, range))
            / c.predict(&Features::exact_range(d, params, whole(d, params)))
    }

    /// The least CPU seconds, on one worker, before the slowest-to-reach target of `d` is
    /// decoded, however the sample is cut and whoever decodes it: the calibrated cost of that
    /// target's run from its keyframe ([`Features::longest_chain`]) under the same residual,
    /// leaving out the per-frame discard term (a piece that keeps several targets of one run
    /// discards fewer of its frames). No more than `whole_s`; 0 where no such floor is known (a
    /// video without a timing, a codec without a model or with a negative coefficient).
    pub fn chain_s(&self, d: &Descriptor, params: &Params, whole_s: f64) -> f64 {
        let (Some(cost), Some(run)) = (self.codecs.get(&d.codec), Features::longest_chain(d, params)) else {
            return 0.0;
        };
        let c = &cost.coefficients;
        if [c.c0, c.c_px, c.c_bits, c.c_seek].iter().any(|x| *x < 0.0) {
            return 0.0;
        }
        let floor = c.c0 + c.c_px * run.mpixels + c.c_bits * run.mbits;
        let whole_pred = c.predict(&Features::exact_range(d, params, whole(d, params)));
        (whole_s * floor / whole_pred).clamp(0.0, whole_s.max(0.0))
    }
}

/// Every target of `d`.
fn whole(d: &Descriptor, params: &Params) -> FrameRange {
    FrameRange::whole(output_shape(d, params).0)
}

impl Workload {
    /// Reads and checks a workload file (errors name the file and field).
    pub fn load(path: &Path) -> Result<Workload, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read workload {}: {e}", path.display()))?;
        let mut w = Self::parse(&text, &path.display().to_string())?;
        w.path = path.to_path_buf();
        Ok(w)
    }

    /// Parses and checks a workload; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Workload, String> {
        let w: Workload = toml::from_str(text).map_err(|e| format!("workload {source}: {e}"))?;
        w.validate().map_err(|e| format!("workload {source}: {e}"))?;
        Ok(w)
    }

    /// The calibration file's path (relative to the workload's folder).
    pub fn calibration_path(&self) -> PathBuf {
        let p = Path::new(&self.calibration);
        if p.is_absolute() {
            return p.to_path_buf();
        }
        self.path.parent().unwrap_or(Path::new(".")).join(p)
    }

    /// Checks every field the simulator relies on; names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.regime.trim().is_empty() {
            return Err("regime must not be empty (leave it out for the default, \"mild\")".into());
        }
        let m = &self.model;
        for (f, v) in [("model.c0", m.c0), ("model.a", m.a), ("model.b", m.b), ("model.sigma", m.sigma)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{f} must be a non-negative number"));
            }
        }
        let r = &self.run;
        if r.global_batch == 0 || r.ranks == 0 || r.workers_per_rank == 0 || r.lookahead == 0 {
            return Err(
                "run.global_batch, run.ranks, run.workers_per_rank and run.lookahead must be ≥ 1".into()
            );
        }
        if r.warmup >= r.steps {
            return Err("run.warmup must be smaller than run.steps".into());
        }
        if let Some(c) = r.cores_per_rank {
            if !(c.is_finite() && c > 0.0) {
                return Err("run.cores_per_rank must be positive".into());
            }
        }
        if let Some(x) = r.cpu_per_accel {
            if !(x.is_finite() && x > 0.0) {
                return Err("run.cpu_per_accel must be positive".into());
            }
            if r.cores_per_rank.is_some() {
                return Err("run: give cores_per_rank or cpu_per_accel, not both".into());
            }
        }
        let c = &self.cluster;
        if c.ranks_per_node == 0 {
            return Err("cluster.ranks_per_node must be ≥ 1".into());
        }
        for (f, v) in [
            ("cluster.intra_alpha_s", c.intra_alpha_s),
            ("cluster.inter_alpha_s", c.inter_alpha_s),
            ("cluster.intra_beta", c.intra_beta),
            ("cluster.inter_beta", c.inter_beta),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{f} must be a non-negative number"));
            }
        }
        if c.intra_beta <= 0.0 || c.inter_beta <= 0.0 {
            return Err("cluster.intra_beta and cluster.inter_beta must be positive".into());
        }
        let p = &self.preprocess;
        if p.sample_fps == 0 || p.max_frames == 0 || p.max_pixels < 28 * 28 {
            return Err("preprocess: sample_fps and max_frames ≥ 1, max_pixels ≥ 784".into());
        }
        let d = &self.dataset;
        if d.count == 0 {
            return Err("dataset.count must be ≥ 1".into());
        }
        if !(0.0..1.0).contains(&d.failure_rate) {
            return Err("dataset.failure_rate must be in [0, 1)".into());
        }
        if d.components.is_empty() {
            return Err("dataset.components is empty".into());
        }
        for (i, c) in d.components.iter().enumerate() {
            let bad = |what: &str| Err(format!("dataset.components[{i}]: {what}"));
            let ln_ok = |l: &LogNormal| l.median > 0.0 && l.min >= 0.0 && l.min <= l.max && l.sigma >= 0.0;
            if !(c.weight > 0.0 && c.weight.is_finite()) {
                return bad("weight must be positive");
            }
            match (c.modality.as_str(), c.codec.as_str()) {
                ("video", "h264" | "mpeg4" | "hevc" | "vp9" | "av1") => {
                    if c.fps.is_empty() || c.fps.iter().any(|f| !(f.value > 0.0 && f.weight > 0.0)) {
                        return bad("fps: video needs choices with positive values and weights");
                    }
                    match &c.duration_s {
                        Some(l) if ln_ok(l) && l.min > 0.0 => {}
                        _ => return bad("duration_s: video needs {median > 0, sigma ≥ 0, 0 < min ≤ max}"),
                    }
                    match &c.bit_rate_mbps {
                        Some(l) if ln_ok(l) => {}
                        _ => return bad("bit_rate_mbps: video needs {median > 0, sigma ≥ 0, 0 ≤ min ≤ max}"),
                    }
                }
                ("image", "jpeg" | "png") => match &c.file_kb {
                    Some(l) if ln_ok(l) => {}
                    _ => return bad("file_kb: image needs {median > 0, sigma ≥ 0, 0 ≤ min ≤ max}"),
                },
                (m, k) => {
                    return bad(&format!(
                        "modality/codec {m}/{k}: one of video/h264, video/mpeg4, video/hevc, video/vp9, video/av1, image/jpeg, image/png (the decoded codecs)"
                    ))
                }
            }
            if c.resolutions.is_empty()
                || c.resolutions
                    .iter()
                    .any(|r| r.weight <= 0.0 || r.size.iter().any(|&s| !(16..=8192).contains(&s)))
            {
                return bad("resolutions need sizes in 16..=8192 and positive weights");
            }
            if !(c.text_tokens.min >= 0.0 && c.text_tokens.min <= c.text_tokens.max) {
                return bad("text_tokens needs 0 ≤ min ≤ max");
            }
        }
        Ok(())
    }

    /// The dataset's descriptors, drawn from the mixture (deterministic per `dataset.seed`).
    pub fn descriptors(&self) -> Vec<Descriptor> {
        let d = &self.dataset;
        let mut rng = Rng(splitmix64(d.seed ^ 0x0DA7_A5E7));
        let mut out = Vec::with_capacity(d.count);
        for i in 0..d.count {
            let c = &d.components[rng.pick(d.components.iter().map(|c| c.weight))];
            let [w, h] = c.resolutions[rng.pick(c.resolutions.iter().map(|r| r.weight))].size;
            let ln = |rng: &mut Rng, l: &LogNormal| rng.lognormal(l.median, l.sigma, l.min, l.max);
            let text_tokens = ln(&mut rng, &c.text_tokens).round() as u32;
            let id = splitmix64(d.seed.wrapping_add(i as u64));
            let mut desc = Descriptor {
                id,
                width: w,
                height: h,
                text_tokens,
                status: Status::Ok,
                manifest_line: i as u32 + 1,
                ..Descriptor::default()
            };
            if c.modality == "video" {
                let fps = c.fps[rng.pick(c.fps.iter().map(|f| f.weight))].value;
                let dur = c.duration_s.as_ref().map_or(1.0, |l| ln(&mut rng, l)).max(0.05);
                let mbps = c.bit_rate_mbps.as_ref().map_or(1.0, |l| ln(&mut rng, l));
                let fps_den = 1000u32;
                let fps_num = (fps * fps_den as f64).round().max(1.0) as u32;
                desc.modality = Modality::Video;
                desc.codec = Codec::from_name(&c.codec).unwrap_or(Codec::H264);
                desc.container = Container::Mp4;
                desc.fps_num = fps_num;
                desc.fps_den = fps_den;
                desc.time_base_num = 1;
                desc.time_base_den = 1000;
                desc.duration_ticks = (dur * 1000.0).round().max(1.0) as i64;
                desc.frames = (dur * fps).round().max(1.0) as u32;
                desc.bit_rate = (mbps * 1e6).round() as u64;
                desc.bytes = (mbps * 1e6 * dur / 8.0).round() as u64;
                desc.keyint = c.gop.unwrap_or(0);
            } else {
                let kb = c.file_kb.as_ref().map_or(100.0, |l| ln(&mut rng, l));
                desc.modality = Modality::Image;
                desc.codec = if c.codec == "jpeg" { Codec::Jpeg } else { Codec::Png };
                desc.container = if c.codec == "jpeg" { Container::Jpeg } else { Container::Png };
                desc.frames = 1;
                desc.bytes = (kb * 1000.0).round() as u64;
            }
            if d.failure_rate > 0.0 && rng.uniform() < d.failure_rate {
                desc.status = Status::Corrupt;
            }
            out.push(desc);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
name = "t"
follows = "test"
[model]
formula = "latents"
c0 = 0.1
a = 1e-6
b = 0.0
sigma = 0.0
[run]
global_batch = 8
ranks = 2
workers_per_rank = 2
[dataset]
count = 50
failure_rate = 0.1
[[dataset.components]]
weight = 1
modality = "video"
codec = "h264"
resolutions = [{ size = [1280, 720], weight = 1 }]
fps = [{ value = 30, weight = 1 }]
duration_s = { median = 10, sigma = 0.2, min = 2, max = 30 }
bit_rate_mbps = { median = 4, sigma = 0.3, min = 0.5, max = 20 }
gop = 60
text_tokens = { median = 64, sigma = 0.3, min = 1, max = 512 }
"#;

    #[test]
    fn parses_and_draws_deterministic_descriptors() {
        let w = Workload::parse(BASE, "t.toml").unwrap();
        assert_eq!(w.model.formula, TokenFormula::Latents);
        let (a, b) = (w.descriptors(), w.descriptors());
        assert_eq!(a, b);
        assert!(a.iter().all(|d| d.modality == Modality::Video && d.keyint == 60 && d.bit_rate > 0));
        let failed = a.iter().filter(|d| !d.status.is_ok()).count();
        assert!(failed > 0 && failed < 20, "{failed}");
    }

    #[test]
    fn bad_files_name_the_field() {
        let e = Workload::parse(&BASE.replace("ranks = 2", "ranks = 0"), "x.toml").unwrap_err();
        assert!(e.contains("x.toml") && e.contains("run.ranks"), "{e}");
        let e = Workload::parse(&BASE.replace("codec = \"h264\"", "codec = \"vp8\""), "x.toml").unwrap_err();
        assert!(e.contains("components[0]") && e.contains("vp8"), "{e}");
        let e = Workload::parse(&BASE.replace("bit_rate_mbps", "bitrate"), "x.toml").unwrap_err();
        assert!(e.contains("x.toml") && e.contains("bitrate"), "{e}");
        let e = Workload::parse("name = 3", "y.toml").unwrap_err();
        assert!(e.contains("y.toml"), "{e}");
        let e = Workload::parse(
            &BASE.replace("follows = \"test\"", "follows = \"test\"\nregime = \" \""),
            "r.toml",
        )
        .unwrap_err();
        assert!(e.contains("r.toml") && e.contains("regime"), "{e}");
    }

    #[test]
    fn regime_defaults_to_mild_and_is_read_when_given() {
        assert_eq!(Workload::parse(BASE, "t.toml").unwrap().regime, DEFAULT_REGIME);
        let tagged = BASE.replace("follows = \"test\"", "follows = \"test\"\nregime = \"long segments\"");
        let w = Workload::parse(&tagged, "t.toml").unwrap();
        assert_eq!(w.regime, "long segments");
        // The tag changes nothing else: same descriptors.
        assert_eq!(w.descriptors(), Workload::parse(BASE, "t.toml").unwrap().descriptors());
    }

    #[test]
    fn no_piece_holding_a_clips_longest_run_costs_less_than_the_run() {
        // The camera originals: 4K60 H.264 with a keyframe every 250 frames.
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/workloads/egoexo4d_4k.toml");
        let w = Workload::load(&path).unwrap();
        let cal = Calibration::load(&w.calibration_path()).unwrap();
        let p = w.preprocess.params();
        for d in w.descriptors().iter().take(300) {
            let whole_s = cal.decode_s(d, &p, 7).unwrap();
            let chain = cal.chain_s(d, &p, whole_s);
            assert!(chain > 0.0 && chain <= whole_s, "{} of {whole_s} s", chain);
            // However the sample is cut, some piece holds the target of the longest run and
            // costs at least the run.
            for parts in [2, 3, 5, 16, 1024] {
                let pieces = crate::decode::split::split_targets(d, &p, parts);
                let most = pieces.iter().map(|&r| cal.part_s(d, &p, whole_s, r)).fold(0.0, f64::max);
                assert!(most >= chain * (1.0 - 1e-12), "{parts} parts: largest {most} s < run {chain} s");
            }
        }
    }

    #[test]
    fn calibration_parses_and_draws_positive_times() {
        let text = r#"{"models": {"h264": {"coefficients": {"c0": 0.003, "c_px": 0.004, "c_bits": 0.002,
            "c_seek": 0.0001}, "mean_rel_error": 0.2, "p95_rel_error": 0.5, "n": 10, "n_heldout": 3}}}"#;
        let c = Calibration::parse(text, "cal.json").unwrap();
        let w = Workload::parse(BASE, "t.toml").unwrap();
        let p = w.preprocess.params();
        for d in w.descriptors() {
            let s = c.decode_s(&d, &p, 1).unwrap();
            assert!(s > 0.0 && s == c.decode_s(&d, &p, 1).unwrap());
        }
        assert!(Calibration::parse("{}", "cal.json").unwrap_err().contains("cal.json"));
    }
}
