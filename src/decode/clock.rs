//! The calling thread's CPU time, for decode-cost observations that do not depend on how many
//! other threads share the cores.

/// CPU seconds the calling thread has used (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`); 0.0 where
/// the clock is unavailable.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: ts is a valid, writable timespec; the clock id is a constant the kernel knows.
    let ret = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if ret != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
