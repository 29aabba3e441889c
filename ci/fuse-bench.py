#!/usr/bin/env python3
"""FUSE figures, side by side: one short run per (binary, cache setting).

Usage: ci/fuse-bench.py BIN [BIN...] [--iters N] [--entries N]

Mounts each scalevfs binary's memfs (`BIN mount DIR --foreground`), with the
default caches and with `--attr-timeout 0 --entry-timeout 0`, and times from
this one client thread: stat, open+close, read 4 KiB, create+close+unlink,
and listing a directory of N entries (os.listdir, and os.scandir + stat of
each entry). Prints one table, microseconds per operation (median of 5
rounds). A benchmark, not a test: it asserts nothing but that mounts work.
"""
import os, subprocess, sys, tempfile, time, statistics

def parse():
    bins, iters, entries = [], 2000, 2000
    a = sys.argv[1:]
    i = 0
    while i < len(a):
        if a[i] == "--iters":
            iters = int(a[i + 1]); i += 2
        elif a[i] == "--entries":
            entries = int(a[i + 1]); i += 2
        else:
            bins.append(a[i]); i += 1
    if not bins:
        sys.exit(__doc__)
    return bins, iters, entries

def mount(bin_, mnt, extra):
    p = subprocess.Popen([bin_, "mount", mnt, "--foreground"] + extra,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.ismount(mnt):
            return p
        time.sleep(0.05)
    p.kill()
    sys.exit(f"mount of {bin_} failed")

def unmount(p, mnt):
    subprocess.run(["fusermount3", "-u", mnt], check=False)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()

def per_op(f, n):
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        f(n)
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)

def run(mnt, iters, entries):
    d = os.path.join(mnt, "b")
    os.mkdir(d)
    f = os.path.join(d, "f")
    with open(f, "wb") as h:
        h.write(b"x" * 4096)
    big = os.path.join(mnt, "big")
    os.mkdir(big)
    for i in range(entries):
        os.close(os.open(os.path.join(big, f"e{i:05}"), os.O_CREAT | os.O_WRONLY, 0o644))
    def stat(n):
        for _ in range(n):
            os.stat(f)
    def openclose(n):
        for _ in range(n):
            os.close(os.open(f, os.O_RDONLY))
    fd = os.open(f, os.O_RDONLY)
    def read4k(n):
        for _ in range(n):
            os.pread(fd, 4096, 0)
    def create(n):
        for i in range(n):
            p = os.path.join(d, "c")
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
            os.unlink(p)
    def listdir(n):
        for _ in range(n):
            os.listdir(big)
    def scanstat(n):
        for _ in range(n):
            for e in os.scandir(big):
                e.stat(follow_symlinks=False)
    out = {
        "stat": per_op(stat, iters),
        "open+close": per_op(openclose, iters),
        "read 4 KiB": per_op(read4k, iters),
        "create+close+unlink": per_op(create, max(iters // 4, 1)),
        f"listdir {entries}": per_op(listdir, 10),
        f"scandir+stat {entries}": per_op(scanstat, 3),
    }
    os.close(fd)
    return out

def main():
    bins, iters, entries = parse()
    settings = [("default caches", []),
                ("caches off", ["--attr-timeout", "0", "--entry-timeout", "0"])]
    table = {}
    for b in bins:
        for sname, extra in settings:
            mnt = tempfile.mkdtemp(prefix="fbench-")
            p = mount(b, mnt, extra)
            try:
                table[(b, sname)] = run(mnt, iters, entries)
            finally:
                unmount(p, mnt)
                os.rmdir(mnt)
    ops = list(next(iter(table.values())).keys())
    for sname, _ in settings:
        print(f"\n{sname} (us/op, one client thread)")
        print(f"{'operation':<24}" + "".join(f"{os.path.basename(b):>22}" for b in bins))
        for op in ops:
            print(f"{op:<24}" + "".join(f"{table[(b, sname)][op]:>22.1f}" for b in bins))

if __name__ == "__main__":
    main()
