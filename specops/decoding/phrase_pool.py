"""Ouroboros' phrase pool (docs/methods.md §Ouroboros, Pool): key token -> the newest ``capacity``
continuations of ``length`` tokens, least recently inserted evicted first; it may persist across
prompts (phrases from history contexts)."""
import collections
import itertools


class PhrasePool:
    def __init__(self, length, capacity):
        if length < 1 or capacity < 1:
            raise ValueError(f"phrase length and capacity must be >= 1, got {length}, {capacity}")
        self.length, self.capacity = length, capacity
        self._by_key = {}

    def __len__(self):
        return sum(len(v) for v in self._by_key.values())

    def insert(self, key, phrase):
        phrase = tuple(phrase)
        if len(phrase) != self.length:
            return
        slot = self._by_key.setdefault(key, collections.OrderedDict())
        slot[phrase] = None
        slot.move_to_end(phrase)  # a re-inserted phrase becomes the newest
        while len(slot) > self.capacity:
            slot.popitem(last=False)

    def replace(self, key, old, new):
        """Swaps a phrase for its corrected version (kept at the old one's age if absent)."""
        self._by_key.get(key, {}).pop(tuple(old), None)
        self.insert(key, new)

    def get(self, key, k):
        """Up to ``k`` phrases for ``key``, newest first."""
        slot = self._by_key.get(key)
        return [list(p) for p in itertools.islice(reversed(slot), max(k, 0))] if slot else []

    def add_ngrams(self, tokens, start=0):
        """Inserts every (key, continuation) n-gram of ``tokens`` that ends at or after ``start``."""
        n = self.length + 1
        for end in range(max(n, start + 1), len(tokens) + 1):
            self.insert(tokens[end - n], tokens[end - n + 1:end])


_SHARED = {}


def shared_pool(identity, length, capacity):
    """One pool per (model identity, phrase length): phrases carry over between generate calls."""
    key = (identity, length)
    pool = _SHARED.get(key)
    if pool is None or pool.capacity != capacity:
        pool = _SHARED[key] = PhrasePool(length, capacity)
    return pool
