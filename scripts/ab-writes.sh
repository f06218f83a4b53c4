#!/usr/bin/env bash
# Large writes through a loopback mount, two builds alternating (A, B, A, B, ...): per
# round and build a fresh server and mount, three warm-up writes, then four 512 MiB
# `dd conv=fsync` at each block size; prints MB/s over the four and the CPU seconds per
# GiB of the server, the mount and dd (from /proc). Session 30's splice A/B
# (docs/results/ab-cpu-s30.txt) was taken this way.
#
#   bash scripts/ab-writes.sh A_ZCFS B_ZCFS [ROUNDS] [BLOCK_SIZES]   (default 5, "1M 128k")
#
# Needs root. Raises fs.pipe-max-size to 2 MiB for the run where it is lower (the
# mount's splice pipes need it without CAP_SYS_RESOURCE) and restores it. Everything
# started is stopped by PID on exit.
set -euo pipefail
A=$1 B=$2 ROUNDS=${3:-5} SIZES=${4:-"1M 128k"}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
PIPE_MAX_WAS=$(cat /proc/sys/fs/pipe-max-size)
W=$(mktemp -d /tmp/zcfs-ab-writes.XXXXXX)
SRC=/dev/shm/zcfs-ab-writes-src-$$
PIDS=() IMG=""
stop() {
  set +e
  mountpoint -q "$W/mnt" && umount "$W/mnt"
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  PIDS=()
  [ -n "$IMG" ] && rm -f "$IMG"
  set -e
}
cleanup() { stop; rm -rf "$W" "$SRC"; echo "$PIPE_MAX_WAS" > /proc/sys/fs/pipe-max-size; }
trap cleanup EXIT
[ "$PIPE_MAX_WAS" -lt 2097152 ] && echo 2097152 > /proc/sys/fs/pipe-max-size
head -c $((512 << 20)) /dev/urandom > "$SRC"
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
one() {   # one LABEL ZCFS BS
  local z=$2 bs=$3 port=$((20000 + RANDOM % 20000))
  IMG=/dev/shm/zcfs-ab-writes-$$.img
  "$z" mkfs "$IMG" --size 4G >/dev/null
  "$z" serve "$IMG" --listen "127.0.0.1:$port" --insecure --no-root-squash >"$W/s.out" 2>"$W/s.err" & PIDS+=($!)
  for _ in $(seq 100); do grep -q serving "$W/s.out" 2>/dev/null && break; sleep 0.05; done
  mkdir -p "$W/mnt"
  "$z" mount "127.0.0.1:$port" "$W/mnt" 2>"$W/m.err" & PIDS+=($!)
  for _ in $(seq 200); do mountpoint -q "$W/mnt" && break; sleep 0.05; done
  for _ in 1 2 3; do dd if="$SRC" of="$W/mnt/w" bs=1M status=none; rm "$W/mnt/w"; done
  local sp=${PIDS[0]} mp=${PIDS[1]} s0 m0 t0 t1 s1 m1 e u sy
  s0=$(ticks "$sp"); m0=$(ticks "$mp"); t0=$(date +%s.%N)
  /usr/bin/time -f "%e %U %S" -o "$W/dd.t" bash -c \
    "for i in 1 2 3 4; do dd if=$SRC of=$W/mnt/f bs=$bs conv=fsync status=none; done"
  t1=$(date +%s.%N); s1=$(ticks "$sp"); m1=$(ticks "$mp")
  read -r e u sy < "$W/dd.t"
  awk -v l="$1" -v bs="$bs" -v a="$t0" -v b="$t1" -v s=$((s1 - s0)) -v m=$((m1 - m0)) -v u="$u" -v sy="$sy" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%s %s MB/s %.0f  CPU s/GiB: server %.2f mount %.2f dd %.2f\n", bs, l, 4 * 536.870912 / (b - a), s / hz / 2, m / hz / 2, (u + sy) / 2 }'
  stop
}
for _ in $(seq "$ROUNDS"); do
  for bs in $SIZES; do one A "$A" "$bs"; one B "$B" "$bs"; done
done
