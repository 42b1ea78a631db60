"""Generators of valid random inputs, shared by the tests and the benchmarks."""
import torch


def random_parents(B, T, *, num_nodes=None, generator=None, device="cpu", max_children=None):
    """Random topologically ordered trees: ``parents[b, i]`` uniform in ``[0, i)``.

    Shape: -> int32 [B, T]. Padding entries (``i >= num_nodes[b]``) are filled with garbage on
    purpose (values a kernel must ignore). ``max_children=1`` gives chains."""
    i = torch.arange(T)
    u = torch.rand(B, T, generator=generator)
    parents = (u * i.clamp(min=1)).long().clamp(max=(i - 1).clamp(min=0))
    if max_children == 1:
        parents = (i - 1).expand(B, T).clone()
    parents[:, 0] = -1
    if num_nodes is not None:
        pad = i[None, :] >= num_nodes.cpu()[:, None]
        parents[pad] = torch.randint(-5, T + 5, (int(pad.sum()),), generator=generator)
    return parents.to(torch.int32).to(device)


def random_num_nodes(B, T, *, generator=None, device="cpu"):
    """Ragged valid node counts in [1, T], with at least one full row. Shape: -> int32 [B]."""
    n = torch.randint(1, T + 1, (B,), generator=generator)
    n[0] = T
    return n.to(torch.int32).to(device)
