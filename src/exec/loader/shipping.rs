//! Moving decoded tensors between ranks, and putting split samples together: the exchanges of
//! [`Loader::ship_ahead`] near the end of an accelerator step, the ones [`Loader`] runs while it
//! collects a batch, and what each rank owes and awaits of a step. Every rank knows from the
//! plan who sends to whom, so each exchange is pairwise among the ranks concerned.

use std::time::{Duration, Instant};

use super::{Exchange, ExecError, Loader, Part, Sample, Slot, TensorData};
use crate::exec::exchange::{self, Piece};

impl<'w> Loader<'w> {
    /// Exchanges the next step's tensors decoded for other ranks while the accelerator finishes
    /// the step in training, so that they reach their owners before their batches are
    /// collected instead of on the input-wait path. Call it on every rank (or on none), after
    /// [`Loader::prepare_ahead`] and [`LoaderConfig::ship_margin_s`] before the accelerator's
    /// step ends at `step_end`. It sends what is decoded already; then, if this rank still owes
    /// tensors or awaits some, it waits for its own until [`LoaderConfig::ship_slack_s`] before
    /// the step is predicted to end on the slowest rank (never before `step_end`: the gradient
    /// sync would hold it until then anyway) and exchanges again:
    ///
    /// ```no_run
    /// # use datahelix::exec::loader::Loader;
    /// # use std::time::{Duration, Instant};
    /// # fn step(loader: &mut Loader<'_>, accel_s: f64) -> Result<(), Box<dyn std::error::Error>> {
    /// let batch = loader.next_batch()?;
    /// let step_end = Instant::now() + Duration::from_secs_f64(accel_s); // the step runs
    /// loader.prepare_ahead()?;
    /// let margin = Duration::from_millis(100);
    /// std::thread::sleep(step_end.saturating_duration_since(Instant::now()).saturating_sub(margin));
    /// loader.ship_ahead(step_end)?;
    /// std::thread::sleep(step_end.saturating_duration_since(Instant::now()));
    /// // the gradient all-reduce, then:
    /// loader.report_step(accel_s, &batch);
    /// # Ok(()) }
    /// ```
    pub fn ship_ahead(&mut self, step_end: Instant) -> Result<(), ExecError> {
        self.ships_ahead = true;
        let next = self.next_step;
        if !self.moves(next) {
            return Ok(());
        }
        self.ship_early(next, "ship ahead")?;
        // The stragglers: both sides of a pair know from the plan and the first exchange that
        // a second one follows, so the ranks concerned meet again and no one else does.
        if !self.owed(next).is_empty() || !self.awaited(next).is_empty() {
            let sync = step_end + Duration::from_secs_f64(self.behind_slowest_s);
            let limit = sync.checked_sub(Duration::from_secs_f64(self.cfg.ship_slack_s)).unwrap_or(sync);
            let owed = self.owed(next);
            self.wait_until(next, &owed, limit);
            self.ship_early(next, "ship late")?;
        }
        self.preassemble(next);
        Ok(())
    }

    /// Puts together this rank's split samples of step `t` whose pieces are all in hand:
    /// copying a clip's pieces into one tensor takes milliseconds, better spent while the
    /// accelerator runs than on the input-wait path. [`Loader::collect`] adds them.
    fn preassemble(&mut self, t: u64) {
        let me = self.world.rank();
        let Some(p) = self.plans.get(&t) else { return };
        let received = self.early.get(&t).map_or(&[][..], |v| &v[..]);
        let mut jobs_of: Vec<Vec<usize>> = vec![Vec::new(); p.slots.len()];
        for j in 0..p.plan.jobs.len() {
            jobs_of[p.slot_of(j)].push(j);
        }
        let in_hand = |j: usize| {
            if p.plan.decoder[j] as usize == me {
                self.done.contains_key(&(t, j))
            } else {
                let (k, part) = (p.slot_of(j), p.plan.jobs[j].part);
                received.iter().any(|x| x.slot == k && x.part as u32 == part)
            }
        };
        let complete: Vec<usize> = (0..p.slots.len())
            .filter(|&k| jobs_of[k].len() > 1 && p.owner_of(jobs_of[k][0]) == me)
            .filter(|&k| jobs_of[k].iter().all(|&j| in_hand(j)))
            .collect();
        if complete.is_empty() {
            return;
        }
        let parts_of: Vec<u32> = jobs_of.iter().map(|js| js.len() as u32).collect();
        let slots = p.slots.clone();
        let own: Vec<(usize, u16, usize)> = complete
            .iter()
            .flat_map(|&k| jobs_of[k].iter().map(move |&j| (k, j)))
            .filter(|&(_, j)| p.plan.decoder[j] as usize == me)
            .map(|(k, j)| (k, p.plan.jobs[j].part as u16, j))
            .collect();
        let mut parts = Vec::new();
        for (k, part, j) in own {
            if let Ok(out) = self.take(t, j) {
                parts.push(Part { slot: k, part, out });
            }
        }
        if let Some(early) = self.early.get_mut(&t) {
            let (theirs, rest): (Vec<Part>, Vec<Part>) =
                std::mem::take(early).into_iter().partition(|x| complete.contains(&x.slot));
            *early = rest;
            parts.extend(theirs);
        }
        let t0 = self.now();
        let mut skipped = Vec::new();
        let held = self.assemble(parts, &parts_of, &slots, &mut skipped);
        let t1 = self.now();
        self.span(0, "assemble", format!("assemble ahead step {t}"), t0, t1);
        let entry = self.assembled.entry(t).or_default();
        entry.0.extend(held);
        entry.1.extend(skipped);
        entry.2.extend(complete);
    }

