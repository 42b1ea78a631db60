"""GSD (docs/methods.md §GSD): TSD's search (tsd.py) with ``tau`` set: tau-redundant children are
merged into the first occurrence (``TokenGraph``) and the DAG is unmerged into a tree of at most
``max_tree_nodes`` nodes for the target. Greedy verification on it is exact, so greedy GSD stays
token-identical to greedy decoding; the approximation is on the draft side (copies reuse the first
occurrence's successors and draft distribution) and in the sampling rule: ``gsd`` (R5, the
reference rule, not lossless) by default, any lossless mode via ``verify="mss_pointmass"`` /
``"sample_match"``. A copy's draft K/V belong to another context, so the draft cache keeps the
accepted path only up to the first copied node (the rest is re-fed as catch-up).
"""
from .tsd import TSD


class GSD(TSD):
    name = "gsd"
    description = "graph SD: TSD with tau-redundant nodes merged into a DAG, unmerged for verification"
    PARAMS = dict(TSD.PARAMS, tau=2)
    sampling_mode = "gsd"


GraphDrafter = GSD  # the class's name before issue #32 (a public name: kept)
