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
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import sampling
from ..rules.base import PathVerdict, top2
from .build import DraftTree


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
    """One host read per node of the walk (``_test_children``), the root's carrying every row's top-2 (audit)."""
    node, path, clause, tops = 0, [], [], None
    while True:
        nxt, name, token, node_tops = _test_children(rule, tree, z, node, temperature, top_p, gen, rule_kwargs,
                                                     with_tops=tops is None)
        tops = tops or node_tops
        if nxt is None:
            return _verdict(rule, tree, z, path, clause, token, tops)
        path.append(nxt)
        clause.append(name)
        node = nxt


def _test_children(rule, tree: DraftTree, z: torch.Tensor, node: int, temperature: float, top_p: float,
                   gen: torch.Generator, rule_kwargs: dict, with_tops: bool):
    """The recursion above at one node, on the device: every child tested in rank order against the residual
    left by the earlier ones (one uniform each, drawn together), and the token to commit if none is accepted
    drawn from the final residual. A test after an acceptance is computed and ignored (it cannot change the
    first accepted child, and p only matters when every child was rejected), so the law is the sequential one.
    Returns (first accepted child or None, its clause, the drawn token, every row's top-2 or None)."""
    dev, kids = z.device, tree.children[node]
    p = p_node = sampling.warp(z[node], temperature, top_p)
    u = torch.rand(len(kids), generator=gen, device=dev)
    accept, clauses = [], []
    for i, c in enumerate(kids):
        q = tree.child_q(node, i, z.shape[-1], dev)
        v = rule(torch.tensor([tree.tokens[c]], device=dev), z[node][None], p_node[None], q[None], u[i:i + 1],
                 p_standard=p[None], **rule_kwargs)   # the standard test on the residual, clauses on p_target
        accept.append(v.accept[0])
        clauses.append(v.clause[0])
        if rule.correction == "residual":                 # skipped: untested, p stays
            p = torch.where(v.skipped[0], p, sampling.residual(p, q))
    parts = [torch.stack(accept).double(), torch.stack(clauses).double()] if kids else []
    parts.append(sampling.sample(p, gen).double().reshape(1))
    if with_tops:
        parts += [t.double() for t in top2(z)]
    host = torch.cat(parts).tolist()                      # the one host read
    m = len(kids)
    first = next((i for i in range(m) if host[i]), None)
    tops = None
    if with_tops:
        n = len(tree.tokens)
        rows = host[2 * m + 1:]
        tops = {name: rows[i * n:(i + 1) * n] for i, name in enumerate(("z1", "z2", "t1", "t2"))}
    if first is None:
        return None, None, int(host[2 * m]), tops
    return kids[first], _name(rule, int(host[m + first])), int(host[2 * m]), tops


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
