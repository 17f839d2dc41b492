"""What the `make bench` scripts share (scripts/bench*.py): runner invocations into a runs folder of their own,
the runner's runs read back as table rows, paired ratios between runs from their records (``stats.speedup_ci``),
the model pair of a config, and forward costs. Every decoded row is the runner's: a script arranges
invocations of `mars-bench +compare=...` (methods interleaved sample by sample, order rotated, as the runner
records them) and prints what the runner and mars_bench/stats.py computed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

from mars_bench import stats as S
from mars_bench.store.io import read_samples

TASKS = ("gsm8k", "humaneval")
RUNS_MARK = ".bench-runs"             # a runs folder a bench script made (and may clear)
PRECISION = {"fp32": "fp32", "bf16": "bf16 weights, fp32 activations"}
ROW_COLUMNS = ["task", "block", "row", "precision", "tokens_per_s", "tau", "vs_ar", "vs_ar_lo", "vs_ar_hi",
               "identical_to_ar", "n", "outside_forward_share", "theta", "relaxed", "method", "k", "batch_size",
               "fast_kernel", "dirs"]


# ---- runner invocations -------------------------------------------------------------------------------------
def fresh_runs_dir(path: Path) -> Path:
    """``path`` empty and marked as a bench's (a folder a bench made is cleared; another is refused)."""
    path = Path(path)
    if path.exists():
        if not (path / RUNS_MARK).exists() and any(path.iterdir()):
            raise SystemExit(f"{path} holds files no bench script wrote; choose another --runs folder")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / RUNS_MARK).touch()
    return path


def run_compare(compare: str, task: str, runs_dir: Path, overrides=(), threads: int | None = None,
                quiet: bool = False) -> float:
    """One runner invocation, `mars-bench +compare=<compare> task=<task> <overrides>` into ``runs_dir``, in a
    process of its own; returns that process's peak resident memory in GB (its ru_maxrss)."""
    cmd = [sys.executable, "-m", "mars_bench.cli", f"+compare={compare}", f"task={task}",
           f"results_dir={runs_dir}", *overrides]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    print("+ mars-bench " + " ".join(cmd[3:]), file=sys.stderr, flush=True)
    with tempfile.TemporaryFile("w+") as log:   # quiet: the output kept for the error's tail
        proc = subprocess.Popen(cmd, env=env, stdout=log if quiet else None,
                                stderr=subprocess.STDOUT if quiet else None)
        _, status, usage = os.wait4(proc.pid, 0)   # this child's own rusage (its peak RSS)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        log.seek(0)
        tail = log.read().strip().splitlines()[-5:] if quiet else []
    if code:
        raise SystemExit(f"mars-bench +compare={compare} task={task} failed (exit {code})"
                         + "".join(f"\n  {x}" for x in tail))
    return usage.ru_maxrss / 1e6   # kB (Linux) -> GB


def runner_rows(runs_dir, block: str = "runner") -> pd.DataFrame:
    """The runner's runs under ``runs_dir`` as table rows (``load_frames``): summary.json's tokens/s, tau,
    speedup vs ar and its CI, samples identical to ar, share of the loop's wall time outside forwards; what ran
    (method, k, theta, dtype) from run.json, never parsed from a label."""
    from mars_bench.report.frames import load_frames

    runs = load_frames([runs_dir]).runs
    if runs.empty:
        return pd.DataFrame(columns=ROW_COLUMNS)
    dtype = [(spec.model or {}).get("dtype") or "dtype unknown" for spec in runs["spec"]]
    same = (runs["pct_identical"].astype(float) * runs["n_compared"].astype(float) / 100).round()
    out = pd.DataFrame({
        "task": runs["task"], "block": [f"{block}, {d}" for d in dtype], "row": runs["label"],
        "precision": [PRECISION.get(d, d) for d in dtype], "tokens_per_s": runs["tokens_per_s"], "tau": runs["tau"],
        "vs_ar": runs["speedup"], "vs_ar_lo": runs["speedup_lo"], "vs_ar_hi": runs["speedup_hi"],
        "identical_to_ar": same.where(runs["method"] != "ar", runs["n"]), "n": runs["n"],
        "outside_forward_share": runs["outside_forward_share"], "theta": runs["theta"], "relaxed": runs["relaxed"],
        "method": runs["method"], "k": runs["k"], "batch_size": runs["batch_size"],
        "fast_kernel": [",".join(k or []) for k in runs["fast_kernel"]], "dirs": runs["dirs"]})
    return out.astype({"identical_to_ar": "Int64", "n": "Int64"})


def records_by_id(dirs) -> dict:
    """Sample id -> record, from the samples.jsonl of a run's directories."""
    out = {}
    for d in dirs:
        recs, _ = read_samples(Path(d) / "samples.jsonl")
        out.update({r["id"]: r for r in recs})
    return out


