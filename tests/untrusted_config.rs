//! The C configuration is untrusted: `dh_config_set`'s keys and values and
//! `dh_config_from_file`'s TOML come from users and their programs, and the `resume` document
//! (a loader state, `datahelix::exec::state::LoaderState`) from files that may be damaged. Any
//! key, value, document or file never panics (through C: never `DH_PANIC`), gives the code the
//! header documents with a message that names the key (or the file), and a valid setting or
//! state round-trips. The environment variables the configuration reads are checked through the
//! `datahelix` binary (changing this process's environment would race with the other tests).

use std::ffi::{c_char, CStr, CString};
use std::time::Duration;

use datahelix::exec::state::{DatasetId, LoaderState};
use datahelix::ffi::config::{dh_config, dh_config_free, dh_config_from_file, dh_config_new, dh_config_set};
use datahelix::ffi::{dh_error_message, dh_result};
use datahelix::policy::Policy;
use proptest::collection::vec;
use proptest::prelude::*;

mod untrusted_support;

use untrusted_support::{apply, mutation};

/// The keys `dh_config_set` documents (`csrc/include/datahelix.h`), but `resume_file`, whose
/// value is a path to read (random paths could name a device that never ends): it is tested with
/// files of its own below.
const KEYS: &[&str] = &[
    "data",
    "index_dir",
    "policy",
    "global_batch",
    "workers",
    "seed",
    "mix",
    "steps",
    "warmup",
    "lookahead",
    "budget_mib",
    "cpu_budget",
    "cores",
    "job",
    "check_plan",
    "split_above_s",
    "plan_group_ranks",
    "transfer_model",
    "max_frames",
    "max_pixels",
    "collective_timeout_s",
    "decode_timeout_s",
    "max_skip_rate",
    "backend",
    "resume",
];

/// What `set(key, value)` must answer, from the header's documentation of each key: `None` for
/// an unknown key, else whether the value is accepted.
fn accepted(key: &str, value: &str) -> Option<bool> {
    let t = value.trim();
    let seconds = |v: &str| v.trim().parse::<f64>().ok().filter(|s| s.is_finite());
    Some(match key {
        "data" => !value.is_empty(),
        "policy" => t.parse::<Policy>().is_ok(),
        "global_batch" | "workers" | "lookahead" => t.parse::<usize>().is_ok(),
        "seed" | "steps" | "warmup" => t.parse::<u64>().is_ok(),
        "budget_mib" => t.parse::<usize>().ok().and_then(|m| m.checked_mul(1 << 20)).is_some(),
        "cpu_budget" | "check_plan" => ["true", "1", "yes", "on", "false", "0", "no", "off"].contains(&t),
        "cores" | "split_above_s" | "decode_timeout_s" | "max_skip_rate" => {
            seconds(t).is_some_and(|s| s >= 0.0)
        }
        "collective_timeout_s" => seconds(t).is_some_and(|s| s > 0.0),
        "job" | "index_dir" => true,
        "transfer_model" => ["default", "measured"].contains(&t),
        "backend" => ["mpi", "hccl"].contains(&t),
        "max_frames" | "plan_group_ranks" => t.parse::<u32>().is_ok(),
        "max_pixels" => t.parse::<u64>().is_ok(),
        "resume" => LoaderState::from_json(value).is_ok(),
        "mix" => mix_accepted(t),
        _ => return None,
    })
}

/// What `mix` documents: empty (uniform), or `name=weight` pairs separated by commas — names
/// without `/`, `=` or `#`, each once, weights integers 1–1000, at most 64 groups.
fn mix_accepted(t: &str) -> bool {
    let parts: Vec<&str> = t.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    if t.is_empty() {
        return true;
    }
    let mut names = std::collections::HashSet::new();
    !parts.is_empty()
        && parts.len() <= 64
        && parts.iter().all(|p| {
            p.split_once('=').is_some_and(|(name, w)| {
                let name = name.trim();
                !name.is_empty()
                    && !name.contains(['/', '=', '#'])
                    && w.trim().parse::<u64>().is_ok_and(|w| (1..=1000).contains(&w))
                    && names.insert(name.to_owned())
            })
        })
}

