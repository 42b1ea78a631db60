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


def pack_mask(visible):
    """Packs a boolean visibility matrix into the int32 word format.

    Shape: visible bool [..., N] -> int32 [..., ceil(N/32)]."""
    n = visible.shape[-1]
    words = (n + 31) // 32
    padded = torch.zeros(*visible.shape[:-1], words * 32, dtype=torch.int64, device=visible.device)
    padded[..., :n] = visible.to(torch.int64)
    weights = torch.ones(32, dtype=torch.int64, device=visible.device) << torch.arange(32, device=visible.device)
    packed = (padded.view(*visible.shape[:-1], words, 32) * weights).sum(-1)
    # Word values >= 2**31 wrap to negative int32: the bit pattern is what matters.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_mask(mask, n):
    """Inverse of :func:`pack_mask`. Shape: mask int32 [..., W] -> bool [..., n] (n <= 32 W)."""
    bits = torch.arange(32, device=mask.device)
    out = ((mask.to(torch.int64)[..., :, None] >> bits) & 1).bool()
    return out.flatten(-2)[..., :n]


@register("build_tree_mask", "torch")
def _build_tree_mask_torch(parents, num_nodes):
    # The spec: node i sees what its parent sees, plus itself, filled in topological order.
    B, T = parents.shape
    dev = parents.device
    rows = torch.arange(B, device=dev)
    visible = torch.zeros(B, T, T, dtype=torch.bool, device=dev)
    depth = torch.zeros(B, T, dtype=torch.int32, device=dev)
    for i in range(T):
        is_child = (i > 0) & (i < num_nodes)
        parent = parents[:, i].clamp(0, max(i - 1, 0)).long()
        visible[:, i] = visible[rows, parent] & is_child[:, None]
        visible[:, i, i] = True
        depth[:, i] = torch.where(is_child, depth[rows, parent] + 1, 0)
    return pack_mask(visible), depth


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
