#!/usr/bin/env bash
# What the SLURM test tier needs (tests/test_slurm.py, `pytest -m slurm`): Debian's slurm-wlm (slurmctld,
# slurmd, sbatch, squeue, scancel, sinfo) and munge. The tier starts and stops its own one-node cluster from a
# configuration it writes in a temporary directory; nothing here configures or starts a daemon.
# Idempotent: returns at once when every binary is there. Needs root and apt-get (Debian / Ubuntu).
# Usage: bash .ci/slurm.sh && .venv/bin/python -m pytest -q -m slurm
set -euo pipefail
need=(munged slurmctld slurmd sbatch squeue scancel sinfo)
missing=()
for b in "${need[@]}"; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || missing+=("$b")
done
[ "${#missing[@]}" = 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo ".ci/slurm.sh: ${missing[*]} missing; install slurm-wlm and munge as root (apt-get install slurm-wlm munge)" >&2
  exit 1
fi
start=$(date +%s)
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
echo "slurm-wlm $(slurmctld -V | awk '{print $2}') and munge installed in $(( $(date +%s) - start )) s"
