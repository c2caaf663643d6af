//! `datahelix perf OP`: a collective microbenchmark shaped like nccl-tests, run under `mpirun`.
//!
//! ```text
//! mpirun -np 4 datahelix perf alltoallv -b 64K -e 16M -f 4 -w 5 -n 20 -c 1 --raw
//! ```
//! One row per size (`size` = bytes per peer): `size count type time_us algbw busbw wrong`, with
//! algbw in GB/s (10^9 B/s) and busbw = algbw·(n−1)/n for allgather and alltoallv, algbw·2(n−1)/n
//! for allreduce, algbw for broadcast (nccl-tests' conventions; algbw counts the whole buffer,
//! `n · size`, for allgather and alltoallv). `time_us` is the slowest rank's mean. With `-c 1`
//! every received byte is checked against its sender's rank/offset pattern and `wrong` counts the
//! bad bytes over all ranks; the exit status is 1 if any is wrong.
//!
//! `--raw` times the same sweep straight on MPI (blocking `MPI_Alltoallv`, `MPI_Allgather`,
//! `MPI_Allreduce`, `MPI_Bcast` on the same communicator; no trait, no watchdog) in the same
//! process, alternating iteration by iteration with the layer, and adds `raw_time_us`,
//! `raw_busbw`, `raw_wrong` and `busbw_ratio` (layer / raw) to each row. Every row also carries
//! the median time (`time_us_median`, and with `--raw` `raw_time_us_median`, `busbw_ratio_median`):
//! on a shared machine a few descheduled iterations dominate the mean, not the median.
//!
//! `--backend hccl` (a build with the `hccl` feature) measures the HCCL backend; `--raw` then
//! times straight MPI on its bootstrap communicator, so the ratio compares HCCL with MPI.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::{CliError, EXIT_FAILURES};
use crate::collective::{check, Collective, ReduceOp};
use crate::comm::{self, mpi::raw::OwnedComm, Backend, Config};

/// The collective to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PerfOp {
    /// `all_gather`: `size` bytes from every rank to every rank.
    Allgather,
    /// `all_to_all_v`: `size` bytes from every rank to every rank (itself included).
    Alltoallv,
    /// `all_reduce_f64` (sum) of `size` bytes of doubles.
    Allreduce,
    /// `broadcast` of `size` bytes from rank 0.
    Broadcast,
}

impl PerfOp {
    fn name(self) -> &'static str {
        match self {
            PerfOp::Allgather => "allgather",
            PerfOp::Alltoallv => "alltoallv",
            PerfOp::Allreduce => "allreduce",
            PerfOp::Broadcast => "broadcast",
        }
    }
}

/// Arguments of `datahelix perf`.
#[derive(Debug, Args)]
pub struct PerfArgs {
    /// Collective to measure.
    #[arg(value_enum)]
    pub op: PerfOp,
    /// Smallest size, bytes per peer (suffixes K, M, G = 2^10, 2^20, 2^30).
    #[arg(short = 'b', long = "minbytes", default_value = "32K", value_parser = parse_size)]
    pub min_bytes: usize,
    /// Largest size, bytes per peer.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub max_bytes: usize,
    /// Multiplication factor between sizes (at least 2).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Check every received byte (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u8,
    /// Also time the same sweep straight on MPI, in the same process.
    #[arg(long)]
    pub raw: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write the JSON document to this file instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Collective backend: mpi or hccl.
    #[arg(long, default_value = "mpi")]
    pub backend: Backend,
    /// Watchdog timeout in seconds (default: DATAHELIX_COLLECTIVE_TIMEOUT, else 300).
    #[arg(long)]
    pub timeout: Option<f64>,
}

/// Parses `64K`, `16M`, `1G` or a plain byte count.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))
}

/// One row of the table / JSON (`shared/CLI.md` keys first).
#[derive(Debug, Serialize)]
pub struct Row {
    /// Bytes per peer.
    pub size: usize,
    /// Elements per peer.
    pub count: usize,
    /// Element type.
    #[serde(rename = "type")]
    pub type_: &'static str,
    /// Mean time per collective, slowest rank, microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
    /// Wrong bytes over all ranks (0 when not checked).
    pub wrong: u64,
    /// `--raw`: the same for straight MPI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_time_us: Option<f64>,
    /// `--raw`: straight MPI's bus bandwidth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_busbw: Option<f64>,
    /// `--raw`: wrong bytes of straight MPI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_wrong: Option<u64>,
    /// `--raw`: busbw / raw_busbw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw_ratio: Option<f64>,
    /// Median time per collective (slowest rank's median), microseconds: robust to the stalls
    /// of a shared machine, where the mean is not.
    pub time_us_median: f64,
    /// `--raw`: straight MPI's median time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw_time_us_median: Option<f64>,
    /// `--raw`: busbw ratio from the medians (raw median time / layer median time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busbw_ratio_median: Option<f64>,
}

