"""The torch reference of warp_probs: the warping rule of :mod:`specops.ops.sampling` (its module
docstring states it, ties and limits included); the fp32 top-p mass here is summed in fp64."""
import torch

MIN_TEMPERATURE = 2.0**-126  # below it (0 and denormals) a row is greedy


def warp_probs(logits, temperature, top_k, top_p):
    """The spec, vectorised over rows with one sort: every threshold is a value of z. Shape: logits
    [N, V], temperature / top_p fp32 [N], top_k int32 [N] (checked) -> probs fp32 [N, V]."""
    V = logits.shape[1]
    greedy = ~(temperature >= MIN_TEMPERATURE)
    x = logits.float()
    z = (x - x.max(dim=-1, keepdim=True).values) / torch.where(greedy, 1.0, temperature)[:, None]
    z_sorted, order = z.sort(dim=-1, descending=True)
    # top-k: the k-th largest value; ties with it are kept.
    k = torch.where((top_k > 0) & (top_k < V), top_k, V).long()
    keep = z >= z_sorted.gather(1, (k - 1)[:, None])
    # top-p over the survivors: the first token (by decreasing z) where the mass reaches p.
    probs_sorted = torch.softmax(z.masked_fill(~keep, float("-inf")), dim=-1).gather(1, order).double()
    cum = probs_sorted.cumsum(dim=-1)
    crossing = (cum < top_p.double()[:, None] * cum[:, -1:]).sum(dim=-1).clamp(max=V - 1)
    cutoff = z_sorted.gather(1, crossing[:, None])
    keep &= (top_p >= 1)[:, None] | (z >= cutoff)
    probs = torch.softmax(z.masked_fill(~keep, float("-inf")), dim=-1)
    one_hot = torch.zeros_like(probs).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], one_hot, probs)
