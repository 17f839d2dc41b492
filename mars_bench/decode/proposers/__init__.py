"""Proposers: how drafts are made. One interface (``base.Proposer``), one module per way of drafting:

  chain.py          a small LM drafts a chain of k tokens, batched over rows (``sd``; adaptive length)
  tree.py           a drafter (small LM or EAGLE-3 head) drafts a tree per row (``sd_tree``, ``eagle3``)
  lookup.py         prompt lookup: an n-gram match in prompt + output, no model (``lookup``)
  prompt_lookup.py  the n-gram matcher itself (pure functions)
Each is a class with ``make(method, drafter, cfg, tree)``; ``decode.drafting`` declares which scheme uses which,
and ``factory.make_proposer`` builds it for a ``Method`` (``ar`` has none).
"""
