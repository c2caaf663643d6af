//! The C ABI: `libdatahelix` (cdylib and staticlib) and `csrc/include/datahelix.h`.
//!
//! Modelled on rustls-ffi: opaque handles, functions named `dh_<object>_<verb>`, outputs last and
//! written only on success, `dh_*_free(NULL)` a no-op, a `#[repr(u32)]` result enum with stable
//! numbers, and every exported body inside `ffi_boundary!` so that no panic crosses into C.
//! The header is generated from these sources by a pinned cbindgen and committed; the test
//! `tests/c_abi_header.rs` fails when the two disagree (`DH_BLESS=1` rewrites the header).
//!
//! All of the crate's C-facing `unsafe` lives in this module, each block with its `SAFETY:`.
//!
//! The same handles serve Rust bindings (the Python package in `python/`) through safe methods:
//! [`config::dh_config::new`] and [`set`](config::dh_config::set), [`loader::dh_loader::open`],
//! [`next_batch`](loader::dh_loader::next_batch), [`report_step`](loader::dh_loader::report_step)
//! and the rest, so every binding gets the same checks, errors and metrics as C:
//!
//! ```no_run
//! use datahelix::ffi::{config::dh_config, loader::dh_loader};
//!
//! let mut config = dh_config::new()?;
//! config.set("data", "data/tiny")?;
//! config.set("steps", "4")?;
//! let mut loader = dh_loader::open(&config)?;
//! while let Some(batch) = loader.next_batch()? {
//!     // ... the training step on batch.samples ...
//!     loader.report_step(0.01)?;
//! }
//! loader.close()?;
//! # Ok::<(), datahelix::ffi::Error>(())
//! ```
//!
//! Objects: [`config::dh_config`] (how to load), [`loader::dh_loader`] (one rank's loader,
//! owning its world), [`loader::dh_batch`] (one step's samples, with zero-copy
//! [`loader::dh_tensor`] views). See `docs/c-abi.md`.
#![allow(non_camel_case_types)]
// The exported functions are called from C, where `unsafe` means nothing: their pointer contracts
// are documented in the header, and each dereference is an `unsafe` block with its SAFETY note.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

use std::cell::RefCell;
use std::ffi::{c_char, CStr};

pub mod config;
pub mod loader;

/// What a `dh_*` function returns. The numbers are stable: new codes are only ever added.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum dh_result {
    /// Success; the outputs were written.
    DH_OK = 0,
    /// A required pointer argument was NULL.
    DH_NULL_PARAMETER = 1,
    /// A panic inside the library was caught at the boundary (a bug: please report it with the
    /// message of `dh_error_message`). The object involved should only be freed afterwards.
    DH_PANIC = 2,
    /// An argument's value is not valid (bad number, bad UTF-8, out of range).
    DH_INVALID_PARAMETER = 3,
    /// `dh_config_set` or a TOML file named a key the library does not know.
    DH_UNKNOWN_KEY = 4,
    /// A file could not be read.
    DH_IO = 5,
    /// A configuration file is not valid TOML, or holds a value of the wrong type.
    DH_PARSE = 6,
    /// The dataset's index is missing or unusable (run `datahelix index DIR`).
    DH_INDEX = 7,
    /// MPI could not be initialised, or was already finalised.
    DH_MPI_INIT = 8,
    /// A collective operation failed.
    DH_COLLECTIVE = 9,
    /// The loader failed in another way that makes the run meaningless (the message says why).
    DH_LOADER = 10,
    /// The loader was closed, or an earlier `dh_loader_next` failed: it can only be freed.
    DH_CLOSED = 11,
    /// Every configured step (`steps`) has been delivered.
    DH_END = 12,
    /// The request is valid but not supported by this build.
    DH_UNSUPPORTED = 13,
    /// A sample or tensor index is out of range.
    DH_OUT_OF_RANGE = 14,
    /// A loader was called from another thread than the one that created it (it uses MPI at
    /// `MPI_THREAD_FUNNELED`); nothing was done.
    DH_WRONG_THREAD = 15,
}

