#!/usr/bin/env bash
# What the qemu test tier needs (tests/test_neon_qemu.py, `pytest -m qemu`): Debian's aarch64 cross compiler
# (gcc-aarch64-linux-gnu, with libc6-dev-arm64-cross and the cross libgomp) and qemu-user (qemu-aarch64), which runs
# the cross-compiled NEON kernels on this x86 machine. Nothing here is configured or started.
# Idempotent: returns at once when every tool is there. Needs root and apt-get (Debian / Ubuntu).
# Usage: bash .ci/qemu.sh && .venv/bin/python -m pytest -q -m qemu
set -euo pipefail
need=(aarch64-linux-gnu-gcc qemu-aarch64)
missing=()
for b in "${need[@]}"; do
  command -v "$b" >/dev/null 2>&1 || missing+=("$b")
done
[ -d /usr/aarch64-linux-gnu/lib ] || missing+=(/usr/aarch64-linux-gnu/lib)
[ "${#missing[@]}" = 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo ".ci/qemu.sh: ${missing[*]} missing; install as root: apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross" >&2
  exit 1
fi
start=$(date +%s)
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-user gcc-aarch64-linux-gnu \
  libc6-dev-arm64-cross >/dev/null
echo "$(aarch64-linux-gnu-gcc --version | head -1) and $(qemu-aarch64 --version | head -1) installed in $(( $(date +%s) - start )) s"
