#!/usr/bin/env bash
# Every benchmark in one run: zcfs remote across a veth pair and local, through the client
# library and through FUSE, beside the baselines a user would pick instead (tmpfs, NFS-Ganesha
# with a libnfs client, sshfs) and the machine's limits (raw TCP on the same link, memcpy).
#
#   bash scripts/bench.sh            short mode, about 8 minutes (ends with the mount table)
#   bash scripts/bench.sh --full     full mode (adds the shared baselines: limits, tmpfs, NFS, sshfs)
#   bash scripts/bench.sh --nfs      also the NFS baseline in short mode (the layer-2 lane's QD1 figures
#                                    beside NFS-Ganesha's in one run, issue 12)
#   bash scripts/bench.sh --tbf      also shape the veth to 1 Gbit/s (the RZCFS link) for a second remote run
#   bash scripts/bench.sh --publish  also write docs/benchmarks.md and its plots from this run
#
# Output: bench-results/<timestamp>/ with CSV and JSON of every figure, PNG plots and
# results.md. Everything started here runs on loopback or inside namespaces created here,
# is stopped by PID, and is cleaned up on exit, also when a step fails. Namespaces, CPU
# accounting and the small-file writer are zcfs-bench subcommands (crates/bench); the
# namespaces carry this script's pid, so those of a run killed before its cleanup are
# removed by the next run (or `zcfs-bench netns sweep`).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
MODE=short TBF=0 PUBLISH=0 NFS=0
for a in "$@"; do
  case "$a" in
    --full) MODE=full ;;
    --short) MODE=short ;;
    --tbf) TBF=1 ;;
    --nfs) NFS=1 ;;
    --publish) PUBLISH=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "usage: $0 [--full] [--nfs] [--tbf] [--publish] (--help for more)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "run as root (namespaces, mounts, tmpfs)" >&2; exit 1; }
SHARED=${SHARED_BENCH:-$REPO/../shared/bench}
OUT=$REPO/bench-results/$(date +%Y%m%d-%H%M%S)-$MODE
mkdir -p "$OUT"
export RESULTS_DIR=$OUT/csv WORK=/tmp/zcfs-bench-$$
export FIO_RUNTIME=${FIO_RUNTIME:-$([ $MODE = full ] && echo 4 || echo 1)}
export FIO_SIZE=${FIO_SIZE:-$([ $MODE = full ] && echo 256M || echo 64M)}
mkdir -p "$RESULTS_DIR" "$WORK"
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/setup.sh build-essential pkg-config fuse3 fio git iproute2 util-linux python3-matplotlib python3-numpy sshfs openssh-server openssh-client
cargo build --release --quiet -p zcfs -p zcfs-bench
Z=$REPO/target/release/zcfs
ZB=$REPO/target/release/zcfs-bench
source "$SHARED/lib.sh"   # fio_one, fio_suite, fio_qd16, fio_prepare, row, csv_begin, log

