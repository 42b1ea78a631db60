"""The torch reference of specops.linear (the spec of the values), batch-invariant by construction:
each output element is reduced in 8 lanes along K, then the lanes are combined by halving (the order
of docs/batch_invariance.md §specops.linear), with elementwise tensor operations only (never a matmul
or a reduction kernel), so its value cannot depend on how many rows share the call or on the threads."""
import torch

LANES = 8


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
        for j in range(blocks):  # lane l takes k = 8 j + l, in the order of j
            acc = acc + wf[:, j] * xf[m, j]
        acc = acc[:, :4] + acc[:, 4:]  # lane l plus lane l + 4, then l + 2, then l + 1
        acc = acc[:, :2] + acc[:, 2:]
        y = acc[:, 0] + acc[:, 1]  # [N]
        if bias is not None:
            y = y + bias.float()
        out[m] = y.to(x.dtype)
    return out
