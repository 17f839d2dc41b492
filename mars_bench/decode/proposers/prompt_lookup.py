"""Prompt lookup (n-gram) drafting: propose tokens that followed an earlier copy of the sequence's tail.

Algorithm (L = len(seq)); for n = max_ngram down to min_ngram (skipping n >= L):
  pattern = seq[L-n:]                       # the last n tokens
  matches = { i : seq[i:i+n] == pattern, 0 <= i < L-n }   # i = L-n, the suffix itself, is never a match;
                                            # a match may overlap the suffix ([1,1,1], n=2 -> i = 0)
  if matches: i = min(matches) if prefer == "first" else max(matches)
              return seq[i+n : i+n+k]       # clipped at the sequence end: 1..k tokens
return []                                   # no n-gram of any allowed size recurs
The longest n-gram with any match wins, whatever its position; within one n, ``prefer`` picks:
  "first" (default) the earliest match, scanning from the start: transformers'
          ``PromptLookupCandidateGenerator`` (``generate(prompt_lookup_num_tokens=k)``, min_ngram = 1, with
          no eos / logits-processor cropping, which belongs to the engine);
  "last"  the most recent match (llama.cpp-style); it may sit just before the suffix and give < k tokens.
The draft is a point mass (q_draft = None): verified with rule exact, greedy or sampled, it is lossless.

``NgramIndex`` gives the same answer in O(1) per proposal: for each n it maps n-gram -> its first (or
last) start i among those with a following token (i + n < L), updated in O(new tokens) by ``extend``.
"""
from __future__ import annotations

PREFER = ("first", "last")


def _check(k: int, max_ngram: int, min_ngram: int, prefer: str) -> None:
    for name, v in (("k", k), ("min_ngram", min_ngram)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}={v!r}; allowed: an integer >= 1")
    if not isinstance(max_ngram, int) or isinstance(max_ngram, bool) or max_ngram < min_ngram:
        raise ValueError(f"max_ngram={max_ngram!r}; allowed: an integer >= min_ngram={min_ngram}")
    if prefer not in PREFER:
        raise ValueError(f"prefer={prefer!r}; allowed: {', '.join(PREFER)}")


def lookup(seq: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1, prefer: str = "first") -> list[int]:
    """Up to ``k`` draft tokens for ``seq`` (prompt + output so far); [] when nothing matches.

    Matching rule in the module docstring: longest n first, then the first (or last) earlier occurrence
    of the last n tokens, never the suffix itself; the draft is what followed it, clipped to ``seq``'s end.
    A direct scan, O(L * max_ngram): the reference for ``NgramIndex``.
    """
    _check(k, max_ngram, min_ngram, prefer)
    L = len(seq)
    for n in range(min(max_ngram, L - 1), min_ngram - 1, -1):
        pattern, head = seq[L - n:], seq[L - n]
        starts = range(L - n) if prefer == "first" else range(L - n - 1, -1, -1)
        for i in starts:
            if seq[i] == head and seq[i:i + n] == pattern:
                return seq[i + n:i + n + k]
    return []


class NgramIndex:
    """Incremental ``lookup`` for one sequence: ``extend`` with committed tokens, ``propose(k)`` a draft.

    ``first[n]`` (or ``last``) maps an n-gram to its chosen start i among starts with i + n < L, i.e. every
    n-gram except those ending at the last token, so the suffix itself is never found. ``extend`` adds the
    starts that gained a following token: O(new tokens * ngram sizes). Append-only (no rollback).
    """

    def __init__(self, tokens: list[int] = (), max_ngram: int = 3, min_ngram: int = 1, prefer: str = "first"):
        _check(1, max_ngram, min_ngram, prefer)
        self.max_ngram, self.min_ngram, self.prefer = max_ngram, min_ngram, prefer
        self.tokens: list[int] = []
        self._pos: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_ngram, max_ngram + 1)}
        self._added = dict.fromkeys(self._pos, 0)      # starts 0.._added[n]-1 are indexed
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        """Append committed tokens and index every n-gram that now has a following token."""
        t = self.tokens
        t.extend(int(x) for x in tokens)
        keep_first = self.prefer == "first"
        for n, pos in self._pos.items():
            for i in range(self._added[n], len(t) - n):
                key = tuple(t[i:i + n])
                if keep_first:
                    pos.setdefault(key, i)
                else:
                    pos[key] = i
            self._added[n] = max(self._added[n], len(t) - n)

    def propose(self, k: int) -> list[int]:
        """``lookup(self.tokens, k, max_ngram, min_ngram, prefer)``, from the index."""
        _check(k, self.max_ngram, self.min_ngram, self.prefer)
        t, L = self.tokens, len(self.tokens)
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            i = self._pos[n].get(tuple(t[L - n:]))
            if i is not None:
                return t[i + n:i + n + k]
        return []
