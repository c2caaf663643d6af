//! Fault injection for the multi-rank tests of what peers send, in debug builds only:
//! `DATAHELIX_FAULT=KIND@RANK` makes rank RANK corrupt the first tensor message it sends, the
//! way a peer running another build (or a corrupted one) would. KIND is
//!
//! - `shape`: `[F, H, W, 3]` announced as `[F, H·W, 1, 3]` (the same bytes, another shape);
//! - `oversized`: the header announces 2⁵⁰ uncompressed bytes, zstd-compressed;
//! - `truncated`: the header announces more payload than the message holds;
//! - `stale`: the header names an earlier step;
//! - `replica-oversized` ([`replica_oversized`]): a replica group's leader announces its batch
//!   to its group as 2⁵⁰ bytes;
//! - `replica-ahead-oversized` (the same function): a replica group's leader announces the
//!   first tensor it sends ahead of its batch as 2⁵⁰ bytes;
//! - `replica-state-oversized` (the same function): a replica group's leader announces the
//!   loader state that goes with its batch as 2⁵⁰ bytes.
//!
//! `tests/peer_faults.rs` checks that each one ends the job on every rank with an error naming
//! the rank, the step and what was wrong, without a huge allocation or a hang. Release builds
//! compile none of it: [`injected`] is always `None` there.

/// What a rank's first tensor message gets wrong. (Release builds match on it but never make
/// one: [`injected`] is `None` there.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub(crate) enum Fault {
    Shape,
    Oversized,
    Truncated,
    Stale,
}

/// The fault this rank injects into its next tensor message, once per process.
pub(crate) fn injected(rank: usize) -> Option<Fault> {
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static FIRED: AtomicBool = AtomicBool::new(false);
        let spec = std::env::var("DATAHELIX_FAULT").ok()?;
        let (kind, at) = spec.split_once('@')?;
        if at.parse::<usize>().ok()? != rank || FIRED.swap(true, Ordering::SeqCst) {
            return None;
        }
        match kind {
            "shape" => Some(Fault::Shape),
            "oversized" => Some(Fault::Oversized),
            "truncated" => Some(Fault::Truncated),
            "stale" => Some(Fault::Stale),
            _ => None,
        }
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = rank;
        None
    }
}

/// Whether this rank, the leader of a replica group, announces what it sends next to its group
/// as 2⁵⁰ bytes, once per process: its batch (`kind` `replica-oversized`) or a tensor sent
/// ahead of it (`replica-ahead-oversized`), as `DATAHELIX_FAULT=KIND@RANK` asks (RANK in the
/// leaders' world). Its followers must refuse the length before allocating
/// (`tests/own_comm.rs`).
pub(crate) fn replica_oversized(kind: &str, rank: usize) -> bool {
    #[cfg(debug_assertions)]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static FIRED: AtomicBool = AtomicBool::new(false);
        let Ok(spec) = std::env::var("DATAHELIX_FAULT") else { return false };
        spec.split_once('@')
            .is_some_and(|(asked, at)| asked == kind && at.parse::<usize>().ok() == Some(rank))
            && !FIRED.swap(true, Ordering::SeqCst)
    }
    #[cfg(not(debug_assertions))]
    {
        let _ = (kind, rank);
        false
    }
}

/// Corrupts the message whose header starts at `header` in `send` (see the module docs).
pub(crate) fn corrupt(send: &mut [u8], header: usize, fault: Fault) {
    use super::exchange::at;
    let h = &mut send[header..header + super::exchange::HEADER];
    let u32_at = |h: &[u8], i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |h: &[u8], i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or([0; 8]));
    match fault {
        Fault::Shape => {
            // [F, H, W, 3] -> [F, H·W, 1, 3]: the same bytes and frames (and frame times),
            // another shape.
            let (height, width) = (u32_at(h, at::SHAPE + 4), u32_at(h, at::SHAPE + 8));
            h[at::SHAPE + 4..at::SHAPE + 8].copy_from_slice(&height.wrapping_mul(width).to_le_bytes());
            h[at::SHAPE + 8..at::SHAPE + 12].copy_from_slice(&1u32.to_le_bytes());
        }
        Fault::Oversized => {
            h[at::COMPRESSED] = 1;
            h[at::RAW_LEN..at::RAW_LEN + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
        }
        Fault::Truncated => {
            let wire = u64_at(h, at::WIRE_LEN);
            h[at::WIRE_LEN..at::WIRE_LEN + 8].copy_from_slice(&(wire + 4096).to_le_bytes());
        }
        Fault::Stale => {
            let step = u64_at(h, at::STEP);
            h[at::STEP..at::STEP + 8].copy_from_slice(&step.wrapping_sub(1).to_le_bytes());
        }
    }
}
