"""Small valid keyword arguments of every public op (the base that tests/test_bad_input.py edits
into its cases). CPU tensors; fixed seeds."""
import torch

import specops
from specops.ops.linear import pack_weight

I32, F32 = torch.int32, torch.float32
NAN, INF = float("nan"), float("inf")


def gen():  # the fixed generator of every case
    return torch.Generator().manual_seed(7)


def _lp(*shape):  # log-distribution rows
    return torch.log_softmax(torch.randn(*shape, generator=gen()), -1)


TREE = [[-1, 0, 0, 1, 3], [-1, 0, 1, 1, 0]]  # two valid 5-node trees
VTREE = [[-1, 0, 1, 0], [-1, 0, 0, 2]]  # two valid 4-node trees (verify ops, V = 6)


def valid_args(op):
    """Small valid keyword arguments of ``op`` (CPU tensors; moved to the test device later).
    ``op[bitmask]``: with a grammar bitmask that disallows token 5 everywhere, where the logits hold
    NaN (target) and +inf (draft): the mask makes them -inf, so they are valid."""
    t = lambda x, d=I32: torch.tensor(x, dtype=d)
    if op.endswith("[bitmask]"):
        base = valid_args(op[:-len("[bitmask]")])
        base.update(bitmask=specops.pack_mask(torch.arange(6) != 5).expand(2, 4, 1).contiguous())
        base["target_logits"][..., 5] = NAN
        if "draft_logits" in base:
            base["draft_logits"][..., 5] = INF
        return base
    if op == "warp_probs":
        return dict(logits=torch.randn(2, 7, generator=gen()), temperature=t([0.5, 1.0], F32),
                    top_k=t([0, 3]), top_p=t([0.9, 1.0], F32))
    if op == "build_tree_mask":
        return dict(parents=t(TREE), num_nodes=t([5, 4]))
    if op == "tree_attention":
        mask, _ = specops.build_tree_mask(t([[-1, 0, 1], [-1, 0, 0]]), backend="torch")
        return dict(q=torch.randn(2, 3, 4, 8, generator=gen()), k_cache=torch.randn(2, 2, 16, 8, generator=gen()),
                    v_cache=torch.randn(2, 2, 16, 8, generator=gen()), prefix_lens=t([5, 0]), block_lens=t([3, 2]),
                    mask=mask, q_lens=t([3, 2]))
    if op == "kv_compact":
        return dict(k_cache=torch.randn(2, 2, 2, 16, 4, generator=gen()), v_cache=torch.randn(2, 2, 2, 16, 4),
                    prefix_lens=t([3, 5]), accept_idx=t([[0, 2, 3], [0, 1, 4]]), accept_lens=t([3, 2]))
    if op == "kv_compact_paged":  # sequence 0 moves row 5 to 4, sequence 1 row 6 to 5: both in their page 1
        return {"k_pages": torch.randn(2, 6, 4, 3, 4, generator=gen()), "v_pages": torch.randn(2, 6, 4, 3, 4),
                "page_table": t([[5, 0, 2], [1, 3, 4]]), "prefix_lens": t([2, 4]),
                "accept_idx": t([[0, 1, 3], [0, 2, 6]]), "accept_lens": t([3, 2])}
    if op in ("verify_greedy", "verify_tree"):
        base = dict(tokens=t([[0, 1, 2, 3], [0, 4, 5, 1]]), parents=t(VTREE), num_nodes=t([4, 3]))
        if op == "verify_greedy":
            return dict(base, target_logits=torch.randn(2, 4, 6, generator=gen()))
        return dict(base, target_probs=_lp(2, 4, 6).exp(), draft_probs=_lp(2, 4, 6).flip(-1).exp(),
                    uniforms=torch.rand(2, 4, 2, generator=gen()), mode="mss")
    if op == "verify_tree_logits":
        return dict(tokens=t([[0, 1, 2, 3], [0, 4, 5, 1]]), parents=t(VTREE), num_nodes=t([4, 3]),
                    target_logits=torch.randn(2, 4, 6, generator=gen()), uniforms=torch.rand(2, 4, 2, generator=gen()),
                    temperature=t([0.7, 1.0], F32), top_k=t([0, 3]), top_p=t([0.9, 1.0], F32),
                    draft_logits=torch.randn(2, 4, 6, generator=gen()).flip(-1), draft_temperature=t([1.0, 0.5], F32),
                    draft_top_k=t([2, 0]), draft_top_p=t([1.0, 0.8], F32), mode="mss")
    if op == "verify_joint":
        return dict(draft_tokens=t([[1, 2, 3], [5, 0, 4]]), target_logprobs=_lp(2, 4, 6),
                    draft_joint_logprobs=-torch.rand(2, 3, generator=gen()), tau=t([0.5, 0.25], F32),
                    uniforms=torch.rand(2, generator=gen()))
    if op == "verify_joint_logits":
        return dict(draft_tokens=t([[1, 2, 3], [5, 0, 4]]), target_logits=torch.randn(2, 4, 6, generator=gen()),
                    draft_joint_logprobs=-torch.rand(2, 3, generator=gen()).cumsum(-1), tau=t([0.5, 0.25], F32),
                    uniforms=torch.rand(2, generator=gen()), temperature=t([0.7, 1.0], F32), top_k=t([0, 3]),
                    top_p=t([0.9, 1.0], F32), bonus_temperature=t([1.0, 0.5], F32), bonus_top_k=t([2, 0]),
                    bonus_top_p=t([1.0, 0.8], F32), num_nodes=t([4, 2]))
    if op == "apply_token_bitmask":
        return dict(logits=torch.randn(2, 3, 40, generator=gen()), bitmask=t([[[-1, 255]] * 3, [[1, 0]] * 3]))
    if op == "topn_expand":
        return dict(parent_scores=-torch.rand(2, 3, generator=gen()), child_logprobs=_lp(2, 3, 7), n=4)
    if op == "linear":
        return {"x": torch.randn(3, 5, generator=gen()), "weight": torch.randn(4, 5), "bias": torch.randn(4)}
    if op == "linear[packed]":  # bf16, with the cpp backend's packed copy of the weight
        base = {k: v.bfloat16() for k, v in valid_args("linear").items()}
        return {**base, "packed": pack_weight(base["weight"])}
    assert op == "select_topn_subtree"
    return dict(parents=t(TREE), scores=-torch.rand(2, 5, generator=gen()).cumsum(-1), n=3, num_nodes=t([5, 4]))
