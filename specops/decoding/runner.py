"""Model runners: a stock HF causal LM with a static KV cache, behind the interface the loop uses.

The runner (``specops.integrations.transformers.SpecModel``) owns the cache and the "specops"
attention implementation. The loop needs only::

    runner.lens                                   # int32 [B]: committed KV length per sequence
    runner.prefill(input_ids, lens)               # int64 [B, L] right-padded -> logits [B, L, V]
    runner.forward_block(tokens, parents, num_nodes=None, q_start=0)
                                                  # tokens [B, T - q_start] (the new nodes), parents
                                                  # [B, T] (the whole block); K/V at rows lens + i,
                                                  # positions lens + depth -> logits [B, T - q_start, V]
    runner.compact(accept_idx, accept_lens)       # accepted rows to lens.., lens += accept_lens
    runner.commit(counts)                         # keep the first counts[b] block rows (a chain)
    runner.truncate(new_lens)                     # lens = new_lens <= lens (metadata only)

``set_runner_factory`` swaps the constructor (tests use it to prove bad input fails before any work).
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
    logits = runner.forward_block(tokens[:, q_start:], parents, num_nodes=num_nodes, q_start=q_start)
    return logits.float()


def commit_paths(runner, paths):
    """Per sequence, keeps block rows ``paths[b]`` (a root path of node indices, or None/[] for
    nothing). A chain prefix needs no copy: ``runner.commit`` (metadata only) keeps it, whatever the
    method's KV policy says; anything else goes through ``runner.compact`` (one kv_compact call)."""
    B = len(paths)
    lens = [len(p) if p else 0 for p in paths]
    dev = runner.lens.device
    counts = torch.tensor(lens, dtype=torch.int32, device=dev)
    if all(not p or p == list(range(len(p))) for p in paths):
        if any(lens):
            runner.commit(counts)
        return
    A = max(lens)
    idx = torch.zeros(B, A, dtype=torch.int32)
    for b, p in enumerate(paths):
        base = list(p) if p else []
        start = base[-1] + 1 if base else 0  # rows past accept_lens: any increasing filler
        idx[b] = torch.tensor(base + list(range(start, start + A - len(base))), dtype=torch.int32)
    runner.compact(idx.to(dev), counts)


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
