#!/usr/bin/env bash
# A/B of the lazily mapped image device on a many-core machine (stop 31):
# three builds of `scalevfs` copied to .dev/sv-nostripe (one fallocate per
# thread per fresh chunk), .dev/sv-stripe (one per chunk, 64 lock stripes)
# and .dev/sv-adapt (plus pwrite for a lone writer of unallocated bytes),
# alternated over 3 rounds with the pwrite and fully preallocated mmap
# targets, then the 80,000-file tree at 16 threads. Output: OUT/ab.md.
#
#   bench/lazy-ab16.sh OUT
set -u
OUT=$1
mkdir -p $OUT
for r in 1 2 3; do
  for b in nostripe stripe adapt; do
    echo "== $b round $r" >> $OUT/ab.md
    timeout 40 .dev/sv-$b bench-tree --files 20000 --dirs 200 --threads 1,4,16 --targets lib-ext4 --report-dir /tmp/r 2>&1 | grep '^| lib' >> $OUT/ab.md
  done
  echo "== pwrite,mmap round $r" >> $OUT/ab.md
  timeout 60 .dev/sv-adapt bench-tree --files 20000 --dirs 200 --threads 1,4,16 --targets lib-ext4-pwrite,lib-ext4-mmap --report-dir /tmp/r 2>&1 | grep '^| lib' >> $OUT/ab.md
done
for b in nostripe stripe adapt; do
  echo "== 80k $b" >> $OUT/ab.md
  timeout 40 .dev/sv-$b bench-tree --files 80000 --dirs 800 --threads 16 --targets lib-ext4 --image-mib 3072 --report-dir /tmp/r 2>&1 | grep '^| lib' >> $OUT/ab.md
done
echo "== 80k pwrite mmap" >> $OUT/ab.md
timeout 60 .dev/sv-adapt bench-tree --files 80000 --dirs 800 --threads 16 --targets lib-ext4-pwrite,lib-ext4-mmap --image-mib 3072 --report-dir /tmp/r 2>&1 | grep '^| lib' >> $OUT/ab.md
