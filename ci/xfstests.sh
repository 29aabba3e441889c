#!/usr/bin/env bash
# xfstests (fstests) against a scalevfs FUSE mount: memfs (default) or, with
# --image, the ext4 type serving ext4 image files.
#
#   ci/xfstests.sh [options] XFSTESTS_DIR [CHECK ARGS...]
#
# XFSTESTS_DIR is an xfstests checkout (git://git.kernel.org/pub/scm/fs/xfs/
# xfstests-dev.git or github.com/kdave/xfstests); CHECK ARGS go to its
# ./check (default: -g quick). Needs root and /dev/fuse.
#
# Options:
#   --bin PATH        scalevfs binary (default target/release/scalevfs, else
#                     target/debug/scalevfs, under $CARGO_TARGET_DIR if set)
#   --install-deps    apt-get install the build dependencies that are missing
#   --mem SIZE        memory cap of each scalevfs daemon (default 4G): a
#                     cgroup v1/v2 memory limit where one can be made, else
#                     ulimit -v
#   --size SIZE       memfs capacity (ENOSPC past it; default 2G)
#   --timeout SECS    stop ./check after this long (default: none); the
#                     results so far are still counted
#   --results DIR     where the logs go (default /tmp/scalevfs-xfstests)
#   --image           serve ext4 images instead of memfs: TEST_DEV and
#                     SCRATCH_DEV are IMAGE_DIR/test.img and scratch.img,
#                     made afresh by mkfs.ext4 at the start of the run and
#                     mounted by `scalevfs mount --image IMG DIR`
#   --image-dir DIR   where the images go (default /tmp/xfs-ext4)
#   --image-size SIZE size of each image (default 2G)
#   --features LIST   mkfs.ext4 -O for the images (default orphan_file; e.g.
#                     ^orphan_file: unlinked open files go on the orphan list)
#   --block-size N    mkfs.ext4 -b for the images (default: mkfs's choice,
#                     4096 on images of 512 MiB and more; e.g. 1024)
#   --mount-options O more `scalevfs mount -o` options for both mounts,
#                     comma separated (e.g. noexport, for overlayfs tests)
#
# What it does: builds xfstests if needed (make), creates the users and
# groups the suite wants (fsgqa, fsgqa2, 123456-fsgqa), writes the mount
# helper /sbin/mount.fuse.scalevfs (mount -t fuse.scalevfs runs it) and
# XFSTESTS_DIR/local.config for FSTYP=fuse, then runs ./check with TEST and
# SCRATCH mounted by `scalevfs mount -o allow_other,default_permissions`.
# It prints pass / fail / not-run counts, the reason of every failure (the
# first lines of its .out.bad diff or its check message) and which failures
# ci/xfstests-known.txt lists as inherent. Exit status: 0 when every failure
# is a known one, 1 otherwise.
#
# --image: xfstests cannot re-create a FSTYP=fuse filesystem (its
# _scratch_mkfs only empties SCRATCH_MNT, _test_mkfs and the fsck after each
# test do nothing, _scratch_mkfs_sized is "not run"), so the mount helper
# does it: before each mount it waits until the image's previous daemon has
# written everything back and exited (a lock the daemon holds), runs
# `e2fsck -fn` on the image (the check xfstests would run for ext4; errors go
# to IMAGE_DIR/../RESULTS/fsck.log, put down to the test that last mounted
# the image, and a damaged test image is then repaired with e2fsck -fy so
# that later tests start clean), and makes the scratch image afresh with
# mkfs.ext4 at the first scratch mount of each test (so every test's
# _scratch_mkfs gets an empty filesystem; a second _scratch_mkfs in the same
# test only empties it). A second mount of an image that is still mounted is
# refused (exit 32): two daemons on one image would corrupt it. At the end
# both images get a last e2fsck -fn. ci/xfstests-known.txt entries whose
# reason names memfs do not count in this mode (the ext4 type keeps its
# data across a remount); ci/xfstests-known-ext4.txt lists this mode's own
# inherent failures.
#
# Where /dev/fuse is missing the run is SKIPPED (exit 0) with the reason
# printed -- unless SCALEVFS_REQUIRE_FUSE=1, which makes that a failure.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
tdir=${CARGO_TARGET_DIR:-$root/target}
bin=
install_deps=0
mem=4G
size=2G
timeout_s=
results=/tmp/scalevfs-xfstests
image=0
image_dir=/tmp/xfs-ext4
image_size=2G
features=orphan_file
block_size=
mount_opts=

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --install-deps) install_deps=1; shift ;;
    --mem) mem=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --image) image=1; shift ;;
    --image-dir) image_dir=$2; shift 2 ;;
    --image-size) image_size=$2; shift 2 ;;
    --features) features=$2; shift 2 ;;
    --block-size) block_size=$2; shift 2 ;;
    --mount-options) mount_opts=$2; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "xfstests: unknown option $1"; usage 1 ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage 1
