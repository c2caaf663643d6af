//! Two data-parallel groups in one job, each with its own loader on its own communicator: the
//! job splits `MPI_COMM_WORLD` (even and odd ranks, as a tensor-parallel layout leaves one
//! data-parallel group per position) and hands each group's communicator to
//! `MpiWorld::with_comm`. Group g samples with seed 10 + g. Between loader calls the job runs
//! collectives of its own on the whole world.
//!
//! ```text
//! mpirun -np 4 target/debug/examples/split_loaders DATA POLICY STEPS GLOBAL_BATCH
//! ```
//!
//! Prints `ids GROUP STEP GROUP_RANK id,… skipped id,…` per rank and step, then `ok RANK`.

use datahelix::comm::mpi::{CallerComm, MpiWorld};
use datahelix::comm::{Config, World};
use datahelix::exec::loader::{Loader, LoaderConfig};
use datahelix::policy::Policy;
use mpi::topology::Color;
use mpi::traits::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: split_loaders DATA POLICY STEPS GLOBAL_BATCH");
        std::process::exit(2);
    }
    let policy: Policy = args[2].parse()?;
    let steps: u64 = args[3].parse()?;
    let global_batch: usize = args[4].parse()?;

    let universe = mpi::initialize().ok_or("MPI was initialised already")?;
    let world = universe.world();
    let group = world.rank() % 2;
    let dp = world.split_by_color(Color::with_value(group)).ok_or("MPI_Comm_split gave no communicator")?;
    let dp_world = MpiWorld::with_comm(Config::from_env()?, &CallerComm::of_rsmpi(&dp))?;
    let mut cfg = LoaderConfig::new(args[1].clone().into());
    cfg.policy = policy;
    cfg.global_batch = global_batch;
    cfg.workers = 2;
    cfg.steps = steps;
    cfg.seed = 10 + group as u64;
    let mut loader = Loader::new(World::Mpi(dp_world), cfg)?;
    let dp_rank = loader.world().rank();
    for step in 0..steps {
        let batch = loader.next_batch()?;
        assert_eq!(batch.step, step, "steps in order");
        let list =
            |ids: &mut dyn Iterator<Item = u64>| ids.map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        println!(
            "ids {group} {} {dp_rank} {} skipped {}",
            batch.step,
            list(&mut batch.samples.iter().map(|s| s.id)),
            list(&mut batch.skipped.iter().copied())
        );
        // The job's own collective across both groups.
        let held = (batch.samples.len() + batch.skipped.len()) as u64;
        let mut total = 0u64;
        world.all_reduce_into(&held, &mut total, mpi::collective::SystemOperation::sum());
        assert_eq!(total as usize, 2 * global_batch, "both groups' batches are whole");
        loader.prepare_ahead()?;
        loader.ship_ahead(std::time::Instant::now())?;
        loader.report_step(0.02)?;
        world.barrier();
    }
    drop(loader);
    // The group communicator is still the job's to use.
    dp.barrier();
    println!("ok {}", world.rank());
    Ok(())
}
