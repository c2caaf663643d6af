//! Replica groups: ranks that must train on identical batches (a tensor-parallel group, whose
//! ranks each hold a slice of the model) get them without decoding them twice. Rank 0 of each
//! group runs the loader on the data-parallel world of the group leaders; it broadcasts every
//! batch's bytes to the rest of its group.
//!
//! ```no_run
//! use datahelix::comm::mpi::MpiWorld;
//! use datahelix::comm::{Config, World};
//! use datahelix::exec::loader::LoaderConfig;
//! use datahelix::exec::replica::ReplicaLoader;
//!
//! let world = MpiWorld::init(Config::default())?;
//! // Groups of 2 consecutive ranks see the same batches; the leaders split each global batch.
//! let (dp, group) = ReplicaLoader::split_world(&world, 2)?;
//! let mut loader = ReplicaLoader::new(dp.map(World::Mpi), World::Mpi(group), LoaderConfig::new("data/skewed".into()))?;
//! let batch = loader.next_batch()?; // the same ids and bytes on both ranks of a group
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A follower's batch arrives in broadcasts of its group, each tensor straight from the
//! leader's buffer into the follower's. Most of them cross while the step before trains: after
//! planning ahead and again after shipping (the two points of [`Loader::finish_step`], or the
//! caller's [`ReplicaLoader::prepare_ahead`] and [`ReplicaLoader::ship_ahead`]), the leader
//! sends the tensors of the next step it holds whole; the batch's table (header, ids, shapes,
//! frame times, and which tensor came ahead) then goes with only the rest. Everything is
//! checked before use, and the tensors' sizes before anything is allocated for them. An
//! error on the leader reaches its followers as an error naming it instead of a hang. Every
//! rank can say where the run stands
//! ([`ReplicaLoader::state`]: the leader's state, with what its policy learned and its skip
//! count, sent to its followers when the group opens and with each batch), and a run resumes
//! from it ([`ReplicaLoader::resume`]) with the same or another world size and group size.

use std::time::Instant;

use super::loader::{Accelerator, Batch, ExecError, Loader, LoaderConfig, Sample, TensorData, WorldRef};
use super::state::LoaderState;
use crate::collective::Collective;
use crate::comm::mpi::{InitError, MpiWorld};

/// Bytes of a batch header: step, samples, skipped, input wait, decode CPU, bytes in.
const HEAD: usize = 48;
/// Bytes of a sample's entry: id, shape (4), tokens, length, and which tensor sent ahead is its
/// own ([`NOT_AHEAD`]: none, it follows the table).
const ENTRY: usize = 64;
/// The length a leader broadcasts instead of a batch, or the count instead of tensors sent
/// ahead, when it failed.
const FAILED: u64 = u64::MAX;
/// A batch entry's tensor follows the table (it was not sent ahead).
const NOT_AHEAD: u64 = u64::MAX;
/// The longest loader state a follower accepts from its leader (the longest any rank reads).
const MAX_STATE_BYTES: u64 = super::state::MAX_BYTES;

/// One rank of a replica group: the loader on its leader, a receiver elsewhere.
pub struct ReplicaLoader<'w> {
    leader: Option<Loader<'w>>,
    /// A follower's index and lookup of its samples' metadata (the leader's loader has its own).
    meta: Option<(crate::index::Index, super::sample_meta::SampleMeta)>,
    /// The group's state ([`ReplicaLoader::state`]): its leader's, as of the group's last
    /// batch (or its opening), the same document on every rank of the group.
    shared: LoaderState,
    /// The most bytes a batch from the leader may announce ([`batch_bound`]).
    max_batch_bytes: u64,
    /// The most tensors a leader may send ahead at once: the global batch.
    max_ahead: u64,
    /// On the leader: the next step's tensors sent ahead, in the order sent.
    sent_ahead: Vec<SentAhead>,
    /// On a follower: the tensors received ahead for the step after the last batch, in order
    /// (taken as the batch names them).
    got_ahead: Vec<Option<Vec<u8>>>,
    /// Bytes of the batches' tensors delivered so far: [sent ahead, sent with their batch].
    delivered_bytes: [u64; 2],
    group: WorldRef<'w>,
}

/// A tensor a leader sent ahead: a slot of a step, at the address and length it had then. The
/// batch's sample for that slot is the same tensor when both still match (a buffer freed and
/// another one allocated in its place would be another decode of the same slot: the same bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
struct SentAhead {
    step: u64,
    slot: u32,
    addr: usize,
    len: usize,
}

