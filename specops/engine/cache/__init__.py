"""specops KV caches (transformers ``Cache`` subclasses): :class:`StaticKVCache` (one contiguous
[L, B, Hkv, S, D] buffer) and :class:`PagedKVCache` (a page pool and a page table), with the same
methods and semantics (:class:`~specops.engine.cache.base.KVCacheBase`)."""
from .base import KVCacheBase
from .paged import PagedKVCache
from .static import StaticKVCache

__all__ = ["KVCacheBase", "PagedKVCache", "StaticKVCache"]
