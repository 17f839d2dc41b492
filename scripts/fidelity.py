"""Distribution fidelity at T > 0: the target's log-likelihood of every sampled run's outputs, teacher-forced,
beside ar's on the same samples.

A lossless method samples from the target's law, so every function of its outputs has ar's distribution: the mean
log p_target per output token has ar's mean (Δ = 0 up to sampling noise), and no output token falls outside the
top-p support. A lossy rule (MARS, their q) moves outputs towards the target's and the draft's top tokens, so
their mean log p_target rises above ar's: this measures that move on the law itself, where a task metric at T = 1
may move either way (docs/results.md, "The paper's main setting: T = 1 trees").

    python scripts/fidelity.py results/study/trees_t1_wmt19.tar.xz [--runs GLOB ...] [--out PREFIX]

Per group of runs sharing an ar baseline (``RunSpec.baseline``: target, settings, batch size): the target is
loaded from the ar run's saved config (``load_pair``) and every prompt rebuilt from it (the runner's ``prepare``),
each checked against the recorded prompt length; every turn's output ids are scored in one forward over the cached
prompt (a prompt shared by the runs of a sample is computed once). Per sample: the sum of log p_target (softmax of
the raw logits / temperature; top-p is the support only) over its output tokens / their count; Δ vs ar paired on
sample ids, its CI and p by the paired bootstrap (``stats.mean_delta``), MDE beside. Per run, its calibration
under the sampling law (``Scores``): the mean of log w(x_t) + H(w_t) over its output tokens, which is 0 for draws
from the law whatever contexts they reached, so it needs no reference run and separates "off the law" from "where
one draw per sample went", which the paired Δ mixes. Greedy runs are left out (their fidelity is the
identical-to-ar share in the report). Writes PREFIX.md and PREFIX.json.
"""
from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from mars_bench.base.errors import InputError
from mars_bench.stats import StatsSettings, mean_delta
from mars_bench.store.io import atomic_write_text
from mars_bench.store.pack import is_pack, unpacked
from mars_bench.store.read import RunFiles, find_runs

CAPTION = ("log p_target / token = mean over samples of log p_target per output token (softmax of the target's "
           "raw logits / T, teacher-forced on the recorded outputs); Δ = method - ar paired on samples [95% CI], p = "
           "paired bootstrap, MDE = smallest Δ this n detects at 80% power: a lossless method has ar's law, Δ = 0 up "
           "to sampling noise. Calibration gap = mean over output tokens of log w(x_t) + H(w_t), w the sampling law "
           "(top-p warp of softmax(z / T)) at each position, 95% CI +-1.96 sqrt(sum Var_w(log w)) / tokens, z = gap / "
           "its standard error, p two-sided: tokens drawn from the target's law give gap 0 (no reference run needed); "
           "below 0, outputs less likely than the law's own draws (a flatter law), above 0, more (towards its mode). "
           "outside top-p = output tokens outside the sampling support (a lossless method has none).")


def groups(runs: list[RunFiles], patterns: list[str]) -> list[tuple[RunFiles, list[RunFiles]]]:
    """(ar run, the sampled runs whose baseline it is), for every sampled ar run; ``patterns``: keep only runs
    whose directory name matches one (ar always kept)."""
    sampled = [r for r in runs if r.spec.temperature > 0 and r.spec.engine == "native" and r.records]
    out = []
    for ar in (r for r in sampled if r.spec.scheme == "ar"):
        mine = [r for r in sampled if r is not ar and r.spec.baseline() == ar.spec
                and (r.model_dir, r.task_dir) == (ar.model_dir, ar.task_dir)
                and (not patterns or any(fnmatch.fnmatch(r.spec.dir_name, p) for p in patterns))]
        if mine:
            out.append((ar, mine))
    return out


class Scores(NamedTuple):
    """One sample's (or turn's) scores: ``logp`` = sum of log p_target over its ``tokens``; ``outside`` = tokens
    outside the top-p support; ``cal`` = sum of log w(x_t) + H(w_t) and ``var`` = sum of Var_w(log w) over the
    others, w the sampling law at each position: a draw from w has E[log w(x) + H(w)] = 0 at every position, so
    over a run cal / sqrt(var) is ~N(0, 1) when its tokens were drawn from the target's law."""
    logp: float
    tokens: int
    outside: int
    cal: float
    var: float