#[derive(Serialize)]
struct Doc<'a> {
    op: &'static str,
    ranks: usize,
    backend: &'static str,
    raw: bool,
    rows: &'a [Row],
    warmup: usize,
    iters: usize,
    check: bool,
}

/// Buffers of one size, shared by the layer and the raw runs.
struct Bufs {
    send: Vec<u8>,
    recv: Vec<u8>,
    fsend: Vec<f64>,
    frecv: Vec<f64>,
    counts: Vec<usize>,
    displs: Vec<usize>,
    icounts: Vec<i32>,
    idispls: Vec<i32>,
}

/// Runs `datahelix perf`.
pub fn run(args: PerfArgs) -> Result<i32, CliError> {
    if args.factor < 2 {
        return Err(CliError::usage(format!("-f {} : the step factor must be at least 2", args.factor)));
    }
    if args.min_bytes == 0 || args.min_bytes > args.max_bytes {
        return Err(CliError::usage(format!(
            "-b {} -e {}: sizes must satisfy 0 < min <= max",
            args.min_bytes, args.max_bytes
        )));
    }
    let mut config = Config::from_env().map_err(|e| CliError::usage(e.to_string()))?;
    if let Some(t) = args.timeout {
        if !(t.is_finite() && t > 0.0) {
            return Err(CliError::usage(format!("--timeout {t}: must be a positive number of seconds")));
        }
        config.timeout = Duration::from_secs_f64(t);
    }
    let world = comm::init_backend(config, args.backend)
        .map_err(|e| CliError { code: EXIT_FAILURES + 2, message: e.to_string() })?;
    let raw_comm: Option<&OwnedComm> = match (world.mpi_world(), args.raw) {
        (Some(w), true) => Some(w.raw()),
        (None, true) => {
            return Err(CliError::usage("--raw measures against MPI: launch under mpirun (even with -np 1)"))
        }
        _ => None,
    };
    let c = world.collective();
    let n = c.size();
    let mut sizes = Vec::new();
    let mut s = args.min_bytes;
    while s <= args.max_bytes {
        sizes.push(s);
        s = match s.checked_mul(args.factor) {
            Some(v) => v,
            None => break,
        };
    }
    if raw_comm.is_some() && sizes.iter().any(|&s| s.checked_mul(n).is_none_or(|t| t > i32::MAX as usize)) {
        return Err(CliError::usage("--raw: sizes x ranks must stay below 2^31 bytes (MPI int counts)"));
    }
    if c.rank() == 0 && !args.json {
        println!(
            "# datahelix perf {}: {n} ranks, backend {}, warmup {}, iters {}, check {}{}",
            args.op.name(),
            c.backend(),
            args.warmup,
            args.iters,
            args.check,
            if args.raw { ", raw MPI measured alternately in the same run" } else { "" }
        );
        print!(
            "# {:>12} {:>12} {:>7} {:>10} {:>8} {:>8} {:>7}",
            "size", "count", "type", "time(us)", "algbw", "busbw", "#wrong"
        );
        if args.raw {
            print!(
                " {:>12} {:>10} {:>7} {:>10} {:>10} {:>9}",
                "raw time(us)", "raw busbw", "ratio", "med(us)", "raw med", "med ratio"
            );
        }
        println!();
    }
    let mut rows = Vec::new();
    for &size in &sizes {
        let row = measure(c, raw_comm, &args, size)
            .map_err(|e| CliError { code: EXIT_FAILURES + 2, message: e })?;
        if c.rank() == 0 && !args.json {
            print!(
                "  {:>12} {:>12} {:>7} {:>10.1} {:>8.3} {:>8.3} {:>7}",
                row.size, row.count, row.type_, row.time_us, row.algbw, row.busbw, row.wrong
            );
            if let (Some(t), Some(b), Some(r)) = (row.raw_time_us, row.raw_busbw, row.busbw_ratio) {
                print!(" {t:>12.1} {b:>10.3} {r:>7.3}");
            }
            if let (Some(rm), Some(mr)) = (row.raw_time_us_median, row.busbw_ratio_median) {
                print!(" {:>10.1} {rm:>10.1} {mr:>9.3}", row.time_us_median);
            }
            println!();
            let _ = std::io::stdout().flush();
        }
        rows.push(row);
    }
    let wrong: u64 = rows.iter().map(|r| r.wrong + r.raw_wrong.unwrap_or(0)).sum();
    if c.rank() == 0 && (args.json || args.out.is_some()) {
        let doc = Doc {
            op: args.op.name(),
            ranks: n,
            backend: c.backend(),
            raw: args.raw,
            rows: &rows,
            warmup: args.warmup,
            iters: args.iters,
            check: args.check != 0,
        };
        let text = serde_json::to_string_pretty(&doc).map_err(|e| CliError::usage(e.to_string()))?;
        match &args.out {
            Some(path) => std::fs::write(path, text + "\n")
                .map_err(|e| CliError::usage(format!("--out {}: {e}", path.display())))?,
            None => println!("{text}"),
        }
    }
    if c.rank() == 0 && wrong > 0 {
        eprintln!("datahelix perf: {wrong} wrong bytes");
    }
    drop(world);
    Ok(if wrong > 0 { EXIT_FAILURES } else { 0 })
}

