#!/usr/bin/env bash
# Where the time of a remote mount goes (issue 11's breakdown): a 512 MiB `dd bs=1M
# conv=fsync` write and a cold `dd bs=1M` read through `zcfs mount 127.0.0.1:PORT` of a
# `zcfs serve` on loopback, sampled system-wide by perf; samples of the writer/reader (dd),
# the mount's threads and the server's threads are sorted into what they were doing.
# Prints CPU seconds per GiB by process and the share of each kind of work.
#
#   bash scripts/profile-mount.sh [ZCFS_BINARY]     (default target/release/zcfs)
#
# Needs root and perf (linux-perf). Everything started is stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=${1:-$PWD/target/release/zcfs}
W=$(mktemp -d /tmp/zcfs-profile.XXXXXX)
IMG=/dev/shm/zcfs-profile-$$.img SRC=/dev/shm/zcfs-profile-src-$$
PIDS=()
cleanup() {
  set +e
  mountpoint -q "$W/mnt" && umount "$W/mnt"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$W" "$IMG" "$SRC"
}
trap cleanup EXIT
command -v perf >/dev/null || bash scripts/setup.sh linux-perf
PORT=$((20000 + $$ % 20000))
"$Z" mkfs "$IMG" --size 2G >/dev/null
"$Z" serve "$IMG" --listen "127.0.0.1:$PORT" --insecure --no-root-squash >"$W/serve.out" 2>"$W/serve.err" & SP=$!; PIDS+=($SP)
for _ in $(seq 100); do grep -q serving "$W/serve.out" 2>/dev/null && break; sleep 0.05; done
mkdir -p "$W/mnt"
"$Z" mount "127.0.0.1:$PORT" "$W/mnt" 2>"$W/mount.err" & MP=$!; PIDS+=($MP)
for _ in $(seq 200); do mountpoint -q "$W/mnt" && break; sleep 0.05; done
head -c $((512 << 20)) /dev/urandom > "$SRC"
sleep 2   # let a prefault thread (if any) get ahead, as on a server that has been up
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
phase() {   # phase name dd-args...
  local name=$1; shift
  local s0 m0 t0 t1 s1 m1
  s0=$(ticks $SP); m0=$(ticks $MP); t0=$(date +%s.%N)
  perf record -a -g -F 499 -o "$W/$name.data" -- dd "$@" status=none 2>/dev/null
  t1=$(date +%s.%N); s1=$(ticks $SP); m1=$(ticks $MP)
  local hz; hz=$(getconf CLK_TCK)
  awk -v n="$name" -v a="$t0" -v b="$t1" -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v hz="$hz" 'BEGIN {
    printf "%s: %.0f MB/s; CPU per GiB: server %.2f s, mount %.2f s\n", n, 536870912 / (b - a) / 1e6, 2 * s / hz, 2 * m / hz }'
  perf report -i "$W/$name.data" --no-children --sort comm,sym -g none --stdio 2>/dev/null \
    | python3 "$PWD/scripts/profile-categories.py" "$name"
}
phase write if="$SRC" of="$W/mnt/big" bs=1M conv=fsync
sync; echo 3 > /proc/sys/vm/drop_caches
phase read if="$W/mnt/big" of=/dev/null bs=1M
