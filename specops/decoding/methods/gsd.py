"""GSD (docs/methods.md §GSD): TSD's search (tsd.py) with ``tau`` set, so tau-redundant children are
merged (``TokenGraph``) and the DAG is unmerged into a tree of at most ``max_tree_nodes`` nodes for
the target. Sampling: ``gsd`` (R5, the reference rule, not lossless) by default, a lossless rule via
``verify``.
"""
from .tsd import TSD


class GSD(TSD):
    name = "gsd"
    description = "graph SD: TSD with tau-redundant nodes merged into a DAG, unmerged for verification"
    PARAMS = dict(TSD.PARAMS, tau=2)
    sampling_mode = "gsd"
