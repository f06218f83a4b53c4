#!/usr/bin/env bash
# Builds or mount options side by side over a veth pair, in rounds whose order rotates,
# so that drift on a shared machine hits every target alike. A target is DIR or
# DIR:OPTIONS (DIR holds zcfs and zcfs-bench; OPTIONS are the mount's -o). Each target
# gets its own server (DIR's zcfs, in the server namespace) and mount (in the client
# namespace). Per round and target: the client library against the target's server
# (zcfs-bench library, DIR's build), fio 4 KiB O_DIRECT random reads at QD1 (psync) and
# QD16 (io_uring) and 4 KiB buffered random writes at QD1 through the mount, and with
# --meta 2,000 file creates, a cold ls -l, git clone and tar x. Prints per-round CSV
# lines, then the medians per target.
#
#   bash scripts/ab-veth.sh [--rounds N] [--meta] [--no-library] TARGET TARGET...
#
# Session 33 used it for the receive buffer (two builds) and -o readers= (one build,
# several options). Needs root and fio. Everything started is stopped by PID on exit.
set -euo pipefail
ROUNDS=5 META=0 LIB=1 TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --meta) META=1 ;;
    --no-library) LIB=0 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) TARGETS+=("$1") ;;
  esac
  shift
done
[ ${#TARGETS[@]} -ge 1 ] || { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
ZB=${TARGETS[0]%%:*}/zcfs-bench
W=$(mktemp -d /tmp/zcfs-ab-veth.XXXXXX)
PIDS=() NETNS=() MOUNTS=()
cleanup() {
  set +e
  for m in "${MOUNTS[@]}"; do umount -l "$m"; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ ${#NETNS[@]} -gt 0 ] && "$ZB" netns down "${NETNS[@]}"
  rm -rf "$W" /dev/shm/zcfs-ab-veth-$$-*
}
trap cleanup EXIT
eval "$("$ZB" netns up --owner $$ --label abv --subnet 218)"; NETNS+=("$SRV" "$CLI")
i=0
for t in "${TARGETS[@]}"; do
  i=$((i + 1)); d=${t%%:*} o=""; [ "$t" != "$d" ] && o=${t#*:}
  img=/dev/shm/zcfs-ab-veth-$$-$i.img
  "$d/zcfs" mkfs "$img" --size 2G --inodes 100000 >/dev/null
  "$ZB" netns exec "$SRV" -- "$d/zcfs" serve "$img" --listen "$SRV_IP:$((7100 + i))" --insecure \
    --no-root-squash >"$W/serve$i.out" 2>"$W/serve$i.err" & PIDS+=($!)
  for _ in $(seq 100); do grep -q serving "$W/serve$i.out" 2>/dev/null && break; sleep 0.05; done
  mkdir -p "$W/m$i"
  "$ZB" netns exec "$CLI" -- "$d/zcfs" mount "$SRV_IP:$((7100 + i))" "$W/m$i" ${o:+-o "$o"} \
    2>"$W/mount$i.err" & PIDS+=($!); MOUNTS+=("$W/m$i")
  for _ in $(seq 200); do mountpoint -q "$W/m$i" && break; sleep 0.05; done
  mountpoint -q "$W/m$i" || { echo "target $t: no mount" >&2; exit 1; }
  dd if=/dev/urandom of="$W/m$i/fio.dat" bs=1M count=256 status=none conv=fsync
done
if [ $META = 1 ]; then
  tar -C "$REPO" -cf "$W/src.tar" crates docs
  git clone -q --bare "$REPO" "$W/repo.git"
fi
secs() { local a b; a=$(date +%s.%N); "$@" >/dev/null 2>&1; b=$(date +%s.%N); awk -v a="$a" -v b="$b" 'BEGIN { printf "%.4f", b - a }'; }
fio_row() {   # fio_row FILE QD [randwrite] -> "IOPS p50_us"
  local eng=psync rw=${3:-randread} direct=1 key=read; [ "$2" -gt 1 ] && eng=io_uring
  # Buffered random writes through the page cache, as an editor or a database would.
  [ "$rw" = randwrite ] && direct=0 key=write
  timeout 60 fio --name=t --filename="$1" --rw="$rw" --bs=4k --direct=$direct --ioengine=$eng \
    --iodepth="$2" --runtime=2 --time_based --output-format=json 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]["'$key'"]
print("%.0f %.1f" % (j["iops"], j["clat_ns"]["percentile"]["50.000000"] / 1000))'
}
echo "round,target,test,value,unit" > "$W/rows.csv"
row() { echo "$1" | tee -a "$W/rows.csv"; }
n=${#TARGETS[@]}
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    i=$(( (k + r) % n + 1 )); t=${TARGETS[$((i - 1))]}; d=${t%%:*}
    if [ $LIB = 1 ]; then
      "$ZB" netns exec "$CLI" -- "$d/zcfs-bench" library "$SRV_IP:$((7100 + i))" --repeat 1 --seconds 1 \
        | while IFS=, read -r _ test v unit; do row "$r,$t,library-$test,$v,$unit"; done
    fi
    for qd in 1 16; do
      read -r iops p50 < <(fio_row "$W/m$i/fio.dat" $qd)
      row "$r,$t,mount-randread-4k-qd$qd,$iops,IOPS"
      row "$r,$t,mount-randread-4k-qd$qd,$p50,p50_us"
    done
    read -r iops p50 < <(fio_row "$W/m$i/fio.dat" 1 randwrite)
    row "$r,$t,mount-buffered-randwrite-4k-qd1,$iops,IOPS"
    row "$r,$t,mount-buffered-randwrite-4k-qd1,$p50,p50_us"
    if [ $META = 1 ]; then
      s=$W/m$i/s; mkdir -p "$s/files"
      row "$r,$t,create-2000,$(secs "$ZB" create-files "$s/files" 2000),s"
      sync; echo 3 > /proc/sys/vm/drop_caches
      row "$r,$t,ls-l-2000,$(secs ls -l "$s/files"),s"
      row "$r,$t,git-clone,$(secs git clone -q "$W/repo.git" "$s/clone"),s"
      row "$r,$t,tar-x,$(secs tar -C "$s" -xf "$W/src.tar"),s"
      rm -rf "$s"
    fi
  done
done
echo
python3 - "$W/rows.csv" <<'PY'
import collections, csv, statistics, sys
v = collections.defaultdict(list)
order = []
for row in csv.DictReader(open(sys.argv[1])):
    if row["target"] not in order:
        order.append(row["target"])
    v[(row["test"], row["unit"], row["target"])].append(float(row["value"]))
tests = sorted({(t, u) for t, u, _ in v})
print("test,unit," + ",".join(order))
for t, u in tests:
    def fmt(x):
        return f"{x:.0f}" if x >= 1000 else f"{x:.4g}"
    print(f"{t},{u}," + ",".join(fmt(statistics.median(v[(t, u, g)])) if v[(t, u, g)] else "" for g in order))
PY
