//! `datahelix gen --spec SPEC.json --out DIR`: write a dataset from a spec.

use std::path::PathBuf;

use clap::Args;

use super::CliError;
use crate::gen::{generate, GenOptions, Spec};

/// Write a dataset (manifest.jsonl + media files) from a spec, using the ffmpeg CLI.
#[derive(Debug, Args)]
pub struct GenArgs {
    /// The spec (JSON), e.g. scripts/specs/tiny.json.
    #[arg(long)]
    pub spec: PathBuf,
    /// The dataset folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// Parallel ffmpeg processes (default: one per core).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// Regenerate even if DIR already holds this spec's dataset.
    #[arg(long)]
    pub force: bool,
}

/// Runs `datahelix gen`.
pub fn run(args: GenArgs) -> Result<i32, CliError> {
    let spec = Spec::load(&args.spec).map_err(CliError::usage)?;
    let opts = GenOptions { workers: args.workers, force: args.force, ffmpeg: None };
    let report = generate(&spec, &args.out, &opts).map_err(CliError::usage)?;
    if report.generated {
        eprintln!(
            "gen: wrote {} samples of '{}' to {} in {:.1} s",
            report.count,
            spec.name,
            args.out.display(),
            report.seconds
        );
    } else {
        eprintln!(
            "gen: {} already holds '{}' ({} samples); --force to regenerate",
            args.out.display(),
            spec.name,
            report.count
        );
    }
    Ok(0)
}
