"""The run-time self-check of engine=vllm: on the user's own machine, vLLM version and model runner, before any
record of a lossy run is written (docs/vllm.md "Self-check").

  1. strict = exact: the run's first ``PROMPTS`` prompts decoded ``TOKENS`` tokens with ``exact`` and with the run's
     rule at its strict setting (``STRICT``: mars theta = 1, threshold single = acc = 1, ...; the rule's own
     ``strict`` line), same seeds: greedy, the tokens must be equal (a plugin or processor that touches rows it
     should not, or verifies the wrong drafts, changes them); sampled, the strict run must relax nothing.
  2. relaxations obey the rule: the same prompts with the run's own settings; every relaxed acceptance the audit
     reports must be the token committed at its position (the draft the rule accepted is what vLLM kept), and in
     greedy decoding for the rules whose decision reads only the top-2 (``REPLAYED``) the rule itself, called on a
     row rebuilt from the audited z1 / z2 / top-1 / top-2, must accept that draft by the same clause.
A failure refuses the run in one line naming the version and the runner (``ConfigError``); a pass is written to the
run directory (``engine_check.json``, beside run.json); each record's kernel names the version and runner
(``vllm-<version>-<runner>``).
"""
from __future__ import annotations

import torch

from mars_bench.base.errors import ConfigError
from mars_bench.decode.rules import RULES

PROMPTS, TOKENS = 2, 16
STRICT = {"mars": {"theta": 1.0, "sampled_top1": "margin"}, "mars_prob": {"theta": 1.0, "sampled_top1": "margin"},
          "threshold": {"single": 1.0, "acc": 1.0}, "topk_delta": {"top_k": 1, "delta": 0.0}}
REPLAYED = ("mars", "mars_prob")   # greedy decisions that depend on the row's top-2 only


def strict_settings(rule: str, settings: dict) -> dict:
    return RULES[rule].settings({**settings, **STRICT[rule]})


def replay(rule: str, settings: dict, entry: dict) -> bool:
    """The rule's greedy verdict on a row holding only the audited top-2 (-inf elsewhere): accepted by the same clause."""
    size = max(entry["top1"], entry["top2"], entry["draft"]) + 1
    z = torch.full((1, size), float("-inf"))
    z[0, entry["top1"]], z[0, entry["top2"]] = entry["z1"], entry["z2"]
    v = RULES[rule](torch.tensor([entry["draft"]]), z, **settings)
    clause = RULES[rule].clauses[int(v.clause[0]) - 1] if int(v.clause[0]) else None
    return bool(v.accept[0]) and clause == entry["clause"]


def problems(rule: str, settings: dict, greedy: bool, exact_ids: list, strict_ids: list, loose: list,
             strict_audit: list = ()) -> list[str]:
    """What the three decodes show wrong (module doc); ``loose``: (output ids, audit steps) per prompt. Sampled:
    vLLM's sampled speculative decoding is not reproducible across calls for one seed (its draft is not seeded per
    request), so the strict run is checked by its audit (no relaxed acceptance) instead of its tokens."""
    strict_name = f"the strict {rule} ({', '.join(f'{k}={v}' for k, v in STRICT[rule].items())})"
    if greedy:
        out = [f"prompt {i}: {strict_name} gave other tokens than exact from token "
               f"{next(j for j, (a, b) in enumerate(zip(e + [None], s + [None])) if a != b)}"
               for i, (e, s) in enumerate(zip(exact_ids, strict_ids)) if e != s]
    else:
        out = [f"prompt {i}: {strict_name} relaxed {n} draft(s)"
               for i, n in enumerate(sum(len(st["relaxed"]) for st in steps) for steps in strict_audit) if n]
    for i, (ids, steps) in enumerate(loose):
        for st in steps:
            for e in st["relaxed"]:
                pos = st["done"] + e["depth"] - 1
                if pos < len(ids) and ids[pos] != e["draft"]:
                    out.append(f"prompt {i}: a relaxed draft {e['draft']} at token {pos} is not the token kept "
                               f"({ids[pos]})")
                elif greedy and rule in REPLAYED and not replay(rule, settings, e):
                    out.append(f"prompt {i}: relaxed draft {e['draft']} at token {pos} (z1 {e['z1']:.4g}, z2 "
                               f"{e['z2']:.4g}) is not what {rule} accepts")
    return out


def run(models, job) -> dict:
    """The self-check of ``job``'s rule on ``models`` (``engine.Models``, or ``serve.ServedModels``: its decodes then go
    through the server); its record, or a one-line ConfigError."""
    from mars_bench.store.recordbuild import sample_seed
    from mars_bench.tasks import build_messages

    m = job.method
    samples = job.samples[:PROMPTS]
    prompts = [models.prompt_ids(build_messages(job.task, s, [], 0)) for s in samples]
    seeds = [sample_seed(job.cfg.seed, i, 0) for i in range(len(samples))]
    settings = dict(m.rule_kwargs)

    def decode(rule, s):
        return models.decode_ids(job, prompts, seeds, (rule, s), TOKENS)

    exact_ids, _ = decode("exact", {})
    strict_ids, strict_audit = decode(m.rule, strict_settings(m.rule, settings))
    loose_ids, audits = decode(m.rule, settings)
    greedy = float(job.cfg.temperature) == 0
    found = problems(m.rule, RULES[m.rule].settings(settings), greedy, exact_ids, strict_ids,
                     list(zip(loose_ids, audits)), strict_audit)
    where = f"vLLM {models.version}, Model Runner {models.runner.upper()}"
    if found:
        raise ConfigError(f"engine=vllm self-check failed on {where}: {found[0]} ({len(found)} problem(s)); the run "
                          "is refused (docs/vllm.md \"Self-check\")")
    return {"passed": True, "vllm": models.version, "runner": models.runner, "rule": m.rule, "settings": settings,
            "strict": STRICT[m.rule], "prompts": len(prompts), "tokens": TOKENS,
            "relaxed_checked": sum(len(st["relaxed"]) for steps in audits for st in steps),
            "replayed": greedy and m.rule in REPLAYED}
