#!/usr/bin/env bash
# FUSE frontend cost (DPFS's null-backend measurement): fio 4 KiB random read/write at
# QD1 (psync) and QD16 (io_uring), O_DIRECT, on `zcfs mount null`, beside libfuse's C
# reference (passthrough_hp) and tmpfs, in the same run. The baseline and the fio jobs
# come from ../shared/bench (fuse_null.sh and lib.sh), called here, not copied.
# Results: $RESULTS_DIR/fuse_null.csv (+ rows for zcfs), and a table on stdout.
set -u
cd "$(dirname "$0")/.."
REPO=$PWD
SHARED=${SHARED_BENCH:-$REPO/../shared/bench}
[ -f "$SHARED/lib.sh" ] || { echo "no $SHARED/lib.sh (the shared bench scripts)" >&2; exit 2; }
export FIO_RUNTIME=${FIO_RUNTIME:-4}
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet -p zcfs || exit 1
Z=$REPO/target/release/zcfs

# 1. The baseline: tmpfs and passthrough_hp (builds libfuse from Debian's source).
bash "$SHARED/fuse_null.sh" || echo "fuse_null.sh failed; zcfs rows follow anyway" >&2

# 2. zcfs on the same fio jobs, appended to the same CSV.
source "$SHARED/lib.sh"
SUITE=fuse_null
CSV_FILE="$RESULTS_DIR/$SUITE.csv"
[ -f "$CSV_FILE" ] || csv_begin fuse_null
MNT=$WORK/zcfs-null-mnt
ZPID=""
zcfs_cleanup() {
  [ -n "$ZPID" ] && kill -TERM "$ZPID" 2>/dev/null && wait "$ZPID" 2>/dev/null
  mountpoint -q "$MNT" && umount -l "$MNT"
  ZPID=""
}
trap zcfs_cleanup EXIT
run_zcfs() {   # run_zcfs target source [mount args...]
  local target=$1 source=$2; shift 2
  mkdir -p "$MNT"
  "$Z" mount "$source" "$MNT" "$@" 2>"$WORK/zcfs-mount.log" &
  ZPID=$!
  for _ in $(seq 100); do mountpoint -q "$MNT" && break; sleep 0.1; done
  mountpoint -q "$MNT" || { log "zcfs mount $source failed: $(tail -2 "$WORK/zcfs-mount.log")"; return 1; }
  FIO_NOTE="zcfs $* " fio_qd1_qd16_zcfs "$target" "$MNT"
  zcfs_cleanup
}
fio_qd1_qd16_zcfs() {
  fio_prepare "$2"
  fio_one "$1" "randread-4k-qd1" "$2" randread 4k 1 psync --direct=1
  fio_one "$1" "randwrite-4k-qd1" "$2" randwrite 4k 1 psync --direct=1
  fio_qd16 "$1" "$2"
}
run_zcfs zcfs-null null
IMG=/dev/shm/zcfs-fusenull-$$.img
"$Z" mkfs "$IMG" --size 1G --force >/dev/null && run_zcfs zcfs-local "$IMG"
rm -f "$IMG"
csv_to_json

# 3. The comparison.
python3 - "$CSV_FILE" <<'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]))]
get = lambda t, test: next((r for r in rows if r["target"] == t and r["test"] == test), None)
print("\n| test | tmpfs | passthrough_hp (libfuse) | zcfs null | zcfs null / libfuse | zcfs local volume |")
print("|---|---:|---:|---:|---:|---:|")
for test in ["randread-4k-qd1", "randwrite-4k-qd1", "randread-4k-qd16", "randwrite-4k-qd16"]:
    cells = []
    for t in ["tmpfs", "fuse-hp", "zcfs-null"]:
        r = get(t, test)
        cells.append(r)
    def fmt(r):
        if not r or r["iops"] in ("NA", ""): return "-"
        return f'{float(r["lat_p50_us"]):.1f} µs p50, {float(r["iops"])/1000:.0f}k IOPS'
    hp, zn, zl = cells[1], cells[2], get("zcfs-local", test)
    ratio = "-"
    if hp and zn and hp["iops"] not in ("NA", "") and zn["iops"] not in ("NA", ""):
        ratio = f'{float(zn["iops"]) / float(hp["iops"]):.2f}x IOPS'
    print(f"| {test} | {fmt(cells[0])} | {fmt(hp)} | {fmt(zn)} | {ratio} | {fmt(zl)} |")
PY
