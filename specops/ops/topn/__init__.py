"""Top-n tree expansion and OPT-Tree's final subtree choice.

A *candidate* is a (parent, token) pair scored ``parent_scores[b, p] + child_logprobs[b, p,
token]`` (fp32). One order decides everything, on every backend: higher score first; equal scores:
lower parent, then lower token (i.e. lower flat index ``parent * V + token``). A candidate scored
``-inf`` or NaN is *unavailable* (padding parents; children a warper removed), never selected.

* ``topn_expand``: per parent its best ``per_parent_k`` candidates, then the best ``n`` of those,
  sorted. OPT-Tree layers (``per_parent_k = n``), beam steps (``n = beams``), TSD/GSD's top-k per
  frontier node (``per_parent_k = k``, ``n = P * k``). Slots past the available candidates hold
  score ``-inf``, token ``-1``, parent ``-1``.
* ``select_topn_subtree``: the ``n``-node subtree (root included) of the largest scores. Scores
  are made non-increasing along paths (a node's is the minimum over its path below the root; a
  no-op for cumulative log-probs) and ties go to the lower index, always an ancestor's side since
  ``parents[i] < i``: the chosen set is ancestor-closed, a connected subtree with the root.

``check=True`` value checks sync the host once; ``check=False`` for the hot path and CUDA graphs.
Limits (ValueError naming them): ``n <= MAX_N = 65536`` (outputs are ``[B, n]``; no tree, beam or
frontier is that large, and an unbounded ``n`` would only allocate padding); ``V <= 2**31 - 1`` in
``topn_expand`` (int32 tokens), whose CUDA backend selects in shared memory: ``n <= 2048``."""
import torch

from ...backend import register_op, register_supports, resolve
from .. import checks
from ..sampling import FLOAT_DTYPES, MAX_VOCAB  # tokens are int32
from . import ref

_CUDA_MAX_N = 2048  # kTopItems * kThreads in csrc/cuda/topn.cu
MAX_N = 2**16  # n of both ops: rows of the [B, n] outputs


def _n(n):
    return checks.integer("n", n, 1, MAX_N, "MAX_N: outputs are [B, n]; no draft tree is that large")


def topn_expand(parent_scores, child_logprobs, n, *, per_parent_k=None, check=True, backend=None):
    """The best ``n`` (parent, token) candidates by ``parent_score + child_logprob``.

    Shape: parent_scores fp32/bf16/fp16 [B, P], child_logprobs fp32/bf16/fp16 [B, P, V] -> (scores
    fp32 [B, n], tokens int32 [B, n], parents int32 [B, n]), best first. Limits: ``1 <= n <= 65536``
    (2048 on cuda), ``V <= 2**31 - 1``. ``per_parent_k`` (None: no limit) caps each parent's
    candidates, chosen by the same order. ``check=True`` rejects NaN and ``+inf`` (one host sync)."""
    checks.tensor("parent_scores", parent_scores, dtype=FLOAT_DTYPES, rank=2)
    B, P = parent_scores.shape
    checks.tensor("child_logprobs", child_logprobs, dtype=FLOAT_DTYPES, shape=(B, P, None),
                  device=parent_scores.device)
    V = child_logprobs.shape[2]
    if P == 0 or V == 0:
        raise ValueError(f"child_logprobs must have P >= 1 and V >= 1, got shape {tuple(child_logprobs.shape)}")
    if V > MAX_VOCAB:
        raise ValueError(f"child_logprobs must have V <= {MAX_VOCAB} (tokens are int32), got V={V}")
    n = _n(n)
    k = V if per_parent_k is None else checks.integer("per_parent_k", per_parent_k, 1)
    if check:
        checks.not_nan_or_posinf("parent_scores", parent_scores)
        checks.not_nan_or_posinf("child_logprobs", child_logprobs)
    args = (parent_scores.float(), child_logprobs, n, min(k, V))
    return resolve("topn_expand", parent_scores.device, backend, args)(*args)


def select_topn_subtree(parents, scores, n, num_nodes=None, *, check=True, backend=None):
    """OPT-Tree's final selection: the best ``n`` nodes of a draft tree as a rooted subtree.

    Shape: parents int32 [B, T], scores fp32/bf16/fp16 [B, T] (each node's cumulative path log-prob;
    the root's is ignored), num_nodes int32 [B] or None (= T) -> (keep_idx int32 [B, n], new_parents
    int32 [B, n], counts int32 [B]). Limit: ``1 <= n <= 65536``.

    ``n`` counts the root (OPT-Tree's budget of ``n`` draft nodes passes ``n + 1``): a tree of
    ``counts[b] = min(n, available nodes)`` nodes in ``build_tree_mask``'s convention; ``keep_idx[b,
    j]``, the original index of new node ``j``, increases (topological; siblings keep their order);
    ``new_parents`` re-indexes the parents; slots ``j >= counts[b]`` hold -1. Nodes scored ``-inf`` or
    NaN (and so their descendants) are never kept; the root always is."""
    checks.tensor("parents", parents, dtype=torch.int32, rank=2)
    checks.nonempty("parents", parents, 1, "node (T >= 1)")
    checks.tensor("scores", scores, dtype=FLOAT_DTYPES, shape=tuple(parents.shape), device=parents.device)
    n = _n(n)
    num_nodes = checks.tree_nodes(parents, num_nodes, check)
    return resolve("select_topn_subtree", parents.device, backend)(parents, scores.float(), num_nodes, n)


# ---- backends ----------------------------------------------------------------------------------------

def _cuda_supports(parent_scores, child_logprobs, n, per_parent_k):
    return None if n <= _CUDA_MAX_N else f"n={n} > {_CUDA_MAX_N} (the CUDA kernel's shared-memory selection)"


def _triton(name):
    """The Triton kernel ``name`` (its module imported at the first call)."""
    def call(*args):
        from ...triton_kernels import topn

        return getattr(topn, name)(*args)

    return call


def _topn_fake(parent_scores, child_logprobs, n, per_parent_k):
    B = parent_scores.shape[0]  # parent_scores is fp32 here
    return tuple(parent_scores.new_empty((B, n), dtype=d) for d in (torch.float32, torch.int32, torch.int32))


def _subtree_fake(parents, scores, num_nodes, n):
    B = parents.shape[0]
    return parents.new_empty((B, n)), parents.new_empty((B, n)), parents.new_empty((B,))


register_op("topn_expand", ref.topn_expand, _triton("topn_expand"), _topn_fake)
register_supports("topn_expand", ("cuda", "cudasim"), _cuda_supports)
register_op("select_topn_subtree", ref.select_topn_subtree, _triton("select_topn_subtree"), _subtree_fake)
