"""The engine room: one model and its KV state, driven by device tensors (README's layout table).
It imports ``specops.ops`` (and ``specops.models``, ``specops.draft_models``, ``specops.parallel``),
never ``specops.decoding``, which drives it."""
from .cache import KVCache, KVCacheBase, PagedKVCache, StaticKVCache
from .runner import KV_LAYOUTS, ModelRunner, Stager, pad_batch

__all__ = ["KV_LAYOUTS", "KVCache", "KVCacheBase", "ModelRunner", "PagedKVCache", "Stager", "StaticKVCache",
           "pad_batch"]
