#!/usr/bin/env bash
# Server requests per user operation through a remote mount, for one or more builds side
# by side: what each workload costs in round trips, counted by the server (`zcfs stat
# ADDR:PORT`), so the figures do not move with the machine's load as timings do.
# Workloads: create+write+close of 1,000 files of 4 KiB, `tar x` of the source tree,
# `git clone` of this repository (bare copy), a cold `ls -l` of the 1,000 files, `rm -rf`
# of it all. Prints one line per build and
# workload: the total and the count per operation.
#
#   bash scripts/round-trips.sh BUILD_DIR [BUILD_DIR...]   (each DIR holds zcfs and zcfs-bench)
#
# Needs root (mounts, drop_caches). Everything started is stopped by PID on exit.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
REPO=$(cd "$(dirname "$0")/.." && pwd)
W=$(mktemp -d /tmp/zcfs-rt.XXXXXX)
PIDS=() MNTS=()
cleanup() {
  set +e
  for m in "${MNTS[@]}"; do mountpoint -q "$m" && umount "$m"; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$W" /dev/shm/zcfs-rt-$$-*
}
trap cleanup EXIT
tar -C "$REPO" -cf "$W/src.tar" crates
git clone -q --bare "$REPO" "$W/repo.git"
PORT=$((23000 + $$ % 20000))
i=0
for d in "$@"; do
  port=$((PORT + i)) img=/dev/shm/zcfs-rt-$$-$i.img m=$W/mnt-$i
  "$d/zcfs" mkfs "$img" --size 2G --inodes 200000 >/dev/null
  "$d/zcfs" serve "$img" --listen "127.0.0.1:$port" --insecure --no-root-squash \
    >"$W/srv-$i.out" 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do grep -q serving "$W/srv-$i.out" 2>/dev/null && break; sleep 0.05; done
  mkdir -p "$m"
  "$d/zcfs" mount "127.0.0.1:$port" "$m" 2>/dev/null & PIDS+=($!); MNTS+=("$m")
  for _ in $(seq 200); do mountpoint -q "$m" && break; sleep 0.05; done
  python3 - "$d" "$m" "127.0.0.1:$port" "$W/src.tar" "$W/repo.git" <<'PY'
import re, subprocess, sys
build, m, addr, tarball, repo = sys.argv[1:]
def counts():
    out = subprocess.run([build + "/zcfs", "stat", addr], capture_output=True, text=True).stdout
    return {p[0]: int(p[1]) for p in (l.split() for l in out.splitlines())
            if len(p) >= 3 and re.fullmatch(r"[a-z_0-9]+", p[0]) and p[1].isdigit()}
def sh(c):
    subprocess.run(c, shell=True, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for name, pre, cmd in [
    ("create 1000 x 4 KiB", f"mkdir -p {m}/cf", f"{build}/zcfs-bench create-files {m}/cf 1000"),
    ("tar x", f"mkdir -p {m}/tx", f"tar -C {m}/tx -xf {tarball}"),
    ("git clone", "", f"git clone -q {repo} {m}/gc"),
    ("ls -l of 1000 (cold)", "sync; echo 2 > /proc/sys/vm/drop_caches", f"ls -l {m}/cf"),
    ("rm -rf", "", f"rm -rf {m}/cf {m}/tx {m}/gc"),
]:
    if pre:
        sh(pre)
    a = counts(); sh(cmd); b = counts()
    # forget is posted in batches as the kernel evicts inodes: not a round trip anyone waits
    # for; payload counts bytes.
    d = {k: b[k] - a.get(k, 0) for k in b if b[k] > a.get(k, 0) and k not in ("stats", "forget", "payload")}
    print(f"{build} | {name} | {sum(d.values())} | " + ", ".join(f"{k} {v}" for k, v in sorted(d.items())))
PY
  i=$((i + 1))
done
