#!/usr/bin/env bash
# Real tools in a mounted scalevfs: ci/fuse-tools-smoke.sh DIR
# (DIR: an empty directory inside the mount). Exits non-zero on the first
# failure, printing which step failed.
set -euo pipefail
dir=${1:?usage: fuse-tools-smoke.sh DIR}
cd "$dir"
step() { echo "  smoke: $*"; }

step "build a source tree"
mkdir -p src/sub/deeper
for i in $(seq 1 50); do printf 'file %s\n%.0s' "$i" $(seq 1 $((i * 10))) > "src/f$i.txt"; done
head -c 300000 /dev/urandom > src/sub/blob.bin
printf '#!/bin/sh\necho hi\n' > src/sub/run.sh && chmod 755 src/sub/run.sh
ln -s ../f1.txt src/sub/link-to-f1
touch -d '2001-02-03 04:05:06' src/sub/deeper/old

step "cp -a"
cp -a src copy
diff -r src copy
[ "$(stat -c %Y copy/sub/deeper/old)" = "$(stat -c %Y src/sub/deeper/old)" ]
[ "$(readlink copy/sub/link-to-f1)" = "../f1.txt" ]
[ "$(stat -c %a copy/sub/run.sh)" = 755 ]

step "tar create and extract"
tar -cf tree.tar src
mkdir untar && tar -xf tree.tar -C untar
diff -r src untar/src
tar -czf tree.tgz -C src . && mkdir untgz && tar -xzf tree.tgz -C untgz && diff -r src untgz

step "ls -la"
ls -la src > ls.out
ls -la src/sub > ls-sub.out && grep -q 'link-to-f1 -> ../f1.txt' ls-sub.out
grep -q 'f50.txt' ls.out

step "mv (rename within and across directories)"
mv copy/f1.txt copy/f1.moved
mv copy/f1.moved copy/sub/deeper/
[ -f copy/sub/deeper/f1.moved ] && [ ! -e copy/f1.txt ]
mv copy renamed-copy && [ -d renamed-copy/sub ]

step "ln and ln -s"
ln src/f2.txt hard
[ "$(stat -c %h src/f2.txt)" = 2 ] && [ "$(stat -c %i hard)" = "$(stat -c %i src/f2.txt)" ]
ln -s src/f3.txt soft
cmp soft src/f3.txt
[ "$(readlink soft)" = src/f3.txt ]

step "find"
[ "$(find src -type f | wc -l)" = 53 ]
[ "$(find src -type l | wc -l)" = 1 ]
[ "$(find . -name blob.bin -path '*untar*')" = ./untar/src/sub/blob.bin ]

step "du"
du -sh src > /dev/null
[ "$(du -s --apparent-size -B1 src/sub/blob.bin | cut -f1)" = 300000 ]

step "git init, add, commit"
mkdir repo && cp -a src/. repo/
(
  cd repo
  git init -q .
  git -c user.name=ci -c user.email=ci@example.invalid add -A
  git -c user.name=ci -c user.email=ci@example.invalid commit -q -m initial
  echo change >> f1.txt
  git -c user.name=ci -c user.email=ci@example.invalid commit -q -am second
  [ "$(git rev-list --count HEAD)" = 2 ]
  [ -z "$(git status --porcelain)" ]
  git fsck --no-progress --strict >/dev/null
  git gc -q
  [ "$(git log -1 --format=%s)" = second ]
)

step "python3 sqlite3 (rollback journal and WAL)"
python3 - <<'PY'
import sqlite3
for mode in ("delete", "wal"):
    path = f"db-{mode}.sqlite"
    con = sqlite3.connect(path)
    con.execute(f"pragma journal_mode={mode}")
    con.execute("pragma synchronous=full")
    con.execute("create table t (k integer primary key, v text)")
    with con:
        con.executemany("insert into t (v) values (?)", [(f"value {i}",) for i in range(2000)])
    con.execute("create index iv on t (v)")
    con.commit()
    con.close()
    con = sqlite3.connect(path)
    n, = con.execute("select count(*) from t where v like 'value 1%'").fetchone()
    assert n == 1111, n
    assert con.execute("pragma integrity_check").fetchone()[0] == "ok"
    con.close()
print("  smoke: sqlite ok")
PY

step "cleanup (rm -rf)"
rm -rf src renamed-copy untar untgz repo tree.tar tree.tgz hard soft ls.out ls-sub.out db-*
[ -z "$(ls -A .)" ]
echo "  smoke: all steps passed"
