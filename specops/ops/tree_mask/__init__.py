"""Tree masks: ancestor visibility and depth of every draft-tree node, bit-packed.

Terms: a draft tree of ``T`` nodes is given by parent pointers in topological order; node 0
is the root (the pending token). The mask row of node ``i`` marks node ``j`` iff ``j`` is an
ancestor of ``i`` or ``i`` itself, in bit ``j % 32`` of int32 word ``j // 32`` — the visibility
format ``tree_attention`` consumes. Depth positions the node: ``position = prefix + depth``.
"""
import torch

from ... import extension
from ...backend import register, register_compiled, resolve
from .. import checks
from . import ref
from .ref import pack_mask, unpack_mask  # noqa: F401  (the word format: public, specops.pack_mask)


def build_tree_mask(parents, num_nodes=None, *, check=True, backend=None):
    """Ancestor mask and depth of every node of a batch of draft trees.

    Shape: parents int32 [B, T], num_nodes int32 [B] or None (= T) -> mask int32 [B, T, ceil(T/32)],
    depth int32 [B, T].

    Rows ``i >= num_nodes[b]`` are padding: their mask holds only their own bit, their depth is 0.
    ``check=False`` skips the value checks (tree rules, ``num_nodes`` range) that need a host sync;
    the kernels never loop on malformed input, but its output is then unspecified.
    """
    checks.tensor("parents", parents, dtype=torch.int32, rank=2)
    checks.nonempty("parents", parents, 1, "node (T >= 1)")
    num_nodes = checks.tree_nodes(parents, num_nodes, check)
    return resolve("build_tree_mask", parents.device, backend)(parents, num_nodes)


register("build_tree_mask", "torch")(ref.build_tree_mask)


@register_compiled("build_tree_mask")
def _compiled(ns, parents, num_nodes):
    return ns.build_tree_mask(parents, num_nodes)


@register("build_tree_mask", "triton")
def _build_tree_mask_triton(parents, num_nodes):
    from ...triton_kernels import tree_mask as kernels

    return kernels.build_tree_mask(parents, num_nodes)


if extension.cpu_ext is not None or extension.cuda_ext is not None:

    @torch.library.register_fake("specops::build_tree_mask")
    def _(parents, num_nodes):
        B, T = parents.shape
        return parents.new_empty((B, T, (T + 31) // 32)), parents.new_empty((B, T))
