"""The ``"specops"`` attention implementation for Hugging Face transformers.

The runner (:class:`specops.engine.ModelRunner`) passes a block's metadata as one keyword,
``specops_block``, which HF hands down through every layer's ``**kwargs`` (eager and compiled alike; no
thread-local state). The packed mask as a 4-D ``attention_mask`` ([B, 1, Tq, W]) makes HF's mask
builders return early; ``position_ids`` are ``prefix + depth``, so RoPE sees each node at its depth.

* Eager (:class:`Block`): the model writes each layer's new K/V into the specops cache
  (``past_key_values``); the first layer builds one :class:`specops.TreeAttentionPlan`, every layer runs
  it on its cache view (a [B, Hkv, S, D] slice of a :class:`~specops.engine.cache.StaticKVCache`, or a
  layer's page pools of a :class:`~specops.engine.cache.PagedKVCache`).
* Compiled (:class:`CompiledBlock`, :mod:`specops.engine.compiled`): no HF ``Cache``;
  :func:`block_attention` writes the layer's new rows straight into the cache storage and runs the kernel.

Without a block (a plain HF forward, or ``generate``) the new tokens are a causal chain after the cached
ones; an HF padding mask (left-padded batches) or a sliding window the sequence outgrows falls back to SDPA.
"""
import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from ..ops.layout import KvLayout
from ..ops.tree_attention.plan import TreeAttentionPlan
from ..ops.tree_mask import pack_mask

NAME = "specops"
BLOCK_KW = "specops_block"  # the one keyword that carries a block's metadata to every layer


@dataclass
class Block:
    """What the attention of one eager forward needs beyond the cache view.

    Shape: prefix_lens, block_lens, q_lens int32 [B]; mask int32 [B, Tq, W]; page_table int32
    [B, max_pages] and ``page_size`` for a paged cache, else None. ``longest``: a host upper bound on
    prefix + block rows (the sliding-window check without a sync). ``plan``: (the shapes, the
    :class:`specops.TreeAttentionPlan`) the first layer of those shapes built; ``invariant``: the
    batch-invariant schedule (docs/batch_invariance.md)."""

    prefix_lens: torch.Tensor
    block_lens: torch.Tensor
    mask: torch.Tensor
    q_lens: torch.Tensor
    longest: int
    page_table: torch.Tensor = None
    page_size: int = None
    plan: tuple = None
    invariant: bool = False


class CompiledBlock(NamedTuple):
    """What the attention of one compiled forward needs (graph inputs: tensors, plus the kernel).

    Shape: prefix_lens, block_lens, q_lens int32 [B]; mask int32 [B, 1, Tb, W]; rows int64 [B, Tb]
    (the cache row of every new row); k_store, v_store [L, B, Hkv, S, D] with page_table None
    (contiguous), or [L, N, ps, Hkv, D] with page_table int32 [B, max_pages] (paged). ``impl``: the
    plan's kernel function, or None for the compiled extension's registered op (``.functional``).
    ``layer``: a graph of a run of layers (docs/compile.md) passes that run's stores and the index in it."""

    impl: object
    prefix_lens: torch.Tensor
    block_lens: torch.Tensor
    q_lens: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
    k_store: torch.Tensor
    v_store: torch.Tensor
    page_table: torch.Tensor
    invariant: bool = False
    layer: int = None  # None: the module's layer_idx


