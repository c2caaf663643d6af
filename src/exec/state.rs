//! A loader's resumable state: a small versioned JSON document that says where a run stands.
//!
//! ```
//! use datahelix::exec::state::{DatasetId, LoaderState};
//!
//! let dataset = DatasetId { samples: 120, manifest_sha256: "ab".repeat(32), index_sha256: "cd".repeat(32), mix: None };
//! let state = LoaderState::new(42, 17, "helix", 16, dataset.clone());
//! assert_eq!(state.epoch, 2); // positions 17·16 = 272 of 120 samples: epoch 2
//! let text = state.to_json();
//! let back = LoaderState::from_json(&text).unwrap();
//! assert_eq!(back, state);
//! // A state whose fields were edited no longer matches its checksum.
//! assert!(LoaderState::from_json(&text.replace("\"next_step\": 17", "\"next_step\": 18")).is_err());
//! // Resuming checks the state against the job at hand.
//! assert!(back.check_against(42, 16, &dataset).is_ok());
//! assert!(back.check_against(43, 16, &dataset).unwrap_err().contains("seed"));
//! ```
//!
//! The global batch of a step depends only on the dataset's ids, the seed and the step
//! ([`crate::sampler`]), so the state needs no rank, world size or policy internals to resume the
//! exact global batches of a run that never stopped; the batches' split across ranks may differ.
//! A state a loader writes also carries what its policy learned ([`Learned`]: the decode and
//! accelerator cost models, the CPUs' recent pace), so that the resumed run plans its first steps
//! with them instead of the priors, and the skip budget's count of the steps before it
//! ([`SkipCount`]), so that a resumed run ends where the run it continues would have when its
//! samples keep failing. Version 1 documents (neither) and version 2 (no count) are still read.

use serde::{Deserialize, Serialize};

use crate::sampler::{epoch_of, words_hash};
use crate::step::{Learned, SkipCount};

/// The `format` field of every state document.
pub const FORMAT: &str = "datahelix-loader-state";
/// The document version this build writes (it reads this one, version 2, which has no `skips`,
/// and version 1, which has no `learned` either).
pub const VERSION: u32 = 3;

/// The largest state document read (one with every codec's decode model and the 128
/// accelerator observations it keeps comes to ~25 KiB, by its parts' sizes; the demo's, of
/// three codecs and four observations, is 8.7 KiB).
pub const MAX_BYTES: u64 = 1 << 20;

/// Which dataset a state belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetId {
    /// Samples the sampler draws from (an epoch's length).
    pub samples: u64,
    /// SHA-256 of the manifest, hex.
    pub manifest_sha256: String,
    /// SHA-256 of the index's records, ids and paths, hex ([`crate::index::Index::content_sha256`]).
    pub index_sha256: String,
    /// The weighted mixture of groups the sampler draws by, in its one written form
    /// ([`crate::sampler::mix::Mix`]); `None`: the protocol's uniform draw.
    pub mix: Option<String>,
}

/// Where a run stands: the next step to deliver, and what it must be resumed with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderState {
    /// Always [`FORMAT`].
    pub format: String,
    /// Document version ([`VERSION`]).
    pub version: u32,
    /// The sampler's protocol version ([`crate::sampler::PROTOCOL`]).
    pub protocol: String,
    /// The build that wrote it (informational: a resumed run may run a newer build).
    pub build: String,
    /// Sampler seed.
    pub seed: u64,
    /// The first step a resumed run delivers (global numbering).
    pub next_step: u64,
    /// The epoch `next_step`'s first position lies in.
    pub epoch: u64,
    /// The policy that wrote it (a resumed run may use another: the global batches are the same).
    pub policy: String,
    /// Samples per global batch.
    pub global_batch: u64,
    /// The dataset's samples (an epoch's length).
    pub samples: u64,
    /// SHA-256 of the dataset's manifest, hex.
    pub manifest_sha256: String,
    /// SHA-256 of the dataset's index content, hex.
    pub index_sha256: String,
    /// What the policy learned by then (absent in version 1 documents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<Learned>,
    /// The skip budget's count of the steps before `next_step` (absent before version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skips: Option<SkipCount>,
    /// The mix the batches were drawn by (absent: uniform, and in states before mixes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mix: Option<String>,
    /// [`words_hash`] of the document without this field, hex: catches edits and damage.
    pub checksum: String,
}

impl LoaderState {
    /// The state of a run whose next step is `next_step`.
    pub fn new(
        seed: u64,
        next_step: u64,
        policy: &str,
        global_batch: u64,
        dataset: DatasetId,
    ) -> LoaderState {
        let epoch = epoch_of(next_step.saturating_mul(global_batch), dataset.samples);
        let DatasetId { samples, manifest_sha256, index_sha256, mix } = dataset;
        let mut s = LoaderState {
            format: FORMAT.into(),
            version: VERSION,
            protocol: crate::sampler::PROTOCOL.into(),
            build: super::fingerprint::build_id(),
            seed,
            next_step,
            epoch,
            policy: policy.into(),
            global_batch,
            samples,
            manifest_sha256,
            index_sha256,
            learned: None,
            skips: None,
            mix,
            checksum: String::new(),
        };
        s.checksum = s.expected_checksum();
        s
    }

