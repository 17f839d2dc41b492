"""``threshold``: SGLang's ``--speculative-accept-threshold-single`` / ``-acc`` (python/sglang/srt/
speculative/eagle_info.py; sgl-kernel speculative_sampling.cuh ``TreeSpeculativeSamplingTargetOnly``:
``coin <= prob_acc / threshold_acc || target_prob >= threshold_single``).

    sampled: accept d  iff  u q_draft(d) < p_target(d) / acc   or   p_target(d) >= single
    greedy:  accept d  iff  d == argmax z   (SGLang's greedy path ignores both thresholds)

SGLang drafts are point masses (q = 1 for the drafted token, as for this harness's top-k tree
children), where the first clause is its ``coin <= p / acc``; with a sampled chain draft q_draft is the
draft's distribution. p_target is after temperature and top-p, so a token outside the nucleus is never
accepted. Strict (= exact): single = 1 and acc = 1 (SGLang's defaults).
"""
from __future__ import annotations

from mars_bench.decode.rules.base import Knob, Rule, register


def _threshold(draft, z, p_target, q_draft, u, standard, single, acc):
    if p_target is None:
        return standard, standard.long() * 0
    pd = p_target.gather(-1, draft[..., None]).squeeze(-1)
    qd = q_draft.gather(-1, draft[..., None]).squeeze(-1)
    by_acc = u * qd < pd / acc
    accept = standard | by_acc | (pd >= single)
    return accept, (~by_acc).long() + 1     # 1 = acc clause, 2 = single clause (where lenient)


threshold = register(Rule(
    "threshold", _threshold, lossless=False,
    doc="SGLang accept thresholds: u q(d) < p(d) / acc or p(d) >= single",
    knobs=(Knob("single", 1.0, "accept outright when p_target(d) >= single", low=0.0, high=1.0, open_low=True,
                tag="single"),
           Knob("acc", 1.0, "raise the acceptance probability p/q to min(1, p/(q acc))", low=0.0, high=1.0,
                open_low=True, tag="acc")),
    clauses=("acc", "single"), strict="single=1 and acc=1 (SGLang's defaults)", sweep="acc"))