def specops_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """HF attention function. Shape: query [B, Hq, T, D]; key, value [B, Hkv, S, D] (the cache view,
    GQA not expanded; a compiled block: this forward's new rows) -> ([B, T, Hq, D], None)."""
    block = kwargs.pop(BLOCK_KW, None)
    if isinstance(block, CompiledBlock):
        return block_attention(module, query, key, value, block, scaling)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    if block is None:
        if attention_mask is not None and attention_mask.dtype == torch.int32:
            raise RuntimeError(
                f"{type(module).__name__} received a specops block mask but not its {BLOCK_KW!r} keyword: this "
                f"model's layers do not pass their keyword arguments down to the attention function")
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
        block = Block(prefix_lens=prefix, block_lens=torch.full((B,), T, dtype=torch.int32, device=dev),
                      mask=causal_mask(B, T, dev), q_lens=None, longest=key.shape[2])
    elif window and block.longest > window:
        raise NotImplementedError(
            f"{type(module).__name__} layer {getattr(module, 'layer_idx', '?')} has a sliding window of {window} "
            f"rows but a sequence holds up to {block.longest}: tree blocks beyond the window are not supported")
    q = query.transpose(1, 2)  # [B, T, Hq, D] (a view)
    # One plan per forward, built by the first layer of its shapes (docs/plans.md, "Who uses them").
    shapes = (q.shape, key.shape, q.dtype, scaling)
    if block.plan is None or block.plan[0] != shapes:
        plan = TreeAttentionPlan(block.prefix_lens, block.block_lens, block.mask, q_lens=block.q_lens,
                                 sm_scale=scaling, page_table=block.page_table, page_size=block.page_size,
                                 head_dim=q.shape[3], num_heads=q.shape[2],
                                 num_kv_heads=key.shape[2 if block.page_table is not None else 1],
                                 dtype=q.dtype, device=q.device, check=False, invariant=block.invariant)
        block.plan = (shapes, plan)
    return block.plan[1].run(q, key, value), None


AttentionInterface.register(NAME, specops_attention)
# A block's packed mask arrives as a 4-D attention_mask, which HF's mask builders pass through
# untouched; any other forward (a plain HF call) gets SDPA's mask, which the function above reads.
AttentionMaskInterface.register(NAME, sdpa_mask)


def use_specops_attention(model):
    """Switches an HF model to the ``"specops"`` attention implementation; returns the model."""
    model.set_attn_implementation(NAME)
    return model


@functools.lru_cache(maxsize=64)
def causal_mask(B, T, device):
    """The chain mask (query i sees block keys 0..i): int32 [B, T, ceil(T/32)], an expanded view built
    once per (B, T, device): read-only."""
    return pack_mask(torch.ones(T, T, dtype=torch.bool, device=device).tril()).expand(B, T, -1)


# ---- the compiled forwards' attention ----------------------------------------------------------

def block_attention(module, query, key, value, block, scaling):
    """The attention of one layer inside a compiled block forward.

    Shape: query [B, Hq, Tb, D]; key, value [B, Hkv, Tb, D] (this forward's new rows, RoPE applied);
    ``block``: a :class:`CompiledBlock` -> ([B, Tb, Hq, D], None)."""
    layer = module.layer_idx if block.layer is None else block.layer
    kv = KvLayout(block.k_store, block.v_store, block.page_table)
    (B, H), dev = key.shape[:2], key.device
    # Whole-input index_put_, not a write into the layer's view: inductor updates the cache in place.
    lid = torch.full((1, 1, 1), layer, dtype=torch.int64, device=dev)
    heads = torch.arange(H, device=dev)[None, :, None]  # [1, Hkv, 1]
    # The rows' addresses are the layout's (b, row) or (page, slot), as the eager caches' and the kernels'.
    x, y = [a[:, None, :] for a in kv.address(torch.arange(B, device=dev)[:, None], block.rows)]  # [B, 1, Tb]
    where = (lid, x, y, heads) if kv.is_paged else (lid, x, heads, y)  # [B, Hkv, Tb]
    for store, new in ((kv.k, key), (kv.v, value)):
        store.index_put_(where, new.to(store.dtype))
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    args = (query.transpose(1, 2), kv.k[layer], kv.v[layer], *kv.tensors()[2:],  # paged: + page_table
            block.prefix_lens, block.block_lens, block.mask[:, 0], block.q_lens)
    if block.impl is None:  # the compiled extension's registered op: one opaque node of the graph
        # `.functional`, without the optional mutated workspace inductor cannot lower (docs/compile.md).
        op = torch.ops.specops.tree_attention_paged if kv.is_paged else torch.ops.specops.tree_attention
        return op.functional(*args, float(scaling), 1, block.invariant), None
    return block.impl(*args, scaling, 1, None, block.invariant), None
