"""The reference decoding loop: every method as a Drafter on one loop (docs/methods.md §The decoding loop).

``generate`` is the entry point; ``METHODS`` maps method names to Drafter classes (one file per method
in ``methods/``), named for their methods; former names (``ChainDrafter`` = ``SD``, ...) are aliases.
"""
from .adaptive import AdaptiveConfig
from .api import generate
from .methods import (AR, GSD, METHODS, MJSD, SD, TSD, DESCRIPTIONS, BeamDrafter, ChainDrafter, Drafter,
                      GraphDrafter, ModelDrafter, MultiDraftDrafter, NGram, NgramDrafter, NullDrafter, OPTTree,
                      OptTreeDrafter, Ouroboros, OuroborosDrafter, SpecInfer, TopKTreeDrafter)
from .metrics import Metrics
from .phrase_pool import PhrasePool
from .sampling import SamplingConfig
from .token_graph import TokenGraph
from .tree import Candidates, Draft

__all__ = [
    "AR", "AdaptiveConfig", "BeamDrafter", "Candidates", "ChainDrafter", "DESCRIPTIONS", "Draft", "Drafter", "GSD",
    "GraphDrafter", "METHODS", "MJSD", "Metrics", "ModelDrafter", "MultiDraftDrafter", "NGram", "NgramDrafter",
    "NullDrafter", "OPTTree", "OptTreeDrafter", "Ouroboros", "OuroborosDrafter", "PhrasePool", "SD",
    "SamplingConfig", "SpecInfer", "TSD", "TokenGraph", "TopKTreeDrafter", "generate",
]
