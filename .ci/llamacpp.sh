#!/usr/bin/env bash
# The llama.cpp engine's binding (docs/llamacpp.md), built from its sdist into the project's virtualenv (it needs
# only numpy, jinja2, diskcache and typing-extensions beside the project's). On CPUs with AMX (Sapphire Rapids and
# later) ggml's AMX code crashed on batched evaluations of the real target with GGML_NATIVE=ON (0.3.36): there the
# build names the AVX-512 families and leaves AMX out; elsewhere GGML_NATIVE=ON. The first build took 5.4 min on 2
# quiet AMX cores (22.8 min with the multimodal library and a job beside it, docs/llamacpp.md); later installs take
# seconds (the wheel is cached below). Idempotent: a finished install leaves $VENV/.llamacpp-installed and reruns
# return at once.
# Usage: bash .ci/llamacpp.sh [VENV] [--cached-only]   (default .venv). --cached-only installs the cached wheel and
# exits 3 (nothing built) where this CPU has none (.ci/run: the build only where CI has room for it).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
CACHED_ONLY="${2:-}"
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
# The built wheel is kept per (package, build flags, CPU): a fresh clone on the same machine installs it in seconds;
# another CPU (a shared home) builds its own, so a -march=native build never reaches a CPU that lacks its ISA.
KEY=$(printf '%s\n%s\n%s\n' "$PKG" "$CMAKE_ARGS" "$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo || uname -m)" \
      | sha256sum | cut -c1-16)
WHEELS="${MARS_BENCH_CACHE:-$HOME/.cache/mars-bench}/wheels/llama-cpp-python-$KEY"
start=$(date +%s)
if ! ls "$WHEELS"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  [ "$CACHED_ONLY" = --cached-only ] && exit 3
  rm -rf "$WHEELS.tmp.$$"
  "$VENV/bin/pip" wheel -q --no-cache-dir --no-deps -w "$WHEELS.tmp.$$" "$PKG"
  mv "$WHEELS.tmp.$$" "$WHEELS" 2>/dev/null || rm -rf "$WHEELS.tmp.$$"   # another build finished first: keep it
  echo "llama-cpp-python built in $(( $(date +%s) - start )) s ($CMAKE_ARGS) -> $WHEELS"
fi
"$VENV/bin/pip" install -q "$WHEELS"/llama_cpp_python-*.whl
"$VENV/bin/python" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
touch "$STAMP"
echo "llama-cpp-python ready in $VENV in $(( $(date +%s) - start )) s"
