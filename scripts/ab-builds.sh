#!/usr/bin/env bash
# Two builds of zcfs side by side on loopback, rounds interleaved (A, B, A, B, ...), so that
# drift on a shared machine hits both alike: small files through the mount (create+write+
# close, tar x, a cold ls -l, rm -rf), 4 KiB QD1/QD16 fio through the mount, and the client
# library against a fresh server each round. Prints per-round lines and a table of medians
# with the B/A ratio.
#
#   bash scripts/ab-builds.sh A_DIR B_DIR [ROUNDS]    (each DIR holds zcfs and zcfs-bench)
#
# Needs root (mounts, drop_caches) and fio. Everything started is stopped by PID on exit.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 2; }
A=$1 B=$2 R=${3:-5}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/zcfs-ab.XXXXXX)
PIDS=() MNTS=()
cleanup() {
  set +e
  for m in "${MNTS[@]}"; do mountpoint -q "$m" && umount "$m"; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$W" /dev/shm/zcfs-ab-$$-*
}
trap cleanup EXIT
serve() {   # serve NAME BIN_DIR PORT -> PID in SPID
  "$2/zcfs" mkfs "/dev/shm/zcfs-ab-$$-$1.img" --size 2G --inodes 200000 >/dev/null
  "$2/zcfs" serve "/dev/shm/zcfs-ab-$$-$1.img" --listen "127.0.0.1:$3" --insecure --no-root-squash \
    >"$W/$1.out" 2>/dev/null & SPID=$!; PIDS+=($SPID)
  for _ in $(seq 100); do grep -q serving "$W/$1.out" 2>/dev/null && break; sleep 0.05; done
}
PORT=$((21000 + $$ % 20000))
declare -A MPORT=([A]=$PORT [B]=$((PORT + 1)))
for n in A B; do
  d=${!n}; serve "$n" "$d" "${MPORT[$n]}"
  mkdir -p "$W/mnt-$n"
  "$d/zcfs" mount "127.0.0.1:${MPORT[$n]}" "$W/mnt-$n" 2>/dev/null & PIDS+=($!); MNTS+=("$W/mnt-$n")
  for _ in $(seq 200); do mountpoint -q "$W/mnt-$n" && break; sleep 0.05; done
  dd if=/dev/urandom of="$W/mnt-$n/fio.dat" bs=1M count=64 conv=fsync status=none
done
tar -C "$REPO" -cf "$W/src.tar" crates docs
fio1() {   # fio1 DIR RW ENGINE QD DIRECT -> p50 µs (QD 1) or IOPS
  fio --name=t --filename="$1/fio.dat" --size=64M --rw="$2" --bs=4k --direct="$5" --ioengine="$3" \
    --iodepth="$4" --time_based=1 --runtime=2 --ramp_time=0.3 --norandommap=1 --randrepeat=0 \
    --lat_percentiles=1 --clat_percentiles=0 --percentile_list=50 --output-format=json 2>/dev/null |
    python3 -c 'import json, sys
t = sys.stdin.read(); j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] >= j["write"]["io_bytes"] else j["write"]
print("%.1f" % (list(d["lat_ns"]["percentile"].values())[0] / 1000) if sys.argv[1] == "1" else "%.0f" % (j["read"]["iops"] + j["write"]["iops"]))' "$4"
}
secs() { local t0; t0=$(date +%s.%N); "$@" >/dev/null 2>&1; awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.4f", b - a }'; }
OUT=$W/rounds.txt
for r in $(seq "$R"); do
  for n in A B; do
    d=${!n} m=$W/mnt-$n
    mkdir -p "$m/r$r/files"
    line="$n create=$(secs "$d/zcfs-bench" create-files "$m/r$r/files" 1000)"
    line+=" tar=$(secs tar -C "$m/r$r" -xf "$W/src.tar")"
    sync; echo 2 > /proc/sys/vm/drop_caches
    line+=" ls=$(secs ls -l "$m/r$r/files") rm=$(secs rm -rf "$m/r$r")"
    line+=" rr1=$(fio1 "$m" randread psync 1 1) rw1=$(fio1 "$m" randwrite psync 1 1)"
    line+=" bw1=$(fio1 "$m" randwrite psync 1 0) rr16=$(fio1 "$m" randread io_uring 16 1)"
    serve "lib-$n-$r" "$d" $((PORT + 10)); lp=$SPID
    lib=$("$d/zcfs-bench" library "127.0.0.1:$((PORT + 10))" --repeat 1 --seconds 0.5 2>/dev/null || true)
    kill "$lp"; wait "$lp" 2>/dev/null || true; rm -f "/dev/shm/zcfs-ab-$$-lib-$n-$r.img"
    for k in randread-4k-qd1 randwrite-4k-qd1 randread-4k-qd16; do
      line+=" lib-$k=$(awk -F, -v k="$k" '$2 == k { print $3 }' <<<"$lib")"
    done
    echo "round $r $line" | tee -a "$OUT"
  done
done
python3 - "$OUT" <<'PY'
import statistics, sys
v = {}
for l in open(sys.argv[1]):
    p = l.split()
    for kv in p[3:]:
        k, x = kv.split("=")
        if x:
            v.setdefault((p[2], k), []).append(float(x))
keys = [k for (n, k) in v if n == "A"]
print("| measure | A | B | B / A |\n|---|---:|---:|---:|")
for k in dict.fromkeys(keys):
    if ("B", k) in v:
        a, b = statistics.median(v[("A", k)]), statistics.median(v[("B", k)])
        print(f"| {k} | {a:g} | {b:g} | {b / a:.2f}x |")
PY
