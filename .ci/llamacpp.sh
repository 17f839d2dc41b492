#!/usr/bin/env bash
# The llama.cpp engine's binding (docs/llamacpp.md), built from its sdist into the project's virtualenv (it needs
# only numpy, jinja2, diskcache and typing-extensions beside the project's). On CPUs with AMX (Sapphire Rapids and
# later) ggml's AMX code crashed on batched evaluations of the real target with GGML_NATIVE=ON (0.3.36): there the
# build names the AVX-512 families and leaves AMX out; elsewhere GGML_NATIVE=ON. ~5 min on 2 cores (measured:
# docs/llamacpp.md). Idempotent: a finished install leaves $VENV/.llamacpp-installed and reruns return at once.
# Usage: bash .ci/llamacpp.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PKG="llama-cpp-python==0.3.36"
STAMP="$VENV/.llamacpp-installed"
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then exit 0; fi
# LLAVA_BUILD=OFF: no multimodal library (51 of the 178 objects; the binding loads it only for image chats)
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
-DGGML_AVX512_VBMI=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
else
  export CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=ON"
fi
start=$(date +%s)
"$VENV/bin/pip" install -q --no-cache-dir "$PKG"
"$VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
touch "$STAMP"
echo "llama-cpp-python built and installed into $VENV in $(( $(date +%s) - start )) s ($CMAKE_ARGS)"
