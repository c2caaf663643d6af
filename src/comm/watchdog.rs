//! What the watchdog says when a collective does not finish: the per-peer states a timed-out rank
//! collects, the report it prints, and a SIGTERM reporter so that ranks the launcher kills (after
//! another rank died or aborted) still say which collective they were in.
//!
//! The waiting itself lives in the backends (`comm::mpi` polls its non-blocking requests against
//! a deadline); this module holds what is backend-independent.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::collective::{CollectiveOp, Site};

/// What a peer answered (or failed to answer) when asked where it is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PeerState {
    /// Inside a collective: which one, and for how long it has waited.
    In {
        /// The collective.
        op: Option<CollectiveOp>,
        /// Its sequence number on the peer's world.
        seq: u64,
        /// The peer's training step, if set.
        step: Option<u64>,
        /// How long the peer has been waiting in it.
        waited: Duration,
    },
    /// Outside collectives, waiting for its own decodes ([`encode_decoding`]).
    Decoding {
        /// The peer's training step, if set.
        step: Option<u64>,
        /// How long since the peer left its last collective.
        busy: Duration,
    },
    /// No answer within the grace period.
    Silent,
}

/// The op code of [`PeerState::Decoding`] on the wire (no collective has it).
const DECODING: u64 = 1 << 32;

/// The wire form of "decoding outside collectives", answered by [`crate::collective::Collective::serve_watchdog`].
pub fn encode_decoding(step: Option<u64>, busy: Duration) -> Vec<u64> {
    vec![DECODING, 0, step.unwrap_or(u64::MAX), busy.as_millis() as u64]
}

/// The wire form of a state: `[op code, seq, step or u64::MAX, waited ms]`.
pub fn encode(site: &Site, waited: Duration) -> Vec<u64> {
    vec![site.op.code(), site.seq, site.step.unwrap_or(u64::MAX), waited.as_millis() as u64]
}

/// Parses [`encode`]'s form.
pub fn decode(words: &[u64]) -> PeerState {
    match words {
        [DECODING, _, step, ms, ..] => PeerState::Decoding {
            step: (*step != u64::MAX).then_some(*step),
            busy: Duration::from_millis(*ms),
        },
        [op, seq, step, ms, ..] => PeerState::In {
            op: CollectiveOp::from_code(*op),
            seq: *seq,
            step: (*step != u64::MAX).then_some(*step),
            waited: Duration::from_millis(*ms),
        },
        _ => PeerState::Silent,
    }
}

/// The message a timed-out rank prints before it aborts the job. `backend` names the backend of
/// `site` where it is not the MPI world that asked the peers (`Some("hccl")`).
#[allow(clippy::too_many_arguments)]
pub fn report(
    site: &Site,
    backend: Option<&str>,
    waited: Duration,
    timeout: Duration,
    peers: &[(usize, PeerState)],
    no_data_from: Option<&[usize]>,
    grace: Duration,
    exit_code: i32,
) -> String {
    let mut s = format!(
        "datahelix: {site}{} did not complete within {:.1} s (timeout {:.1} s); peers:\n",
        backend.map(|b| format!(" ({b})")).unwrap_or_default(),
        waited.as_secs_f64(),
        timeout.as_secs_f64()
    );
    let mut mismatch = false;
    for (rank, state) in peers {
        let _ = match state {
            PeerState::In { op, seq, waited, .. } if *op == Some(site.op) && *seq == site.seq => {
                writeln!(s, "  rank {rank}: arrived (also waiting in it, {:.1} s)", waited.as_secs_f64())
            }
            PeerState::In { op, seq, step, waited } => {
                let name = op.map_or("an unknown collective", CollectiveOp::name);
                let step = step.map(|t| format!(" (step {t})")).unwrap_or_default();
                let waited = waited.as_secs_f64();
                if *seq > site.seq {
                    // Its part of this collective is done (an all-to-all ends on a rank once
                    // what it sends is out and what it is sent is in): it waits further on.
                    writeln!(s, "  rank {rank}: past it: done with its part, now in {name} #{seq}{step}, waiting {waited:.1} s")
                } else {
                    // At the same number another collective is one rank's skipped or added
                    // call; at an earlier one the peer is behind, waiting on someone.
                    mismatch |= *seq == site.seq;
                    writeln!(
                        s,
                        "  rank {rank}: NOT ARRIVED: it is in {name} #{seq}{step}, waiting {waited:.1} s"
                    )
                }
            }
            PeerState::Decoding { step, busy } => writeln!(
                s,
                "  rank {rank}: NOT ARRIVED: alive, waiting for its own decodes{} for {:.1} s, outside \
                 collectives (decodes slower than the timeout: raise it, or lower decode_timeout_s)",
                step.map(|t| format!(" of step {t}")).unwrap_or_default(),
                busy.as_secs_f64()
            ),
            PeerState::Silent => writeln!(
                s,
                "  rank {rank}: NOT ARRIVED: no answer within {:.1} s (dead, exited, or busy outside \
                 DataHelix collectives)",
                grace.as_secs_f64()
            ),
        };
    }
    if let Some(ranks) = no_data_from.filter(|r| !r.is_empty()) {
        let _ = writeln!(s, "  data still missing from ranks {ranks:?}");
    }
    let silent: Vec<usize> =
        peers.iter().filter(|(_, state)| *state == PeerState::Silent).map(|&(rank, _)| rank).collect();
    if mismatch {
        s.push_str(
            "  The ranks issued different collectives: every rank must call the same collectives in the \
             same order (one rank skipped or added one).\n",
        );
    } else if !silent.is_empty() {
        // The others' places follow from waiting on the silent ones: the cause is there.
        let _ = writeln!(
            s,
            "  Ranks {silent:?} did not answer: dead, stopped, or cut off from this rank's network; look \
             at their hosts first (the others wait on them)."
        );
    }
    let _ = writeln!(
        s,
        "  Aborting the job (exit {exit_code}). If the ranks are only slow, raise the timeout \
         (DATAHELIX_COLLECTIVE_TIMEOUT=seconds)."
    );
    s
}

