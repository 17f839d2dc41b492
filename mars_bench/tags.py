"""Run directory names: built and parsed here and nowhere else (``RunTag.format`` / ``RunTag.parse``).

A run directory's name holds every setting that changes outputs, so rerunning a command resumes it and
runs never mix:
    <head>[-k<k>][-<tree shape>][-sample|-qdraft][-<rule settings>][-pmin<p>][-draft<quant>][-b<B>]
        [-sys<name>][-afterstep][-nothink|-think][-prompts<src>]-T<T>-p<top_p>-n<max new>-s<seed>
head: the drafting scheme (ar, sd, sd_tree, eagle3) with rule exact; the release presets for rule mars
(mars, mars_tree, eagle3_mars, so older results stay readable); otherwise <scheme>+<rule>
(e.g. sd+topk_delta). Rule settings come from the rule's registration (``Rule.tag_parts``): numbers
as <prefix><value>, switches only when not at their default. Parts are separated by '-' followed by
a letter, so numbers such as 1e-05 stay whole. -b<B> is the batch size, present only when B > 1, so
batched runs (throughput, docs/batching.md) never mix with batch-size-1 runs; their ar baseline is the
ar run at the same B. -qdraft: a sampled tree whose top-k children are verified against the draft's
probability (``method.topk_q=draft``, the MARS authors' code; lossy even with rule exact, so such a run
is never a lossless reference: ``RunTag.lossless``).
The protocol's parts (conf/protocol/) appear only away from their defaults: -sys<name> a named system
prompt (system_prompts.py), -afterstep the authors' budget rule (checked after each step), -nothink /
-think model.enable_thinking false / true, -prompts<src> the task option prompts (e.g. -promptsauthors)
for tasks that have it. The ar baseline keeps them all: runs under different protocols never mix.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field, replace

from .decode.rules import RULES
from .decode.types import CHAIN, PRESETS, SCHEMES, TREE

_HEAD = {(scheme, rule): name for name, (scheme, rule) in PRESETS.items()}
_SPLIT = re.compile(r"-(?=[A-Za-z])")
_NUM = r"[0-9][0-9.e+-]*"


def _fmt(x: float) -> str:
    return f"{float(x):g}"


@dataclass(frozen=True)
class RunTag:
    scheme: str                     # ar | sd | sd_tree | eagle3
    rule: str                       # a name in RULES (exact for ar)
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    k: int | None = None            # chains
    tree: str | None = None         # trees: d<depth>-w<top_k>-t<total> or paths<sha1[:8]>
    sample_children: bool = False   # trees, sampled: children drawn without replacement
    topk_q: str = "onehot"          # trees, sampled, topk children: onehot | draft (in the tag as -qdraft)
    settings: dict = field(default_factory=dict)   # the rule's settings (defaults filled in)
    p_min: float = 0.0              # chains: adaptive draft length
    draft_quant: str | None = None  # int8 when the draft model is quantized
    batch_size: int = 1             # sequences decoded at once (in the tag only when > 1)
    system_prompt: str = "none"     # protocol.system_prompt (a name in system_prompts.SYSTEM_PROMPTS)
    budget: str = "exact"           # protocol.budget: exact | after_step
    enable_thinking: bool | None = None  # model.enable_thinking (None: the chat template's default)
    task_prompts: str = "ours"      # the task option prompts, for tasks that have it (else ours)

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg, max_new: int, task_prompts: str = "ours") -> "RunTag":
        """``task_prompts``: the task's ``prompts`` option as the runner applied it (ours for tasks without it)."""
        from . import config as C

        m = C.method_of(cfg)
        tree = None
        if m.name in TREE:
            paths = m.tree.get("static_paths")
            tree = (f"paths{hashlib.sha1(str([list(p) for p in paths]).encode()).hexdigest()[:8]}" if paths is not None
                    else f"d{m.tree['depth']}-w{m.tree['top_k']}-t{m.tree['total_tokens']}")
        quant = C.draft_quant_of(cfg)
        return cls(scheme=m.name, rule=m.rule if m.speculative else "exact", temperature=float(cfg.temperature),
                   top_p=float(cfg.top_p), max_new_tokens=int(max_new), seed=int(cfg.seed),
                   k=m.k if m.name == "sd" else None, tree=tree,
                   sample_children=m.name in TREE and m.tree.get("children") == "sample" and cfg.temperature > 0,
                   topk_q=m.tree.get("topk_q", "onehot") if m.name in TREE and cfg.temperature > 0 else "onehot",
                   settings=dict(m.rule_kwargs) if m.speculative else {},
                   p_min=m.p_min if m.name == "sd" else 0.0, draft_quant=None if quant in (None, "none") else quant,
                   batch_size=int(cfg.get("batch_size", 1) or 1), system_prompt=cfg.protocol.system_prompt,
                   budget=cfg.protocol.budget, enable_thinking=cfg.model.enable_thinking, task_prompts=task_prompts)

    @property
    def head(self) -> str:
        if self.rule == "exact":
            return self.scheme
        return _HEAD.get((self.scheme, self.rule), f"{self.scheme}+{self.rule}")

    def format(self) -> str:
        parts = [self.head]
        if self.k is not None:
            parts.append(f"k{self.k}")
        if self.tree:
            parts.append(self.tree)
        if self.sample_children:
            parts.append("sample")
        if self.topk_q != "onehot":
            parts.append(f"q{self.topk_q}")
        if self.scheme != "ar":
            rule = RULES[self.rule]
            parts += rule.tag_parts(rule.settings(self.settings), self.temperature, self.top_p)
        if self.p_min:
            parts.append(f"pmin{_fmt(self.p_min)}")
        if self.draft_quant:
            parts.append(f"draft{self.draft_quant}")
        if self.batch_size > 1:
            parts.append(f"b{self.batch_size}")
        parts += self._protocol_parts()
        parts += [f"T{_fmt(self.temperature)}", f"p{_fmt(self.top_p)}", f"n{self.max_new_tokens}", f"s{self.seed}"]
        return "-".join(parts)

    __str__ = format

    def _protocol_parts(self) -> list[str]:
        parts = [] if self.system_prompt == "none" else [f"sys{self.system_prompt}"]
        if self.budget == "after_step":
            parts.append("afterstep")
        if self.enable_thinking is not None:
            parts.append("think" if self.enable_thinking else "nothink")
        if self.task_prompts != "ours":
            parts.append(f"prompts{self.task_prompts}")
        return parts

    # ---- related runs ------------------------------------------------------------------------
    def baseline(self) -> "RunTag":
        """The ar run of the same target and settings (speedup, fidelity)."""
        return RunTag("ar", "exact", self.temperature, self.top_p, self.max_new_tokens, self.seed,
                      batch_size=self.batch_size, system_prompt=self.system_prompt, budget=self.budget,
                      enable_thinking=self.enable_thinking, task_prompts=self.task_prompts)

    @property
    def lossless(self) -> bool:
        """A speculative run whose outputs follow the target's law: a lossless rule and, for sampled
        trees, top-k children verified as point masses (topk_q onehot)."""
        return self.scheme != "ar" and RULES[self.rule].lossless and self.topk_q == "onehot"

    def lossless_reference(self) -> "RunTag | None":
        """The same drafting with rule exact and topk_q onehot (sd for a lossy chain rule), or None for
        ar and lossless runs."""
        if self.scheme == "ar" or self.lossless:
            return None
        return replace(self, rule="exact", settings={}, topk_q="onehot")

    # ---- parsing -----------------------------------------------------------------------------
    @classmethod
    def parse(cls, name: str) -> "RunTag | None":
        """The inverse of ``format``; None for a name that is not a run tag."""
        parts = _SPLIT.split(name)
        if len(parts) < 5:
            return None
        try:
            tail = dict(zip("Tpns", (_value(p, c) for p, c in zip(parts[-4:], "Tpns"))))
            scheme, rule = _scheme_rule(parts[0])
        except ValueError:
            return None
        out = {"k": None, "tree": None, "sample_children": False, "topk_q": "onehot", "p_min": 0.0, "draft_quant": None,
               "batch_size": 1}
        body = parts[1:-4]
        if body and scheme == "sd" and re.fullmatch(r"k\d+", body[0]):
            out["k"] = int(body.pop(0)[1:])
        if body and scheme in TREE and re.fullmatch(r"d\d+|paths[0-9a-f]{8}", body[0]):
            out["tree"] = body.pop(0)
            while out["tree"].startswith("d") and body and re.fullmatch(r"[wt]\d+", body[0]):
                out["tree"] += "-" + body.pop(0)
        if body and body[0] == "sample":
            out["sample_children"] = bool(body.pop(0))
        if body and scheme in TREE and body[0] == "qdraft":
            out["topk_q"] = body.pop(0)[1:]
        out.update(_protocol_settings(body))
        if body and re.fullmatch(r"b\d+", body[-1]) and int(body[-1][1:]) > 1:
            out["batch_size"] = int(body.pop()[1:])
        if body and re.fullmatch(r"draft[a-z0-9]+", body[-1]):
            out["draft_quant"] = body.pop()[5:]
        if body and re.fullmatch(f"pmin{_NUM}", body[-1]):
            out["p_min"] = float(body.pop()[4:])
        try:
            settings = _rule_settings(rule, body) if scheme != "ar" else {}
        except ValueError:
            return None
        if scheme != "ar" and body:
            return None
        return cls(scheme=scheme, rule=rule, temperature=tail["T"], top_p=tail["p"], max_new_tokens=int(tail["n"]),
                   seed=int(tail["s"]), settings=settings, **out)


