"""Tree drafts: EAGLE-2-style dynamic trees and static trees, built by any drafter.

A tree's node 0 is the root: the newest committed token ``seq[-1]`` (not a draft). Every other node is
a draft token whose parent is the context it continues; nodes are stored in BFS order (by depth, then
by creation), so a parent always precedes its children and siblings keep their draw / rank order.

Dynamic trees (EAGLE-2, Li et al. 2024), knobs named as in the EAGLE code and the authors' scripts:
  1. the root's draft logits give its ``top_k`` children (level 1);
  2. ``depth`` times: the ``top_k`` newest-level nodes with the best cumulative draft log-probability
     (the frontier) are fed to the drafter in ONE forward with a tree attention mask, and each gets
     ``top_k`` children (so the deepest drafts are at depth ``depth + 1``);
  3. rerank every drafted node by cumulative draft log-probability and keep ``total_tokens - 1`` of
     them (``total_tokens`` counts the root, as EAGLE's ``total_token`` does). The selection is
     best-first over nodes whose parent and previous sibling are already kept (ties: shallower node,
     then the earlier-created one), so the kept set is closed under ancestors and, per parent, is a
     prefix of its children in draw order. With deterministic top-k children (scores non-increasing
     down a path and along siblings) this is exactly EAGLE-2's plain top-N rerank.
A chain is ``top_k = 1``: depth + 1 drafts. Static trees: ``static_paths`` lists every node as its
path of child ranks from the root ([0] = best child of the root, [0, 1] = its second-best child, ...);
``depth``/``top_k``/``total_tokens`` are then ignored.

How children are chosen (``TreeSpec.children``; greedy decoding always uses ``topk`` on raw logits):
  topk    the top-k tokens of the draft's RAW logits (EAGLE; scores = log_softmax of raw logits).
          Deterministic given the prefix, so sampled verification treats each child as a point-mass
          draft, q = one-hot (see tree.verify); ``topk_q = draft`` instead verifies a child against
          its draft probability at T = 1, softmax(raw draft logits)[child], as the MARS authors' code
          does (lossy; tree.verify).
  sample  children drawn one by one WITHOUT replacement from q = warp(draft logits, T, top_p);
          sampled verification uses q restricted to the not-yet-drawn tokens. Scores must not depend
          on a draw's own value (pruning would bias it): the i-th draw scores the EXPECTED draft
          probability of that draw, log sum_x q_i(x) q(x).

Drafters (``drafters.lm.LMDrafter`` over a small causal LM; ``drafters.eagle3.Eagle3Drafter``) are asked for
the root's logits once and for each frontier in one forward per depth; a fed node gets the next
drafter slot, which is how the drafter's cache keeps the accepted path after verification. Top-k dynamic trees are
built on the drafter's device and read to the host once (``_dynamic_on_device``); sampled children and
static trees are built on the host.
The loop that drives them is ``decode.engine`` (through ``proposers.tree``).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch

from mars_bench.decode import sampling

CHILDREN = ("topk", "sample")
TOPK_Q = ("onehot", "draft")


@dataclass(frozen=True)
class TreeSpec:
    # defaults: the fastest shape on the 2-core CPU by `make bench` (conf/method/sd_tree.yaml has the sweep)
    depth: int = 3                   # expansion forwards after the root (EAGLE `depth`); max depth + 1
    top_k: int = 3                   # children per expanded node, and frontier width
    total_tokens: int = 10           # tree size incl. the root (EAGLE `total_token`)
    static_paths: tuple | None = None  # static tree: paths of child ranks; None = dynamic
    children: str = "topk"           # sampled decoding: topk (q = one-hot) | sample (without replacement)
    topk_q: str = "onehot"           # sampled, topk children: onehot (lossless) | draft (the authors' q; lossy)

    def __post_init__(self):
        for name, low in (("depth", 0), ("top_k", 1), ("total_tokens", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"method.{name}={v!r}; allowed: an integer >= {low}")
        if self.children not in CHILDREN:
            raise ValueError(f"method.children={self.children!r}; allowed: {', '.join(CHILDREN)}")
        if self.topk_q not in TOPK_Q:
            raise ValueError(f"method.topk_q={self.topk_q!r}; allowed: {', '.join(TOPK_Q)}")
        if self.topk_q != "onehot" and self.children != "topk":
            raise ValueError(f"method.topk_q={self.topk_q!r} with method.children={self.children}; allowed with "
                             "children=sample: onehot (a drawn child is verified against the law it was drawn from)")
        if self.static_paths is not None:
            object.__setattr__(self, "static_paths", check_paths(self.static_paths))

    @property
    def max_depth(self) -> int:
        if self.static_paths is not None:
            return max(len(p) for p in self.static_paths)
        return self.depth + 1

    @classmethod
    def from_method(cls, method) -> "TreeSpec":
        """From ``method.tree`` (a TreeSpec or a dict of knobs) or flat method attributes."""
        tree = getattr(method, "tree", None)
        if isinstance(tree, TreeSpec):
            return tree
        if tree:
            return cls(**dict(tree))
        names = ("depth", "top_k", "total_tokens", "static_paths", "children", "topk_q")
        return cls(**{n: getattr(method, n) for n in names if getattr(method, n, None) is not None})


def check_paths(paths) -> tuple:
    """Validate a static tree: non-empty int paths, no duplicates, parent and previous sibling present."""
    out = tuple(tuple(int(r) for r in p) for p in paths)
    if not out:
        raise ValueError("method.static_paths is empty; allowed: a list of child-rank paths, e.g. [[0], [1], [0, 0]]")
    seen = set()
    for p, raw in zip(out, paths):
        if not p or min(p) < 0 or p in seen or list(p) != [r for r in raw]:
            raise ValueError(f"method.static_paths entry {list(raw)!r}; allowed: distinct non-empty lists "
                             "of ranks >= 0")
        seen.add(p)
    for p in out:
        need = [p[:-1]] if len(p) > 1 else []
        need += [p[:-1] + (p[-1] - 1,)] if p[-1] > 0 else []
        for q in need:
            if q not in seen:
                raise ValueError(f"method.static_paths has {list(p)} but not {list(q)}; allowed: every parent "
                                 "path and every lower-ranked sibling present")
    return out


@dataclass
class DraftTree:
    """One step's tree. Node 0 = root; ``q[node]`` = draft distribution its children were drawn from
    (``sample`` mode only); ``logq[j]`` = the draft's log-probability at T = 1 of node j's token given
    its parent (log softmax of the raw draft logits; top-k modes; 0 for the root)."""
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    slots: list[int]                 # drafter slot of each node (-1: never fed to the drafter)
    mode: str = "greedy"             # greedy | topk | sample
    q: dict = field(default_factory=dict)
    logq: list[float] = field(default_factory=list)
    topk_q: str = "onehot"           # TreeSpec.topk_q: how sampled verification sees a top-k child
    children: list[list[int]] = field(init=False)

    def __post_init__(self):
        self.children = [[] for _ in self.tokens]
        for j, p in enumerate(self.parents[1:], 1):
            self.children[p].append(j)

    @property
    def size(self) -> int:
        return len(self.tokens) - 1

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestors(self) -> torch.Tensor:
        """Bool [n, n]: entry (i, j) is True when j is i or an ancestor of i."""
        n = len(self.tokens)
        anc = torch.eye(n, dtype=torch.bool)
        for j in range(1, n):
            anc[j] |= anc[self.parents[j]]
        return anc

    def children_q(self, vocab: int, device) -> torch.Tensor:
        """Float [n - 1, V]: row j - 1 is the q node j is verified against given its earlier siblings (see
        tree.verify), every node of the tree at once. Top-k children: one-hot (they were not drawn: a point
        mass), or with ``topk_q = draft`` the same vector scaled by the child's draft probability at T = 1
        (floored at 1e-10 as the authors' code does), so the standard test is min(1, p / q(child)) and the
        residual lowers only the child's entry to max(0, p(child) - q(child)), their non-relaxed path.
        Sampled children: the parent's q with the earlier siblings' tokens zeroed, renormalised."""
        n = len(self.tokens)
        if n < 2:
            raise ValueError(f"children_q of a tree of {n} node(s); allowed: a tree with at least one draft")
        if self.mode != "sample":
            mass = (torch.ones(n - 1) if self.topk_q == "onehot"
                    else torch.tensor([max(math.exp(lq), 1e-10) for lq in self.logq[1:]]))
            index = (torch.arange(n - 1, device=device), torch.tensor(self.tokens[1:], device=device))
            return torch.zeros(n - 1, vocab, device=device).index_put(index, mass.to(device))
        q = torch.stack([self.q[par].to(device) for par in self.parents[1:]])   # drawn on the drafter's device
        rows, toks = [], []                       # (node j - 1, token of an earlier sibling of j)
        for kids in self.children:
            for i, c in enumerate(kids):
                rows += [c - 1] * i
                toks += [self.tokens[s] for s in kids[:i]]
        index = tuple(torch.tensor(x, dtype=torch.long, device=device) for x in (rows, toks))
        q = q.index_put(index, torch.zeros((), dtype=q.dtype, device=device))
        return q / q.sum(-1, keepdim=True)


# -- building ---------------------------------------------------------------------------------
class _Pool:
    """Every drafted node of one step (node 0 = root)."""

    def __init__(self, root_token: int, mode: str):
        self.tok, self.par, self.dep, self.score, self.logq = [root_token], [-1], [0], [0.0], [0.0]
        self.rank, self.slot, self.kids, self.q, self.mode = [0], [-1], [[]], {}, mode
        self.n_fed = 0

    def add_children(self, node, z, k, cfg, gen) -> list[int]:
        toks, logp, q = _pick(z, k, self.mode, cfg, gen)
        return self._add(node, toks, logp, q)

    def add_level(self, nodes: list[int], zs: torch.Tensor, k: int, cfg, gen) -> list[int]:
        """``add_children`` of every node of a level (``zs`` [n, V], one row per node), node by node."""
        return [c for row, i in enumerate(nodes) for c in self.add_children(i, zs[row], k, cfg, gen)]

    def _add(self, node, toks, logp, q) -> list[int]:
        if q is not None and toks:
            self.q[node] = q
        new = []
        for r, (t, lp) in enumerate(zip(toks, logp)):
            self.tok.append(t), self.par.append(node), self.dep.append(self.dep[node] + 1)
            self.score.append(self.score[node] + lp), self.logq.append(lp), self.rank.append(r), self.slot.append(-1)
            self.kids.append([]), self.kids[node].append(len(self.tok) - 1), new.append(len(self.tok) - 1)
        return new

    def feed(self, drafter, nodes: list[int]) -> torch.Tensor:
        z = drafter.expand([self.tok[i] for i in nodes], [self.slot[self.par[i]] for i in nodes])
        for i in nodes:
            self.slot[i], self.n_fed = self.n_fed, self.n_fed + 1
        return z

    def select(self, n: int) -> list[int]:
        """Best-first: a node is available once its parent and previous sibling are kept."""
        key = lambda i: (-self.score[i], self.dep[i], i)  # noqa: E731
        heap, keep = [key(c) for c in self.kids[0][:1]], []
        while heap and len(keep) < n:
            i = heapq.heappop(heap)[2]
            keep.append(i)
            nxt = self.kids[i][:1] + ([self.kids[self.par[i]][self.rank[i] + 1]]
                                      if self.rank[i] + 1 < len(self.kids[self.par[i]]) else [])
            for c in nxt:
                heapq.heappush(heap, key(c))
        return keep

    def tree(self, keep, topk_q: str = "onehot") -> DraftTree:
        order = [0] + sorted(keep, key=lambda i: (self.dep[i], i))
        new = {old: j for j, old in enumerate(order)}
        t = DraftTree([self.tok[i] for i in order], [new.get(self.par[i], -1) for i in order],
                      [self.dep[i] for i in order], [self.slot[i] for i in order], self.mode,
                      logq=[self.logq[i] for i in order], topk_q=topk_q)
        t.q = {new[i]: q for i, q in self.q.items() if i in new and t.children[new[i]]}
        return t


def _pick(z: torch.Tensor, k: int, mode: str, cfg, gen):
    """Children of one node from its draft logits row: (tokens, log-scores, q or None)."""
    if mode == "sample":
        # Sequential draws without replacement from q, all at once (Gumbel-top-k: the k largest q(x) / E_x,
        # E_x ~ Exp(1) i.i.d., in order, are k sequential draws without replacement; tokens with q = 0 have key
        # -1 and are dropped after the read). The score of the i-th draw must not depend on its own value
        # (whether it survives pruning would then bias it away from q_i): it is the EXPECTED draft probability
        # of the i-th draw given the earlier ones, log sum_x q_i(x) q(x), q_i: q without the earlier draws,
        # renormalised (its sums taken over what remains, not by subtraction, which cancels where one token
        # holds nearly all the mass). E = -log(1 - U), U ~ U[0, 1) in float64 (Exp(1) by inversion, as torch's
        # exponential_ draws it, at ~0.3x its CPU time over a 152k vocabulary: ~0.9 against ~3 ms a node; one
        # child is the same argmax, k = 1, in place of torch.multinomial's ~3.3 ms).
        q = sampling.warp(z, cfg.temperature, cfg.top_p)
        k = min(k, q.shape[-1])
        e = torch.rand(q.shape, generator=gen, dtype=torch.float64, device=q.device).neg_().log1p_().neg_()
        top = torch.topk(torch.where(q > 0, q / e.to(q.dtype), -1.0), k).indices   # q / e can underflow to 0
        if k == 1:
            out = torch.cat([top.to(q.dtype), torch.log((q * q).sum() / q.sum()).reshape(1), q[top]]).tolist()
            return ([int(out[0])], out[1:2], q) if out[2] > 0 else ([], [], q)
        rows, cols = torch.ones(k, k, dtype=torch.bool, device=q.device).tril(-1).nonzero(as_tuple=True)
        w = q.expand(k, -1).clone()                      # row i: q without the draws before the i-th
        w[rows, top[cols]] = 0.0
        scores = torch.log((w * q).sum(-1) / w.sum(-1))
        out = torch.cat([top.to(scores.dtype), scores, q[top]]).tolist()   # the one host read
        n = sum(x > 0 for x in out[2 * k:])              # draws with q > 0 come first (their keys are >= 0)
        toks, scores = [int(t) for t in out[:n]], out[k:k + n]
        return toks, scores, q
    k = min(k, int(torch.isfinite(z).sum()))     # padded-vocabulary drafts carry -inf columns
    top = torch.topk(z, k)
    return top.indices.tolist(), torch.log_softmax(z.float(), -1)[top.indices].tolist(), None


def build_tree(drafter, seq: list[int], spec: TreeSpec, max_depth: int, mode: str, cfg, gen) -> DraftTree:
    """Draft one step's tree below the root ``seq[-1]``, at most ``max_depth`` deep."""
    pool = _Pool(seq[-1], mode)
    levels = min(spec.max_depth, max_depth)
    z = drafter.root(seq) if levels >= 1 else None
    if z is None:
        return pool.tree([], spec.topk_q)
    if spec.static_paths is not None:
        return _static(pool, drafter, z, spec, levels, cfg, gen)
    if mode != "sample":
        return _dynamic_on_device(seq[-1], drafter, z, spec, levels, mode)
    frontier = pool.add_level([0], z[None], spec.top_k, cfg, gen)
    for _ in range(levels - 1):
        frontier = sorted(sorted(frontier, key=lambda i: (-pool.score[i], i))[: spec.top_k])
        if not frontier:
            break
        zs = pool.feed(drafter, frontier)
        frontier = pool.add_level(frontier, zs, spec.top_k, cfg, gen)
    return pool.tree(pool.select(spec.total_tokens - 1), spec.topk_q)


def _dynamic_on_device(root: int, drafter, z: torch.Tensor, spec: TreeSpec, levels: int, mode: str) -> DraftTree:
    """``build_tree`` for dynamic trees of top-k children (greedy or topk), built on the drafter's device and
    read to the host once. The same tree as ``_Pool``: scores are float64 sums of the children's T = 1
    log-probabilities; the frontier is the newest level's top_k by (-score, creation order), fed in creation
    order; the kept nodes are the plain top-(total_tokens - 1) by (-score, depth, creation order), which is the
    best-first selection for top-k children (scores never rise down a path or along siblings). Children of
    -inf logits (padded or reduced draft vocabularies) get score -inf: never kept, fed only where a level has
    fewer than top_k finite nodes (their slots unused)."""
    dev, k = z.device, min(spec.top_k, z.shape[-1])
    tok = [torch.tensor([root], device=dev)]
    par = [torch.tensor([-1], device=dev)]
    score = [torch.zeros(1, dtype=torch.float64, device=dev)]
    logq = [torch.zeros(1, dtype=torch.float64, device=dev)]
    depth, slot = [0], torch.full((1,), -1, dtype=torch.long, device=dev)
    parents, rows, size = torch.zeros(1, dtype=torch.long, device=dev), z[None], 1
    n_fed = 0
    for level in range(1, levels + 1):
        top = torch.topk(rows, k, dim=-1)
        lp = torch.log_softmax(rows.float(), -1).gather(-1, top.indices).double()
        base = score_all[parents][:, None] if level > 1 else torch.zeros_like(lp)
        sc = torch.where(torch.isfinite(top.values), base + lp, torch.full_like(lp, float("-inf")))
        n_new = sc.numel()
        tok.append(top.indices.reshape(-1))
        par.append(parents[:, None].expand(-1, k).reshape(-1))
        score.append(sc.reshape(-1))
        logq.append(lp.reshape(-1))
        depth += [level] * n_new
        slot = torch.cat([slot, torch.full((n_new,), -1, dtype=torch.long, device=dev)])
        score_all, tok_all, par_all = torch.cat(score), torch.cat(tok), torch.cat(par)
        if level == levels:
            break
        f = min(spec.top_k, n_new)
        newest = torch.arange(size, size + n_new, device=dev)
        pick = torch.sort(torch.sort(-score_all[newest], stable=True).indices[:f]).values
        frontier = newest[pick]
        rows = drafter.expand(tok_all[frontier], slot[par_all[frontier]])
        slot[frontier] = torch.arange(n_fed, n_fed + f, device=dev)
        n_fed, size, parents = n_fed + f, size + n_new, frontier
    n = len(depth)
    dep = torch.tensor(depth, device=dev)
    order = torch.sort(dep[1:], stable=True).indices
    order = order[torch.sort(-score_all[1:][order], stable=True).indices][: spec.total_tokens - 1] + 1
    kept = torch.sort(order).values
    pack = torch.stack([tok_all[kept].double(), par_all[kept].double(), slot[kept].double(), torch.cat(logq)[kept],
                        score_all[kept], kept.double()])
    toks, pars, slots, lqs, scs, ids = pack.tolist() if n > 1 else ([],) * 6      # the one host read
    live = [j for j, s in enumerate(scs) if s != float("-inf")]
    new = {0: 0, **{int(ids[j]): i + 1 for i, j in enumerate(live)}}
    return DraftTree([root] + [int(toks[j]) for j in live], [-1] + [new[int(pars[j])] for j in live],
                     [0] + [depth[int(ids[j])] for j in live], [-1] + [int(slots[j]) for j in live], mode,
                     logq=[0.0] + [lqs[j] for j in live], topk_q=spec.topk_q)


def _static(pool: _Pool, drafter, z, spec: TreeSpec, levels: int, cfg, gen) -> DraftTree:
    paths = [p for p in spec.static_paths if len(p) <= levels]
    n_kids: dict[tuple, int] = {}
    for p in paths:
        n_kids[p[:-1]] = max(n_kids.get(p[:-1], 0), p[-1] + 1)
    path_of, level, rows = {0: ()}, [0], [z]
    while level:
        new = []
        for node, row in zip(level, rows):
            for c in pool.add_children(node, row, n_kids.get(path_of[node], 0), cfg, gen):
                path_of[c] = path_of[node] + (pool.rank[c],)
                new.append(c)
        level = [c for c in new if path_of[c] in n_kids]
        rows = pool.feed(drafter, level) if level else []
    return pool.tree(list(range(1, len(pool.tok))), spec.topk_q)