xfs=$(cd "$1" && pwd) || { echo "xfstests: no directory $1"; exit 1; }
shift
[ $# -gt 0 ] || set -- -g quick
[ -x "$xfs/check" ] || { echo "xfstests: $xfs is not an xfstests checkout (no ./check)"; exit 1; }

skip() {
  if [ "${SCALEVFS_REQUIRE_FUSE:-0}" = 1 ]; then
    echo "xfstests: FAILED: $* (SCALEVFS_REQUIRE_FUSE=1)"
    exit 1
  fi
  echo "xfstests: SKIPPED: $*"
  exit 0
}

if [ -z "$bin" ]; then
  if [ -x "$tdir/release/scalevfs" ]; then bin=$tdir/release/scalevfs; else bin=$tdir/debug/scalevfs; fi
fi
bin=$(readlink -f "$bin")
[ -x "$bin" ] || { echo "xfstests: no scalevfs binary at $bin (build it, or --bin PATH)"; exit 1; }
[ "$(id -u)" = 0 ] || skip "xfstests needs root (mount, users, mount helper)"
[ -c /dev/fuse ] || skip "/dev/fuse is not available"

to_bytes() { # 4G -> bytes
  local v=${1^^} m=1
  case $v in *K) m=1024 ;; *M) m=$((1 << 20)) ;; *G) m=$((1 << 30)) ;; *T) m=$((1 << 40)) ;; esac
  v=${v%[KMGT]}
  [[ $v =~ ^[0-9]+$ ]] || { echo "xfstests: bad size $1" >&2; exit 1; }
  echo $((v * m))
}
mem_bytes=$(to_bytes "$mem")
to_bytes "$size" > /dev/null
image_bytes=$(to_bytes "$image_size")
mkfs_b=
case $block_size in
  '') ;;
  1024|2048|4096) mkfs_b="-b $block_size" ;;
  *) echo "xfstests: --block-size $block_size: 1024, 2048 or 4096"; exit 1 ;;
esac

# ---------------------------------------------------------------- deps
# Commands the suite (or its build) needs, with the Debian package.
deps="autoreconf:automake libtoolize:libtool make:make gcc:gcc gawk:gawk bc:bc
  xfs_io:xfsprogs setfacl:acl getfattr:attr fio:fio dbench:dbench killall:psmisc
  uuidgen:uuid-runtime mkfs.ext4:e2fsprogs python3:python3 dump:dump
  quota:quota lvm:lvm2 sed:sed flock:util-linux e2fsck:e2fsprogs"
headers="/usr/include/xfs/xfs.h:xfslibs-dev /usr/include/acl/libacl.h:libacl1-dev
  /usr/include/attr/attributes.h:libattr1-dev /usr/include/libaio.h:libaio-dev
  /usr/include/uuid/uuid.h:uuid-dev /usr/include/gdbm.h:libgdbm-dev
  /usr/include/liburing.h:liburing-dev"
