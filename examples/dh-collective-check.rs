//! Multi-rank test driver for the collective layer, launched by `tests/collective_*.rs` under
//! `mpirun -np N` (it also runs without a launcher, as a world of one rank). Every rank asserts on
//! what it received; the exit status is non-zero if any rank saw a wrong byte.
//!
//! ```text
//! dh-collective-check semantics [--large]   all collectives, zero/uneven/empty sizes, provenance check
//! dh-collective-check kill --at K           the last rank kills itself (SIGKILL) at step K
//! dh-collective-check skip --at K           rank 1 skips the all-reduce of step K
//! dh-collective-check stop --at K [--device] the last rank stops itself (SIGSTOP) at step K
//! ```
//! `stop --device` (HCCL only) steps with all-gathers of device buffers instead of all-reduces.
//! `--backend hccl` (a build with the `hccl` feature) runs the same checks on the HCCL backend.
//! The watchdog timeout comes from `DATAHELIX_COLLECTIVE_TIMEOUT`.

use std::time::Duration;

use datahelix::collective::reference::{self, AllToAllVArgs, Segment};
use datahelix::collective::{check, cost::TransferModel, prefix_sums, Collective, ReduceOp};
use datahelix::comm::{self, Backend, Config, World};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("");
    let at: u64 = args
        .iter()
        .position(|a| a == "--at")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dh-collective-check: {e}");
            std::process::exit(2);
        }
    };
    let backend: Backend = match args.iter().position(|a| a == "--backend").map(|i| args.get(i + 1)) {
        None => Backend::Mpi,
        Some(v) => match v.map(|v| v.parse()) {
            Some(Ok(b)) => b,
            Some(Err(e)) => {
                eprintln!("dh-collective-check: {e}");
                std::process::exit(2);
            }
            None => {
                eprintln!("dh-collective-check: --backend needs a value (mpi or hccl)");
                std::process::exit(2);
            }
        },
    };
    let mut world = match comm::init_backend(config, backend) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("dh-collective-check: {e}");
            std::process::exit(2);
        }
    };
    let code = match mode {
        "semantics" => semantics(&mut world, args.iter().any(|a| a == "--large")),
        "kill" => kill(world.collective(), at),
        "skip" => skip(world.collective(), at),
        "stop" if args.iter().any(|a| a == "--device") => stop_device(&world, at),
        "stop" => stop(world.collective(), at),
        "short" => short(world.collective()),
        _ => {
            eprintln!(
                "usage: dh-collective-check semantics [--large] | kill --at K | skip --at K | stop --at K \
                 [--device] | short [--backend mpi|hccl]"
            );
            2
        }
    };
    drop(world);
    std::process::exit(code);
}

/// Bytes rank `src` sends to rank `dst` in a scenario.
type CountFn = Box<dyn Fn(usize, usize) -> usize>;

/// Per-rank failures, reported at the end.
struct Checks {
    rank: usize,
    run: u64,
    failures: Vec<String>,
}

impl Checks {
    fn expect(&mut self, ok: bool, what: impl FnOnce() -> String) {
        self.run += 1;
        if !ok {
            self.failures.push(what());
        }
    }

    fn verify(&mut self, name: &str, recv: &[u8], segs: &[Segment]) {
        let (wrong, first) = reference::verify(self.rank, recv, segs);
        self.expect(wrong == 0, || {
            format!("{name}: {wrong} wrong bytes; first: {}", first.unwrap_or_default())
        });
    }
}

/// Every rank's all-to-all-v arguments for a count function `count(src, dst)`. Send blocks are
/// packed in rank order, or in reverse with gaps; receive blocks always in reverse with gaps.
fn layout(n: usize, count: &dyn Fn(usize, usize) -> usize, reverse_send: bool) -> Vec<AllToAllVArgs> {
    let place = |counts: &[usize], reverse: bool, gap: usize| -> (Vec<usize>, usize) {
        let mut displs = vec![0; counts.len()];
        let mut at = 0;
        let order: Vec<usize> =
            if reverse { (0..counts.len()).rev().collect() } else { (0..counts.len()).collect() };
        for p in order {
            displs[p] = at;
            at += counts[p] + gap;
        }
        (displs, at)
    };
    (0..n)
        .map(|r| {
            let send_counts: Vec<usize> = (0..n).map(|d| count(r, d)).collect();
            let recv_counts: Vec<usize> = (0..n).map(|s| count(s, r)).collect();
            let (send_displs, send_len) = if reverse_send {
                place(&send_counts, true, 3)
            } else {
                (prefix_sums(&send_counts), send_counts.iter().sum())
            };
            let (recv_displs, recv_len) = place(&recv_counts, true, 5);
            AllToAllVArgs { send_counts, send_displs, recv_counts, recv_displs, send_len, recv_len }
        })
        .collect()
}