impl SentAhead {
    fn of(step: u64, slot: u32, data: &[u8]) -> SentAhead {
        SentAhead { step, slot, addr: data.as_ptr() as usize, len: data.len() }
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A batch's table: header, entries, skipped ids, then every sample's `shape[0]` frame times
/// (f64), in batch order; `ahead[k]`, where `Some`, is the index among the tensors sent ahead
/// that is sample `k`'s. The other tensors follow it on the wire, each in a broadcast of its own
/// from the leader's buffer into the follower's (no copy into or out of a message).
fn encode_table(b: &Batch, ahead: &[Option<usize>]) -> Vec<u8> {
    let frames: usize = b.samples.iter().map(|s| s.shape[0]).sum();
    let mut out = Vec::with_capacity(HEAD + ENTRY * b.samples.len() + 8 * (b.skipped.len() + frames));
    for v in [b.step, b.samples.len() as u64, b.skipped.len() as u64] {
        out.extend(v.to_le_bytes());
    }
    for v in [b.input_wait_s, b.decode_cpu_s] {
        out.extend(v.to_le_bytes());
    }
    out.extend(b.bytes_in.to_le_bytes());
    for (k, s) in b.samples.iter().enumerate() {
        out.extend(s.id.to_le_bytes());
        for d in s.shape {
            out.extend((d as u64).to_le_bytes());
        }
        out.extend(s.tokens.to_le_bytes());
        out.extend((s.data.len() as u64).to_le_bytes());
        let sent = ahead.get(k).copied().flatten();
        out.extend(sent.map_or(NOT_AHEAD, |j| j as u64).to_le_bytes());
    }
    for id in &b.skipped {
        out.extend(id.to_le_bytes());
    }
    for s in &b.samples {
        for k in 0..s.shape[0] {
            out.extend(s.timestamps_s.get(k).copied().unwrap_or(f64::NAN).to_le_bytes());
        }
    }
    out
}

/// The batch of [`encode_table`]'s bytes, its samples' tensors still empty (each will be its
/// shape's product of bytes, checked here), and which of them were sent ahead; refusing
/// anything inconsistent and a table announcing more than `max_bytes` (the table and the
/// tensors together) before anything is allocated for the tensors.
fn decode_table(bytes: &[u8], max_bytes: u64) -> Result<(Batch, Vec<Option<u64>>), String> {
    let bad = |what: &str| format!("the batch the group leader sent is malformed ({what})");
    if bytes.len() < HEAD {
        return Err(bad("shorter than its header"));
    }
    let (step, n, n_skipped) = (u64_at(bytes, 0), u64_at(bytes, 8), u64_at(bytes, 16));
    let f = |at| f64::from_bits(u64_at(bytes, at));
    let (input_wait_s, decode_cpu_s, bytes_in) = (f(24), f(32), u64_at(bytes, 40));
    let entries = (n as u128) * ENTRY as u128 + (n_skipped as u128) * 8;
    if HEAD as u128 + entries > bytes.len() as u128 {
        return Err(bad("more samples than bytes"));
    }
    let (n, n_skipped) = (n as usize, n_skipped as usize);
    let mut times_at = HEAD + n * ENTRY + n_skipped * 8;
    // The table's bytes, then each tensor's as it is read.
    let mut total = bytes.len() as u64;
    let mut samples = Vec::with_capacity(n);
    let mut ahead = Vec::with_capacity(n);
    for k in 0..n {
        let e = HEAD + k * ENTRY;
        let shape = [0, 1, 2, 3].map(|d| u64_at(bytes, e + 8 + 8 * d) as usize);
        let len = u64_at(bytes, e + 48);
        let expect = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
        if expect != Some(len) {
            return Err(bad(&format!("sample {k}'s shape {shape:?} does not match its {len} bytes")));
        }
        total = total.saturating_add(len);
        ahead.push(Some(u64_at(bytes, e + 56)).filter(|&j| j != NOT_AHEAD));
        if total > max_bytes {
            return Err(bad(&format!(
                "its tensors come to more than {max_bytes} bytes, the most a batch of this run can hold"
            )));
        }
        let times = shape[0].checked_mul(8).filter(|&t| t <= bytes.len() - times_at);
        let Some(times) = times else { return Err(bad(&format!("sample {k}'s frame times are cut off"))) };
        let timestamps_s: Vec<f64> = bytes[times_at..times_at + times]
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        if timestamps_s.iter().any(|t| !t.is_finite()) {
            return Err(bad(&format!("sample {k} has a frame time that is not finite")));
        }
        samples.push(Sample {
            id: u64_at(bytes, e),
            shape,
            tokens: u64_at(bytes, e + 40),
            data: TensorData::Owned(Vec::new()),
            timestamps_s,
            meta: String::new(),
        });
        times_at += times;
    }
    if times_at != bytes.len() {
        return Err(bad("bytes left over"));
    }
    let skipped = (0..n_skipped).map(|k| u64_at(bytes, HEAD + n * ENTRY + 8 * k)).collect();
    Ok((Batch { step, samples, skipped, input_wait_s, decode_cpu_s, bytes_in }, ahead))
}

impl<'w> ReplicaLoader<'w> {
    /// Splits `world` into replica groups of `size` consecutive ranks (a tensor-parallel layout)
    /// and the data-parallel world of their leaders (group rank 0; `None` on the others).
    /// Collective over `world`; `size` must divide its ranks.
    pub fn split_world(world: &MpiWorld, size: usize) -> Result<(Option<MpiWorld>, MpiWorld), ExecError> {
        let (rank, ranks) = (world.rank(), world.size());
        if size == 0 || ranks % size != 0 {
            return Err(ExecError::Invalid(format!(
                "replica groups of {size} ranks do not divide the world's {ranks} ranks"
            )));
        }
        let split_err =
            |e: InitError| ExecError::Invalid(format!("cannot split the world into replica groups: {e}"));
        let group = world.split(Some((rank / size) as u32)).map_err(split_err)?;
        let group = group.ok_or_else(|| ExecError::Invalid("MPI_Comm_split gave no replica group".into()))?;
        let dp = world.split((rank % size == 0).then_some(0)).map_err(split_err)?;
        Ok((dp, group))
    }

    /// This rank's part of its replica group `group`: on the group's rank 0 a [`Loader`] over
    /// `dp` (the leaders' data-parallel world, `Some` exactly there), elsewhere a receiver.
    /// Collective over `group` (and, for the leaders, over `dp`).
    pub fn new(
        dp: Option<impl Into<WorldRef<'w>>>,
        group: impl Into<WorldRef<'w>>,
        cfg: LoaderConfig,
    ) -> Result<ReplicaLoader<'w>, ExecError> {
        ReplicaLoader::open(dp, group, cfg, None)
    }

    /// [`ReplicaLoader::new`] continuing from `state` (any rank's [`ReplicaLoader::state`], or a
    /// [`Loader::state`]): the leaders resume their loader from it ([`Loader::resume`], which
    /// checks it); the followers take where they stand from their leader.
    pub fn resume(
        dp: Option<impl Into<WorldRef<'w>>>,
        group: impl Into<WorldRef<'w>>,
        cfg: LoaderConfig,
        state: &LoaderState,
    ) -> Result<ReplicaLoader<'w>, ExecError> {
        ReplicaLoader::open(dp, group, cfg, Some(state))
    }

