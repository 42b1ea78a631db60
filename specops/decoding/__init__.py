"""The reference decoding loop: every method as a Drafter on one loop (docs/methods.md §The decoding loop).

``generate`` is the entry point; ``METHODS`` maps method names to Drafter classes.
"""
from .adaptive import AdaptiveConfig
from .api import generate
from .drafters.base import Drafter, ModelDrafter, NullDrafter
from .drafters.mjsd import BeamDrafter
from .drafters.sd import ChainDrafter
from .drafters.specinfer import MultiDraftDrafter
from .drafters.ngram import NgramDrafter
from .drafters.opt_tree import OptTreeDrafter
from .drafters.ouroboros import OuroborosDrafter
from .drafters.topk_tree import GraphDrafter, TopKTreeDrafter
from .metrics import Metrics
from .methods import DESCRIPTIONS, METHODS
from .phrase_pool import PhrasePool
from .sampling import SamplingConfig
from .token_graph import TokenGraph
from .tree import Candidates, Draft

__all__ = [
    "AdaptiveConfig", "BeamDrafter", "Candidates", "ChainDrafter", "DESCRIPTIONS", "Draft", "Drafter", "GraphDrafter", "METHODS",
    "Metrics", "ModelDrafter", "MultiDraftDrafter", "NgramDrafter", "NullDrafter", "OptTreeDrafter",
    "OuroborosDrafter", "PhrasePool", "SamplingConfig", "TokenGraph", "TopKTreeDrafter", "generate",
]