// ---- SIGTERM reporter ----

const NONE: u64 = u64::MAX;
static RANK: AtomicU64 = AtomicU64::new(NONE);
static OP: AtomicU64 = AtomicU64::new(NONE);
static SEQ: AtomicU64 = AtomicU64::new(0);
static STEP: AtomicU64 = AtomicU64::new(NONE);

/// Records that this rank entered `site` (read by the SIGTERM reporter).
pub fn note_enter(site: &Site) {
    RANK.store(site.rank as u64, Ordering::Relaxed);
    SEQ.store(site.seq, Ordering::Relaxed);
    STEP.store(site.step.unwrap_or(NONE), Ordering::Relaxed);
    OP.store(site.op.code(), Ordering::Release);
}

/// Records that this rank left its collective.
pub fn note_leave() {
    OP.store(NONE, Ordering::Release);
}

/// Installs a SIGTERM handler that writes one line naming the collective this rank is in, then
/// terminates as SIGTERM would. Installed only where SIGTERM still has its default action (an
/// embedding application's own handler is left alone). Returns whether it was installed.
pub fn install_sigterm_reporter() -> bool {
    // SAFETY: sigaction with a null new action only reads the current disposition into `old`.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `old` is a valid writable sigaction.
    if unsafe { libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut old) } != 0
        || old.sa_sigaction != libc::SIG_DFL
    {
        return false;
    }
    // SAFETY: an all-zero sigaction is a valid value to fill in.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t;
    act.sa_flags = libc::SA_RESETHAND;
    // SAFETY: installs a handler that only uses async-signal-safe calls (write, raise) on
    // stack data and atomics.
    unsafe { libc::sigemptyset(&mut act.sa_mask) };
    // SAFETY: as above.
    unsafe { libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut()) == 0 }
}

/// Appends `v` in decimal to `buf` at `at`; returns the new end. Allocation-free.
fn put_u64(buf: &mut [u8], mut at: usize, mut v: u64) -> usize {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    while n > 0 && at < buf.len() {
        n -= 1;
        buf[at] = digits[n];
        at += 1;
    }
    at
}

fn put(buf: &mut [u8], at: usize, s: &[u8]) -> usize {
    let n = s.len().min(buf.len() - at);
    buf[at..at + n].copy_from_slice(&s[..n]);
    at + n
}

