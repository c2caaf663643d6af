//! What a `dh_loader` and `datahelix train` drive: this rank's [`Loader`], or its part of a
//! replica group (`replica_ranks`: [`ReplicaLoader`], which owns the group's and the leaders'
//! communicators, beside the job's whole world for the caller's collectives, e.g.
//! `dh_loader_all_reduce_sum` or the training loop's gradient sync).

use std::time::Instant;

use crate::collective::Collective;
use crate::comm::World;
use crate::exec::loader::{Accelerator, Batch, Counters, ExecError, Loader, LoaderConfig, WorldRef};
use crate::exec::replica::ReplicaLoader;
use crate::exec::state::LoaderState;
use crate::metrics::Span;
use crate::plan::TransferCost;

pub(crate) enum Driver {
    Plain(Box<Loader<'static>>),
    /// Fields drop in order: the replica loader (its workers, then its communicators) before
    /// the world it was split from.
    Replica {
        replica: Box<ReplicaLoader<'static>>,
        /// Boxed: with the HCCL backend built in, a `World` is hundreds of bytes.
        world: Box<World>,
    },
}

impl Driver {
    /// Opens the loader on `world`, or on its replica groups of `replica_ranks` consecutive
    /// ranks when more than 1 (each group, and the data-parallel world of their leaders, on
    /// `world`'s backend). Collective over `world`.
    pub(crate) fn open(
        world: World,
        cfg: LoaderConfig,
        resume: Option<&LoaderState>,
        replica_ranks: usize,
    ) -> Result<Driver, ExecError> {
        Driver::open_or_give_back(world, cfg, resume, replica_ranks).map_err(|(e, _world)| e)
    }

    /// [`Driver::open`] that hands `world` back where it failed with the world still whole
    /// ([`Loader::open_or_give_back`]): the caller says why before it ends the world, so that
    /// every rank's reason is printed before the first rank out can exit.
    pub(crate) fn open_or_give_back(
        world: World,
        cfg: LoaderConfig,
        resume: Option<&LoaderState>,
        replica_ranks: usize,
    ) -> Result<Driver, (ExecError, Option<Box<World>>)> {
        if replica_ranks <= 1 {
            return Loader::open_or_give_back(world.into(), cfg, resume)
                .map(|loader| Driver::Plain(Box::new(loader)))
                .map_err(|(e, world)| (e, world.and_then(WorldRef::into_owned)));
        }
        let opened = replica_worlds(&world, replica_ranks).and_then(|(dp, group)| match resume {
            Some(state) => ReplicaLoader::resume(dp, group, cfg, state),
            None => ReplicaLoader::new(dp, group, cfg),
        });
        match opened {
            Ok(replica) => Ok(Driver::Replica { replica: Box::new(replica), world: Box::new(world) }),
            Err(e) => Err((e, Some(Box::new(world)))),
        }
    }

    /// The loader that decodes on this rank: `None` on a replica group's other ranks.
    fn own(&self) -> Option<&Loader<'static>> {
        match self {
            Driver::Plain(loader) => Some(loader),
            Driver::Replica { replica, .. } => replica.loader(),
        }
    }

    pub(crate) fn next_batch(&mut self) -> Result<Batch, ExecError> {
        match self {
            Driver::Plain(loader) => loader.next_batch(),
            Driver::Replica { replica, .. } => replica.next_batch(),
        }
    }

    pub(crate) fn prepare_ahead(&mut self) -> Result<(), ExecError> {
        match self {
            Driver::Plain(loader) => loader.prepare_ahead(),
            Driver::Replica { replica, .. } => replica.prepare_ahead(),
        }
    }

    pub(crate) fn ship_ahead(&mut self, step_end: Instant) -> Result<(), ExecError> {
        match self {
            Driver::Plain(loader) => loader.ship_ahead(step_end),
            Driver::Replica { replica, .. } => replica.ship_ahead(step_end),
        }
    }

    pub(crate) fn report_step(&mut self, accel_s: f64) -> Result<(), ExecError> {
        match self {
            Driver::Plain(loader) => loader.report_step(accel_s),
            Driver::Replica { replica, .. } => replica.report_step(accel_s),
        }
    }

    /// The library's step driver ([`Loader::train_step`], [`ReplicaLoader::train_step`]).
    pub(crate) fn train_step(&mut self, accel: &mut dyn Accelerator) -> Result<Batch, ExecError> {
        match self {
            Driver::Plain(loader) => loader.train_step(accel),
            Driver::Replica { replica, .. } => replica.train_step(accel),
        }
    }

    /// Sets the instant the trace and records count from (where this rank decodes).
    pub(crate) fn set_epoch(&mut self, t0: Instant) {
        match self {
            Driver::Plain(loader) => loader.set_epoch(t0),
            Driver::Replica { replica, .. } => replica.set_epoch(t0),
        }
    }

