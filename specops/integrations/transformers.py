"""The ``"specops"`` attention implementation for Hugging Face transformers, and :class:`SpecModel`,
the runner the decoding loop drives a stock HF causal LM with.

How a tree block reaches the kernel: :class:`SpecModel` opens a block (:class:`Block`: prefix
lengths, block lengths, the bit-packed visibility mask of the queries, their count) for the
duration of one forward; the model writes each layer's new K/V into the
:class:`~specops.cache.StaticKVCache` (``past_key_values``) and calls the registered attention
function. The first layer builds one :class:`specops.TreeAttentionPlan` for the block (lengths, mask,
backend: checked once) and every layer runs it on its cache view (a [B, Hkv, S, D] slice of a
:class:`~specops.cache.StaticKVCache`, or a layer's page pools of a
:class:`~specops.cache.PagedKVCache`, whose page table the block carries). Positions are
``prefix + depth`` (``position_ids``), so RoPE sees each node at its depth in the tree.

Without an open block (a plain HF forward or ``generate`` with ``attn_implementation="specops"``),
the function treats the new tokens as a causal chain after the cached ones; a padding mask from HF
(left-padded batches) or a sliding window that the sequence outgrows falls back to torch SDPA.
"""
import inspect
import threading
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from ..cache import PagedKVCache, StaticKVCache
from ..ops import _checks
from ..ops.plan import TreeAttentionPlan
from ..ops.tree_mask import build_tree_mask, pack_mask
from . import compiled as _compiled
from .compiled import block_attention

NAME = "specops"
_state = threading.local()


@dataclass
class Block:
    """What the attention of one forward needs beyond the cache view.

    Shape: prefix_lens, block_lens, q_lens int32 [B]; mask int32 [B, Tq, W]; page_table int32
    [B, max_pages] when the cache is paged (then ``page_size`` too), else None. ``longest`` is a host
    upper bound on prefix + block rows (for the sliding-window check, so no sync is needed).
    ``plan``: the :class:`specops.TreeAttentionPlan` the first layer built (checked once, backend
    resolved once) with the shapes it was built for; later layers with those shapes just run it."""

    prefix_lens: torch.Tensor
    block_lens: torch.Tensor
    mask: torch.Tensor
    q_lens: torch.Tensor
    longest: int
    page_table: torch.Tensor = None
    page_size: int = None
    plan: tuple = None


def specops_mask(*args, **kwargs):
    """Mask hook: inside a specops block the visibility travels in :class:`Block`, so none is built."""
    if getattr(_state, "block", None) is not None:
        return None
    return sdpa_mask(*args, **kwargs)


def specops_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """HF attention function. Shape: query [B, Hq, T, D]; key, value [B, Hkv, S, D] (the cache view,
    GQA not expanded) -> ([B, T, Hq, D], None)."""
    if kwargs.get("specops_block") is not None:  # a compiled block forward (specops.integrations.compiled)
        return block_attention(module, query, key, value, kwargs["specops_block"], scaling)
    block = getattr(_state, "block", None)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    if block is None:
        if attention_mask is not None or (window and key.shape[2] > window) or module.training:
            return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                          dropout=dropout, **kwargs)
        B, T, dev = query.shape[0], query.shape[2], query.device
        # Unpadded sequences: the first new token's position is the number of rows already cached
        # (a StaticKVCache hands over its whole buffer, so key.shape[2] says nothing).
        position_ids = kwargs.get("position_ids")
        if position_ids is not None:
            prefix = position_ids[:, 0].to(torch.int32).expand(B).contiguous()
        else:
            prefix = torch.full((B,), key.shape[2] - T, dtype=torch.int32, device=dev)
        block = Block(prefix_lens=prefix,
                      block_lens=torch.full((B,), T, dtype=torch.int32, device=dev),
                      mask=causal_mask(B, T, dev), q_lens=None, longest=key.shape[2])
    elif window and block.longest > window:
        raise NotImplementedError(
            f"{type(module).__name__} layer {getattr(module, 'layer_idx', '?')} has a sliding window of {window} "
            f"rows but a sequence holds up to {block.longest}: tree blocks beyond the window are not supported")
    q = query.transpose(1, 2)  # [B, T, Hq, D] (a view)
    # Every layer of one forward passes the same shapes over the same cache: the first layer builds
    # the plan (argument checks and backend choice), the others only run it (the per-call Python
    # checks cost about as much as the kernel itself for a single query). A layer of other shapes
    # (e.g. another head dim) builds its own.
    shapes = (q.shape, key.shape, q.dtype, scaling)
    if block.plan is None or block.plan[0] != shapes:
        plan = TreeAttentionPlan(block.prefix_lens, block.block_lens, block.mask, q_lens=block.q_lens,
                                 sm_scale=scaling, page_table=block.page_table, page_size=block.page_size,
                                 head_dim=q.shape[3], num_heads=q.shape[2],
                                 num_kv_heads=key.shape[2 if block.page_table is not None else 1],
                                 dtype=q.dtype, device=q.device, check=False)
        block.plan = (shapes, plan)
    out = block.plan[1].run(q, key, value)
    return out, None


