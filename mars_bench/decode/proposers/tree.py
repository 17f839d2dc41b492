"""A drafter (small LM or EAGLE-3 head) drafts a tree per row (``tree.build``): EAGLE-2 dynamic trees or
static ones. Each row has its own drafter state (a fork of the drafter: same weights, own cache), so
rows are drafted one after another and verified together in the target's batched forward.
"""
from __future__ import annotations

from mars_bench.decode.drafters import as_drafter
from mars_bench.decode.tree.build import TreeSpec, build_tree
from mars_bench.decode.proposers.base import Proposal


class TreeProposer:
    kind = "tree"

    def __init__(self, draft, spec: TreeSpec | None, method, cfg):
        if draft is None:
            raise ValueError(f"method {method.name!r} needs a draft model or a drafting head")
        self.spec = spec if spec is not None else TreeSpec.from_method(method)
        self.base, self.cfg = as_drafter(draft), cfg
        self.needs_hidden = self.base.needs_hidden
        self.most = self.spec.max_depth
        self.rows_hint = self.spec.total_tokens if self.spec.static_paths is None else len(self.spec.static_paths) + 1
        self.mode = "greedy" if cfg.temperature == 0.0 else self.spec.children
        self.rows: list = []
        self.forward_s = 0.0
        self.base.expect(self.spec.top_k if self.spec.static_paths is None else _widest(self.spec))

    @classmethod
    def make(cls, method, drafter, cfg, tree=None) -> "TreeProposer":
        return cls(drafter, tree, method, cfg)

    def reset(self, batch_size: int) -> None:
        self.rows = [None] * batch_size

    def start(self, row: int, prompt: list[int], hidden=None) -> None:
        d = self.rows[row] = self.base.fork()
        self._timed(d, d.prefill, prompt, hidden)

    def propose(self, rows, most: list[int]) -> list[Proposal]:
        out = []
        for b, (r, m) in enumerate(zip(rows, most)):
            d = self.rows[b]
            tree = self._timed(d, build_tree, d, r.seq, self.spec, m, self.mode, self.cfg, r.gen)
            out.append(Proposal(tree.tokens[1:], tree=tree))
        return out

    def commit(self, rows, proposals, verdicts, committed, hidden=None) -> None:
        for b, (p, v, c) in enumerate(zip(proposals, verdicts, committed)):
            d = self.rows[b]
            self._timed(d, d.commit, p.tree, v.path, c, hidden[b] if hidden else None)

    def select(self, keep: list[int]) -> None:
        self.rows = [self.rows[b] for b in keep]

    def _timed(self, d, fn, *args):
        before = d.forward_s
        out = fn(*args)
        self.forward_s += d.forward_s - before
        return out


def _widest(spec: TreeSpec) -> int:
    """Static tree: the most nodes one drafter expansion feeds (nodes of one depth with children)."""
    parents = {p[:-1] for p in spec.static_paths if len(p) > 1}
    return max([sum(1 for p in parents if len(p) == d) for d in range(1, spec.max_depth)], default=1)
