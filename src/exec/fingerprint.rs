//! The same job on every rank: what every rank's loader must agree on before its first step.
//!
//! ```
//! use datahelix::exec::fingerprint::{differences, Fingerprint};
//!
//! let a = Fingerprint::from_fields(&[("global_batch", 16), ("seed", 7)]);
//! let b = Fingerprint::from_fields(&[("global_batch", 32), ("seed", 7)]);
//! let text = differences(&[a.clone(), a, b]).unwrap();
//! assert!(text.contains("global_batch: 16 on ranks [0, 1], 32 on rank [2]"));
//! ```
//!
//! At [`crate::exec::loader::Loader::new`] every rank all-gathers its fingerprint (fixed size: one word per
//! field) and compares them all, so every rank reaches the same verdict from the same bytes and
//! fails with the same message naming the fields and ranks that differ — instead of training on
//! different data, or deadlocking on plans made from different inputs.

use crate::collective::Collective;
use crate::decode::sample::Params;
use crate::sampler::words_hash;

/// Fields that are hashes (shown in hex).
const HASHES: [&str; 4] = ["protocol", "build", "manifest_sha256", "index_sha256"];
/// The most bytes a rank's fingerprint may take (its encoding is a few hundred bytes): a peer
/// announcing more is refused before anything is allocated.
const MAX_FINGERPRINT_BYTES: usize = 1 << 20;

/// This build: the crate version and the commit it was built from (`build.rs`).
pub fn build_id() -> String {
    format!("{}+{}", env!("CARGO_PKG_VERSION"), env!("DATAHELIX_BUILD_COMMIT"))
}

fn text_hash(text: &str) -> u64 {
    words_hash(text.as_bytes())
}

/// One rank's account of the job, field by field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    fields: Vec<(&'static str, u64)>,
}

/// What a loader's fingerprint is made of.
pub struct JobFacts<'a> {
    /// SHA-256 of the dataset's manifest.
    pub manifest_sha256: [u8; 32],
    /// SHA-256 of the index's content.
    pub index_sha256: [u8; 32],
    /// Samples the sampler draws from.
    pub samples: u64,
    /// Preprocessing.
    pub params: Params,
    /// Policy name.
    pub policy: &'a str,
    /// Global batch.
    pub global_batch: u64,
    /// Sampler seed.
    pub seed: u64,
    /// Decode workers across all ranks.
    pub workers: u64,
    /// Steps decoded ahead.
    pub lookahead: u64,
    /// Steps of the run.
    pub steps: u64,
    /// The first step (0, or where a resumed run continues).
    pub first_step: u64,
    /// Token formula name.
    pub formula: &'a str,
    /// Plan-hash checking on.
    pub check_plan: bool,
    /// The split threshold, seconds (`None`: automatic).
    pub split_above_s: Option<f64>,
    /// The skip budget (every rank must end the run at the same point).
    pub max_skip_rate: f64,
    /// The transfer model measured at open (a dozen collectives every rank must issue).
    pub measure_transfer: bool,
    /// Ranks per planning group (0: automatic).
    pub plan_group_ranks: u32,
    /// Late ranks on (every rank must send and receive late pieces alike).
    pub late_pieces: bool,
    /// The mix the batches are drawn by (`None`: uniform), in its one written form.
    pub mix: Option<&'a str>,
}

impl Fingerprint {
    /// The fingerprint of a job.
    pub fn of(job: &JobFacts<'_>) -> Fingerprint {
        let word = |h: &[u8; 32]| u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        let p = job.params;
        Fingerprint::from_fields(&[
            ("ready", 1),
            ("protocol", text_hash(crate::sampler::PROTOCOL)),
            ("build", text_hash(&build_id())),
            ("manifest_sha256", word(&job.manifest_sha256)),
            ("index_sha256", word(&job.index_sha256)),
            ("samples", job.samples),
            ("sample_fps_num", p.sample_fps.0 as u64),
            ("sample_fps_den", p.sample_fps.1 as u64),
            ("max_frames", p.max_frames as u64),
            ("max_pixels", p.max_pixels),
            ("policy", text_hash(job.policy)),
            ("global_batch", job.global_batch),
            ("seed", job.seed),
            ("workers", job.workers),
            ("lookahead", job.lookahead),
            ("steps", job.steps),
            ("first_step", job.first_step),
            ("token_formula", text_hash(job.formula)),
            ("check_plan", job.check_plan as u64),
            ("split_above_s", job.split_above_s.map_or(u64::MAX, f64::to_bits)),
            ("max_skip_rate", job.max_skip_rate.to_bits()),
            ("measure_transfer", job.measure_transfer as u64),
            ("plan_group_ranks", job.plan_group_ranks as u64),
            ("late_pieces", job.late_pieces as u64),
            ("mix", job.mix.map_or(0, text_hash)),
        ])
    }

