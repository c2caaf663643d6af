//! Replica groups: groups of 2 consecutive ranks (a tensor-parallel pair) train on identical
//! batches; only each group's rank 0 decodes, on the data-parallel world of the leaders.
//!
//! ```text
//! mpirun -np 4 target/debug/examples/replicas DATA POLICY STEPS GLOBAL_BATCH
//! ```
//!
//! Prints `batch STEP RANK GROUP LEADS HASH ids…` per rank and step (HASH covers every id, shape
//! and tensor byte) and `wait STEP RANK SECONDS` (the batch's input wait), then `ok RANK`. At
//! step 1 the leaders sleep 0.3 s before asking for the batch: their followers wait for it.

use datahelix::comm::{self, Config, World};
use datahelix::exec::loader::LoaderConfig;
use datahelix::exec::replica::ReplicaLoader;
use datahelix::plan::Fnv;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: replicas DATA POLICY STEPS GLOBAL_BATCH");
        std::process::exit(2);
    }
    let World::Mpi(world) = comm::init(Config::from_env()?)? else {
        return Err("run under mpirun".into());
    };
    let rank = datahelix::collective::Collective::rank(&world);
    let (dp, group) = ReplicaLoader::split_world(&world, 2)?;
    let mut cfg = LoaderConfig::new(args[1].clone().into());
    cfg.policy = args[2].parse()?;
    cfg.steps = args[3].parse()?;
    cfg.global_batch = args[4].parse()?;
    cfg.workers = 2;
    cfg.seed = 3;
    let mut loader = ReplicaLoader::new(dp.map(World::Mpi), World::Mpi(group), cfg)?;
    let steps: u64 = args[3].parse()?;
    for step in 0..steps {
        if step == 1 && loader.leads() {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let batch = loader.next_batch()?;
        println!("wait {step} {rank} {:.6}", batch.input_wait_s);
        assert_eq!(batch.step, step);
        let mut h = Fnv::default();
        for s in &batch.samples {
            h.u64(s.id);
            for d in s.shape {
                h.u64(d as u64);
            }
            h.bytes(&s.data);
            h.bytes(s.meta.as_bytes());
            for t in &s.timestamps_s {
                h.u64(t.to_bits());
            }
            assert_eq!(s.timestamps_s.len(), s.shape[0], "sample {}: one time per frame", s.id);
            println!("meta {step} {rank} {} {}", s.id, s.meta);
        }
        for id in &batch.skipped {
            h.u64(*id);
        }
        let ids: Vec<String> = batch
            .samples
            .iter()
            .map(|s| s.id)
            .chain(batch.skipped.iter().copied())
            .map(|i| i.to_string())
            .collect();
        println!("batch {step} {rank} {} {} {:016x} {}", rank / 2, loader.leads(), h.finish(), ids.join(","));
        loader.prepare_ahead()?;
        loader.ship_ahead(std::time::Instant::now())?;
        loader.report_step(0.02)?;
    }
    drop(loader);
    println!("ok {rank}");
    Ok(())
}