/// The case of `collective_timeout_s_past_durations_range_is_an_error` below: a finite, positive
/// number of seconds that `Duration` cannot hold (it panicked once; now refused). The properties
/// leave exactly that case to that test.
fn hits_the_timeout_bug(key: &str, value: &str) -> bool {
    key == "collective_timeout_s"
        && value
            .trim()
            .parse::<f64>()
            .is_ok_and(|s| s.is_finite() && s > 0.0 && Duration::try_from_secs_f64(s).is_err())
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(String::from),
        1 => "[a-z_]{0,16}",
        1 => "\\PC{0,12}",
        1 => prop::sample::select(KEYS).prop_map(|k| format!(" {k}")),
        1 => prop::sample::select(KEYS).prop_map(|k| k.to_uppercase()),
    ]
}

fn arb_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[ \t]{0,1}[-+]?[0-9]{0,22}(\\.[0-9]{0,4})?([eE][-+]?[0-9]{1,3})?[ \t]{0,1}",
        2 => prop::sample::select(vec![
            "", " ", "0", "-0", "1", "-1", "+1", "0.0", "1e308", "1e309", "-1e309", "5e-324", "inf", "-inf",
            "+inf", "infinity", "NaN", "nan", "-nan", "18446744073709551615", "18446744073709551616",
            "4294967295", "4294967296", "17592186044415", "17592186044416", "0x10", "1_000", "true",
            "false", "yes", "no", "on", "off", " true ", "TRUE", "True", "2", "helix", " helix ",
            "Helix", "rank-local", "actor-pool", "post-balance", "helix-batching", "helix-placement",
            "helix\u{0}", "{}", "null", "/", ".", "..", "mpi", "hccl", " hccl", "HCCL", "nccl",
            "video=3,image=1", " video = 3 , image=1 ,", "video=0", "video=1001", "video=1000", "video=0.5",
            "a=1,a=2", "a/b=1", "=1", "a=", "a=1,,b=2", ",", "video", "a#=1", "x=-1", "x=+1",
        ])
        .prop_map(String::from),
        2 => "\\PC{0,40}",
        1 => any::<String>(),
    ]
}

