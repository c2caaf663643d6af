//! One rank's step protocol, written once, as a state machine without I/O: the loader
//! ([`crate::exec::loader::Loader`]) drives one [`Engine`] with the real collectives, decode pool
//! and clock; the simulator ([`crate::sim`]) drives one per rank with simulated CPUs, links and
//! time. Neither owns a copy of the protocol.
//!
//! An [`Engine`] holds what only its rank knows (its decodes in flight, what it sent and
//! received, its step record); an [`Agreed`] holds what every rank computes identically from the
//! all-gathered records (the cost models, the plans). A driver begins a [`Call`] and then polls:
//! each [`Action`] is either local (submit decode jobs, wait for some, put a sample together,
//! deliver the batch) or a collective whose result the driver hands back as the [`Event`] of the
//! next poll. Finished decodes are filed with [`Engine::finished`] whenever they come.
//!
//! ```
//! use datahelix::step::{Action, Call, Engine};
//!
//! let mut engine = Engine::new(0, 1, 1, 0);
//! // Before the first step, `Prepare` takes the round the first `Next` would: the first steps
//! // are planned, and their decodes begin, while the caller still sets up.
//! engine.begin(Call::Prepare).unwrap();
//! # struct NoData;
//! # impl datahelix::step::Catalog for NoData {
//! #     fn lookup(&self, _: u64) -> Result<Option<(usize, datahelix::descriptor::Descriptor)>, String> { Ok(None) }
//! # }
//! # let cfg = datahelix::step::AgreedConfig::for_tests();
//! # let mut agreed = datahelix::step::Agreed::new(cfg, &[1, 2], 1);
//! // Its first action is the round's all-gather of every rank's step record.
//! assert!(matches!(engine.poll(&mut agreed, &NoData, None).unwrap(), Action::Gather(_)));
//! ```
//!
//! # The collective schedule of a step
//!
//! Every rank issues the same collectives in the same order, decided only by what every rank
//! knows — the plans and the gathered records — never by local timing. With `moves(t)`: "the
//! plan of step `t` decodes a job away from its sample's owner", and `L` the lookahead:
//!
//! | call | collectives, in order |
//! |---|---|
//! | [`Call::Next`] of step `s` | if `s` was not prepared: a *round* (below); else, if the plan of `s` splits a sample and predicts a rank late by more than the step takes (helix): a round first, so that step `s + L` starts decoding while that rank waits — on a step that waits anyway; if `moves(s)`: one exchange of every tensor of `s` still owed (senders wait for their decodes); the after-decode step — helix's gate: when the plan's sizes make a rebalance pay, an exchange of the samples it moves that did not move at `Ship`; post-balance: one fixed-size all-gather of the decoded sizes (each rank's padded to the most slots a rank trains), then an exchange when it balances |
//! | [`Call::Prepare`] (after `Next(s)`) | if `moves(s+1)`: one exchange of what of `s+1` is decoded already; a round |
//! | [`Call::Prepare`] before the first `Next` | a round (the one that `Next` then skips) |
//! | [`Call::Ship`] (near the end of step `s`) | if `moves(s+1)`: an exchange of what of `s+1` is decoded; a wait (local) until shortly before the slowest rank's predicted end; a second exchange of `s+1`; helix, when `s+1` is planned: its gate is decided here (from the plan's sizes, on the model every rank holds at this point of its calls) and, when it moves samples, one exchange of those put together by now — every pair of the decision meets, so both sides know what came and what is left for `Next` |
//!
//! A *round* all-gathers every rank's [`crate::plan::record::StepRecord`], plans the steps up to
//! `s + L` not planned yet, and — with `check_plan` — all-reduces a hash of those plans and of
//! the collectives this rank has issued so far, so that a rank whose inputs, build or schedule
//! differ is named at once instead of hanging. The DataLoader-style baselines (`rank-local`,
//! `post-balance`) plan from the sampler alone and, like the loaders they stand for, add no
//! collective to a step: only their first round gathers (for everyone's worker counts) and
//! checks; their later rounds are local. An exchange is pairwise: a pair of ranks meets
//! only when the plan puts a tensor between them that is not yet across (both sides know that
//! from the plan and from their earlier exchanges); every rank still enters it.
//!
//! Opening a loader (before any step) issues: an all-reduce of "a file changed since indexing
//! here", then — only if some rank saw one — a barrier around rank 0's re-probe of those files;
//! then the fingerprint's all-gather of the job's facts.
//!
//! So when a call returns, this rank owes its peers nothing for it: every exchange of the call is
//! complete on both sides, and no later call of another rank waits for one of this rank's. A
//! caller may run its own collectives between any two calls — except after a late-rank step's
//! `Next`, below, which only a caller that opts in sees.
//!
//! # A late rank
//!
//! With [`AgreedConfig::late_pieces`] (the caller's next call follows `Next` before any
//! collective of its own: `Loader::train_step` does; `datahelix train` turns it on) and a caller
//! that prepares or ships, a plan may name late ranks ([`crate::plan::Plan::late_ranks`]), the
//! last ones (of each placement group, where there are groups), where some rank must wait for its input whatever the schedule: samples whose
//! decode chains outlast the time until their batch is due, grouped on as few ranks as the step
//! allows ([`crate::plan::late`]), or, where the CPUs fall far short of the step's pace, the
//! last rank alone with the stretched batch (its decode jobs then queue behind the next step's
//! on every rank). The pieces owed to a late rank skip the collection's exchange, and one more
//! exchange, `late`, carries them: a late rank issues it in its `Next` right after the
//! collection's exchange and waits there for its pieces (sending in it, once decoded, what it
//! owes the other late ranks); every other rank issues it first thing in its next call
//! (`Prepare`, or `Ship`), once it has decoded what it owes (often nothing: then it meets no
//! one). Every rank thus issues the same collectives in the same order, but the ranks whose
//! batches are ready return from `Next` without waiting for the late ranks' pieces. Such a step
//! moves no samples after decoding (its gate decides no moves); a step whose late rank waits on
//! the CPUs takes no early round. The simulator meets the `late` exchange out of lockstep, as
//! the ranks do.