    /// The fingerprint of a rank that could not open its dataset (or its state to resume): its
    /// own error says why; the others learn that it failed.
    pub fn unready() -> Fingerprint {
        let mut f = Fingerprint::of(&JobFacts {
            manifest_sha256: [0; 32],
            index_sha256: [0; 32],
            samples: 0,
            params: Params::default(),
            policy: "",
            global_batch: 0,
            seed: 0,
            workers: 0,
            lookahead: 0,
            steps: 0,
            first_step: 0,
            formula: "",
            check_plan: false,
            split_above_s: None,
            max_skip_rate: 0.0,
            measure_transfer: false,
            plan_group_ranks: 0,
            late_pieces: false,
            mix: None,
        });
        f.fields.iter_mut().for_each(|f| f.1 = 0);
        f
    }

    /// A fingerprint of the given fields, in order (examples and tests).
    pub fn from_fields(fields: &[(&'static str, u64)]) -> Fingerprint {
        Fingerprint { fields: fields.to_vec() }
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[(&'static str, u64)] {
        &self.fields
    }

    fn encode(&self) -> Vec<u8> {
        self.fields.iter().flat_map(|(_, v)| v.to_le_bytes()).collect()
    }

    /// Another rank's fingerprint from its words, with this one's field names.
    fn decode_like(&self, bytes: &[u8]) -> Fingerprint {
        let fields = self
            .fields
            .iter()
            .zip(bytes.chunks_exact(8))
            .map(|((name, _), w)| (*name, u64::from_le_bytes(w.try_into().expect("8 bytes"))))
            .collect();
        Fingerprint { fields }
    }
}

fn show(name: &str, value: u64) -> String {
    match name {
        _ if HASHES.contains(&name) || name == "policy" || name == "token_formula" => {
            format!("{value:#018x}")
        }
        "split_above_s" if value == u64::MAX => "automatic".into(),
        "split_above_s" => format!("{}", f64::from_bits(value)),
        "check_plan" | "measure_transfer" => if value == 1 { "on" } else { "off" }.into(),
        _ => value.to_string(),
    }
}

fn ranks_text(ranks: &[usize]) -> String {
    let label = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{label} {ranks:?}")
}

/// `None` when every fingerprint is the same; else one line per field that differs, each value
/// with the ranks that hold it (ranks are positions in `all`).
pub fn differences(all: &[Fingerprint]) -> Option<String> {
    let first = all.first()?;
    let mut lines = Vec::new();
    for (k, (name, _)) in first.fields.iter().enumerate() {
        // (value, ranks holding it), in order of first appearance.
        let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
        for (r, f) in all.iter().enumerate() {
            let v = f.fields.get(k).map_or(u64::MAX, |x| x.1);
            match groups.iter_mut().find(|g| g.0 == v) {
                Some(g) => g.1.push(r),
                None => groups.push((v, vec![r])),
            }
        }
        if groups.len() > 1 {
            let held: Vec<String> =
                groups.iter().map(|(v, rs)| format!("{} on {}", show(name, *v), ranks_text(rs))).collect();
            lines.push(format!("  {name}: {}", held.join(", ")));
        }
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// All-gathers `mine` and compares: `Err` with the same message on every rank when any rank's
/// job differs. The words travel with their count (an all-gather of the sizes first), so a rank
/// running a build with more or fewer fields is named as such instead of truncating a
/// fixed-size gather.
pub fn check_same_job(world: &dyn Collective, mine: &Fingerprint) -> Result<(), String> {
    let blocks = world.all_gather_v_vec(&mine.encode(), MAX_FINGERPRINT_BYTES).map_err(|e| e.to_string())?;
    compare(mine, &blocks)
}

/// The comparison of [`check_same_job`] over every rank's words (`blocks[r]` from rank `r`).
fn compare(mine: &Fingerprint, blocks: &[Vec<u8>]) -> Result<(), String> {
    let mut widths: Vec<(usize, Vec<usize>)> = Vec::new();
    for (r, b) in blocks.iter().enumerate() {
        // Words of 8 bytes; anything else is no fingerprint at all.
        let w = if b.len() % 8 == 0 { b.len() / 8 } else { usize::MAX };
        match widths.iter_mut().find(|g| g.0 == w) {
            Some(g) => g.1.push(r),
            None => widths.push((w, vec![r])),
        }
    }
    let prints: Vec<Fingerprint> = blocks.iter().map(|b| mine.decode_like(b)).collect();
    if widths.len() > 1 {
        let held: Vec<String> = widths
            .iter()
            .map(|(w, rs)| match *w {
                usize::MAX => format!("an unreadable one on {}", ranks_text(rs)),
                w => format!("{w} fields on {}", ranks_text(rs)),
            })
            .collect();
        let common = differences(&prints).map(|t| format!("; of the fields they share these differ:\n{t}"));
        return Err(format!(
            "the ranks run different builds of DataHelix: their job fingerprints have {}{}\nDeploy one \
             build everywhere and start again",
            held.join(", "),
            common.unwrap_or_default()
        ));
    }
    let unready: Vec<usize> = prints
        .iter()
        .enumerate()
        .filter(|(_, p)| p.fields.first() == Some(&("ready", 0)))
        .map(|(r, _)| r)
        .collect();
    if !unready.is_empty() {
        return Err(format!(
            "{} could not open the dataset or the state to resume (the error there says why); every rank \
             stops",
            ranks_text(&unready)
        ));
    }
    match differences(&prints) {
        None => Ok(()),
        Some(text) => Err(format!(
            "the ranks are not running the same job — these differ:\n{text}\nEvery rank must run the same \
             build on the same dataset (manifest and index) with the same settings; fix the ranks named \
             (re-index a changed dataset with `datahelix index`, deploy one build everywhere) and start \
             again"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_with_other_fields_is_named_not_truncated() {
        let mine = Fingerprint::from_fields(&[("ready", 1), ("build", 0xaa), ("seed", 7)]);
        let longer = Fingerprint::from_fields(&[("ready", 1), ("build", 0xbb), ("seed", 7), ("new", 1)]);
        let blocks = vec![mine.encode(), longer.encode(), mine.encode()];
        let e = compare(&mine, &blocks).unwrap_err();
        assert!(
            e.contains("different builds") && e.contains("3 fields on ranks [0, 2], 4 fields on rank [1]"),
            "{e}"
        );
        assert!(
            e.contains("build: 0x00000000000000aa on ranks [0, 2], 0x00000000000000bb on rank [1]"),
            "{e}"
        );
        let e = compare(&mine, &[mine.encode(), vec![1, 2, 3]]).unwrap_err();
        assert!(e.contains("an unreadable one on rank [1]"), "{e}");
        assert_eq!(compare(&mine, &[mine.encode(), mine.encode()]), Ok(()));
    }

    #[test]
    fn equal_prints_have_no_differences() {
        let a = Fingerprint::from_fields(&[("samples", 3), ("seed", 1)]);
        assert_eq!(differences(&[a.clone(), a.clone(), a]), None);
        assert_eq!(differences(&[]), None);
    }

    #[test]
    fn every_differing_field_is_named_with_its_ranks() {
        let base = [("manifest_sha256", 0xab), ("global_batch", 16), ("seed", 7), ("check_plan", 1)];
        let mut other = base;
        other[0].1 = 0xcd;
        other[3].1 = 0;
        let a = Fingerprint::from_fields(&base);
        let b = Fingerprint::from_fields(&other);
        let text = differences(&[a.clone(), b.clone(), a, b]).expect("differs");
        assert!(
            text.contains(
                "manifest_sha256: 0x00000000000000ab on ranks [0, 2], 0x00000000000000cd on ranks [1, 3]"
            ),
            "{text}"
        );
        assert!(text.contains("check_plan: on on ranks [0, 2], off on ranks [1, 3]"), "{text}");
        assert!(!text.contains("global_batch") && !text.contains("seed"), "{text}");
    }

    #[test]
    fn a_different_build_or_protocol_is_a_difference() {
        let facts = |policy| JobFacts {
            manifest_sha256: [1; 32],
            index_sha256: [2; 32],
            samples: 3,
            params: Params::default(),
            policy,
            global_batch: 4,
            seed: 5,
            workers: 6,
            lookahead: 2,
            steps: 10,
            first_step: 0,
            formula: "tokens",
            check_plan: true,
            split_above_s: None,
            max_skip_rate: 0.01,
            measure_transfer: false,
            plan_group_ranks: 0,
            late_pieces: false,
            mix: None,
        };
        let a = Fingerprint::of(&facts("helix"));
        assert_eq!(a, Fingerprint::of(&facts("helix")), "a pure function of the facts");
        let mut b = a.clone();
        b.fields.iter_mut().find(|f| f.0 == "build").expect("build field").1 ^= 1;
        let text = differences(&[a.clone(), b]).expect("differs");
        assert!(text.starts_with("  build: "), "{text}");
        let c = Fingerprint::of(&facts("rank-local"));
        assert!(differences(&[a, c]).expect("differs").contains("policy"));
    }
}
