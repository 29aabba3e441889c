#!/usr/bin/env bash
# Many-core figures plus where the time goes: the write-side workloads at
# 1..16 threads, shared-line writes per op (counting build), the ext4
# library's fsync, orphan-scheme and untar-like runs beside the kernel's
# ext4, and cpu-clock profiles (perf, frame-pointer build) of the runs that
# stop scaling. Everything lands in OUT; the profiles as perf-*.txt.
#
#   bench/manycore4.sh BIN TRACED FPBIN PERF OUT [THREADS]
#
# TRACED, FPBIN or PERF may be `-` to skip that part. PERF is the command
# that runs perf (e.g. a carried perf with its own loader and libraries).
# Every step has a time limit; the whole run stays under about 4 minutes on
# 16 cores.
set -u
BIN=$1
TRACED=$2
FPBIN=$3
PERF=$4
OUT=$5
THREADS=${6:-1,2,4,8,16}
mkdir -p "$OUT"
. "$(dirname "$0")/common.sh"
machine_info
# One process per workload, tables appended to bench.md.
for w in control control-pingpong creat-clo mkdir-rmdir wis-fs/unlink1p wis-fs/unlink2p \
    wis-fs/open1p; do
    v=()
    [ "$w" = creat-clo ] && v=(--variant lockless)
    timeout 20 "$BIN" bench "$w" "${v[@]}" --quiet --threads "$THREADS" \
        --report-dir "$OUT/rep/${w//\//-}" >> "$OUT/bench.md" 2>&1
    echo "bench $w rc=$?" >> "$OUT/machine.txt"
done
if [ "$TRACED" != - ]; then
    step traced 40 "$TRACED" bench --traced creat-clo mkdir-rmdir wis-fs/unlink1p \
        --variant default,lockless --threads 2,16 --duration 0.5 --rounds 1 --quiet \
        --report-dir "$OUT/rep/traced"
fi
step fsync 80 "$BIN" bench-fsync --threads "$THREADS" --seconds 0.4 \
    --targets lib-ext4,lib-ext4-mmap,lib-ext4-list,lib-ext4-none,kernel --image-mib 256 \
    --report-dir "$OUT/rep/fsync"
step tree 60 "$BIN" bench-tree --files 20000 --dirs 200 --threads "$THREADS" \
    --targets lib-memfs,lib-ext4,lib-ext4-mmap,kernel --report-dir "$OUT/rep/tree"
if [ "$FPBIN" != - ] && [ "$PERF" != - ]; then
    prof() { # name limit command...: record at 16 threads, report flat and by caller
        local name=$1 limit=$2
        shift 2
        timeout "$limit" $PERF record -F 499 -g -e cpu-clock -o "$OUT/$name.data" -- "$@" \
            > "$OUT/$name.run.txt" 2>&1
        echo "perf $name rc=$?" >> "$OUT/machine.txt"
        PAGER=cat timeout 40 $PERF report -i "$OUT/$name.data" --stdio --no-children \
            -g none --percent-limit 0.3 > "$OUT/perf-$name.txt" 2>/dev/null
        PAGER=cat timeout 40 $PERF report -i "$OUT/$name.data" --stdio --no-children \
            -g caller,0.5,callee,function,percent --percent-limit 1.5 \
            >> "$OUT/perf-$name.txt" 2>/dev/null
        rm -f "$OUT/$name.data"
    }
    prof tree16 40 "$FPBIN" bench-tree --files 80000 --dirs 800 --threads 16 \
        --targets lib-ext4 --image-mib 3072 --report-dir "$OUT/rep/ptree"
    prof tree16m 40 "$FPBIN" bench-tree --files 80000 --dirs 800 --threads 16 \
        --targets lib-ext4-mmap --image-mib 3072 --report-dir "$OUT/rep/ptreem"
    prof creat16 20 "$FPBIN" bench creat-clo --variant lockless --threads 16 --duration 2 \
        --rounds 1 --quiet --report-dir "$OUT/rep/pcreat"
    prof ext4creat16 30 "$FPBIN" bench-fsync --workloads creat-clo --targets lib-ext4 \
        --threads 16 --seconds 2 --image-mib 256 --report-dir "$OUT/rep/pext4creat"
    prof fsync16 30 "$FPBIN" bench-fsync --workloads fsync --targets lib-ext4 \
        --threads 16 --seconds 2 --image-mib 256 --report-dir "$OUT/rep/pfsync"
fi
tar czf "$OUT/reports.tgz" -C "$OUT" rep
rm -rf "$OUT/rep"
ls -la "$OUT"
