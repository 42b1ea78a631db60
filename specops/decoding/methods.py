"""The method registry: name -> Drafter class. Adding a method = adding its Drafter class here."""
from .drafters.base import NullDrafter
from .drafters.mjsd import BeamDrafter
from .drafters.sd import ChainDrafter
from .drafters.specinfer import MultiDraftDrafter
from .drafters.ngram import NgramDrafter
from .drafters.opt_tree import OptTreeDrafter
from .drafters.ouroboros import OuroborosDrafter
from .drafters.topk_tree import GraphDrafter, TopKTreeDrafter

# The registry and the CLI's choices come from the classes' own names (order: the CLI's).
METHODS = {cls.name: cls for cls in (NullDrafter, ChainDrafter, MultiDraftDrafter, TopKTreeDrafter, GraphDrafter,
                                     OptTreeDrafter, OuroborosDrafter, BeamDrafter, NgramDrafter)}
DESCRIPTIONS = {name: cls.description for name, cls in METHODS.items()}


def get(name):
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"unknown method {name!r}; expected one of: {', '.join(METHODS)}")
    return METHODS[name]


def make(name, **params):
    return get(name)(**params)