def _total(items) -> Scores:
    return Scores(*(sum(col) for col in zip(Scores(0.0, 0, 0, 0.0, 0.0), *items)))


def token_scores(z: torch.Tensor, out: list[int], temperature: float, top_p: float) -> Scores:
    """``Scores`` of tokens ``out`` (one per row of logits ``z``): log p_target = log softmax(z / T), and the
    calibration terms under the sampling law w = warp(z, T, top-p) over the tokens inside w's support."""
    from mars_bench.decode.sampling import warp

    z, o = z.float(), torch.tensor(out)[:, None]
    lp = torch.log_softmax(z / temperature, -1).gather(-1, o)[:, 0]
    w = warp(z, temperature, top_p).double()
    lw = torch.where(w > 0, w.log(), torch.zeros_like(w))
    h, m2 = -(w * lw).sum(-1), (w * lw * lw).sum(-1)
    inside = w.gather(-1, o)[:, 0] > 0
    cal = (lw.gather(-1, o)[:, 0] + h)[inside]
    return Scores(float(lp.sum()), len(out), int((~inside).sum()), float(cal.sum()), float((m2 - h * h)[inside].sum()))


class Scorer:
    """The target of one ar run's config, scoring outputs over a cached prompt."""

    def __init__(self, ar: RunFiles):
        from omegaconf import OmegaConf

        from mars_bench.models.pairs import load_pair
        from mars_bench.run.runner import prepare

        cfg = OmegaConf.load(ar.dirs[0] / "config.yaml")
        prep = prepare(cfg)
        self.task, self.samples = prep.task, {s.id: s for s in prep.samples}
        self.pair = load_pair(cfg.model, need_draft=False)
        self.temperature, self.top_p = ar.spec.temperature, ar.spec.top_p
        self.cached: list[int] = []

    def logp(self, ids: list[int], out: list[int]) -> Scores:
        """``out`` scored after ``ids`` in one forward over the cached prefix they share with the last call."""
        fed = ids + out[:-1]
        keep = 0
        while keep < min(len(self.cached), len(ids) - 1) and self.cached[keep] == fed[keep]:
            keep += 1
        tgt = self.pair.target
        if keep:
            tgt.crop(keep)
        else:
            tgt.reset()
        z = tgt.forward(fed[keep:])[-len(out):]
        self.cached = fed
        return token_scores(z, out, self.temperature, self.top_p)

    def score(self, rec: dict) -> Scores:
        """``Scores`` summed over every turn of a record."""
        from mars_bench.tasks import build_messages

        sample = self.samples.get(rec["id"])
        if sample is None:
            raise InputError(f"sample {rec['id']!r} is not among the task's samples of the ar run's config")
        turns, answers = [], []
        for t, turn in enumerate(rec["turns"]):
            ids = self.pair.prompt_ids(build_messages(self.task, sample, answers, t))
            if len(ids) != turn["prompt_tokens"]:
                raise InputError(f"sample {rec['id']!r} turn {t}: rebuilt prompt has {len(ids)} tokens, the record "
                                 f"{turn['prompt_tokens']}; allowed: runs of this checkout's task and template")
            if turn["output_ids"]:
                turns.append(self.logp(ids, turn["output_ids"]))
            answers.append(turn["output_text"])
        return _total(turns)