missing=()
for d in $deps; do command -v "${d%%:*}" > /dev/null || missing+=("${d#*:}"); done
for d in $headers; do [ -e "${d%%:*}" ] || missing+=("${d#*:}"); done
command -v libtool > /dev/null || missing+=(libtool-bin)
if [ ${#missing[@]} -gt 0 ]; then
  if [ $install_deps = 1 ]; then
    echo "xfstests: installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" > /dev/null \
      || { echo "xfstests: apt-get install failed"; exit 1; }
  else
    echo "xfstests: missing packages: ${missing[*]} (apt-get install them, or pass --install-deps)"
    exit 1
  fi
fi

# ---------------------------------------------------------------- build
if [ ! -x "$xfs/ltp/fsx" ] || [ ! -x "$xfs/src/godown" -a ! -x "$xfs/src/xfsctl" ]; then
  echo "xfstests: building $xfs (make)"
  (cd "$xfs" && make -j"$(nproc)") > "$xfs/build.log" 2>&1 \
    || { echo "xfstests: build failed, see $xfs/build.log"; tail -20 "$xfs/build.log"; exit 1; }
fi

# ---------------------------------------------------------------- users
getent group fsgqa > /dev/null || groupadd fsgqa
getent passwd fsgqa > /dev/null || useradd -m -g fsgqa fsgqa
getent passwd fsgqa2 > /dev/null || useradd -m fsgqa2
getent passwd 123456-fsgqa > /dev/null || useradd 123456-fsgqa 2> /dev/null \
  || echo "xfstests: note: cannot create user 123456-fsgqa (tests that need it will not run)"

# ---------------------------------------------------------------- helper
# mount(8) runs /sbin/mount.fuse.scalevfs SOURCE DIR -o OPTIONS for
# `mount -t fuse.scalevfs`. The helper starts the daemon (which returns once
# the mount is up), with SOURCE as the fsname so that /proc/mounts names the
# "device" xfstests expects, in a memory-capped cgroup.
work=$results
mkdir -p "$work"
helper=/sbin/mount.fuse.scalevfs
cat > "$helper" << EOF
#!/bin/bash
# Written by scalevfs ci/xfstests.sh: mount -t fuse.scalevfs SOURCE DIR -o OPTS
src=\$1 dir=\$2
shift 2
opts=
while [ \$# -gt 0 ]; do
  case \$1 in
    -o) opts=\${opts:+\$opts,}\$2; shift 2 ;;
    -o*) opts=\${opts:+\$opts,}\${1#-o}; shift ;;
    *) shift ;;                      # -n, -s, -v: nothing to do
  esac
done
keep=()
dev=dev suid=suid
IFS=, read -ra all <<< "\$opts"
for o in "\${all[@]}"; do
  case \$o in
    # A remount (mount -o remount,ro DIR) is the kernel's: FUSE takes the
    # read-only flag; mount -i keeps mount(8) from calling this helper again.
    remount) exec mount -i -o "\$opts" "\$dir" ;;
    ''|defaults|source=*|fsname=*|subtype=*|user|nouser|auto|noauto|_netdev|nofail) ;;
    nodev) dev= ;;
    nosuid) suid= ;;
    dev|suid) ;;
    *) keep+=("\$o") ;;
  esac