    fn open(
        dp: Option<impl Into<WorldRef<'w>>>,
        group: impl Into<WorldRef<'w>>,
        cfg: LoaderConfig,
        resume: Option<&LoaderState>,
    ) -> Result<ReplicaLoader<'w>, ExecError> {
        let group = group.into();
        let leads = group.get().rank() == 0;
        let max_batch_bytes = batch_bound(&cfg);
        let cfg_global_batch = cfg.global_batch as u64;
        // A follower reads its samples' metadata from its own copy of the index; without one
        // its batches still arrive, their metadata empty.
        let meta = (!leads)
            .then(|| crate::index::Index::open_in(&cfg.data, cfg.index_dir.as_deref()))
            .and_then(|i| i.map_err(|e| tracing::warn!("replica follower: no sample metadata: {e}")).ok())
            .map(|index| {
                let meta = super::sample_meta::SampleMeta::open(&index, &cfg.data, cfg.index_dir.as_deref());
                (index, meta)
            });
        let leader = match (leads, dp) {
            (true, Some(dp)) => Some(match resume {
                Some(state) => Loader::resume(dp, cfg, state),
                None => Loader::new(dp, cfg),
            }),
            (false, None) => None,
            (true, None) => Some(Err(ExecError::Invalid(
                "the replica group's rank 0 needs the data-parallel world".into(),
            ))),
            (false, Some(_)) => Some(Err(ExecError::Invalid(
                "only a replica group's rank 0 joins the data-parallel world".into(),
            ))),
        };
        // Every member learns whether its leader's loader opened, so none waits for batches
        // that never come.
        let mine_ok = leader.as_ref().is_none_or(|l| l.is_ok());
        let mut flags = vec![0u8; group.get().size()];
        group.get().all_gather(&[u8::from(mine_ok)], &mut flags)?;
        let leader = leader.transpose()?;
        if let Some(r) = flags.iter().position(|&f| f == 0) {
            return Err(ExecError::Invalid(format!(
                "rank {r} of this replica group could not open its loader (its error says why)"
            )));
        }
        let shared = share_state(&group, leader.as_ref().map(Loader::state))?;
        Ok(ReplicaLoader {
            leader,
            meta,
            shared,
            max_batch_bytes,
            max_ahead: cfg_global_batch,
            sent_ahead: Vec::new(),
            got_ahead: Vec::new(),
            delivered_bytes: [0; 2],
            group,
        })
    }

    /// Where the run stands, the same document on every rank of the group: the leader's
    /// [`Loader::state`] — with what its policy learned and its skip budget's count — as it was
    /// when it sent the group's last batch (or opened the group), which every batch carries to
    /// the followers. A run resumed from any rank's state plans with the models and counts on
    /// from the count the leaders had. Not collective.
    pub fn state(&self) -> LoaderState {
        self.shared.clone()
    }

    /// Bytes of the tensors delivered so far in this group's batches: `[sent ahead, sent with
    /// their batch]` — how much of the broadcast left the input-wait path. Not collective.
    pub fn delivered_bytes(&self) -> [u64; 2] {
        self.delivered_bytes
    }

    /// True on the group's rank 0 (the rank that decodes).
    pub fn leads(&self) -> bool {
        self.leader.is_some()
    }

    /// The replica group's world.
    pub fn group(&self) -> &dyn Collective {
        self.group.get()
    }

    /// The loader (on the leader only).
    pub fn loader(&self) -> Option<&Loader<'w>> {
        self.leader.as_ref()
    }

    /// [`Loader::set_epoch`] on the leader; nothing elsewhere.
    pub fn set_epoch(&mut self, t0: Instant) {
        if let Some(loader) = &mut self.leader {
            loader.set_epoch(t0);
        }
    }

    /// The next step's batch, the same on every rank of the group (but `input_wait_s`: each
    /// rank's own wait in this call, the broadcast's included). Collective over the group (and,
    /// on the leader, the loader's world).
    pub fn next_batch(&mut self) -> Result<Batch, ExecError> {
        let g = self.group.get();
        match &mut self.leader {
            Some(loader) => {
                let got = loader.next_batch_in_slots();
                let sent = std::mem::take(&mut self.sent_ahead);
                let sending = Instant::now();
                let mut got = got.map(|(batch, slots)| {
                    // Each sample's tensor among those sent ahead, if it is one of them.
                    let ahead: Vec<Option<usize>> = (batch.samples.iter().zip(slots))
                        .map(|(s, k)| sent.iter().rposition(|a| *a == SentAhead::of(batch.step, k, &s.data)))
                        .collect();
                    (batch, ahead)
                });
                let table = got.as_ref().ok().map(|(batch, ahead)| encode_table(batch, ahead));
                // Where the run now stands, with the batch: the followers' state moves on too.
                let state = got.is_ok().then(|| loader.state());
                let note = state.as_ref().map(|s| s.to_json().into_bytes()).unwrap_or_default();
                let mut len = table.as_ref().map_or(FAILED, |t| t.len() as u64);
                if super::fault::replica_oversized("replica-oversized", loader.world().rank()) {
                    len = 1 << 50;
                }
                let mut note_len = note.len() as u64;
                if super::fault::replica_oversized("replica-state-oversized", loader.world().rank()) {
                    note_len = 1 << 50;
                }
                let mut lens = [len, note_len].map(u64::to_le_bytes).concat();
                g.broadcast(0, &mut lens)?;
                if let (Some(mut table), Ok((batch, ahead))) = (table, got.as_mut()) {
                    table.extend_from_slice(&note);
                    g.broadcast(0, &mut table)?;
                    for (sample, ahead) in batch.samples.iter_mut().zip(ahead.iter()) {
                        self.delivered_bytes[usize::from(ahead.is_none())] += sample.data.len() as u64;
                        if ahead.is_none() {
                            g.broadcast(0, &mut sample.data)?;
                        }
                    }
                }
                if let Some(state) = state {
                    self.shared = state;
                }
                // The caller waited for the broadcast too.
                got.map(|(mut batch, _)| {
                    batch.input_wait_s += sending.elapsed().as_secs_f64();
                    batch
                })
            }
            None => {
                let asked = Instant::now();
                let got_ahead = std::mem::take(&mut self.got_ahead);
                let (mut batch, bytes, state) = self.receive_batch(got_ahead)?;
                self.delivered_bytes = [0, 1].map(|k| self.delivered_bytes[k] + bytes[k]);
                if let Some((index, meta)) = &self.meta {
                    meta.fill(index, &mut batch.samples);
                }
                self.shared = state;
                // This rank's own wait (for its leader's batch and the broadcast), not the
                // leader's, which the header carried.
                batch.input_wait_s = asked.elapsed().as_secs_f64();
                Ok(batch)
            }
        }
    }

    /// A follower's part of [`ReplicaLoader::next_batch`]: the table and the group's state,
    /// then each tensor not among `got_ahead` (the tensors received ahead for this step); and
    /// the batch's tensor bytes [received ahead, received with it].
    fn receive_batch(
        &self,
        mut got_ahead: Vec<Option<Vec<u8>>>,
    ) -> Result<(Batch, [u64; 2], LoaderState), ExecError> {
        let g = self.group.get();
        let mut lens = [0u8; 16];
        g.broadcast(0, &mut lens)?;
        let (len, state_len) = (u64_at(&lens, 0), u64_at(&lens, 8));
        if len == FAILED {
            return Err(ExecError::Invalid(
                "the replica group's rank 0 failed to load the batch (its error says why)".into(),
            ));
        }
        if len > self.max_batch_bytes {
            // Not joined: the leader's broadcast ends at the collective watchdog, or when the
            // launcher ends the job on this rank's error.
            return Err(refuse(
                &self.group,
                format!(
                    "the replica group's rank 0 announced a batch table of {len} bytes, more than a \
                     batch of this run can hold ({} bytes: the global batch at the largest tensor of \
                     max_frames and max_pixels); is every rank of the group running the same build \
                     and settings?",
                    self.max_batch_bytes
                ),
            ));
        }
        if state_len > MAX_STATE_BYTES {
            return Err(refuse(
                &self.group,
                format!(
                    "the replica group's rank 0 announced a loader state of {state_len} bytes with its batch \
                     (at most {MAX_STATE_BYTES})"
                ),
            ));
        }
        let len = usize::try_from(len)
            .map_err(|_| refuse(&self.group, format!("the replica group's rank 0 announced {len} bytes")))?;
        let mut table = vec![0u8; len + state_len as usize];
        g.broadcast(0, &mut table)?;
        let (mut batch, ahead) =
            decode_table(&table[..len], self.max_batch_bytes).map_err(|why| refuse(&self.group, why))?;
        let state =
            follow(&self.shared, &table[len..], batch.step).map_err(|why| refuse(&self.group, why))?;
        let expected = self.shared.next_step;
        let mut bytes = [0u64; 2];
        for (k, (sample, ahead)) in batch.samples.iter_mut().zip(ahead).enumerate() {
            let len: usize = sample.shape.iter().product();
            bytes[usize::from(ahead.is_none())] += len as u64;
            let data = match ahead {
                None => {
                    let mut data = vec![0u8; len];
                    g.broadcast(0, &mut data)?;
                    data
                }
                Some(j) => {
                    // Sent ahead for the step this rank expects next, once, at this length.
                    let taken =
                        usize::try_from(j).ok().and_then(|j| got_ahead.get_mut(j)).and_then(Option::take);
                    let fits = taken.filter(|d| d.len() == len && expected == batch.step);
                    fits.ok_or_else(|| {
                        refuse(
                            &self.group,
                            format!(
                                "the batch the group leader sent for step {} names tensor {j} sent ahead for \
                                 sample {k}, which this rank does not hold at {len} bytes",
                                batch.step
                            ),
                        )
                    })?
                }
            };
            sample.data = TensorData::Owned(data);
        }
        Ok((batch, bytes, state))
    }

    /// A leader's sending ahead: the next step's tensors it holds whole and has not sent yet
    /// (`ok`: its loader's last call succeeded; else it says it failed). Collective over the
    /// group, answered by [`ReplicaLoader::receive_ahead`].
    fn send_ahead(
        group: &dyn Collective,
        loader: &mut Loader<'_>,
        sent: &mut Vec<SentAhead>,
        ok: bool,
    ) -> Result<(), ExecError> {
        let rank = loader.world().rank();
        let (step, held) = loader.whole_tensors_ahead();
        let new: Vec<(SentAhead, &mut [u8])> = (held.into_iter())
            .map(|(k, data)| (SentAhead::of(step, k, data), data))
            .filter(|(a, _)| !sent.contains(a))
            .collect();
        let count = if ok { new.len() as u64 } else { FAILED };
        let mut head = [count.to_le_bytes(), step.to_le_bytes()].concat();
        group.broadcast(0, &mut head)?;
        if !ok || new.is_empty() {
            return Ok(());
        }
        let mut lens: Vec<u8> = new.iter().flat_map(|(a, _)| (a.len as u64).to_le_bytes()).collect();
        if super::fault::replica_oversized("replica-ahead-oversized", rank) {
            lens[..8].copy_from_slice(&(1u64 << 50).to_le_bytes());
        }
        group.broadcast(0, &mut lens)?;
        for (a, data) in new {
            group.broadcast(0, data)?;
            sent.push(a);
        }
        Ok(())
    }

    /// A follower's part of a sending ahead ([`ReplicaLoader::send_ahead`]): the tensors
    /// kept until the batch names them; their count, step and bytes checked before anything is
    /// allocated.
    fn receive_ahead(&mut self) -> Result<(), ExecError> {
        let g = self.group.get();
        let mut head = [0u8; 16];
        g.broadcast(0, &mut head)?;
        let (count, step) = (u64_at(&head, 0), u64_at(&head, 8));
        if count == FAILED {
            return Err(ExecError::Invalid(
                "the replica group's rank 0 failed while preparing the next batch (its error says why)"
                    .into(),
            ));
        }
        if count == 0 {
            return Ok(());
        }
        let expected = self.shared.next_step;
        if count > self.max_ahead || expected != step {
            return Err(refuse(
                &self.group,
                format!(
                    "the replica group's rank 0 sends {count} tensors ahead for step {step}, where this rank \
                     expects at most {} for step {}; is every rank of the group running the same build and \
                     settings?",
                    self.max_ahead, expected
                ),
            ));
        }
        let mut lens = vec![0u8; 8 * count as usize];
        g.broadcast(0, &mut lens)?;
        let lens: Vec<u64> =
            lens.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect();
        let held: u64 = self.got_ahead.iter().flatten().map(|d| d.len() as u64).sum();
        let total = lens.iter().fold(held, |t, &l| t.saturating_add(l));
        if total > self.max_batch_bytes {
            return Err(refuse(
                &self.group,
                format!(
                    "the replica group's rank 0 sends {total} bytes of tensors ahead for step {step}, more \
                     than a batch of this run can hold ({} bytes)",
                    self.max_batch_bytes
                ),
            ));
        }
        for len in lens {
            let mut data = vec![0u8; len as usize];
            g.broadcast(0, &mut data)?;
            self.got_ahead.push(Some(data));
        }
        Ok(())
    }

    /// [`Loader::prepare_ahead`] on the leader, which then sends ahead what it holds of the
    /// next batch; its followers receive it. Collective over the group (and, on the leader,
    /// the loader's world).
    pub fn prepare_ahead(&mut self) -> Result<(), ExecError> {
        self.then_send_ahead(Loader::prepare_ahead)
    }

    /// [`Loader::ship_ahead`] on the leader, which then sends ahead what more it holds of the
    /// next batch; its followers receive it. Collective like [`ReplicaLoader::prepare_ahead`].
    pub fn ship_ahead(&mut self, step_end: Instant) -> Result<(), ExecError> {
        self.then_send_ahead(|loader| loader.ship_ahead(step_end))
    }

    /// `call` on the leader's loader, then its sending ahead (saying so if `call` failed); a
    /// follower's receiving of it.
    fn then_send_ahead(
        &mut self,
        call: impl FnOnce(&mut Loader<'w>) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        let group = self.group.get();
        match &mut self.leader {
            Some(loader) => {
                let done = call(loader);
                Self::send_ahead(group, loader, &mut self.sent_ahead, done.is_ok())?;
                done
            }
            None => self.receive_ahead(),
        }
    }

    /// [`Loader::report_step`] on the leader (the group's accelerator step); nothing elsewhere.
    pub fn report_step(&mut self, accel_s: f64) -> Result<(), ExecError> {
        self.leader.as_mut().map_or(Ok(()), |l| l.report_step(accel_s))
    }

    /// [`Loader::train_step`] for a replica group: every rank launches its slice of the step on
    /// the same batch; the leader plans and ships while it runs, and sends ahead what it holds
    /// of the next batch.
    pub fn train_step(&mut self, accel: &mut dyn Accelerator) -> Result<Batch, ExecError> {
        let batch = self.next_batch()?;
        let launched = super::loader::launch(accel, &batch)?;
        self.finish_step(accel, launched)?;
        Ok(batch)
    }

    /// The rest of a step launched at `launched` on the batch delivered last: on the leader
    /// [`Loader::finish_step`] (plan, ship, wait, report), sending ahead after planning and
    /// after shipping; elsewhere receiving that, then the wait.
    pub fn finish_step(&mut self, accel: &mut dyn Accelerator, launched: Instant) -> Result<(), ExecError> {
        let group = self.group.get();
        match &mut self.leader {
            Some(loader) => {
                let sent = &mut self.sent_ahead;
                loader.finish_step_then(accel, launched, |l, ok| Self::send_ahead(group, l, sent, ok))
            }
            None => {
                self.receive_ahead()?;
                self.receive_ahead()?;
                accel.wait().map(|_| ()).map_err(|e| {
                    let step = self.shared.next_step.saturating_sub(1);
                    ExecError::Invalid(format!("the accelerator's step {step} failed: {e}"))
                })
            }
        }
    }
}

