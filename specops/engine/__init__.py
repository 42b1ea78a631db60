"""The engine room: one model and its KV state, driven by device tensors.

:class:`ModelRunner` owns a Hugging Face causal LM, its KV cache (contiguous or paged,
:mod:`specops.engine.cache`) and, with ``compile=True``, its compiled block forwards
(:mod:`specops.engine.compiled`); :mod:`specops.engine.attention` is the ``"specops"`` attention
implementation the model runs with. The engine imports ``specops.ops`` (and the model-level
helpers ``specops.models``, ``specops.draft_models``, ``specops.parallel``), never
``specops.decoding``, which drives it.
"""
from .cache import KVCache, KVCacheBase, PagedKVCache, StaticKVCache
from .runner import KV_LAYOUTS, ModelRunner, Stager, pad_batch

__all__ = ["KV_LAYOUTS", "KVCache", "KVCacheBase", "ModelRunner", "PagedKVCache", "Stager", "StaticKVCache",
           "pad_batch"]