def paired_ratio(dirs, base_dirs, settings: S.StatsSettings | None = None) -> dict:
    """tokens/s of the run in ``dirs`` over that of the run in ``base_dirs`` on the sample ids both hold, with
    its paired bootstrap CI (``stats.speedup_ci``), and how many of those samples have the same output tokens."""
    a, b = records_by_id(dirs), records_by_id(base_dirs)
    ids = sorted(set(a) & set(b))
    col = lambda recs, key: [float(recs[i][key]) for i in ids]  # noqa: E731
    est = S.speedup_ci(col(a, "new_tokens"), col(a, "wall_s"), col(b, "new_tokens"), col(b, "wall_s"),
                       settings or S.StatsSettings())
    outputs = lambda r: [t.get("output_ids") for t in r.get("turns", [])]  # noqa: E731
    return {**est, "same_tokens": sum(outputs(a[i]) == outputs(b[i]) for i in ids)}


# ---- the model pair of a config, forward costs -----------------------------------------------------------------
def draft_overrides(draft: str) -> list[str]:
    """A draft setting as model overrides: 'q4+v32768' -> model.draft_quant=q4 model.draft_vocab=32768."""
    quant_name, _, vocab = draft.partition("+v")
    return [f"model.draft_quant={quant_name}", f"model.draft_vocab={int(vocab) if vocab else 0}"]


def model_cfg(overrides=()):
    """The model config `mars-bench <overrides>` composes (the embedded default pair unless ``model=`` is given)."""
    from hydra import compose, initialize_config_dir

    from mars_bench.config import schema as C

    C.register()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides)).model


def load(overrides=()):
    """(pair, draft quantization) of the model config of ``overrides`` (``load_pair``, as the runner loads it)."""
    from mars_bench.models.pairs import load_pair

    mcfg = model_cfg(overrides)
    return load_pair(mcfg), mcfg.get("draft_quant", "none")


def gguf_paths() -> list[Path]:
    """The embedded pair's GGUF files (target, draft), as llama.cpp reads them."""
    from mars_bench.models.embedded import DRAFT, TARGET, default_cache_dir

    return [default_cache_dir() / "gguf" / f"{n}.gguf" for n in (TARGET, DRAFT)]


def forward_costs(paths: dict, ns, ctx: int = 200, reps: int = 3, rounds: int = 2) -> dict:
    """ms of one forward scoring n new tokens after a ctx-token prefix, n in ``ns``, per path (name -> (adapter,
    packing) or a llama.cpp runner); the paths alternate per n, so all see the same machine state; best of
    ``reps`` in each of ``rounds`` passes over n."""
    g = torch.Generator().manual_seed(0)
    out = {name: {} for name in paths}
    for p in paths.values():
        if isinstance(p, tuple):
            vocab = p[0].vocab
            p[0].reset()
            p[0].forward(torch.randint(0, vocab, (ctx,), generator=g).tolist(), logits=False)
    for n in [n for _ in range(rounds) for n in ns]:
        for name, p in paths.items():
            if not isinstance(p, tuple):
                best = p.forward_ms(ctx=ctx, ns=(n,), reps=reps)[n] / 1000
            else:
                adapter, packing = p
                adapter.packing = packing
                adapter.expect(n)
                best = float("inf")
                for _ in range(reps):
                    adapter.crop(ctx)
                    t0 = time.perf_counter()
                    adapter.forward(torch.randint(0, adapter.vocab, (n,), generator=g).tolist())
                    best = min(best, time.perf_counter() - t0)
            out[name][n] = min(out[name].get(n, float("inf")), best * 1000)
    for p in paths.values():
        if isinstance(p, tuple):
            p[0].packing = True
    return out


LLAMA_PROBE = """
import sys
from mars_bench.models import llamacpp
r = llamacpp.LlamaCppRunner(sys.argv[1], sys.argv[2], k=2, threads=1)
r.run(list(range(1000, 1010)), 2, (), speculative=True)
"""


def llama_unavailable() -> str | None:
    """None when llama.cpp decodes two tokens of the embedded GGUF pair in a fresh process, else why not (a build
    whose kernels crash on this CPU kills only the probe)."""
    from mars_bench.models import llamacpp

    why = llamacpp.unavailable() or next((f"{p} missing" for p in gguf_paths() if not p.exists()), None)
    if why:
        return why
    proc = subprocess.run([sys.executable, "-c", LLAMA_PROBE, *map(str, gguf_paths())], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or [""])[-1][:120]
        return (f"llama.cpp failed a 2-token probe in a fresh process (exit {proc.returncode}"
                f"{': ' + last if last else ''})")
    return None


def weight_bytes(model) -> int:
    """Bytes of the weights of a model's linear layers as its kernels read them (codes, int8, bf16 or fp32)."""
    from mars_bench.models import fastpath, panel, quant

    out = 0
    for m in model.modules():
        if isinstance(m, quant.QuantLinear):
            out += m.panels.numel()
        elif isinstance(m, fastpath.Int8Linear):
            out += m.in_features * m.out_features
        elif isinstance(m, panel.PanelLinear):
            out += m.in_features * m.out_features * (2 if m.bf16 else 4)
        elif isinstance(m, fastpath.PackedLinear):
            out += m.in_features * m.out_features * 4
        elif isinstance(m, torch.nn.Linear):
            out += m.weight.numel() * m.weight.element_size()
    return out


def stream_rate(gib: float = 1.0, reps: int = 3) -> float:
    """GB/s this machine streams from DRAM into a sum over all threads (best of ``reps``): the weight-streaming
    bound a forward's rate is read against."""
    x = torch.ones(int(gib * 2**30) // 8, dtype=torch.int64)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 8 / best / 1e9
