#!/usr/bin/env bash
# The main job on defaults: a volume in /dev/shm, served on loopback, mounted through
# FUSE, real file I/O with unmodified tools, what happened (throughput, copies per
# byte), then clean up. Run as root on Debian; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/setup.sh build-essential pkg-config fuse3 sqlite3
echo "== building zcfs (release)"
cargo build --release --quiet -p zcfs
Z="$PWD/target/release/zcfs"

WORK=$(mktemp -d /tmp/zcfs-demo.XXXXXX)
IMG=/dev/shm/zcfs-demo-$$.img
MP=$WORK/mnt
PORT=$((17000 + $$ % 1000))
SERVER_PID="" MOUNT_PID=""
mkdir -p "$MP"

cleanup() {
  set +e
  if [ -n "$MOUNT_PID" ] && kill -0 "$MOUNT_PID" 2>/dev/null; then
    kill -TERM "$MOUNT_PID"; wait "$MOUNT_PID" 2>/dev/null
  fi
  grep -q " $MP " /proc/self/mountinfo && umount -l "$MP"
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null
  fi
  rm -rf "$WORK" "$IMG"
}
trap cleanup EXIT

mbps() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f MB/s", b / s / 1e6 }'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

echo "== volume: $IMG (2 GiB, in /dev/shm)"
"$Z" mkfs "$IMG" --size 2G

echo "== server: zcfs serve on 127.0.0.1:$PORT"
"$Z" serve "$IMG" --listen "127.0.0.1:$PORT" --insecure --no-root-squash > "$WORK/serve.out" 2> "$WORK/serve.err" &
SERVER_PID=$!
for _ in $(seq 100); do grep -q serving "$WORK/serve.out" 2>/dev/null && break; sleep 0.05; done
cat "$WORK/serve.out"

echo "== client: zcfs mount 127.0.0.1:$PORT $MP (FUSE)"
"$Z" mount "127.0.0.1:$PORT" "$MP" 2> "$WORK/mount.err" &
MOUNT_PID=$!
for _ in $(seq 200); do grep -q " $MP " /proc/self/mountinfo && break; sleep 0.05; done
grep -q " $MP " /proc/self/mountinfo || { cat "$WORK/mount.err"; exit 1; }
df -h "$MP" | tail -1

echo "== real I/O with unmodified tools"
SRC="$PWD/crates"
t=$(now); cp -a "$SRC" "$MP/src"; el=$(since "$t")
n=$(find "$MP/src" -type f | wc -l)
diff -r "$SRC" "$MP/src" && echo "cp -a of a source tree: $n files in ${el}s, identical (diff -r)"

head -c $((256 << 20)) /dev/urandom > "$WORK/data"
t=$(now); dd if="$WORK/data" of="$MP/big" bs=1M conv=fsync status=none; el=$(since "$t")
echo "sequential write, 256 MiB, dd bs=1M + fsync: $(mbps $((256 << 20)) "$el")"
echo 3 > /proc/sys/vm/drop_caches
t=$(now); dd if="$MP/big" of="$WORK/back" bs=1M status=none; el=$(since "$t")
echo "sequential read, 256 MiB, dd bs=1M (page cache dropped): $(mbps $((256 << 20)) "$el")"
cmp "$WORK/data" "$WORK/back" && echo "read back: identical (cmp)"

mkdir "$MP/small"
t=$(now); for i in $(seq 1000); do echo "file $i" > "$MP/small/f$i"; done; el=$(since "$t")
echo "1,000 small files created and written: ${el}s"
t=$(now); ls -l "$MP/small" > /dev/null; el=$(since "$t")
echo "ls -l of 1,000 entries: ${el}s"
t=$(now); tar -C "$MP" -cf "$MP/src.tar" src; tar -C "$MP/small" -xf "$MP/src.tar"; el=$(since "$t")
diff -r "$SRC" "$MP/small/src" && echo "tar create + extract on the mount: ${el}s, identical"
out=$(sqlite3 "$MP/demo.db" "create table t(k integer primary key, v text);
  with recursive c(x) as (select 1 union all select x+1 from c where x<10000)
  insert into t(v) select hex(randomblob(32)) from c;
  select count(*) from t; pragma integrity_check;" | tr '\n' ' ')
echo "sqlite3: $out"

echo "== what the server saw (zcfs stat 127.0.0.1:$PORT)"
"$Z" stat "127.0.0.1:$PORT"

echo "== unmount, stop the server, check the volume"
kill -TERM "$MOUNT_PID"; wait "$MOUNT_PID" || true; MOUNT_PID=""
kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || true; SERVER_PID=""
head -2 "$WORK/serve.err"
"$Z" fsck "$IMG"
"$Z" stat "$IMG" | sed -n '5,9p'
echo "== done (volume, mount point and processes cleaned up)"
