"""Draft trees: ``build`` (TreeSpec, DraftTree, EAGLE-2 dynamic and static trees), ``mask`` (the 4-D tree
attention mask), ``verify`` (greedy and sampled tree verification), ``loop`` (the tree decoding loop:
``from mars_bench.decode.tree.loop import generate_tree``; not imported here, so drafters can use
``mask`` without importing the loop)."""
from .build import DraftTree, TreeSpec, build_tree, check_paths  # noqa: F401
from .mask import SlotTree, additive_mask  # noqa: F401