# ------------------------------------------------------------------ cleanup
PIDS=() MOUNTS=() NETNS=() FILES=()
cleanup() {
  set +e
  local m p n
  for m in "${MOUNTS[@]}"; do mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }; done
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  # Also stops what is still running inside (sshd's per-connection children).
  [ ${#NETNS[@]} -gt 0 ] && "$ZB" netns down "${NETNS[@]}"
  for m in "${FILES[@]}"; do rm -rf "$m"; done
  rm -rf "$WORK"
}
trap cleanup EXIT

step() { log "== $*"; }
wait_mount() { local i; for i in $(seq 200); do mountpoint -q "$1" && return 0; sleep 0.05; done; log "no mount at $1"; return 1; }

# ------------------------------------------------------------------ 1. machine limits and baselines (full mode)
BASELINES=()
[ $MODE = full ] && BASELINES=(limits tmpfs nfs sshfs)
[ $MODE = short ] && [ $NFS = 1 ] && BASELINES=(nfs)
for s in "${BASELINES[@]}"; do
  step "baseline: $s.sh"
  WITH_TBF=$TBF bash "$SHARED/$s.sh" || log "$s.sh failed; continuing"
done

# ------------------------------------------------------------------ 2. zcfs client library: remote and local
# The layer-2 lane beside TCP in the same run (issue 12) when root and AF_XDP allow it.
TRANSPORTS=tcp
if WHY=$("$ZB" l2-check); then TRANSPORTS=tcp,l2; else log "layer 2 skipped: $WHY"; fi
step "zcfs-bench remote ($MODE, transports $TRANSPORTS)"
"$ZB" remote $([ $MODE = short ] && echo --short) --transport "$TRANSPORTS" --l2-poll wait,busy --out "$OUT" 2>"$OUT/remote.log"
grep -E '^(l2/tcp|layer 2 skipped|lane client)' "$OUT/remote.log" || true
if [ "$TRANSPORTS" = tcp,l2 ]; then
  # Issue 12: 4 KiB QD1 reads through a remote FUSE mount over layer 2 (and over TCP)
  # beside the library's own on the same server, both lane poll modes, rounds alternated.
  step "zcfs-bench remote-mount: 4 KiB QD1 through a mount beside the library, TCP and layer 2"
  "$ZB" remote-mount --transport tcp,l2 --l2-poll wait,busy --rounds "$([ $MODE = full ] && echo 5 || echo 3)" \
    --seconds "$([ $MODE = full ] && echo 2 || echo 1)" --out "$OUT" 2>"$OUT/remote-mount.log" >/dev/null \
    && grep -E '^- over layer 2' "$OUT/remote-mount.md" \
    || log "zcfs-bench remote-mount failed; see $OUT/remote-mount.log"
fi
if [ $TBF = 1 ]; then
  step "zcfs-bench remote over a 1 Gbit/s veth"
  mkdir -p "$OUT/tbf1g"
  "$ZB" remote $([ $MODE = short ] && echo --short) --tbf 1gbit --out "$OUT/tbf1g" 2>"$OUT/tbf1g/remote.log"
fi
step "zcfs-bench local ($MODE)"
"$ZB" local $([ $MODE = short ] && echo --short) --out "$OUT" 2>"$OUT/local.log"
step "zcfs-bench samehost ($MODE): direct map and shared buffer beside FUSE and in-process (issue 13)"
"$ZB" samehost $([ $MODE = short ] && echo --quick) --out "$OUT" 2>"$OUT/samehost.log" \
  || log "zcfs-bench samehost failed; see $OUT/samehost.log"

# ------------------------------------------------------------------ 3. FUSE: zcfs local, zcfs remote across veth, tmpfs
csv_begin fuse
# CPU per operation of every fio job: fio's own user+system time plus that of the file
# system's processes (CPU_PIDS: the zcfs mount and server; tmpfs has none, its work is
# in fio's system time).
CPU_CSV=$RESULTS_DIR/cpu.csv
echo "target,test,ops,fio_cpu_us_per_op,fs_cpu_us_per_op" > "$CPU_CSV"
CPU_PIDS=()
eval "$(declare -f fio_one | sed '1s/^fio_one/lib_fio_one/')"
fio_one() {
  local c0 c1; c0=$("$ZB" cpu-time "${CPU_PIDS[@]}")
  lib_fio_one "$@"
  c1=$("$ZB" cpu-time "${CPU_PIDS[@]}")
  "$ZB" fio-cpu-row "$WORK/fio-$1-$2.json" "$1" "$2" "$((c1 - c0))" >> "$CPU_CSV" || true
}
fio_jobs() {   # fio_jobs target dir
  if [ $MODE = full ]; then
    fio_suite "$1" "$2"
  else
    fio_prepare "$2"
    local bs rw
    for bs in 4k 1m; do for rw in randread randwrite; do
      fio_one "$1" "$rw-$bs-qd1" "$2" "$rw" "$bs" 1 psync --direct=1
    done; done
    fio_one "$1" "mmap-randread-1k" "$2" randread 1k 1 mmap
    fio_one "$1" "mmap-randwrite-1k" "$2" randwrite 1k 1 mmap
  fi
  fio_qd16 "$1" "$2"
}

TMPFS=$WORK/tmpfs
tmpfs_mount "$TMPFS" 2G; MOUNTS+=("$TMPFS")
step "fio on tmpfs (the local ceiling)"
fio_jobs tmpfs "$TMPFS"

IMG=/dev/shm/zcfs-bench-fuse-$$.img; FILES+=("$IMG")
"$Z" mkfs "$IMG" --size 4G --inodes 200000 >/dev/null
LMP=$WORK/zcfs-local; mkdir -p "$LMP"
"$Z" mount "$IMG" "$LMP" 2>"$OUT/mount-local.log" & LPID=$!; PIDS+=($LPID); MOUNTS+=("$LMP")
wait_mount "$LMP"
step "fio on a local zcfs mount"
CPU_PIDS=("$LPID")
fio_jobs zcfs-local-fuse "$LMP"
CPU_PIDS=()

# Remote: server in one namespace, the FUSE client in another, joined by a veth pair
# (SRV, CLI, SRV_IP, CLI_IP). `netns exec` enters only the network namespace, so the mount
# is visible here, and becomes the program, so $! is the zcfs process.
NS_VARS=$("$ZB" netns up --owner $$ --label fuse --subnet 210); eval "$NS_VARS"; NETNS+=("$SRV" "$CLI")
RIMG=/dev/shm/zcfs-bench-fuse-remote-$$.img; FILES+=("$RIMG")
"$Z" mkfs "$RIMG" --size 4G --inodes 200000 >/dev/null
"$ZB" netns exec "$SRV" -- "$Z" serve "$RIMG" --listen "$SRV_IP:7070" --insecure --no-root-squash >"$WORK/serve.out" 2>"$OUT/serve-remote.log" & SPID=$!; PIDS+=($SPID)
for _ in $(seq 100); do grep -q serving "$WORK/serve.out" 2>/dev/null && break; sleep 0.05; done
RMP=$WORK/zcfs-remote; mkdir -p "$RMP"
"$ZB" netns exec "$CLI" -- "$Z" mount "$SRV_IP:7070" "$RMP" 2>"$OUT/mount-remote.log" & RPID=$!; PIDS+=($RPID); MOUNTS+=("$RMP")
wait_mount "$RMP"
step "fio on a remote zcfs mount across veth"
CPU_PIDS=("$RPID" "$SPID")
fio_jobs zcfs-remote-fuse "$RMP"
CPU_PIDS=()

# ------------------------------------------------------------------ 4. FUSE null backend vs queue depth (DPFS Fig. 2a)
NMP=$WORK/zcfs-null; mkdir -p "$NMP"
"$Z" mount null "$NMP" --direct-io 2>"$OUT/mount-null.log" & NULL_PID=$!; PIDS+=($NULL_PID); MOUNTS+=("$NMP")
wait_mount "$NMP"
CPU_PIDS=("$NULL_PID")
step "FUSE null backend, 4/16/64 KiB random reads at QD 1..32"
for bs in 4k 16k 64k; do
  for qd in 1 2 4 8 16 32; do
    fio_one zcfs-null "randread-$bs-qd$qd" "$NMP" randread "$bs" "$qd" io_uring --direct=1
  done
done
csv_to_json

# ------------------------------------------------------------------ 5. small files and real tools
SMALL=$RESULTS_DIR/smallfiles.csv
echo "target,test,count,seconds" > "$SMALL"
NFILES=$([ $MODE = full ] && echo 20000 || echo 2000)
tar -C "$REPO" -cf "$WORK/src.tar" crates docs
timed() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
# create-write-close-4k is timed around `zcfs-bench create-files`, whose start-up takes a few
# ms (the Python loop it replaces spent ~0.17 s starting on this VM, most of the old figure).
small_files() {   # small_files target dir
  local t=$1 d=$2/smallfiles-$$
  mkdir -p "$d"
  echo "$t,create-write-close-4k,$NFILES,$(timed "$ZB" create-files "$d" "$NFILES")" >> "$SMALL"
  echo 3 > /proc/sys/vm/drop_caches
  echo "$t,ls-l,$NFILES,$(timed ls -l "$d")" >> "$SMALL"
  echo "$t,git-clone,1,$(timed git clone -q --no-hardlinks "$REPO" "$d/clone")" >> "$SMALL"
  echo "$t,tar-x,1,$(timed tar -C "$d" -xf "$WORK/src.tar")" >> "$SMALL"
  rm -rf "$d"
}
SMALL_TARGETS=("tmpfs:$TMPFS" "zcfs-local-fuse:$LMP" "zcfs-remote-fuse:$RMP")
# sshfs as sshfs.sh sets it up (a private sshd in its own namespace on 127.0.0.1:2222,
# serving a tmpfs; sshfs in our mount namespace), when sshfs and sshd are installed.
if command -v sshfs >/dev/null && [ -x /usr/sbin/sshd ]; then
  SSHD_DIR=$WORK/sshd SEXP=$WORK/sshfs-export SMNT=$WORK/sshfs-mnt
  mkdir -p "$SSHD_DIR" "$SMNT" /run/sshd; chmod 700 "$SSHD_DIR"
  ssh-keygen -q -t ed25519 -N '' -f "$SSHD_DIR/host_ed25519"
  ssh-keygen -q -t ed25519 -N '' -f "$SSHD_DIR/client_ed25519"
  cp "$SSHD_DIR/client_ed25519.pub" "$SSHD_DIR/authorized_keys"
  printf '%s\n' "ListenAddress 127.0.0.1" "Port 2222" "HostKey $SSHD_DIR/host_ed25519" \
    "AuthorizedKeysFile $SSHD_DIR/authorized_keys" "PermitRootLogin prohibit-password" \
    "PasswordAuthentication no" "KbdInteractiveAuthentication no" "UsePAM no" "StrictModes no" \
    "Subsystem sftp internal-sftp" "LogLevel ERROR" > "$SSHD_DIR/sshd_config"
  tmpfs_mount "$SEXP" 2G
  NS_VARS=$("$ZB" netns up --owner $$ --label ssh --alone); eval "$NS_VARS"; SSHNS=$NS; NETNS+=("$SSHNS")
  "$ZB" netns exec "$SSHNS" -- /usr/sbin/sshd -D -e -f "$SSHD_DIR/sshd_config" 2>"$SSHD_DIR/sshd.log" & PIDS+=($!)
  sleep 1
  if timeout 30 sshfs "root@127.0.0.1:$SEXP" "$SMNT" -o "ssh_command=$ZB netns exec $SSHNS -- ssh" \
      -o "IdentityFile=$SSHD_DIR/client_ed25519,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,port=2222,Compression=no,LogLevel=ERROR,Ciphers=aes128-gcm@openssh.com"; then
    MOUNTS=("$SMNT" "${MOUNTS[@]}" "$SEXP")
    SMALL_TARGETS+=("sshfs:$SMNT")
  else
    log "sshfs mount failed; no sshfs row in the small-file tests: $(cat "$SSHD_DIR/sshd.log")"
    MOUNTS+=("$SEXP")
  fi
fi
for pair in "${SMALL_TARGETS[@]}"; do
  step "small files and real tools on ${pair%%:*}"
  small_files "${pair%%:*}" "${pair#*:}"
done
cat "$SMALL"

# ------------------------------------------------------------------ 6. the mount table (issue 11)
# What users do through a remote mount, zcfs beside sshfs on the same veth link and the
# client library on that link (scripts/bench-mount.sh: its own namespaces and servers).
step "the mount table: zcfs remote mount vs sshfs vs the client library"
NO_BUILD=1 bash scripts/bench-mount.sh --reps "$([ $MODE = full ] && echo 5 || echo 3)" --out "$OUT/mount" \
  || log "bench-mount.sh failed; see $OUT/mount"

# ------------------------------------------------------------------ 6b. checkpoints (issue 13)
# examples/python/checkpoint.py: numpy tensors saved atomically and restored (CRC-checked)
# through the same-host direct map (libzcfs), a local zcfs mount and tmpfs; it starts and
# stops its own server and mount (images on /dev/shm) and cleans up after itself.
step "checkpoint save/restore: direct map vs local zcfs mount vs tmpfs"
cargo build --release --quiet -p zcfs-samehost-c
CK_ARGS=$([ $MODE = full ] && echo "--total 2G --files 400" || echo "--total 256M --files 200")
if ZCFS_LIB=$REPO/target/release/libzcfs.so /usr/bin/python3 examples/python/checkpoint.py bench --zcfs "$Z" \
    $CK_ARGS --out "$OUT/checkpoint.json" --table "$OUT/checkpoint.md" 2>"$OUT/checkpoint.log"; then
  cp "$OUT/checkpoint.json" "$REPO/bench-results/checkpoint.json"
  echo; echo "Checkpoints (issue 13):"; cat "$OUT/checkpoint.md"
else
  log "checkpoint.py failed; see $OUT/checkpoint.log"
fi

# ------------------------------------------------------------------ 7. report
step "report"
# Debian's python3 is the one python3-matplotlib installs into.
PY=/usr/bin/python3; [ -x "$PY" ] || PY=python3
"$PY" "$REPO/scripts/bench-report.py" "$OUT" $([ $PUBLISH = 1 ] && echo --publish "$REPO/docs")
[ -f "$OUT/mount/mount-table.md" ] && { echo; echo "The mount table (issue 11):"; cat "$OUT/mount/mount-table.md"; }
[ -f "$OUT/remote-mount.md" ] && { echo; echo "Through a mount over layer 2 (issue 12):"; cat "$OUT/remote-mount.md"; }
log "results in $OUT (results.md, mount/mount-table.md, plots/*.png, csv/, *.json)"