    /// The dataset it belongs to.
    pub fn dataset(&self) -> DatasetId {
        DatasetId {
            samples: self.samples,
            manifest_sha256: self.manifest_sha256.clone(),
            index_sha256: self.index_sha256.clone(),
            mix: self.mix.clone(),
        }
    }

    /// The same state carrying what the policy learned.
    pub fn with_learned(mut self, learned: Option<Learned>) -> LoaderState {
        self.learned = learned;
        self.checksum = self.expected_checksum();
        self
    }

    /// The same state carrying the skip budget's count of the steps before `next_step`.
    pub fn with_skips(mut self, skips: Option<SkipCount>) -> LoaderState {
        self.skips = skips;
        self.checksum = self.expected_checksum();
        self
    }

    fn expected_checksum(&self) -> String {
        let mut unsigned = self.clone();
        unsigned.checksum = String::new();
        let bytes = serde_json::to_vec(&unsigned).expect("a state serialises");
        format!("{:016x}", words_hash(&bytes))
    }

    /// The document, pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a state serialises") + "\n"
    }

    /// Reads a document, refusing one that is malformed, truncated, of another format or
    /// version, inconsistent, or edited since it was written (the checksum).
    pub fn from_json(text: &str) -> Result<LoaderState, String> {
        if text.len() as u64 > MAX_BYTES {
            return Err(format!("not a loader state ({} bytes; a state is at most {MAX_BYTES})", text.len()));
        }
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("not a loader state (malformed or truncated JSON: {e})"))?;
        if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(format!("not a loader state (its \"format\" is not \"{FORMAT}\")"));
        }
        let (learned, skips) = (value.get("learned").is_some(), value.get("skips").is_some());
        match value.get("version").and_then(|v| v.as_u64()) {
            Some(1) if !learned && !skips => {}
            Some(2) if !skips => {}
            Some(v) if v == VERSION as u64 => {}
            v => {
                return Err(format!(
                    "a loader state of version {}{}, this build reads versions 1 to {VERSION}",
                    v.map_or("?".into(), |v| v.to_string()),
                    if v.is_some_and(|v| v < VERSION as u64) { " with fields of a later one" } else { "" }
                ))
            }
        }
        let s: LoaderState = serde_json::from_value(value).map_err(|e| {
            format!("not a valid loader state: {}", crate::text::clipped(&e.to_string(), 400))
        })?;
        if s.checksum != s.expected_checksum() {
            return Err("the loader state was changed after it was written (its checksum does not match); \
                 use the file the run wrote"
                .into());
        }
        if let Some(learned) = &s.learned {
            learned.check().map_err(|e| format!("the loader state's learned models are unusable: {e}"))?;
        }
        if let Some(skips) = &s.skips {
            let before = s.next_step.saturating_mul(s.global_batch);
            skips
                .check()
                .and_then(|()| match skips.planned <= before {
                    true => Ok(()),
                    false => Err(format!("{} samples planned before step {}", skips.planned, s.next_step)),
                })
                .map_err(|e| format!("the loader state's skip count is unusable: {e}"))?;
        }
        let epoch = epoch_of(s.next_step.saturating_mul(s.global_batch), s.samples);
        if s.global_batch == 0 || s.samples == 0 || s.epoch != epoch {
            return Err(format!(
                "the loader state is inconsistent (global batch {}, {} samples, epoch {} for step {})",
                s.global_batch, s.samples, s.epoch, s.next_step
            ));
        }
        Ok(s)
    }

    /// Reads a state file; the error names the file.
    pub fn read(path: &std::path::Path) -> Result<LoaderState, String> {
        let cannot = |e: String| format!("cannot read the loader state {}: {e}", path.display());
        let len = std::fs::metadata(path).map_err(|e| cannot(e.to_string()))?.len();
        if len > MAX_BYTES {
            return Err(cannot(format!("{len} bytes, a state is at most {MAX_BYTES}")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| cannot(e.to_string()))?;
        LoaderState::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Writes the state to `path` (through a temporary file and a rename: a crash leaves the old
    /// file or the new one, never half of one).
    pub fn write(&self, path: &std::path::Path) -> Result<(), String> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, self.to_json())
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("cannot write the loader state {}: {e}", path.display()))
    }

    /// `Ok` when a job of `seed`, `global_batch` over `dataset` can continue from this state;
    /// else which field differs, with both values.
    pub fn check_against(&self, seed: u64, global_batch: u64, dataset: &DatasetId) -> Result<(), String> {
        let mut differ = Vec::new();
        if self.protocol != crate::sampler::PROTOCOL {
            differ.push(format!(
                "protocol: state {}, this build {}",
                self.protocol,
                crate::sampler::PROTOCOL
            ));
        }
        if self.seed != seed {
            differ.push(format!("seed: state {}, this run {seed}", self.seed));
        }
        if self.global_batch != global_batch {
            differ.push(format!("global_batch: state {}, this run {global_batch}", self.global_batch));
        }
        if self.samples != dataset.samples {
            differ.push(format!("samples: state {}, this dataset {}", self.samples, dataset.samples));
        }
        if self.manifest_sha256 != dataset.manifest_sha256 {
            differ.push(format!(
                "manifest_sha256: state {}, this dataset {}",
                self.manifest_sha256, dataset.manifest_sha256
            ));
        }
        if self.index_sha256 != dataset.index_sha256 {
            differ.push(format!(
                "index_sha256: state {}, this dataset {}",
                self.index_sha256, dataset.index_sha256
            ));
        }
        if self.mix != dataset.mix {
            let text = |m: &Option<String>| m.clone().unwrap_or_else(|| "none (uniform)".into());
            differ.push(format!("mix: state {}, this run {}", text(&self.mix), text(&dataset.mix)));
        }
        if differ.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "the loader state belongs to another run — {}; resume with the dataset, seed, global batch \
                 and mix it was written with",
                differ.join("; ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dataset() -> DatasetId {
        DatasetId { samples: 48, manifest_sha256: "0f".repeat(32), index_sha256: "aa".repeat(32), mix: None }
    }

    #[test]
    fn round_trips_and_computes_the_epoch() {
        let s = LoaderState::new(7, 6, "rank-local", 16, dataset());
        assert_eq!(s.epoch, 2);
        assert_eq!(LoaderState::from_json(&s.to_json()).unwrap(), s);
        let v: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert!(v["seed"].is_u64(), "the seed is a JSON integer");
    }

    #[test]
    fn damaged_foreign_and_edited_documents_are_refused() {
        let text = LoaderState::new(7, 6, "helix", 16, dataset()).to_json();
        let truncated = &text[..text.len() / 2];
        assert!(LoaderState::from_json(truncated).unwrap_err().contains("malformed or truncated"));
        assert!(LoaderState::from_json("").is_err());
        assert!(LoaderState::from_json("{\"format\": \"other\"}").unwrap_err().contains("format"));
        let v4 = text.replace("\"version\": 3", "\"version\": 4");
        assert!(LoaderState::from_json(&v4).unwrap_err().contains("version 4"));
        let edited = text.replace("\"seed\": 7", "\"seed\": 8");
        assert!(LoaderState::from_json(&edited).unwrap_err().contains("checksum"));
        let extra = text.replacen('{', "{\"unknown\": 1,", 1);
        assert!(LoaderState::from_json(&extra).is_err());
        // Valid JSON, but longer than any state: refused before it is parsed.
        let padded = " ".repeat(MAX_BYTES as usize) + &text;
        assert!(LoaderState::from_json(&padded).unwrap_err().contains("a state is at most 1048576"));
        assert!(LoaderState::from_json(&padded[MAX_BYTES as usize - 100..]).is_ok());
    }

    /// `s` with its checksum made to match its (edited) fields.
    fn signed(mut s: LoaderState) -> String {
        s.checksum = s.expected_checksum();
        s.to_json()
    }

    /// An agreed state that has fitted a few observations of every kind.
    fn learned() -> Learned {
        use crate::decode::cost::{CostModel, Features};
        use crate::descriptor::Codec;
        let mut decode = CostModel::for_worker_cores(0.4);
        for k in 1..30 {
            let f = Features { mpixels: k as f64 * 3.1, mbits: 7.0 / k as f64, discarded: (k % 5) as f64 };
            decode.observe_features(Codec::H264, &f, 0.013 * k as f64 + 0.1 / k as f64);
            decode.observe_features(Codec::Jpeg, &f, 0.003 * k as f64);
        }
        Learned {
            worker_millicores: 400,
            decode: decode.saved(),
            accel: (1..40)
                .map(|k| [k as f64 * 101.3, (k * k) as f64 * 1e4 / 3.0, 0.1 + k as f64 / 7.0])
                .collect(),
            zstd: [2.7, 3.1e8],
            paces: vec![0.3, 1.0 / 3.0, 0.7],
            wholes: vec![0.4, 0.5, 0.9],
            balanced: vec![1.1, 1.2, 1.0 / 7.0],
        }
    }

    #[test]
    fn learned_models_cross_the_file_bit_for_bit() {
        let s = LoaderState::new(7, 6, "helix", 16, dataset()).with_learned(Some(learned()));
        let back = LoaderState::from_json(&s.to_json()).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.learned.as_ref().unwrap().hash(), learned().hash());
        assert!(s.to_json().len() < MAX_BYTES as usize / 16, "{} bytes", s.to_json().len());
    }

    #[test]
    fn a_version_1_document_still_reads() {
        let mut v1 = LoaderState::new(7, 6, "helix", 16, dataset());
        v1.version = 1;
        v1.checksum = v1.expected_checksum();
        let text = v1.to_json();
        assert!(!text.contains("learned"));
        assert_eq!(LoaderState::from_json(&text).unwrap(), v1);
        // Version 1 has no learned models: one that claims both is not a document any build wrote.
        v1.learned = Some(learned());
        assert!(LoaderState::from_json(&signed(v1)).unwrap_err().contains("version 1"));
    }

    #[test]
    fn a_version_2_document_still_reads_and_skip_counts_are_checked() {
        let mut v2 = LoaderState::new(7, 6, "helix", 16, dataset()).with_learned(Some(learned()));
        v2.version = 2;
        v2.checksum = v2.expected_checksum();
        assert_eq!(LoaderState::from_json(&v2.to_json()).unwrap(), v2);
        let count = SkipCount { planned: 96, failed: 11, ids: vec![4, 9, 4] };
        // Version 2 has no skip count: one that claims one is not a document any build wrote.
        v2.skips = Some(count.clone());
        assert!(LoaderState::from_json(&signed(v2))
            .unwrap_err()
            .contains("version 2 with fields of a later"));
        let s = LoaderState::new(7, 6, "helix", 16, dataset()).with_skips(Some(count.clone()));
        assert_eq!(LoaderState::from_json(&s.to_json()).unwrap().skips, Some(count.clone()));
        let bad = |c: SkipCount| LoaderState::from_json(&signed(s.clone().with_skips(Some(c)))).unwrap_err();
        // More planned than the 6 steps of 16 before step 6; more ids than failures, or than a
        // state keeps.
        assert!(bad(SkipCount { planned: 97, ..count.clone() }).contains("97 samples planned before step 6"));
        assert!(bad(SkipCount { failed: 2, ..count.clone() }).contains("3 failed ids for 2"));
        let many = SkipCount { failed: 40, ids: vec![1; crate::step::NAMED_SKIPS + 1], ..count };
        assert!(bad(many).contains("skip count is unusable"));
    }

    #[test]
    fn learned_figures_no_run_could_learn_are_refused_with_the_field() {
        let state = |l: Learned| signed(LoaderState::new(7, 6, "helix", 16, dataset()).with_learned(Some(l)));
        let mut l = learned();
        l.decode[0].coefficients[1] = -1e-3;
        let e = LoaderState::from_json(&state(l)).unwrap_err();
        assert!(
            e.contains("learned models are unusable") && e.contains("h264 decode model's coefficients"),
            "{e}"
        );
        let mut l = learned();
        l.decode[1].codec = "h267".into();
        assert!(LoaderState::from_json(&state(l)).unwrap_err().contains("unknown codec \"h267\""));
        let mut l = learned();
        l.decode[1] = l.decode[0].clone();
        assert!(LoaderState::from_json(&state(l)).unwrap_err().contains("h264 codec twice"));
        let mut l = learned();
        l.accel = vec![[1.0, 1.0, 0.5]; crate::step::MAX_ACCEL_OBSERVATIONS + 1];
        assert!(LoaderState::from_json(&state(l)).unwrap_err().contains("at most 128"));
        let mut l = learned();
        l.accel[3][2] = -0.5;
        assert!(LoaderState::from_json(&state(l)).unwrap_err().contains("accelerator observation"));
        let mut l = learned();
        l.paces = vec![0.5; 9];
        assert!(LoaderState::from_json(&state(l)).unwrap_err().contains("9 paces"));
        // A number JSON cannot hold is written as null, which no figure accepts.
        let mut l = learned();
        l.zstd[0] = f64::NAN;
        assert!(LoaderState::from_json(&state(l)).unwrap_err().contains("not a valid loader state"));
    }

    #[test]
    fn another_dataset_seed_or_batch_names_the_field() {
        let s = LoaderState::new(7, 6, "helix", 16, dataset());
        assert!(s.check_against(7, 16, &dataset()).is_ok());
        let mut other = dataset();
        other.index_sha256 = "ab".repeat(32);
        let e = s.check_against(7, 16, &other).unwrap_err();
        assert!(e.contains("index_sha256: state") && !e.contains("seed: "), "{e}");
        let e = s.check_against(8, 32, &dataset()).unwrap_err();
        assert!(
            e.contains("seed: state 7, this run 8") && e.contains("global_batch: state 16, this run 32"),
            "{e}"
        );
    }
}
