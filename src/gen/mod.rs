//! `datahelix gen`: writes a dataset in the protocol's format (`manifest.jsonl` + media files)
//! from a [`Spec`], driving the `ffmpeg` command-line tool. Deterministic per spec and seed:
//! the same spec names the same ids, paths, sizes, durations and encoder settings.
//!
//! ```no_run
//! use datahelix::gen::{generate, GenOptions, Spec};
//!
//! let spec = Spec::load(std::path::Path::new("scripts/specs/tiny.json")).unwrap();
//! let report = generate(&spec, std::path::Path::new("data/tiny"), &GenOptions::default()).unwrap();
//! println!("{} samples in {:.1} s", report.count, report.seconds);
//! ```

mod spec;

pub use spec::{Component, Faults, LogNormal, Spec, Weighted, WeightedValue};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rayon::prelude::*;

use crate::manifest::MANIFEST_FILE;
use crate::rng::Rng;
use crate::sampler::splitmix64;

/// Where `gen` records the spec a folder was generated from (to skip regenerating it).
pub const GEN_SPEC_PATH: &str = ".datahelix/gen-spec.json";

/// How to generate.
#[derive(Clone, Debug, Default)]
pub struct GenOptions {
    /// Parallel `ffmpeg` processes (0: one per core).
    pub workers: usize,
    /// Regenerate even if the folder already holds this spec's dataset.
    pub force: bool,
    /// The `ffmpeg` program (default: `ffmpeg` on PATH).
    pub ffmpeg: Option<PathBuf>,
}

/// What a generation did.
#[derive(Clone, Debug)]
pub struct GenReport {
    /// Samples in the manifest.
    pub count: usize,
    /// False when the folder already held this spec's dataset and nothing was written.
    pub generated: bool,
    /// Wall seconds.
    pub seconds: f64,
}

/// One planned sample: everything needed to write its file, chosen from the spec.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedSample {
    /// Sample id (full u64 range).
    pub id: u64,
    /// Path relative to the dataset folder.
    pub path: String,
    /// Text tokens.
    pub text_tokens: u32,
    /// Index of the component it was drawn from.
    pub component: usize,
    /// Width, height.
    pub size: [u32; 2],
    /// Frame rate (video).
    pub fps: f64,
    /// Duration in seconds (video).
    pub duration_s: f64,
}

/// Chooses every sample of the dataset (no files are written).
pub fn plan(spec: &Spec) -> Vec<PlannedSample> {
    (0..spec.count)
        .map(|i| {
            let mut rng = Rng(splitmix64(spec.seed ^ splitmix64(i as u64)));
            let ci = rng.pick(spec.components.iter().map(|c| c.weight));
            let c = &spec.components[ci];
            let size = c.resolutions[rng.pick(c.resolutions.iter().map(|r| r.weight))].size;
            let (fps, duration_s) = if c.modality == "video" {
                let fps = c.fps[rng.pick(c.fps.iter().map(|f| f.weight))].value;
                let d = c
                    .duration_s
                    .as_ref()
                    .map(|d| rng.lognormal(d.median, d.sigma, d.min, d.max))
                    .unwrap_or(1.0);
                (fps, (d * 1000.0).round() / 1000.0)
            } else {
                (0.0, 0.0)
            };
            let t = &c.text_tokens;
            let text_tokens = rng.lognormal(t.median, t.sigma, t.min, t.max).round() as u32;
            let ext = match (c.modality.as_str(), c.codec.as_str()) {
                ("image", "jpeg") => "jpg",
                ("image", _) => "png",
                _ => c.container.as_deref().unwrap_or("mp4"),
            };
            let folder = if c.modality == "video" { "videos" } else { "images" };
            PlannedSample {
                id: splitmix64(spec.seed.wrapping_add(0x5EED).wrapping_add(i as u64)),
                path: format!("{folder}/{i:06}.{ext}"),
                text_tokens,
                component: ci,
                size,
                fps,
                duration_s,
            }
        })
        .collect()
}

