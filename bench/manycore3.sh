#!/usr/bin/env bash
# Many-core A/B of the write side: the create/unlink/open workloads with two
# builds of `scalevfs` ("before" and "after" a change) on one warm machine,
# alternated (after, before, after), the counting build's shared-line writes
# per op at 2..16 threads, and the ext4 group-commit and untar-like runs.
#
#   bench/manycore3.sh BIN BEFORE TRACED OUT [THREADS]
#
# BEFORE or TRACED may be `-` to skip that part. Writes machine.txt,
# after-1.md, before.md, after-2.md, traced.md, fsync.md, tree.md and
# reports.tgz into OUT. Every step has a time limit; the whole run stays
# under about 5 minutes on 16 cores.
set -u
BIN=$1
BEFORE=$2
TRACED=$3
OUT=$4
THREADS=${5:-1,2,4,8,16}
mkdir -p "$OUT"
. "$(dirname "$0")/common.sh"
machine_info
# One process per workload (BIN NAME WORKLOADS...): tables appended to NAME.md.
each() {
    local bin=$1 name=$2
    shift 2
    local t0=$SECONDS w
    for w in "$@"; do
        local v=()
        [ "$w" = creat-clo ] && v=(--variant lockless)
        if [ "$name" = before ]; then
            # The build before the fix: one process per thread count too.
            local n
            for n in ${THREADS//,/ }; do
                timeout 20 "$bin" bench "$w" "${v[@]}" --quiet --threads "$n" \
                    --report-dir "$OUT/rep-$name/${w//\//-}-$n" >> "$OUT/$name.md" 2>&1
                echo "$name $w $n rc=$?" >> "$OUT/machine.txt"
            done
            continue
        fi
        timeout 30 "$bin" bench "$w" "${v[@]}" --quiet --threads "$THREADS" \
            --report-dir "$OUT/rep-$name/${w//\//-}" >> "$OUT/$name.md" 2>&1
        echo "$name $w rc=$?" >> "$OUT/machine.txt"
    done
    echo "$name $((SECONDS - t0))s" >> "$OUT/machine.txt"
}
# Each workload runs in a process of its own, and under BEFORE each thread
# count too: builds before the "Pins in frees" fix (limbo.rs) can overflow
# a thread's stack when the garbage of many exited threads is collected at
# a thread's exit.
# Write side (the workloads of issue 16) plus the read side and the controls.
W="control control-pingpong creat-clo mkdir-rmdir wis-fs/unlink1 wis-fs/unlink1p
   wis-fs/unlink2 wis-fs/unlink2p wis-fs/open1p wis-fs/open1a wis-fs/open2"
V="default,lockless"
each "$BIN" after-1 $W stat-same access-same lookup-spread
if [ "$BEFORE" != - ]; then
    each "$BEFORE" before $W
    each "$BIN" after-2 $W
fi
if [ "$TRACED" != - ]; then
    step traced 60 "$TRACED" bench --traced creat-clo mkdir-rmdir wis-fs/unlink1p \
        wis-fs/unlink2p wis-fs/open1p wis-fs/open2 --variant "$V" --threads 2,4,8,16 \
        --duration 0.5 --rounds 1 --quiet --report-dir "$OUT/rep-traced"
fi
step fsync 60 "$BIN" bench-fsync --threads "$THREADS" --seconds 0.4 \
    --targets lib-ext4,lib-ext4-none,kernel --image-mib 256 --report-dir "$OUT/fsync"
step tree 60 "$BIN" bench-tree --files 20000 --dirs 200 --threads "$THREADS" \
    --targets lib-memfs,lib-ext4,kernel --report-dir "$OUT/tree"
tar czf "$OUT/reports.tgz" -C "$OUT" $(cd "$OUT" && ls -d rep-* fsync tree 2>/dev/null)
rm -rf "$OUT"/rep-* "$OUT/fsync" "$OUT/tree"
ls -la "$OUT"
