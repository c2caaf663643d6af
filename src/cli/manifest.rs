//! `datahelix manifest DIR`: write a `manifest.jsonl` for a folder of media that has none.

use std::path::PathBuf;

use clap::Args;

use super::{write_json, CliError};
use crate::manifest::{write_from_media, ScanOptions};

/// Write DIR/manifest.jsonl listing every media file beneath DIR, with sidecar captions
/// (NAME.txt, or NAME.json's "caption"/"text"), ids from the files' paths, and text_tokens the
/// captions' word counts.
#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// The folder of media.
    pub dir: PathBuf,
    /// Replace an existing manifest.jsonl.
    #[arg(long)]
    pub force: bool,
    /// Print what was written as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `datahelix manifest`.
pub fn run(args: ManifestArgs) -> Result<i32, CliError> {
    let report = write_from_media(&args.dir, &ScanOptions { force: args.force }).map_err(CliError::usage)?;
    if args.json {
        write_json(&report, None)?;
    } else {
        eprintln!(
            "manifest: {} media files ({} with a caption) listed in {}; next: datahelix index {}",
            report.samples,
            report.with_caption,
            report.manifest.display(),
            args.dir.display()
        );
    }
    Ok(0)
}
