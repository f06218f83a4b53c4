#!/usr/bin/env bash
# Every test of zcfs: formatting, lints, unit, integration, property, fuzz-smoke, crash,
# FUSE and network-namespace tests, in release mode (the crash suite enumerates ~100k
# crash states). Run as root on Debian; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/setup.sh build-essential pkg-config fuse3 git rsync sqlite3 fio tar iproute2 util-linux clang llvm python3 python3-numpy
# The layer-2 (AF_XDP) tests fail rather than skip when the XDP program was not built
# (no clang) or the run is not root.
export ZCFS_REQUIRE_L2=1
# The Python examples (crates/samehost-c/tests/python_*.rs) fail rather than skip without
# python3 and numpy (Debian's, installed above).
export ZCFS_REQUIRE_PYTHON=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --release --no-fail-fast --lib --bins --tests -- --test-threads 2 2>&1 | tee "$log" || status=$?
# Model check (loom) of the read pins that let readers send PM blocks without a lock.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p zcfs-volume --release --lib loom 2>&1 | tee -a "$log" || status=$?
# One closing line for the whole run.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit $status