/// The last error message of this thread, through the C call.
fn last_error() -> String {
    let need = dh_error_message(std::ptr::null_mut(), 0);
    let mut buf = vec![0 as c_char; need];
    assert_eq!(dh_error_message(buf.as_mut_ptr(), buf.len()), need);
    // SAFETY: dh_error_message wrote a NUL-terminated string into buf.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

/// A configuration made through C, freed on drop.
struct CConfig(*mut dh_config);

impl CConfig {
    fn new() -> CConfig {
        let mut p = std::ptr::null_mut();
        assert_eq!(dh_config_new(&mut p), dh_result::DH_OK, "{}", last_error());
        assert!(!p.is_null());
        CConfig(p)
    }

    fn set_bytes(&self, key: &[u8], value: &[u8]) -> dh_result {
        let (k, v) = (CString::new(key).unwrap(), CString::new(value).unwrap());
        dh_config_set(self.0, k.as_ptr(), v.as_ptr())
    }
}

impl Drop for CConfig {
    fn drop(&mut self) {
        dh_config_free(self.0);
    }
}

fn arb_state() -> impl Strategy<Value = LoaderState> {
    (
        any::<u64>(),
        prop_oneof![0u64..1000, any::<u64>()],
        prop::sample::select(Policy::ALL.to_vec()),
        prop_oneof![1u64..64, 1u64..=u64::MAX],
        prop_oneof![1u64..10_000, 1u64..=u64::MAX],
        "[0-9a-f]{64}",
        "[0-9a-f]{64}",
        prop::option::of("[a-z]{1,8}=[1-9](,[a-z]{1,8}=[1-9]){0,3}"),
    )
        .prop_map(|(seed, next_step, policy, global_batch, samples, m, i, mix)| {
            let dataset = DatasetId { samples, manifest_sha256: m, index_sha256: i, mix };
            LoaderState::new(seed, next_step, policy.name(), global_batch, dataset)
        })
}

/// The reasons `LoaderState::from_json` documents, one of which every refusal gives.
fn is_a_state_reason(e: &str) -> bool {
    [
        "not a loader state",
        "a loader state of version",
        "not a valid loader state",
        "changed after it was written",
        "inconsistent",
        "learned models are unusable",
    ]
    .iter()
    .any(|r| e.contains(r))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Any key and value through the safe method (the one the Python binding calls): no panic,
    /// accepted exactly when the documentation says, refused with `DH_UNKNOWN_KEY` (naming the
    /// key and listing the known ones) or `DH_INVALID_PARAMETER` (naming the key).
    #[test]
    fn set_follows_the_documented_values(key in arb_key(), value in arb_value()) {
        prop_assume!(!hits_the_timeout_bug(&key, &value));
        let mut c = dh_config::new().unwrap();
        let r = c.set(&key, &value);
        match (accepted(&key, &value), r) {
            (None, Err(e)) => {
                prop_assert_eq!(e.code(), dh_result::DH_UNKNOWN_KEY);
                prop_assert!(e.message().contains(&format!("{key:?}")) && e.message().contains("known keys"), "{}", e);
            }
            (Some(true), Ok(())) => {}
            (Some(false), Err(e)) => {
                prop_assert_eq!(e.code(), dh_result::DH_INVALID_PARAMETER);
                prop_assert!(e.message().contains(&format!("configuration key {key:?}")), "{}", e);
            }
            (want, got) => prop_assert!(false, "{:?} = {:?}: expected accepted {:?}, got {:?}", key, value, want, got.map_err(|e| e.to_string())),
        }
        // The configuration stays usable whatever was refused.
        prop_assert!(c.set("global_batch", "8").is_ok());
    }

    /// The same through C, with bytes that need not be UTF-8: never `DH_PANIC`, the same code as
    /// the safe method, and `dh_error_message` says why.
    #[test]
    fn dh_config_set_through_c(
        key in prop_oneof![arb_key().prop_map(String::into_bytes), vec(1u8..=255, 0..12)],
        value in prop_oneof![arb_value().prop_map(String::into_bytes), vec(1u8..=255, 0..40)],
    ) {
        prop_assume!(!key.contains(&0) && !value.contains(&0));
        let (k, v) = (std::str::from_utf8(&key), std::str::from_utf8(&value));
        if let (Ok(k), Ok(v)) = (k, v) {
            prop_assume!(!hits_the_timeout_bug(k, v));
        }
        let c = CConfig::new();
        let code = c.set_bytes(&key, &value);
        prop_assert_ne!(code, dh_result::DH_PANIC, "{}", last_error());
        match (k, v) {
            (Ok(k), Ok(v)) => {
                let want = dh_config::new().unwrap().set(k, v).map_or_else(|e| e.code(), |()| dh_result::DH_OK);
                prop_assert_eq!(code, want);
                if code != dh_result::DH_OK {
                    prop_assert!(last_error().contains(&format!("{k:?}")), "{}", last_error());
                }
            }
            (Err(_), _) => {
                prop_assert_eq!(code, dh_result::DH_INVALID_PARAMETER);
                prop_assert!(last_error().contains("key is not valid UTF-8"), "{}", last_error());
            }
            (Ok(_), Err(_)) => {
                prop_assert_eq!(code, dh_result::DH_INVALID_PARAMETER);
                prop_assert!(last_error().contains("value is not valid UTF-8"), "{}", last_error());
            }
        }
    }
}

/// A TOML value of any type.
fn arb_toml_value() -> impl Strategy<Value = toml::Value> {
    prop_oneof![
        4 => arb_value().prop_map(toml::Value::String),
        2 => any::<i64>().prop_map(toml::Value::Integer),
        1 => prop_oneof![Just(0i64), 1i64..100, -5i64..0].prop_map(toml::Value::Integer),
        2 => prop_oneof![
            any::<f64>(),
            0.0f64..1e3,
            Just(f64::INFINITY),
            Just(f64::NAN),
            Just(-0.0),
            Just(1e19),
        ]
        .prop_map(toml::Value::Float),
        1 => any::<bool>().prop_map(toml::Value::Boolean),
        1 => vec(any::<i64>().prop_map(toml::Value::Integer), 0..3).prop_map(toml::Value::Array),
        1 => Just(toml::Value::Table(toml::Table::from_iter([("a".to_string(), toml::Value::Integer(1))]))),
    ]
}

/// The text `dh_config_from_file` gives `set` for a TOML value (None: not a setting).
fn setting_text(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Reads a configuration file through C: the code, and whether the output was written.
fn from_file(path: &std::path::Path) -> (dh_result, bool) {
    let p = CString::new(path.to_str().unwrap()).unwrap();
    let mut out = std::ptr::null_mut();
    let code = dh_config_from_file(p.as_ptr(), &mut out);
    let written = !out.is_null();
    dh_config_free(out);
    (code, written)
}

/// A valid configuration file's text.
const GOOD_TOML: &str = "data = \"/datasets/tiny\"\npolicy = \"helix\"\nglobal_batch = 16\nworkers = 4\n\
    seed = 7\nsteps = 100\nwarmup = 2\nlookahead = 2\nbudget_mib = 512\ncpu_budget = false\ncores = 2.5\n\
    job = \"run-1\"\ncheck_plan = true\nsplit_above_s = 0.5\nmax_frames = 16\nmax_pixels = 200704\n\
    collective_timeout_s = 30\ndecode_timeout_s = 60.0\nmax_skip_rate = 0.01\n";

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A TOML file of any keys and values: never `DH_PANIC`; accepted exactly when every setting
    /// is (as `dh_config_set` would take its text); refused with the code of one of the bad
    /// settings (`DH_PARSE` for an array or table), naming the file; nothing written then.
    #[test]
    fn config_file_of_any_settings(pairs in vec((arb_key(), arb_toml_value()), 0..6)) {
        let table: toml::Table = pairs.iter().cloned().collect();
        let texts: Vec<(String, Option<String>)> = table.iter().map(|(k, v)| (k.clone(), setting_text(v))).collect();
        for (k, t) in &texts {
            prop_assume!(t.as_ref().is_none_or(|t| !hits_the_timeout_bug(k, t)));
        }
        let want: Vec<dh_result> = texts
            .iter()
            .filter_map(|(k, t)| match t {
                None => Some(dh_result::DH_PARSE),
                Some(t) => dh_config::new().unwrap().set(k, t).err().map(|e| e.code()),
            })
            .collect();
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("dh.toml");
        std::fs::write(&path, table.to_string()).unwrap();
        let (code, written) = from_file(&path);
        prop_assert_ne!(code, dh_result::DH_PANIC, "{}", last_error());
        if want.is_empty() {
            prop_assert_eq!(code, dh_result::DH_OK, "{}\n{}", last_error(), table.to_string());
            prop_assert!(written);
        } else {
            prop_assert!(want.contains(&code), "{:?} not one of {:?}: {}", code, want, last_error());
            prop_assert!(!written, "the output is written only on success");
            prop_assert!(last_error().contains(path.to_str().unwrap()), "the message names the file: {}", last_error());
        }
    }

    /// A damaged configuration file (or any bytes): never `DH_PANIC`, one of the documented
    /// codes, the file named.
    #[test]
    fn config_file_damaged_or_random(
        mutations in vec(mutation(), 0..5),
        random in proptest::option::of(vec(any::<u8>(), 0..300)),
    ) {
        let mut bytes = random.unwrap_or_else(|| GOOD_TOML.as_bytes().to_vec());
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("dh.toml");
        std::fs::write(&path, &bytes).unwrap();
        let (code, written) = from_file(&path);
        prop_assert_ne!(code, dh_result::DH_PANIC, "{}", last_error());
        prop_assert_eq!(written, code == dh_result::DH_OK);
        let documented = [
            dh_result::DH_OK,
            dh_result::DH_IO,
            dh_result::DH_PARSE,
            dh_result::DH_UNKNOWN_KEY,
            dh_result::DH_INVALID_PARAMETER,
        ];
        prop_assert!(documented.contains(&code), "{:?}", code);
        if code != dh_result::DH_OK {
            prop_assert!(last_error().contains(path.to_str().unwrap()), "{}", last_error());
        }
        if std::str::from_utf8(&bytes).is_err() {
            prop_assert_eq!(code, dh_result::DH_IO, "a file that is not UTF-8 text");
        }
    }

    /// A loader state round-trips, through `from_json` and the `resume` key alike.
    #[test]
    fn resume_state_round_trips(state in arb_state()) {
        let text = state.to_json();
        prop_assert_eq!(&LoaderState::from_json(&text).unwrap(), &state);
        prop_assert!(dh_config::new().unwrap().set("resume", &text).is_ok());
    }

    /// A damaged state document: refused with one of the documented reasons (the checksum
    /// catches every edit that changes a value), or, when the damage only touched layout, read as
    /// the very state that was written. Through `resume` the message names the key and stays short.
    #[test]
    fn resume_state_damaged(state in arb_state(), mutations in vec(mutation(), 1..5)) {
        let mut bytes = state.to_json().into_bytes();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        match LoaderState::from_json(&text) {
            Ok(back) => prop_assert_eq!(back, state),
            Err(e) => prop_assert!(is_a_state_reason(&e), "{}", e),
        }
        let mut c = dh_config::new().unwrap();
        if let Err(e) = c.set("resume", &text) {
            prop_assert_eq!(e.code(), dh_result::DH_INVALID_PARAMETER);
            prop_assert!(e.message().starts_with("configuration key \"resume\""), "{}", e);
        }
    }

    /// `resume_file` with files holding anything: accepted exactly when the text is a valid
    /// state; otherwise `DH_INVALID_PARAMETER` naming the file.
    #[test]
    fn resume_file_of_any_content(
        state in arb_state(),
        mutations in vec(mutation(), 0..3),
        random in proptest::option::of(vec(any::<u8>(), 0..200)),
    ) {
        let mut bytes = random.unwrap_or_else(|| state.to_json().into_bytes());
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("state.json");
        std::fs::write(&path, &bytes).unwrap();
        let valid = std::str::from_utf8(&bytes).ok().is_some_and(|t| LoaderState::from_json(t).is_ok());
        let r = dh_config::new().unwrap().set("resume_file", path.to_str().unwrap());
        match r {
            Ok(()) => prop_assert!(valid),
            Err(e) => {
                prop_assert!(!valid, "{}", e);
                prop_assert_eq!(e.code(), dh_result::DH_INVALID_PARAMETER);
                prop_assert!(e.message().contains(path.to_str().unwrap()), "{}", e);
            }
        }
    }
}

/// NULL arguments, paths that are not files, and files that are not text.
#[test]
fn null_and_unreadable_arguments_are_errors() {
    let c = CConfig::new();
    let k = CString::new("seed").unwrap();
    let v = CString::new("1").unwrap();
    assert_eq!(dh_config_set(std::ptr::null_mut(), k.as_ptr(), v.as_ptr()), dh_result::DH_NULL_PARAMETER);
    assert_eq!(dh_config_set(c.0, std::ptr::null(), v.as_ptr()), dh_result::DH_NULL_PARAMETER);
    assert_eq!(dh_config_set(c.0, k.as_ptr(), std::ptr::null()), dh_result::DH_NULL_PARAMETER);
    assert!(last_error().contains("value is NULL"), "{}", last_error());
    let mut out = std::ptr::null_mut();
    assert_eq!(dh_config_from_file(std::ptr::null(), &mut out), dh_result::DH_NULL_PARAMETER);
    let p = CString::new("/nonexistent/dh.toml").unwrap();
    assert_eq!(dh_config_from_file(p.as_ptr(), std::ptr::null_mut()), dh_result::DH_NULL_PARAMETER);
    assert_eq!(dh_config_from_file(p.as_ptr(), &mut out), dh_result::DH_IO);
    assert!(last_error().contains("/nonexistent/dh.toml"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = CString::new(tmp.path().to_str().unwrap()).unwrap();
    assert_eq!(dh_config_from_file(dir.as_ptr(), &mut out), dh_result::DH_IO, "a directory");
    let bad = CString::new(b"/tmp/\xff.toml".to_vec()).unwrap();
    assert_eq!(dh_config_from_file(bad.as_ptr(), &mut out), dh_result::DH_INVALID_PARAMETER);
    assert!(out.is_null());
    let mut cfg = dh_config::new().unwrap();
    for path in ["", "/nonexistent/state.json", tmp.path().to_str().unwrap()] {
        let e = cfg.set("resume_file", path).unwrap_err();
        assert_eq!(e.code(), dh_result::DH_INVALID_PARAMETER, "{path:?}: {e}");
    }
}

/// A huge `resume` document that is not a state is cut in the error message, not echoed whole
/// (`abbreviated` in src/ffi/config.rs).
#[test]
fn a_huge_resume_document_gives_a_short_message() {
    let mut c = dh_config::new().unwrap();
    let state = LoaderState::new(
        1,
        2,
        "helix",
        4,
        DatasetId { samples: 10, manifest_sha256: "0".repeat(64), index_sha256: "1".repeat(64), mix: None },
    );
    let padded = state.to_json().replacen('{', &format!("{{{}", " ".repeat(1 << 20)), 1);
    for doc in ["x".repeat(1 << 20), "{".repeat(1 << 20), padded[..padded.len() - 2].to_string()] {
        let e = c.set("resume", &doc).unwrap_err();
        assert!(e.message().len() < 4096, "a {}-byte message", e.message().len());
    }
}

/// Fixed with this test (low severity: the caller's own value, but `dh_error_message` callers size buffers for a
/// sentence): a refused value is quoted whole in the error. For plain keys `invalid()`
/// (src/ffi/config.rs) formats `{value:?}` uncut, and `Policy::from_str` quotes it again; for
/// `resume`, the value is cut but serde's messages from `LoaderState::from_json`
/// (src/exec/state.rs: "not a valid loader state: {e}") quote a hostile document's strings or
/// keys whole. Minimal inputs: `dh_config_set("workers", "9" × 2^20)` gives a message of
/// 1 048 642 bytes; a state document whose `"seed"` is a 1 MiB string likewise.
#[test]
fn a_huge_value_gives_a_short_message() {
    let mut c = dh_config::new().unwrap();
    let mut long = Vec::new();
    let huge = "9".repeat(1 << 20);
    for key in ["workers", "cores", "policy", "cpu_budget", "max_frames"] {
        let n = c.set(key, &huge).unwrap_err().message().len();
        if n >= 4096 {
            long.push(format!("{key}: {n} bytes"));
        }
    }
    let state = LoaderState::new(
        1,
        2,
        "helix",
        4,
        DatasetId { samples: 10, manifest_sha256: "0".repeat(64), index_sha256: "1".repeat(64), mix: None },
    );
    let text = state.to_json();
    let huge = "A".repeat(1 << 20);
    let wrong_type = text.replace("\"seed\": 1", &format!("\"seed\": \"{huge}\""));
    let unknown_key = text.replacen('{', &format!("{{\"{huge}\": 1,"), 1);
    for (what, doc) in [("a string seed", wrong_type), ("an unknown key", unknown_key)] {
        let n = LoaderState::from_json(&doc).unwrap_err().len();
        let through_c = c.set("resume", &doc).unwrap_err().message().len();
        if n >= 4096 || through_c >= 4096 {
            long.push(format!("resume with {what}: {n} bytes ({through_c} through dh_config_set)"));
        }
    }
    assert!(long.is_empty(), "messages of a megabyte: {long:#?}");
}

/// Fixed with this test: `collective_timeout_s` checks that the seconds are finite and positive, then calls
/// `Duration::from_secs_f64` (src/ffi/config.rs, `set`, key "collective_timeout_s"), which
/// panics for 2^64 seconds or more ("cannot convert float seconds to Duration: value is either
/// too big or NaN"). Through C the panic boundary turns it into `DH_PANIC`; through the safe
/// method (the Python binding) it unwinds into the caller. Minimal input: "1.8446744073709552e19".
#[test]
fn collective_timeout_s_past_durations_range_is_an_error() {
    let c = CConfig::new();
    for value in ["1.8446744073709552e19", "1e20", "1e308"] {
        let code = c.set_bytes(b"collective_timeout_s", value.as_bytes());
        assert_eq!(code, dh_result::DH_INVALID_PARAMETER, "{value}: {}", last_error());
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("dh.toml");
    std::fs::write(&path, "collective_timeout_s = 1e20\n").unwrap();
    assert_eq!(from_file(&path).0, dh_result::DH_INVALID_PARAMETER, "{}", last_error());
    let e = std::panic::catch_unwind(|| dh_config::new().unwrap().set("collective_timeout_s", "1e20").err());
    assert!(matches!(e, Ok(Some(_))), "the safe method panicked");
}

fn train_with_env(var: &str, value: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_datahelix"))
        .args(["train", "--data", "/nonexistent/dataset", "--steps", "2", "--warmup", "0"])
        .env(var, value)
        .env("DATAHELIX_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run datahelix")
}

/// The environment the configuration reads (`comm::Config::from_env`, for `dh_config_new` and
/// the CLI alike): malformed values are a usage error naming the variable, before MPI starts.
#[test]
fn malformed_environment_is_a_usage_error() {
    for (var, value) in [
        ("DATAHELIX_COLLECTIVE_TIMEOUT", "nan"),
        ("DATAHELIX_COLLECTIVE_TIMEOUT", "inf"),
        ("DATAHELIX_COLLECTIVE_TIMEOUT", "-1"),
        ("DATAHELIX_COLLECTIVE_TIMEOUT", "0"),
        ("DATAHELIX_COLLECTIVE_TIMEOUT", "ten"),
        ("DATAHELIX_COLLECTIVE_TIMEOUT", ""),
        ("DATAHELIX_MPI_MAX_MESSAGE", "0"),
        ("DATAHELIX_MPI_MAX_MESSAGE", "-1"),
        ("DATAHELIX_MPI_MAX_MESSAGE", "2147483648"),
        ("DATAHELIX_MPI_MAX_MESSAGE", "18446744073709551616"),
    ] {
        let o = train_with_env(var, value);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{var}={value:?}: {err}");
        assert!(err.contains(var) && !err.contains("panicked"), "{var}={value:?}: {err}");
    }
}

/// Fixed with this test: the same unchecked conversion in `comm::Config::from_env` (src/comm/mod.rs, the
/// `DATAHELIX_COLLECTIVE_TIMEOUT` branch: `Duration::from_secs_f64(secs)` after only a
/// finite-and-positive check): `DATAHELIX_COLLECTIVE_TIMEOUT=1e20` panics `datahelix train`
/// (exit 101) instead of a usage error, and makes `dh_config_new` return `DH_PANIC`.
#[test]
fn collective_timeout_env_past_durations_range_is_a_usage_error() {
    let o = train_with_env("DATAHELIX_COLLECTIVE_TIMEOUT", "1e20");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("DATAHELIX_COLLECTIVE_TIMEOUT") && !err.contains("panicked"), "{err}");
}
