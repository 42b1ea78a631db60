"""The methods, one file each, and their registry: name -> Drafter class. A new method is a Drafter
subclass listed in ``_CLASSES`` (specops/decoding/README.md, "Adding a method"); its ``name`` is the
registry key and the CLI's choice, its ``description`` the CLI's help line."""
from .ar import AR
from .base import LOSSLESS_SAMPLING_MODES, MODES, Drafter, ModelDrafter
from .gsd import GSD
from .mjsd import MJSD
from .ngram import NGram
from .opt_tree import OPTTree, OptTreeDrafter
from .ouroboros import Ouroboros
from .sd import SD
from .specinfer import SpecInfer
from .tsd import TSD

_CLASSES = (AR, SD, SpecInfer, TSD, GSD, OPTTree, Ouroboros, MJSD, NGram)  # the CLI's order
# The classes' names before issue #32 (public names: kept; OptTreeDrafter in opt_tree.py, which bench/ imports).
NullDrafter, ChainDrafter, MultiDraftDrafter, TopKTreeDrafter, GraphDrafter = AR, SD, SpecInfer, TSD, GSD
OuroborosDrafter, BeamDrafter, NgramDrafter = Ouroboros, MJSD, NGram
METHODS = {cls.name: cls for cls in _CLASSES}  # the registry and the CLI's choices: nothing listed twice
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