mod agreed;
mod engine;
mod learned;

pub use agreed::{
    AfterDecode, Agreed, AgreedConfig, Catalog, LastExchange, Planned, SkipCount, Slot,
    DEFAULT_MAX_SKIP_RATE, MIN_SKIPS_JUDGED, NAMED_SKIPS,
};
pub use engine::{Counters, Engine};
pub use learned::{Learned, Resumed, MAX_ACCEL_OBSERVATIONS};

use std::sync::Arc;

use crate::decode::split::FrameRange;

/// A part of a step's batch: a whole sample (`part` 0) or one piece of a split one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartKey {
    /// The step.
    pub step: u64,
    /// The sample's index in its global batch.
    pub slot: u32,
    /// Which piece (0 for a whole sample).
    pub part: u16,
}

/// What a driver asks its engine to do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Call {
    /// The next step's batch (after the previous step's gradient sync).
    Next,
    /// Plan ahead while the accelerator runs the step just delivered.
    Prepare,
    /// Near the end of the accelerator step: exchange what of the next step is decoded.
    /// `step_end_s` is when the accelerator's step ends, on the driver's clock.
    Ship {
        /// The accelerator step's end, driver's clock, seconds.
        step_end_s: f64,
    },
}

/// One decode job for the driver's pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeRequest {
    /// What it decodes.
    pub key: PartKey,
    /// The sample's id.
    pub id: u64,
    /// The sample's position in the catalog (the index).
    pub pos: usize,
    /// Earliest-deadline-first key: `(step << 32) | position in this rank's order`.
    pub priority: u64,
    /// The sampled frames, when a piece (None: the whole sample).
    pub frames: Option<FrameRange>,
    /// Predicted seconds on one worker.
    pub predicted_s: f64,
    /// The output shape it will have, `[F, H', W', 3]` (exact under the protocol).
    pub shape: [usize; 4],
}

/// A decode that finished, as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    /// What it decoded.
    pub key: PartKey,
    /// Whether it succeeded.
    pub ok: bool,
    /// Output shape (when ok).
    pub shape: [usize; 4],
    /// Wall seconds it took on its worker.
    pub seconds: f64,
    /// CPU seconds it took.
    pub cpu_s: f64,
}

/// What one tensor message carries besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Message {
    /// Which part (for a moved whole sample, part 0).
    pub key: PartKey,
    /// The sample's id.
    pub id: u64,
    /// False when decoding failed (no bytes follow): the owner learns of the skip.
    pub ok: bool,
    /// `[F, H, W, 3]` of the bytes.
    pub shape: [usize; 4],
    /// Tokens (moved samples only; 0 for parts).
    pub tokens: u64,
}

/// What an exchange moves: decoded parts (held by the driver under their [`PartKey`]) or whole
/// samples already put together (held under `(step, slot)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Decoded parts.
    Parts,
    /// Whole samples (after-decode rebalancing).
    Samples,
}

/// The label of a late-rank step's `late` exchange (module docs, "A late rank"): the one exchange
/// the ranks issue at different points of their calls, which a simulator must not meet in
/// lockstep.
pub const LATE_EXCHANGE: &str = "late";

