//! `datahelix decode DIR`: decode samples of an indexed dataset with the worker pool and print
//! per sample its shape, timestamps, SHA-256 and time (`shared/CLI.md`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{write_json, CliError, EXIT_FAILURES};
use crate::decode::pool::{Job, Mode, Outcome, Output, Pool, PoolConfig};
use crate::decode::{Params, Strategy};
use crate::descriptor::Status;
use crate::index::Index;

/// Seek-or-scan choice on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StrategyArg {
    /// From the descriptor (keyframe interval against the gap between sampled frames).
    Auto,
    /// One sequential pass.
    Scan,
    /// Seek to the keyframe before each target when one lies ahead.
    Seek,
}

/// A `--decode-timeout` in seconds as the pool's limit (0, negative or not finite: none).
pub(crate) fn timeout(seconds: f64) -> Option<std::time::Duration> {
    (seconds.is_finite() && seconds > 0.0).then(|| std::time::Duration::from_secs_f64(seconds.min(1e9)))
}

/// Preprocessing and pool options shared by `decode` and `calibrate`.
#[derive(Debug, Args)]
pub struct DecodeOpts {
    /// Decode threads (the CPU budget).
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Tensor buffer budget in MiB; a sample larger than it is a per-sample error.
    #[arg(long, default_value_t = 1024)]
    pub budget_mib: usize,
    /// Frames sampled per second of video.
    #[arg(long, default_value_t = 2)]
    pub sample_fps: u32,
    /// Most frames per sample.
    #[arg(long, default_value_t = 16)]
    pub max_frames: u32,
    /// Most output pixels per frame.
    #[arg(long, default_value_t = 200_704)]
    pub max_pixels: u64,
    /// Seek or scan.
    #[arg(long, value_enum, default_value_t = StrategyArg::Auto)]
    pub strategy: StrategyArg,
    /// Seconds one sample's decode may take before it fails with a reason (0: no limit).
    #[arg(long, default_value_t = 60.0)]
    pub decode_timeout: f64,
}

impl DecodeOpts {
    /// The preprocessing parameters.
    pub fn params(&self) -> Params {
        Params { sample_fps: (self.sample_fps, 1), max_frames: self.max_frames, max_pixels: self.max_pixels }
    }

    /// The pool configuration.
    pub fn pool(&self) -> PoolConfig {
        PoolConfig {
            workers: self.workers.max(1),
            budget_bytes: self.budget_mib.saturating_mul(1 << 20),
            params: self.params(),
            decode_timeout: timeout(self.decode_timeout),
        }
    }

    fn strategy(&self) -> Option<Strategy> {
        match self.strategy {
            StrategyArg::Auto => None,
            StrategyArg::Scan => Some(Strategy::Scan),
            StrategyArg::Seek => Some(Strategy::Seek),
        }
    }
}

/// Decode samples of an indexed dataset into tensors (see shared/CLI.md).
#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The dataset folder (indexed with `datahelix index`).
    pub dir: PathBuf,
    /// The folder of the dataset's index, when it cannot live in the dataset folder (read-only
    /// storage); default: `DATAHELIX_INDEX_DIR`, else DIR/.datahelix.
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Only these sample ids (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<u64>,
    /// Decode every frame in the decoder's native format (no scaling, no RGB): the work of
    /// `ffmpeg -threads 1 -i FILE -f null -`.
    #[arg(long)]
    pub all_frames: bool,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the JSON document to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write each tensor as OUTDIR/<id>.rgb (raw bytes).
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// Exit 1 when any sample failed.
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub opts: DecodeOpts,
}