/// `r` as FFmpeg's rate syntax; NTSC rates become their exact rationals (29.97 → 30000/1001).
fn rate_arg(fps: f64) -> String {
    let ntsc = fps * 1001.0 / 1000.0;
    if (ntsc - ntsc.round()).abs() < 1e-3 && (fps - fps.round()).abs() > 1e-3 {
        format!("{}/1001", ntsc.round() as u64 * 1000)
    } else if (fps - fps.round()).abs() < 1e-9 {
        format!("{}", fps.round() as u64)
    } else {
        format!("{fps}")
    }
}

/// The `ffmpeg` arguments that write one planned sample to `out`.
pub fn ffmpeg_args(c: &Component, s: &PlannedSample, out: &Path) -> Vec<String> {
    let [w, h] = s.size;
    let video = c.modality == "video";
    let rate = if video { format!(":rate={}", rate_arg(s.fps)) } else { String::new() };
    let source = match c.content.as_str() {
        "fractal" => format!("mandelbrot=size={w}x{h}{rate}"),
        "noise" => format!("testsrc2=size={w}x{h}{rate},noise=alls=60:allf=t+u"),
        _ => format!("testsrc2=size={w}x{h}{rate}"),
    };
    let mut a: Vec<String> = ["-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-f", "lavfi", "-i"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.push(source);
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    if video {
        push(&["-t", &format!("{:.3}", s.duration_s)]);
        match c.codec.as_str() {
            "h264" => push(&[
                "-c:v",
                "libx264",
                "-preset",
                "veryfast",
                "-crf",
                &c.quality.unwrap_or(23).to_string(),
            ]),
            // Fast presets: a generated dataset is for decode cost, not for compression.
            "hevc" => push(&[
                "-c:v",
                "libx265",
                "-preset",
                "veryfast",
                "-crf",
                &c.quality.unwrap_or(28).to_string(),
                "-x265-params",
                "log-level=error:pools=1:frame-threads=1",
                "-tag:v",
                "hvc1",
            ]),
            "vp9" => push(&[
                "-c:v",
                "libvpx-vp9",
                "-deadline",
                "realtime",
                "-cpu-used",
                "8",
                "-b:v",
                "0",
                "-crf",
                &c.quality.unwrap_or(36).to_string(),
            ]),
            "av1" => {
                push(&["-c:v", "libsvtav1", "-preset", "12", "-crf", &c.quality.unwrap_or(40).to_string()])
            }
            _ => push(&["-c:v", "mpeg4", "-q:v", &c.quality.unwrap_or(5).to_string()]),
        }
        if let Some(g) = c.gop {
            push(&["-g", &g.to_string()]);
        }
        push(&["-pix_fmt", "yuv420p"]);
    } else {
        push(&["-frames:v", "1"]);
        if c.codec == "jpeg" {
            push(&["-q:v", &c.quality.unwrap_or(3).to_string()]);
        }
    }
    push(&["-threads", "1", "-fflags", "+bitexact", "-flags:v", "+bitexact"]);
    a.push(out.to_string_lossy().into_owned());
    a
}

/// Writes the dataset of `spec` into `out`. Skips the work when `out` already holds it.
pub fn generate(spec: &Spec, out: &Path, opts: &GenOptions) -> Result<GenReport, String> {
    let started = Instant::now();
    spec.validate()?;
    let spec_json = serde_json::to_string_pretty(spec).map_err(|e| e.to_string())?;
    let marker = out.join(GEN_SPEC_PATH);
    if !opts.force
        && out.join(MANIFEST_FILE).is_file()
        && std::fs::read_to_string(&marker).map(|s| s == spec_json).unwrap_or(false)
    {
        return Ok(GenReport {
            count: spec.count,
            generated: false,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    let ffmpeg = opts.ffmpeg.clone().unwrap_or_else(|| PathBuf::from("ffmpeg"));
    let samples = plan(spec);
    // Files of an earlier spec would linger beside the new manifest: start the media folders afresh.
    for dir in ["videos", "images"] {
        let _ = std::fs::remove_dir_all(out.join(dir));
    }
    for dir in ["videos", "images", ".datahelix"] {
        std::fs::create_dir_all(out.join(dir))
            .map_err(|e| format!("cannot create {}: {e}", out.join(dir).display()))?;
    }
    // The manifest goes last: a folder without one was not finished and is regenerated.
    let _ = std::fs::remove_file(out.join(MANIFEST_FILE));
    let _ = std::fs::remove_file(&marker);

    let pool =
        rayon::ThreadPoolBuilder::new().num_threads(opts.workers).build().map_err(|e| e.to_string())?;
    pool.install(|| {
        samples.par_iter().try_for_each(|s| {
            let c = &spec.components[s.component];
            let path = out.join(&s.path);
            // SVT-AV1 logs its configuration to stderr unless told to keep to errors.
            let result = Command::new(&ffmpeg).args(ffmpeg_args(c, s, &path)).env("SVT_LOG", "1").output();
            match result {
                Ok(o) if o.status.success() => Ok(()),
                Ok(o) => Err(format!(
                    "ffmpeg failed writing sample {} ({}): {}",
                    s.id,
                    path.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => {
                    Err(format!("cannot run {}: {e}; install FFmpeg (scripts/setup.sh)", ffmpeg.display()))
                }
            }
        })
    })?;
    apply_faults(spec, &samples, out)?;

    let mut manifest = Vec::new();
    for s in &samples {
        let line = serde_json::json!({"id": s.id, "path": s.path, "text_tokens": s.text_tokens});
        writeln!(manifest, "{line}").map_err(|e| e.to_string())?;
    }
    std::fs::write(out.join(MANIFEST_FILE), manifest).map_err(|e| format!("cannot write manifest: {e}"))?;
    std::fs::write(&marker, spec_json).map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    Ok(GenReport { count: samples.len(), generated: true, seconds: started.elapsed().as_secs_f64() })
}

/// Damages the spec's chosen samples: truncated videos, text in place of media, deleted files.
fn apply_faults(spec: &Spec, samples: &[PlannedSample], out: &Path) -> Result<(), String> {
    let f = &spec.faults;
    let is_video = |s: &&PlannedSample| spec.components[s.component].modality == "video";
    // Faults go to the last samples of the manifest, videos first for truncation.
    let mut videos = samples.iter().rev().filter(is_video);
    let mut used: Vec<&str> = Vec::new();
    for s in videos.by_ref().take(f.truncated) {
        let path = out.join(&s.path);
        let len = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
        let file = std::fs::OpenOptions::new().write(true).open(&path).map_err(|e| e.to_string())?;
        file.set_len(len / 2).map_err(|e| e.to_string())?;
        used.push(&s.path);
    }
    let mut rest = samples.iter().rev().filter(|s| !used.contains(&s.path.as_str()));
    for s in rest.by_ref().take(f.not_media) {
        std::fs::write(out.join(&s.path), b"this is a text file, not a video\n")
            .map_err(|e| e.to_string())?;
    }
    for s in rest.take(f.missing) {
        std::fs::remove_file(out.join(&s.path)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Spec {
        serde_json::from_str(include_str!("../../scripts/specs/tiny.json")).unwrap()
    }

    #[test]
    fn plan_is_deterministic_and_seed_dependent() {
        let s = spec();
        assert_eq!(plan(&s), plan(&s));
        let mut other = s.clone();
        other.seed += 1;
        assert_ne!(plan(&s), plan(&other));
        let ids: std::collections::HashSet<u64> = plan(&s).iter().map(|p| p.id).collect();
        assert_eq!(ids.len(), s.count);
    }

    #[test]
    fn ntsc_rates_are_exact() {
        assert_eq!(rate_arg(29.97), "30000/1001");
        assert_eq!(rate_arg(23.976), "24000/1001");
        assert_eq!(rate_arg(25.0), "25");
        assert_eq!(rate_arg(12.5), "12.5");
    }
}