done
# As mount(8) does for other filesystems (and fuser does not): device files
# and set-id programs work unless nodev / nosuid are given.
keep+=(\$dev \$suid "fsname=\$src")
name=\${src##*/}
name=\${name%.img}
if [ $image = 1 ]; then
  # An image still mounted elsewhere: a second daemon on it would corrupt
  # it (the kernel would share one superblock; scalevfs cannot).
  if awk -v s="\$src" '\$1 == s { f = 1 } END { exit !f }' /proc/mounts; then
    echo "mount.fuse.scalevfs: \$src is already mounted" >&2
    exit 32
  fi
  # The previous daemon on this image holds fd 9's lock until it has
  # written the image back and exited (umount returns before that).
  exec 9> "\$src.lock"
  if ! flock -w 300 9; then
    echo "mount.fuse.scalevfs: the previous daemon on \$src did not exit in 300 s" >&2
    exit 32
  fi
  cur=\${seqnum:-none}
  last=\$(cat "\$src.last" 2> /dev/null)
  out=\$(e2fsck -fn "\$src" 2>&1)
  st=\$?
  if [ \$st != 0 ]; then
    f="$work/fsck-\$name-\$(date -u +%H%M%S)-\${last//\//-}.log"
    printf '%s\n' "\$out" > "\$f"
    echo "\$(date -u +%T) \$src after \${last:-?} (mounting for \$cur): e2fsck -fn exit \$st: \$(printf '%s\n' "\$out" | grep -vE '^(Pass |e2fsck |Warning: skipping journal)' | head -3 | tr '\n' ' ') (\$f)" >> "$work/fsck.log"
  fi
  if [ "\$name" = scratch ]; then
    if [ "\$(cat "\$src.fmt" 2> /dev/null)" != "\$cur" ]; then
      mkfs.ext4 -q -F -O $features $mkfs_b "\$src" > /dev/null 2>&1 \\
        || { echo "mount.fuse.scalevfs: mkfs.ext4 \$src failed" >&2; exit 32; }
      echo "\$cur" > "\$src.fmt"
    fi
  elif [ \$st != 0 ]; then
    e2fsck -fy "\$src" > /dev/null 2>&1
    echo "\$(date -u +%T) \$src repaired with e2fsck -fy (exit \$?)" >> "$work/fsck.log"
  fi
  echo "\$cur" > "\$src.last"
  what=(--image "\$src")
else
  what=(--size $size)
fi
# Memory cap: a cgroup if one can be made, else the address-space limit.
cap=$mem_bytes
cg=
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  cg=/sys/fs/cgroup/scalevfs-xfstests-\$\$
  mkdir "\$cg" 2> /dev/null && echo "\$cap" > "\$cg/memory.max" 2> /dev/null \\
    && echo \$\$ > "\$cg/cgroup.procs" 2> /dev/null || cg=
else
  base=/sys/fs/cgroup/memory\$(awk -F: '\$2 == "memory" {print \$3}' /proc/self/cgroup)
  cg=\$base/scalevfs-xfstests-\$\$
  mkdir "\$cg" 2> /dev/null && echo "\$cap" > "\$cg/memory.limit_in_bytes" 2> /dev/null \\
    && echo \$\$ > "\$cg/tasks" 2> /dev/null || cg=
fi
[ -n "\$cg" ] || ulimit -v \$((cap / 1024 + (1 << 20)))
echo "\$(date -u +%T) mount \$src \$dir -o \$(IFS=,; echo "\${keep[*]}") cgroup=\${cg:-none} test=\${seqnum:-none}" >> "$work/mounts.log"
# A mount point that is still mounted (a previous mount not yet gone)
# would make the wait below report success for the old mount.
if mountpoint -q "\$dir"; then
  echo "mount.fuse.scalevfs: \$dir is already a mount point" >&2
  exit 32
fi
# The daemon in the foreground in its own session, its messages (a panic
# included) kept in a log; the helper returns once the mount is up.
log="$work/daemon-\$name.log"
echo "\$(date -u +%T) mount" >> "\$log"
setsid bash -c '"\$@"; echo "\$(date -u +%T) daemon exit status \$?"' daemon \
  "$bin" mount "\$dir" --foreground "\${what[@]}" -o "\$(IFS=,; echo "\${keep[*]}")" \
  >> "\$log" 2>&1 < /dev/null &
pid=\$!
exec 9>&-
for _ in \$(seq 1 600); do
  mountpoint -q "\$dir" && exit 0
  kill -0 \$pid 2> /dev/null || break
  sleep 0.05
done
tail -3 "\$log" >&2
exit 1
EOF
chmod 755 "$helper"

# ---------------------------------------------------------------- config
mnt=/mnt/scalevfs-xfstests
mkdir -p "$mnt/test" "$mnt/scratch"
for d in "$mnt/test" "$mnt/scratch"; do
  mountpoint -q "$d" && umount "$d"
done
if [ $image = 1 ]; then
  mkdir -p "$image_dir"
  image_dir=$(cd "$image_dir" && pwd)
  test_dev=$image_dir/test.img
  scratch_dev=$image_dir/scratch.img
  for img in "$test_dev" "$scratch_dev"; do
    rm -f "$img" "$img.last" "$img.fmt"
    truncate -s "$image_bytes" "$img" && mkfs.ext4 -q -F -O "$features" $mkfs_b "$img" \
      || { echo "xfstests: mkfs.ext4 $img failed"; exit 1; }
  done
else
  test_dev=scalevfs-test
  scratch_dev=scalevfs-scratch
fi
cat > "$xfs/local.config" << EOF
# Written by scalevfs ci/xfstests.sh
export TEST_DEV=$test_dev
export TEST_DIR=$mnt/test
export SCRATCH_DEV=$scratch_dev
export SCRATCH_MNT=$mnt/scratch
export FSTYP=fuse
export FUSE_SUBTYP=.scalevfs
export MOUNT_OPTIONS="-oallow_other,default_permissions${mount_opts:+,$mount_opts}"
export TEST_FS_MOUNT_OPTS="-oallow_other,default_permissions${mount_opts:+,$mount_opts}"
export RESULT_BASE=$work/results
EOF

# CPUs offline before the run: generic/650 (CPU hotplug) takes CPUs
# offline and back; a run stopped in the middle of it would leave them
# offline, so cleanup brings back every CPU that was online at the start.
offline_at_start=""
for f in /sys/devices/system/cpu/cpu[0-9]*/online; do
  [ -r "$f" ] && [ "$(cat "$f")" = 0 ] && offline_at_start="$offline_at_start $f"
done

cleanup() {
  local f
  for f in /sys/devices/system/cpu/cpu[0-9]*/online; do
    if [ -w "$f" ] && [ "$(cat "$f")" = 0 ]; then
      case " $offline_at_start " in
        *" $f "*) ;;
        *) echo 1 > "$f" 2> /dev/null && echo "xfstests: brought ${f%/online} back online" ;;
      esac
    fi
  done
  for d in "$mnt/test" "$mnt/scratch"; do
    mountpoint -q "$d" && { umount "$d" 2> /dev/null || umount -l "$d"; }
  done
  # Each image's daemon writes it back after umount returns: wait for it.
  if [ $image = 1 ]; then
    local img
    for img in "$test_dev" "$scratch_dev"; do
      [ -e "$img.lock" ] && flock -w 300 "$img.lock" true
    done
  fi
  # The helper's cgroups, once their daemons are gone.
  local cg
  for cg in /sys/fs/cgroup/scalevfs-xfstests-* \
    /sys/fs/cgroup/memory"$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)"/scalevfs-xfstests-*; do
    [ -d "$cg" ] && rmdir "$cg" 2> /dev/null
  done
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- run
if [ $image = 1 ]; then
  echo "xfstests: binary $bin, daemon memory cap $mem, ext4 images $test_dev $scratch_dev ($image_size), logs $work"