/// One sample of the `decode` JSON document.
#[derive(Debug, Serialize)]
pub struct SampleJson {
    /// Sample id.
    pub id: u64,
    /// Path relative to the dataset.
    pub path: String,
    /// `[F, H, W, 3]` (all frames: `[frames, H, W, 0]`, native planar format).
    pub shape: Option<[usize; 4]>,
    /// Chosen frame times, seconds.
    pub timestamps_s: Vec<f64>,
    /// Its metadata: `path` and the manifest row's other fields (caption, label, ...).
    pub meta: serde_json::Value,
    /// SHA-256 of the tensor bytes (hex); null for all frames.
    pub sha256: Option<String>,
    /// Wall seconds of the decode.
    pub seconds: f64,
    /// CPU seconds of the decode.
    pub cpu_seconds: f64,
    /// `scan` or `seek` (sampled decodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<&'static str>,
    /// Native pixel format (all frames).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pix_fmt: Option<String>,
    /// Null when decoded, else what went wrong (id, path, reason).
    pub error: Option<String>,
}

#[derive(Serialize)]
struct DecodeJson {
    dataset: String,
    workers: usize,
    all_frames: bool,
    /// The pool's byte budget (`--budget-mib`).
    budget_mib: usize,
    /// The process's peak resident memory at the end (`getrusage`'s `ru_maxrss`): what the
    /// budget bounds, beside the process's own footprint.
    peak_rss_mib: f64,
    ok: usize,
    failed: usize,
    seconds: f64,
    samples: Vec<SampleJson>,
}

/// The process's peak resident set size in MiB (`getrusage(RUSAGE_SELF)`; 0 where unavailable).
fn peak_rss_mib() -> f64 {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: usage is a valid, writable rusage; RUSAGE_SELF is a constant the kernel knows.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    usage.ru_maxrss as f64 / 1024.0 // Linux reports KiB
}

/// A sample the index could not hand to the pool.
pub(super) struct Rejected {
    pub id: u64,
    pub path: String,
    pub reason: String,
}

/// The samples [`submit`] queued, `(id, relative path)` in order, and those it rejected.
type Submitted = (Vec<(u64, String)>, Vec<Rejected>);

/// Queues samples of `index` (all, or `ids`) on `pool`, deadline = position in the request.
/// Returns the submitted `(id, relative path)` in order, and the rejected ones.
pub(super) fn submit(
    pool: &Pool,
    index: &Index,
    ids: &[u64],
    mode: Mode,
    strategy: Option<Strategy>,
) -> Result<Submitted, CliError> {
    let positions: Vec<Result<usize, u64>> = if ids.is_empty() {
        (0..index.len()).map(Ok).collect()
    } else {
        ids.iter().map(|&id| index.position_of(id).ok_or(id)).collect()
    };
    let mut submitted = Vec::new();
    let mut rejected = Vec::new();
    let root = std::fs::canonicalize(index.dir())
        .map_err(|e| CliError::usage(format!("the dataset folder {}: {e}", index.dir().display())))?;
    for (k, p) in positions.into_iter().enumerate() {
        let i = match p {
            Ok(i) => i,
            Err(id) => {
                rejected.push(Rejected { id, path: String::new(), reason: "id not in the index".into() });
                continue;
            }
        };
        let d = index.get(i).map_err(|e| CliError::usage(e.to_string()))?;
        let rel = index.path(i).map_err(|e| CliError::usage(e.to_string()))?.to_owned();
        if d.status != Status::Ok {
            let reason = format!("sample {} ({rel}): index status `{}`", d.id, d.status);
            rejected.push(Rejected { id: d.id, path: rel, reason });
            continue;
        }
        pool.submit(Job {
            id: d.id,
            path: index.dir().join(&rel),
            deadline: k as u64,
            descriptor: Some(d),
            mode,
            strategy,
            frames: None,
            beneath: Some((root.clone(), rel.clone())),
        });
        submitted.push((d.id, rel));
    }
    Ok((submitted, rejected))
}