fn bufs(op: PerfOp, n: usize, size: usize) -> Bufs {
    let total = match op {
        PerfOp::Allgather | PerfOp::Alltoallv => n * size,
        _ => size,
    };
    let counts = vec![size; n];
    let displs: Vec<usize> = (0..n).map(|p| p * size).collect();
    let elems = if op == PerfOp::Allreduce { size / 8 } else { 0 };
    Bufs {
        send: vec![0u8; if op == PerfOp::Allgather { size } else { total }],
        recv: vec![0u8; total],
        fsend: vec![0.0; elems],
        frecv: vec![0.0; elems],
        icounts: counts.iter().map(|&c| c as i32).collect(),
        idispls: displs.iter().map(|&d| d as i32).collect(),
        counts,
        displs,
    }
}

fn layer_once(c: &dyn Collective, op: PerfOp, b: &mut Bufs) -> Result<(), String> {
    let r = match op {
        PerfOp::Alltoallv => c.all_to_all_v(&b.send, &b.counts, &b.displs, &mut b.recv, &b.counts, &b.displs),
        PerfOp::Allgather => c.all_gather(&b.send, &mut b.recv),
        PerfOp::Allreduce => c.all_reduce_f64(&mut b.frecv, ReduceOp::Sum),
        PerfOp::Broadcast => c.broadcast(0, &mut b.recv),
    };
    r.map_err(|e| e.to_string())
}

fn raw_once(m: &OwnedComm, op: PerfOp, b: &mut Bufs) -> Result<(), String> {
    let r = match op {
        PerfOp::Alltoallv => {
            m.alltoallv_blocking(&b.send, &b.icounts, &b.idispls, &mut b.recv, &b.icounts, &b.idispls)
        }
        PerfOp::Allgather => m.allgather_blocking(&b.send, &mut b.recv),
        PerfOp::Allreduce => m.allreduce_blocking(&b.fsend, &mut b.frecv),
        PerfOp::Broadcast => m.bcast_blocking(0, &mut b.recv),
    };
    r.map_err(|e| format!("raw MPI: {e}"))
}

/// Fills send buffers with the pattern and poisons receive buffers.
fn prepare_check(op: PerfOp, rank: usize, n: usize, size: usize, b: &mut Bufs) {
    match op {
        PerfOp::Alltoallv => {
            check::fill(rank, 0, &mut b.send);
            for p in 0..n {
                check::poison(p, rank * size, &mut b.recv[p * size..(p + 1) * size]);
            }
        }
        PerfOp::Allgather => {
            check::fill(rank, 0, &mut b.send);
            for p in 0..n {
                check::poison(p, 0, &mut b.recv[p * size..(p + 1) * size]);
            }
        }
        PerfOp::Broadcast => {
            if rank == 0 {
                check::fill(0, 0, &mut b.recv);
            } else {
                check::poison(0, 0, &mut b.recv);
            }
        }
        PerfOp::Allreduce => {
            for (i, x) in b.fsend.iter_mut().enumerate() {
                *x = ((rank + 1) * (i % 1024)) as f64;
            }
            // The layer reduces frecv in place; the raw run writes frecv from fsend.
            b.frecv.copy_from_slice(&b.fsend);
        }
    }
}

