"""Per-sample records, run summaries and the manifest (versions, git commit, data sha256).

Records are written first, one JSON line per finished sample, flushed and fsynced; summaries are
derived from them (``summarize``) and written atomically. Tables and plots only read these files.
A line of samples.jsonl is a ``SampleRecord`` (its turns ``TurnRecord``s) in dict form: ``to_dict`` writes it
with its ``record_version``; ``from_dict`` reads lines of every version, those written before the version
existed included.
Definitions (cited in every table caption):
  tau      = new tokens / target verification forwards (accepted drafts + 1 bonus/correction per step)
  speedup  = (sum new tokens / sum wall s) of a method / the same for ``ar``, over the same samples
Beside them, labelled as theirs, the authors' formulas (5SSjw/MARS, mars/evaluation/speed.py, speed1.py):
  tau_authors     = sum new tokens / sum idx, idx = verification cycles - 1 per generate call (a turn);
                    their ``idx`` is the loop index at the break of eagenerate, one less than the number of
                    target verification forwards after the prefill, which is what ``steps`` counts here
  speedup_authors = mean over samples of the method's tokens/s / mean over samples of ar's tokens/s (a ratio
                    of means); ar's tokens per turn = len(tokenizer(output text).input_ids) - 1, the text
                    re-tokenized (``n_retokenized`` of a turn); the method's tokens are its new tokens
  speedup_mean_of_ratios = mean over samples of (tokens/s method / tokens/s ar on that sample), neither
                    ours nor the authors'; kept in summary.json only, for comparison
"""
from __future__ import annotations

import errno
import json
import logging
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path

from .locking import APPEND_LOCK, Claims, StorageError, exclusive, storage_errors  # noqa: F401 (re-export)

log = logging.getLogger("mars_bench")

TAU_DEFINITION = ("tau = mean tokens committed per target verification forward "
                  "(accepted drafts + 1 bonus/correction token)")
SPEEDUP_DEFINITION = ("speedup = (sum new tokens / sum wall s) of the method over the same for "
                      "plain autoregressive decoding (ar) of the same target, same samples and settings")
TAU_AUTHORS_DEFINITION = ("tau (authors' formula) = sum new tokens / sum over turns of (target verification "
                          "forwards - 1), their idx (5SSjw/MARS speed.py); above tau, most on short outputs")
SPEEDUP_AUTHORS_DEFINITION = ("speedup (authors' formula) = mean over samples of the method's tokens/s / mean "
                              "over samples of ar's tokens/s, ar's tokens counted by re-tokenizing its output "
                              "text minus 1 per turn (5SSjw/MARS speed.py)")


# ---- the sample record ---------------------------------------------------------------------------
RECORD_VERSION = 1   # the layout of a samples.jsonl line; 0: a line written before records had a version