/// The most bytes a batch may take on the wire: every sample of the global batch at the run's
/// largest tensor (`max_frames` frames of `max_pixels`, or of the smallest 28 × 28 picture,
/// RGB) with its frame times, entry and a skipped id. A follower refuses a larger announcement
/// before it allocates anything.
fn batch_bound(cfg: &LoaderConfig) -> u64 {
    let samples = cfg.global_batch as u128;
    let frames = cfg.params.max_frames.max(1) as u128;
    let pixels = cfg.params.max_pixels.max(28 * 28) as u128;
    let per_sample = ENTRY as u128 + 8 + frames * (pixels * 3 + 8);
    (HEAD as u128 + samples * per_sample).min(FAILED as u128 - 1) as u64
}

/// A follower's refusal of what its leader sent: the group no longer agrees on what comes next
/// (the leader goes on, or is left inside a broadcast this rank will not join). The group's
/// world, when owned here, skips its closing barrier, which would meet the leader's next
/// collective and end the job on a truncated message; and the reason is said at once, since
/// the job may end before the caller prints the error.
fn refuse(group: &WorldRef<'_>, why: String) -> ExecError {
    if let WorldRef::Owned(world) = group {
        if let Some(mpi) = world.mpi_world() {
            mpi.abandon();
        }
    }
    crate::comm::say_whole(&format!("datahelix: rank {} of a replica group: {why}", group.get().rank()));
    ExecError::Invalid(why)
}

