//! The worker pool: earliest-deadline-first order with a deterministic tie-break, a byte budget
//! that makes decoding wait for buffers and rejects a sample larger than the whole budget,
//! changed and missing files as per-sample errors.

mod decode_support;

use std::path::PathBuf;
use std::time::Duration;

use datahelix::decode::pool::{Failure, Job, Pool, PoolConfig};
use datahelix::descriptor::Descriptor;
use decode_support::make_clip;

fn clips(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    (
        make_clip(&dir.join("a.mp4"), "320x240", 24, 2.0, &["-c:v", "libx264"]),
        make_clip(&dir.join("b.mkv"), "176x144", 25, 1.0, &["-c:v", "mpeg4"]),
    )
}

#[test]
fn jobs_run_earliest_deadline_first_with_id_tie_break() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = clips(dir.path());
    let pool = Pool::new_paused(PoolConfig { workers: 1, ..PoolConfig::default() });
    let jobs = [(10u64, 5u64), (11, 1), (3, 3), (2, 1), (1, 9), (7, 3)];
    for (i, &(id, deadline)) in jobs.iter().enumerate() {
        let p = if i % 2 == 0 { a.clone() } else { b.clone() };
        pool.submit(Job::sampled(id, p, deadline));
    }
    pool.resume();
    let mut order = Vec::new();
    while let Some(o) = pool.recv() {
        assert!(o.result.is_ok(), "{:?}", o.result.err().map(|e| e.to_string()));
        order.push((o.deadline, o.id));
    }
    assert_eq!(order, vec![(1, 2), (1, 11), (3, 3), (3, 7), (5, 10), (9, 1)]);
}

#[test]
fn the_byte_budget_bounds_memory_and_rejects_oversized_samples() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = clips(dir.path());
    // a.mp4: 4 frames of 224×308×3, and FFmpeg's pictures while it decodes.
    let one = 4 * 224 * 308 * 3;
    let working = datahelix::decode::Decoder::open(&a).unwrap().working_bytes();
    let pool = Pool::new(PoolConfig { workers: 2, budget_bytes: one + working, ..PoolConfig::default() });
    for id in 0..3 {
        pool.submit(Job::sampled(id, a.clone(), id));
    }
    let first = pool.recv().unwrap();
    let tensor = match first.result {
        Ok(datahelix::decode::pool::Output::Sampled { tensor, .. }) => tensor,
        other => panic!("{other:?}"),
    };
    assert_eq!(tensor.len(), one);
    // While we hold the only buffer the budget allows, nothing else can finish.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            let o = pool.recv();
            tx.send(o.map(|o| o.result.is_ok())).unwrap();
            let o = pool.recv();
            tx.send(o.map(|o| o.result.is_ok())).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err(), "decoded past the byte budget");
        drop(tensor);
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), Some(true));
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), Some(true));
    });
    // A sample larger than the whole budget is an error for that sample only.
    let small =
        Pool::new(PoolConfig { workers: 1, budget_bytes: one + working - 1, ..PoolConfig::default() });
    small.submit(Job::sampled(42, a.clone(), 0));
    let o = small.recv().unwrap();
    let e = o.result.unwrap_err();
    assert!(matches!(e.reason, Failure::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("42") && e.to_string().contains("a.mp4"), "{e}");
}

#[test]
fn changed_and_missing_files_are_per_sample_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = clips(dir.path());
    let bytes = std::fs::metadata(&a).unwrap().len();
    let pool = Pool::new(PoolConfig { workers: 2, ..PoolConfig::default() });
    let stale = Descriptor { id: 1, bytes: bytes + 1, ..Descriptor::default() };
    pool.submit(Job { descriptor: Some(stale), ..Job::sampled(1, a.clone(), 0) });
    pool.submit(Job::sampled(2, dir.path().join("gone.mp4"), 1));
    pool.submit(Job::sampled(3, b.clone(), 2));
    let mut seen = std::collections::BTreeMap::new();
    while let Some(o) = pool.recv() {
        seen.insert(o.id, o.result.map(|_| ()).map_err(|e| (e.to_string(), e.reason)));
    }
    match &seen[&1] {
        Err((msg, Failure::Changed(_))) => assert!(msg.contains("a.mp4") && msg.contains("changed")),
        other => panic!("{other:?}"),
    }
    match &seen[&2] {
        Err((msg, Failure::Missing(_))) => assert!(msg.contains("gone.mp4") && msg.contains("sample 2")),
        other => panic!("{other:?}"),
    }
    assert!(seen[&3].is_ok());
}