@dataclass(frozen=True)
class TurnRecord:
    """One turn of a sample: its decode's counts, timings, per-step acceptances and output. ``span_s``
    (batched decoding only) is written only when set; keys this version does not know are kept in ``extra``."""
    prompt_tokens: int | None = None
    new_tokens: int = 0
    steps: int = 0                          # target verification forwards (prefill excluded)
    n_retokenized: int | None = None        # len(tokenizer(output text).input_ids); None: not recorded
    tau: float | None = None
    stop_reason: str | None = None
    prefill_s: float = 0.0
    wall_s: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0
    proposed: list = field(default_factory=list)    # per step: drafts proposed
    accepted: list = field(default_factory=list)    # per step: drafts accepted
    relaxed: list = field(default_factory=list)     # one entry per lenient acceptance
    z1: list = field(default_factory=list)
    z2: list = field(default_factory=list)
    outcome: str = ""
    output_ids: list = field(default_factory=list)
    output_text: str = ""
    depth_proposed: list | None = None      # trees: deepest draft per step
    span_s: float | None = None             # batched: admission to finish, shared with other rows
    extra: dict = field(default_factory=dict)

    _WHEN_SET = ("span_s",)

    def to_dict(self) -> dict:
        """The turn as samples.jsonl holds it."""
        return _as_dict(self, self._WHEN_SET)

    @classmethod
    def from_dict(cls, data) -> "TurnRecord":
        """A turn from its dict (any record version; missing keys take their defaults); a TurnRecord as is."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValueError(f"turn record {data!r:.60}; allowed: a JSON object")
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class SampleRecord:
    """One finished sample (all its turns), one line of samples.jsonl: what ran, its totals over the turns,
    its score and the turns. ``from_dict`` reads lines of every version, including those written before
    ``record_version`` existed (0); ``writer`` (the process that wrote the line) is written only when set."""
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
    theta: float | None = None
    temperature: float | None = None
    seed: int | None = None
    timing: str | None = None               # interleaved | sequential
    order: int | None = None                # position among the interleaved methods for this sample
    phase: str | None = None                # a study's phase: quality (batched) | timed (B = 1); None outside studies
    machine: dict | None = None             # where it was decoded (``machine()``): cpu, isa, threads, gpu
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
    record_version: int = RECORD_VERSION
    extra: dict = field(default_factory=dict)

    _WHEN_SET = ("writer",)

    def to_dict(self) -> dict:
        """The sample as samples.jsonl holds it: ``record_version`` first, then today's keys."""
        out = _as_dict(self, self._WHEN_SET)
        out["turns"] = [TurnRecord.from_dict(t).to_dict() for t in self.turns]
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
        known = _known(cls, data)
        known["turns"] = [TurnRecord.from_dict(t) for t in data.get("turns") or []]
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


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    with storage_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_samples(path: Path, repair: bool = False) -> tuple[list[dict], list[str]]:
    """(records, problems). A corrupt or truncated line is reported as 'file:line: why' and skipped.

    ``repair``: a truncated final line (a run killed mid-write) is cut off the file so that a resumed
    run appends cleanly. Later duplicates of an id are ignored (the first complete record wins).
    """
    path = Path(path)
    if not path.exists():
        return [], []
    records, problems, seen, good_bytes = [], [], set(), 0
    with open(path, "rb") as f:
        data = f.read()
    offset = 0
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        end = offset + len(raw) + 1
        complete = end <= len(data)
        offset = end
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            if not isinstance(rec, dict) or "id" not in rec:
                raise ValueError("not a sample record (no 'id')")
        except ValueError as e:
            problems.append(f"{path}:{lineno}: {'truncated line' if not complete else e}")
            continue
        if not complete:
            problems.append(f"{path}:{lineno}: truncated line (no newline)")
            continue
        good_bytes = end
        if rec["id"] in seen:
            continue
        seen.add(rec["id"])
        records.append(rec)
    if repair and good_bytes < len(data) and data[good_bytes:].count(b"\n") == 0:
        with open(path, "r+b") as f:
            f.truncate(good_bytes)
    return records, problems


