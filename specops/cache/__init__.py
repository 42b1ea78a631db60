"""The KV caches' public name (README: ``specops.cache.StaticKVCache`` / ``PagedKVCache``), kept as an
alias: they live in the engine, :mod:`specops.engine.cache`."""
from ..engine.cache import KVCacheBase, PagedKVCache, StaticKVCache

__all__ = ["KVCacheBase", "PagedKVCache", "StaticKVCache"]
