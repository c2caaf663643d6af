//! Fuzz-style robustness: real files truncated and with flipped bytes, decoded by the pool (by
//! scan and by seek) and probed. No crash (FFmpeg asserts would abort this process), no hang (a deadline on the whole run),
//! exactly one outcome per sample, and an error for every file cut well before its end.

mod decode_support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use datahelix::decode::pool::{Job, Pool, PoolConfig};
use datahelix::decode::Strategy;
use datahelix::descriptor::Status;
use datahelix::manifest::Entry;
use datahelix::probe::probe;
use decode_support::media_set;

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn truncated_and_bit_flipped_files_never_crash_or_hang() {
    let dir = tempfile::tempdir().unwrap();
    let files = media_set(dir.path());
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let mut rng = 0x5EED_u64;
    // (id, path, must fail)
    let mut cases: Vec<(u64, PathBuf, bool)> = Vec::new();
    for (fi, f) in files.iter().enumerate() {
        let bytes = std::fs::read(f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for (k, keep) in [0.0, 0.1, 0.25, 0.4, 0.6, 0.8, 0.95, 0.999].into_iter().enumerate() {
            let p = bad.join(format!("cut{k}_{name}"));
            std::fs::write(&p, &bytes[..(bytes.len() as f64 * keep) as usize]).unwrap();
            cases.push(((fi * 1000 + k) as u64, p, keep <= 0.4));
        }
        for v in 0..24 {
            let mut b = bytes.clone();
            let flips = 1 + splitmix(&mut rng) % 64;
            for _ in 0..flips {
                let at = (splitmix(&mut rng) % b.len() as u64) as usize;
                b[at] ^= 1 << (splitmix(&mut rng) % 8);
            }
            let p = bad.join(format!("flip{v}_{name}"));
            std::fs::write(&p, &b).unwrap();
            cases.push(((fi * 1000 + 100 + v) as u64, p, false));
        }
    }
    // Each file decoded twice: by scan, and by seek (which first has Matroska read its cues),
    // and probed as `datahelix index` does (which seeks in Matroska too).
    let n = 2 * cases.len();
    let mut jobs: Vec<Job> = cases.iter().map(|(id, p, _)| Job::sampled(*id, p.clone(), *id)).collect();
    jobs.extend(cases.iter().map(|(id, p, _)| Job {
        strategy: Some(Strategy::Seek),
        ..Job::sampled(id + SEEK_IDS, p.clone(), *id)
    }));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let pool = Pool::new(PoolConfig { workers: 2, ..PoolConfig::default() });
        for j in jobs {
            pool.submit(j);
        }
        while let Some(o) = pool.recv() {
            let _ = tx.send((o.id, o.result.map(|_| ()).map_err(|e| e.to_string())));
        }
    });
    let (probe_tx, probe_rx) = std::sync::mpsc::channel();
    let to_probe: Vec<(u64, PathBuf)> = cases.iter().map(|(id, p, _)| (*id, p.clone())).collect();
    std::thread::spawn(move || {
        for (id, path) in to_probe {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let entry = Entry { id, path: name, text_tokens: 0, line: 1, extra: None };
            let _ = probe_tx.send((id, probe(path.parent().unwrap(), &entry).status));
        }
    });
    let mut seen: BTreeMap<u64, Result<(), String>> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while seen.len() < n {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (id, r) =
            rx.recv_timeout(left).unwrap_or_else(|_| panic!("hang: {} of {n} outcomes", seen.len()));
        assert!(seen.insert(id, r).is_none(), "two outcomes for {id}");
    }
    let mut statuses: BTreeMap<u64, Status> = BTreeMap::new();
    while statuses.len() < cases.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let (id, status) = probe_rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("probe hang: {} of {} files", statuses.len(), cases.len()));
        statuses.insert(id, status);
    }
    let mut errors = 0;
    for (id, path, must_fail) in &cases {
        for id in [*id, id + SEEK_IDS] {
            let r = &seen[&id];
            if let Err(e) = r {
                errors += 1;
                assert!(
                    e.contains(&id.to_string()) && e.contains(&*path.file_name().unwrap().to_string_lossy()),
                    "{e}"
                );
            }
            if *must_fail {
                assert!(r.is_err(), "{}: decoded without error", path.display());
            }
        }
    }
    let usable = statuses.values().filter(|s| **s == Status::Ok).count();
    eprintln!(
        "{n} decodes of {} damaged files: {errors} errors, {} decoded; probed {usable} usable",
        cases.len(),
        n - errors
    );
}

/// Added to a case's id for its decode by seek.
const SEEK_IDS: u64 = 1 << 40;
