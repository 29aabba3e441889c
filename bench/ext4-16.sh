#!/usr/bin/env bash
# The ext4 type on a many-core machine: fsync-heavy creates with two builds
# (BEFORE and BIN, alternated twice), the untar-like tree and the orphan
# schemes at THREADS, the tree through FUSE, and a cpu-clock profile of the
# fsync workload at 16 threads (PERF may be `-` to skip it). Writes
# machine.txt and one .md per step into OUT, plus perf-fsync16.txt.
#
#   bench/ext4-16.sh BIN BEFORE PERF OUT [THREADS]
set -u
BIN=$1
BEFORE=$2
PERF=$3
OUT=$4
THREADS=${5:-1,2,4,8,16}
mkdir -p "$OUT"
. "$(dirname "$0")/common.sh"
machine_info
ls -la /dev/fuse >> "$OUT/machine.txt" 2>&1
for r in 1 2; do
    step fsync-after 40 "$BIN" bench-fsync --workloads fsync --threads "$THREADS" \
        --seconds 0.4 --targets lib-ext4,lib-ext4-pwrite --image-mib 256 \
        --report-dir "$OUT/rep/fa$r"
    step fsync-before 30 "$BEFORE" bench-fsync --workloads fsync --threads "$THREADS" \
        --seconds 0.4 --targets lib-ext4 --image-mib 256 --report-dir "$OUT/rep/fb$r"
done
step tree 80 "$BIN" bench-tree --files 20000 --dirs 200 --threads "$THREADS" \
    --targets lib-memfs,lib-ext4,lib-ext4-pwrite,kernel --report-dir "$OUT/rep/tree"
step tree80k 60 "$BIN" bench-tree --files 80000 --dirs 800 --threads 16 \
    --targets lib-ext4,lib-ext4-pwrite,kernel --image-mib 3072 --report-dir "$OUT/rep/tree80k"
step orphans 60 "$BIN" bench-fsync --workloads creat-clo --threads "$THREADS" --seconds 0.4 \
    --targets lib-ext4,lib-ext4-list,lib-ext4-none,kernel --image-mib 256 \
    --report-dir "$OUT/rep/orphans"
step fuse 90 "$BIN" bench-tree --files 20000 --dirs 200 --threads "$THREADS" \
    --targets fuse-memfs,fuse-ext4 --report-dir "$OUT/rep/fuse"
if [ "$PERF" != - ]; then
    timeout 30 $PERF record -F 499 -g -e cpu-clock -o "$OUT/f.data" -- "$BIN" bench-fsync \
        --workloads fsync --targets lib-ext4 --threads 16 --seconds 2 --image-mib 256 \
        --report-dir "$OUT/rep/pf" > "$OUT/perf-run.txt" 2>&1
    PAGER=cat timeout 40 $PERF report -i "$OUT/f.data" --stdio --no-children -g none \
        --percent-limit 0.5 > "$OUT/perf-fsync16.txt" 2>/dev/null
    PAGER=cat timeout 40 $PERF report -i "$OUT/f.data" --stdio --no-children \
        -g caller,0.5,callee,function,percent --percent-limit 3 \
        >> "$OUT/perf-fsync16.txt" 2>/dev/null
    rm -f "$OUT/f.data"
fi
rm -rf "$OUT/rep"
