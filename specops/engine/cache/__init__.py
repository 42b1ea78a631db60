"""specops KV caches (transformers ``Cache`` subclasses): :class:`KVCache` over a KV layout
(:class:`specops.ops.layout.KvLayout`), and its two constructors :class:`StaticKVCache` (one
contiguous [L, B, Hkv, S, D] buffer) and :class:`PagedKVCache` (a page pool and a page table), with
the same methods and semantics. ``KVCacheBase`` is :class:`KVCache`'s former name."""
from .base import KVCache, PagedKVCache, StaticKVCache

KVCacheBase = KVCache

__all__ = ["KVCache", "KVCacheBase", "PagedKVCache", "StaticKVCache"]
