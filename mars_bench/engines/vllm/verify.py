"""The rule registry applied to vLLM's chain verification, batched, on CPU or GPU tensors: pure torch, no vLLM.

vLLM verifies a step's drafts of every request at once: ``draft`` [N] (the requests' drafts concatenated,
``num_draft`` [B] of them per request), the target's logits at those positions and, for sampled requests,
uniforms u [N] and the draft's probabilities q_draft [N, V] (None: point-mass drafts, q = 1 at the draft).
Its kernel accepts the longest prefix of each request's chain that passes the standard test (greedy:
draft == argmax; sampled: p_target[d] >= u q_draft[d]), then emits the correction (greedy: argmax; sampled: a
draw from norm(max(0, p_target - q_draft))) or the bonus token.

``decide`` runs each request's rule (``decode/rules``: the same function the native engine calls) on its
positions, from the RAW target logits z (before temperature, top-k/top-p and logits processors) and from
p_target = softmax of the logits vLLM's kernel will read (after them), with vLLM's own uniforms. ``rewrite``
then changes the kernel's input at each RELAXED position (accepted by the rule where the standard test, with
the same uniform, rejects): the row becomes one-hot at the draft (0 there, -inf elsewhere), so the unchanged
kernel accepts it (greedy: argmax = draft; sampled: p_target[d] = 1 >= u q_draft[d]). Every other row is left
as vLLM made it, so the kernel's own test, correction and bonus draw do the rest: the chain's accepted prefix
is the rule's, and a rejected row's correction is drawn from the residual of the unchanged p_target. Rules
that are not position-wise (``fly``: a block rule) or correct from p_target (``typical``), and mars'
``outside_top2=skip`` (a rejection the standard test would accept), cannot be expressed this way:
``check_rule`` refuses them in one line.

``audit`` reads the kernel's output (accepted prefix per request) and returns, per request, what the
native engine records per step: drafts proposed / accepted, z1 / z2 / top-1 / top-2 of each verified position
and one entry per relaxed acceptance.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mars_bench.decode.rules import RULES, Rule, top2

PLACEHOLDER = -1   # vLLM's id for a rejected slot in the kernel's output


def supported_rules() -> tuple[str, ...]:
    """Rules vLLM's chain kernel can carry by input rewriting: position-wise (defined for trees) with the residual
    correction."""
    return tuple(n for n, r in RULES.items() if "tree" in r.modes and r.correction == "residual")


def check_rule(name: str, settings: dict) -> None:
    """A one-line ValueError for a rule (or setting) vLLM's verification cannot express."""
    ok = supported_rules()
    if name not in ok:
        raise ValueError(f"rule={name} cannot run inside vLLM's verification (not position-wise or not corrected "
                         f"from the residual); allowed with engine=vllm: {', '.join(ok)}")
    if settings.get("outside_top2") == "skip":
        raise ValueError("rule.outside_top2=skip cannot run inside vLLM's verification (it rejects what the standard "
                         "test accepts); allowed with engine=vllm: test")


@dataclass
class Decision:
    """One step's per-position verdict (``decide``), the rows rewritten, and what the audit reads."""
    accept: torch.Tensor          # BoolTensor[N]: the rule's decision at each position (prefix not applied)
    relaxed: torch.Tensor         # BoolTensor[N]: accepted by the rule where the standard test rejects
    clause: torch.Tensor          # LongTensor[N]: 1-based clause of a relaxed acceptance, else 0
    z1: torch.Tensor
    z2: torch.Tensor
    top1: torch.Tensor
    top2: torch.Tensor
    rules: list = field(default_factory=list)    # per request: rule name or None (not ours)


def _expand(per_request: list, num_draft: list[int]) -> list:
    return [x for x, n in zip(per_request, num_draft) for _ in range(n)]


def decide(draft: torch.Tensor, num_draft: list[int], z: torch.Tensor, logits: torch.Tensor,
           draft_probs: torch.Tensor | None, uniform: torch.Tensor | None, greedy: list[bool],
           specs: list) -> Decision:
    """The rule of each request on its positions. ``z``: raw target logits [N, V]; ``logits``: what vLLM's kernel
    reads [N, V] (p_target = its softmax for sampled requests); ``greedy`` [B]; ``specs`` [B]: (Rule, settings) or
    None for a request this harness did not send (its rows are never touched)."""
    n_tok = draft.shape[0]
    draft = draft.long()
    z = z.float()
    z1, z2, t1, t2 = top2(z)
    accept = torch.zeros(n_tok, dtype=torch.bool, device=z.device)
    relaxed = torch.zeros_like(accept)
    clause = torch.zeros(n_tok, dtype=torch.long, device=z.device)
    pos_spec, pos_greedy = _expand(specs, num_draft), _expand(greedy, num_draft)
    groups: dict = {}
    valid = (draft >= 0).tolist()    # vLLM pads with -1: its kernel rejects those, the rule never sees them
    for i, (spec, g) in enumerate(zip(pos_spec, pos_greedy)):
        if spec is not None and valid[i]:
            rule, settings = spec
            groups.setdefault((rule.name, tuple(sorted(settings.items())), g), (rule, settings, []))[2].append(i)
    for (_, _, g), (rule, settings, rows) in groups.items():
        idx = torch.tensor(rows, dtype=torch.long, device=z.device)
        d = draft[idx]
        if g:
            v = rule(d, z[idx], **settings)
        else:
            p_target = torch.softmax(logits[idx].float(), dim=-1)
            if draft_probs is None:
                q_draft = torch.nn.functional.one_hot(d, z.shape[-1]).to(p_target.dtype)
            else:
                q_draft = draft_probs[idx].float()
            v = rule(d, z[idx], p_target, q_draft, uniform[idx], **settings)
        accept[idx], relaxed[idx], clause[idx] = v.accept, v.relaxed, v.clause
    names = [None if s is None else s[0].name for s in specs]
    return Decision(accept, relaxed, clause, z1, z2, t1, t2, names)