fn run_all_to_all_v(c: &dyn Collective, checks: &mut Checks, name: &str, args: &[AllToAllVArgs]) {
    let r = c.rank();
    let a = &args[r];
    let mut send = vec![0u8; a.send_len];
    check::fill(r, 0, &mut send);
    let segs = reference::all_to_all_v_sources(args, r);
    let mut recv = vec![0u8; a.recv_len];
    reference::poison_outside(&mut recv, &segs);
    match c.all_to_all_v(&send, &a.send_counts, &a.send_displs, &mut recv, &a.recv_counts, &a.recv_displs) {
        Ok(()) => checks.verify(name, &recv, &segs),
        Err(e) => checks.expect(false, || format!("{name}: {e}")),
    }
}

fn semantics(world: &mut World, large: bool) -> i32 {
    let (rank, n) = (world.collective().rank(), world.collective().size());
    let mut checks = Checks { rank, run: 0, failures: Vec::new() };
    let scenarios: Vec<(&str, CountFn)> = vec![
        ("uniform", Box::new(|_, _| 1000)),
        ("all-zero", Box::new(|_, _| 0)),
        ("one-byte", Box::new(|_, _| 1)),
        ("uneven", Box::new(|s, d| if (s + d) % 3 == 0 { 0 } else { (s * 7919 + d * 104_729) % 5001 })),
        ("last-rank-sends-nothing", Box::new(move |s, d| if s == n - 1 { 0 } else { 3000 + s + d })),
        ("rank-0-receives-nothing", Box::new(|s, d| if d == 0 { 0 } else { 777 * (s + 1) })),
        ("only-self", Box::new(|s, d| if s == d { 4096 + s } else { 0 })),
    ];
    for max_message in [None, Some(1000usize)] {
        if let (World::Mpi(w), Some(m)) = (&mut *world, max_message) {
            w.set_max_message_bytes(m);
        }
        let c = world.collective();
        let tag = if max_message.is_some() { "chunked" } else { "direct" };
        for (name, count) in &scenarios {
            for reverse in [false, true] {
                let args = layout(n, count.as_ref(), reverse);
                run_all_to_all_v(
                    c,
                    &mut checks,
                    &format!("all_to_all_v {name} {tag} reverse={reverse}"),
                    &args,
                );
            }
        }
        // all_gather of fixed sizes, including zero.
        for len in [0usize, 1, 1000, 65_537] {
            let mut send = vec![0u8; len];
            check::fill(rank, 0, &mut send);
            let counts = vec![len; n];
            let displs: Vec<usize> = (0..n).map(|p| p * len).collect();
            let segs = reference::all_gather_v_sources(&counts, &displs);
            let mut recv = vec![0u8; n * len];
            reference::poison_outside(&mut recv, &segs);
            match c.all_gather(&send, &mut recv) {
                Ok(()) => checks.verify(&format!("all_gather {len} {tag}"), &recv, &segs),
                Err(e) => checks.expect(false, || format!("all_gather {len}: {e}")),
            }
        }
        // all_gather_v: uneven, rank 1 contributes nothing, blocks in reverse with gaps.
        let counts: Vec<usize> = (0..n).map(|p| if p == 1 { 0 } else { 1500 + 333 * p }).collect();
        let mut displs = vec![0; n];
        let mut at = 0;
        for p in (0..n).rev() {
            displs[p] = at;
            at += counts[p] + 7;
        }
        let mut send = vec![0u8; counts[rank]];
        check::fill(rank, 0, &mut send);
        let segs = reference::all_gather_v_sources(&counts, &displs);
        let mut recv = vec![0u8; at];
        reference::poison_outside(&mut recv, &segs);
        match c.all_gather_v(&send, &counts, &displs, &mut recv) {
            Ok(()) => checks.verify(&format!("all_gather_v {tag}"), &recv, &segs),
            Err(e) => checks.expect(false, || format!("all_gather_v: {e}")),
        }
        // Broadcast from every root, sizes 0, 1, 100 000.
        for root in 0..n {
            for len in [0usize, 1, 100_000] {
                let mut data = vec![0u8; len];
                if rank == root {
                    check::fill(root, 0, &mut data);
                } else {
                    check::poison(root, 0, &mut data);
                }
                match c.broadcast(root, &mut data) {
                    Ok(()) => {
                        let (wrong, _) = check::mismatches(root, 0, &data);
                        checks.expect(wrong == 0, || {
                            format!("broadcast root {root} len {len} {tag}: {wrong} wrong")
                        });
                    }
                    Err(e) => checks.expect(false, || format!("broadcast: {e}")),
                }
            }
        }
        // Reductions, including an empty one.
        let nf = n as f64;
        let mut f = [rank as f64 + 0.5, 1.0, -(rank as f64)];
        let ok = c.all_reduce_f64(&mut f, ReduceOp::Sum).is_ok();
        checks.expect(ok && f == [nf * (nf - 1.0) / 2.0 + nf * 0.5, nf, -(nf * (nf - 1.0) / 2.0)], || {
            format!("all_reduce f64 sum: {f:?}")
        });
        let mut f = [rank as f64, -(rank as f64)];
        let ok = c.all_reduce_f64(&mut f, ReduceOp::Max).is_ok();
        checks.expect(ok && f == [nf - 1.0, 0.0], || format!("all_reduce f64 max: {f:?}"));
        let mut u = [rank as u64 + 1, 10 * rank as u64];
        let ok = c.all_reduce_u64(&mut u, ReduceOp::Min).is_ok();
        checks.expect(ok && u == [1, 0], || format!("all_reduce u64 min: {u:?}"));
        let mut u = [rank as u64 + 1, u64::MAX - rank as u64];
        let ok = c.all_reduce_u64(&mut u, ReduceOp::Max).is_ok();
        checks.expect(ok && u == [n as u64, u64::MAX], || format!("all_reduce u64 max: {u:?}"));
        let mut u = [1u64; 3000];
        let ok = c.all_reduce_u64(&mut u, ReduceOp::Sum).is_ok();
        checks.expect(ok && u.iter().all(|&x| x == n as u64), || {
            "all_reduce u64 sum of 3000 (chunked) wrong".into()
        });
        let mut empty: [f64; 0] = [];
        let ok = c.all_reduce_f64(&mut empty, ReduceOp::Sum).is_ok();
        checks.expect(ok, || "empty all_reduce failed".into());
        checks.expect(c.barrier().is_ok(), || "barrier failed".into());
    }
    let c = world.collective();
    // Provided helpers.
    let mut mine = vec![0u8; rank * 3];
    check::fill(rank, 0, &mut mine);
    match c.all_gather_v_vec(&mine, usize::MAX) {
        Ok(all) => checks.expect(
            all.len() == n
                && all.iter().enumerate().all(|(p, b)| b.len() == p * 3 && check::mismatches(p, 0, b).0 == 0),
            || "all_gather_v_vec wrong".into(),
        ),
        Err(e) => checks.expect(false, || format!("all_gather_v_vec: {e}")),
    }
    // A size above the bound (the last rank's) is refused on every rank before allocating, and
    // no rank goes on to the data all-gather without the others.
    if n > 1 {
        match c.all_gather_v_vec(&mine, (n - 1) * 3 - 1) {
            Ok(_) => checks.expect(false, || "all_gather_v_vec took a size above its bound".into()),
            Err(e) => checks.expect(e.to_string().contains(&format!("rank {} announced", n - 1)), || {
                format!("all_gather_v_vec over its bound: {e}")
            }),
        }
    }
    let blocks: Vec<Vec<u8>> = (0..n)
        .map(|p| {
            let mut b = vec![0u8; (rank + p) % 4 * 100];
            check::fill(rank, p * 10_000, &mut b);
            b
        })
        .collect();
    match c.all_to_all_v_vec(&blocks, usize::MAX) {
        Ok(got) => checks.expect(
            got.iter().enumerate().all(|(p, b)| {
                b.len() == (p + rank) % 4 * 100 && check::mismatches(p, rank * 10_000, b).0 == 0
            }),
            || "all_to_all_v_vec wrong".into(),
        ),
        Err(e) => checks.expect(false, || format!("all_to_all_v_vec: {e}")),
    }
    // Sparse exchange: rank r sends to p only when (r + p) % 3 == 1; everyone else is left out.
    // Odd ranks send empty blocks (announced, zero bytes).
    let pairs = |a: usize, b: usize| a != b && (a + b) % 3 == 1;
    let size = |r: usize| (r + 1) % 2 * (r + 1) * 37;
    let blocks: Vec<Vec<u8>> = (0..n)
        .map(|p| {
            let mut b = if pairs(rank, p) { vec![0u8; size(rank)] } else { Vec::new() };
            check::fill(rank, p * 10_000, &mut b);
            b
        })
        .collect();
    let expect: Vec<bool> = (0..n).map(|p| pairs(p, rank)).collect();
    let send: Vec<bool> = (0..n).map(|p| pairs(rank, p)).collect();
    match c.exchange_vec(&blocks, &send, &expect, usize::MAX) {
        Ok(got) => checks.expect(
            got.iter().enumerate().all(|(p, b)| {
                if pairs(p, rank) {
                    b.len() == size(p) && check::mismatches(p, rank * 10_000, b).0 == 0
                } else {
                    b.is_empty()
                }
            }),
            || "exchange_vec wrong".into(),
        ),
        Err(e) => checks.expect(false, || format!("exchange_vec: {e}")),
    }
    // Bad arguments (the same on every rank) are errors on every rank, not hangs.
    let mut recv = vec![0u8; 4];
    let bad = c.all_to_all_v(&[0u8; 4], &vec![4; n], &vec![0; n], &mut recv, &vec![4; n], &vec![1; n]);
    checks.expect(
        matches!(&bad, Err(e) if e.to_string().contains("all_to_all_v") && e.to_string().contains(&format!("rank {rank}"))),
        || format!("bad all_to_all_v layout not rejected: {bad:?}"),
    );
    // Transfer-cost model: calibrated on every rank, identical everywhere.
    match TransferModel::calibrate(c, &[1 << 10, 1 << 14, 1 << 16], 2).and_then(|m| m.agree(c)) {
        Ok(m) => {
            let text = serde_json::to_string(&m).unwrap_or_default();
            let hash = text
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
            checks.expect(c.agree(hash).unwrap_or(false), || "transfer models differ between ranks".into());
            checks.expect(m.predict(1 << 20) > 0.0, || format!("model predicts nothing: {m:?}"));
        }
        Err(e) => checks.expect(false, || format!("calibration: {e}")),
    }
    if large {
        // Buffers beyond 64 MiB, uneven per peer; once direct, once through the chunked path.
        let per = (66usize << 20) / n + 1;
        for max_message in [None, Some(16usize << 20)] {
            if let (World::Mpi(w), Some(m)) = (&mut *world, max_message) {
                w.set_max_message_bytes(m);
            }
            let args = layout(n, &|s, d| per + 4099 * s + 17 * d, false);
            run_all_to_all_v(
                world.collective(),
                &mut checks,
                &format!("large all_to_all_v max_message={max_message:?}"),
                &args,
            );
        }
    }
    let c = world.collective();
    let mut failed = [checks.failures.len() as u64];
    if let Err(e) = c.all_reduce_u64(&mut failed, ReduceOp::Sum) {
        checks.failures.push(format!("final all_reduce: {e}"));
        failed[0] += 1;
    }
    for f in &checks.failures {
        eprintln!("rank {rank}: FAILED {f}");
    }
    println!(
        "rank {rank}/{n}: {} checks, {} failed here, {} failed in the job",
        checks.run,
        checks.failures.len(),
        failed[0]
    );
    i32::from(failed[0] != 0)
}

