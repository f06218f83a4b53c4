#!/usr/bin/env bash
# What a user of a default remote mount sees while its server is stopped (SIGSTOP: its
# sockets stay open, nothing is answered) and after it resumes, on loopback. Prints
# how long each step took. Root required (FUSE). About 2 minutes.
#   bash scripts/stopped-server.sh [ZCFS_BINARY] [PORT]
set -u
Z=${1:-$(dirname "$0")/../target/release/zcfs}
PORT=${2:-7392}
IMG=/dev/shm/zcfs-stopped-server-$$.img
MNT=$(mktemp -d /tmp/zcfs-stopped-server.XXXXXX)
SRV= MP=
cleanup() {
  [ -n "$SRV" ] && kill -CONT "$SRV" 2>/dev/null
  mountpoint -q "$MNT" && "$Z" umount "$MNT" 2>/dev/null
  [ -n "$MP" ] && wait "$MP" 2>/dev/null
  [ -n "$SRV" ] && kill "$SRV" 2>/dev/null && wait "$SRV" 2>/dev/null
  rm -f "$IMG"; rmdir "$MNT" 2>/dev/null
}
trap cleanup EXIT
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
"$Z" mkfs --size 1G --root-mode 777 "$IMG" >/dev/null
"$Z" serve "$IMG" --listen 127.0.0.1:$PORT --insecure >/dev/null 2>&1 & SRV=$!
sleep 0.5
"$Z" mount 127.0.0.1:$PORT "$MNT" >/dev/null 2>&1 & MP=$!
for _ in $(seq 50); do mountpoint -q "$MNT" && break; sleep 0.1; done
echo before > "$MNT/before"

# A writer under way when the server stops: how long until it gets its error.
dd if=/dev/zero of="$MNT/big" bs=1M count=4096 conv=fsync status=none 2>/dev/null & DD=$!
sleep 0.3
kill -STOP "$SRV"
t=$(now); timeout 300 tail --pid=$DD -f /dev/null; wait $DD; echo "dd bs=1M under way when the server stopped: exit $? after $(since "$t") s"

t=$(now); timeout 60 touch "$MNT/new0" 2>/dev/null; echo "touch of a new file: exit $? after $(since "$t") s"
for i in 1 2 3; do t=$(now); timeout 60 touch "$MNT/new$i" 2>/dev/null; echo "touch again: exit $? after $(since "$t") s"; done
end=$(( $(date +%s) + 60 )); n=0; slow=0
while [ "$(date +%s)" -lt $end ]; do
  t=$(now); timeout 60 stat "$MNT/x$n" >/dev/null 2>&1; d=$(since "$t"); n=$((n+1))
  if [ "$(echo "$d > 1" | bc)" = 1 ]; then slow=$((slow+1)); echo "  a stat took $d s"; fi
  sleep 0.1
done
echo "60 s of stat every 0.1 s: $n calls, $slow of them over 1 s"

kill -CONT "$SRV"
t=$(now); for i in $(seq 200); do echo after > "$MNT/after" 2>/dev/null && break; sleep 0.05; done
echo "first write that succeeded after the server resumed: after $(since "$t") s ($i tries)"
[ "$(cat "$MNT/before" "$MNT/after")" = "$(printf 'before\nafter')" ] && echo "contents: ok" || echo "contents: WRONG"