    /// Whether this rank decodes: every rank without replica groups, a group's rank 0 with them.
    pub(crate) fn leads(&self) -> bool {
        self.own().is_some()
    }

    pub(crate) fn finish_step(
        &mut self,
        accel: &mut dyn Accelerator,
        launched: Instant,
    ) -> Result<(), ExecError> {
        match self {
            Driver::Plain(loader) => loader.finish_step(accel, launched),
            Driver::Replica { replica, .. } => replica.finish_step(accel, launched),
        }
    }

    /// With replica groups, [`ReplicaLoader::delivered_bytes`]: the batches' tensor bytes that
    /// reached the group ahead of their batch, and with it.
    pub(crate) fn replica_bytes(&self) -> Option<[u64; 2]> {
        match self {
            Driver::Plain(_) => None,
            Driver::Replica { replica, .. } => Some(replica.delivered_bytes()),
        }
    }

    /// Where the run stands (the same on every rank of a replica group).
    pub(crate) fn state(&self) -> LoaderState {
        match self {
            Driver::Plain(loader) => loader.state(),
            Driver::Replica { replica, .. } => replica.state(),
        }
    }

    /// [`Loader::resumed`] as a result file says it, where this rank decodes.
    pub(crate) fn resumed_json(&self) -> serde_json::Value {
        self.own().map_or(serde_json::Value::Null, |l| l.resumed().to_json())
    }

    /// Every rank of the job (not only the leaders of replica groups).
    pub(crate) fn world(&self) -> &dyn Collective {
        match self {
            Driver::Plain(loader) => loader.world(),
            Driver::Replica { world, .. } => world.collective(),
        }
    }

    /// This rank's rebalance counters (zero where it does not decode).
    pub(crate) fn counters(&self) -> Counters {
        self.own().map(Loader::counters).unwrap_or_default()
    }

    /// Steps planned with late ranks so far (zero where this rank does not decode).
    pub(crate) fn late_steps(&self) -> u64 {
        self.own().map_or(0, Loader::late_steps)
    }

    /// Bytes charged to this rank's decode budget (zero where it does not decode).
    pub(crate) fn charged_bytes(&self) -> usize {
        self.own().map_or(0, Loader::charged_bytes)
    }

    /// [`Loader::cpu_budget`] where this rank decodes.
    pub(crate) fn cpu_budget(&self) -> Option<(&'static str, Option<&str>)> {
        self.own().map(Loader::cpu_budget)
    }

    /// Steps stretched to the CPUs' pace (zero where this rank does not decode).
    pub(crate) fn stretched_steps(&self) -> u64 {
        self.own().map_or(0, Loader::stretched_steps)
    }

    /// The trace spans kept so far (none where this rank does not decode).
    pub(crate) fn spans(&self) -> &[Span] {
        self.own().map_or(&[], Loader::spans)
    }

    /// The transfer model planned with, where this rank decodes.
    pub(crate) fn transfer(&self) -> Option<&TransferCost> {
        self.own().map(Loader::transfer)
    }
}

/// `world` split into this rank's replica group of `size` consecutive ranks and, on the group's
/// first rank, the data-parallel world of the groups' first ranks, on the same backend: MPI
/// communicators split from it, or HCCL communicators of their own (bootstrapped over the
/// split MPI communicators, on this rank's device). Collective over `world`.
fn replica_worlds(world: &World, size: usize) -> Result<(Option<World>, World), ExecError> {
    let Some(mpi) = world.mpi_world() else {
        return Err(ExecError::Invalid(format!(
            "replica groups of {size} ranks need a launcher: start the job with mpirun (or srun), or \
             set replica_ranks to 1"
        )));
    };
    let (dp, group) = ReplicaLoader::split_world(mpi, size)?;
    match world {
        #[cfg(feature = "hccl")]
        World::Hccl(hccl) => {
            let hccl_err = |e| ExecError::Invalid(format!("HCCL replica groups of {size} ranks: {e}"));
            // The leaders first (collective over them), then each group (over its ranks). Every
            // member learns whether its leader's world was made, so that no follower waits in
            // the group's set-up for a leader that gave up.
            let dp = dp.map(|m| hccl.join(m).map(World::Hccl)).transpose();
            let made = group.all_gather_vec(&[u8::from(dp.is_ok())])?;
            let dp = dp.map_err(hccl_err)?;
            if made.contains(&0) {
                return Err(ExecError::Invalid(format!(
                    "HCCL replica groups of {size} ranks: this group's first rank could not join the \
                     data-parallel world (its error says why)"
                )));
            }
            let group = hccl.join(group).map_err(hccl_err)?;
            Ok((dp, World::Hccl(group)))
        }
        _ => Ok((dp.map(World::Mpi), World::Mpi(group))),
    }
}
