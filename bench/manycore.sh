#!/usr/bin/env bash
# Many-core scaling run: `scalevfs bench` (every workload, before vs after),
# `scalevfs bench-tree` (library targets, the kernel's ext4 and tmpfs) and
# `scalevfs bench-fsync` (group commit; orphan file vs list vs none; the
# library and the kernel's ext4) at 1..16 threads, on a lent many-core
# machine. Writes machine.txt, bench.md, tree.md, fsync.md and reports.tgz
# (report.json, SVG plots) into OUT.
#
#   bench/manycore.sh [BIN] [OUT] [THREADS] [TREE_THREADS] [FSYNC_THREADS]
#
# Each step has a time limit so that the whole run stays inside about
# 7 minutes; a step that runs out is reported in machine.txt.
set -u
BIN=${1:-target/release/scalevfs}
OUT=${2:-manycore-out}
THREADS=${3:-1,2,4,8,12,16}
TREE_THREADS=${4:-1,2,4,8,16}
FSYNC_THREADS=${5:-1,2,4,8,16}
mkdir -p "$OUT"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc)"
    lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA|L2|L3|MHz' || true
    grep MemTotal /proc/meminfo
    uname -a
    for t in mkfs.ext4 e2fsck losetup fusermount3; do
        printf '%s: %s\n' "$t" "$(command -v $t || echo missing)"
    done
} > "$OUT/machine.txt" 2>&1
timeout 280 "$BIN" bench --quiet --threads "$THREADS" --report-dir "$OUT/rep" > "$OUT/bench.md" 2>&1
echo "bench rc=$?" >> "$OUT/machine.txt"
timeout 110 "$BIN" bench-tree --files 20000 --dirs 200 --threads "$TREE_THREADS" \
    --targets lib-memfs,lib-ext4,kernel,tmpfs --report-dir "$OUT/tree" > "$OUT/tree.log" 2>&1
echo "bench-tree rc=$?" >> "$OUT/machine.txt"
cp "$OUT/tree/tree.md" "$OUT/tree.md" 2>/dev/null
timeout 150 "$BIN" bench-fsync --threads "$FSYNC_THREADS" --seconds 0.5 \
    --targets lib-ext4,lib-ext4-list,lib-ext4-none,lib-ext4-1ms,lib-ext4-mmap,kernel \
    --image-mib 256 --report-dir "$OUT/fsync" > "$OUT/fsync.log" 2>&1
echo "bench-fsync rc=$?" >> "$OUT/machine.txt"
cp "$OUT/fsync/fsync.md" "$OUT/fsync.md" 2>/dev/null
tar czf "$OUT/reports.tgz" -C "$OUT" rep tree fsync 2>/dev/null
rm -rf "$OUT/rep" "$OUT/tree" "$OUT/fsync"
ls -la "$OUT"