else
  echo "xfstests: binary $bin, daemon memory cap $mem, memfs size $size, logs $work"
fi
echo "xfstests: ./check $*"
rm -rf "$work/results" "$work"/daemon-*.log "$work"/fsck*.log "$work/mounts.log"
(
  cd "$xfs" || exit 1
  if [ -n "$timeout_s" ]; then
    timeout --foreground -k 30 "$timeout_s" ./check "$@"
  else
    ./check "$@"
  fi
) > "$work/check.log" 2>&1
rc=$?
[ $rc = 124 ] && echo "xfstests: stopped after $timeout_s s (--timeout); counting what ran"
if [ $image = 1 ]; then
  cleanup
  for img in "$test_dev" "$scratch_dev"; do
    e2fsck -fn "$img" > "$work/fsck-final-${img##*/}.log" 2>&1
    echo "$(date -u +%T) final e2fsck -fn $img: exit $?" >> "$work/fsck-final.log"
  done
fi

# ---------------------------------------------------------------- report
known=$here/xfstests-known.txt
# One line per test that ran: "generic/001 pass|fail|notrun|..."
awk '
  /^[a-z0-9]+\/[0-9]+[ \t]/ {
    t = $1; s = "pass"
    if ($0 ~ /\[not run\]/) s = "notrun"
    else if ($0 ~ /\[failed/ || $0 ~ /- output mismatch/ || $0 ~ /_check_/) s = "fail"
    else if ($0 ~ /\[expunged\]/) s = "expunged"
    st[t] = s; if (!(t in seen)) { seen[t] = 1; order[++n] = t }
  }
  /^Failures:/ { for (i = 2; i <= NF; i++) st[$i] = "fail" }
  END { for (i = 1; i <= n; i++) print order[i], st[order[i]] }
' "$work/check.log" > "$work/status.txt"
npass=$(awk '$2 == "pass"' "$work/status.txt" | wc -l)
nfail=$(awk '$2 == "fail"' "$work/status.txt" | wc -l)
nnot=$(awk '$2 == "notrun"' "$work/status.txt" | wc -l)
echo
echo "| result  | tests |"
echo "|---------|-------|"
echo "| pass    | $npass |"
echo "| fail    | $nfail |"
echo "| not run | $nnot |"
echo "| applicable (pass + fail) | $((npass + nfail)) |"
echo
known_why() { # FILE TEST: the reason FILE gives for TEST, if listed
  grep -hE "^$2[[:space:]]" "$1" 2> /dev/null | head -1 | cut -f2- -d' ' | sed 's/^[[:space:]]*//'
}
unknown=0
echo "Failures (reason: first lines of the diff or the check message):"
while read -r t s; do
  [ "$s" = fail ] || continue
  reason=
  bad=$(ls "$work"/results/*/"$t".out.bad "$work"/results/"$t".out.bad 2> /dev/null | head -1)
  full=$(ls "$work"/results/*/"$t".full "$work"/results/"$t".full 2> /dev/null | head -1)
  if [ -n "$bad" ]; then
    reason=$(diff -u "$xfs/tests/$t.out" "$bad" 2> /dev/null | grep -E '^[+-][^+-]' | head -3 | tr '\n' ' ')
  fi
  [ -n "$reason" ] || reason=$(grep -A3 -E "^$t[ \t]" "$work/check.log" | grep -vE "^$t[ \t]" | head -2 | tr '\n' ' ')
  [ -n "$reason" ] || reason=$(grep -E "^$t[ \t]" "$work/check.log" | head -1)
  if [ $image = 1 ]; then
    # This mode's own list first; then the memfs list without its memfs
    # reasons (the ext4 type keeps its data across a remount).
    why=$(known_why "$here/xfstests-known-ext4.txt" "$t")
    [ -n "$why" ] || why=$(known_why "$known" "$t" | grep -v memfs)
  else
    why=$(known_why "$known" "$t")
  fi
  if [ -n "$why" ]; then
    tag="known: $why"
  else
    tag=NEW; unknown=$((unknown + 1))
  fi
  echo "  $t [$tag] ${reason:0:300}"
  [ -n "$full" ] && echo "      full log: $full"
done < "$work/status.txt"
echo
echo "Not run (reason):"
grep -E '\[not run\]' "$work/check.log" | sed 's/^/  /' | head -1000 > "$work/notrun.txt"
awk '{ $1 = $1 } 1' "$work/notrun.txt" | sed -E 's/^[^ ]+ +\[not run\] +//' | sort | uniq -c | sort -rn | head -40
echo
if grep -l 'panicked' "$work"/daemon-*.log > /dev/null 2>&1; then
  echo "Daemon panics (see $work/daemon-*.log):"
  grep -h -A2 'panicked' "$work"/daemon-*.log | head -20
  unknown=$((unknown + 1))
fi
if [ $image = 1 ]; then
  echo
  if [ -s "$work/fsck.log" ]; then
    echo "e2fsck -fn before a mount found errors (the test named last the image's user before):"
    sed 's/^/  /' "$work/fsck.log" | head -50
    unknown=$((unknown + 1))
  else
    echo "e2fsck -fn before every mount: no errors"
  fi
  echo "Final e2fsck -fn of the images:"
  for img in "$test_dev" "$scratch_dev"; do
    echo "  $img:"
    sed 's/^/    /' "$work/fsck-final-${img##*/}.log"
  done
  grep -q 'exit [^0]' "$work/fsck-final.log" && unknown=$((unknown + 1))
fi
echo
echo "xfstests: $npass passed, $nfail failed ($unknown not in ci/xfstests-known.txt), $nnot not run; check.log in $work"
[ $unknown = 0 ]
