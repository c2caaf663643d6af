//! The bytes side of the step protocol: decoded outputs filed from the pool, tensors packed for
//! and unpacked from an exchange, and split samples put together. The engine says what; this
//! module holds and moves the bytes.

use std::collections::HashSet;
use std::time::Instant;

use super::{ExecError, Loader, Part, Sample, TensorData};
use crate::decode::pool::{Outcome, Output};
use crate::exec::exchange::{self, Piece};
use crate::step::{ExchangeOrder, Finished, Message, PartKey, Payload, SampleSpec};

impl Loader<'_> {
    /// The next step's tensors this rank holds whole, for the slots it trains on, by slot, as
    /// they stand once every finished decode is filed: what a replica group's leader sends its
    /// followers while the step before trains (`exec::replica`; mutable only because a
    /// broadcast takes its root's buffer so). A slot the gate moves to another rank after this
    /// call is not in the batch; one whose bytes are replaced is in it at another address.
    pub(crate) fn whole_tensors_ahead(&mut self) -> (u64, Vec<(u32, &mut [u8])>) {
        self.file_finished();
        let step = self.engine.next_step();
        let Some(plan) = self.agreed.plan_of(step).cloned() else { return (step, Vec::new()) };
        let mine: Vec<u32> = plan.owned.get(self.engine.rank()).cloned().unwrap_or_default();
        let assembled: HashSet<u32> =
            mine.iter().copied().filter(|&k| self.samples.contains_key(&(step, k))).collect();
        // A slot decoded in one piece is whole as soon as that piece is here.
        let whole_parts: HashSet<PartKey> = (mine.iter())
            .filter(|k| !assembled.contains(k))
            .filter_map(|&k| match plan.jobs_of.get(k as usize)?.as_slice() {
                [job] => Some(plan.key_of(*job)),
                _ => None,
            })
            .collect();
        let mut held: Vec<(u32, &mut [u8])> = (self.samples.iter_mut())
            .filter(|((t, k), _)| *t == step && assembled.contains(k))
            .map(|(&(_, k), sample)| (k, &mut sample.data[..]))
            .collect();
        held.extend(
            (self.parts.iter_mut())
                .filter(|(key, _)| whole_parts.contains(key))
                .map(|(key, part)| (key.slot, &mut part.data[..])),
        );
        held.sort_by_key(|(k, _)| *k);
        (step, held)
    }

    /// Files one finished decode: its bytes kept under its part key, the engine told.
    pub(super) fn file(&mut self, outcome: Outcome) {
        let Some((key, frames, predicted_s)) = self.in_pool.remove(&outcome.deadline) else {
            return; // not submitted by this loader (cannot happen: every job came from a plan)
        };
        let (ok, shape) = match outcome.result {
            Ok(Output::Sampled { tensor, decoded }) => {
                let shape = decoded.shape.dims();
                let part = Part { data: TensorData::Pooled(tensor), timestamps_s: decoded.timestamps_s };
                self.parts.insert(key, part);
                (true, shape)
            }
            Ok(Output::AllFrames(_)) => {
                tracing::warn!(
                    rank = self.engine.rank(),
                    "sample {}: all-frames output in a training run",
                    outcome.id
                );
                (false, [0; 4])
            }
            Err(e) => {
                tracing::warn!(rank = self.engine.rank(), step = key.step, "skipping {e}");
                (false, [0; 4])
            }
        };
        let end = outcome.finished.saturating_duration_since(self.started).as_secs_f64();
        let lane = 1 + ((outcome.deadline & 0xffff_ffff) as u32 % self.workers_here.max(1));
        // The planner's prediction beside the measured span: where a plan went wrong, at a glance.
        let what = match frames {
            Some(r) => format!(
                "decode {} frames {}..{} (step {}, predicted {predicted_s:.3} s)",
                outcome.id, r.start, r.end, key.step
            ),
            None => format!("decode {} (step {}, predicted {predicted_s:.3} s)", outcome.id, key.step),
        };
        self.span(lane, "decode", what, end - outcome.seconds, end);
        let finished = Finished { key, ok, shape, seconds: outcome.seconds, cpu_s: outcome.cpu_seconds };
        self.engine.finished(&self.agreed, finished);
    }

    /// Carries out one pairwise exchange: packs what the engine sends, returns what came.
    pub(super) fn exchange(&mut self, order: ExchangeOrder) -> Result<Vec<(usize, Message, u64)>, ExecError> {
        let t0 = self.now();
        let (me, ranks) = (self.world.get().rank(), self.world.get().size());
        // One send buffer, blocks back to back in rank order: the bytes are copied once here.
        let mut outgoing = order.outgoing;
        outgoing.sort_by_key(|&(to, _, _)| to);
        let pieces_out = outgoing.len();
        let mut send = Vec::new();
        let mut counts = vec![0usize; ranks];
        for (to, m, compress) in outgoing {
            if to >= ranks {
                return Err(ExecError::Invalid(format!(
                    "rank {me}: a tensor planned for rank {to} of {ranks}"
                )));
            }
            let header = Piece {
                step: m.key.step,
                index: m.key.slot,
                part: m.key.part,
                id: m.id,
                shape: m.shape,
                tokens: m.tokens,
                ok: m.ok,
                timestamps_s: Vec::new(),
                data: Vec::new(),
            };
            let data = match order.payload {
                Payload::Parts => self.parts.remove(&m.key).map(|p| (p.data, p.timestamps_s)),
                Payload::Samples => {
                    self.samples.remove(&(m.key.step, m.key.slot)).map(|s| (s.data, s.timestamps_s))
                }
            };
            let before = send.len();
            let packed = match (m.ok, data) {
                (true, Some((data, timestamps_s))) => {
                    self.measure_zstd(&data);
                    exchange::pack_data(&mut send, &Piece { timestamps_s, ..header }, &data, compress)
                }
                (true, None) => {
                    return Err(ExecError::Invalid(format!(
                        "rank {me}: part {} of slot {} of step {} is to be sent but is not in hand",
                        m.key.part, m.key.slot, m.key.step
                    )))
                }
                (false, _) => exchange::pack(&mut send, &Piece { ok: false, shape: [0; 4], ..header }, false),
            };
            packed.map_err(|e| ExecError::Invalid(e.to_string()))?;
            counts[to] += send.len() - before;
        }
        let flags = |listed: &[usize]| {
            let mut flags = vec![false; ranks];
            for &r in listed.iter().filter(|&&r| r < ranks) {
                flags[r] = true;
            }
            flags
        };
        if let (Some(fault), Some(&to)) = (super::super::fault::injected(me), order.send.first()) {
            let at: usize = counts[..to].iter().sum();
            if counts[to] >= exchange::HEADER {
                super::super::fault::corrupt(&mut send, at, fault);
            }
        }
        // What one rank may send here: every sample of the step at the largest planned size, with
        // its header and zstd's worst case (a little over the raw bytes).
        let max_bytes = self.largest_tensor(order.step, order.payload);
        let per_message = exchange::HEADER + max_bytes + max_bytes / 128 + 1024;
        // (A sample may come in pieces: up to 16 per sample is far more than the planner makes.)
        let max_in = per_message.saturating_mul(self.cfg.global_batch.max(1) * 16);
        let received = self.world.get().exchange_packed(
            &send,
            &counts,
            &flags(&order.send),
            &flags(&order.expect),
            max_in,
        )?;
        drop(send);
        let mut out = Vec::new();
        for q in (0..ranks).filter(|&q| q != me) {
            let pieces = exchange::unpack(received.block(q), max_bytes).map_err(|e| {
                ExecError::Invalid(format!(
                    "rank {me}, {} step {}: from rank {q}: {e}",
                    order.label, order.step
                ))
            })?;
            for piece in pieces {
                let bytes = (exchange::HEADER + piece.data.len()) as u64;
                let key = PartKey { step: piece.step, slot: piece.index, part: piece.part };
                if piece.ok && piece.shape.iter().product::<usize>() != piece.data.len() {
                    return Err(ExecError::Invalid(format!(
                        "rank {me}: rank {q} sent part {} of slot {} of step {} with shape {:?} but {} bytes",
                        piece.part,
                        piece.index,
                        piece.step,
                        piece.shape,
                        piece.data.len()
                    )));
                }
                let m = Message { key, id: piece.id, ok: piece.ok, shape: piece.shape, tokens: piece.tokens };
                if piece.ok {
                    let charge = self.pool.charge(piece.data.len());
                    let data = TensorData::Received(piece.data, charge);
                    match order.payload {
                        Payload::Parts => {
                            let part = Part { data, timestamps_s: piece.timestamps_s };
                            self.parts.insert(key, part);
                        }
                        Payload::Samples => {
                            let sample = Sample {
                                id: piece.id,
                                shape: piece.shape,
                                tokens: piece.tokens,
                                data,
                                timestamps_s: piece.timestamps_s,
                                meta: String::new(),
                            };
                            self.samples.insert((key.step, key.slot), sample);
                        }
                    }
                }
                out.push((q, m, bytes));
            }
        }
        let t1 = self.now();
        let name = if order.label == crate::step::LATE_EXCHANGE {
            // Which ranks were late and what reached this one after its step's collection.
            let late = self.agreed.plan_of(order.step).map(|p| p.plan.late_ranks.clone()).unwrap_or_default();
            let late: Vec<String> = late.iter().map(u32::to_string).collect();
            format!(
                "late step {} (ranks {} late): {} pieces in, {pieces_out} out",
                order.step,
                late.join(" "),
                out.len()
            )
        } else {
            format!("{} step {}", order.label, order.step)
        };
        self.span(0, "transfer", name, t0, t1);
        Ok(out)
    }

    /// The most bytes one message of this exchange may carry, from the plan: the largest
    /// planned piece of the step (parts), or its whole planned batch (samples, whose pieces add
    /// up). Received lengths are checked against it before anything is allocated.
    fn largest_tensor(&self, step: u64, payload: Payload) -> usize {
        let Some(p) = self.agreed.plan_of(step) else { return 0 };
        let bytes = p.shapes.iter().map(|s| s.iter().product::<usize>());
        match payload {
            Payload::Parts => bytes.max().unwrap_or(0),
            Payload::Samples => bytes.sum(),
        }
    }

    /// Puts samples together from their parts (a whole sample as it is, a split one
    /// concatenated in piece order) and drops the parts of failed samples.
    pub(super) fn assemble(
        &mut self,
        specs: Vec<SampleSpec>,
        drop: Vec<PartKey>,
        ahead: bool,
    ) -> Result<(), ExecError> {
        let t0 = self.now();
        for key in drop {
            self.parts.remove(&key);
        }
        let split = specs.iter().any(|s| s.parts.len() > 1);
        let step = specs.first().map_or(0, |s| s.step);
        for spec in specs {
            let mut parts = Vec::with_capacity(spec.parts.len());
            for key in &spec.parts {
                let part = self.parts.remove(key).ok_or_else(|| {
                    ExecError::Invalid(format!(
                        "rank {}: part {} of sample {} (step {}) is not in hand",
                        self.engine.rank(),
                        key.part,
                        spec.id,
                        spec.step
                    ))
                })?;
                parts.push(part);
            }
            // The pieces' frames in piece order, and their times with them.
            let timestamps_s: Vec<f64> = parts.iter().flat_map(|p| p.timestamps_s.iter().copied()).collect();
            let data = if parts.len() == 1 {
                parts.remove(0).data
            } else {
                let mut bytes = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
                for p in &parts {
                    bytes.extend_from_slice(&p.data);
                }
                let charge = self.pool.charge(bytes.len());
                TensorData::Received(bytes, charge)
            };
            let sample = Sample {
                id: spec.id,
                shape: spec.shape,
                tokens: spec.tokens,
                data,
                timestamps_s,
                meta: String::new(),
            };
            self.samples.insert((spec.step, spec.slot), sample);
        }
        if split {
            let t1 = self.now();
            let what = if ahead { "assemble ahead step" } else { "assemble step" };
            self.span(0, "assemble", format!("{what} {step}"), t0, t1);
        }
        Ok(())
    }

    /// Measures zstd level 1 on a tensor about to be sent: on its first MiB (a tensor's frames
    /// are alike; compressing all of it would put tens of milliseconds on the exchange's path),
    /// for the first tensor and every 16th after.
    fn measure_zstd(&mut self, data: &[u8]) {
        const SAMPLE: usize = 1 << 20;
        let nth = self.zstd_seen;
        self.zstd_seen += 1;
        if data.len() < 4096 || (self.engine.zstd_measured() && nth % 16 != 0) {
            return;
        }
        let data = &data[..data.len().min(SAMPLE)];
        let t = Instant::now();
        if let Ok(c) = zstd::bulk::compress(data, 1) {
            let secs = t.elapsed().as_secs_f64().max(1e-9);
            self.engine.note_zstd(c.len() as f64 / data.len() as f64, data.len() as f64 / secs);
        }
    }
}
