//! HEVC, VP9 and AV1 (in MP4 and WebM) beside H.264, end to end through the CLI: `datahelix gen`
//! writes them with libx265, libvpx-vp9 and SVT-AV1; `index` probes them as decodable with the
//! right codec and container; `decode` delivers every sample byte-identical to an independent
//! ffmpeg-CLI reference decode; `calibrate` fits each codec its own cost model.

mod common;
mod decode_support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;

use common::{datahelix, dataset, run};
use datahelix::descriptor::{Codec, Container, Status};
use datahelix::index::Index;
use decode_support::assert_decode_matches_reference;
use serde_json::Value;

fn json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON document on stdout")
}

/// `scripts/specs/codecs_tiny.json`, generated and indexed once per test binary.
fn codecs_dataset() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = dataset("codecs_tiny");
        let o = run(datahelix().arg("index").arg(&dir));
        assert!(o.status.success(), "index failed: {}", String::from_utf8_lossy(&o.stderr));
        dir
    })
    .clone()
}

#[test]
fn generated_clips_index_with_their_codec_and_container() {
    let dir = codecs_dataset();
    let index = Index::open(&dir).unwrap();
    let mut codecs = BTreeSet::new();
    for i in 0..index.len() {
        let d = index.get(i).unwrap();
        let path = index.path(i).unwrap().to_owned();
        assert_eq!(d.status, Status::Ok, "{path}: {d:?}");
        let container = match path.rsplit('.').next() {
            Some("mp4") => Container::Mp4,
            Some("webm" | "mkv") => Container::Mkv,
            other => panic!("{path}: unexpected extension {other:?}"),
        };
        assert_eq!(d.container, container, "{path}");
        assert!(d.frames > 0 && d.width > 0 && d.duration_ticks > 0, "{path}: {d:?}");
        codecs.insert(d.codec.name());
    }
    let want: BTreeSet<&str> =
        [Codec::H264, Codec::Hevc, Codec::Vp9, Codec::Av1].iter().map(|c| c.name()).collect();
    assert_eq!(codecs, want, "the spec draws every codec");
}

#[test]
fn every_codec_decodes_like_the_ffmpeg_cli() {
    let dir = codecs_dataset();
    assert_eq!(assert_decode_matches_reference(&dir, datahelix().arg("decode").arg(&dir)), 8);
}

#[test]
fn calibrate_fits_a_model_for_each_new_codec() {
    let dir = codecs_dataset();
    let index = Index::open(&dir).unwrap();
    let doc = json(&run(datahelix().arg("calibrate").arg(&dir).arg("--json")));
    let models = doc["models"].as_object().unwrap();
    for codec in ["hevc", "vp9", "av1"] {
        let m = &models.get(codec).unwrap_or_else(|| panic!("no {codec} model: {doc}"));
        let samples = (0..index.len()).filter(|&i| index.get(i).unwrap().codec.name() == codec).count();
        let seen = m["n"].as_u64().unwrap() as usize + m["n_heldout"].as_u64().unwrap() as usize;
        assert_eq!(seen, samples, "{codec}: every sample fitted or held back: {m}");
        let c = &m["coefficients"];
        let sum: f64 = ["c0", "c_px", "c_bits", "c_seek"].iter().map(|k| c[k].as_f64().unwrap()).sum();
        assert!(sum > 0.0, "{codec}: a model that predicts nothing: {m}");
    }
}