fn count_wrong(op: PerfOp, rank: usize, n: usize, size: usize, b: &Bufs) -> u64 {
    match op {
        PerfOp::Alltoallv => {
            (0..n).map(|p| check::mismatches(p, rank * size, &b.recv[p * size..(p + 1) * size]).0).sum()
        }
        PerfOp::Allgather => {
            (0..n).map(|p| check::mismatches(p, 0, &b.recv[p * size..(p + 1) * size]).0).sum()
        }
        PerfOp::Broadcast => check::mismatches(0, 0, &b.recv).0,
        PerfOp::Allreduce => {
            let k = (n * (n + 1) / 2) as f64;
            b.frecv.iter().enumerate().filter(|(i, x)| **x != k * (i % 1024) as f64).count() as u64 * 8
        }
    }
}

fn measure(c: &dyn Collective, raw: Option<&OwnedComm>, args: &PerfArgs, size: usize) -> Result<Row, String> {
    let (rank, n, op) = (c.rank(), c.size(), args.op);
    let mut b = bufs(op, n, size);
    for _ in 0..args.warmup {
        layer_once(c, op, &mut b)?;
        if let Some(m) = raw {
            raw_once(m, op, &mut b)?;
        }
    }
    // Timed: layer and raw alternate iteration by iteration, so drift hits both alike.
    let iters = args.iters.max(1);
    let mut samples = [Vec::with_capacity(iters), Vec::with_capacity(iters)];
    for _ in 0..iters {
        let t0 = Instant::now();
        layer_once(c, op, &mut b)?;
        samples[0].push(t0.elapsed().as_secs_f64());
        if let Some(m) = raw {
            let t1 = Instant::now();
            raw_once(m, op, &mut b)?;
            samples[1].push(t1.elapsed().as_secs_f64());
        }
    }
    let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    // [mean layer, mean raw, median layer, median raw], each the slowest rank's.
    let mut t = [mean(&samples[0]), mean(&samples[1]), median(&mut samples[0]), median(&mut samples[1])];
    c.all_reduce_f64(&mut t, ReduceOp::Max).map_err(|e| e.to_string())?;
    let mut wrong = [0u64; 2];
    if args.check != 0 {
        prepare_check(op, rank, n, size, &mut b);
        layer_once(c, op, &mut b)?;
        wrong[0] = count_wrong(op, rank, n, size, &b);
        if let Some(m) = raw {
            prepare_check(op, rank, n, size, &mut b);
            raw_once(m, op, &mut b)?;
            wrong[1] = count_wrong(op, rank, n, size, &b);
        }
        c.all_reduce_u64(&mut wrong, ReduceOp::Sum).map_err(|e| e.to_string())?;
    }
    let (count, type_, algbytes) = match op {
        PerfOp::Allreduce => (size / 8, "double", (size / 8 * 8) as f64),
        PerfOp::Broadcast => (size, "uint8", size as f64),
        _ => (size, "uint8", (size * n) as f64),
    };
    let nf = n as f64;
    let factor = match op {
        PerfOp::Allgather | PerfOp::Alltoallv => (nf - 1.0) / nf,
        PerfOp::Allreduce => 2.0 * (nf - 1.0) / nf,
        PerfOp::Broadcast => 1.0,
    };
    let bw = |secs: f64| if secs > 0.0 { algbytes / secs / 1e9 } else { 0.0 };
    let (algbw, busbw) = (bw(t[0]), bw(t[0]) * factor);
    let raw_busbw = raw.map(|_| bw(t[1]) * factor);
    Ok(Row {
        size,
        count,
        type_,
        time_us: t[0] * 1e6,
        algbw,
        busbw,
        wrong: wrong[0],
        raw_time_us: raw.map(|_| t[1] * 1e6),
        raw_busbw,
        raw_wrong: raw.map(|_| wrong[1]),
        busbw_ratio: raw_busbw.map(|r| if r > 0.0 { busbw / r } else { 0.0 }),
        time_us_median: t[2] * 1e6,
        raw_time_us_median: raw.map(|_| t[3] * 1e6),
        busbw_ratio_median: raw.map(|_| if t[2] > 0.0 { t[3] / t[2] } else { 0.0 }),
    })
}

/// Median of `v` (0 for an empty slice); reorders `v`.
fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }
}
