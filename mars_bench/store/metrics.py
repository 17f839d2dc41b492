"""Run-level numbers from sample records: totals, tau, acceptance, the speedup over ar and the pairs it is taken
over (records of the same sample, decoded on the same machine).

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

from mars_bench.store.contention import disturbed
from mars_bench.store.provenance import machine_label
from mars_bench.store.records import SampleRecord, as_records

TAU_DEFINITION = ("tau = mean tokens committed per target verification forward "
                  "(accepted drafts + 1 bonus/correction token)")
SPEEDUP_DEFINITION = ("speedup = (sum new tokens / sum wall s) of the method over the same for "
                      "plain autoregressive decoding (ar) of the same target, same samples and settings")
TAU_AUTHORS_DEFINITION = ("tau (authors' formula) = sum new tokens / sum over turns of (target verification "
                          "forwards - 1), their idx (5SSjw/MARS speed.py); above tau, most on short outputs")
SPEEDUP_AUTHORS_DEFINITION = ("speedup (authors' formula) = mean over samples of the method's tokens/s / mean "
                              "over samples of ar's tokens/s, ar's tokens counted by re-tokenizing its output "
                              "text minus 1 per turn (5SSjw/MARS speed.py)")


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


def same_machine(a: SampleRecord, b: SampleRecord) -> bool:
    """Whether two records' times compare: equal machines, or either unrecorded (written before it was)."""
    return a.machine is None or b.machine is None or a.machine == b.machine


def speed_pairs(records: list[SampleRecord], ar_records: list[SampleRecord]) -> list[tuple]:
    """``paired_records`` whose two records ran on the same machine and neither under contention (``contention.
    disturbed``: docs/timing.md): the pairs a speedup is computed over (quality pairs across machines and loads;
    speed never does)."""
    return [(r, b) for r, b in paired_records(records, ar_records)
            if same_machine(r, b) and not disturbed(r.contention) and not disturbed(b.contention)]


def contended(records: list) -> list[str]:
    """The ids of the records decoded under contention (``contention.disturbed``), in order."""
    return [r.id for r in as_records(records) if disturbed(r.contention)]


def contention_recorded(records: list) -> bool | None:
    """Whether a run's records say what the machine did while they were timed: True (all), False (none: written
    before it was measured, or batched), None (some)."""
    have = {r.contention is not None for r in as_records(records)}
    return None if len(have) > 1 else (have.pop() if have else False)


def left_out_note(records: list, ar_records: list) -> str | None:
    """Why samples both runs hold are not speed pairs (``speed_pairs``), counted, the contended ones named."""
    records, ar_records = as_records(records), as_records(ar_records)
    common = paired_records(records, ar_records)
    apart = sum(not same_machine(r, b) for r, b in common)
    busy = [r.id for r, b in common if same_machine(r, b) and (disturbed(r.contention) or disturbed(b.contention))]
    notes = ([f"{apart} of {len(common)} samples left out: decoded on another machine than ar's (speed compares "
              "only within one machine)"] if apart else []) + (
        [f"{len(busy)} of {len(common)} samples left out: timed under contention in this run or ar's "
         f"(docs/timing.md): {', '.join(busy)}"] if busy else [])
    return "; ".join(notes) or None


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