fn kill(c: &dyn Collective, at: u64) -> i32 {
    let n = c.size();
    for step in 0..1000u64 {
        c.set_step(Some(step));
        if step == at && c.rank() == n - 1 {
            eprintln!("rank {}: killing myself (SIGKILL) at step {step}", c.rank());
            // SAFETY: kill(2) on our own pid with a valid signal number has no memory effects.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let counts = vec![1024usize; n];
        let displs = prefix_sums(&counts);
        let send = vec![7u8; 1024 * n];
        let mut recv = vec![0u8; 1024 * n];
        if let Err(e) = c.all_to_all_v(&send, &counts, &displs, &mut recv, &counts, &displs) {
            eprintln!("{e}");
            return 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    0
}

/// The last rank stops itself (SIGSTOP) at step `at`: alive, silent, never answering.
fn stop(c: &dyn Collective, at: u64) -> i32 {
    let n = c.size();
    for step in 0..1000u64 {
        c.set_step(Some(step));
        if step == at && c.rank() == n - 1 {
            eprintln!("rank {}: stopping myself (SIGSTOP) at step {step}", c.rank());
            // SAFETY: raise(3) with a valid signal number has no memory effects.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        let mut x = [1u64];
        if let Err(e) = c.all_reduce_u64(&mut x, ReduceOp::Sum) {
            eprintln!("{e}");
            return 1;
        }
    }
    0
}

/// [`stop`] with an all-gather of device buffers a step (the HCCL backend's device methods).
fn stop_device(world: &World, at: u64) -> i32 {
    #[cfg(feature = "hccl")]
    if let World::Hccl(h) = world {
        use datahelix::comm::hccl::DataType;
        let (rank, n) = (h.rank(), h.size());
        let (Ok(mut send), Ok(mut recv)) = (h.alloc(8), h.alloc(8 * n)) else {
            eprintln!("rank {rank}: cannot allocate device memory");
            return 1;
        };
        if let Err(e) = send.write(0, &(rank as u64).to_le_bytes()) {
            eprintln!("rank {rank}: {e}");
            return 1;
        }
        for step in 0..1000u64 {
            h.set_step(Some(step));
            if step == at && rank == n - 1 {
                eprintln!("rank {rank}: stopping myself (SIGSTOP) at step {step}");
                // SAFETY: raise(3) with a valid signal number has no memory effects.
                unsafe { libc::raise(libc::SIGSTOP) };
            }
            if let Err(e) = h.all_gather_device(&send, &mut recv, 1, DataType::U64) {
                eprintln!("rank {rank}: all_gather_device: {e}");
                return 1;
            }
        }
        return 0;
    }
    eprintln!("dh-collective-check: stop --device needs --backend hccl (a build with the hccl feature)");
    let _ = (world, at);
    2
}

/// Rank 0 sends rank 1 half of what rank 1 expects, in an all-to-all-v that goes point to
/// point (run with `DATAHELIX_MPI_MAX_MESSAGE` below 200): the receive's count check must catch
/// it; exit 0 means the short message went unnoticed.
fn short(c: &dyn Collective) -> i32 {
    let n = c.size();
    // Rank s sends rank d `send(s, d)` bytes; rank d expects `expect(s, d)`.
    let send = |s: usize, d: usize| if s == 0 && d == 1 { 100 } else { 200 };
    let send_counts: Vec<usize> = (0..n).map(|d| send(c.rank(), d)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|s| if s == c.rank() { send(s, s) } else { 200 }).collect();
    let (sd, rd) = (prefix_sums(&send_counts), prefix_sums(&recv_counts));
    let data = vec![5u8; send_counts.iter().sum()];
    let mut recv = vec![0u8; recv_counts.iter().sum()];
    match c.all_to_all_v(&data, &send_counts, &sd, &mut recv, &recv_counts, &rd) {
        Ok(()) => {
            eprintln!("rank {}: all_to_all_v completed", c.rank());
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn skip(c: &dyn Collective, at: u64) -> i32 {
    for step in 0..10u64 {
        c.set_step(Some(step));
        if step == at && c.rank() == 1 {
            eprintln!("rank 1: skipping the all_reduce of step {step}");
            continue;
        }
        let mut x = [1u64];
        if let Err(e) = c.all_reduce_u64(&mut x, ReduceOp::Sum) {
            eprintln!("{e}");
            return 1;
        }
    }
    0
}