/// The error behind a failed call: its code and message (kept for `dh_error_message`, and
/// raised as a Python exception by the Python package).
#[derive(Debug)]
pub struct Error {
    code: dh_result,
    message: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl Error {
    /// The `dh_result` a C caller gets.
    pub fn code(&self) -> dh_result {
        self.code
    }

    /// What went wrong and what to do (the text of `dh_error_message`).
    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn new(code: dh_result, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    pub(crate) fn null(what: &str) -> Error {
        Error::new(dh_result::DH_NULL_PARAMETER, format!("{what} is NULL"))
    }
}

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn set_last_error(message: String) {
    LAST_ERROR.with(|m| *m.borrow_mut() = message);
}

/// Runs `f` and turns its error (kept as this thread's last error) or a panic into a code.
pub(crate) fn boundary<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown payload".into());
            set_last_error(format!("panic inside libdatahelix: {what}"));
            fallback
        }
    }
}

/// The one panic boundary of every exported function.
///
/// `ffi_boundary!({ body })`: the body returns `Result<(), Error>`; the function returns
/// `dh_result` (`DH_PANIC` on a panic, the error's code otherwise, with its message kept).
/// `ffi_boundary!(fallback => { body })`: the body returns the value itself; `fallback` on a panic.
macro_rules! ffi_boundary {
    ($fallback:expr => $body:block) => {
        $crate::ffi::boundary($fallback, move || $body)
    };
    ($body:block) => {
        $crate::ffi::boundary($crate::ffi::dh_result::DH_PANIC, move || {
            let r: ::std::result::Result<(), $crate::ffi::Error> = (move || $body)();
            $crate::ffi::finish(r)
        })
    };
}
pub(crate) use ffi_boundary;

/// Keeps an error's message for this thread and returns its code.
pub(crate) fn finish(r: Result<(), Error>) -> dh_result {
    match r {
        Ok(()) => dh_result::DH_OK,
        Err(e) => {
            set_last_error(e.message);
            e.code
        }
    }
}

/// An out-parameter the caller must pass: a pointer to write through, or `DH_NULL_PARAMETER`
/// naming it where it is NULL. Checks only for NULL; that it points to writable storage of
/// a `T` is the header's contract, for the caller's `unsafe` write to rely on.
pub(crate) fn out_arg<T>(p: *mut T, what: &str) -> Result<std::ptr::NonNull<T>, Error> {
    std::ptr::NonNull::new(p).ok_or_else(|| Error::null(what))
}

/// Borrows a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string valid for `'a`.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: p is not NULL and, by this function's contract, NUL-terminated and valid for 'a.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map_err(|_| Error::new(dh_result::DH_INVALID_PARAMETER, format!("{what} is not valid UTF-8")))
}

/// The version of the header a program was compiled against (`#if DH_VERSION_MAJOR == 0 …`):
/// the major number is the shared library's soname (`libdatahelix.so.0`), bumped on every
/// incompatible change of the ABI; `dh_version()` says which library runs.
pub const DH_VERSION_MAJOR: u32 = 0;
/// See DH_VERSION_MAJOR: new functions or fields at the ends of growable structs.
pub const DH_VERSION_MINOR: u32 = 1;
/// See DH_VERSION_MAJOR: fixes only.
pub const DH_VERSION_PATCH: u32 = 0;

/// A decimal number at compile time (the crate's version parts).
const fn decimal(s: &str) -> u32 {
    let b = s.as_bytes();
    let (mut i, mut v) = (0, 0u32);
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "a version part is not a decimal number");
        v = v * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    v
}

