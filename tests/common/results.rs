//! What the tests read from `datahelix train`'s result: the global batches delivered, the
//! bytes of each step.

use std::collections::BTreeMap;

use datahelix::sampler::Sampler;
use serde_json::Value;

/// Every global batch's ids appear exactly once over the ranks, delivered or skipped.
pub fn assert_exactly_once(result: &Value, manifest_ids: &[u64]) -> BTreeMap<u64, Vec<u64>> {
    let p = &result["params"];
    let (seed, g, steps) = (
        p["seed"].as_u64().unwrap(),
        p["global_batch"].as_u64().unwrap() as usize,
        p["steps"].as_u64().unwrap(),
    );
    let sampler = Sampler::new(manifest_ids, seed);
    let mut skipped = BTreeMap::new();
    for step in 0..steps {
        let mut want = sampler.global_batch(step, g);
        want.sort_unstable();
        let mut got = Vec::new();
        for r in result["records"].as_array().unwrap().iter().filter(|r| r["step"] == step) {
            got.extend(r["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()));
            let sk: Vec<u64> = r["skipped"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            skipped.entry(step).or_insert_with(Vec::new).extend(sk.iter().copied());
            got.extend(sk);
        }
        got.sort_unstable();
        assert_eq!(got, want, "{}: step {step}", p["policy"]);
    }
    skipped
}

/// Per step, the wrapping sum over ranks of the delivered tensors' checksums (independent of
/// which rank trains which sample).
pub fn step_checksums(result: &Value) -> BTreeMap<u64, u64> {
    let mut sums = BTreeMap::new();
    for r in result["records"].as_array().unwrap() {
        let c = r["tensor_checksum"].as_u64().expect("run with --checksums");
        let e = sums.entry(r["step"].as_u64().unwrap()).or_insert(0u64);
        *e = e.wrapping_add(c);
    }
    sums
}