/// One pairwise exchange: every rank calls it; rank `q` is in `send` of rank `p` exactly when
/// `p` is in `expect` of rank `q`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeOrder {
    /// For traces.
    pub label: &'static str,
    /// The step whose tensors move.
    pub step: u64,
    /// Parts or samples.
    pub payload: Payload,
    /// The ranks this rank sends a block (possibly empty) to, ascending.
    pub send: Vec<usize>,
    /// The ranks this rank receives a block from, ascending.
    pub expect: Vec<usize>,
    /// What to send, to whom, and whether to compress it.
    pub outgoing: Vec<(usize, Message, bool)>,
}

/// A part of a batch put together from its pieces (or a whole sample taken as it is).
#[derive(Clone, Debug, PartialEq)]
pub struct SampleSpec {
    /// The step.
    pub step: u64,
    /// The sample's index in its global batch.
    pub slot: u32,
    /// Its id.
    pub id: u64,
    /// Its parts in piece order (each held by the driver under its key).
    pub parts: Vec<PartKey>,
    /// The whole's shape.
    pub shape: [usize; 4],
    /// Its tokens.
    pub tokens: u64,
}

/// A step's batch on this rank: the samples the driver holds under `(step, slot)`.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSpec {
    /// The step.
    pub step: u64,
    /// Its samples' slots, in batch order.
    pub slots: Vec<u32>,
    /// Their ids.
    pub ids: Vec<u64>,
    /// Their tokens.
    pub tokens: Vec<u64>,
    /// Ids of this rank's samples that failed.
    pub skipped: Vec<u64>,
    /// Bytes of tensors received from other ranks for this step.
    pub bytes_in: u64,
    /// CPU seconds this rank's workers spent on this step's samples.
    pub decode_cpu_s: f64,
}

/// Bytes of one entry of post-balance's gathered sizes (sample slot, tokens, bytes: three `u64`).
/// A rank holds at most a global batch of samples of a step, so its contribution to
/// [`Action::GatherV`] is at most this times the global batch.
pub const SIZE_ENTRY_BYTES: usize = 24;

/// What the engine asks its driver to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Collective: all-gather these fixed-size bytes; answer [`Event::Gathered`].
    Gather(Vec<u8>),
    /// Collective: all-gather these bytes of any size; answer [`Event::GatheredV`].
    GatherV(Vec<u8>),
    /// Collective: check every rank holds this value; answer [`Event::Agreed`].
    Agree(u64),
    /// Collective: one pairwise exchange; answer [`Event::Exchanged`].
    Exchange(ExchangeOrder),
    /// Queue these decode jobs (no answer).
    Submit(Vec<DecodeRequest>),
    /// File finished decodes ([`Engine::finished`]) until every one of `keys` is, or the
    /// driver's clock reaches `until_s` (None: no limit); then poll again with no event.
    Await {
        /// The parts waited for.
        keys: Vec<PartKey>,
        /// The latest time to wait to (driver's clock).
        until_s: Option<f64>,
    },
    /// Put these samples together from their parts, and drop these parts (no answer).
    Assemble {
        /// The samples.
        samples: Vec<SampleSpec>,
        /// Parts of samples that failed (their bytes can go).
        drop: Vec<PartKey>,
        /// Whether ahead of the batch's collection (while the accelerator runs).
        ahead: bool,
    },
    /// The batch of the call (the last action of [`Call::Next`] before [`Action::Done`]).
    Deliver(BatchSpec),
    /// The call is complete.
    Done,
}

/// A collective's result, handed to the next [`Engine::poll`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Every rank's bytes, in rank order, concatenated (shared: a simulator hands the same
    /// bytes to every engine).
    Gathered(Arc<Vec<u8>>),
    /// Every rank's bytes, in rank order.
    GatheredV(Arc<Vec<Vec<u8>>>),
    /// Whether every rank held the same value.
    Agreed(bool),
    /// The messages received, with their sender and bytes on the wire.
    Exchanged(Vec<(usize, Message, u64)>),
}

/// Why a step cannot go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// The catalog (the index) could not be read.
    #[error("{0}")]
    Catalog(String),
    /// The planner refused its input.
    #[error("{0}")]
    Plan(#[from] crate::plan::PlanError),
    /// A peer or the driver broke the protocol, with what to do.
    #[error("{0}")]
    Protocol(String),
    /// More samples failed than the run's skip budget allows (`max_skip_rate`), with their ids.
    #[error("{0}")]
    SkipBudget(String),
}
