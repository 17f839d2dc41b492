"""A sample's record from its decodes, for every engine (the native loop in ``runner.Models``, engine=vllm):
``job_fields`` (what every record of one job shares, built once per job from its RunSpec), ``turn_record`` (one
turn from the engine's ``DecodeResult``) and ``sample_record`` (the turns' totals under the job's fields)."""
from __future__ import annotations

from dataclasses import fields

from mars_bench.decode.types import DecodeStats
from mars_bench.store.records import SampleRecord, TurnRecord


def sample_seed(seed: int, index: int, turn: int) -> int:
    """The generator seed of a sample's turn (every engine): a sample's outputs never depend on what else is
    decoded."""
    return seed * 1_000_003 + index + 100_003 * turn


def job_fields(tag, task, model_name: str, draft_quant: str | None, interleaved: bool, phase: str | None) -> dict:
    """The ``SampleRecord`` fields every record of a job shares: its spec (``tag``: method, scheme, rule, k and
    p_min as the run's spec holds them, so k is None for ar and trees), task, the model's name, the draft's
    quantization as it runs (``config.settings.draft_quant_of``), how it was timed and its study phase. theta is
    in ``rule_settings`` (once)."""
    return dict(task=task.name, task_version=task.version, model=model_name, method=tag.head, scheme=tag.scheme,
                rule=tag.rule, rule_settings=tag.settings, k=tag.k, p_min=tag.p_min, draft_quant=draft_quant,
                temperature=tag.temperature, seed=tag.seed,
                timing="interleaved" if interleaved else "sequential", phase=phase, batch_size=tag.batch_size)


def turn_record(res, prompt_ids, text, tokenizer=None, batched: bool = False) -> dict:
    """One turn's record (``TurnRecord``) as samples.jsonl holds it, from the engine's result ``res``.
    ``n_retokenized`` = len(tokenizer(text.strip()).input_ids), special tokens as the tokenizer adds them: the
    count the authors' speed script takes ar's tokens from (minus 1); None without a tokenizer. ``batched``
    (batch size > 1): the row's ``span_s`` (admission to finish) is recorded too."""
    retok = len(tokenizer(text.strip()).input_ids) if tokenizer is not None else None
    stats = {f.name: getattr(res, f.name) for f in fields(DecodeStats)}
    return TurnRecord(
        **{**stats, "z1": [round(x, 4) for x in res.z1], "z2": [round(x, 4) for x in res.z2]},
        prompt_tokens=len(prompt_ids), new_tokens=len(res.tokens), n_retokenized=retok, tau=res.tau,
        output_ids=res.tokens, output_text=text, span_s=res.span_s if batched else None).to_dict()


def sample_record(job, sample, index, turns, score, fast_kernel: str, order: int,
                  machine_facts: dict | None = None, contention=None) -> dict:
    """One sample's record (``SampleRecord``) as samples.jsonl holds it: ``job.fields`` (``job_fields``), the
    sample, and the totals of ``turns``, its turn records (``turn_record``'s dicts or TurnRecords);
    ``contention``: what the machine did while it was timed (``contention.Probe``; None: not measured)."""
    turns = [TurnRecord.from_dict(t) for t in turns]
    s = lambda key: sum(getattr(t, key) for t in turns)  # noqa: E731
    n_acc = sum(sum(t.accepted) for t in turns)
    lenient = [e for t in turns for e in t.relaxed]
    by_clause = {}
    for e in lenient:
        by_clause[e["clause"]] = by_clause.get(e["clause"], 0) + 1
    return SampleRecord(
        **job.fields, id=sample.id, index=index, fast_kernel=fast_kernel, machine=machine_facts, order=order,
        new_tokens=s("new_tokens"), steps=s("steps"), tau=s("new_tokens") / s("steps") if s("steps") else 0.0,
        n_proposed=sum(sum(t.proposed) for t in turns), n_accepted=n_acc, n_exact=n_acc - len(lenient),
        n_relaxed=len(lenient), n_by_clause=by_clause, prefill_s=s("prefill_s"), wall_s=s("wall_s"),
        target_s=s("target_s"), draft_s=s("draft_s"), score=score, turns=turns, contention=contention).to_dict()
