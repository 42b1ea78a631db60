"""verify_greedy / verify_tree / verify_joint: opcheck of the three schemas, torch.compile(fullgraph=True)
over the cpp path. Their bad input: the battery of tests/test_bad_input.py."""
import pytest
import torch
from _op_checks import assert_same, needs_cpp

import specops
from specops.ops.verify import MODES
from specops.testing import random_verify_case

I32 = torch.int32


def _joint_args():
    """verify_joint's (draft_tokens, target_logprobs, draft_joint_logprobs, uniforms): B = 2, g = 3, V = 6."""
    g = torch.Generator().manual_seed(4)
    lp = torch.log_softmax(torch.randn(2, 4, 6, generator=g), -1)
    tokens = torch.randint(0, 6, (2, 3), generator=g, dtype=I32)
    return tokens, lp, -torch.rand(2, 3, generator=g), torch.rand(2, generator=g)


# ---- registration -----------------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("mode", MODES)
def test_opcheck_verify_tree(mode):
    c = random_verify_case(3, 9, 13, generator=torch.Generator().manual_seed(6))
    torch.library.opcheck(torch.ops.specops.verify_tree.default,
                          (c["tokens"], c["parents"], c["target_probs"], c["uniforms"],
                           c["draft_probs"] if mode != "mss_pointmass" else None, c["num_nodes"], mode))


@needs_cpp
def test_opcheck_verify_greedy_and_joint():
    c = random_verify_case(3, 9, 13, generator=torch.Generator().manual_seed(7))
    mask = specops.pack_mask(torch.rand(3, 9, 13, generator=torch.Generator().manual_seed(8)) < 0.5)
    tree, x, n = (c["tokens"], c["parents"]), c["target_logits"], c["num_nodes"]
    for args in [(*tree, x, n), (*tree, x.bfloat16(), n), (*tree, x, n, mask)]:
        torch.library.opcheck(torch.ops.specops.verify_greedy.default, args)
    tokens, lp, lq, u = _joint_args()
    log_tau = torch.log(torch.full((2,), 0.3))
    torch.library.opcheck(torch.ops.specops.verify_joint.default, (tokens, lp, lq, log_tau, u))


@needs_cpp
def test_torch_compile_fullgraph():
    c = random_verify_case(4, 12, 50, generator=torch.Generator().manual_seed(8))

    def step(tok, par, P, U, Q, n, logits, jt, lp, lq, ju):
        idx, lens, bonus = specops.verify_tree(tok, par, P, U, draft_probs=Q, mode="mss", num_nodes=n, check=False,
                                               backend="cpp")
        gidx, glens, gbonus = specops.verify_greedy(tok, par, logits, n, check=False, backend="cpp")
        jidx, jlens, jbonus = specops.verify_joint(jt, lp, lq, 0.3, ju, check=False, backend="cpp")
        return idx, lens + glens, bonus * 2, gidx, gbonus, jidx, jlens, jbonus

    args = (c["tokens"], c["parents"], c["target_probs"], c["uniforms"], c["draft_probs"], c["num_nodes"],
            c["target_logits"], *_joint_args())
    assert_same(torch.compile(step, fullgraph=True)(*args), step(*args))
