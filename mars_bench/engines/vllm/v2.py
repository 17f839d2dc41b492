"""The rule registry inside vLLM's Model Runner V2, through vLLM's public ``LogitsProcessor`` interface
(``vllm/v1/worker/gpu/sample/logits_processor/interface.py``, the same in 0.32, 0.33 and 0.34).

V2 verifies a step's chain of request b at its logits rows: row i (``ctx.expanded_local_pos`` i = 0..k) holds the
target's logits after the first i drafts; the draft it verifies is the input token of the next row of the same
request (``ctx.input_ids[row + 1]``: V2's kernel reads ``draft_sampled_ptr + logit_idx + 1``); the request's last
row is the bonus row (no draft). ``apply`` runs before temperature and top-k/top-p, so the rows it sees are the raw
logits z. For each request that carries the harness's rule (``verify.spec_of`` of its extra_args) it runs the rule
(``verify.decide``: ``decode/rules``' function, the one the native engine and the V1 patch call) on the drafted rows
and makes a row one-hot at its draft (0 there, -inf elsewhere; ``verify.rewrite``) where the rule accepts what the
standard test rejects, so V2's unchanged kernel accepts it; every other row, the correction and the bonus draw are
vLLM's own. Greedy decoding only (``compat.runner``): the sampled test needs q_draft and the kernel's uniform, which a
logits processor does not see. Draft slots of a step that starts inside the prefill hold -1 in V2 (placeholders):
the rule never sees them.

The audit of a step (one JSON line per request, as the V1 plugin writes): drafts proposed, the accepted prefix
(greedy: the rule's own prefix, which V2's argmax test then keeps), z1 / z2 and the relaxed acceptances; ``done``:
output tokens before the step, from the row's position and the request's prompt length.

``RowRules`` holds this logic without vLLM (tested on CPU tensors with vLLM's own ``LogitsContext`` where it
imports, else a stand-in); ``processor_class()`` is vLLM's subclass, named ``PROCESSOR`` in ``LLM(logits_processors=
[...])`` and in ``vllm serve --logits-processors``.
"""
from __future__ import annotations

import torch

from mars_bench.engines.vllm import verify

PROCESSOR = "mars_bench.engines.vllm.v2:MarsLogitsProcessor"


def _extra(sampling_params) -> dict | None:
    return sampling_params.extra_args if sampling_params is not None else None


def check_params(sampling_params) -> None:
    """A one-line ValueError for a request V2 cannot carry: a lossy rule with temperature > 0 (module doc); the
    rule and its settings as ``verify.spec_of`` checks them."""
    spec = verify.spec_of(_extra(sampling_params))
    if spec is None:
        return
    rule, settings = spec
    verify.check_rule(rule.name, settings)
    if sampling_params.temperature and not rule.lossless:
        raise ValueError(f"rule={rule.name} with temperature={sampling_params.temperature} cannot run in vLLM's "
                         "Model Runner V2 (its logits processors see neither q_draft nor the kernel's uniform); "
                         "allowed: temperature=0, or the V1 runner (vLLM 0.32 / 0.33)")


class RowRules:
    """Per request slot: the rule, its settings and the audit key (``add``); per step: the decision on the batch's
    drafted rows, the rows rewritten in place, and the audit rows (``apply``)."""

    def __init__(self, prompt_len=None):
        self.slots: dict[int, tuple] = {}      # slot -> ((Rule, settings), key)
        self.prompt_len = prompt_len           # slot -> prompt tokens (vLLM's req_states.prompt_len.np)

    def add(self, slot: int, sampling_params) -> bool:
        extra = _extra(sampling_params)
        spec = verify.spec_of(extra)
        if spec is None or spec[0].lossless:
            self.slots.pop(slot, None)         # exact: vLLM's own verification, nothing to rewrite
            return False
        self.slots[slot] = (spec, verify.key_of(extra))
        return True

    def apply(self, logits: torch.Tensor, slot_of_row, local_pos, input_ids, pos) -> list[tuple[str, dict]]:
        """Decide and rewrite ``logits`` [rows, V] in place; returns (key, step record) per request of ours that had
        drafts. ``slot_of_row``, ``local_pos``, ``input_ids``, ``pos``: [rows] (``LogitsContext``)."""
        slots, lp = slot_of_row.tolist(), local_pos.tolist()
        if not any(s in self.slots for s in slots):
            return []
        ids = input_ids.tolist()
        n = len(slots)
        rows, drafts, num_draft, specs, keys, starts = [], [], [], [], [], []
        r = 0
        while r < n:                            # one request: rows r .. e (local positions 0 .. e - r)
            e = r
            while e + 1 < n and lp[e + 1] == lp[e] + 1:
                e += 1
            if slots[r] in self.slots and e > r:
                spec, key = self.slots[slots[r]]
                rows += range(r, e)
                drafts += ids[r + 1:e + 1]
                num_draft.append(e - r)
                specs.append(spec)
                keys.append(key)
                starts.append(r)
            r = e + 1
        if not rows:
            return []
        idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        draft = torch.tensor(drafts, dtype=torch.long, device=logits.device)
        z = logits[idx].float()
        dec = verify.decide(draft, num_draft, z, z, None, None, [True] * len(specs), specs)
        relaxed_rows = idx[dec.relaxed]
        if relaxed_rows.numel():
            logits[relaxed_rows] = float("-inf")
            logits[relaxed_rows, draft[dec.relaxed]] = 0.0
        accepted = verify.first_rejections(dec.accept & (draft >= 0), num_draft)
        records = verify.audit(dec, draft, num_draft, accepted)
        positions = pos.tolist()
        out = []
        for key, start, rec in zip(keys, starts, records):
            done = positions[start] + 1 - int(self.prompt_len[slots[start]]) if self.prompt_len is not None else None
            out.append((key, {**rec, "done": done, "runner": "v2"}))
        return out


_CLASS = []


def processor_class():
    """vLLM's ``LogitsProcessor`` subclass (built on first use: vLLM is imported here only)."""
    if _CLASS:
        return _CLASS[0]
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

    from mars_bench.engines.vllm import compat, plugin

    class MarsLogitsProcessor(LogitsProcessor):
        """The rule registry in V2's verification (module doc)."""

        def __init__(self, vllm_config, req_states):
            self.rules = RowRules(req_states.prompt_len.np)

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            check_params(sampling_params)

        def add_request(self, req_idx, sampling_params) -> bool:
            return self.rules.add(int(req_idx), sampling_params)

        def apply(self, logits, ctx):
            rows = self.rules.apply(logits, ctx.expanded_idx_mapping, ctx.expanded_local_pos, ctx.input_ids, ctx.pos)
            if rows and compat.writes_audit():
                plugin.write_audit(rows)
            return logits

    _CLASS.append(MarsLogitsProcessor)
    return MarsLogitsProcessor


def __getattr__(name):   # ``module:MarsLogitsProcessor`` as vLLM's loader resolves it
    if name == "MarsLogitsProcessor":
        return processor_class()
    raise AttributeError(name)