AttentionInterface.register(NAME, specops_attention)
AttentionMaskInterface.register(NAME, specops_mask)


def use_specops_attention(model):
    """Switches an HF model to the ``"specops"`` attention implementation; returns the model."""
    model.set_attn_implementation(NAME)
    return model


_CAUSAL = {}  # (T, device) -> packed chain mask [T, W]; built once, read-only afterwards
_CAUSAL_MAX = 64


def causal_mask(B, T, device):
    """The chain mask: query i sees block keys 0..i. Shape: -> int32 [B, T, ceil(T/32)] (an
    expanded view of a cached mask: do not write into it)."""
    key = (T, str(device))
    mask = _CAUSAL.get(key)
    if mask is None:
        vis = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        mask = pack_mask(vis)
        if len(_CAUSAL) >= _CAUSAL_MAX:
            _CAUSAL.pop(next(iter(_CAUSAL)))
        _CAUSAL[key] = mask
    return mask.expand(B, T, -1)


KV_LAYOUTS = ("contiguous", "paged")


class SpecModel:
    """Runs a stock HF causal LM over prefixes and draft blocks, with a :class:`StaticKVCache`
    (``kv_layout="contiguous"``) or a :class:`PagedKVCache` of ``page_size``-row pages (``"paged"``).

    ``lens`` (int32 [B]) are the committed rows per sequence. A draft block is written after them and
    stays uncommitted until :meth:`compact` (keep the accepted path) or :meth:`commit` (keep all)."""

    prefill_last_only = True  # prefill(..., last_only=True) is supported

    def __init__(self, model, batch_size, max_len, *, cache_dtype=None, kv_layout="contiguous", page_size=16,
                 compile=False, compile_mode="default"):
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        if not isinstance(compile, bool):
            raise ValueError(f"compile must be a bool, got {compile!r}")
        max_len = _checks.integer("max_len", max_len, 1)
        # Compiled blocks are padded to their bucket; the padding rows' K/V land past the valid rows,
        # so the cache keeps one largest bucket of spare rows (never committed, never attended).
        rows = max_len + (_compiled.MAX_BUCKET if compile else 0)
        if kv_layout == "paged":
            page_size = _checks.integer("page_size", page_size, 1)
            if page_size & (page_size - 1):
                raise ValueError(f"page_size must be a power of two >= 1, got {page_size}")

            def make(n):
                return PagedKVCache.for_model(model, batch_size, n, dtype=cache_dtype, page_size=page_size)
        else:
            def make(n):
                return StaticKVCache.for_model(model, batch_size, n, dtype=cache_dtype)
        if compile:  # a free cache of an earlier runner of the model when it is large enough
            self.cache = _compiled.decoder_for(model, compile_mode).cache_for(
                self, make, rows, (batch_size, kv_layout, page_size, cache_dtype))
        else:
            self.cache = make(rows)
        self._max_len = max_len
        self.kv_layout = kv_layout
        self.model = use_specops_attention(model).eval()
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.vocab_size = cfg.vocab_size
        self.device = self.cache.device
        try:
            self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            self._keeps_logits = False
        self.compiled = _compiled.CompiledRunner(self, cfg, compile_mode) if compile else None

    @property
    def buckets(self):
        """The block sizes compiled forwards are padded to (``()`` when not compiled)."""
        return _compiled.BUCKETS if self.compiled is not None else ()

    def block_cost(self, T):
        """Measured seconds of a block forward of ``T`` query rows: the running mean of its bucket's
        compiled forwards (a step function of T), or None before one ran (or when not compiled)."""
        return None if self.compiled is None else self.compiled.cost(T)

    @property
    def compile_time_s(self):
        """Seconds this runner's forwards spent compiling (tracing, code generation or loading a
        graph from the disk cache); 0.0 when every graph it used was compiled already."""
        return 0.0 if self.compiled is None else self.compiled.compile_time_s

    def warmup(self, sizes=None):
        """Compiles the graphs for blocks of ``sizes`` query rows (default: every bucket) now, before
        any timed work; returns the seconds spent. Call before ``prefill`` (it writes scratch rows)."""
        return 0.0 if self.compiled is None else self.compiled.warmup(sizes)

    @property
    def lens(self):
        return self.cache.lens

    @property
    def batch_size(self):
        return self.cache.batch_size

    @property
    def max_len(self):
        return self._max_len

    def prefill(self, input_ids, lens, *, last_only=False):
        """Runs right-padded prompts from an empty cache and commits them.

        Shape: input_ids int [B, L], lens int32 [B] (1 <= lens <= L) -> logits [B, L, V] in the
        model's dtype (rows >= lens[b] are padding); with ``last_only`` [B, V], the logits after each
        prompt's last token (the LM head then runs on those rows only)."""
        _checks.tensor("input_ids", input_ids, dtype=(torch.int64, torch.int32), shape=(self.batch_size, None),
                       device=self.device)
        B, L = input_ids.shape
        _checks.lengths("lens", lens, B, self.device)
        if L > self.max_len:
            raise ValueError(f"input_ids: prompt of {L} tokens exceeds the cache (max_len={self.max_len})")
        _checks.range_values("lens", lens, 1, L, "every prompt needs at least one token")
        self.cache.reset()
        block = self._block(prefix_lens=torch.zeros_like(lens), block_lens=lens, mask=causal_mask(B, L, self.device),
                            q_lens=lens, longest=L)
        positions = torch.arange(L, device=self.device).expand(B, L)
        last = (lens.to(torch.int64) - 1)[:, None]  # [B, 1]
        keep = last if last_only and self._keeps_logits else None
        logits = self._run(input_ids, positions, block, offset=0, logits_to_keep=keep)
        self.cache.commit(lens)
        if last_only:
            if logits.dim() == 4:  # transformers < 5.20 indexes every row with the [B, 1] keep -> [B, B, 1, V]
                logits = logits[torch.arange(B, device=logits.device), torch.arange(B, device=logits.device)]
            if logits.shape[1] != 1:  # the model ignored logits_to_keep: pick the rows here
                logits = torch.take_along_dim(logits, last[..., None], dim=1)
            return logits[:, 0]
        return logits

    def forward_block(self, tokens, parents, num_nodes=None, *, q_start=0):
        """Target/draft forward over draft-tree nodes ``q_start..T-1`` (the earlier ones were written by
        previous calls of the same block). Positions are ``lens + depth``.

        Shape: tokens int [B, T - q_start], parents int32 [B, T] (the whole block so far), num_nodes
        int32 [B] or None -> logits [B, T - q_start, V] in the model's dtype."""
        mask, depth = build_tree_mask(parents, num_nodes, check=False)
        T = parents.shape[1]
        block_lens = num_nodes if num_nodes is not None else torch.full_like(self.lens, T)
        return self.forward_mask(tokens, mask[:, q_start:], depth[:, q_start:], block_lens, q_start=q_start)

    def forward_mask(self, tokens, mask, depth, block_lens, *, q_start=0):
        """The general form: any visibility mask (DAG, lookahead window) over the block.

        Shape: tokens int [B, Tq], mask int32 [B, Tq, W] (visibility of block keys 0..), depth int32
        [B, Tq] (position = lens + depth), block_lens int32 [B] (valid block rows incl. these
        queries) -> logits [B, Tq, V] in the model's dtype. Query rows >= block_lens - q_start are
        padding. With ``compile=True`` a block of up to ``max(buckets)`` rows runs the compiled graph
        of its bucket; a longer one (or one a sliding window cannot take) runs eagerly."""
        B, Tq = tokens.shape
        _checks.tensor("tokens", tokens, dtype=(torch.int64, torch.int32), shape=(self.batch_size, None),
                       device=self.device)
        longest = max(self.cache.host_lens()) + q_start + Tq
        if longest > self._max_len:
            raise ValueError(f"forward_mask: cache overflow: the longest sequence holds {longest - q_start - Tq} "
                             f"rows, {q_start + Tq} more would exceed max_len={self._max_len}")
        if self.compiled is not None and self.compiled.takes(Tq, longest):
            return self.compiled.forward(tokens, mask, depth, block_lens, q_start)
        block = self._block(prefix_lens=self.lens, block_lens=block_lens, mask=mask, q_lens=block_lens - q_start,
                            longest=longest)
        positions = self.lens[:, None].to(torch.int64) + depth
        return self._run(tokens, positions, block, offset=q_start)

    def _block(self, **kw):
        if self.kv_layout == "paged":
            kw.update(page_table=self.cache.page_table, page_size=self.cache.page_size)
        return Block(**kw)

    def _run(self, ids, positions, block, offset, logits_to_keep=None):
        self.cache.begin_block(offset, ids.shape[1])
        _state.block = block
        kw = {} if logits_to_keep is None else {"logits_to_keep": logits_to_keep}
        try:
            out = self.model(input_ids=ids.long(), position_ids=positions.long(), past_key_values=self.cache,
                             use_cache=True, **kw)
        finally:
            _state.block = None
            self.cache.end_block()
        return out.logits

    def compact(self, accept_idx, accept_lens, **kw):
        """Keeps the accepted block rows (int32 [B, A] node indices, int32 [B] counts); lens += accept_lens."""
        self.cache.compact(accept_idx, accept_lens, **kw)

    def commit(self, counts):
        """Keeps the first ``counts[b]`` block rows as they are (a chain accepted in order)."""
        self.cache.commit(counts)

    def truncate(self, new_lens, host_lens=None):
        """lens = new_lens (int32 [B], each <= lens); ``host_lens``: the same as a list (no host sync)."""
        self.cache.truncate(new_lens, host_lens)
