"""Model runners: a stock HF causal LM with a static KV cache, behind the interface the loop uses.

The runner (``specops.integrations.transformers.SpecModel``) owns the cache and the "specops"
attention implementation. The loop needs only::

    runner.lens                                   # int32 [B]: committed KV length per sequence
    runner.prefill(input_ids, lens)               # int64 [B, L] right-padded -> logits [B, L, V]
    runner.forward_block(tokens, parents, num_nodes=None, q_start=None)
                                                  # tree block at rows lens..lens+T-1, positions
                                                  # lens + depth -> logits [B, T(-q_start), V] fp32
    runner.compact(accept_idx, accept_lens)       # accepted rows to lens.., lens += accept_lens
    runner.truncate(new_lens)                     # lens = new_lens (metadata only)

``set_runner_factory`` swaps the constructor (tests use it to run the loop over a plain-HF stand-in).
"""
import torch

_factory = None


def set_runner_factory(factory):
    """``factory(model, batch_size, max_len) -> runner``; None restores the default. Returns the old one."""
    global _factory
    old, _factory = _factory, factory
    return old


def make_runner(model, batch_size, max_len):
    if _factory is not None:
        return _factory(model, batch_size, max_len)
    try:
        from specops.integrations.transformers import SpecModel
    except ImportError as err:
        raise RuntimeError(
            "the specops model runner (specops.integrations.transformers.SpecModel) is not available "
            f"in this build: {err}") from err
    return SpecModel(model, batch_size, max_len)


def block_logits(runner, tokens, parents, num_nodes, q_start=0):
    """Forward a (ragged, padded) tree block; returns logits of nodes ``q_start..T-1`` only.

    Shape: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B] -> fp32 [B, T - q_start, V].
    Rows below ``q_start`` must already hold their K/V from an earlier call on the same block."""
    T = tokens.shape[1]
    logits = runner.forward_block(tokens, parents, num_nodes=num_nodes, q_start=q_start or None)
    if logits.shape[1] == T and q_start:
        logits = logits[:, q_start:]
    return logits.float()


def lens_list(runner):
    return [int(x) for x in runner.lens.tolist()]


def pad_batch(seqs, pad=0):
    """Right-padded ids and lengths. Shape: -> int64 [B, max len], int32 [B]."""
    B = len(seqs)
    L = max(len(s) for s in seqs)
    ids = torch.full((B, L), pad, dtype=torch.int64)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    return ids, torch.tensor([len(s) for s in seqs], dtype=torch.int32)
