//! The `datahelix` command line. Each subcommand lives in its own module; names and JSON shapes
//! follow `shared/CLI.md` (scripts and outside comparisons read them).
//!
//! Exit codes: 0 success, 1 the run finished but reported failures (with `--strict`), 2 bad usage
//! or unusable input.

mod calibrate;
pub mod compare;
mod decode;
mod frontier;
mod gen;
mod index;
mod manifest;
pub mod perf;
mod plan;
mod sim;
mod train;

use std::path::Path;

use clap::{Parser, Subcommand};

/// Exit status for "finished, but reported failures".
pub const EXIT_FAILURES: i32 = 1;
/// Exit status for bad usage or unusable input.
pub const EXIT_USAGE: i32 = 2;

/// The input data plane for synchronous multimodal training.
#[derive(Debug, Parser)]
#[command(name = "datahelix", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a dataset from a spec (drives the ffmpeg CLI).
    Gen(gen::GenArgs),
    /// Write a manifest.jsonl for a folder of media that has none.
    Manifest(manifest::ManifestArgs),
    /// Probe a dataset and write its descriptor index.
    Index(index::IndexArgs),
    /// Collective microbenchmark (nccl-tests shape), run under mpirun.
    Perf(perf::PerfArgs),
    /// Plan a synthetic step and show the planner's decisions and predictions.
    Plan(plan::PlanArgs),
    /// Emulated training under mpirun: the input pipeline measured (PROTOCOL.md).
    Train(train::TrainArgs),
    /// Decode samples into tensors with the worker pool.
    Decode(decode::DecodeArgs),
    /// Fit the decode-cost model on this machine.
    Calibrate(calibrate::CalibrateArgs),
    /// Compare policies from `train` results: table, `--json`, plots.
    Compare(compare::CompareArgs),
    /// Simulate policies at scale on workload files, or like a `train` run on a dataset.
    Sim(sim::SimArgs),
    /// From a run's records: the least wall time any schedule has at each miss rate.
    Frontier(frontier::FrontierArgs),
}

/// An error the CLI reports on stderr before exiting with `code`.
#[derive(Debug)]
pub struct CliError {
    /// Exit status.
    pub code: i32,
    /// What went wrong and what to do.
    pub message: String,
}

impl CliError {
    /// A bad-usage or unusable-input error (exit 2).
    pub fn usage(message: impl Into<String>) -> Self {
        CliError { code: EXIT_USAGE, message: message.into() }
    }

    /// An error whose message the command has printed already (exit `code`): [`run`] prints
    /// nothing more.
    pub fn said(code: i32) -> Self {
        CliError { code, message: String::new() }
    }
}

/// Runs a parsed command line; returns the process exit status.
pub fn run(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Gen(args) => gen::run(args),
        Command::Index(args) => index::run(args),
        Command::Manifest(args) => manifest::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Train(args) => train::run(args),
        Command::Decode(args) => decode::run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Frontier(args) => frontier::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if !e.message.is_empty() {
                eprintln!("datahelix: {}", e.message);
            }
            e.code
        }
    }
}

/// Prints one JSON document on stdout, or writes it to `out`.
pub fn write_json<T: serde::Serialize>(doc: &T, out: Option<&Path>) -> Result<(), CliError> {
    let text =
        serde_json::to_string_pretty(doc).map_err(|e| CliError::usage(format!("cannot encode JSON: {e}")))?;
    match out {
        Some(path) => std::fs::write(path, text + "\n")
            .map_err(|e| CliError::usage(format!("cannot write {}: {e}", path.display()))),
        None => {
            println!("{text}");
            Ok(())
        }
    }
}
