#!/usr/bin/env bash
# What the layer-2 lane costs bulk TCP on the same interface (issue 12): `zcfs cp` of a
# 512 MiB file from a `zcfs serve` to /dev/null through the client library, across a
# two-queue veth pair, in rounds alternating between
#   plain:   the server without --l2, nothing attached to the client's veth end;
#   with-l2: the server with --l2 on its end and a `zcfs mount --l2` holding the lane (and
#            so zcfs's XDP program) on the client's end, idle, while the copy runs on TCP.
# Prints MB/s per copy and the medians. Root; everything started here is stopped by PID.
#
#   bash scripts/bench-l2-tcp-cost.sh [ROUNDS]      (default 3; two copies per round and case)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
Z=$PWD/target/release/zcfs ZB=$PWD/target/release/zcfs-bench
[ -x "$Z" ] && [ -x "$ZB" ] || cargo build --release --quiet -p zcfs -p zcfs-bench
eval "$("$ZB" netns up --owner $$ --label l2tcp --queues 2)"
IMG=/dev/shm/zcfs-l2tcp-$$.img SRCF=/dev/shm/zcfs-l2tcp-src-$$ LOG=$(mktemp -d)
SP="" MPID="" MP=""
cleanup() {
  set +e
  [ -n "$MP" ] && mountpoint -q "$MP" && umount "$MP"
  for p in $MPID $SP; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ -n "$MP" ] && rmdir "$MP"
  "$ZB" netns down "$SRV" "$CLI"
  rm -rf "$IMG" "$SRCF" "$LOG"
}
trap cleanup EXIT
"$Z" mkfs "$IMG" --size 2G >/dev/null
head -c $((512 << 20)) /dev/urandom >"$SRCF"
PORT=7400
declare -A RATES
one() { # case-name server-args...
  local name=$1; shift
  PORT=$((PORT + 1))   # a fresh port and log per server: no stale "serving" line
  rm -f "$LOG/srv"
  "$ZB" netns exec "$SRV" -- "$Z" serve "$IMG" --listen "$SRV_IP:$PORT" --insecure --no-root-squash "$@" >"$LOG/srv" 2>&1 & SP=$!
  for _ in $(seq 200); do grep -q serving "$LOG/srv" && break; sleep 0.05; done
  "$ZB" netns exec "$CLI" -- "$Z" cp "$SRCF" "$SRV_IP:$PORT:/f"
  if [ "$name" = with-l2 ]; then
    MP=$(mktemp -d)
    "$ZB" netns exec "$CLI" -- "$Z" mount "$SRV_IP:$PORT" "$MP" --l2 veth-cli >"$LOG/mnt" 2>&1 & MPID=$!
    for _ in $(seq 200); do mountpoint -q "$MP" && break; sleep 0.05; done
    ls "$MP" >/dev/null
    ip -n "$CLI" link show veth-cli | grep -q "xdp" || { echo "no XDP program on veth-cli" >&2; exit 1; }
  fi
  for _ in 1 2; do
    local t0 t1
    t0=$(date +%s.%N)
    "$ZB" netns exec "$CLI" -- "$Z" cp "$SRV_IP:$PORT:/f" /dev/null
    t1=$(date +%s.%N)
    local r; r=$(python3 -c "print(round(512 / ($t1 - $t0)))")
    echo "$name: $r MB/s"
    RATES[$name]="${RATES[$name]:-} $r"
  done
  if [ -n "$MP" ]; then umount "$MP"; wait "$MPID" 2>/dev/null || true; rmdir "$MP"; MP="" MPID=""; fi
  kill "$SP"; wait "$SP" 2>/dev/null || true; SP=""
}
for _ in $(seq "$ROUNDS"); do
  one plain
  one with-l2 --l2 veth-srv
done
for name in plain with-l2; do
  echo "$name median: $(printf '%s\n' ${RATES[$name]} | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}') MB/s"
done
