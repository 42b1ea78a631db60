"""specops KV caches: :class:`KVCache` over a :class:`specops.ops.layout.KvLayout`, allocated by
:class:`StaticKVCache` or :class:`PagedKVCache` (see :mod:`.base`). ``KVCacheBase``: its former name."""
from .base import KVCache, PagedKVCache, StaticKVCache

KVCacheBase = KVCache

__all__ = ["KVCache", "KVCacheBase", "PagedKVCache", "StaticKVCache"]