def rewrite(logits: torch.Tensor, draft: torch.Tensor, relaxed: torch.Tensor) -> torch.Tensor:
    """Rows of ``logits`` at relaxed positions made one-hot at the draft (0 there, -inf elsewhere), in place;
    returns ``logits``. No relaxed position: the tensor is not written."""
    rows = relaxed.nonzero().squeeze(-1)
    if rows.numel():
        logits[rows] = float("-inf")
        logits[rows, draft.long()[rows]] = 0.0
    return logits


def accepted_counts(output_token_ids: torch.Tensor) -> list[int]:
    """Drafts accepted per request from the kernel's output [B, max_spec_len + 1] (valid tokens - 1)."""
    return ((output_token_ids != PLACEHOLDER).sum(-1) - 1).clamp_min(0).tolist()


def first_rejections(accept: torch.Tensor, num_draft: list[int]) -> list[int]:
    """Per request: the length of the accepted prefix under ``accept`` (the rule's own chain decision)."""
    out, start = [], 0
    for n in num_draft:
        a = accept[start:start + n].tolist()
        out.append(next((i for i, x in enumerate(a) if not x), n))
        start += n
    return out


def audit(dec: Decision, draft: torch.Tensor, num_draft: list[int], n_accepted: list[int]) -> list[dict | None]:
    """Per request this harness sent (else None): drafts proposed and accepted this step, z1 / z2 / top-1 / top-2 at
    each verified position (the accepted ones and the first rejected one, as the native engine records) and one
    entry per relaxed acceptance (depth 1-based, draft, clause name, top-1 / top-2, z1, z2). ``agree``: the
    kernel's accepted prefix equals the rule's."""
    rule_prefix = first_rejections(dec.accept, num_draft)
    out, start = [], 0
    cols = [x.tolist() for x in (draft.long(), dec.relaxed, dec.clause, dec.z1, dec.z2, dec.top1, dec.top2)]
    for b, (n, acc) in enumerate(zip(num_draft, n_accepted)):
        name = dec.rules[b]
        if name is None:
            out.append(None)
            start += n
            continue
        d, rel, cl, z1, z2, t1, t2 = (c[start:start + n] for c in cols)
        m = min(acc + 1, n)
        relaxed = [{"depth": i + 1, "draft": d[i], "rule": name, "clause": RULES[name].clauses[cl[i] - 1],
                    "top1": t1[i], "top2": t2[i], "z1": z1[i], "z2": z2[i]} for i in range(acc) if rel[i]]
        out.append({"proposed": n, "accepted": acc, "z1": z1[:m], "z2": z2[:m], "relaxed": relaxed,
                    "agree": acc == rule_prefix[b]})
        start += n
    return out


PREFIX = "mars_bench_"   # the request's keys in ``SamplingParams.extra_args`` / ``vllm serve``'s ``vllm_xargs``
FLAT = (str, int, float)  # what ``vllm_xargs`` carries (vLLM refuses a nested object)


def request_args(rule: str, settings: dict, key: str) -> dict:
    """A request's rule, settings and audit key as FLAT ``extra_args`` (the one form the offline engine and ``vllm
    serve``'s ``vllm_xargs`` both carry): ``mars_bench_rule``, ``mars_bench_key`` and ``mars_bench_<knob>`` per setting.
    A value that is not a string or number (a nested object, a list, a bool) is refused in one line."""
    out = {f"{PREFIX}rule": rule, f"{PREFIX}key": key}
    for name, value in settings.items():
        if isinstance(value, bool) or not isinstance(value, FLAT):
            raise ValueError(f"rule setting {name}={value!r:.60}; allowed: a string or a number (vllm_xargs "
                             "carries flat values only)")
        out[f"{PREFIX}{name}"] = value
    return out


def _ours(extra: dict | None) -> dict:
    return {k[len(PREFIX):]: v for k, v in (extra or {}).items() if k.startswith(PREFIX)}


def spec_of(extra: dict | None) -> tuple[Rule, dict] | None:
    """A request's rule from its ``SamplingParams.extra_args`` (``request_args``' flat keys); None when this harness
    did not send it. A nested value, an unknown rule or setting is refused in one line (ValueError); the settings are
    checked by the rule's registration."""
    ours = _ours(extra)
    if "rule" not in ours:
        return None
    nested = next((k for k, v in ours.items() if isinstance(v, bool) or not isinstance(v, FLAT)), None)
    if nested is not None:
        raise ValueError(f"extra_args {PREFIX}{nested}={ours[nested]!r:.60}; allowed: a string or a number "
                         "(flat keys, request_args)")
    name = ours.pop("rule")
    ours.pop("key", None)
    if name not in RULES:
        raise ValueError(f"extra_args {PREFIX}rule={name!r}; allowed: {', '.join(RULES)}")
    rule = RULES[name]
    return rule, rule.settings(ours)


def key_of(extra: dict | None) -> str | None:
    """The audit key of a request ``spec_of`` reads (``mars_bench_key``)."""
    return _ours(extra).get("key")
