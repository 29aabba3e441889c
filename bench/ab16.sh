#!/usr/bin/env bash
# A/B of two builds on a many-core machine: ROUNDS alternated runs of each
# (A, B, A, B, ...) over WORKLOADS at THREADS, one process per run, so that
# drift of the host shows in both. Writes OUT/a-N.md, OUT/b-N.md and
# OUT/machine.txt.
#
#   bench/ab16.sh A B OUT ROUNDS THREADS WORKLOADS...
set -u
A=$1; B=$2; OUT=$3; ROUNDS=$4; THREADS=$5
shift 5
mkdir -p "$OUT"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc)"
    lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA' || true
    uname -a
} > "$OUT/machine.txt" 2>&1
for r in $(seq 1 "$ROUNDS"); do
    for x in a b; do
        bin=$A; [ $x = b ] && bin=$B
        timeout 60 "$bin" bench "$@" --variant default,lockless --quiet \
            --threads "$THREADS" --report-dir "$OUT/rep" >> "$OUT/$x.md" 2>&1
        echo "$x round $r rc=$?" >> "$OUT/machine.txt"
    done
done
rm -rf "$OUT/rep"
