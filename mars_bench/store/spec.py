"""Run specs: every setting that changes a run's outputs (``RunSpec``), stored in the run directory as
``run.json`` and named by a short hash of it.

A run directory is named ``<label>@<digest>`` (``RunSpec.dir_name``):
    label   a readable summary of the spec (below); two specs may share one, since numbers in it are
            rounded to 6 significant digits (theta 0.9 and 0.9000001 both read th0.9)
    digest  the first 10 hex digits of the sha256 of the spec's canonical JSON (``RunSpec.digest``): equal
            specs give equal names in every process, so rerunning a command resumes its run, and specs
            that differ anywhere (floats compared exactly) never share a directory
``run.json`` (``SPEC_FILE``) holds the spec itself (``to_dict``, with ``spec_version``); ``read_spec``
reads it back. Result trees written before run.json existed are named by the label alone, ending in
-s<seed>; ``read_spec`` reads their spec from that name (``RunSpec.parse``), and nothing else reads a
directory's name.

The label:
    <head>[-k<k>][-<tree shape>][-sample|-qdraft][-<rule settings>][-pmin<p>][-draft<quant>][-b<B>]
        [-sys<name>][-afterstep][-nothink|-think][-prompts<src>]-T<T>-p<top_p>-n<max new>-s<seed>
-<engine>[-serve] follows the protocol's parts for engines other than native (-serve: through the engine's HTTP
server, ``vllm serve``, with batch_size requests in flight).
head: the drafting scheme (ar, sd, sd_tree, eagle3) with rule exact; the release presets for rule mars
(mars, mars_tree, eagle3_mars, so older results stay readable); otherwise <scheme>+<rule>
(e.g. sd+topk_delta). Rule settings come from the rule's registration (``Rule.tag_parts``): numbers
as <prefix><value>, switches only when not at their default. Parts are separated by '-' followed by
a letter, so numbers such as 1e-05 stay whole. -b<B> is the batch size, present only when B > 1, so
batched runs (throughput, docs/batching.md) never mix with batch-size-1 runs; their ar baseline is the
ar run at the same B. -qdraft: a sampled tree whose top-k children are verified against the draft's
probability (``method.topk_q=draft``, the MARS authors' code; lossy even with rule exact, so such a run
is never a lossless reference: ``RunSpec.lossless``).
The protocol's parts (conf/protocol/) appear only away from their defaults: -sys<name> a named system
prompt (system_prompts.py), -afterstep the authors' budget rule (checked after each step), -nothink /
-think model.enable_thinking false / true, -prompts<src> the task option prompts (e.g. -promptsauthors)
for tasks that have it. The ar baseline keeps them all: runs under different protocols never mix.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from mars_bench.decode.rules import RULES
from mars_bench.decode.drafting import SCHEMES, scheme_of
from mars_bench.decode.types import PRESETS

_HEAD = {(scheme, rule): name for name, (scheme, rule) in PRESETS.items()}
_SPLIT = re.compile(r"-(?=[A-Za-z])")
_NUM = r"[0-9][0-9.e+-]*"

SPEC_FILE = "run.json"
SPEC_VERSION = 2        # the layout of run.json (2: model identity and engine); from_dict reads every version up to this one
DIGEST_CHARS = 10
DIR_SEPARATOR = "@"     # between label and digest; never in a legacy name (those end in -s<seed>)
NATIVE = "native"       # the default engine (this package's own loop), named once: engines.NATIVE is this
# Fields left out of the digest at these values (fixed here, never the dataclass defaults, so that changing a
# default can never give an old directory to new settings). A field added later goes here with the value
# that means "not used", so that every earlier run keeps its directory.
DIGEST_NEUTRAL = {"options": {}, "draft_vocab": 0, "model": None, "draft_model": None, "engine": "native",
                  "engine_version": None, "serve": False}


def _fmt(x: float) -> str:
    return f"{float(x):g}"


@dataclass(frozen=True)
class RunSpec:
    """Every setting that changes a run's outputs; names its directory (``dir_name``) and is stored there
    (run.json, ``to_dict``)."""
    scheme: str                     # a name in decode.drafting.SCHEMES: ar | sd | lookup | sd_tree | eagle3
    rule: str                       # a name in RULES (exact for ar)
    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int
    k: int | None = None            # speculative chains (sd, lookup): most drafts per step
    tree: str | None = None         # trees: d<depth>-w<top_k>-t<total> or paths<sha1[:8]>
    sample_children: bool = False   # trees, sampled: children drawn without replacement
    topk_q: str = "onehot"          # trees, sampled, topk children: onehot | draft (in the label as -qdraft)
    settings: dict = field(default_factory=dict)   # the rule's settings (defaults filled in)
    p_min: float = 0.0              # chains: adaptive draft length
    draft_quant: str | None = None  # the draft's quantization scheme (int8row, q8g32, q4g32) when quantized
    draft_vocab: int = 0            # model.draft_vocab: ids the draft's LM head keeps (0 = all)
    batch_size: int = 1             # sequences decoded at once (in the label only when > 1)
    system_prompt: str = "none"     # protocol.system_prompt (a name in system_prompts.SYSTEM_PROMPTS)
    budget: str = "exact"           # protocol.budget: exact | after_step
    enable_thinking: bool | None = None  # model.enable_thinking (None: the chat template's default)
    task_prompts: str = "ours"      # the task option prompts, for tasks that have it (else ours)
    options: dict = field(default_factory=dict)    # scheme-specific knobs (Method.options), e.g. maxngram3-minngram1
    # What ran it (models/identity.py): the target side (weights, dtype, device, fast path, sharding), shared with
    # the ar baseline, and the proposer's weights (draft LM and/or EAGLE-3 head; None without one). None = unknown:
    # a result tree written before run identities, which no new run ever matches.
    model: dict | None = None
    draft_model: dict | None = None
    engine: str = NATIVE            # what runs the decoding loop: native (ours) | vllm | llamacpp
    engine_version: str | None = None   # the engine's version where it is not this package (vllm, llamacpp)
    serve: bool = False             # requests sent to the engine's HTTP server (vllm serve), batch_size in flight

    def __post_init__(self):
        """Checks scheme and rule and gives every number its one type (floats as floats, counts as ints, the
        rule's settings through its registration), so that equal settings give equal digests."""
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme={self.scheme!r}; allowed: {', '.join(SCHEMES)}")
        if self.rule not in RULES:
            raise ValueError(f"rule={self.rule!r}; allowed: {', '.join(RULES)}")
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        for name in ("temperature", "top_p", "p_min"):
            put(name, float(getattr(self, name)))
        for name in ("max_new_tokens", "seed", "batch_size", "draft_vocab"):
            put(name, int(getattr(self, name)))
        if self.k is not None:
            put("k", int(self.k))
        settings = dict(self.settings or {})
        put("settings", RULES[self.rule].settings(settings) if self.scheme != "ar" else settings)
        put("options", dict(self.options or {}))
        for name in ("model", "draft_model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{name}={value!r:.60}; allowed: an object or null")
            put(name, None if value is None else dict(value))
        if self.scheme == "ar" and self.draft_model is not None:
            raise ValueError("draft_model set for scheme ar; allowed: null (ar runs no draft)")

    # ---- run.json ----------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The spec as JSON-safe values (what run.json holds): ``spec_version`` and every field; floats
        keep their exact value through JSON."""
        return {"spec_version": SPEC_VERSION,
                **{f.name: _copy(getattr(self, f.name)) for f in fields(self)}}

    @classmethod
    def from_dict(cls, data: dict) -> "RunSpec":
        """The inverse of ``to_dict``; a one-line ValueError for a version, field or value it cannot read."""
        if not isinstance(data, dict):
            raise ValueError(f"run spec {data!r:.60}; allowed: a JSON object")
        version = data.get("spec_version")
        if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SPEC_VERSION:
            raise ValueError(f"spec_version={version!r}; allowed: an integer from 1 to {SPEC_VERSION}")
        body = {k: v for k, v in data.items() if k != "spec_version"}
        names = [f.name for f in fields(cls)]
        unknown = [k for k in body if k not in names]
        if unknown:
            raise ValueError(f"run spec field {unknown[0]!r}; allowed: {', '.join(names)}")
        required = [f.name for f in fields(cls) if _required(f)]
        missing = [name for name in required if name not in body]
        if missing:
            raise ValueError(f"run spec lacks {missing[0]!r}; required: {', '.join(required)}")
        try:
            return cls(**body)
        except TypeError as e:   # a value of the wrong kind, e.g. settings that are not an object
            raise ValueError(f"run spec value of the wrong type ({e}); allowed: the types of RunSpec.to_dict") from None

    @property
    def digest(self) -> str:
        """10 hex digits of the sha256 of the canonical JSON of every field (those of ``DIGEST_NEUTRAL`` left
        out at their neutral value); the same in every process and platform."""
        core = {f.name: _copy(getattr(self, f.name)) for f in fields(self)
                if not (f.name in DIGEST_NEUTRAL and getattr(self, f.name) == DIGEST_NEUTRAL[f.name])}
        text = json.dumps(core, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
        return hashlib.sha256(text.encode("ascii")).hexdigest()[:DIGEST_CHARS]

    @property
    def dir_name(self) -> str:
        """The run directory's name: ``<label>@<digest>``."""
        return f"{self.label}{DIR_SEPARATOR}{self.digest}"

    # ---- the label ---------------------------------------------------------------------------
    @property
    def head(self) -> str:
        if self.rule == "exact":
            return self.scheme
        return _HEAD.get((self.scheme, self.rule), f"{self.scheme}+{self.rule}")

    @property
    def label(self) -> str:
        """The short readable name (module doc); also the whole name of a legacy run directory."""
        parts = [self.head]
        if self.k is not None:
            parts.append(f"k{self.k}")
        if self.tree:
            parts.append(self.tree)
        parts += [f"{name.replace('_', '')}{value}" for name, value in sorted((self.options or {}).items())]
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
        if self.draft_vocab:
            parts.append(f"dvocab{self.draft_vocab}")
        if self.batch_size > 1:
            parts.append(f"b{self.batch_size}")
        parts += self._protocol_parts()
        if self.engine != NATIVE:
            parts.append(self.engine)
        if self.serve:
            parts.append("serve")
        parts += [f"T{_fmt(self.temperature)}", f"p{_fmt(self.top_p)}", f"n{self.max_new_tokens}", f"s{self.seed}"]
        return "-".join(parts)

    def __str__(self) -> str:
        return self.label

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
    def baseline(self, native: bool = False) -> "RunSpec":
        """The ar run of the same target and settings (speedup, fidelity) on the same engine; ``native``: on the
        native engine (the ratio of another engine's run, e.g. llama.cpp's, to this package's ar)."""
        engine, version = ("native", None) if native else (self.engine, self.engine_version)
        return RunSpec("ar", "exact", self.temperature, self.top_p, self.max_new_tokens, self.seed,
                       batch_size=self.batch_size, system_prompt=self.system_prompt, budget=self.budget,
                       enable_thinking=self.enable_thinking, task_prompts=self.task_prompts, model=self.model,
                       engine=engine, engine_version=version, serve=self.serve and not native)

    @property
    def speculative(self) -> bool:
        """Its scheme drafts (``decode.drafting``): every scheme but ar."""
        return scheme_of(self.scheme).speculative

    @property
    def lossless(self) -> bool:
        """A speculative run whose outputs follow the target's law: a lossless rule and, for sampled
        trees, top-k children verified as point masses (topk_q onehot)."""
        return self.scheme != "ar" and RULES[self.rule].lossless and self.topk_q == "onehot"

    def lossless_reference(self) -> "RunSpec | None":
        """The same drafting with rule exact and topk_q onehot (sd for a lossy chain rule), or None for
        ar and lossless runs."""
        if self.scheme == "ar" or self.lossless:
            return None
        return replace(self, rule="exact", settings={}, topk_q="onehot")

    # ---- legacy names ------------------------------------------------------------------------
    @classmethod
    def parse(cls, name: str) -> "RunSpec | None":
        """A legacy run directory's name (a label, no digest) read back as its spec; None for a name that
        is not one. Numbers are as the label rounded them; only ``read_spec`` needs this."""
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
        s = scheme_of(scheme)
        if body and not s.tree and s.speculative and re.fullmatch(r"k\d+", body[0]):
            out["k"] = int(body.pop(0)[1:])
        if body and s.tree and re.fullmatch(r"d\d+|paths[0-9a-f]{8}", body[0]):
            out["tree"] = body.pop(0)
            while out["tree"].startswith("d") and body and re.fullmatch(r"[wt]\d+", body[0]):
                out["tree"] += "-" + body.pop(0)
        if body and body[0] == "sample":
            out["sample_children"] = bool(body.pop(0))
        if body and s.tree and body[0] == "qdraft":
            out["topk_q"] = body.pop(0)[1:]
        out.update(_protocol_settings(body))
        if body and re.fullmatch(r"b\d+", body[-1]) and int(body[-1][1:]) > 1:
            out["batch_size"] = int(body.pop()[1:])
        if body and re.fullmatch(r"draft[a-z0-9]+", body[-1]):
            out["draft_quant"] = body.pop()[5:]
        try:
            if body and re.fullmatch(f"pmin{_NUM}", body[-1]):
                out["p_min"] = float(body.pop()[4:])
            settings = _rule_settings(rule, body) if scheme != "ar" else {}
        except ValueError:
            return None
        if scheme != "ar" and body:
            return None
        try:
            return cls(scheme=scheme, rule=rule, temperature=tail["T"], top_p=tail["p"],
                       max_new_tokens=int(tail["n"]), seed=int(tail["s"]), settings=settings, **out)
        except (ValueError, OverflowError):
            return None


def _protocol_settings(body: list[str]) -> dict:
    """Consume the protocol's parts from the end of ``body`` (in place), in reverse order of ``label``."""
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


def _required(f) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _copy(value):
    """A field's value for JSON: dicts copied (a spec's dicts stay its own)."""
    return dict(value) if isinstance(value, dict) else value


def read_spec(run_dir) -> "RunSpec | None":
    """The spec of a run directory: its ``run.json`` when it has one; else (result trees written before
    run.json existed) its name, read once as a legacy tag. None for a directory that is not a run."""
    run_dir = Path(run_dir)
    path = run_dir / SPEC_FILE
    if not path.is_file():
        return RunSpec.parse(run_dir.name)
    try:
        return RunSpec.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def write_spec(run_dir, spec: RunSpec) -> None:
    """Write ``run_dir/run.json`` (atomically) unless it is there; one that is there must hold ``spec``."""
    from mars_bench.store.io import atomic_write_json

    path = Path(run_dir) / SPEC_FILE
    if path.is_file():
        found = read_spec(run_dir)
        if found != spec:
            raise ValueError(f"{path} holds the spec of {found.dir_name}, not of {spec.dir_name}; "
                             "allowed: one run per directory")
        return
    atomic_write_json(path, spec.to_dict())


__all__ = ["RunSpec", "SPEC_FILE", "SPEC_VERSION", "read_spec", "write_spec"]
