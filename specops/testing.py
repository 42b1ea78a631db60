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


def random_verify_case(B, T, V, *, generator=None, device="cpu", chain=False, match=0.7, sharpness=3.0):
    """A ragged batch of draft trees with target/draft rows, for the verification ops.

    Target logits are ``sharpness * N(0, 1)``; draft rows are the softmax of the target logits plus
    noise (a correlated but different proposer). A node's token is, with probability ``match``, the
    argmax of its parent's target row (so greedy paths go deep), else a draw from its own draft row.
    Padding entries (``i >= num_nodes[b]``) hold garbage tokens and parents on purpose.

    Shape: -> dict of tokens, parents int32 [B, T]; num_nodes int32 [B]; target_logits,
    target_probs, draft_probs fp32 [B, T, V]; uniforms fp32 [B, T, 2].
    """
    g = generator
    num_nodes = random_num_nodes(B, T, generator=g)
    parents = random_parents(B, T, num_nodes=num_nodes, generator=g, max_children=1 if chain else None)
    logits = torch.randn(B, T, V, generator=g) * sharpness
    draft = (logits + torch.randn(B, T, V, generator=g) * sharpness).softmax(-1)
    drawn = torch.multinomial(draft.reshape(B * T, V), 1, generator=g).reshape(B, T)
    par = parents.long().clamp(0, T - 1)
    greedy = logits.argmax(-1).gather(1, par)
    tokens = torch.where(torch.rand(B, T, generator=g) < match, greedy, drawn)
    pad = torch.arange(T)[None, :] >= num_nodes[:, None]
    tokens[pad] = torch.randint(-5, V + 5, (int(pad.sum()),), generator=g)
    tokens[:, 0] = torch.randint(0, V, (B,), generator=g)
    case = dict(tokens=tokens.to(torch.int32), parents=parents, num_nodes=num_nodes, target_logits=logits,
                target_probs=logits.softmax(-1), draft_probs=draft, uniforms=torch.rand(B, T, 2, generator=g))
    return {k: v.to(device) for k, v in case.items()}
