#!/usr/bin/env bash
# ThreadSanitizer over the concurrency tests: the sync crate's tests (LockRef,
# seqlock, spinlock, lockstat), the orphan crate's, and the core's
# multi-threaded integration tests (rename_races, append_atomicity,
# orphan_lifecycle, dcache_bounded, change_listener, flock_matches_linux).
#
# Nightly only: `-Zsanitizer=thread` with `-Zbuild-std` (std instrumented
# too, else every std lock and channel is a false report). Own target
# directory (target/tsan), so the normal build stays warm. Needs the nightly
# toolchain with rust-src (`.ci/run` installs it).
#
# Suppressions: ci/tsan.supp, one reason per entry. Extra arguments go to
# the test binaries (e.g. `ci/tsan.sh rename` to run matching tests only).
# A report fails the run (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
export RUSTFLAGS="${RUSTFLAGS:-} -Zsanitizer=thread"
export CARGO_TARGET_DIR="${TSAN_TARGET_DIR:-target/tsan}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-} suppressions=$PWD/ci/tsan.supp halt_on_error=1 second_deadlock_stack=1"
threads="${TSAN_TEST_THREADS:-2}"
run() {
  cargo +nightly test -Zbuild-std --target "$target" --quiet "$@"
}
echo "== tsan: scalevfs-sync"
run -p scalevfs-sync --tests -- --test-threads="$threads" "${@}"
echo "== tsan: scalevfs-orphan"
run -p scalevfs-orphan --tests -- --test-threads="$threads" "${@}"
echo "== tsan: scalevfs (concurrency tests)"
run -p scalevfs --test append_atomicity --test orphan_lifecycle --test dcache_bounded \
  --test change_listener --test flock_matches_linux -- --test-threads="$threads" "${@}"
# rename_races: the lock-free walk against renames, every variant (~40 s
# under TSan on 2 cores). Its other two tests (non-authoritative memfs with
# eviction, the reference walk) take ~80 s more and add little TSan can see
# that dcache_bounded (eviction) and this one do not; left to the normal run.
run -p scalevfs --test rename_races -- --test-threads="$threads" \
  rename_races_authoritative_memfs "${@}"
# walk_rename_races: walks, opens and getcwd through directories exchanged
# and names renamed over (the per-step validation's orderings: d_seq, the
# bucket sequences); a few seconds.
run -p scalevfs --test walk_rename_races -- --test-threads="$threads" "${@}"
echo "== tsan: scalevfs page and counter races (unit tests)"
run -p scalevfs --lib -- --test-threads="$threads" race_tests percpu "${@}"
