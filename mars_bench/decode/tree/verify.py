"""Verifying a draft tree against one target forward: a rule (decode.rules.RULES) decides every node.

``z`` holds the target's RAW logits for every tree node (row 0 = root): row j predicts the children of
node j. A node's token is judged by the rule on its PARENT's row, exactly as a chain position is
judged on the row before it; the rule functions are called unchanged (batched over nodes).

Greedy (temperature 0), ``verify_greedy``:
  node j is accepted when the rule accepts tokens[j] on z[parent(j)] (exact: the argmax; mars: also
  the top-2 when r = z2/z1 > theta) and its parent is accepted (the root always is). Among accepted
  nodes take the deepest; ties -> fewer relaxed acceptances on the path -> the lexicographically
  smallest path of node indices (BFS order, i.e. the draft's preferred branch). Then emit
  argmax z[end] (bonus after a leaf, correction otherwise). With ``exact`` at most one child of a node
  can be accepted (siblings are distinct), the path is unique and the output is the target's greedy
  continuation: lossless.

Sampled (temperature > 0), ``verify_sampled``: multi-draft recursive rejection sampling
(SpecInfer, Miao et al. 2024; EAGLE; recursive speculative decoding, Jeon et al. 2024). From the root:
    p <- p_target(node) = warp(z[node], T, top_p)
    for the node's children c_1..c_m in their draw / rank order:
        q_i <- the distribution c_i was drawn from GIVEN the earlier siblings (below)
        u ~ U[0, 1);  verdict = rule(c_i, z[node], p, q_i, u)   # exact: accept iff u q_i(c_i) < p(c_i)
        accepted -> commit c_i, move to c_i, start over there
        rejected -> p <- norm(max(0, p - q_i))                      # sampling.residual
    no child accepted (or a leaf) -> commit one token drawn from p and stop.
  q_i by how the children were chosen (tree.TreeSpec.children):
    topk   children = top-k of the draft logits: a deterministic function of the prefix, i.e. a
           point-mass draft, q_i = one-hot(c_i) (upstream EAGLE's q = 1). Then the test accepts c_i
           with probability p(c_i) and the residual is p with c_i removed, renormalised; by induction
           P(commit x) = p_target(x) whatever the set of children.
    topk with ``topk_q = draft`` (TreeSpec): the MARS authors' non-relaxed path (evaluate_posterior in
           their model/utils.py, q from topK_genrate in model/cnets.py): q_i = q_draft(c_i) e_{c_i}, where
           q_draft(c_i) = softmax(raw draft logits)[c_i] at T = 1 whatever the decoding temperature.
           The test accepts c_i with probability min(1, p(c_i) / q_draft(c_i)); after a rejection only
           c_i's entry changes, p(c_i) <- max(0, p(c_i) - q_draft(c_i)), then p is renormalised:
               theirs: gtp[x] = max(0, px - qx); gtp = gtp / gtp.sum()
               ours:   p <- norm(max(0, p - q_i))   (the same vector, as q_i is zero off c_i)
           Children are tried in draft-rank order, as their sorted retrieve_indices do. NOT lossless:
           min(1, p / q_draft) >= p, so every child is accepted at least as often as by the lossless
           test (tau rises), and the committed law leans towards the draft's top-k.
    sample children drawn sequentially without replacement from q; q_i = q with c_1..c_{i-1} zeroed,
           renormalised, which is exactly the law of c_i given the earlier draws, independent of the
           coins of earlier tests. Each test is the standard lemma (x ~ q_i, accept w.p.
           min(1, p/q_i), else the residual law) so the committed token follows the current p, and by
           induction over siblings follows p_target. Pruning keeps, per node, a prefix of the draw
           order decided without looking at the pruned draws' values (tree._pick).
  Levels: a child's subtree was drafted from the draft conditioned on that child only, so the same
  argument applies at every depth given the accepted prefix. ``exact`` is lossless; ``mars`` applies
  its margin clause per node (top-1 accepted outright, top-2 when r > theta), as in the chain.
  The authors' MARS tree path is mars with ``topk_q = draft``, sampled_top1 = margin, nonpositive_top1
  = ratio and outside_top2 = skip: where r > theta their code gives a child outside the top-2 no test
  (it is skipped and p is left as it was); with outside_top2 = test (the default) it gets the standard
  test and, on rejection, the residual.
  One host read for the whole walk (``_test_all``): what happens at a node (its tests in rank order, the
  residual they leave, the token drawn if none is accepted) depends only on z[node], its children with
  their q_i, and the node's own uniforms and draw, never on how the walk got there. So every node's
  recursion runs at once on the device (for a leaf: the draw from p_target), each with fresh
  randomness independent of every other node's, and the host reads the outcome once and walks from the
  root: at each node the first accepted child, else that node's drawn token. Which nodes the walk visits
  depends only on the draws of the nodes above them, so given the walk reaches a node, that node's
  draws are still fresh and independent, and the committed path and token follow the sequential law
  above; the draws of nodes it never visits go unused.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mars_bench.decode import sampling
from mars_bench.decode.rules.base import PathVerdict, top2
from mars_bench.decode.tree.build import DraftTree


@dataclass
class TreeVerdict(PathVerdict):
    path: list[int] = field(default_factory=list)   # accepted nodes, depth 1..m (root excluded)
    rejected_end: bool = False   # the path's end node had children and every one was rejected


def verify_greedy(rule, tree: DraftTree, z: torch.Tensor, **rule_kwargs) -> TreeVerdict:
    """One host read: the rule's verdict on every node, and every row's argmax and top-2 (audit), packed."""
    n = len(tree.tokens)
    ok, n_rel = [True] + [False] * (n - 1), [0] * n
    dev = z.device
    z1, z2, t1, t2 = top2(z)
    parts = [t1.double(), z1.double(), z2.double(), t2.double()]
    if n > 1:
        par = torch.tensor(tree.parents[1:], device=dev)
        v = rule(torch.tensor(tree.tokens[1:], device=dev), z[par], None, None, None, **rule_kwargs)
        parts += [v.accept.double(), v.clause.double()]
    host = torch.cat(parts).tolist()
    rows = {name: host[i * n:(i + 1) * n] for i, name in enumerate(("t1", "z1", "z2", "t2"))}
    acc = [False] + [bool(a) for a in host[4 * n:5 * n - 1]] if n > 1 else [False]
    cl = [0] + [int(c) for c in host[5 * n - 1:6 * n - 2]] if n > 1 else [0]
    for j in range(1, n):
        p = tree.parents[j]
        if ok[p] and acc[j]:
            ok[j], n_rel[j] = True, n_rel[p] + int(cl[j] > 0)
    best = min((j for j in range(n) if ok[j]),
               key=lambda j: (-tree.depths[j], n_rel[j], tree.path_to(j)))
    path = tree.path_to(best)
    return _verdict(rule, tree, z, path, [_name(rule, cl[j]) for j in path], int(rows["t1"][best]), rows)


def verify_sampled(rule, tree: DraftTree, z: torch.Tensor, temperature: float, top_p: float,
                   gen: torch.Generator, **rule_kwargs) -> TreeVerdict:
    """One host read: every node's tests and fallback draw (``_test_all``) and every row's top-2 (audit), packed;
    then the walk from the root on the host."""
    n = len(tree.tokens)
    accept, clause, drawn = _test_all(rule, tree, z, temperature, top_p, gen, rule_kwargs)
    host = torch.cat([accept.double(), clause.double(), drawn.double(), *(t.double() for t in top2(z))]).tolist()
    acc, cl, token = host[:n], host[n:2 * n], host[2 * n:3 * n]
    tops = {name: host[(3 + i) * n:(4 + i) * n] for i, name in enumerate(("z1", "z2", "t1", "t2"))}
    node, path, names = 0, [], []
    while True:
        nxt = next((c for c in tree.children[node] if acc[c]), None)    # the first accepted child
        if nxt is None:
            return _verdict(rule, tree, z, path, names, int(token[node]), tops)
        path.append(nxt)
        names.append(_name(rule, int(cl[nxt])))
        node = nxt


def _test_all(rule, tree: DraftTree, z: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator,
              rule_kwargs: dict):
    """The recursion above at every node at once, on the device: rank by rank, the i-th child of every node
    that has one is tested against the residual its earlier siblings left (one uniform per child, drawn
    together), then every node draws from its final residual (a leaf: from p_target). A test after an
    acceptance is computed and ignored by the walk, and so is a node's draw once a child is accepted.
    Returns per node (entry 0, the root, unused) the rule's verdict and clause, and per node the drawn token."""
    dev, n = z.device, len(tree.tokens)
    p_target = sampling.warp(z, temperature, top_p)
    p = p_target.clone()                                  # row r: node r's residual so far
    accept = torch.zeros(n, dtype=torch.bool, device=dev)
    clause = torch.zeros(n, dtype=torch.long, device=dev)
    u = torch.rand(2 * n - 1, generator=gen, device=dev)  # node j's test: u[j - 1]; node r's draw: u[n - 1 + r]
    if n > 1:
        q = tree.children_q(z.shape[-1], dev)             # node j's: q[j - 1]
        tokens = torch.tensor(tree.tokens, device=dev)
        for i in range(max(len(kids) for kids in tree.children)):
            rows = [r for r, kids in enumerate(tree.children) if len(kids) > i]
            at, kid = (torch.tensor(x, device=dev) for x in (rows, [tree.children[r][i] for r in rows]))
            q_i, p_at = q[kid - 1], p[at]
            v = rule(tokens[kid], z[at], p_target[at], q_i, u[kid - 1], p_standard=p_at,
                     **rule_kwargs)                       # the standard test on the residual, clauses on p_target
            accept.index_copy_(0, kid, v.accept)
            clause.index_copy_(0, kid, v.clause)
            if rule.correction == "residual":             # skipped: untested, p stays
                p.index_copy_(0, at, torch.where(v.skipped[:, None], p_at, sampling.residual(p_at, q_i)))
    return accept, clause, sampling.sample_rows(p, u[n - 1:])


def _name(rule, c: int):
    return rule.clauses[c - 1] if c else None


def _verdict(rule, tree: DraftTree, z: torch.Tensor, path: list[int], clause: list, nxt: int,
             tops: dict | None = None) -> TreeVerdict:
    """``tops``: every row's top-2 already on the host (``verify_greedy``), else read here for the path's rows."""
    end = path[-1] if path else 0
    rejected_end = bool(tree.children[end])
    rows = [tree.parents[j] for j in path] + ([end] if rejected_end else [])
    if tops is not None:
        z1, z2 = [tops["z1"][r] for r in rows], [tops["z2"][r] for r in rows]
        t1, t2 = [int(tops["t1"][r]) for r in rows], [int(tops["t2"][r]) for r in rows]
    elif rows:
        z1, z2, t1, t2 = (x.tolist() for x in top2(z[torch.tensor(rows, device=z.device)]))
    else:
        z1 = z2 = t1 = t2 = []
    return TreeVerdict(nxt, clause, z1, z2, t1, t2, rule.name, path=path, rejected_end=rejected_end)
