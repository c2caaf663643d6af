//! Each delivered sample's metadata (its path and the manifest row's other fields, as JSON),
//! looked up by id in the dataset's index and the metadata file beside it
//! ([`crate::index::meta`]). Every rank reads its own copy: nothing of it crosses the exchange.

use std::path::Path;

use super::loader::Sample;
use crate::index::meta::{meta_file, Meta};
use crate::index::{index_file, Index};

/// The metadata file of one opened index.
pub(crate) struct SampleMeta {
    meta: Option<Meta>,
}

impl SampleMeta {
    /// Opens the metadata file beside `index` (the index of `data`, in `index_dir` when given).
    /// An index without one (written by an older build) gives each sample its path only, with a
    /// warning.
    pub(crate) fn open(index: &Index, data: &Path, index_dir: Option<&Path>) -> SampleMeta {
        let path = meta_file(&index_file(data, index_dir));
        let meta = match Meta::open(&path, index.manifest_sha256(), index.len()) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("samples' metadata is their path only: {e}");
                None
            }
        };
        SampleMeta { meta }
    }

    /// The metadata of sample `id` of `index` as a JSON object's text (`{}` for an id not in it).
    pub(crate) fn of(&self, index: &Index, id: u64) -> String {
        let Some(at) = index.position_of(id) else { return "{}".into() };
        if let Some(text) = self.meta.as_ref().and_then(|m| m.get(at)) {
            return text.to_owned();
        }
        let path = index.path(at).unwrap_or_default();
        format!("{{\"path\":{}}}", serde_json::Value::String(path.to_owned()))
    }

    /// Fills every sample's [`Sample::meta`].
    pub(crate) fn fill(&self, index: &Index, samples: &mut [Sample]) {
        for s in samples {
            s.meta = self.of(index, s.id);
        }
    }
}
