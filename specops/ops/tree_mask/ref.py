"""The torch reference of build_tree_mask, and the mask's word format (:func:`pack_mask` /
:func:`unpack_mask`: bit ``j % 32`` of int32 word ``j // 32``) that tree_attention and the token
bitmasks read."""
import torch


def pack_mask(visible):
    """Packs boolean visibility into the word format. Shape: bool [..., N] -> int32 [..., ceil(N/32)]."""
    padded = torch.nn.functional.pad(visible.long(), (0, -visible.shape[-1] % 32))  # whole words
    packed = (padded.unflatten(-1, (-1, 32)) << torch.arange(32, device=visible.device)).sum(-1)
    # Word values >= 2**31 wrap to negative int32: the bit pattern is what matters.
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_mask(mask, n):
    """Inverse of :func:`pack_mask`. Shape: mask int32 [..., W] -> bool [..., n] (n <= 32 W)."""
    bits = (mask.long()[..., None] >> torch.arange(32, device=mask.device)) & 1  # [..., W, 32]
    return bits.bool().flatten(-2)[..., :n]


def build_tree_mask(parents, num_nodes):
    """The spec: node i sees what its parent sees, plus itself, filled in topological order.
    Shape: parents int32 [B, T], num_nodes int32 [B] -> mask int32 [B, T, ceil(T/32)], depth int32 [B, T]."""
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