/// Sends the leader's loader state (`Some` exactly there) to its followers, which check it and
/// keep it: the group's state on every rank. Collective over `group`.
fn share_state(world: &WorldRef<'_>, mine: Option<LoaderState>) -> Result<LoaderState, ExecError> {
    let group = world.get();
    let mut wire = mine.as_ref().map(|s| s.to_json().into_bytes()).unwrap_or_default();
    let mut len = (wire.len() as u64).to_le_bytes();
    group.broadcast(0, &mut len)?;
    if let Some(state) = mine {
        group.broadcast(0, &mut wire)?;
        return Ok(state);
    }
    let len = u64::from_le_bytes(len);
    if len == 0 || len > MAX_STATE_BYTES {
        // Not joined: the leader's broadcast ends at the collective watchdog, if not before.
        return Err(refuse(
            world,
            format!("the replica group's rank 0 announced a loader state of {len} bytes (at most {MAX_STATE_BYTES})"),
        ));
    }
    let mut wire = vec![0u8; len as usize];
    group.broadcast(0, &mut wire)?;
    parse_state(&wire)
        .map_err(|e| refuse(world, format!("the loader state the replica group's rank 0 sent {e}")))
}

/// A loader state from a leader's bytes, or why not (`is not UTF-8`, `is refused: …`).
fn parse_state(bytes: &[u8]) -> Result<LoaderState, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8".to_string())?;
    LoaderState::from_json(text).map_err(|e| format!("is refused: {e}"))
}