class SampleWriter:
    """Appends one JSON line per finished sample, flushed and fsynced; shares a run directory safely.

    Several processes may use one run directory at once: each sample is claimed first (``claimed``), so no
    sample is decoded twice and no line is duplicated (policy: ``locking``). Every write error is a one-line
    ``StorageError`` naming the path; a failed append is cut back so that the file holds whole lines only."""

    def __init__(self, path: Path, on_start=None):
        """``on_start()``: called once, when this writer first claims a sample (its run directory created),
        before that sample is decoded; the runner writes the run's spec there."""
        self.path = Path(path)   # a new run directory is created only when the first sample is claimed
        self._lock = self.path.parent / APPEND_LOCK
        self._on_start = on_start
        self._claims: Claims | None = None
        self.done: set = set()
        self._offset = None   # bytes of samples.jsonl already read (whole lines)
        if self.path.parent.is_dir():
            self.refresh()
        else:
            _check_writable(self.path.parent)

    @property
    def claims(self) -> Claims:
        if self._claims is None:
            with storage_errors(self.path.parent):
                self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._on_start is not None:
                self._on_start()
            self._claims = Claims(self.path.parent)
        return self._claims

    def refresh(self) -> set:
        """Add the ids finished since the last call (by any process); a torn last line is a killed writer's
        (appends hold the lock) and is cut off. Reads only the new bytes."""
        with exclusive(self._lock), storage_errors(self.path):
            if self._offset is None:
                existing, _ = read_samples(self.path, repair=True)
                self.done = {r["id"] for r in existing}
                self._offset = self.path.stat().st_size if self.path.exists() else 0
                return self.done
            if not self.path.exists():
                return self.done
            with open(self.path, "r+b") as f:
                f.seek(self._offset)
                data = f.read()
                end = data.rfind(b"\n") + 1
                if end < len(data):
                    f.truncate(self._offset + end)
        for raw in data[:end].split(b"\n"):
            try:
                rec = json.loads(raw) if raw.strip() else None
            except ValueError:
                continue          # reported by read_samples when the run is summarized
            if isinstance(rec, dict) and "id" in rec:
                self.done.add(rec["id"])
        self._offset += end
        return self.done

    def claim(self, sample_id: str, wait: bool = False) -> bool:
        """True: this process holds ``sample_id`` and it is not finished; decode it, then ``write`` it."""
        if not self.claims.take(sample_id, wait=wait):
            return False
        if sample_id in self.refresh():
            self.claims.release(sample_id)
            return False
        return True

    def claimed(self, todo: list) -> "_Claimed":
        """The (index, sample) pairs of ``todo`` this process gets to decode (see ``locking``)."""
        return _Claimed(self, todo)

    def write(self, record: "dict | SampleRecord") -> None:
        from .interrupts import deferred

        if isinstance(record, SampleRecord):
            record = record.to_dict()
        record = {**record, "writer": f"{platform.node()}:{os.getpid()}"}   # which process decoded it (several may share a run dir)
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8")
        kept = f"{len(self.done)} finished samples are kept in {self.path}"
        with deferred(), exclusive(self._lock), storage_errors(self.path, kept):
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                start = os.fstat(fd).st_size
                try:
                    view = memoryview(line)
                    while view:
                        view = view[os.write(fd, view):]
                    os.fsync(fd)
                except OSError:
                    try:
                        os.ftruncate(fd, start)   # never leave half a record behind
                    except OSError:
                        pass                      # read_samples(repair=True) cuts it on the next run
                    raise
            finally:
                os.close(fd)
        self.done.add(record["id"])
        self.claims.release(record["id"])

    def close(self) -> None:
        if self._claims is not None:
            self._claims.release_all()


