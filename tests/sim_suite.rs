//! The simulator's suite in reduced form (few steps): every workload under every policy delivers
//! each sample of each global batch exactly once (or reports it skipped) — also with every round
//! agreed on (`check_plan`: the ranks' plans and collective schedules compared) — and the same
//! seed gives the same numbers.

use std::collections::BTreeMap;
use std::path::Path;

use datahelix::policy::Policy;
use datahelix::sampler::Sampler;
use datahelix::sim::{self, Overrides};

fn reduced() -> Overrides {
    Overrides { steps: Some(6), ..Overrides::default() }
}

#[test]
fn every_workload_and_policy_delivers_exactly_once() {
    let files = sim::suite_files(Path::new("scripts/workloads")).unwrap();
    assert_eq!(files.len(), 11, "the suite ships 11 workloads");
    for file in files {
        let (w, cal) = sim::load(&file).unwrap();
        for check_plan in [false, true] {
            for policy in Policy::ALL {
                let (mut cfg, data) = sim::prepare(&w, &cal, policy, &reduced()).unwrap();
                cfg.check_plan = check_plan;
                let run = sim::simulate(&cfg, &data).unwrap();
                let ids: Vec<u64> = data.descriptors().iter().map(|d| d.id).collect();
                let sampler = Sampler::new(&ids, cfg.seed);
                for s in 0..cfg.steps {
                    let mut want: Vec<u64> = sampler.global_batch(s, cfg.global_batch);
                    want.sort_unstable();
                    let mut got: Vec<u64> = run
                        .records
                        .iter()
                        .filter(|r| r.step == s)
                        .flat_map(|r| r.ids.iter().chain(&r.skipped).copied())
                        .collect();
                    got.sort_unstable();
                    assert_eq!(got, want, "{} {policy} check_plan {check_plan} step {s}", w.name);
                }
                let waits_ok = run.records.iter().all(|r| r.input_wait_s >= -1e-9 && r.end_s >= r.start_s);
                assert!(waits_ok, "{} {policy}: negative wait or step", w.name);
                assert!(run.summary.throughput > 0.0, "{} {policy}", w.name);
            }
        }
    }
}

#[test]
fn same_seed_same_numbers_other_seed_other_numbers() {
    let (w, cal) = sim::load(Path::new("scripts/workloads/llava_video_178k.toml")).unwrap();
    let mut seen = BTreeMap::new();
    for policy in [Policy::RankLocal, Policy::Helix] {
        let a = sim::run_workload(&w, &cal, policy, &reduced()).unwrap();
        let b = sim::run_workload(&w, &cal, policy, &reduced()).unwrap();
        assert_eq!(a.records, b.records, "{policy}");
        assert_eq!(a.summary, b.summary, "{policy}");
        let c = sim::run_workload(&w, &cal, policy, &Overrides { seed: Some(99), ..reduced() }).unwrap();
        assert_ne!(a.records, c.records, "{policy}: the seed must matter");
        seen.insert(policy, a.summary.throughput);
    }
    assert_eq!(seen.len(), 2);
}

#[test]
fn more_ranks_scale_the_batch() {
    let (w, cal) = sim::load(Path::new("scripts/workloads/webvid10m_short.toml")).unwrap();
    let over = Overrides { ranks: Some(32), steps: Some(4), ..Overrides::default() };
    let (cfg, data) = sim::prepare(&w, &cal, Policy::Helix, &over).unwrap();
    assert_eq!(cfg.ranks(), 32);
    assert_eq!(cfg.global_batch, w.run.global_batch * 4);
    let run = sim::simulate(&cfg, &data).unwrap();
    assert_eq!(run.records.len(), 32 * 4);
}

#[test]
fn the_cpu_budget_is_the_named_share_of_the_accelerator() {
    let (w, cal) = sim::load(Path::new("scripts/workloads/kinetics700_10s.toml")).unwrap();
    assert_eq!(w.run.cpu_per_accel, Some(0.75), "the suite's budget");
    let mut cores = Vec::new();
    for share in [0.5, 1.0] {
        let over = Overrides { steps: Some(40), cpu_per_accel: Some(share), ..Overrides::default() };
        let (cfg, data) = sim::prepare(&w, &cal, Policy::Helix, &over).unwrap();
        let run = sim::simulate(&cfg, &data).unwrap();
        let measured = run.summary.cpu_bound_s / run.summary.accel_bound_s;
        assert!((measured / share - 1.0).abs() < 0.25, "share {share}: measured {measured}");
        assert!(cfg.workers.iter().zip(&cfg.cores).all(|(&w, &c)| w as f64 >= c), "a worker per core");
        cores.push(cfg.cores[0]);
    }
    assert!((cores[0] / cores[1] - 2.0).abs() < 1e-9, "half the share, twice the cores: {cores:?}");
}