/// The state the group's batch of `step` carried (`bytes`), checked against the group's state
/// so far (`shared`): a state of the same run — seed, global batch, dataset, sampler and policy
/// — whose next step is the one after `step`.
fn follow(shared: &LoaderState, bytes: &[u8], step: u64) -> Result<LoaderState, String> {
    let why = |e: String| format!("the loader state sent with the batch of step {step} {e}");
    let sent = parse_state(bytes).map_err(why)?;
    sent.check_against(shared.seed, shared.global_batch, &shared.dataset())
        .map_err(|e| why(format!("belongs to another run: {e}")))?;
    if sent.policy != shared.policy || Some(sent.next_step) != step.checked_add(1) {
        return Err(why(format!(
            "says policy {} and next step {}, where the group runs {} and is at step {step}",
            sent.policy, sent.next_step, shared.policy
        )));
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> Batch {
        let sample = |id, f: usize| Sample {
            id,
            shape: [f, 2, 3, 3],
            tokens: 7 * id,
            data: TensorData::Owned((0..f * 18).map(|b| (b * id as usize) as u8).collect()),
            timestamps_s: (0..f).map(|k| k as f64 * 0.5).collect(),
            meta: String::new(),
        };
        Batch {
            step: 5,
            samples: vec![sample(3, 2), sample(9, 1)],
            skipped: vec![11],
            input_wait_s: 0.25,
            decode_cpu_s: 1.5,
            bytes_in: 99,
        }
    }

    #[test]
    fn a_batch_table_crosses_whole() {
        let b = batch();
        let (back, ahead) = decode_table(&encode_table(&b, &[None, Some(4)]), u64::MAX).unwrap();
        assert_eq!(ahead, [None, Some(4)], "which tensor was sent ahead crosses with the table");
        let lens: Vec<usize> = back.samples.iter().map(|s| s.shape.iter().product()).collect();
        assert_eq!((back.step, back.skipped.clone(), back.bytes_in), (5, vec![11], 99));
        assert_eq!((back.input_wait_s, back.decode_cpu_s), (0.25, 1.5));
        assert_eq!(lens, [36, 18], "each tensor's length, for the broadcasts that follow");
        for (x, y) in b.samples.iter().zip(&back.samples) {
            assert_eq!((x.id, x.shape, x.tokens), (y.id, y.shape, y.tokens));
            assert_eq!(x.timestamps_s, y.timestamps_s);
        }
    }

    /// The bound is a full batch at the largest tensor, with room for a skipped id a sample.
    #[test]
    fn the_batch_bound_holds_a_full_batch_of_the_largest_tensors() {
        let mut cfg = LoaderConfig::new("unused".into());
        cfg.global_batch = 3;
        cfg.params.max_frames = 2;
        cfg.params.max_pixels = 28 * 56;
        let full = |id| Sample {
            id,
            shape: [2, 28, 56, 3],
            tokens: 1,
            data: TensorData::Owned(vec![1; 2 * 28 * 56 * 3]),
            timestamps_s: vec![0.0, 0.5],
            meta: String::new(),
        };
        let b = Batch {
            step: 0,
            samples: (0..3).map(full).collect(),
            skipped: vec![],
            input_wait_s: 0.0,
            decode_cpu_s: 0.0,
            bytes_in: 0,
        };
        let tensors = 3 * 2 * 28 * 56 * 3;
        assert_eq!(batch_bound(&cfg), (encode_table(&b, &[]).len() + tensors + 3 * 8) as u64);
        cfg.params.max_pixels = 10; // below the smallest picture: 28 x 28 counts
        assert_eq!(batch_bound(&cfg), (HEAD + 3 * (ENTRY + 8 + 2 * (784 * 3 + 8))) as u64);
    }

    /// A follower takes the state its leader sent with a batch only if it is a valid document
    /// of the same run, at the step after that batch, with what the leader learned intact.
    #[test]
    fn a_followers_state_is_its_leaders_checked() {
        use crate::exec::state::DatasetId;
        let dataset = DatasetId {
            samples: 96,
            manifest_sha256: "ab".repeat(32),
            index_sha256: "cd".repeat(32),
            mix: None,
        };
        let shared = LoaderState::new(7, 3, "helix", 16, dataset.clone());
        let skips = crate::step::SkipCount { planned: 160, failed: 2, ids: vec![5, 6] };
        let sent = LoaderState::new(7, 10, "helix", 16, dataset.clone()).with_skips(Some(skips));
        let wire = sent.to_json().into_bytes();
        let took = follow(&shared, &wire, 9).unwrap();
        assert_eq!(took, sent, "the leader's document, its count included");
        assert_eq!((took.next_step, took.epoch), (10, 1), "160 positions into 96 samples: epoch 1");
        assert!(took.check_against(7, 16, &dataset).is_ok());
        let refused = |wire: &[u8], step| follow(&shared, wire, step).expect_err("refused");
        assert!(refused(&wire, 10).contains("next step 10"), "a state for another step");
        let other = LoaderState::new(8, 10, "helix", 16, dataset.clone()).to_json().into_bytes();
        assert!(refused(&other, 9).contains("another run"), "another seed");
        let policy = LoaderState::new(7, 10, "rank-local", 16, dataset).to_json().into_bytes();
        assert!(refused(&policy, 9).contains("policy rank-local"));
        let text = String::from_utf8(wire).unwrap();
        assert!(refused(text.replace("160", "161").as_bytes(), 9).contains("checksum"), "edited");
        assert!(refused(&[0xff, 0xfe], 9).contains("UTF-8"));
    }

    #[test]
    fn damaged_batches_are_refused() {
        let wire = encode_table(&batch(), &[]);
        let decode = |bytes: &[u8]| decode_table(bytes, u64::MAX).map(|_| ());
        for cut in [0, HEAD - 1, HEAD + 10, wire.len() - 1] {
            assert!(decode(&wire[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = wire.clone();
        longer.push(0);
        assert!(decode(&longer).expect_err("refused").contains("left over"));
        let mut huge = wire.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge).expect_err("refused").contains("more samples"));
        // Tensors beyond the run's bound are refused before anything is allocated for them.
        let fits = (wire.len() + 36 + 18) as u64;
        assert!(decode_table(&wire, fits).is_ok());
        let over = decode_table(&wire, fits - 1).err().expect("refused");
        assert!(over.contains("more than"), "{over}");
        let mut shape = wire;
        shape[HEAD + 8..HEAD + 16].copy_from_slice(&1000u64.to_le_bytes());
        assert!(decode(&shape).expect_err("refused").contains("shape"));
    }
}
