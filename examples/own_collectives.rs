//! A training loop that owns MPI and runs its own blocking collectives between every pair of
//! loader calls — as a real training step does (a loss all-reduce, a metrics gather, a blocking
//! `.item()`) — and checks on every rank that each global batch arrived exactly once.
//!
//! ```text
//! mpirun -np 4 target/debug/examples/own_collectives DATA POLICY STEPS GLOBAL_BATCH WORKERS [DELAY_SEED] [SPLIT_ABOVE_S]
//! ```
//!
//! With `DELAY_SEED`, every rank sleeps a random 0–40 ms before each loader call (a different
//! draw per rank, step and call). Prints `ok RANK STEPS` on success; exits non-zero otherwise.
//!
//! With `OWN_SETUP=prepare:MS` (or `plain:MS`) in the environment, the job spends MS
//! milliseconds setting up (as a model load would) between opening the loader and its first
//! batch, having called `prepare_ahead` first (or not), and prints `first RANK DONE OWN`: of the
//! OWN decodes of step 0 on this rank, DONE had finished before the first `next_batch`.

use std::time::Duration;

use datahelix::comm::{self, Config};
use datahelix::exec::loader::{Loader, LoaderConfig};
use datahelix::policy::Policy;
use datahelix::sampler::{splitmix64, Sampler};
use mpi::collective::SystemOperation;
use mpi::traits::*;

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| {
        eprintln!(
            "usage: own_collectives DATA POLICY STEPS GLOBAL_BATCH WORKERS [DELAY_SEED] [SPLIT_ABOVE_S] ({what})"
        );
        std::process::exit(2)
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let data: String = arg(&args, 1, "DATA");
    let policy: Policy = args.get(2).map_or(Ok(Policy::Helix), |p| p.parse()).map_err(|e: String| e)?;
    let steps: u64 = arg(&args, 3, "STEPS");
    let global_batch: usize = arg(&args, 4, "GLOBAL_BATCH");
    let workers: usize = arg(&args, 5, "WORKERS");
    let delay_seed: Option<u64> = args.get(6).and_then(|a| a.parse().ok());
    let split_above: Option<f64> = args.get(7).and_then(|a| a.parse().ok());

    // The training job initialises MPI and keeps its own communicator; the loader duplicates
    // MPI_COMM_WORLD for itself.
    let universe = mpi::initialize().ok_or("MPI was initialised already")?;
    let mine = universe.world();
    let (rank, ranks) = (mine.rank() as usize, mine.size() as usize);
    let world = comm::init(Config::from_env()?)?;
    let mut cfg = LoaderConfig::new(data.into());
    cfg.policy = policy;
    cfg.global_batch = global_batch;
    cfg.workers = workers;
    cfg.steps = steps;
    cfg.seed = 5;
    cfg.check_plan = true;
    cfg.split_above_s = split_above;
    let setup: Option<(bool, u64)> = match std::env::var("OWN_SETUP") {
        Err(_) => None,
        Ok(v) => match v.split_once(':').map(|(mode, ms)| (mode, ms.parse::<u64>())) {
            Some(("prepare", Ok(ms))) => Some((true, ms)),
            Some(("plain", Ok(ms))) => Some((false, ms)),
            _ => return Err(format!("OWN_SETUP={v:?}: expected prepare:MS or plain:MS").into()),
        },
    };
    cfg.trace = setup.is_some();
    let mut loader = Loader::new(world, cfg)?;
    if let Some((prepare, ms)) = setup {
        if prepare {
            loader.prepare_ahead()?;
        }
        std::thread::sleep(Duration::from_millis(ms));
    }
    let index = datahelix::index::Index::open(&loader.config().data)?;
    let ids: Vec<u64> = index.iter().filter_map(Result::ok).map(|d| d.id).collect();
    let sampler = Sampler::new(&ids, 5);

    let mut draw = 0u64;
    let mut pause = |step: u64| {
        if let Some(seed) = delay_seed {
            draw += 1;
            let r = splitmix64(seed ^ splitmix64(rank as u64 ^ splitmix64(step ^ (draw << 20))));
            std::thread::sleep(Duration::from_micros(r % 40_000));
        }
    };
    for step in 0..steps {
        pause(step);
        let batch = loader.next_batch()?;
        if batch.step != step {
            return Err(format!("rank {rank}: expected step {step}, got {}", batch.step).into());
        }
        if step == 0 && setup.is_some() {
            let (done, own) = decodes_before_first_batch(loader.spans());
            println!("first {rank} {done} {own}");
        }
        // The caller's own collective: how many samples each rank holds (an all-gather).
        let held = (batch.samples.len() + batch.skipped.len()) as u64;
        let mut counts = vec![0u64; ranks];
        mine.all_gather_into(&held, &mut counts[..]);
        pause(step);
        loader.prepare_ahead()?;
        // Every id of the step, on every rank, from the caller's own all-gather-v.
        let mine_ids: Vec<u64> =
            batch.samples.iter().map(|s| s.id).chain(batch.skipped.iter().copied()).collect();
        let counts_i: Vec<i32> = counts.iter().map(|&c| c as i32).collect();
        let displs: Vec<i32> =
            counts_i.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
        let mut all = vec![0u64; counts.iter().sum::<u64>() as usize];
        {
            let mut part = mpi::datatype::PartitionMut::new(&mut all[..], &counts_i[..], &displs[..]);
            mine.all_gather_varcount_into(&mine_ids[..], &mut part);
        }
        all.sort_unstable();
        let mut want = sampler.global_batch(step, global_batch);
        want.sort_unstable();
        if all != want {
            return Err(
                format!("rank {rank}, step {step}: delivered {all:?}, the global batch is {want:?}").into()
            );
        }
        // The accelerator's step; the loader ships near its end; a loss all-reduce in between.
        let accel_s = 0.05 + 2e-6 * batch.samples.iter().map(|s| s.tokens).sum::<u64>() as f64;
        std::thread::sleep(Duration::from_secs_f64(accel_s * 0.5));
        let mut loss = 0.0f64;
        mine.all_reduce_into(&accel_s, &mut loss, SystemOperation::sum());
        pause(step);
        let end = std::time::Instant::now() + Duration::from_secs_f64(accel_s * 0.5);
        loader.ship_ahead(end)?;
        mine.barrier();
        std::thread::sleep(end.saturating_duration_since(std::time::Instant::now()));
        pause(step);
        loader.report_step(accel_s)?;
        let mut grad = 0.0f64;
        mine.all_reduce_into(&accel_s, &mut grad, SystemOperation::sum());
    }
    let (issued, _) = loader.schedule();
    println!("ok {rank} {steps} collectives {issued} bytes_in {}", loader.counters().bytes_in);
    drop(loader);
    Ok(())
}

/// Of this rank's decodes of step 0 (trace spans `decode … (step 0, …`), how many had ended
/// when the first batch was asked for (the start of the span `input step 0`), and how many there
/// are.
fn decodes_before_first_batch(spans: &[datahelix::metrics::Span]) -> (usize, usize) {
    let asked = spans.iter().find(|s| s.name == "input step 0").map_or(f64::INFINITY, |s| s.start_s);
    let own: Vec<f64> = spans
        .iter()
        .filter(|s| s.cat == "decode" && s.name.contains("(step 0,"))
        .map(|s| s.start_s + s.dur_s)
        .collect();
    (own.iter().filter(|&&end| end <= asked).count(), own.len())
}
