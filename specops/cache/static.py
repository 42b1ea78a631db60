"""StaticKVCache: one preallocated K/V buffer for all layers, per-sequence lengths, in-place
compaction after acceptance — and a transformers ``Cache``, so a stock HF model writes into it.

Layout: ``k``, ``v`` [L, B, Hkv, S, D]; ``k[l]`` is the per-layer [B, Hkv, S, D] view that
``tree_attention`` reads and HF's attention receives. ``lens`` int32 [B] counts the committed rows
of every sequence. A forward appends its T new rows at ``lens[b] + offset`` (``offset`` = rows of
the current draft block already written); they stay uncommitted until ``compact`` (keep the
accepted path) or ``commit`` (keep all).

Two ways to drive it:
- the specops runner (:class:`specops.integrations.transformers.SpecModel`) opens a block
  (``begin_block``), runs the model, then compacts: lengths may be ragged across the batch;
- a plain HF forward with ``past_key_values=cache`` and no block open appends and commits like
  ``DynamicCache`` (lengths then stay equal across the batch).
"""
import numbers

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .ops import _checks
from .ops.kv_compact import CACHE_DTYPES, kv_compact


class _Layer(CacheLayerMixin):
    """One layer's face of the shared buffer, for code that walks ``cache.layers``."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner, index):
        super().__init__()
        self.owner, self.index = owner, index
        self.keys, self.values = owner.k[index], owner.v[index]
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        return None

    def update(self, key_states, value_states, *args, **kwargs):
        return self.owner.append_block(self.index, key_states, value_states)

    def get_mask_sizes(self, query_length):
        return self.owner.max_len, 0

    def get_seq_length(self):
        return self.owner.seq_length()

    def get_max_length(self):
        return self.owner.max_len


class StaticKVCache(Cache):
    """Preallocated K/V for ``num_layers`` layers of ``batch_size`` sequences of ``max_len`` rows.

    Shape: k, v [L, B, Hkv, S, D]; lens int32 [B].

    Every method validates its arguments before it writes anything: a rejected call leaves
    ``k``, ``v`` and ``lens`` bit-identical. ``dtype`` is fp32, fp16 or bf16 (what
    ``kv_compact`` moves)."""

    def __init__(self, num_layers, batch_size, num_kv_heads, max_len, head_dim, *, dtype=torch.float32,
                 device="cpu"):
        names = ("num_layers", "batch_size", "num_kv_heads", "max_len", "head_dim")
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        for name, size in zip(names, shape):
            if isinstance(size, bool) or not isinstance(size, numbers.Integral):
                raise TypeError(f"StaticKVCache {name} must be an int, got {type(size).__name__} {size!r}")
        if min(shape) < 1:
            raise ValueError(f"StaticKVCache sizes must be >= 1, got [L, B, Hkv, S, D] = {list(shape)}")
        if dtype not in CACHE_DTYPES:
            want = " or ".join(str(d) for d in CACHE_DTYPES)
            raise TypeError(f"StaticKVCache dtype must be {want}, got {dtype!r}")
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.lens = torch.zeros(batch_size, dtype=torch.int32, device=device)
        self._host_lens = [0] * batch_size  # mirror of lens for overflow checks; None when stale
        self._block = None  # (offset, T) of the draft block being written, or None in plain mode
        # Where the current forward's rows go, planned once per forward (not per layer): ("slice",
        # start, T) when every sequence writes at the same row, else ("scatter", index [B, Hkv, T, D], T).
        self._write = None
        super().__init__(layers=[_Layer(self, i) for i in range(num_layers)])

    @classmethod
    def for_model(cls, model, batch_size, max_len, *, dtype=None, device=None):
        """Sized from an HF model's config (text config for multimodal wrappers)."""
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        param = next(model.parameters())
        return cls(cfg.num_hidden_layers, batch_size, kv_heads, max_len, head_dim,
                   dtype=dtype or param.dtype, device=device or param.device)

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def batch_size(self):
        return self.k.shape[1]

    def host_lens(self):
        """Committed lengths as a Python list (one host sync if they changed on the device)."""
        if self._host_lens is None:
            self._host_lens = self.lens.tolist()
        return self._host_lens

    def seq_length(self):
        return max(self.host_lens())

    def get_seq_length(self, layer_idx=0):
        return self.seq_length()

    def get_mask_sizes(self, query_length, layer_idx=0):
        return self.max_len, 0

    def get_max_length(self, layer_idx=None):
        return self.max_len

    def _check_room(self, rows, what):
        longest = max(self.host_lens())
        if longest + rows > self.max_len:
            raise ValueError(f"{what}: cache overflow: the longest sequence holds {longest} rows, "
                             f"{rows} more would exceed max_len={self.max_len}")

    # ---- writing ------------------------------------------------------------------------------
    def begin_block(self, offset, rows):
        """The next forward writes ``rows`` new rows at ``lens + offset`` (a draft block that grows
        over several forwards passes its current size as ``offset``); raises before anything is
        written if any sequence would overflow. ``offset`` >= 0, ``rows`` >= 1 (ints)."""
        offset = _checks.integer("offset", offset, 0)
        rows = _checks.integer("rows", rows, 1)
        self._check_room(offset + rows, "begin_block")
        self._block = (offset, rows)
        self._write = self._plan(offset, rows)

    def end_block(self):
        self._block = None
        self._write = None

    def _plan(self, offset, T):
        # One plan per forward, reused by every layer. The host mirror of lens is fresh here (the
        # room check just read it), so this costs no extra sync.
        host = self.host_lens()
        if all(n == host[0] for n in host):
            return ("slice", host[0] + offset, T)
        B, H, D = self.k.shape[1], self.k.shape[2], self.k.shape[4]
        rows = (self.lens.to(torch.int64) + offset)[:, None] + torch.arange(T, device=self.lens.device)
        return ("scatter", rows[:, None, :, None].expand(B, H, T, D), T)

    def append_block(self, layer, k, v):
        """Writes one layer's new rows. Shape: k, v [B, Hkv, T, D] -> the layer's (k, v) [B, Hkv, S, D].

        In a block (``begin_block``) the rows go to ``lens + offset`` and stay uncommitted; in plain
        mode they go to ``lens`` and are committed after the last layer."""
        L, B, H, D = self.k.shape[0], self.k.shape[1], self.k.shape[2], self.k.shape[4]
        layer = _checks.integer("layer", layer, 0, L - 1, f"the cache has num_layers={L}")
        T = k.shape[2] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
        if (T < 1 or not isinstance(v, torch.Tensor) or k.shape != (B, H, T, D) or v.shape != k.shape
                or k.device != self.k.device or v.device != self.k.device or k.dtype not in CACHE_DTYPES
                or v.dtype != k.dtype):
            _checks.tensor("k", k, dtype=CACHE_DTYPES, shape=(B, H, None, D), device=self.k.device)
            _checks.tensor("v", v, dtype=k.dtype, shape=(B, H, T, D), device=self.k.device)
            if T < 1:
                raise ValueError(f"k must hold at least one row (T >= 1), got shape {tuple(k.shape)}")
        self._check_not_aliased(k, v)
        if self._block is not None:
            if self._block[1] != T:
                raise ValueError(f"append_block: the open block has {self._block[1]} rows per sequence, got T={T}")
        elif layer == 0 or self._write is None or self._write[2] != T:
            # Plain mode: the first layer of each forward checks room and plans the write.
            self._check_room(T, "append_block")
            self._write = self._plan(0, T)
        kind, where, _ = self._write
        if kind == "slice":
            self.k[layer, :, :, where:where + T].copy_(k)
            self.v[layer, :, :, where:where + T].copy_(v)
        else:
            self.k[layer].scatter_(2, where, k.to(self.k.dtype))
            self.v[layer].scatter_(2, where, v.to(self.v.dtype))
        if self._block is None and layer == self.k.shape[0] - 1:
            self._write = None
            self.commit(torch.full_like(self.lens, T), host_counts=[T] * B)
        return self.k[layer], self.v[layer]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return self.append_block(layer_idx, key_states, value_states)

    # ---- after verification ----------------------------------------------------------------
    def commit(self, counts, host_counts=None, *, check=True):
        """Keeps the first ``counts[b]`` rows written after ``lens[b]`` (int32 [B]): lens += counts.

        ``host_counts``: the same counts as a Python list, when the caller has them; keeps the host
        mirror of ``lens`` fresh without a sync. ``check=True`` requires ``0 <= counts[b]`` and
        ``lens[b] + counts[b] <= max_len``; without ``host_counts`` that costs one host sync, which
        refreshes the host mirror (so the next block's room check needs none). ``check=False``
        skips the value checks (no sync) and leaves the result unspecified for bad counts."""
        _checks.lengths("counts", counts, self.batch_size, self.lens.device)
        if host_counts is not None:
            host_counts = [int(c) for c in host_counts]
            if len(host_counts) != self.batch_size:
                raise ValueError(f"host_counts must have {self.batch_size} entries, got {len(host_counts)}")
        if check:
            if host_counts is None and self._host_lens is None:  # both from the device in one sync
                self._host_lens, host_counts = torch.stack([self.lens, counts]).tolist()
            elif host_counts is None:
                host_counts = counts.tolist()
            for b, (n, c) in enumerate(zip(self.host_lens(), host_counts)):
                if c < 0 or n + c > self.max_len:
                    raise ValueError(f"counts[{b}] must lie in [0, max_len - lens[{b}]] = [0, {self.max_len - n}] "
                                     f"(max_len={self.max_len}, lens[{b}]={n}), got {c}")
        self.lens += counts
        if host_counts is not None and self._host_lens is not None:
            self._host_lens = [n + c for n, c in zip(self._host_lens, host_counts)]
        else:
            self._host_lens = None

    def compact(self, accept_idx, accept_lens, *, check=True, backend=None):
        """Keeps the accepted block rows: row ``lens + accept_idx[b, j]`` moves to ``lens + j`` in every
        layer (one :func:`specops.kv_compact` call), then ``lens += accept_lens``.

        Shape: accept_idx int32 [B, A], accept_lens int32 [B]."""
        kv_compact(self.k, self.v, self.lens, accept_idx, accept_lens, check=check, backend=backend)
        # No second check: with check=True kv_compact has verified lens + accept_idx[b, j] < S for
        # strictly increasing accept_idx[b, j] >= j, so lens + accept_lens <= S = max_len holds; with
        # check=False nothing is checked (and nothing syncs), as documented.
        self.commit(accept_lens, check=False)

    def truncate(self, new_lens):
        """Metadata only: ``lens = new_lens`` (int32 [B], each <= the current length; one host sync)."""
        _checks.lengths("new_lens", new_lens, self.batch_size, self.lens.device)
        bad = (new_lens < 0) | (new_lens > self.lens)
        if bool(bad.any()):
            b = _checks.first_index(bad)[0]
            raise ValueError(f"new_lens must lie in [0, lens], got new_lens[{b}] = {int(new_lens[b])} "
                             f"for lens[{b}] = {int(self.lens[b])}")
        self.lens.copy_(new_lens)
        self._host_lens = None

    def reset(self):
        self.lens.zero_()
        self._host_lens = [0] * self.batch_size
        self._block = None
        self._write = None

    def crop(self, tokens_to_remove):
        """HF's crop: drop the last ``|tokens_to_remove|`` rows of every sequence (transformers passes
        a negative count, ``crop(-n)``; a positive one removes as many); lengths stop at 0."""
        n = abs(_checks.integer("tokens_to_remove", tokens_to_remove))
        self.truncate((self.lens - n).clamp(min=0))

    def reorder_cache(self, beam_idx):
        """Sequence ``b`` takes the K/V and length of sequence ``beam_idx[b]`` (int32/int64 [B] in
        [0, B); one host sync)."""
        B = self.batch_size
        _checks.tensor("beam_idx", beam_idx, dtype=(torch.int32, torch.int64), shape=(B,), device=self.lens.device)
        _checks.range_values("beam_idx", beam_idx, 0, B - 1, f"a sequence of the batch of B={B}")
        self.k.copy_(self.k[:, beam_idx])
        self.v.copy_(self.v[:, beam_idx])
        self.lens.copy_(self.lens[beam_idx])
        self._host_lens = None

    def _check_not_aliased(self, k, v):
        """New rows must not be views of the cache itself: a slice copy from overlapping memory would
        read rows it has already overwritten. Metadata only."""
        if torch.compiler.is_compiling():
            return
        own = {self.k.untyped_storage().data_ptr(), self.v.untyped_storage().data_ptr()}
        for name, t in (("k", k), ("v", v)):
            if t.untyped_storage().data_ptr() in own:
                raise ValueError(f"{name} must not share memory with the cache's own k/v buffers "
                                 f"(got a view at storage offset {t.storage_offset()}); pass a copy")
