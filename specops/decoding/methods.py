"""The method registry: name -> Drafter class. Adding a method = adding a Drafter here."""
from .drafters.base import NullDrafter
from .drafters.mjsd import BeamDrafter
from .drafters.sd import ChainDrafter
from .drafters.specinfer import MultiDraftDrafter
from .drafters.ngram import NgramDrafter
from .drafters.opt_tree import OptTreeDrafter
from .drafters.ouroboros import OuroborosDrafter
from .drafters.topk_tree import GraphDrafter, TopKTreeDrafter

METHODS = {
    "ar": NullDrafter,
    "sd": ChainDrafter,
    "specinfer": MultiDraftDrafter,
    "tsd": TopKTreeDrafter,
    "gsd": GraphDrafter,
    "opt-tree": OptTreeDrafter,
    "ouroboros": OuroborosDrafter,
    "mjsd": BeamDrafter,
    "ngram": NgramDrafter,
}

DESCRIPTIONS = {
    "ar": "autoregressive decoding (the baseline, same loop)",
    "sd": "speculative decoding, a chain of gamma draft tokens (Leviathan/Chen)",
    "specinfer": "SpecInfer: several draft chains (i.i.d. samples) merged into a token tree",
    "tsd": "tree SD: top-k tree with probability and sibling pruning",
    "gsd": "graph SD: TSD with tau-redundant nodes merged into a DAG, unmerged for verification",
    "opt-tree": "OPT-Tree: per-layer global top-n by path probability, best-n subtree",
    "ouroboros": "Ouroboros: lookahead-accelerated draft + phrase pool + K phrase branches",
    "mjsd": "multi-token joint SD: beam-search draft, joint-likelihood acceptance (approximate)",
    "ngram": "prompt lookup / n-gram draft (model-free)",
}


def get(name):
    if not isinstance(name, str) or name not in METHODS:
        raise ValueError(f"unknown method {name!r}; expected one of: {', '.join(METHODS)}")
    return METHODS[name]


def make(name, **params):
    return get(name)(**params)
