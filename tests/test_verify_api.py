"""verify_greedy / verify_tree / verify_joint: opcheck of the three schemas, torch.compile(fullgraph=True)
over the cpp path. Their bad input: the battery of tests/test_bad_input.py."""
import pytest
import torch

import specops
from specops.ops.verify import MODES
from specops.testing import random_verify_case

from _op_checks import needs_cpp

I32 = torch.int32


def _joint_args(device):
    g = torch.Generator().manual_seed(4)
    lp = torch.log_softmax(torch.randn(2, 4, 6, generator=g), -1)
    return dict(draft_tokens=torch.randint(0, 6, (2, 3), generator=g, dtype=I32), target_logprobs=lp,
                draft_joint_logprobs=-torch.rand(2, 3, generator=g), tau=0.2, uniforms=torch.rand(2, generator=g))


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
    for dtype in (torch.float32, torch.bfloat16):
        torch.library.opcheck(torch.ops.specops.verify_greedy.default,
                              (c["tokens"], c["parents"], c["target_logits"].to(dtype), c["num_nodes"]))
    mask = specops.pack_mask(torch.rand(3, 9, 13, generator=torch.Generator().manual_seed(8)) < 0.5)
    torch.library.opcheck(torch.ops.specops.verify_greedy.default,
                          (c["tokens"], c["parents"], c["target_logits"], c["num_nodes"], mask))
    a = _joint_args("cpu")
    torch.library.opcheck(torch.ops.specops.verify_joint.default,
                          (a["draft_tokens"], a["target_logprobs"], a["draft_joint_logprobs"],
                           torch.log(torch.full((2,), 0.3)), a["uniforms"]))


@needs_cpp
def test_torch_compile_fullgraph():
    c = random_verify_case(4, 12, 50, generator=torch.Generator().manual_seed(8))
    a = _joint_args("cpu")

    def step(tok, par, P, U, Q, n, logits, jt, lp, lq, ju):
        idx, lens, bonus = specops.verify_tree(tok, par, P, U, draft_probs=Q, mode="mss", num_nodes=n, check=False,
                                               backend="cpp")
        gidx, glens, gbonus = specops.verify_greedy(tok, par, logits, n, check=False, backend="cpp")
        jidx, jlens, jbonus = specops.verify_joint(jt, lp, lq, 0.3, ju, check=False, backend="cpp")
        return idx, lens + glens, bonus * 2, gidx, gbonus, jidx, jlens, jbonus

    args = (c["tokens"], c["parents"], c["target_probs"], c["uniforms"], c["draft_probs"], c["num_nodes"],
            c["target_logits"], a["draft_tokens"], a["target_logprobs"], a["draft_joint_logprobs"], a["uniforms"])
    got = torch.compile(step, fullgraph=True)(*args)
    want = step(*args)
    for w, o in zip(want, got):
        assert torch.equal(w, o)
