//! The links of this world, measured at start-up: which ranks share a node, and the transfer
//! model of each class of link (a node's own links, the network between nodes), agreed by every
//! rank so that every rank plans with the same model.
//!
//! ```
//! use datahelix::collective::LocalWorld;
//! use datahelix::exec::links::measure_transfer_model;
//! let world = LocalWorld::new();
//! let links = measure_transfer_model(&world).unwrap();
//! assert!(!links.has_classes()); // one rank, one node
//! ```
//!
//! A rank's node is the `DATAHELIX_NODE` environment variable where set, else its host name.
//! Set it where host names do not tell nodes apart (containers with their own host names on one
//! machine), or to measure two groups of ranks on one machine as if they were two nodes.

use crate::collective::cost::TransferModel;
use crate::collective::{Collective, ReduceOp};
use crate::plan::TransferCost;

use super::loader::ExecError;

/// Per-peer message sizes of the transfer calibration: eager, mid-size and bulk messages.
const TRANSFER_SIZES: [usize; 4] = [1 << 10, 64 << 10, 512 << 10, 2 << 20];

/// Timed exchanges per size (after one warm-up).
const ITERS: usize = 3;

/// Longest node name compared (a host name is at most 255 bytes; longer values are cut).
const MAX_NODE_NAME: usize = 255;

/// The transfer model of this world's links, measured: the ranks' node names all-gathered into
/// a node table; then, per class of link present (within a node, between nodes), all-to-all-v
/// exchanges of each of `TRANSFER_SIZES` (1 KiB, 64 KiB, 512 KiB, 2 MiB) to every peer of that class, timed three times
/// after a warm-up, the times max-reduced over ranks and fitted per size band
/// ([`TransferModel`]); then rank 0's models broadcast. Where every node holds one rank, the
/// network's model serves both classes; on one node there is one class and no table. A few
/// dozen collectives, milliseconds on a host's shared memory. **Collective.**
pub fn measure_transfer_model(world: &dyn Collective) -> Result<TransferCost, ExecError> {
    let rank = world.rank();
    let fail = |e: String| ExecError::Invalid(format!("rank {rank}: transfer calibration: {e}"));
    let node_of = node_table(world, &node_name())?;
    let me = node_of[rank];
    // Every rank must agree on which classes to measure: count peers of each, max over ranks.
    let near_here = node_of.iter().enumerate().filter(|&(p, &n)| p != rank && n == me).count();
    let far_here = node_of.iter().filter(|&&n| n != me).count();
    let mut present = [near_here as u64, far_here as u64];
    world.all_reduce_u64(&mut present, ReduceOp::Max)?;
    let measure = |peer: &dyn Fn(usize) -> bool| {
        TransferModel::calibrate_among(world, &TRANSFER_SIZES, ITERS, peer)
            .and_then(|m| m.agree(world))
            .map(|m| TransferCost::from(&m))
            .map_err(|e| fail(e.to_string()))
    };
    let near = if present[0] > 0 { Some(measure(&|p| node_of[p] == me)?) } else { None };
    let far = if present[1] > 0 { Some(measure(&|p| node_of[p] != me)?) } else { None };
    Ok(match (near, far) {
        (Some(near), Some(far)) => TransferCost::per_node(&near, &far, node_of),
        (Some(one), None) | (None, Some(one)) => one,
        // A world of one rank: nothing to measure.
        (None, None) => crate::policy::default_transfer(),
    })
}

/// This rank's node: `DATAHELIX_NODE` where set and not empty, else the host name.
pub fn node_name() -> String {
    match std::env::var("DATAHELIX_NODE") {
        Ok(v) if !v.trim().is_empty() => v.trim().to_string(),
        _ => host_name(),
    }
}

fn host_name() -> String {
    let mut buf = [0u8; MAX_NODE_NAME + 1];
    // SAFETY: `buf` is writable for its whole length, which is what we pass; gethostname writes
    // at most that many bytes and we read only up to the first NUL within the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Per rank, the node it runs on as dense ids in the order nodes first appear by rank (rank 0's
/// node is 0). **Collective**: an all-gather of fixed-size names.
pub fn node_table(world: &dyn Collective, name: &str) -> Result<Vec<u32>, ExecError> {
    let mut mine = [0u8; MAX_NODE_NAME];
    let bytes = name.as_bytes();
    let len = bytes.len().min(MAX_NODE_NAME);
    mine[..len].copy_from_slice(&bytes[..len]);
    let mut all = vec![0u8; MAX_NODE_NAME * world.size()];
    world.all_gather(&mine, &mut all)?;
    Ok(dense_ids(all.chunks(MAX_NODE_NAME)))
}

/// Dense ids of the names in order of first appearance.
fn dense_ids<'a>(names: impl Iterator<Item = &'a [u8]>) -> Vec<u32> {
    let mut ids: std::collections::HashMap<&[u8], u32> = std::collections::HashMap::new();
    names
        .map(|n| {
            let next = ids.len() as u32;
            *ids.entry(n).or_insert(next)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_numbered_as_they_first_appear() {
        let names: [&[u8]; 5] = [b"b", b"a", b"b", b"c", b"a"];
        assert_eq!(dense_ids(names.into_iter()), vec![0, 1, 0, 2, 1]);
    }

    #[test]
    fn one_rank_gets_one_class_and_no_table() {
        let world = crate::collective::LocalWorld::new();
        assert_eq!(node_table(&world, "n1").unwrap(), vec![0]);
        let t = measure_transfer_model(&world).unwrap();
        assert!(!t.has_classes());
        assert!(t.node_of.is_empty());
    }

    #[test]
    fn the_host_name_is_not_empty() {
        assert!(!host_name().is_empty());
    }
}
