"""The KV caches' public name (README: ``specops.cache.StaticKVCache``): :mod:`specops.engine.cache`."""
from ..engine.cache import KVCache, KVCacheBase, PagedKVCache, StaticKVCache

__all__ = ["KVCache", "KVCacheBase", "PagedKVCache", "StaticKVCache"]
