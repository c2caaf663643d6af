//! `datahelix calibrate DIR`: decode a sample of the dataset, fit the per-codec decode-cost
//! model, and report its coefficients and its relative error on held-back samples.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::decode::{submit, DecodeOpts};
use super::{write_json, CliError};
use crate::decode::cost::{relative_errors, Coefficients, CostModel};
use crate::decode::pool::{Mode, Pool};
use crate::descriptor::Descriptor;
use crate::index::Index;

/// Fit the decode-cost model on this machine (see shared/CLI.md).
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The dataset folder (indexed with `datahelix index`).
    pub dir: PathBuf,
    /// The folder of the dataset's index, when it cannot live in the dataset folder (read-only
    /// storage); default: `DATAHELIX_INDEX_DIR`, else DIR/.datahelix.
    #[arg(long)]
    pub index_dir: Option<PathBuf>,
    /// Decode at most this many samples (0 = all), spread evenly over the index.
    #[arg(long, default_value_t = 0)]
    pub limit: usize,
    /// Hold back every K-th sample (by id order) to measure the error on.
    #[arg(long, default_value_t = 4)]
    pub holdout_every: usize,
    /// Decode each sample this many times and keep the fastest (less noise on busy machines).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Print one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write the JSON document to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub opts: DecodeOpts,
}

/// One codec's fit.
#[derive(Debug, Serialize)]
pub struct ModelJson {
    /// `c0`, `c_px`, `c_bits`, `c_seek` (seconds; per megapixel, megabit, frame).
    pub coefficients: Coefficients,
    /// Mean relative error on the held-back samples.
    pub mean_rel_error: f64,
    /// 95th-percentile relative error on the held-back samples.
    pub p95_rel_error: f64,
    /// Observations fitted.
    pub n: u64,
    /// Held-back samples evaluated (0: evaluated on the fitted ones).
    pub n_heldout: usize,
}

#[derive(Serialize)]
struct CalibrateJson {
    dataset: String,
    workers: usize,
    seconds_measure: &'static str,
    decoded: usize,
    failed: usize,
    models: BTreeMap<String, ModelJson>,
}

/// Observed CPU seconds per sample, fastest of `repeat` decodes.
pub fn measure(
    index: &Index,
    ids: &[u64],
    opts: &DecodeOpts,
    repeat: usize,
) -> Result<BTreeMap<u64, f64>, CliError> {
    let mut best: BTreeMap<u64, f64> = BTreeMap::new();
    let mut failed = BTreeMap::new();
    for _ in 0..repeat.max(1) {
        let pool = Pool::new(opts.pool());
        submit(&pool, index, ids, Mode::Sampled, None)?;
        while let Some(o) = pool.recv() {
            match o.result {
                Ok(_) => {
                    let e = best.entry(o.id).or_insert(f64::INFINITY);
                    *e = e.min(o.cpu_seconds);
                }
                Err(e) => {
                    failed.insert(o.id, e.to_string());
                }
            }
        }
    }
    for (id, e) in failed {
        best.remove(&id);
        eprintln!("calibrate: skipped: {e}");
    }
    Ok(best)
}

/// Fits per-codec models on all but every `k`-th observation (by id) and evaluates on those.
pub fn fit_and_evaluate(
    obs: &[(Descriptor, f64)],
    params: &crate::decode::Params,
    k: usize,
) -> BTreeMap<String, ModelJson> {
    let mut sorted: Vec<&(Descriptor, f64)> = obs.iter().collect();
    sorted.sort_by_key(|(d, _)| d.id);
    let k = k.max(2);
    let mut model = CostModel::default();
    let mut held: BTreeMap<String, Vec<&(Descriptor, f64)>> = BTreeMap::new();
    let mut trained: BTreeMap<String, Vec<&(Descriptor, f64)>> = BTreeMap::new();
    for (i, o) in sorted.iter().enumerate() {
        if i % k == k - 1 {
            held.entry(o.0.codec.name().to_owned()).or_default().push(o);
        } else {
            model.observe(&o.0, params, o.1);
            trained.entry(o.0.codec.name().to_owned()).or_default().push(o);
        }
    }
    let mut out = BTreeMap::new();
    for (codec, coef, n) in model.codecs() {
        let name = codec.name().to_owned();
        let h = held.get(&name).cloned().unwrap_or_default();
        let eval = if h.is_empty() { trained.get(&name).cloned().unwrap_or_default() } else { h.clone() };
        let pairs: Vec<(f64, f64)> = eval.iter().map(|(d, s)| (model.predict(d, params), *s)).collect();
        let (mean, p95) = relative_errors(&pairs);
        out.insert(
            name,
            ModelJson { coefficients: coef, mean_rel_error: mean, p95_rel_error: p95, n, n_heldout: h.len() },
        );
    }
    out
}

/// Runs `datahelix calibrate`.
pub fn run(args: CalibrateArgs) -> Result<i32, CliError> {
    let index =
        Index::open_in(&args.dir, args.index_dir.as_deref()).map_err(|e| CliError::usage(e.to_string()))?;
    let mut ids: Vec<u64> = Vec::new();
    let n = index.len();
    let take = if args.limit == 0 { n } else { args.limit.min(n) };
    for j in 0..take {
        let i = j * n / take.max(1);
        ids.push(index.get(i).map_err(|e| CliError::usage(e.to_string()))?.id);
    }
    let times = measure(&index, &ids, &args.opts, args.repeat)?;
    let mut obs = Vec::new();
    for (&id, &s) in &times {
        if let Some(i) = index.position_of(id) {
            obs.push((index.get(i).map_err(|e| CliError::usage(e.to_string()))?, s));
        }
    }
    let models = fit_and_evaluate(&obs, &args.opts.params(), args.holdout_every);
    let doc = CalibrateJson {
        dataset: args.dir.display().to_string(),
        workers: args.opts.workers.max(1),
        seconds_measure: "thread_cpu",
        decoded: obs.len(),
        failed: ids.len() - obs.len(),
        models,
    };
    if args.json || args.out.is_some() {
        write_json(&doc, args.out.as_deref())?;
    } else {
        for (codec, m) in &doc.models {
            println!(
                "{codec:<8} n={:<5} mean rel err {:.3}  p95 {:.3}  {:?}",
                m.n, m.mean_rel_error, m.p95_rel_error, m.coefficients
            );
        }
    }
    Ok(0)
}