def measure(ar: RunFiles, runs: list[RunFiles], settings: StatsSettings) -> list[dict]:
    """One row per run (ar first): per-sample mean log p_target per token, Δ vs ar paired on sample ids; and the
    run's calibration under the sampling law (``Scores``): gap = sum cal / tokens, z = sum cal / sqrt(sum var), its
    two-sided normal p, and the gap's interval at ``settings.level``, +-z_(1-alpha/2) sqrt(sum var) / tokens."""
    from scipy.stats import norm

    scorer = Scorer(ar)
    recs = {r.key: {x["id"]: x for x in r.records} for r in [ar, *runs]}
    per = {r.key: {} for r in [ar, *runs]}
    for sid in sorted({sid for by_id in recs.values() for sid in by_id}):   # sample-major: one prompt forward
        for r in [ar, *runs]:
            if sid in recs[r.key]:
                per[r.key][sid] = scorer.score(recs[r.key][sid])
    base = {sid: x.logp / x.tokens for sid, x in per[ar.key].items() if x.tokens}
    rows = []
    for r in [ar, *runs]:
        mine = {sid: x.logp / x.tokens for sid, x in per[r.key].items() if x.tokens}
        ids = sorted(set(mine) & set(base))
        tot = _total(per[r.key].values())
        inside = tot.tokens - tot.outside
        row = {"run": r.spec.dir_name, "label": r.spec.label, "task": r.task, "model": r.model,
               "lossless": r.spec.scheme == "ar" or r.spec.lossless, "n": len(ids), "tokens": tot.tokens,
               "outside_top_p": tot.outside, "mean_logp": sum(mine[i] for i in ids) / len(ids) if ids else None}
        if inside and tot.var > 0:
            z = tot.cal / math.sqrt(tot.var)
            half = float(norm.ppf(1 - settings.alpha / 2)) * math.sqrt(tot.var) / inside
            row["calibration"] = {"gap": tot.cal / inside, "lo": tot.cal / inside - half, "hi": tot.cal / inside + half,
                                  "z": z, "p_value": float(2 * norm.sf(abs(z))), "tokens": inside}
        if r is not ar:
            row["delta"] = mean_delta([mine[i] for i in ids], [base[i] for i in ids], settings)
        rows.append(row)
    return rows


def _fmt(x, digits=3, sign=False):
    return "–" if x is None else f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def _ci(v, lo, hi) -> str:
    return _fmt(v, sign=True) if lo is None else f"{_fmt(v, sign=True)} [{_fmt(lo, sign=True)}, {_fmt(hi, sign=True)}]"


def _p(p) -> str:
    return "–" if p is None else f"{p:.2g}"


def markdown(tables: list[tuple[RunFiles, list[dict]]]) -> str:
    out = []
    for ar, rows in tables:
        s = ar.spec
        out += [(f"**{ar.model} · {ar.task} · T={s.temperature:g} p={s.top_p:g} n≤{s.max_new_tokens} seed={s.seed} "
                 f"· batch {s.batch_size}**"), "",
                ("| method | lossless | n | tokens | log p_target / token | Δ vs ar [95% CI] | p | MDE "
                 "| calibration gap [95% CI] | z | p | outside top-p |"),
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            d, c = r.get("delta") or {}, r.get("calibration") or {}
            out.append(f"| {r['label']} | {'yes' if r['lossless'] else 'no'} | {r['n']} | {r['tokens']} | "
                       f"{_fmt(r['mean_logp'])} | {_ci(d.get('delta'), d.get('lo'), d.get('hi'))} | "
                       f"{_p(d.get('p_value'))} | {_fmt(d.get('mde'))} | "
                       f"{_ci(c.get('gap'), c.get('lo'), c.get('hi'))} | "
                       f"{_fmt(c.get('z'), 2, sign=True)} | {_p(c.get('p_value'))} | {r['outside_top_p']} |")
        out.append("")
    return "\n".join(out + [CAPTION, ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a results tree or a pack (.tar.xz)")
    ap.add_argument("--runs", nargs="*", default=[], help="run directory globs to score beside ar (default: all)")
    ap.add_argument("--out", default=None, help="write PREFIX.md and PREFIX.json (default: print only)")
    args = ap.parse_args(argv)
    try:
        path = Path(args.results)
        if not path.exists():
            raise InputError(f"results={args.results!r}: no such results tree or pack")
        with (unpacked(path) if is_pack(path) else contextlib.nullcontext(path)) as root:
            found = groups(find_runs([root]), args.runs)
            if not found:
                raise InputError(f"results={args.results!r}: no sampled (T > 0) native run beside an ar run of the "
                                 f"same settings" + (f" matching {args.runs}" if args.runs else ""))
            tables = [(ar, measure(ar, runs, StatsSettings())) for ar, runs in found]
    except InputError as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    from mars_bench.store.provenance import git_commit, machine, machine_label

    command = shlex.join(["python", f"scripts/{Path(__file__).name}", *(argv if argv is not None else sys.argv[1:])])
    text = (f"Generated by `{command}` at commit {git_commit()} on {machine_label(machine())}.\n\n" + markdown(tables))
    print(text)
    if args.out:
        atomic_write_text(Path(args.out + ".md"), text)
        atomic_write_text(Path(args.out + ".json"), json.dumps([{"ar": ar.spec.dir_name, "rows": rows}
                                                                  for ar, rows in tables], indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
