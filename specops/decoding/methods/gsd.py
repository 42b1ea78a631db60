"""GSD (docs/methods.md §GSD): TSD's search (tsd.py) with ``tau`` set: tau-redundant children merged
(``TokenGraph``), the DAG unmerged into a tree for the target; R5 (not lossless) unless ``verify``."""
from .tsd import TSD


class GSD(TSD):
    name = "gsd"
    description = "graph SD: TSD with tau-redundant nodes merged into a DAG, unmerged for verification"
    PARAMS = dict(TSD.PARAMS, tau=2)
    sampling_mode = "gsd"
