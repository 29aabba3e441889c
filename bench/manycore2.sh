#!/usr/bin/env bash
# A shorter many-core run for A/B work: the write-side memfs workloads with
# both allocators of the `scalevfs` binary (SCALEVFS_ALLOC=system: glibc's
# malloc; default: mimalloc), bench-fsync (ext4 library targets and the
# kernel's ext4) and bench-tree (library ext4 and the kernel's ext4).
#
#   bench/manycore2.sh [BIN] [OUT] [THREADS]
#
# Writes machine.txt, bench-mimalloc.md, bench-system.md, fsync.md, tree.md
# and reports.tgz into OUT; each step has a time limit (about 5 minutes in
# all).
set -u
BIN=${1:-target/release/scalevfs}
OUT=${2:-manycore2-out}
THREADS=${3:-1,2,4,8,16}
mkdir -p "$OUT"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc)"
    lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA' || true
    grep MemTotal /proc/meminfo
    uname -a
} > "$OUT/machine.txt" 2>&1
W="creat-clo mkdir-rmdir wis-fs/unlink1 wis-fs/unlink2 orphan-stress stat-same"
for a in mimalloc system; do
    if [ $a = system ]; then export SCALEVFS_ALLOC=system; else unset SCALEVFS_ALLOC; fi
    timeout 90 "$BIN" bench $W --quiet --threads "$THREADS" --report-dir "$OUT/rep-$a" \
        > "$OUT/bench-$a.md" 2>&1
    echo "bench ($a) rc=$?" >> "$OUT/machine.txt"
done
unset SCALEVFS_ALLOC
timeout 120 "$BIN" bench-fsync --threads "$THREADS" --seconds 0.5 \
    --targets lib-ext4,lib-ext4-list,lib-ext4-none,kernel --image-mib 256 \
    --report-dir "$OUT/fsync" > "$OUT/fsync.log" 2>&1
echo "bench-fsync rc=$?" >> "$OUT/machine.txt"
cp "$OUT/fsync/fsync.md" "$OUT/fsync.md" 2>/dev/null
timeout 90 "$BIN" bench-tree --files 20000 --dirs 200 --threads "$THREADS" \
    --targets lib-ext4,kernel --report-dir "$OUT/tree" > "$OUT/tree.log" 2>&1
echo "bench-tree rc=$?" >> "$OUT/machine.txt"
cp "$OUT/tree/tree.md" "$OUT/tree.md" 2>/dev/null
tar czf "$OUT/reports.tgz" -C "$OUT" rep-mimalloc rep-system fsync tree 2>/dev/null
rm -rf "$OUT"/rep-* "$OUT/fsync" "$OUT/tree" "$OUT/fsync.log" "$OUT/tree.log"
ls -la "$OUT"
