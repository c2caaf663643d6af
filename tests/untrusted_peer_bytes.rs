//! Bytes from peers are untrusted: the exchange's packed tensor blocks
//! (`datahelix::exec::exchange::unpack`) and the step records of the all-gather
//! (`datahelix::plan::record::StepRecord::decode`). Random bytes and damaged valid encodings
//! (flipped, cut, extended, length fields overwritten with huge values) never panic, never
//! allocate more than the bound the reader is given, and come back as an error that says what is
//! wrong; valid encodings round-trip exactly.

mod untrusted_support;

use datahelix::exec::exchange::{pack, unpack, Piece, HEADER};
use datahelix::plan::record::{
    DecodeObservation, FailedSample, StepRecord, MAX_OBSERVATIONS, MAX_SKIPS, MAX_WORKERS, RECORD_BYTES,
};
use proptest::collection::vec;
use proptest::prelude::*;
use untrusted_support::{apply, largest_allocation, mutation};

// Header field offsets of a packed piece (`src/exec/exchange.rs`, `at`): documented there, not
// public, so written out again here.
const INDEX: usize = 0;
const OK: usize = 4;
const COMPRESSED: usize = 5;
const SHAPE: usize = 16;
const TOKENS: usize = 32;
const RAW_LEN: usize = 40;
const WIRE_LEN: usize = 48;
const STEP: usize = 56;

// ---------------------------------------------------------------------------------------------
// The exchange
// ---------------------------------------------------------------------------------------------

/// A piece `pack` and `unpack` agree on: a decoded one carries exactly `∏shape` bytes, a failed
/// one none (its shape is whatever the sender wrote).
fn arb_piece() -> impl Strategy<Value = Piece> {
    let decoded = (
        (any::<u64>(), any::<u32>(), any::<u16>(), any::<u64>(), any::<u64>()),
        [0usize..7, 0usize..7, 0usize..7, 0usize..4],
        any::<bool>(),
        any::<u8>(),
    )
        .prop_flat_map(|((step, index, part, id, tokens), shape, compressible, fill)| {
            let n: usize = shape.iter().product();
            let data = if compressible { Just(vec![fill; n]).boxed() } else { vec(any::<u8>(), n).boxed() };
            let timestamps_s: Vec<f64> = (0..shape[0]).map(|k| k as f64 / 25.0).collect();
            data.prop_map(move |data| Piece {
                step,
                index,
                part,
                id,
                shape,
                tokens,
                ok: true,
                timestamps_s: timestamps_s.clone(),
                data,
            })
        });
    let failed = (
        (any::<u64>(), any::<u32>(), any::<u16>(), any::<u64>(), any::<u64>()),
        [any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()],
    )
        .prop_map(|((step, index, part, id, tokens), dims)| Piece {
            step,
            index,
            part,
            id,
            shape: dims.map(|d| d as usize),
            tokens,
            ok: false,
            timestamps_s: Vec::new(),
            data: Vec::new(),
        });
    prop_oneof![3 => decoded, 1 => failed]
}

/// Pieces with their compression flags.
fn arb_block() -> impl Strategy<Value = Vec<(Piece, bool)>> {
    vec((arb_piece(), any::<bool>()), 0..6)
}

/// The packed block and where each piece starts (plus its end).
fn packed(pieces: &[(Piece, bool)]) -> (Vec<u8>, Vec<usize>) {
    let mut buf = Vec::new();
    let mut starts = vec![0];
    for (p, compress) in pieces {
        pack(&mut buf, p, *compress).expect("a consistent piece packs");
        starts.push(buf.len());
    }
    (buf, starts)
}

fn largest_tensor(pieces: &[(Piece, bool)]) -> usize {
    pieces.iter().map(|(p, _)| p.data.len()).max().unwrap_or(0)
}

