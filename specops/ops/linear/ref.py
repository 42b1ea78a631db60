"""The torch reference of specops.linear: the spec of the values, batch-invariant by construction.

Every output element is reduced in blocks of 8 along K: 8 lane partial sums, lane ``l`` taking
``k = 8 j + l`` in the order of ``j`` (K zero-padded to a multiple of 8), then the lanes combined by halving:
lane ``l`` plus lane ``l + 4``, then ``l + 2``, then ``l + 1`` (docs/batch_invariance.md). Only elementwise
tensor operations are used (products and sums of broadcast tensors, never a matmul or a reduction kernel),
so the value of an element cannot depend on how many rows share the call or on the thread count.
"""
import torch

LANES = 8


def lanes_to_scalar(p):
    """The fixed combination of 8 lane partial sums. Shape: p [..., 8] fp32 -> [...] fp32."""
    p = p[..., :4] + p[..., 4:]  # [..., 4]
    p = p[..., :2] + p[..., 2:]  # [..., 2]
    return p[..., 0] + p[..., 1]


def linear(x, weight, bias):
    """Shape: x [M, K], weight [N, K], bias [N] or None -> [M, N] in x's dtype."""
    M, K = x.shape
    N = weight.shape[0]
    blocks = -(-K // LANES)
    pad = blocks * LANES - K
    xf = torch.nn.functional.pad(x.float(), (0, pad)).view(M, blocks, LANES)  # [M, J, 8]
    wf = torch.nn.functional.pad(weight.float(), (0, pad)).view(N, blocks, LANES)  # [N, J, 8]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    # Row by row: an [N, 8] accumulator per row keeps memory at N * 8 floats.
    for m in range(M):
        acc = torch.zeros(N, LANES, dtype=torch.float32, device=x.device)
        for j in range(blocks):
            acc = acc + wf[:, j] * xf[m, j]
        y = lanes_to_scalar(acc)  # [N]
        if bias is not None:
            y = y + bias.float()
        out[m] = y.to(x.dtype)
    return out
