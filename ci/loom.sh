#!/usr/bin/env bash
# Run every loom model: crates/sync/tests/loom_*.rs (the primitives and the
# dcache protocols), crates/orphan/tests/loom_orphan.rs (the orphan file's
# slot claim and release) and the core's crates/core/src/loom_models.rs (the
# last close against unlink, on the production code of orphan.rs).
#
# Uses its own target directory so the `--cfg loom` build does not evict the
# normal build artefacts. Extra arguments are passed to the test binaries, e.g.
#   ci/loom.sh b_last_put          # only models whose name contains b_last_put
#   LOOM_MAX_PREEMPTIONS=4 ci/loom.sh
# On failure, loom prints the failing interleaving; rerun with LOOM_LOG=1 and
# LOOM_LOCATION=1 (and LOOM_CHECKPOINT_FILE) to trace it.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}"
threads="${LOOM_TEST_THREADS:-2}"
cargo test -p scalevfs-sync --release --test 'loom_*' -- --test-threads="$threads" "$@"
cargo test -p scalevfs-orphan --release --test loom_orphan -- --test-threads="$threads" "$@"
# The core's models run the production code, which frees through
# crossbeam-epoch's one global collector (real, not loom's): with two models
# in one process at once, one model's pin could run the other's deferred
# frees inside the wrong loom execution (loom panics: "index out of bounds" in
# rt/object.rs). So they run one at a time, and each execution ends by
# flushing its own garbage (loom_models::model).
cargo test -p scalevfs --release --lib loom_models -- --test-threads=1 "$@"