/// What every piece `unpack` returns must satisfy, whatever the bytes were.
fn check_unpacked(pieces: &[Piece], max_bytes: usize) -> Result<(), TestCaseError> {
    for p in pieces {
        if p.ok {
            let n = p.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            prop_assert_eq!(n, Some(p.data.len()), "a decoded piece carries ∏shape bytes");
        } else {
            prop_assert!(p.data.is_empty(), "a failed piece carries no bytes");
        }
        prop_assert!(p.data.len() <= max_bytes, "{} bytes, bound {}", p.data.len(), max_bytes);
        prop_assert!(p.shape.iter().all(|&d| d <= u32::MAX as usize));
    }
    // What was accepted is a normal form: packed again (either way) it reads back the same.
    for compress in [false, true] {
        let mut again = Vec::new();
        for p in pieces {
            pack(&mut again, p, compress).map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        let back = unpack(&again, max_bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, pieces);
    }
    Ok(())
}

/// The most a call of `unpack` on `block` with bound `max_bytes` may allocate at once: the one
/// tensor it is allowed, a copy of the block's bytes, and the list of pieces (a piece per 64
/// header bytes at most).
fn unpack_allocation_bound(block: &[u8], max_bytes: usize) -> usize {
    max_bytes.max(block.len() * 4) + 4096
}

fn set(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    /// pack → unpack is the identity; the bound is exact (one byte less than the largest tensor
    /// is refused, naming the sizes); a block cut at a piece boundary reads as its prefix, cut
    /// anywhere else it is an error.
    #[test]
    fn exchange_round_trips_and_cuts_are_errors(pieces in arb_block(), cut in any::<prop::sample::Index>()) {
        let (buf, starts) = packed(&pieces);
        let want: Vec<Piece> = pieces.iter().map(|(p, _)| p.clone()).collect();
        let max = largest_tensor(&pieces);
        prop_assert_eq!(&unpack(&buf, max).unwrap(), &want);
        prop_assert_eq!(&unpack(&buf, usize::MAX).unwrap(), &want);
        if max > 0 {
            let e = unpack(&buf, max - 1).unwrap_err().to_string();
            prop_assert!(e.contains(&format!("at most {} here", max - 1)), "{}", e);
            prop_assert!(e.contains("same DataHelix build"), "the error says what to do: {}", e);
        }
        if !buf.is_empty() {
            let n = cut.index(buf.len());
            match starts.iter().position(|&s| s == n) {
                Some(k) => prop_assert_eq!(&unpack(&buf[..n], max).unwrap(), &want[..k]),
                None => {
                    let e = unpack(&buf[..n], max).unwrap_err().to_string();
                    prop_assert!(e.contains("truncated header") || e.contains("payload shorter"), "{}", e);
                }
            }
        }
    }

    /// Damaged blocks: never a panic, never an allocation past the bound, and what is accepted
    /// is consistent.
    #[test]
    fn exchange_survives_damage(
        pieces in arb_block(),
        mutations in vec(mutation(), 1..6),
        slack in 0usize..64,
    ) {
        let (mut buf, _) = packed(&pieces);
        for m in &mutations {
            apply(&mut buf, m);
        }
        let max = largest_tensor(&pieces) + slack;
        let (r, largest) = largest_allocation(|| unpack(&buf, max));
        prop_assert!(largest <= unpack_allocation_bound(&buf, max), "allocated {} for a {}-byte block", largest, buf.len());
        match r {
            Ok(got) => check_unpacked(&got, max)?,
            Err(e) => prop_assert!(e.to_string().contains("malformed"), "{}", e),
        }
    }

    /// Header fields of one piece overwritten with hostile values (lengths, dimensions, flags).
    #[test]
    fn exchange_hostile_header_fields(
        pieces in arb_block().prop_filter("at least one piece", |p| !p.is_empty()),
        which in any::<prop::sample::Index>(),
        field in prop::sample::select(vec![RAW_LEN, WIRE_LEN, SHAPE, SHAPE + 4, SHAPE + 8, SHAPE + 12, OK, COMPRESSED]),
        v64 in untrusted_support::huge_u64(),
        max in prop_oneof![Just(0usize), 0usize..4096, Just(1 << 20), Just(usize::MAX)],
    ) {
        let (mut buf, starts) = packed(&pieces);
        let at = starts[which.index(pieces.len())] + field;
        match field {
            RAW_LEN | WIRE_LEN => set(&mut buf, at, &v64.to_le_bytes()),
            OK | COMPRESSED => buf[at] = v64 as u8,
            _ => set(&mut buf, at, &(v64 as u32).to_le_bytes()),
        }
        let (r, largest) = largest_allocation(|| unpack(&buf, max));
        // One field alone cannot make a length agree with a shape that did not: the only tensors
        // allocated are the block's own, whatever `max` allows.
        let bound = unpack_allocation_bound(&buf, max.min(largest_tensor(&pieces)));
        prop_assert!(largest <= bound, "allocated {} with max_bytes {}", largest, max);
        if let Ok(got) = r {
            check_unpacked(&got, max)?;
        }
    }

    /// A header announcing more bytes than the bound, with a shape that agrees (so only the bound
    /// stands between the peer and the allocation), is refused before anything of that size is
    /// allocated, compressed or not.
    #[test]
    fn exchange_refuses_huge_announcements_before_allocating(
        dims in [1u32..=u32::MAX, 1u32..=u32::MAX, 1u32..=u32::MAX, 1u32..=u32::MAX],
        max in 0usize..(1 << 20),
        compressed in any::<bool>(),
        payload in vec(any::<u8>(), 0..64),
    ) {
        let announced = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
        // A product past u64 overflows; the header then announces its wrapped value.
        let raw_len = announced.unwrap_or_else(|| dims.iter().fold(1u64, |a, &d| a.wrapping_mul(d as u64)));
        prop_assume!(raw_len as u128 > max as u128);
        let mut h = [0u8; HEADER];
        h[OK] = 1;
        h[COMPRESSED] = compressed as u8;
        for (k, d) in dims.iter().enumerate() {
            set(&mut h, SHAPE + 4 * k, &d.to_le_bytes());
        }
        set(&mut h, RAW_LEN, &raw_len.to_le_bytes());
        set(&mut h, WIRE_LEN, &(payload.len() as u64).to_le_bytes());
        set(&mut h, STEP, &77u64.to_le_bytes());
        let mut block = h.to_vec();
        block.extend_from_slice(&payload);
        let started = std::time::Instant::now();
        let (r, largest) = largest_allocation(|| unpack(&block, max));
        let e = r.unwrap_err().to_string();
        prop_assert!(e.contains("a piece of step 77 announces"), "{}", e);
        prop_assert!(e.contains(&format!("at most {max} here")), "{}", e);
        prop_assert!(largest <= 4096, "allocated {} before refusing", largest);
        prop_assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }

    /// Random bytes, and random headers whose wire length matches the payload that follows (so
    /// the reader gets as far as zstd with hostile frames, or frames of another size).
    #[test]
    fn exchange_random_bytes(
        bytes in vec(any::<u8>(), 0..600),
        header in vec(any::<u8>(), HEADER),
        payload in vec(any::<u8>(), 0..300),
        as_zstd in any::<bool>(),
        dims in [0u32..9, 0u32..9, 0u32..9, 0u32..9],
        max in prop_oneof![0usize..8192, Just(usize::MAX)],
    ) {
        let (r, largest) = largest_allocation(|| unpack(&bytes, max));
        prop_assert!(max == usize::MAX || largest <= unpack_allocation_bound(&bytes, max));
        if let Ok(got) = r {
            check_unpacked(&got, max)?;
        }
        let mut h = header;
        let payload = if as_zstd { zstd::bulk::compress(&payload, 1).unwrap() } else { payload };
        for (k, d) in dims.iter().enumerate() {
            set(&mut h, SHAPE + 4 * k, &d.to_le_bytes());
        }
        let raw: u64 = dims.iter().map(|&d| d as u64).product();
        set(&mut h, RAW_LEN, &raw.to_le_bytes());
        set(&mut h, WIRE_LEN, &(payload.len() as u64).to_le_bytes());
        h[OK] = 1;
        h[COMPRESSED] = as_zstd as u8;
        let mut block = h;
        block.extend_from_slice(&payload);
        let (r, largest) = largest_allocation(|| unpack(&block, max));
        prop_assert!(max == usize::MAX || largest <= unpack_allocation_bound(&block, max));
        match r {
            Ok(got) => {
                prop_assert_eq!(got.len(), 1);
                check_unpacked(&got, max)?;
                prop_assert_eq!(got[0].data.len() as u64, raw);
                prop_assert_eq!(got[0].index, u32::from_le_bytes(block[INDEX..INDEX + 4].try_into().unwrap()));
                prop_assert_eq!(got[0].tokens, u64::from_le_bytes(block[TOKENS..TOKENS + 8].try_into().unwrap()));
            }
            Err(e) => prop_assert!(e.to_string().contains("malformed"), "{}", e),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The step record
// ---------------------------------------------------------------------------------------------

fn any_finite_f64() -> impl Strategy<Value = f64> {
    prop_oneof![untrusted_support::non_negative_f64(), untrusted_support::non_negative_f64().prop_map(|x| -x),]
}

fn arb_observation() -> impl Strategy<Value = DecodeObservation> {
    let nn = untrusted_support::non_negative_f64;
    (any::<u8>(), nn(), nn(), nn(), nn()).prop_map(|(codec, mpixels, mbits, discarded, seconds)| {
        DecodeObservation { codec, mpixels, mbits, discarded, seconds }
    })
}

/// A record every rank of one build would send.
fn arb_record() -> impl Strategy<Value = StepRecord> {
    let nn = untrusted_support::non_negative_f64;
    (
        (any::<u32>(), any::<u64>(), 0..=MAX_WORKERS, any::<u32>(), any_finite_f64(), nn(), any::<u64>()),
        (nn(), nn(), nn(), nn(), nn(), 0u32..=1_000_000),
        (
            vec((any::<u64>(), any::<u64>()).prop_map(|(step, id)| FailedSample { step, id }), 0..=MAX_SKIPS),
            vec(arb_observation(), 0..=MAX_OBSERVATIONS),
        ),
    )
        .prop_map(
            |(
                (rank, step, workers, samples, accel_free_s, queued_cpu_s, mem_cap),
                (gpu_s, sum_tokens, sum_tokens_sq, zstd_ratio, zstd_bps, worker_millicores),
                (skips, observations),
            )| StepRecord {
                rank,
                step,
                workers,
                accel_free_s,
                queued_cpu_s,
                mem_cap,
                gpu_s,
                sum_tokens,
                sum_tokens_sq,
                samples,
                skips,
                observations,
                zstd_ratio,
                zstd_bps,
                worker_millicores,
            },
        )
}

/// The bounds `decode` promises the planner, checked on whatever it accepts.
fn check_bounds(r: &StepRecord) -> Result<(), TestCaseError> {
    prop_assert!(r.workers <= MAX_WORKERS);
    prop_assert!(r.worker_millicores <= 1_000_000);
    prop_assert!(r.skips.len() <= MAX_SKIPS && r.observations.len() <= MAX_OBSERVATIONS);
    prop_assert!(r.accel_free_s.is_finite());
    let counts = [r.queued_cpu_s, r.gpu_s, r.sum_tokens, r.sum_tokens_sq, r.zstd_ratio, r.zstd_bps];
    let measured = r.observations.iter().flat_map(|o| [o.mpixels, o.mbits, o.discarded, o.seconds]);
    for x in counts.into_iter().chain(measured) {
        prop_assert!(x.is_finite() && x >= 0.0, "{}", x);
    }
    Ok(())
}

/// One field of a valid record given a value no build sends, and the reason `decode` must give.
#[derive(Clone, Debug)]
enum Bad {
    Workers(u32),
    Millicores(u32),
    /// Which of the six non-negative counts.
    Count(usize, f64),
    Accel(f64),
    /// Which field of the first observation.
    Observation(usize, f64),
}

fn arb_bad() -> impl Strategy<Value = Bad> {
    let bad = untrusted_support::bad_non_negative_f64;
    prop_oneof![
        (MAX_WORKERS + 1..=u32::MAX).prop_map(Bad::Workers),
        (1_000_001u32..=u32::MAX).prop_map(Bad::Millicores),
        (0usize..6, bad()).prop_map(|(k, v)| Bad::Count(k, v)),
        prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(f64::NEG_INFINITY)].prop_map(Bad::Accel),
        (0usize..4, bad()).prop_map(|(k, v)| Bad::Observation(k, v)),
    ]
}

fn corrupt(r: &mut StepRecord, bad: &Bad) -> &'static str {
    match *bad {
        Bad::Workers(w) => r.workers = w,
        Bad::Millicores(m) => r.worker_millicores = m,
        Bad::Count(k, v) => {
            *[
                &mut r.queued_cpu_s,
                &mut r.gpu_s,
                &mut r.sum_tokens,
                &mut r.sum_tokens_sq,
                &mut r.zstd_ratio,
                &mut r.zstd_bps,
            ][k] = v
        }
        Bad::Accel(v) => r.accel_free_s = v,
        Bad::Observation(k, v) => {
            if r.observations.is_empty() {
                r.observations.push(DecodeObservation::default());
            }
            let o = &mut r.observations[0];
            *[&mut o.mpixels, &mut o.mbits, &mut o.discarded, &mut o.seconds][k] = v;
        }
    }
    match bad {
        Bad::Workers(_) | Bad::Millicores(_) => "decode workers out of range",
        _ => "negative or not finite",
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// encode → decode is the identity for every record within the bounds.
    #[test]
    fn record_round_trips(r in arb_record()) {
        let bytes = r.encode();
        prop_assert_eq!(bytes.len(), RECORD_BYTES);
        let back = StepRecord::decode(&bytes).unwrap();
        prop_assert_eq!(&back, &r);
        // Bit for bit, so -0.0 and subnormals survive too.
        prop_assert_eq!(back.encode(), bytes);
    }

    /// A record with one field out of its bounds is refused, and the error names which bound.
    #[test]
    fn record_out_of_bounds_fields_are_refused(r in arb_record(), bad in arb_bad()) {
        let mut r = r;
        let why = corrupt(&mut r, &bad);
        let e = StepRecord::decode(&r.encode()).unwrap_err();
        prop_assert!(e.to_string().contains(why), "{}: {}", why, e);
        prop_assert!(e.to_string().contains("same DataHelix build"), "{}", e);
    }

    /// Damaged records: never a panic; what is accepted keeps the bounds and re-encodes to a
    /// record that decodes the same; wrong lengths, magic and counts are named.
    #[test]
    fn record_survives_damage(r in arb_record(), mutations in vec(mutation(), 1..5)) {
        let mut bytes = r.encode().to_vec();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        let (result, largest) = largest_allocation(|| StepRecord::decode(&bytes));
        // Two small lists (8 failed samples, 8 observations) at most.
        prop_assert!(largest <= 1024, "allocated {}", largest);
        match result {
            Ok(back) => {
                check_bounds(&back)?;
                prop_assert_eq!(StepRecord::decode(&back.encode()).unwrap(), back);
            }
            Err(e) => {
                let e = e.to_string();
                if bytes.len() != RECORD_BYTES {
                    prop_assert!(e.contains("wrong length"), "{}", e);
                } else if bytes[..4] != r.encode()[..4] {
                    prop_assert!(e.contains("wrong magic"), "{}", e);
                } else if bytes[72] as usize > MAX_SKIPS || bytes[73] != 0 || bytes[74] as usize > MAX_OBSERVATIONS {
                    prop_assert!(e.contains("counts out of range"), "{}", e);
                }
            }
        }
    }

    /// Any bytes of any length; with the magic in place, any body.
    #[test]
    fn record_random_bytes(bytes in vec(any::<u8>(), 0..2 * RECORD_BYTES), body in vec(any::<u8>(), RECORD_BYTES)) {
        match StepRecord::decode(&bytes) {
            Ok(r) => check_bounds(&r)?,
            Err(e) if bytes.len() != RECORD_BYTES => prop_assert!(e.to_string().contains("wrong length"), "{}", e),
            Err(e) => prop_assert!(e.to_string().contains("malformed"), "{}", e),
        }
        let mut b = body;
        b[..4].copy_from_slice(&StepRecord::default().encode()[..4]);
        if let Ok(r) = StepRecord::decode(&b) {
            check_bounds(&r)?;
        }
    }

    /// The all-gather's records: each at its rank's slot, the whole exactly ranks × the size.
    #[test]
    fn records_of_an_all_gather(
        records in vec(arb_record(), 1..6),
        swap in any::<(prop::sample::Index, prop::sample::Index)>(),
        extra in 1usize..RECORD_BYTES,
    ) {
        let ranks = records.len();
        let records: Vec<StepRecord> =
            records.into_iter().enumerate().map(|(k, r)| StepRecord { rank: k as u32, ..r }).collect();
        let mut bytes: Vec<u8> = records.iter().flat_map(|r| r.encode()).collect();
        prop_assert_eq!(&StepRecord::decode_all(&bytes, ranks).unwrap(), &records);
        prop_assert!(StepRecord::decode_all(&bytes, ranks + 1).is_err());
        prop_assert!(StepRecord::decode_all(&bytes[..bytes.len() - extra], ranks).is_err());
        let (a, b) = (swap.0.index(ranks), swap.1.index(ranks));
        if a != b {
            let mut swapped = records.clone();
            swapped.swap(a, b);
            let swapped: Vec<u8> = swapped.iter().flat_map(|r| r.encode()).collect();
            let e = StepRecord::decode_all(&swapped, ranks).unwrap_err();
            prop_assert!(e.to_string().contains("another rank's slot"), "{}", e);
        }
        bytes.extend(std::iter::repeat_n(0u8, extra));
        prop_assert!(StepRecord::decode_all(&bytes, ranks).is_err());
    }
}

/// Fixed with this test (low severity: `ranks` is this process's world size, not a peer's bytes):
/// `StepRecord::decode_all` computes `ranks * RECORD_BYTES` unchecked (src/plan/record.rs,
/// `decode_all`), which panics with "attempt to multiply with overflow" in debug builds and wraps
/// in release builds for `ranks > usize::MAX / RECORD_BYTES`.
#[test]
fn decode_all_with_an_absurd_rank_count_is_an_error() {
    assert!(StepRecord::decode_all(&[], usize::MAX).is_err());
    assert!(StepRecord::decode_all(&[], usize::MAX / RECORD_BYTES + 1).is_err());
}

/// The allocation bounds above are only as good as the measurement: it sees the library's own
/// allocations (here the one tensor a valid piece needs).
#[test]
fn the_allocation_measurement_sees_the_readers_allocations() {
    let piece = Piece {
        step: 1,
        index: 0,
        part: 0,
        id: 2,
        shape: [4, 64, 64, 3],
        tokens: 1,
        ok: true,
        timestamps_s: vec![0.0, 0.5, 1.0, 1.5],
        data: vec![9; 49152],
    };
    for compress in [false, true] {
        let mut buf = Vec::new();
        pack(&mut buf, &piece, compress).unwrap();
        let (r, largest) = largest_allocation(|| unpack(&buf, 1 << 20));
        assert_eq!(r.unwrap(), vec![piece.clone()]);
        assert!(largest >= 49152, "saw {largest} bytes");
    }
}
