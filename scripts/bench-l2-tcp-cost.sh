#!/usr/bin/env bash
# What the layer-2 lane costs bulk TCP on the same interface (issue 12): `zcfs cp` of a
# 512 MiB file from a `zcfs serve` to /dev/null through the client library, across a
# two-queue veth pair, in rounds alternating between
#   plain:    the server without --l2, nothing attached to the client's veth end;
#   with-l2:  the server with --l2 on its end and a `zcfs mount --l2` holding the lane (and
#             so zcfs's XDP program) on the client's end, idle, while the copy runs on TCP;
#   own-pair: the lane on a second veth pair of its own between the same namespaces (no
#             addresses: `zcfs-bench netns up --lane-pair`), server and mount --l2 on its
#             ends, idle; the copy runs on TCP over the first pair, which has no XDP program.
# Prints MB/s per copy, the medians and their ratios to plain. Root; everything started
# here is stopped by PID; every wait and copy is bounded.
#
#   bash scripts/bench-l2-tcp-cost.sh [ROUNDS]      (default 3; two copies per round and case)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
Z=$PWD/target/release/zcfs ZB=$PWD/target/release/zcfs-bench
# Always (a no-op when fresh): a stale zcfs-bench may lack `netns up --lane-pair`. Its
# warnings (vendored fuser's) are shown only if the build fails.
if ! built=$(cargo build --release --quiet -p zcfs -p zcfs-bench 2>&1); then
  echo "$built" >&2
  exit 1
fi
IMG=/dev/shm/zcfs-l2tcp-$$.img SRCF=/dev/shm/zcfs-l2tcp-src-$$ LOG=$(mktemp -d)
SP="" MPID="" MP="" SRV="" CLI=""
cleanup() {
  set +e
  [ -n "$MP" ] && mountpoint -q "$MP" && umount "$MP"
  for p in $MPID $SP; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ -n "$MP" ] && rmdir "$MP"
  [ -n "$SRV" ] && "$ZB" netns down "$SRV" "$CLI"
  rm -rf "$IMG" "$SRCF" "$LOG"
}
trap cleanup EXIT
NS=$("$ZB" netns up --owner $$ --label l2tcp --queues 2 --lane-pair)
eval "$NS"
"$Z" mkfs "$IMG" --size 2G >/dev/null
head -c $((512 << 20)) /dev/urandom >"$SRCF"
PORT=7400
declare -A RATES
xdp_on() { # namespace interface: whether an XDP program is attached there
  ip -n "$1" link show "$2" | grep -q "xdp"
}
one() { # case-name server-args...
  local name=$1; shift
  PORT=$((PORT + 1))   # a fresh port and log per server: no stale "serving" line
  rm -f "$LOG/srv"
  "$ZB" netns exec "$SRV" -- "$Z" serve "$IMG" --listen "$SRV_IP:$PORT" --insecure --no-root-squash "$@" >"$LOG/srv" 2>&1 & SP=$!
  for _ in $(seq 200); do grep -q serving "$LOG/srv" && break; sleep 0.05; done
  grep -q serving "$LOG/srv" || { echo "the server did not start:" >&2; cat "$LOG/srv" >&2; exit 1; }
  timeout 120 "$ZB" netns exec "$CLI" -- "$Z" cp "$SRCF" "$SRV_IP:$PORT:/f"
  local lane_if=""
  case $name in
    with-l2) lane_if=veth-cli ;;
    own-pair) lane_if=$CLI_LANE_IF ;;
  esac
  if [ -n "$lane_if" ]; then
    MP=$(mktemp -d)
    "$ZB" netns exec "$CLI" -- "$Z" mount "$SRV_IP:$PORT" "$MP" --l2 "$lane_if" >"$LOG/mnt" 2>&1 & MPID=$!
    for _ in $(seq 200); do mountpoint -q "$MP" && break; sleep 0.05; done
    mountpoint -q "$MP" || { echo "the mount did not come up:" >&2; cat "$LOG/mnt" >&2; exit 1; }
    ls "$MP" >/dev/null
    "$ZB" netns exec "$CLI" -- "$Z" stat "$MP" | grep -q "^layer 2 *up on $lane_if " \
      || { echo "$name: the mount's lane is not up on $lane_if" >&2; exit 1; }
    xdp_on "$CLI" "$lane_if" || { echo "no XDP program on $lane_if" >&2; exit 1; }
  fi
  # TCP's pair has zcfs's XDP program in with-l2 only (on both ends).
  local want=no ns dev got
  [ "$name" = with-l2 ] && want=yes
  for ns_dev in "$SRV veth-srv" "$CLI veth-cli"; do
    read -r ns dev <<<"$ns_dev"
    got=no; xdp_on "$ns" "$dev" && got=yes
    [ "$got" = "$want" ] || { echo "$name: XDP program on $dev: $got, expected $want" >&2; exit 1; }
  done
  for _ in 1 2; do
    local t0 t1
    t0=$(date +%s.%N)
    timeout 120 "$ZB" netns exec "$CLI" -- "$Z" cp "$SRV_IP:$PORT:/f" /dev/null
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
  one own-pair --l2 "$SRV_LANE_IF"
done
declare -A MEDIAN
for name in plain with-l2 own-pair; do
  MEDIAN[$name]=$(printf '%s\n' ${RATES[$name]} | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}')
  echo "$name median: ${MEDIAN[$name]} MB/s ($(python3 -c "print(f'{${MEDIAN[$name]} / ${MEDIAN[plain]}:.2f}')")x plain)"
done