    /// One exchange of what of step `next` is decoded, kept for its collection.
    fn ship_early(&mut self, next: u64, label: &str) -> Result<(), ExecError> {
        let t0 = self.now();
        let (received, bytes) = self.ship(next, Exchange::Ready)?;
        self.early.entry(next).or_default().extend(received);
        *self.early_bytes.entry(next).or_default() += bytes;
        let t1 = self.now();
        self.span(0, "transfer", format!("{label} step {next}"), t0, t1);
        Ok(())
    }

    /// Whether step `t`'s plan decodes any job away from its sample's owner (every rank knows).
    pub(super) fn moves(&self, t: u64) -> bool {
        self.plans
            .get(&t)
            .is_some_and(|p| (0..p.plan.jobs.len()).any(|j| p.plan.decoder[j] as usize != p.owner_of(j)))
    }

    /// This rank's jobs of step `t` decoded for others and not sent yet.
    pub(super) fn owed(&self, t: u64) -> Vec<usize> {
        let me = self.world.rank();
        let Some(p) = self.plans.get(&t) else { return Vec::new() };
        p.plan.order[me]
            .iter()
            .map(|&j| j as usize)
            .filter(|&j| p.owner_of(j) != me && !self.sent.contains(&(t, j)))
            .collect()
    }

    /// Jobs of step `t` other ranks decode for this one, not received yet.
    pub(super) fn awaited(&self, t: u64) -> Vec<usize> {
        let me = self.world.rank();
        let Some(p) = self.plans.get(&t) else { return Vec::new() };
        (0..p.plan.jobs.len())
            .filter(|&j| {
                p.plan.decoder[j] as usize != me && p.owner_of(j) == me && !self.got.contains(&(t, j))
            })
            .collect()
    }

