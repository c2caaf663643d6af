//! What lists a dataset's samples: a manifest file, or WebDataset shards (tar or zip).
//!
//! ```no_run
//! use datahelix::index::source::Source;
//!
//! let dir = std::path::Path::new("data/shards");
//! match Source::find(dir)? {
//!     Source::Manifest { path, format } => println!("{} ({format:?})", path.display()),
//!     Source::Shards(shards) => println!("{} shards", shards.len()),
//! }
//! # Ok::<(), datahelix::manifest::FindError>(())
//! ```

use std::path::{Path, PathBuf};

use crate::manifest::{self, FindError, Format};
use crate::shard::{self, Shard};

/// The listing of a dataset folder's samples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// `manifest.jsonl`, `manifest.csv` or `manifest.parquet` ([`manifest::find`]).
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// Its format.
        format: Format,
    },
    /// No manifest, and `*.tar` / `*.zip` shards ([`shard::list`]).
    Shards(Vec<Shard>),
}

impl Source {
    /// The manifest of `dir`, else its shards; neither is [`FindError::None`]. A `dir` whose
    /// last component is a brace pattern ([`shard::pattern`]) names exactly those shards.
    pub fn find(dir: &Path) -> Result<Source, FindError> {
        if let Some((folder, pattern)) = shard::pattern::split(dir) {
            return shard::list_pattern(&folder, &pattern).map(Source::Shards).map_err(FindError::Shards);
        }
        match manifest::find(dir) {
            Ok((path, format)) => Ok(Source::Manifest { path, format }),
            Err(FindError::None { dir }) => match shard::list(&dir) {
                Ok(shards) if !shards.is_empty() => Ok(Source::Shards(shards)),
                _ => Err(FindError::None { dir }),
            },
            Err(e) => Err(e),
        }
    }

    /// What messages call it: the manifest's path, `DIR/*.tar` (`*.zip`, or `*.{tar,zip}` for
    /// both), or the pattern as given.
    pub fn name(&self, dir: &Path) -> PathBuf {
        match self {
            Source::Manifest { path, .. } => path.clone(),
            Source::Shards(_) if shard::pattern::split(dir).is_some() => dir.to_path_buf(),
            Source::Shards(shards) => {
                let zips = shards.iter().filter(|s| s.rel.ends_with(".zip")).count();
                dir.join(match zips {
                    0 => "*.tar",
                    z if z == shards.len() => "*.zip",
                    _ => "*.{tar,zip}",
                })
            }
        }
    }
}
