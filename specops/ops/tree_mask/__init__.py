"""Tree masks: ancestor visibility and depth of every draft-tree node, bit-packed.

A draft tree of ``T`` nodes is given by parent pointers in topological order; node 0 is the root (the
pending token). Node ``i``'s mask row marks node ``j`` iff ``j`` is ``i`` or an ancestor, in bit
``j % 32`` of int32 word ``j // 32`` (``tree_attention``'s format). ``position = prefix + depth``.
"""
import torch

from ...backend import register_op, resolve
from .. import checks
from . import ref
from .ref import pack_mask, unpack_mask  # noqa: F401  (the word format: public, specops.pack_mask)


def build_tree_mask(parents, num_nodes=None, *, check=True, backend=None):
    """Ancestor mask and depth of every node of a batch of draft trees.

    Shape: parents int32 [B, T], num_nodes int32 [B] or None (= T) -> mask int32 [B, T, ceil(T/32)],
    depth int32 [B, T]. Rows ``i >= num_nodes[b]`` are padding: only their own bit, depth 0.
    ``check=False`` skips the value checks (tree rules, ``num_nodes`` range; a host sync): the kernels
    never loop on malformed input, but the output is then unspecified."""
    checks.tensor("parents", parents, dtype=torch.int32, rank=2)
    checks.nonempty("parents", parents, 1, "node (T >= 1)")
    num_nodes = checks.tree_nodes(parents, num_nodes, check)
    return resolve("build_tree_mask", parents.device, backend)(parents, num_nodes)


def _fake(parents, num_nodes):
    B, T = parents.shape
    return parents.new_empty((B, T, (T + 31) // 32)), parents.new_empty((B, T))


def _triton(*args):
    from ...triton_kernels import tree_mask

    return tree_mask.build_tree_mask(*args)


register_op("build_tree_mask", ref.build_tree_mask, _triton, _fake)
