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


def random_accept(B, A, *, generator=None, device="cpu", pattern="random", max_len=None):
    """Accepted node lists of a draft block of ``A`` nodes, one per sequence.

    Shape: -> accept_idx int32 [B, A], accept_lens int32 [B]. ``pattern``: ``random`` (a random
    increasing subset of ragged length in [0, max_len or A], usually rooted at 0), ``all`` (every node),
    ``last`` (only node A-1), ``alternating`` (0, 2, 4, ...), ``shift`` (1, 2, ..., A-1: every
    destination is the source of the previous move). Padding entries are garbage on purpose."""
    idx = torch.randint(-3, 2 * A + 3, (B, A), generator=generator)
    lens = torch.zeros(B, dtype=torch.int64)
    top = A if max_len is None else min(max_len, A)
    for b in range(B):
        if pattern == "all":
            chosen = torch.arange(A)
        elif pattern == "last":
            chosen = torch.tensor([A - 1])
        elif pattern == "alternating":
            chosen = torch.arange(0, A, 2)
        elif pattern == "shift":
            chosen = torch.arange(1, A)
        elif pattern == "random":
            n = int(torch.randint(0, top + 1, (1,), generator=generator))
            perm = torch.randperm(A, generator=generator)[:n]
            if n and float(torch.rand(1, generator=generator)) < 0.7:
                perm[0] = 0 if 0 not in perm[1:] else perm[0]
            chosen = perm.unique(sorted=True)
        else:
            raise ValueError(f"pattern must be random, all, last, alternating or shift, got {pattern!r}")
        idx[b, : len(chosen)] = chosen
        lens[b] = len(chosen)
    return idx.to(torch.int32).to(device), lens.to(torch.int32).to(device)
