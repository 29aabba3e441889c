#!/usr/bin/env bash
# The project's test command (the README's second command; .ci/run runs it):
#   1. every crate's unit, integration, property and concurrency tests;
#   2. the loom models of every lock-free algorithm (ci/loom.sh);
#   3. Miri over the unsafe code (ci/miri.sh) and ThreadSanitizer over the
#      concurrency tests (ci/tsan.sh), both on the nightly toolchain;
#   4. the FUSE suite against a real mount (ci/fuse-tests.sh: pjdfstest, fsx,
#      real tools). Without /dev/fuse it is skipped with the reason printed;
#      with SCALEVFS_REQUIRE_FUSE=1 (set by CI) that is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace"
cargo test --workspace --quiet

echo "== counting build (trace-lines): line recorder and conflict matrix"
cargo test --quiet -p scalevfs-sync --features trace-lines --lib trace
cargo test --quiet -p scalevfs-bench --features trace-lines --test commute --test traced

echo "== loom models"
ci/loom.sh

echo "== Miri"
ci/miri.sh

echo "== ThreadSanitizer"
ci/tsan.sh

echo "== FUSE tests"
cargo build --release --quiet -p scalevfs-cli
bash ci/fuse-tests.sh target/release/scalevfs
