#!/usr/bin/env bash
# The project's test command (the README's second command; .ci/run runs it).
#   1. every crate's unit, integration and property tests;
#   2. the loom models of the lock-free algorithms (ci/loom.sh);
#   3. the FUSE suite against a real mount (ci/fuse-tests.sh), when present.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== cargo test --workspace"
cargo test --workspace --quiet

if [ -x ci/loom.sh ]; then
  echo "== loom models"
  ci/loom.sh
fi

if [ -x ci/fuse-tests.sh ]; then
  echo "== FUSE tests"
  ci/fuse-tests.sh
fi