fn sample_json(o: Outcome, path: String, dump: Option<&Path>) -> Result<SampleJson, CliError> {
    let mut s = SampleJson {
        id: o.id,
        path,
        shape: None,
        timestamps_s: Vec::new(),
        meta: serde_json::Value::Null,
        sha256: None,
        seconds: o.seconds,
        cpu_seconds: o.cpu_seconds,
        strategy: None,
        pix_fmt: None,
        error: None,
    };
    match o.result {
        Ok(out) => {
            s.shape = Some(out.shape());
            match out {
                Output::Sampled { tensor, decoded } => {
                    s.sha256 = Some(hex(&Sha256::digest(&tensor[..])));
                    s.timestamps_s = decoded.timestamps_s;
                    s.strategy = Some(decoded.strategy.name());
                    if let Some(dir) = dump {
                        let f = dir.join(format!("{}.rgb", o.id));
                        std::fs::write(&f, &tensor[..])
                            .map_err(|e| CliError::usage(format!("cannot write {}: {e}", f.display())))?;
                    }
                }
                Output::AllFrames(a) => {
                    s.timestamps_s = a.timestamps_s;
                    s.pix_fmt = Some(a.pix_fmt);
                }
            }
        }
        Err(e) => s.error = Some(e.to_string()),
    }
    Ok(s)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs `datahelix decode`.
pub fn run(args: DecodeArgs) -> Result<i32, CliError> {
    let index =
        Index::open_in(&args.dir, args.index_dir.as_deref()).map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(d) = &args.dump {
        std::fs::create_dir_all(d)
            .map_err(|e| CliError::usage(format!("cannot create {}: {e}", d.display())))?;
    }
    let t0 = std::time::Instant::now();
    let pool = Pool::new(args.opts.pool());
    let mode = if args.all_frames { Mode::AllFrames } else { Mode::Sampled };
    let (submitted, rejected) = submit(&pool, &index, &args.ids, mode, args.opts.strategy())?;
    let paths: BTreeMap<u64, String> = submitted.iter().cloned().collect();
    let mut done: BTreeMap<u64, SampleJson> = BTreeMap::new();
    while let Some(o) = pool.recv() {
        let path = paths.get(&o.id).cloned().unwrap_or_default();
        let s = sample_json(o, path, args.dump.as_deref())?;
        if let Some(e) = &s.error {
            eprintln!("decode: {e}");
        }
        done.insert(s.id, s);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let mut samples: Vec<SampleJson> = Vec::new();
    for r in rejected {
        eprintln!("decode: {}", r.reason);
        samples.push(SampleJson {
            id: r.id,
            path: r.path,
            shape: None,
            timestamps_s: Vec::new(),
            meta: serde_json::Value::Null,
            sha256: None,
            seconds: 0.0,
            cpu_seconds: 0.0,
            strategy: None,
            pix_fmt: None,
            error: Some(r.reason),
        });
    }
    for (id, _) in &submitted {
        if let Some(s) = done.remove(id) {
            samples.push(s);
        }
    }
    let meta = crate::exec::sample_meta::SampleMeta::open(&index, &args.dir, args.index_dir.as_deref());
    for s in &mut samples {
        s.meta = serde_json::from_str(&meta.of(&index, s.id)).unwrap_or(serde_json::Value::Null);
    }
    let failed = samples.iter().filter(|s| s.error.is_some()).count();
    let doc = DecodeJson {
        dataset: args.dir.display().to_string(),
        workers: args.opts.workers.max(1),
        all_frames: args.all_frames,
        budget_mib: args.opts.budget_mib,
        peak_rss_mib: peak_rss_mib(),
        ok: samples.len() - failed,
        failed,
        seconds,
        samples,
    };
    if args.json || args.out.is_some() {
        write_json(&doc, args.out.as_deref())?;
    } else {
        for s in &doc.samples {
            match (&s.error, s.shape) {
                (None, Some(sh)) => println!("{:>20} {:?} {:.4} s  {}", s.id, sh, s.seconds, s.path),
                (e, _) => println!("{:>20} error: {}", s.id, e.as_deref().unwrap_or("?")),
            }
        }
        println!("{} ok, {} failed in {:.2} s", doc.ok, doc.failed, doc.seconds);
    }
    Ok(if args.strict && failed > 0 { EXIT_FAILURES } else { 0 })
}
