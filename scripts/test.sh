#!/usr/bin/env bash
# Every test of zcfs: formatting, lints, unit, integration, property, fuzz-smoke and
# crash tests, in release mode (the crash suite enumerates ~100k crash states).
# Run as root on Debian; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/setup.sh build-essential pkg-config fuse3 git rsync sqlite3 fio tar iproute2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --release -- --test-threads 2