def _protocol_settings(body: list[str]) -> dict:
    """Consume the protocol's parts from the end of ``body`` (in place), in reverse order of ``format``."""
    out = {}
    if body and re.fullmatch(r"prompts[a-z0-9_]+", body[-1]):
        out["task_prompts"] = body.pop()[len("prompts"):]
    if body and body[-1] in ("think", "nothink"):
        out["enable_thinking"] = body.pop() == "think"
    if body and body[-1] == "afterstep":
        body.pop()
        out["budget"] = "after_step"
    if body and re.fullmatch(r"sys[a-z0-9_]+", body[-1]):
        out["system_prompt"] = body.pop()[len("sys"):]
    return out


def _value(part: str, prefix: str) -> float:
    if not part.startswith(prefix) or not re.fullmatch(_NUM, part[1:]):
        raise ValueError(part)
    return float(part[1:])


def _scheme_rule(head: str) -> tuple[str, str]:
    if head in PRESETS:
        return PRESETS[head]
    scheme, plus, rule = head.partition("+")
    if scheme not in SCHEMES or (plus and rule not in RULES):
        raise ValueError(head)
    return scheme, rule if plus else "exact"


def _rule_settings(rule_name: str, body: list[str]) -> dict:
    """Consume the rule's parts from ``body`` (in place); the rest of the settings take their defaults."""
    rule, given = RULES[rule_name], {}
    for knob in rule.knobs:
        for i, part in enumerate(body):
            if knob.choices:
                hit = [c for c in knob.choices if part == f"{knob.tag}{c}"]
                if hit:
                    given[knob.name] = hit[0]
            elif part.startswith(knob.tag) and re.fullmatch(_NUM, part[len(knob.tag):]):
                given[knob.name] = knob.check(part[len(knob.tag):], "tag")
            if knob.name in given:
                del body[i]
                break
    return rule.settings(given)


SPEC_FILE = "run.json"


def read_spec(run_dir) -> "RunTag | None":
    """The spec of a run directory: its ``run.json`` when it has one; else (result trees written before
    run.json existed) its name, read once as a legacy tag. None for a directory that is not a run."""
    from pathlib import Path

    run_dir = Path(run_dir)
    return RunTag.parse(run_dir.name)


__all__ = ["RunTag", "CHAIN", "TREE", "SPEC_FILE", "read_spec"]
