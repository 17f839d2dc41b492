"""Per-sample records, run summaries and the manifest (versions, git commit, data sha256).

Records are written first, one JSON line per finished sample, flushed and fsynced; summaries are
derived from them (``summarize``) and written atomically. Tables and plots only read these files.
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
from pathlib import Path
from statistics import median

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

    def __init__(self, path: Path):
        self.path = Path(path)   # a new run directory is created only when the first sample is claimed
        self._lock = self.path.parent / APPEND_LOCK
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

    def write(self, record: dict) -> None:
        from .interrupts import deferred

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


def _sum(records, key):
    return sum(r[key] for r in records)


def authors_idx(record: dict) -> int:
    """The authors' ``idx`` summed over a sample's turns: verification forwards - 1 per turn."""
    return sum(t["steps"] - 1 for t in record["turns"])


def authors_ar_tokens(record: dict) -> int | None:
    """ar's tokens as the authors count them: per turn len(tokenizer(text).input_ids) - 1, from the turn's
    ``n_retokenized``; None when a turn lacks it (records written before it was recorded)."""
    counts = [t.get("n_retokenized") for t in record["turns"]]
    return None if any(c is None for c in counts) else sum(c - 1 for c in counts)


def totals(records: list[dict]) -> dict:
    """Run-level speed and acceptance numbers from per-sample records."""
    tokens, steps, wall = _sum(records, "new_tokens"), _sum(records, "steps"), _sum(records, "wall_s")
    proposed, accepted = _sum(records, "n_proposed"), _sum(records, "n_accepted")
    idx = sum(authors_idx(r) for r in records)
    depth_prop, depth_acc = [], []
    for r in records:
        for turn in r["turns"]:   # trees: depth_proposed = deepest draft per step; chains: k
            for k, n in zip(turn.get("depth_proposed") or turn["proposed"], turn["accepted"]):
                for d in range(k):
                    while len(depth_prop) <= d:
                        depth_prop.append(0)
                        depth_acc.append(0)
                    depth_prop[d] += 1
                    depth_acc[d] += d < n
    return {
        "n_samples": len(records), "new_tokens": tokens, "steps": steps, "wall_s": wall,
        "prefill_s": _sum(records, "prefill_s"), "target_s": _sum(records, "target_s"),
        "draft_s": _sum(records, "draft_s"),
        "tokens_per_s": tokens / wall if wall else 0.0, "tau": tokens / steps if steps else 0.0,
        "idx_authors": idx, "tau_authors": tokens / idx if idx > 0 else None,
        "n_proposed": proposed, "n_accepted": accepted, "n_exact": _sum(records, "n_exact"),
        "n_relaxed": _sum(records, "n_relaxed"),
        "acceptance_rate": accepted / proposed if proposed else None,
        "acceptance_per_depth": [a / p for a, p in zip(depth_acc, depth_prop)],
        "outside_forward_share": 1 - (_sum(records, "target_s") + _sum(records, "draft_s")) / wall if wall else None,
    }


def authors_speedup_columns(records: list[dict], ar_records: list[dict]) -> tuple[list, list, list, list, str | None]:
    """(tokens, wall, ar tokens, ar wall, note) over the samples both runs have, ar's tokens counted the
    authors' way; where an ar record lacks ``n_retokenized``, its generated count stands in and note says so."""
    ar = {r["id"]: r for r in ar_records}
    both = [r for r in records if r["id"] in ar]
    counted = [authors_ar_tokens(ar[r["id"]]) for r in both]
    missing = sum(c is None for c in counted)
    note = (f"{missing} of {len(both)} ar records lack n_retokenized (written before it was recorded): their "
            f"generated token count stands in for the re-tokenized one") if missing else None
    ar_tokens = [ar[r["id"]]["new_tokens"] if c is None else c for r, c in zip(both, counted)]
    return ([r["new_tokens"] for r in both], [r["wall_s"] for r in both], ar_tokens,
            [ar[r["id"]]["wall_s"] for r in both], note)


def speedup(records: list[dict], ar_records: list[dict]) -> dict | None:
    """Speedup over the ``ar`` run on the samples both have: ours, the authors', and the mean of per-sample
    ratios (definitions in the module doc)."""
    ar = {r["id"]: r for r in ar_records}
    both = [r for r in records if r["id"] in ar]
    if not both:
        return None
    base = [ar[r["id"]] for r in both]
    mine_tps = _sum(both, "new_tokens") / _sum(both, "wall_s")
    ar_tps = _sum(base, "new_tokens") / _sum(base, "wall_s")
    ratios = [(r["new_tokens"] / r["wall_s"]) / (b["new_tokens"] / b["wall_s"])
              for r, b in zip(both, base) if r["wall_s"] and b["wall_s"] and b["new_tokens"]]
    tok, wall, ar_tok, ar_wall, note = authors_speedup_columns(records, ar_records)
    rates = [(t / w, a / aw) for t, w, a, aw in zip(tok, wall, ar_tok, ar_wall) if w > 0 and aw > 0]
    ar_mean = sum(a for _, a in rates) / len(rates) if rates else 0.0
    return {"speedup": mine_tps / ar_tps,
            "speedup_authors": sum(m for m, _ in rates) / len(rates) / ar_mean if ar_mean else None,
            "speedup_authors_note": note,
            "speedup_mean_of_ratios": sum(ratios) / len(ratios) if ratios else None,
            "ar_tokens_per_s": ar_tps, "n_common": len(both)}


def median_or_none(xs):
    return median(xs) if xs else None
