"""Draft trees: ``build`` (TreeSpec, DraftTree, EAGLE-2 dynamic and static trees), ``mask`` (the 4-D tree
attention mask and drafter slots), ``verify`` (greedy and sampled tree verification). The loop that
drives them is ``decode.engine`` with ``proposers.tree``."""
from mars_bench.decode.tree.build import DraftTree, TreeSpec, build_tree, check_paths  # noqa: F401
from mars_bench.decode.tree.mask import SlotTree, additive_mask  # noqa: F401
