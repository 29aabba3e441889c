//! Sleeping until a 32-bit word changes (a futex where the build has plain
//! atomics), for the waits of [`crate::Gate`] and [`crate::Turnstile`].
//! In the counting build (`trace-lines`) the atomics are not futex words
//! and a wait polls; under loom a wait is a yield (the models call the
//! non-waiting steps).

use crate::primitive::AtomicU32;

/// Sleep while `a` holds `seen` (may return early).
#[cfg(all(not(loom), not(feature = "trace-lines")))]
pub(crate) fn sleep_while(a: &AtomicU32, seen: u32) {
    atomic_wait::wait(a, seen);
}

/// Wake every thread sleeping on `a`.
#[cfg(all(not(loom), not(feature = "trace-lines")))]
pub(crate) fn wake_all(a: &AtomicU32) {
    atomic_wait::wake_all(a);
}

#[cfg(all(not(loom), feature = "trace-lines"))]
pub(crate) fn sleep_while(_a: &AtomicU32, _seen: u32) {
    std::thread::sleep(std::time::Duration::from_micros(20));
}

#[cfg(all(not(loom), feature = "trace-lines"))]
pub(crate) fn wake_all(_a: &AtomicU32) {}

#[cfg(loom)]
pub(crate) fn sleep_while(_a: &AtomicU32, _seen: u32) {
    crate::primitive::thread::yield_now();
}

#[cfg(loom)]
pub(crate) fn wake_all(_a: &AtomicU32) {}
