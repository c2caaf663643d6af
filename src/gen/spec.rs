//! The dataset spec that `datahelix gen` reads (JSON).
//!
//! ```
//! let spec: datahelix::gen::Spec = serde_json::from_str(r#"{
//!   "name": "example", "count": 4, "seed": 1,
//!   "components": [{
//!     "weight": 1, "modality": "video", "codec": "h264", "container": "mp4",
//!     "resolutions": [{"size": [320, 240], "weight": 1}],
//!     "fps": [{"value": 24, "weight": 1}],
//!     "duration_s": {"median": 2.0, "sigma": 0.3, "min": 1.0, "max": 4.0},
//!     "content": "testsrc",
//!     "text_tokens": {"median": 32, "sigma": 0.5, "min": 4, "max": 256}
//!   }]
//! }"#).unwrap();
//! spec.validate().unwrap();
//! ```

use serde::{Deserialize, Serialize};

/// A whole dataset: how many samples, the seed, and the mixture they are drawn from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// A name for reports.
    pub name: String,
    /// Number of samples.
    pub count: usize,
    /// Seed of every random choice (the same spec writes the same dataset).
    pub seed: u64,
    /// The weighted mixture.
    pub components: Vec<Component>,
    /// Damaged samples to include on purpose (for tests of skipping).
    #[serde(default)]
    pub faults: Faults,
}

/// One kind of sample in the mixture.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Component {
    /// Relative weight in the mixture.
    pub weight: f64,
    /// `video` or `image`.
    pub modality: String,
    /// `h264`, `mpeg4`, `hevc`, `vp9` or `av1` for video; `jpeg` or `png` for images.
    pub codec: String,
    /// `mp4` or `mkv` for video, or `webm` for vp9 and av1 (ignored for images).
    #[serde(default)]
    pub container: Option<String>,
    /// Frame sizes to choose from.
    pub resolutions: Vec<Weighted<[u32; 2]>>,
    /// Frame rates to choose from (video).
    #[serde(default)]
    pub fps: Vec<WeightedValue>,
    /// Duration distribution in seconds (video).
    #[serde(default)]
    pub duration_s: Option<LogNormal>,
    /// Keyframe interval in frames (video; default: the encoder's).
    #[serde(default)]
    pub gop: Option<u32>,
    /// `testsrc` (smooth test pattern), `fractal` (Mandelbrot zoom) or `noise` (high bit rate).
    pub content: String,
    /// Encoder quality: CRF for h264 (x264, default 23), hevc (x265, 28), vp9 (libvpx, 36) and
    /// av1 (SVT-AV1, 40); qscale for mpeg4 (5) and jpeg (3).
    #[serde(default)]
    pub quality: Option<u32>,
    /// Text tokens distribution.
    pub text_tokens: LogNormal,
}

/// A choice with a weight.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Weighted<T> {
    /// The value.
    pub size: T,
    /// Its weight.
    pub weight: f64,
}

/// A numeric choice with a weight.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeightedValue {
    /// The value.
    pub value: f64,
    /// Its weight.
    pub weight: f64,
}

/// A log-normal distribution given by its median and log-space sigma, clamped to `[min, max]`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LogNormal {
    /// Median.
    pub median: f64,
    /// Standard deviation of the logarithm.
    pub sigma: f64,
    /// Lower clamp.
    pub min: f64,
    /// Upper clamp.
    pub max: f64,
}

/// Samples damaged on purpose after generation.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// Videos cut to half their bytes.
    #[serde(default)]
    pub truncated: usize,
    /// Files overwritten with text.
    #[serde(default)]
    pub not_media: usize,
    /// Manifest entries whose file is deleted.
    #[serde(default)]
    pub missing: usize,
}

impl Spec {
    /// Reads a spec file.
    pub fn load(path: &std::path::Path) -> Result<Spec, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read spec {}: {e}", path.display()))?;
        let spec: Spec = serde_json::from_str(&text).map_err(|e| format!("spec {}: {e}", path.display()))?;
        spec.validate().map_err(|e| format!("spec {}: {e}", path.display()))?;
        Ok(spec)
    }

    /// Checks every field a generator relies on; says which component is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.components.is_empty() {
            return Err("no components".into());
        }
        if self.faults.truncated + self.faults.not_media + self.faults.missing > self.count {
            return Err("more faults than samples".into());
        }
        for (i, c) in self.components.iter().enumerate() {
            let bad = |what: &str| Err(format!("component {i}: {what}"));
            if !(c.weight > 0.0 && c.weight.is_finite()) {
                return bad("weight must be positive");
            }
            match (c.modality.as_str(), c.codec.as_str()) {
                ("video", "h264" | "mpeg4" | "hevc" | "vp9" | "av1") => {
                    match (c.codec.as_str(), c.container.as_deref()) {
                        ("vp9" | "av1", Some("mp4" | "mkv" | "webm")) | (_, Some("mp4" | "mkv")) => {}
                        ("vp9" | "av1", _) => return bad("video needs container mp4, mkv or webm"),
                        (_, Some("webm")) => return bad("webm holds only vp9 or av1 video"),
                        _ => return bad("video needs container mp4 or mkv"),
                    }
                    if c.fps.is_empty() || c.fps.iter().any(|f| !(f.value > 0.0 && f.weight > 0.0)) {
                        return bad("video needs fps choices with positive values and weights");
                    }
                    match &c.duration_s {
                        Some(d) if d.min > 0.0 && d.min <= d.max && d.median > 0.0 => {}
                        _ => return bad("video needs duration_s with 0 < min <= max and median > 0"),
                    }
                }
                ("image", "jpeg" | "png") => {}
                (m, k) => return bad(&format!("unsupported modality/codec {m}/{k}")),
            }
            if !matches!(c.content.as_str(), "testsrc" | "fractal" | "noise") {
                return bad("content must be testsrc, fractal or noise");
            }
            if c.resolutions.is_empty()
                || c.resolutions.iter().any(|r| {
                    r.weight <= 0.0
                        || r.size[0] < 16
                        || r.size[1] < 16
                        || r.size[0] > 8192
                        || r.size[1] > 8192
                })
            {
                return bad("resolutions need sizes in 16..=8192 and positive weights");
            }
            if c.text_tokens.min < 0.0 || c.text_tokens.min > c.text_tokens.max {
                return bad("text_tokens needs 0 <= min <= max");
            }
        }
        Ok(())
    }
}
