#!/usr/bin/env bash
# Run the loom models of scalevfs-sync: every crates/sync/tests/loom_*.rs
# (loom_models.rs: the primitives; loom_dcache.rs: dcache protocols).
#
# Uses its own target directory so the `--cfg loom` build does not evict the
# normal build artefacts. Extra arguments are passed to the test binary, e.g.
#   ci/loom.sh b_last_put          # only models whose name contains b_last_put
#   LOOM_MAX_PREEMPTIONS=4 ci/loom.sh
# On failure, loom prints the failing interleaving; rerun with LOOM_LOG=1 and
# LOOM_LOCATION=1 (and LOOM_CHECKPOINT_FILE) to trace it.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
exec cargo test -p scalevfs-sync --release --test 'loom_*' -- --test-threads="${LOOM_TEST_THREADS:-2}" "$@"
