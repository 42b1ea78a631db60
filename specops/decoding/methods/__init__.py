"""The methods, one file each, and their registry: name -> Drafter class.

Adding a method = a Drafter subclass in its own file here, listed in ``_CLASSES``; its ``name`` is
the registry key and the CLI's choice, its ``description`` the CLI's help line.
"""
from .ar import AR, NullDrafter
from .base import LOSSLESS_SAMPLING_MODES, MODES, Drafter, ModelDrafter
from .gsd import GSD, GraphDrafter
from .mjsd import MJSD, BeamDrafter
from .ngram import NGram, NgramDrafter
from .opt_tree import OPTTree, OptTreeDrafter
from .ouroboros import Ouroboros, OuroborosDrafter
from .sd import SD, ChainDrafter
from .specinfer import MultiDraftDrafter, SpecInfer
from .tsd import TSD, TopKTreeDrafter

_CLASSES = (AR, SD, SpecInfer, TSD, GSD, OPTTree, Ouroboros, MJSD, NGram)  # the CLI's order
# The registry and the CLI's choices come from the classes' own names (nothing listed twice).
METHODS = {cls.name: cls for cls in _CLASSES}
DESCRIPTIONS = {name: cls.description for name, cls in METHODS.items()}


def get(name):
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"unknown method {name!r}; expected one of: {', '.join(METHODS)}")
    return METHODS[name]


def make(name, **params):
    return get(name)(**params)


__all__ = [
    "AR", "DESCRIPTIONS", "GSD", "LOSSLESS_SAMPLING_MODES", "METHODS", "MJSD", "MODES", "SD", "TSD", "BeamDrafter",
    "ChainDrafter", "Drafter", "GraphDrafter", "ModelDrafter", "MultiDraftDrafter", "NGram", "NgramDrafter",
    "NullDrafter", "OPTTree", "OptTreeDrafter", "Ouroboros", "OuroborosDrafter", "SpecInfer", "TopKTreeDrafter",
    "get", "make",
]
