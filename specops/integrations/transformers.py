"""The Hugging Face integration's public names (README), kept as aliases: the ``"specops"``
attention implementation lives in :mod:`specops.engine.attention` (importing either module
registers it) and the runner, formerly ``SpecModel``, is :class:`specops.engine.ModelRunner`."""
from ..engine.attention import NAME, causal_mask, specops_attention, use_specops_attention
from ..engine.runner import KV_LAYOUTS, ModelRunner

SpecModel = ModelRunner

__all__ = ["KV_LAYOUTS", "NAME", "ModelRunner", "SpecModel", "causal_mask", "specops_attention",
           "use_specops_attention"]
