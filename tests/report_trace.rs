//! The Chrome trace file of a run (`datahelix train --trace`): valid JSON, one process per rank,
//! named threads, complete events in microseconds.

use std::collections::{BTreeMap, BTreeSet};

use datahelix::metrics::trace::{write_trace, RankMeta};
use datahelix::metrics::Span;
use serde_json::Value;

#[test]
fn one_process_per_rank() {
    let ranks = 4u32;
    let mut spans = Vec::new();
    for rank in 0..ranks {
        for step in 0..5u32 {
            let t = f64::from(step) * 0.1;
            let wait = 0.001 * f64::from(rank);
            for (cat, start, dur) in [
                ("plan", t, 0.0005),
                ("wait", t, wait),
                ("compute", t + wait, 0.05),
                ("transfer", t + 0.06, 0.002),
            ] {
                spans.push(Span {
                    rank,
                    thread: 0,
                    cat: cat.into(),
                    name: format!("{cat} step {step}"),
                    start_s: start,
                    dur_s: dur,
                });
            }
            for worker in 1..=2 {
                spans.push(Span {
                    rank,
                    thread: worker,
                    cat: "decode".into(),
                    name: format!("decode {}", step * 100 + rank * 10 + worker),
                    start_s: t,
                    dur_s: 0.03,
                });
            }
        }
    }
    let meta: Vec<RankMeta> = (0..ranks).map(|rank| RankMeta { rank, label: "host-a".into() }).collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    write_trace(&path, &spans, &meta).unwrap();

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let processes: BTreeMap<u64, &str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| (e["pid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(processes.len(), ranks as usize);
    for (pid, name) in &processes {
        assert_eq!(*name, format!("rank {pid} (host-a)"));
    }
    let threads: BTreeSet<(u64, u64, &str)> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap())
        })
        .collect();
    assert_eq!(threads.len(), 3 * ranks as usize);
    assert!(threads.contains(&(2, 0, "train")) && threads.contains(&(3, 2, "decode 2")));

    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), spans.len());
    for e in &complete {
        assert!(e["ts"].as_f64().is_some() && e["dur"].as_f64().is_some(), "{e}");
        assert!(processes.contains_key(&e["pid"].as_u64().unwrap()));
    }
    let cats: BTreeSet<&str> = complete.iter().map(|e| e["cat"].as_str().unwrap()).collect();
    assert_eq!(cats, ["compute", "decode", "plan", "transfer", "wait"].into_iter().collect());
    // Microseconds: rank 3's step-1 compute starts at 0.1 s + 3 ms.
    let c = complete.iter().find(|e| e["pid"] == 3 && e["name"] == "compute step 1").unwrap();
    assert!((c["ts"].as_f64().unwrap() - 103_000.0).abs() < 1e-6);
    assert!((c["dur"].as_f64().unwrap() - 50_000.0).abs() < 1e-6);
}
