//! Shared helpers of the `untrusted_*` property tests: an allocator that records the largest
//! single allocation a call makes (so a test can assert that an announced length was refused
//! before anything of that size was allocated), and the mutations applied to valid encodings.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::prelude::*;

/// The system allocator, noting on each thread the largest block asked for.
pub struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // A const-initialised Cell<usize> needs no destructor and never allocates; `try_with` only
    // fails while the thread is being torn down, when nothing is being measured.
    let _ = LARGEST.try_with(|c| {
        if size > c.get() {
            c.set(size);
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the only
// addition is a thread-local counter update, which neither allocates nor unwinds.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's layout, which satisfies `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` through this allocator, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` through this allocator with `layout`; the caller
        // upholds `realloc`'s contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its value with the largest single allocation it made on this thread.
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|c| c.set(0));
    let v = f();
    (v, LARGEST.with(|c| c.get()))
}

/// A change to a valid encoding, as a hostile or broken peer (or disk) would make it.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// XOR one byte with a non-zero mask.
    Flip(prop::sample::Index, u8),
    /// Overwrite 8 bytes at an offset with a (typically huge) little-endian value.
    SetU64(prop::sample::Index, u64),
    /// Overwrite 4 bytes at an offset.
    SetU32(prop::sample::Index, u32),
    /// Cut the encoding at an offset.
    Truncate(prop::sample::Index),
    /// Append bytes.
    Extend(Vec<u8>),
}

/// Values a hostile length field holds: the edges of every integer width and around them.
pub fn huge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(i64::MAX as u64),
        Just(i64::MAX as u64 + 1),
        Just(1u64 << 32),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 + 1),
        Just(1u64 << 40),
        Just(1u64 << 50),
        Just(1u64 << 63),
        (0u32..64).prop_map(|s| 1u64 << s),
        any::<u64>(),
    ]
}

/// Values of a hostile 32-bit field.
pub fn huge_u32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(u32::MAX), Just(u32::MAX - 1), Just(1u32 << 31), Just(1u32 << 16), any::<u32>()]
}

/// Any [`Mutation`].
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        2 => (any::<prop::sample::Index>(), huge_u64()).prop_map(|(i, v)| Mutation::SetU64(i, v)),
        1 => (any::<prop::sample::Index>(), huge_u32()).prop_map(|(i, v)| Mutation::SetU32(i, v)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..80).prop_map(Mutation::Extend),
    ]
}

/// Applies `m` to `bytes` (an offset past the end of a short buffer writes what fits).
pub fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let put = |bytes: &mut Vec<u8>, at: &prop::sample::Index, v: &[u8]| {
        if bytes.is_empty() {
            return;
        }
        let at = at.index(bytes.len());
        let n = v.len().min(bytes.len() - at);
        bytes[at..at + n].copy_from_slice(&v[..n]);
    };
    match m {
        Mutation::Flip(at, mask) => {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] ^= mask;
            }
        }
        Mutation::SetU64(at, v) => put(bytes, at, &v.to_le_bytes()),
        Mutation::SetU32(at, v) => put(bytes, at, &v.to_le_bytes()),
        Mutation::Truncate(at) => {
            let n = if bytes.is_empty() { 0 } else { at.index(bytes.len()) };
            bytes.truncate(n);
        }
        Mutation::Extend(tail) => bytes.extend_from_slice(tail),
    }
}

/// Finite `f64`s that are non-negative, edges included.
pub fn non_negative_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-0.0),
        Just(f64::MIN_POSITIVE),
        Just(5e-324),
        Just(f64::MAX),
        0.0f64..1e6,
        (0.0f64..1.0).prop_map(|x| x * f64::MAX),
    ]
}

/// `f64`s that a "finite, non-negative" field must refuse.
pub fn bad_non_negative_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(-f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-f64::MIN_POSITIVE),
        Just(-5e-324),
        Just(f64::MIN),
        (-1e12f64..-1e-12),
        any::<u64>().prop_map(|bits| f64::from_bits(bits | 0x7ff0_0000_0000_0001)), // NaN payloads
    ]
}