    /// One exchange of decoded tensors between the ranks that owe each other some (every rank
    /// calls it at the same point of the step's sequence; pairs with nothing to exchange return
    /// at once). `Exchange::Ready` sends what of step `s` is decoded already; `Exchange::Rest`
    /// sends all the rest of step `s` (waiting for those decodes) and what of step `s+1` is
    /// decoded already. Both sides know from the plan and from what they exchanged before who
    /// sends to whom. Received parts of step `s+1` are kept for it; returns step `s`'s and their
    /// bytes.
    pub(super) fn ship(&mut self, s: u64, what: Exchange) -> Result<(Vec<Part>, u64), ExecError> {
        let me = self.world.rank();
        let ranks = self.world.size();
        let steps: Vec<u64> = match what {
            Exchange::Ready => vec![s],
            Exchange::Rest => vec![s, s + 1],
        };
        let (mut send, mut expect) = (vec![false; ranks], vec![false; ranks]);
        let mut owed: Vec<(u64, usize)> = Vec::new();
        for &t in &steps {
            let p = match self.plans.get(&t) {
                Some(p) => p,
                None => continue,
            };
            for j in self.owed(t) {
                send[p.owner_of(j)] = true;
                owed.push((t, j));
            }
            for j in self.awaited(t) {
                expect[p.plan.decoder[j] as usize] = true;
            }
        }
        if what == Exchange::Rest {
            let rest: Vec<usize> = owed.iter().filter(|x| x.0 == s).map(|x| x.1).collect();
            self.wait_for(s, &rest)?;
        }
        while let Some(outcome) = self.pool.try_recv() {
            self.absorb(outcome);
        }
        let mut blocks: Vec<Vec<u8>> = vec![Vec::new(); ranks];
        for (t, j) in owed {
            if !self.done.contains_key(&(t, j)) {
                continue;
            }
            let (owner, k, part, id) = {
                let p = &self.plans[&t];
                let k = p.slot_of(j);
                (p.owner_of(j), k, p.plan.jobs[j].part as u16, p.slots[k].id)
            };
            let mut header = Piece {
                step: t,
                index: k as u32,
                part,
                id,
                shape: [0; 4],
                tokens: 0,
                ok: false,
                data: Vec::new(),
            };
            let packed = match self.take(t, j)? {
                Ok((shape, data)) => {
                    self.measure_zstd(&data);
                    header.shape = shape;
                    header.ok = true;
                    let z = self.compress(data.len());
                    exchange::pack_data(&mut blocks[owner], &header, &data, z)
                }
                Err(_) => exchange::pack(&mut blocks[owner], &header, false),
            };
            packed.map_err(|e| ExecError::Invalid(e.to_string()))?;
            self.sent.insert((t, j));
        }
        let received = self.world.exchange_vec(&blocks, &send, &expect)?;
        let (mut parts, mut bytes) = (Vec::new(), 0u64);
        for (q, block) in received.iter().enumerate() {
            if q == me {
                continue;
            }
            for piece in exchange::unpack(block).map_err(|e| ExecError::Invalid(e.to_string()))? {
                let (t, k) = (piece.step, piece.index as usize);
                let job = self.plans.get(&t).and_then(|p| {
                    (0..p.plan.jobs.len()).find(|&j| {
                        p.slot_of(j) == k && p.plan.jobs[j].part == piece.part as u32 && p.owner_of(j) == me
                    })
                });
                let Some(j) = job else {
                    return Err(ExecError::Invalid(format!(
                        "rank {me} received piece {} of slot {k} of step {t} from rank {q}, which the plan does not send it; every rank must run the same build",
                        piece.part
                    )));
                };
                self.got.insert((t, j));
                let size = (exchange::HEADER + piece.data.len()) as u64;
                let out =
                    if piece.ok { Ok((piece.shape, TensorData::Owned(piece.data))) } else { Err(piece.id) };
                let part = Part { slot: k, part: piece.part, out };
                if t == s {
                    parts.push(part);
                    bytes += size;
                } else {
                    self.early.entry(t).or_default().push(part);
                    *self.early_bytes.entry(t).or_default() += size;
                }
            }
        }
        Ok((parts, bytes))
    }

    /// Samples from their decoded parts: a whole sample as it is, a split one concatenated in
    /// piece order once every piece is in hand. A sample with a failed piece is skipped whole.
    pub(super) fn assemble(
        &self,
        mut parts: Vec<Part>,
        parts_of: &[u32],
        slots: &[Slot],
        skipped: &mut Vec<u64>,
    ) -> Vec<(usize, Sample)> {
        parts.sort_by_key(|x| (x.slot, x.part));
        let mut held = Vec::new();
        let mut rest = parts.into_iter().peekable();
        while let Some(first) = rest.next() {
            let k = first.slot;
            let mut group = vec![first];
            while rest.peek().is_some_and(|x| x.slot == k) {
                group.extend(rest.next());
            }
            let id = slots[k].id;
            let complete = group.len() as u32 == parts_of[k] && group.iter().all(|x| x.out.is_ok());
            if !complete {
                if group.iter().all(|x| x.out.is_ok()) {
                    tracing::warn!(
                        rank = self.world.rank(),
                        "sample {id}: {} of {} pieces arrived",
                        group.len(),
                        parts_of[k]
                    );
                }
                skipped.push(id);
                continue;
            }
            let mut outs: Vec<([usize; 4], TensorData)> =
                group.into_iter().filter_map(|x| x.out.ok()).collect();
            let (shape, data) = if outs.len() == 1 {
                outs.remove(0)
            } else {
                // Pieces share H', W' and channels; their frames add up.
                let frames = outs.iter().map(|(sh, _)| sh[0]).sum();
                let mut bytes = Vec::with_capacity(outs.iter().map(|(_, d)| d.len()).sum());
                for (_, d) in &outs {
                    bytes.extend_from_slice(d);
                }
                ([frames, outs[0].0[1], outs[0].0[2], outs[0].0[3]], TensorData::Owned(bytes))
            };
            let text = slots[k].desc.map_or(0, |d| d.text_tokens);
            let tokens = self.tokens(text, shape[0] as u32, shape[1] as u32, shape[2] as u32);
            held.push((k, Sample { id, shape, tokens, data }));
        }
        held
    }
}
