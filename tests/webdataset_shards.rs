//! WebDataset tar shards (issue 19, item 1), written by the real `webdataset` package's
//! `ShardWriter`: indexed in place, decoded straight from their byte ranges and trained on under
//! `mpirun -np 4`, every tensor byte-identical to the same clips as loose files; a damaged member
//! is a reported skip and the rest of its shard is delivered; a damaged tar header is an index
//! error naming the shard and byte, the samples before it kept; a brace pattern
//! (`train-{000000..000001}.tar`) names a subset of the shards, with an index of its own.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The project's Python environment (scripts/setup.sh), which has webdataset.
fn python() -> PathBuf {
    let venv = std::env::var_os("DH_VENV").map(PathBuf::from).unwrap_or_else(|| common::repo().join(".venv"));
    let py = venv.join("bin/python");
    assert!(py.is_file(), "no Python environment at {}: run scripts/setup.sh", venv.display());
    py
}

/// Gives every sample of the loose dataset in argv[1] a caption and a label, adds a damaged
/// clip (the first 60% of an MP4) as its seventh sample, and writes the same samples, in the
/// same order, as WebDataset shards of five samples into argv[2] with `ShardWriter`: the media
/// member, `.json` (id, text_tokens), `.txt` (the caption), `.cls` (the label).
const WRITE_SHARDS: &str = r#"
import json, sys, os
import webdataset as wds
loose, out = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(f"{loose}/manifest.jsonl") if l.strip()]
mp4 = next(r for r in rows if r["path"].endswith(".mp4"))
whole = open(f"{loose}/{mp4['path']}", "rb").read()
open(f"{loose}/damaged.mp4", "wb").write(whole[: len(whole) * 6 // 10])
rows.insert(6, {"id": 4242, "path": "damaged.mp4", "text_tokens": 9})
for r in rows:
    r["caption"] = f'clip {r["id"]}, "quoted"'
    r["label"] = r["id"] % 7
with open(f"{loose}/manifest.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
os.makedirs(out, exist_ok=True)
with wds.ShardWriter(f"{out}/train-%06d.tar", maxcount=5) as sink:
    for i, r in enumerate(rows):
        ext = r["path"].rsplit(".", 1)[1].lower()
        sink.write({
            "__key__": f"sample{i:04d}",
            ext: open(f"{loose}/{r['path']}", "rb").read(),
            "json": {"id": r["id"], "text_tokens": r["text_tokens"]},
            "txt": r["caption"],
            "cls": r["label"],
        })
"#;

/// A copy of the tiny dataset with captions and a damaged clip, and the same samples as shards.
struct Pair {
    _tmp: tempfile::TempDir,
    loose: PathBuf,
    shards: PathBuf,
}

fn pair() -> Pair {
    let tmp = common::copy_dataset(&common::tiny_dataset());
    let loose = tmp.path().to_path_buf();
    let shards = loose.join("shards");
    let o = Command::new(python()).arg("-c").arg(WRITE_SHARDS).arg(&loose).arg(&shards).output().unwrap();
    assert!(o.status.success(), "writing shards failed: {}", String::from_utf8_lossy(&o.stderr));
    for dir in [&loose, &shards] {
        let o = common::run(common::datahelix().arg("index").arg(dir).env_remove("DATAHELIX_INDEX_DIR"));
        assert!(o.status.success(), "index {} failed: {}", dir.display(), String::from_utf8_lossy(&o.stderr));
    }
    Pair { _tmp: tmp, loose, shards }
}

fn json_of(cmd: &mut Command) -> Value {
    let o = common::run(cmd.env_remove("DATAHELIX_INDEX_DIR"));
    assert!(o.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// `decode --json` of every sample, by id.
fn decoded(dir: &Path) -> BTreeMap<u64, Value> {
    let v = json_of(common::datahelix().arg("decode").arg(dir).arg("--json"));
    v["samples"].as_array().unwrap().iter().map(|s| (s["id"].as_u64().unwrap(), s.clone())).collect()
}

#[test]
fn shards_index_like_the_same_files_loose_and_decode_to_the_same_bytes() {
    let p = pair();
    let report = json_of(common::datahelix().arg("index").arg(&p.shards).arg("--json"));
    assert_eq!(report["count"], 13, "{report}");
    assert_eq!(report["ok"], 12, "{report}");
    assert_eq!(report["by_status"], serde_json::json!({"truncated": 1}), "{report}");

    // The same descriptors as the loose files, in the same order (paths and times aside).
    let (loose, shards) =
        (datahelix::index::Index::open(&p.loose).unwrap(), datahelix::index::Index::open(&p.shards).unwrap());
    assert_eq!(loose.len(), shards.len());
    for i in 0..loose.len() {
        let strip =
            |d: datahelix::descriptor::Descriptor| datahelix::descriptor::Descriptor { mtime_ns: 0, ..d };
        assert_eq!(strip(shards.get(i).unwrap()), strip(loose.get(i).unwrap()), "sample {i}");
        let path = shards.path(i).unwrap();
        let member = datahelix::shard::location::MemberPath::parse(path).expect("a member path");
        assert!(member.shard.starts_with("train-") && member.member.starts_with("sample"), "{path}");
    }

    let (from_loose, from_shards) = (decoded(&p.loose), decoded(&p.shards));
    assert_eq!(from_loose.keys().collect::<Vec<_>>(), from_shards.keys().collect::<Vec<_>>());
    for (id, want) in &from_loose {
        let got = &from_shards[id];
        if *id == 4242 {
            assert!(got["error"].as_str().is_some_and(|e| e.contains("truncated")), "{got}");
            continue;
        }
        assert!(got["error"].is_null(), "{got}");
        for key in ["shape", "sha256", "timestamps_s"] {
            assert_eq!(got[key], want[key], "sample {id}: {key}");
        }
        for key in ["caption", "label"] {
            assert_eq!(got["meta"][key], want["meta"][key], "sample {id}: meta {key}");
        }
        assert!(got["meta"]["__key__"].as_str().is_some_and(|k| k.starts_with("sample")), "{got}");
        assert!(got["meta"]["__shard__"].as_str().is_some_and(|k| k.ends_with(".tar")), "{got}");
    }

    // Indexed again, nothing is probed: every member is reused.
    let again = json_of(common::datahelix().arg("index").arg(&p.shards).arg("--json"));
    assert_eq!((again["probed"].as_u64(), again["reused"].as_u64()), (Some(0), Some(13)), "{again}");
}

/// `datahelix train` under `mpirun -np 4` (helix: tensors cross ranks) with `--checksums`.
fn train(data: &Path, out: &Path) -> Value {
    let mut cmd = Command::new("mpirun");
    common::mpi_env(&mut cmd).args(["-np", "4"]).env("DATAHELIX_COLLECTIVE_TIMEOUT", "60");
    cmd.env_remove("DATAHELIX_INDEX_DIR")
        .arg(env!("CARGO_BIN_EXE_datahelix"))
        .args(["train", "--data"])
        .arg(data)
        .args(["--policy", "helix", "--global-batch", "8", "--workers", "4", "--steps", "6", "--warmup", "1"])
        .args(["--profile", "0.02,1e-6,0,0.05", "--no-cpu-budget", "--checksums", "--out"])
        .arg(out);
    let o = common::run_limited(&mut cmd, std::time::Duration::from_secs(300));
    assert!(o.status.success(), "train on {} failed: {}", data.display(), String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap()
}

/// Per step: the sorted delivered ids, the sorted skipped ids and the wrapping sum of the
/// delivered tensors' checksums over the ranks.
fn per_step(result: &Value) -> BTreeMap<u64, (Vec<u64>, Vec<u64>, u64)> {
    let ids = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect::<Vec<u64>>();
    let mut steps: BTreeMap<u64, (Vec<u64>, Vec<u64>, u64)> = BTreeMap::new();
    for r in result["records"].as_array().unwrap() {
        let e = steps.entry(r["step"].as_u64().unwrap()).or_default();
        e.0.extend(ids(&r["ids"]));
        e.1.extend(ids(&r["skipped"]));
        e.2 = e.2.wrapping_add(r["tensor_checksum"].as_u64().expect("--checksums"));
    }
    for e in steps.values_mut() {
        e.0.sort_unstable();
        e.1.sort_unstable();
    }
    steps
}

#[test]
fn training_on_shards_under_mpirun_delivers_the_bytes_of_the_loose_files() {
    let p = pair();
    let out = tempfile::tempdir().unwrap();
    let loose = per_step(&train(&p.loose, &out.path().join("loose.json")));
    let result = train(&p.shards, &out.path().join("shards.json"));
    let shards = per_step(&result);
    assert_eq!(shards.len(), 6);
    // Same global batches, same skips, the same bytes delivered (rank by rank placement may differ).
    assert_eq!(shards, loose, "per step: delivered ids, skipped ids, tensor checksums");
    let ids: Vec<u64> = common::manifest_ids(&p.loose);
    let sampler = datahelix::sampler::Sampler::new(&ids, result["params"]["seed"].as_u64().unwrap());
    let mut damaged_seen = false;
    for (step, (delivered, skipped, _)) in &shards {
        let mut all: Vec<u64> = delivered.iter().chain(skipped).copied().collect();
        all.sort_unstable();
        let mut want = sampler.global_batch(*step, 8);
        want.sort_unstable();
        assert_eq!(all, want, "step {step}: exactly once");
        assert!(skipped.iter().all(|&id| id == 4242), "step {step}: only the damaged clip is skipped");
        damaged_seen |= want.contains(&4242);
        // The damaged member's shard neighbours are delivered.
        assert!(!delivered.contains(&4242));
    }
    assert!(damaged_seen, "the damaged clip was in no global batch; choose another seed");
}

#[test]
fn a_brace_pattern_names_some_shards_and_gets_an_index_of_its_own() {
    let p = pair();
    let pattern = p.shards.join("train-{000000..000001}.tar");
    let report = json_of(common::datahelix().arg("index").arg(&pattern).arg("--json"));
    assert_eq!(report["count"], 10, "{report}");
    let index_path = report["index"].as_str().unwrap();
    assert!(index_path.ends_with(".datahelix/train-{000000..000001}.tar/index"), "{index_path}");
    // Decoded through the pattern: the bytes of the whole folder's index, for those samples.
    let (some, all) = (decoded(&pattern), decoded(&p.shards));
    assert_eq!(some.len(), 10);
    for (id, s) in &some {
        assert_eq!(s["sha256"], all[id]["sha256"], "sample {id}");
    }
    // A pattern naming a shard that is not there is refused by name.
    let o = common::run(common::datahelix().arg("index").arg(p.shards.join("train-{000001..000003}.tar")));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("train-000003.tar"), "{err}");
}

/// Shards in subfolders (`train/`, `train/more/`) index as the same shards in one folder and
/// decode to the same bytes; the index names each sample's shard by its path. A brace pattern
/// may span folders (`{a,b}/s-0.tar`).
#[test]
fn shards_in_subfolders_index_and_decode_like_shards_in_one_folder() {
    let p = pair();
    let nested = p.loose.join("nested");
    let names: Vec<String> = std::fs::read_dir(&p.shards)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tar"))
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for (k, name) in names.iter().enumerate() {
        let folder = if k == 0 { nested.join("train") } else { nested.join("train/more") };
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::copy(p.shards.join(name), folder.join(name)).unwrap();
    }
    let report = json_of(common::datahelix().arg("index").arg(&nested).arg("--json"));
    assert_eq!((report["count"].as_u64(), report["ok"].as_u64()), (Some(13), Some(12)), "{report}");
    let index = datahelix::index::Index::open(&nested).unwrap();
    for i in 0..index.len() {
        let path = index.path(i).unwrap();
        let member = datahelix::shard::location::MemberPath::parse(path).expect("a member path");
        assert!(member.shard.starts_with("train/"), "{path}");
    }
    let (flat, from_nested) = (decoded(&p.shards), decoded(&nested));
    assert_eq!(flat.keys().collect::<Vec<_>>(), from_nested.keys().collect::<Vec<_>>());
    for (id, want) in &flat {
        assert_eq!(from_nested[id]["sha256"], want["sha256"], "sample {id}");
        assert_eq!(from_nested[id]["error"].is_null(), want["error"].is_null(), "sample {id}");
    }

    let split = p.loose.join("split");
    let mut sorted = names.clone();
    sorted.sort();
    for (folder, name) in [("a", &sorted[0]), ("b", &sorted[1])] {
        std::fs::create_dir_all(split.join(folder)).unwrap();
        std::fs::copy(p.shards.join(name), split.join(folder).join("s-0.tar")).unwrap();
    }
    let pattern = split.join("{a,b}/s-0.tar");
    let report = json_of(common::datahelix().arg("index").arg(&pattern).arg("--json"));
    assert_eq!(report["count"], 10, "{report}");
    let some = decoded(&pattern);
    assert_eq!(some.len(), 10);
    for (id, s) in &some {
        assert_eq!(s["sha256"], flat[id]["sha256"], "sample {id}");
    }
    // A pattern may not climb out of its folder.
    let o = common::run(common::datahelix().arg("index").arg(split.join("{a,b}/../a/s-0.tar")));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("stay inside"), "{err}");
}

#[test]
fn a_damaged_tar_header_keeps_the_samples_before_it_and_names_the_shard() {
    let p = pair();
    let shard = p.shards.join("train-000001.tar");
    let bytes = std::fs::read(&shard).unwrap();
    // The third member's header: after the first two (header + data padded to 512 each).
    let listing = datahelix::shard::tar::members(&std::fs::File::open(&shard).unwrap()).unwrap();
    let third = listing.members[2].offset - 512;
    let mut damaged = bytes.clone();
    damaged[third as usize + 100] ^= 0x5a;
    std::fs::write(&shard, &damaged).unwrap();
    let report = json_of(common::datahelix().arg("index").arg(&p.shards).arg("--json"));
    let errors: Vec<String> = report["manifest_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    let named = errors.iter().any(|e| e.contains("train-000001.tar") && e.contains(&format!("byte {third}")));
    assert!(named, "no error names the shard and byte {third}: {errors:?}");
    // The first two members of the shard were one sample's .cls and .json (or its media): the
    // other shards' samples are all there.
    let index = datahelix::index::Index::open(&p.shards).unwrap();
    let by_shard: HashMap<String, usize> = (0..index.len()).fold(HashMap::new(), |mut m, i| {
        let path = index.path(i).unwrap().to_owned();
        let shard = datahelix::shard::location::MemberPath::parse(&path).unwrap().shard.to_owned();
        *m.entry(shard).or_default() += 1;
        m
    });
    assert_eq!(by_shard.get("train-000000.tar"), Some(&5));
    assert_eq!(by_shard.get("train-000002.tar"), Some(&3));
    assert!(by_shard.get("train-000001.tar").copied().unwrap_or(0) < 5, "{by_shard:?}");

    // Rewritten to another size after indexing: every command says the index is stale.
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let o = common::run(
        common::datahelix().arg("decode").arg(&p.shards).arg("--json").env_remove("DATAHELIX_INDEX_DIR"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("*.tar changed since the index was built"), "{err}");
}

/// The pair's tar shards unpacked and zipped again in `zips/`, member order kept: the first
/// shard stored (`zip -0`, read in place), the others deflated (`zip`'s default, inflated).
fn zipped(p: &Pair) -> PathBuf {
    let zips = p.loose.join("zips");
    std::fs::create_dir_all(&zips).unwrap();
    let mut tars: Vec<String> = std::fs::read_dir(&p.shards)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tar"))
        .collect();
    tars.sort();
    for (k, tar) in tars.iter().enumerate() {
        let unpacked = p.loose.join(format!("unpacked-{k}"));
        std::fs::create_dir_all(&unpacked).unwrap();
        let ok = Command::new("tar").arg("-xf").arg(p.shards.join(tar)).arg("-C").arg(&unpacked).status();
        assert!(ok.unwrap().success());
        let listing =
            datahelix::shard::tar::members(&std::fs::File::open(p.shards.join(tar)).unwrap()).unwrap();
        let names: Vec<&str> = listing.members.iter().map(|m| m.name.as_str()).collect();
        let archive = zips.join(tar.replace(".tar", ".zip"));
        let level = if k == 0 { "-0" } else { "-6" };
        let ok = Command::new("zip")
            .current_dir(&unpacked)
            .args(["-q", "-X", level])
            .arg(&archive)
            .args(&names)
            .status();
        assert!(ok.unwrap().success());
    }
    zips
}

/// Zip shards (as several public video sets ship their clips), stored and deflated, index like
/// the tars they were made from and decode to the same bytes with the same metadata; a member
/// damaged after indexing fails alone, named with why.
#[test]
fn zip_shards_stored_and_deflated_index_and_decode_like_tars() {
    let p = pair();
    let zips = zipped(&p);
    let report = json_of(common::datahelix().arg("index").arg(&zips).arg("--json"));
    assert_eq!((report["count"].as_u64(), report["ok"].as_u64()), (Some(13), Some(12)), "{report}");
    assert_eq!(report["by_status"], serde_json::json!({"truncated": 1}), "{report}");
    let index = datahelix::index::Index::open(&zips).unwrap();
    let mut codings = Vec::new();
    for i in 0..index.len() {
        let path = index.path(i).unwrap();
        let member = datahelix::shard::location::MemberPath::parse(path).expect("a member path");
        assert!(member.shard.ends_with(".zip"), "{path}");
        codings.push((
            member.shard.to_owned(),
            member.part.coding == datahelix::shard::location::Coding::Stored,
        ));
    }
    assert!(codings.iter().all(|(s, stored)| *stored == s.ends_with("000000.zip")), "{codings:?}");
    // A brace pattern names zips as it names tars.
    let pattern = zips.join("train-{000001..000002}.zip");
    let some = json_of(common::datahelix().arg("index").arg(&pattern).arg("--json"));
    assert_eq!(some["count"], 8, "{some}");

    let (from_tars, from_zips) = (decoded(&p.shards), decoded(&zips));
    assert_eq!(from_tars.keys().collect::<Vec<_>>(), from_zips.keys().collect::<Vec<_>>());
    for (id, want) in &from_tars {
        let got = &from_zips[id];
        assert_eq!(got["error"].is_null(), want["error"].is_null(), "sample {id}: {got}");
        for key in ["shape", "sha256", "timestamps_s"] {
            assert_eq!(got[key], want[key], "sample {id}: {key}");
        }
        for key in ["caption", "label", "__key__"] {
            assert_eq!(got["meta"][key], want["meta"][key], "sample {id}: meta {key}");
        }
    }

    // A deflated media member garbled in the middle after indexing, size and time kept: that
    // sample fails, named, with why; every other sample decodes.
    let archive = zips.join("train-000001.zip");
    let listing = datahelix::shard::zip::members(&std::fs::File::open(&archive).unwrap()).unwrap();
    let media = listing.members.iter().find(|m| m.name.ends_with(".mp4")).expect("an mp4 member");
    let victim = (0..index.len())
        .find(|&i| index.path(i).unwrap().contains(&format!("#{}@", media.name)))
        .map(|i| index.get(i).unwrap().id)
        .expect("the member is indexed");
    let mtime = std::fs::metadata(&archive).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&archive).unwrap();
    let middle = (media.part.range.offset + media.part.range.len / 2) as usize;
    for b in &mut bytes[middle..middle + 16] {
        *b ^= 0xa5;
    }
    std::fs::write(&archive, &bytes).unwrap();
    std::fs::File::options().write(true).open(&archive).unwrap().set_modified(mtime).unwrap();
    let after = decoded(&zips);
    for (id, s) in &after {
        if *id == victim {
            let e = s["error"].as_str().unwrap_or_default();
            assert!(e.contains("shard member") && (e.contains("CRC-32") || e.contains("inflate")), "{s}");
        } else {
            assert_eq!(s["sha256"], from_zips[id]["sha256"], "sample {id}");
        }
    }
}

/// `datahelix train` under `mpirun -np 4` on zip shards delivers per step what it delivers on
/// the loose files: the same ids, skips and tensor bytes.
#[test]
fn training_on_zip_shards_under_mpirun_delivers_the_bytes_of_the_loose_files() {
    let p = pair();
    let zips = zipped(&p);
    let o = common::run(common::datahelix().arg("index").arg(&zips).env_remove("DATAHELIX_INDEX_DIR"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = tempfile::tempdir().unwrap();
    let loose = per_step(&train(&p.loose, &out.path().join("loose.json")));
    assert_eq!(per_step(&train(&zips, &out.path().join("zips.json"))), loose);
}

/// Clips zipped whole, as a public set ships them (`zip -r clips.zip videos/ README.txt`): each
/// clip is a sample of its own, keyed by its path in the archive, decoding to the loose file's
/// bytes; the README is named as no sample, and a gzipped tar beside it as not read, with
/// what to do.
#[test]
fn clips_zipped_whole_are_samples_keyed_by_their_paths() {
    let tmp = common::copy_dataset(&common::tiny_dataset());
    let loose = tmp.path();
    let rows: Vec<Value> = std::fs::read_to_string(loose.join("manifest.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
    std::fs::write(loose.join("README.txt"), "clips of the tiny set\n").unwrap();
    let set = loose.join("zipped");
    std::fs::create_dir(&set).unwrap();
    let ok = Command::new("zip")
        .current_dir(loose)
        .args(["-q", "-X"])
        .arg(set.join("clips.zip"))
        .args(&paths)
        .arg("README.txt")
        .status();
    assert!(ok.unwrap().success());
    let ok =
        Command::new("tar").current_dir(loose).arg("-czf").arg(set.join("more.tar.gz")).args(&paths).status();
    assert!(ok.unwrap().success());
    let o = common::run(
        common::datahelix().arg("index").arg(&set).arg("--json").env_remove("DATAHELIX_INDEX_DIR"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("more.tar.gz") && err.contains("gunzip -k"), "{err}");
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["count"].as_u64(), Some(paths.len() as u64 + 1), "{report}");
    let errors = report["manifest_errors"].to_string();
    assert!(errors.contains("clips.zip, sample README") && errors.contains("no media member"), "{errors}");
    let o = common::run(common::datahelix().arg("index").arg(loose).env_remove("DATAHELIX_INDEX_DIR"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want: HashMap<String, Value> = decoded(loose)
        .into_values()
        .map(|s| {
            let path = paths[rows.iter().position(|r| r["id"] == s["id"]).unwrap()];
            (path.rsplit_once('.').unwrap().0.to_owned(), s["sha256"].clone())
        })
        .collect();
    let got = decoded(&set);
    assert_eq!(got.len(), paths.len());
    for s in got.values() {
        let key = s["meta"]["__key__"].as_str().unwrap();
        assert_eq!(s["id"].as_u64(), Some(datahelix::shard::id_of("clips.zip", key)), "{s}");
        assert_eq!(s["sha256"], want[key], "{key}");
    }
}
