"""The KV caches' public name (README: ``specops.cache.StaticKVCache`` / ``PagedKVCache``), kept as an
alias: they live in the engine, :mod:`specops.engine.cache`."""
from ..engine.cache import KVCache, KVCacheBase, PagedKVCache, StaticKVCache

__all__ = ["KVCache", "KVCacheBase", "PagedKVCache", "StaticKVCache"]