def _check_writable(folder: Path) -> None:
    """A folder to be created must have a writable nearest existing ancestor (read-only mounts included)."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not os.access(p, os.W_OK | os.X_OK):
        err = OSError(errno.EROFS if _read_only(p) else errno.EACCES,
                      os.strerror(errno.EROFS if _read_only(p) else errno.EACCES))
        raise StorageError(p, err)


def _read_only(p: Path) -> bool:
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except OSError:
        return False


class _Claimed:
    """Free samples first (no waiting); then, waiting, the ones other processes held, unless finished by then."""

    def __init__(self, writer: SampleWriter, todo: list):
        self.writer, self.todo = writer, list(todo)

    def __len__(self) -> int:
        return len(self.todo)

    def __iter__(self):
        later = []
        for item in self.todo:
            if item[1].id in self.writer.done:
                continue
            if self.writer.claim(item[1].id):
                yield item
            elif item[1].id not in self.writer.done:
                later.append(item)
        if later:
            log.info("%d samples are being decoded by another process on %s; waiting for them",
                     len(later), self.writer.path.parent)
        for item in later:
            if self.writer.claim(item[1].id, wait=True):   # its holder died or never wrote it: ours now
                yield item


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def manifest() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "platform": platform.platform(),
            "processor": platform.machine(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "git_commit": git_commit()}


def _sum(records: list[SampleRecord], key: str):
    return sum(getattr(r, key) for r in records)


def authors_idx(record: "dict | SampleRecord") -> int:
    """The authors' ``idx`` summed over a sample's turns: verification forwards - 1 per turn."""
    return sum(t.steps - 1 for t in SampleRecord.from_dict(record).turns)


def authors_ar_tokens(record: "dict | SampleRecord") -> int | None:
    """ar's tokens as the authors count them: per turn len(tokenizer(text).input_ids) - 1, from the turn's
    ``n_retokenized``; None when a turn lacks it (records written before it was recorded)."""
    counts = [t.n_retokenized for t in SampleRecord.from_dict(record).turns]
    return None if any(c is None for c in counts) else sum(c - 1 for c in counts)


def acceptance_per_depth(records: list[SampleRecord]) -> list[float]:
    """Share of steps that accepted the draft at depth d, over the steps that proposed it (trees: the
    deepest draft of the step; chains: k)."""
    depth_prop, depth_acc = [], []
    for r in records:
        for turn in r.turns:
            for k, n in zip(turn.depth_proposed or turn.proposed, turn.accepted):
                for d in range(k):
                    while len(depth_prop) <= d:
                        depth_prop.append(0)
                        depth_acc.append(0)
                    depth_prop[d] += 1
                    depth_acc[d] += d < n
    return [a / p for a, p in zip(depth_acc, depth_prop)]


def outside_forward_share(wall_s: float, prefill_s: float, forward_s: float) -> float | None:
    """Share of the decoding loop's wall time (wall minus prefill) spent outside target and draft forwards:
    the harness's own cost per step (proposing, verifying, bookkeeping); None without loop time."""
    loop = wall_s - prefill_s
    return 1 - forward_s / loop if loop > 0 else None


def totals(records: "list[dict | SampleRecord]") -> dict:
    """Run-level speed and acceptance numbers from per-sample records."""
    records = as_records(records)
    tokens, steps, wall = _sum(records, "new_tokens"), _sum(records, "steps"), _sum(records, "wall_s")
    proposed, accepted = _sum(records, "n_proposed"), _sum(records, "n_accepted")
    idx = sum(authors_idx(r) for r in records)
    return {
        "n_samples": len(records), "new_tokens": tokens, "steps": steps, "wall_s": wall,
        "prefill_s": _sum(records, "prefill_s"), "target_s": _sum(records, "target_s"),
        "draft_s": _sum(records, "draft_s"),
        "tokens_per_s": tokens / wall if wall else 0.0, "tau": tokens / steps if steps else 0.0,
        "idx_authors": idx, "tau_authors": tokens / idx if idx > 0 else None,
        "n_proposed": proposed, "n_accepted": accepted, "n_exact": _sum(records, "n_exact"),
        "n_relaxed": _sum(records, "n_relaxed"),
        "acceptance_rate": accepted / proposed if proposed else None,
        "acceptance_per_depth": acceptance_per_depth(records),
        "outside_forward_share": outside_forward_share(wall, _sum(records, "prefill_s"),
                                                       _sum(records, "target_s") + _sum(records, "draft_s")),
    }


def paired_records(records: list[SampleRecord], ar_records: list[SampleRecord]) -> list[tuple]:
    """(record, ar record) for the ids both runs have, in ``records``' order."""
    ar = {r.id: r for r in ar_records}
    return [(r, ar[r.id]) for r in records if r.id in ar]


# the instruction sets the CPU kernels choose between (models/panel.py, fastpath.py), as /proc/cpuinfo names them
ISA_FLAGS = ("amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")


