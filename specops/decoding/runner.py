"""Model runners: a stock HF causal LM with a static KV cache, behind the interface the loop uses.

The runner (``specops.integrations.transformers.SpecModel``) owns the cache and the "specops"
attention implementation. The loop needs only::

    runner.lens                                   # int32 [B]: committed KV length per sequence
    runner.prefill(input_ids, lens)               # int64 [B, L] right-padded -> logits [B, L, V]
    runner.forward_block(tokens, parents, num_nodes=None, q_start=0)
                                                  # tokens [B, T - q_start] (the new nodes), parents
                                                  # [B, T] (the whole block); K/V at rows lens + i,
                                                  # positions lens + depth -> logits [B, T - q_start, V]
    runner.compact(accept_idx, accept_lens, check=False, host_counts=None)
                                                  # accepted rows to lens.., lens += accept_lens
                                                  # (host_counts: accept_lens as a list, if known)
    runner.commit(counts)                         # keep the first counts[b] block rows (a chain; unused)
    runner.truncate(new_lens, host_lens=None)     # lens = new_lens <= lens (metadata only)

``set_runner_factory`` swaps the constructor (tests use it to prove bad input fails before any work).
"""
import torch

_factory = None


def set_runner_factory(factory):
    """``factory(model, batch_size, max_len) -> runner``; None restores the default. Returns the old one."""
    global _factory
    old, _factory = _factory, factory
    return old


def make_runner(model, batch_size, max_len, **runner_kw):
    """The runner for ``model``; ``runner_kw`` (e.g. ``kv_layout``, ``page_size``) go to SpecModel
    (and to a factory only when given, so factories of the plain signature keep working)."""
    if _factory is not None:
        return _factory(model, batch_size, max_len, **runner_kw)
    try:
        from specops.integrations.transformers import SpecModel
    except ImportError as err:
        raise RuntimeError(
            "the specops model runner (specops.integrations.transformers.SpecModel) is not available "
            f"in this build: {err}") from err
    return SpecModel(model, batch_size, max_len, **runner_kw)


def block_logits(runner, tokens, parents, num_nodes, q_start=0):
    """Forward a (ragged, padded) tree block; returns logits of nodes ``q_start..T-1`` only.

    Shape: tokens int64 [B, T], parents int32 [B, T], num_nodes int32 [B] -> fp32 [B, T - q_start, V].
    Rows below ``q_start`` must already hold their K/V from an earlier call on the same block."""
    logits = runner.forward_block(tokens[:, q_start:], parents, num_nodes=num_nodes, q_start=q_start)
    return logits.float()


def commit_paths(runner, paths, check=False):
    """Per sequence, keeps block rows ``paths[b]`` (a root path of node indices, or None/[] for
    nothing) with one ``runner.compact`` (kv_compact; a chain prefix moves each row onto itself).
    The paths are host lists, so the index tensor is a host-to-device copy: nothing is read back
    (``runner.commit`` would check its counts with a host sync)."""
    lens = [len(p) if p else 0 for p in paths]
    if not any(lens):
        return
    A = max(lens)
    rows = []
    for p, n in zip(paths, lens):
        base = list(p) if n else []
        start = base[-1] + 1 if base else 0  # entries past accept_lens: ignored, kept increasing
        rows.append(base + list(range(start, start + A - n)))
    dev = runner.lens.device
    runner.compact(torch.tensor(rows, dtype=torch.int32).to(dev), torch.tensor(lens, dtype=torch.int32).to(dev),
                   check=check, host_counts=lens)


def pad_batch(seqs, pad=0):
    """Right-padded ids and lengths. Shape: -> int64 [B, max len], int32 [B]."""
    B = len(seqs)
    L = max(len(s) for s in seqs)
    ids = torch.full((B, L), pad, dtype=torch.int64)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.int64)
    return ids, torch.tensor([len(s) for s in seqs], dtype=torch.int32)
