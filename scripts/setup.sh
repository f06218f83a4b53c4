#!/usr/bin/env bash
# Installs what zcfs needs on Debian (run as root): a Rust toolchain if none is found,
# and the system packages the tests use. Safe to run again.
set -euo pipefail

need_pkgs=()
for p in "$@"; do
  dpkg -s "$p" >/dev/null 2>&1 || need_pkgs+=("$p")
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  elif command -v rustup >/dev/null 2>&1; then
    rustup toolchain install stable --profile minimal -c clippy -c rustfmt
  else
    echo "setup: no Rust toolchain found. Install rustup (https://rustup.rs) and run again." >&2
    exit 1
  fi
fi