def machine(device: str = "cpu") -> dict:
    """The machine a record is decoded on: CPU model name, which of ISA_FLAGS it has, torch's threads, and the GPU
    when the model runs on CUDA. Speeds are compared only between records of equal machines (``speed_pairs``)."""
    import torch

    from .models.panel import cpu

    model, flags = cpu()
    gpu = torch.cuda.get_device_name(0) if device != "cpu" and torch.cuda.is_available() else None
    return {"cpu": model or platform.machine(), "isa": [f for f in ISA_FLAGS if f in flags],
            "threads": torch.get_num_threads(), "gpu": gpu}


def machine_label(m: dict | None) -> str:
    """One line for headers: 'Intel(R) Xeon(R) Processor (amx_bf16, avx512_bf16, ...; 2 threads)'."""
    if not m:
        return "unrecorded"
    isa = ", ".join(m.get("isa") or []) or "none of " + "/".join(ISA_FLAGS)
    return f"{m.get('gpu') or m.get('cpu')} ({isa}; {m.get('threads')} threads)"


def same_machine(a: SampleRecord, b: SampleRecord) -> bool:
    """Whether two records' times compare: equal machines, or either unrecorded (written before it was)."""
    return a.machine is None or b.machine is None or a.machine == b.machine


def speed_pairs(records: list[SampleRecord], ar_records: list[SampleRecord]) -> list[tuple]:
    """``paired_records`` whose two records ran on the same machine: the pairs a speedup is computed over
    (quality pairs across machines; speed never does)."""
    return [(r, b) for r, b in paired_records(records, ar_records) if same_machine(r, b)]


def machines(records: list) -> list[str]:
    """The distinct machines of a run's records, as labels (one, unless it was resumed elsewhere)."""
    return sorted({machine_label(r.machine) for r in as_records(records)})


def authors_speedup_columns(records, ar_records) -> tuple[list, list, list, list, str | None]:
    """(tokens, wall, ar tokens, ar wall, note) over the samples both runs have, ar's tokens counted the
    authors' way; where an ar record lacks ``n_retokenized``, its generated count stands in and note says so."""
    both = speed_pairs(as_records(records), as_records(ar_records))
    counted = [authors_ar_tokens(b) for _, b in both]
    missing = sum(c is None for c in counted)
    note = (f"{missing} of {len(both)} ar records lack n_retokenized (written before it was recorded): their "
            f"generated token count stands in for the re-tokenized one") if missing else None
    ar_tokens = [b.new_tokens if c is None else c for (_, b), c in zip(both, counted)]
    return ([r.new_tokens for r, _ in both], [r.wall_s for r, _ in both], ar_tokens,
            [b.wall_s for _, b in both], note)


def speedup(records, ar_records) -> dict | None:
    """Speedup over the ``ar`` run on the samples both have: ours, the authors', and the mean of per-sample
    ratios (definitions in the module doc)."""
    records, ar_records = as_records(records), as_records(ar_records)
    pairs = speed_pairs(records, ar_records)
    if not pairs:
        return None
    both, base = [r for r, _ in pairs], [b for _, b in pairs]
    mine_tps = _sum(both, "new_tokens") / _sum(both, "wall_s")
    ar_tps = _sum(base, "new_tokens") / _sum(base, "wall_s")
    ratios = [(r.new_tokens / r.wall_s) / (b.new_tokens / b.wall_s)
              for r, b in pairs if r.wall_s and b.wall_s and b.new_tokens]
    tok, wall, ar_tok, ar_wall, note = authors_speedup_columns(records, ar_records)
    rates = [(t / w, a / aw) for t, w, a, aw in zip(tok, wall, ar_tok, ar_wall) if w > 0 and aw > 0]
    ar_mean = sum(a for _, a in rates) / len(rates) if rates else 0.0
    return {"speedup": mine_tps / ar_tps,
            "speedup_authors": sum(m for m, _ in rates) / len(rates) / ar_mean if ar_mean else None,
            "speedup_authors_note": note,
            "speedup_mean_of_ratios": sum(ratios) / len(ratios) if ratios else None,
            "ar_tokens_per_s": ar_tps, "n_common": len(pairs)}