// The header's macros are literals (cbindgen copies them): the build fails when they drift from
// Cargo.toml's version, which names the library file and its soname (build.rs).
const _: () = assert!(
    DH_VERSION_MAJOR == decimal(env!("CARGO_PKG_VERSION_MAJOR"))
        && DH_VERSION_MINOR == decimal(env!("CARGO_PKG_VERSION_MINOR"))
        && DH_VERSION_PATCH == decimal(env!("CARGO_PKG_VERSION_PATCH")),
    "DH_VERSION_MAJOR/MINOR/PATCH in src/ffi/mod.rs differ from Cargo.toml's version"
);

/// The library's version, e.g. `"datahelix 0.1.0"`: a static NUL-terminated string that the
/// caller must not free. Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn dh_version() -> *const c_char {
    ffi_boundary!(std::ptr::null() => {
        concat!("datahelix ", env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}

/// The name of a result code, e.g. `"DH_NULL_PARAMETER"`: a static NUL-terminated string that
/// the caller must not free (`"DH_UNKNOWN_RESULT"` for a number this build does not define).
/// Thread-safe; never fails.
#[no_mangle]
pub extern "C" fn dh_result_name(result: u32) -> *const c_char {
    ffi_boundary!(std::ptr::null() => {
        let name: &'static str = match result {
            0 => "DH_OK\0",
            1 => "DH_NULL_PARAMETER\0",
            2 => "DH_PANIC\0",
            3 => "DH_INVALID_PARAMETER\0",
            4 => "DH_UNKNOWN_KEY\0",
            5 => "DH_IO\0",
            6 => "DH_PARSE\0",
            7 => "DH_INDEX\0",
            8 => "DH_MPI_INIT\0",
            9 => "DH_COLLECTIVE\0",
            10 => "DH_LOADER\0",
            11 => "DH_CLOSED\0",
            12 => "DH_END\0",
            13 => "DH_UNSUPPORTED\0",
            14 => "DH_OUT_OF_RANGE\0",
            15 => "DH_WRONG_THREAD\0",
            _ => "DH_UNKNOWN_RESULT\0",
        };
        name.as_ptr().cast()
    })
}

/// Copies the message of the last failed `dh_*` call **on the calling thread** into `buf`
/// (truncated to `len - 1` bytes and NUL-terminated when `len > 0`; nothing is written when
/// `buf` is NULL or `len` is 0) and returns the length the whole message needs, NUL included.
/// The message is empty (the return value 1) when no call on this thread has failed yet.
/// Successful calls do not clear it. Thread-safe: each thread has its own last error.
#[no_mangle]
pub extern "C" fn dh_error_message(buf: *mut c_char, len: usize) -> usize {
    ffi_boundary!(0 => {
        LAST_ERROR.with(|m| {
            let m = m.borrow();
            let bytes = m.as_bytes();
            if !buf.is_null() && len > 0 {
                let n = bytes.len().min(len - 1);
                // SAFETY: the caller promises buf holds len writable bytes; n + 1 <= len, and
                // the source is a distinct Rust allocation.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), n);
                    *buf.add(n) = 0;
                }
            }
            bytes.len() + 1
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_dh_panic_with_a_message() {
        let r = boundary(dh_result::DH_PANIC, || -> dh_result { panic!("boom") });
        assert_eq!(r, dh_result::DH_PANIC);
        let need = dh_error_message(std::ptr::null_mut(), 0);
        let mut buf = vec![0 as c_char; need];
        assert_eq!(dh_error_message(buf.as_mut_ptr(), buf.len()), need);
        // SAFETY: dh_error_message NUL-terminated buf.
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
        assert!(s.contains("boom"), "{s}");
    }

    #[test]
    fn result_names_match_numbers() {
        for (n, want) in [
            (0, "DH_OK"),
            (1, "DH_NULL_PARAMETER"),
            (2, "DH_PANIC"),
            (14, "DH_OUT_OF_RANGE"),
            (15, "DH_WRONG_THREAD"),
        ] {
            // SAFETY: dh_result_name returns a static NUL-terminated string.
            let s = unsafe { CStr::from_ptr(dh_result_name(n)) };
            assert_eq!(s.to_str().unwrap(), want);
        }
    }
}
