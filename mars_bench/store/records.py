"""The sample record: one line of samples.jsonl is a ``SampleRecord`` (its turns ``TurnRecord``s) in dict form.
``to_dict`` writes it with its ``record_version``; ``from_dict`` reads lines of every version, those written before
the version existed included. A lossy rule's theta is held once, in ``rule_settings`` (``SampleRecord.theta`` reads
it there); lines written when records also held a ``theta`` key read the same. A turn's decode statistics are the
engine's (``decode.types.DecodeStats``), declared once there; ``TurnRecord`` adds what only a record holds (prompt
size, counts as recorded, the output).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from mars_bench.decode.types import DecodeStats
from mars_bench.store.contention import Contention
from mars_bench.store.io import read_samples

RECORD_VERSION = 1   # the layout of a samples.jsonl line; 0: a line written before records had a version


@dataclass
class TurnRecord(DecodeStats):
    """One turn of a sample: its decode's ``DecodeStats``, counts and output. ``span_s`` (batched decoding only) is
    written only when set; ``depth_proposed`` (trees only) is written as null when empty; keys this version does
    not know are kept in ``extra``."""
    prompt_tokens: int | None = None
    new_tokens: int = 0
    n_retokenized: int | None = None        # len(tokenizer(output text).input_ids); None: not recorded
    tau: float | None = None                # new_tokens / steps as recorded
    output_ids: list = field(default_factory=list)
    output_text: str = ""
    span_s: float | None = None             # batched: admission to finish, shared with other rows
    extra: dict = field(default_factory=dict)

    _WHEN_SET = ("span_s",)
    _NULL_WHEN_EMPTY = ("depth_proposed",)

    def to_dict(self) -> dict:
        """The turn as samples.jsonl holds it."""
        out = _as_dict(self, self._WHEN_SET)
        return {**out, **{name: out[name] or None for name in self._NULL_WHEN_EMPTY}}

    @classmethod
    def from_dict(cls, data) -> "TurnRecord":
        """A turn from its dict (any record version; missing keys take their defaults); a TurnRecord as is."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"turn record {data!r:.60}; allowed: a JSON object")
        known = _known(cls, data)
        return cls(**{**known, **{name: known.get(name) or [] for name in cls._NULL_WHEN_EMPTY}})


@dataclass(frozen=True)
class SampleRecord:
    """One finished sample (all its turns), one line of samples.jsonl: what ran, its totals over the turns,
    its score and the turns. ``from_dict`` reads lines of every version, including those written before
    ``record_version`` existed (0); ``writer`` (the process that wrote the line) and ``contention`` (what the
    machine did while a batch-size-1 sample was timed: ``store.contention``; absent in records written before it
    was measured) are written only when set."""
    id: str
    index: int | None = None
    task: str | None = None
    task_version: int | str | None = None
    model: str | None = None
    method: str | None = None               # the spec's head (mars, sd+topk_delta, ...)
    scheme: str | None = None
    rule: str | None = None
    rule_settings: dict | None = None
    k: int | None = None
    p_min: float | None = None
    draft_quant: str | None = None
    fast_kernel: str | None = None
    temperature: float | None = None
    seed: int | None = None
    timing: str | None = None               # interleaved | sequential
    order: int | None = None                # position among the interleaved methods for this sample
    phase: str | None = None                # a study's phase: quality (batched) | timed (B = 1); None outside studies
    machine: dict | None = None             # where it was decoded (``machine()``): cpu, isa, threads, gpu
    commit: str | None = None               # the code that decoded it (``provenance.git_commit``; '+dirty': changes)
    new_tokens: int = 0
    steps: int = 0
    tau: float = 0.0
    n_proposed: int = 0
    n_accepted: int = 0
    n_exact: int = 0
    n_relaxed: int = 0
    n_by_clause: dict | None = None
    prefill_s: float = 0.0
    wall_s: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0
    score: dict | None = None
    batch_size: int | None = None
    turns: list = field(default_factory=list)   # TurnRecord
    writer: str | None = None
    contention: Contention | None = None    # the machine over the timed sample (batch size 1 only)
    record_version: int = RECORD_VERSION
    extra: dict = field(default_factory=dict)

    _WHEN_SET = ("writer", "contention")

    @property
    def theta(self) -> float | None:
        """The rule's theta, from ``rule_settings`` (None: a rule without one, or none recorded)."""
        return (self.rule_settings or {}).get("theta")

    def to_dict(self) -> dict:
        """The sample as samples.jsonl holds it: ``record_version`` first, then today's keys."""
        out = _as_dict(self, self._WHEN_SET)
        out["turns"] = [TurnRecord.from_dict(t).to_dict() for t in self.turns]
        if self.contention is not None:
            out["contention"] = Contention.from_dict(self.contention).to_dict()
        return {"record_version": out.pop("record_version"), **out}

    @classmethod
    def from_dict(cls, data) -> "SampleRecord":
        """A sample from a samples.jsonl line of any version up to RECORD_VERSION (missing keys take their
        defaults, unknown ones are kept in ``extra``); a SampleRecord as is."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict) or "id" not in data:
            raise ValueError(f"sample record {data!r:.60}; allowed: a JSON object with an 'id'")
        version = data.get("record_version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= RECORD_VERSION:
            raise ValueError(f"record_version={version!r}; allowed: an integer from 0 to {RECORD_VERSION}")
        known = _known(cls, {k: v for k, v in data.items() if k != "theta"})
        if data.get("theta") is not None and "theta" not in (known.get("rule_settings") or {}):
            known["rule_settings"] = {**(known.get("rule_settings") or {}), "theta": data["theta"]}   # older lines
        known["turns"] = [TurnRecord.from_dict(t) for t in data.get("turns") or []]
        if known.get("contention") is not None:
            known["contention"] = Contention.from_dict(known["contention"])
        return cls(**{**known, "record_version": version})


def _as_dict(record, when_set: tuple) -> dict:
    """A record's fields as a dict (``extra`` merged back in), leaving out the ``when_set`` fields at None."""
    out = {f.name: getattr(record, f.name) for f in fields(record)
           if f.name != "extra" and not (f.name in when_set and getattr(record, f.name) is None)}
    return {**out, **record.extra}


def _known(cls, data: dict) -> dict:
    """The constructor arguments of ``cls`` from ``data``: its fields, and every other key in ``extra``."""
    names = {f.name for f in fields(cls)} - {"extra"}
    return {**{k: v for k, v in data.items() if k in names},
            "extra": {k: v for k, v in data.items() if k not in names}}


def as_records(records) -> list[SampleRecord]:
    """Sample records as SampleRecords (dicts as read from samples.jsonl are converted)."""
    return [SampleRecord.from_dict(r) for r in records]


def read_records(path: Path) -> tuple[list[SampleRecord], list[str]]:
    """``read_samples`` as SampleRecords."""
    records, problems = read_samples(path)
    return as_records(records), problems
