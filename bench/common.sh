# Shared by the many-core scripts (bench/manycore3.sh, manycore4.sh,
# ext4-16.sh): source it after setting OUT.

# machine.txt: what the run ran on.
machine_info() {
    {
        echo "date: $(date -u +%FT%TZ)"
        echo "nproc: $(nproc)"
        lscpu | grep -E 'Model name|Socket|Core|Thread|NUMA|L2|L3' || true
        grep MemTotal /proc/meminfo
        uname -a
    } > "$OUT/machine.txt" 2>&1
}

# step NAME LIMIT COMMAND...: run with a time limit into NAME.md (appended),
# its status and seconds into machine.txt.
step() {
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >> "$OUT/$name.md" 2>&1
    echo "$name rc=$? $((SECONDS - t0))s" >> "$OUT/machine.txt"
}