/// Formats the SIGTERM line into `buf` without allocating; returns its length.
fn sigterm_line(buf: &mut [u8], rank: u64, op: u64, seq: u64, step: u64) -> usize {
    let mut at = put(buf, 0, b"datahelix: rank ");
    at = if rank == NONE { put(buf, at, b"?") } else { put_u64(buf, at, rank) };
    at = put(buf, at, b" terminated by SIGTERM while ");
    match CollectiveOp::from_code(op) {
        Some(op) => {
            at = put(buf, at, b"in ");
            at = put(buf, at, op.name().as_bytes());
            at = put(buf, at, b" #");
            at = put_u64(buf, at, seq);
            if step != NONE {
                at = put(buf, at, b" (step ");
                at = put_u64(buf, at, step);
                at = put(buf, at, b")");
            }
        }
        None => at = put(buf, at, b"outside collectives"),
    }
    put(
        buf,
        at,
        b"; the launcher is ending the job, usually because another rank died or aborted (see its message)\n",
    )
}

extern "C" fn on_sigterm(sig: libc::c_int) {
    let mut buf = [0u8; 256];
    let n = sigterm_line(
        &mut buf,
        RANK.load(Ordering::Relaxed),
        OP.load(Ordering::Acquire),
        SEQ.load(Ordering::Relaxed),
        STEP.load(Ordering::Relaxed),
    );
    // SAFETY: write(2) and raise(3) are async-signal-safe; buf is a live stack array of n bytes.
    // SA_RESETHAND restored the default action, so raise terminates the process as SIGTERM would.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigterm_line_names_the_collective() {
        let mut buf = [0u8; 256];
        let n = sigterm_line(&mut buf, 3, CollectiveOp::AllToAllV.code(), 12, 7);
        let line = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(
            line.starts_with("datahelix: rank 3 terminated by SIGTERM while in all_to_all_v #12 (step 7);"),
            "{line}"
        );
        let n = sigterm_line(&mut buf, 0, NONE, 0, NONE);
        assert!(std::str::from_utf8(&buf[..n]).unwrap().contains("outside collectives"));
    }

    /// The report of `site` after 3 s (timeout 3 s, questions 1 s) over `peers`.
    fn report_of(site: &Site, peers: &[(usize, PeerState)], no_data_from: Option<&[usize]>) -> String {
        let secs = Duration::from_secs;
        report(site, None, secs(3), secs(3), peers, no_data_from, secs(1), 3)
    }

    #[test]
    fn report_names_missing_peers_and_mismatches() {
        let site = Site { rank: 0, op: CollectiveOp::AllReduce, seq: 5, step: Some(2) };
        let me = encode(&site, Duration::from_millis(2500));
        let other = Site { op: CollectiveOp::Barrier, ..site };
        let peers =
            [(1, decode(&me)), (2, decode(&encode(&other, Duration::from_secs(1)))), (3, PeerState::Silent)];
        let r = report_of(&site, &peers, None);
        assert!(r.contains("rank 0: all_reduce #5 (step 2) did not complete"), "{r}");
        assert!(r.contains("rank 1: arrived"), "{r}");
        assert!(r.contains("rank 2: NOT ARRIVED: it is in barrier #5 (step 2)"), "{r}");
        assert!(r.contains("rank 3: NOT ARRIVED: no answer"), "{r}");
        assert!(r.contains("issued different collectives"), "{r}");
    }

    /// A host cut off from the network mid-step (seen under `tests/multi_host.rs`'s hosts): a
    /// peer that finished its part of the all-to-all has moved on, and the silent ranks are the
    /// cause, not a skipped collective.
    #[test]
    fn report_names_silent_ranks_as_the_cause_and_peers_ahead_as_past_it() {
        let site = Site { rank: 0, op: CollectiveOp::AllToAllV, seq: 382, step: Some(36) };
        let ahead = Site { rank: 1, op: CollectiveOp::AllGather, seq: 385, step: Some(36) };
        let peers = [
            (1, decode(&encode(&ahead, Duration::from_secs(8)))),
            (2, PeerState::Silent),
            (3, PeerState::Silent),
        ];
        let r = report_of(&site, &peers, Some(&[3]));
        assert!(r.contains("rank 1: past it: done with its part, now in all_gather #385 (step 36)"), "{r}");
        assert!(r.contains("Ranks [2, 3] did not answer"), "{r}");
        assert!(!r.contains("issued different collectives"), "{r}");
        // Behind, not at the same number: no mismatch either.
        let behind = Site { rank: 1, op: CollectiveOp::AllReduce, seq: 380, step: Some(36) };
        let r = report_of(&site, &[(1, decode(&encode(&behind, Duration::from_secs(8))))], None);
        assert!(r.contains("rank 1: NOT ARRIVED: it is in all_reduce #380"), "{r}");
        assert!(!r.contains("issued different collectives") && !r.contains("did not answer"), "{r}");
    }
}
