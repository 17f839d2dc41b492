#!/usr/bin/env bash
# Speculators 0.9.0 beside the project in .venv (docs/eagle3.md): the EAGLE-3 tier (pytest -m speculators) and the
# head recipe (make eagle3-head). Its torchvision / torchaudio requirements break beside the CPU torch, so it goes in
# with --no-deps plus its other requirements; torch and transformers must come out unchanged (checked).
# Idempotent. Usage: bash .ci/speculators.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
if "$PY" -c "import importlib.metadata as m; assert m.version('speculators') == '0.9.0'" 2>/dev/null; then exit 0; fi
before=$("$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__)")
"$VENV/bin/pip" install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0
"$VENV/bin/pip" install -q aiohttp 'datasets>=4,<=5.1.0' 'loguru>=0.7.2,<=0.7.3' 'openai>=2' pydantic-settings
after=$("$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__)")
[ "$before" = "$after" ] || { echo "speculators install changed torch / transformers: $before -> $after"; exit 1; }
echo "speculators 0.9.0 installed beside torch / transformers $after"
