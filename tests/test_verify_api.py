"""verify_greedy / verify_tree / verify_joint: bad input raises naming the argument (inputs left
untouched), opcheck of the three schemas, torch.compile(fullgraph=True) over the cpp path."""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.ops.verify import MODES
from specops.testing import random_verify_case

I32 = torch.int32


# ---- errors -----------------------------------------------------------------------------------------

def _base(device):
    c = random_verify_case(2, 5, 7, generator=torch.Generator().manual_seed(2), device=device)
    c["num_nodes"][:] = 5
    c["tokens"][:, 1:] = c["tokens"][:, 1:].clamp(0, 6)
    c["parents"] = torch.tensor([[-1, 0, 0, 1, 2]] * 2, dtype=I32, device=device)
    return c


def _set(key, index, value):
    def edit(c):
        t = c[key].clone()
        t[index] = value
        return t
    return edit


TREE_ERRORS = [
    ("tokens", lambda c: c["tokens"].long(), TypeError, "tokens must have dtype torch.int32"),
    ("tokens", lambda c: c["tokens"][0], ValueError, "tokens must have rank 2"),
    ("tokens", lambda c: c["tokens"].tolist(), TypeError, "tokens must be a torch.Tensor"),
    ("parents", lambda c: c["parents"][:, :3], ValueError, r"parents must have shape \[2, 5\]"),
    ("target_probs", lambda c: c["target_probs"].double(), TypeError, "target_probs must have dtype torch.float32"),
    ("target_probs", lambda c: c["target_probs"][:, :4], ValueError, r"target_probs must have shape \[B, T, V\]"),
    ("uniforms", lambda c: c["uniforms"][..., :1], ValueError, r"uniforms must have shape \[2, 5, 2\]"),
    ("draft_probs", lambda c: c["draft_probs"][..., :6], ValueError, r"draft_probs must have shape \[2, 5, 7\]"),
    ("draft_probs", lambda c: None, ValueError, "draft_probs is required for mode='mss'"),
    ("num_nodes", lambda c: c["num_nodes"].long(), TypeError, "num_nodes must have dtype torch.int32"),
    ("num_nodes", _set("num_nodes", 1, 0), ValueError, r"num_nodes must lie in \[1, T=5\]"),
    ("parents", _set("parents", (0, 0), 0), ValueError, r"parents\[0, 0\] must be -1"),
    ("parents", _set("parents", (1, 2), 2), ValueError, r"parents\[1, 2\] must satisfy -1 < parent < 2"),
    ("tokens", _set("tokens", (0, 1), 7), ValueError, r"tokens\[0, 1\] must lie in \[0, V=7\), got 7"),
    ("tokens", _set("tokens", (1, 4), -1), ValueError, r"tokens\[1, 4\] must lie in \[0, V=7\), got -1"),
    ("uniforms", _set("uniforms", (0, 0, 0), 1.0), ValueError, r"uniforms must lie in \[0, 1\)"),
    ("uniforms", _set("uniforms", (1, 3, 1), float("nan")), ValueError, r"uniforms must lie in \[0, 1\)"),
    ("target_probs", _set("target_probs", (0, 0, 3), float("nan")), ValueError, r"target_probs\[0, 0\] must be finite"),
    ("target_probs", _set("target_probs", (1, 2, 0), 1.5), ValueError, r"target_probs\[1, 2\] must sum to 1"),
    ("draft_probs", _set("draft_probs", (1, 3, 2), -0.25), ValueError, r"draft_probs\[1, 3\] must be finite and"),
]


@pytest.mark.parametrize("key, edit, exc, match", TREE_ERRORS)
def test_verify_tree_bad_input_raises_naming_the_argument_and_leaves_inputs_untouched(backend, device, key, edit,
                                                                                    exc, match):
    c = _base(device)
    before = {k: v.clone() for k, v in c.items()}
    bad = dict(c, **{key: edit(c)})
    with pytest.raises(exc, match=match):
        specops.verify_tree(bad["tokens"], bad["parents"], bad["target_probs"], bad["uniforms"],
                            draft_probs=bad["draft_probs"], mode="mss", num_nodes=bad["num_nodes"], backend=backend)
    for k, v in c.items():
        assert torch.equal(v, before[k]), k


def test_verify_tree_bad_mode_and_padding_rows_are_not_checked(device):
    c = _base(device)
    with pytest.raises(ValueError, match="mode must be one of"):
        specops.verify_tree(c["tokens"], c["parents"], c["target_probs"], c["uniforms"], mode="greedy")
    c["num_nodes"][:] = 3
    c["tokens"][:, 3:] = 99
    c["target_probs"][:, 3:] = torch.nan
    specops.verify_tree(c["tokens"], c["parents"], c["target_probs"], c["uniforms"], mode="mss_pointmass",
                        num_nodes=c["num_nodes"])


@pytest.mark.parametrize("edit, exc, match", [
    (lambda c: dict(c, target_logits=c["target_logits"].int()), TypeError, "target_logits must have dtype"),
    (lambda c: dict(c, target_logits=c["target_logits"][:, :, :0]), ValueError, r"target_logits must have shape"),
    (lambda c: dict(c, target_logits=_set("target_logits", (1, 1, 1), float("nan"))(c)), ValueError,
     r"target_logits\[1, 1\] must not contain NaN or \+inf"),
    (lambda c: dict(c, tokens=_set("tokens", (0, 3), 9)(c)), ValueError, r"tokens\[0, 3\] must lie in \[0, V=7\)"),
    (lambda c: dict(c, tokens=torch.zeros(2, 0, dtype=I32)), ValueError, "at least one node"),
])
def test_verify_greedy_bad_input_raises(backend, device, edit, exc, match):
    c = edit(_base(device))
    with pytest.raises(exc, match=match):
        specops.verify_greedy(c["tokens"], c["parents"], c["target_logits"], c["num_nodes"], backend=backend)


def _joint_args(device):
    g = torch.Generator().manual_seed(4)
    lp = torch.log_softmax(torch.randn(2, 4, 6, generator=g), -1)
    return dict(draft_tokens=torch.randint(0, 6, (2, 3), generator=g, dtype=I32), target_logprobs=lp,
                draft_joint_logprobs=-torch.rand(2, 3, generator=g), tau=0.2, uniforms=torch.rand(2, generator=g))


@pytest.mark.parametrize("key, value, exc, match", [
    ("draft_tokens", torch.zeros(2, 3, dtype=torch.int64), TypeError, "draft_tokens must have dtype torch.int32"),
    ("target_logprobs", torch.zeros(2, 3, 6), ValueError, r"target_logprobs must have shape \[B, g \+ 1, V\]"),
    ("draft_joint_logprobs", torch.zeros(2, 4), ValueError, r"draft_joint_logprobs must have shape \[2, 3\]"),
    ("uniforms", torch.zeros(2, 1), ValueError, r"uniforms must have rank 1"),
    ("uniforms", torch.tensor([0.5, 1.0]), ValueError, r"uniforms must lie in \[0, 1\)"),
    ("tau", 1.5, ValueError, r"tau must lie in \[0, 1\]"),
    ("tau", "0.5", TypeError, "tau must be a float or a torch.Tensor"),
    ("tau", torch.tensor([0.5, -0.1]), ValueError, r"tau must lie in \[0, 1\]"),
    ("draft_tokens", torch.tensor([[0, 1, 6], [0, 0, 0]], dtype=I32), ValueError,
     r"draft_tokens must lie in \[0, V=6\), got 6 at \[0, 2\]"),
    ("target_logprobs", torch.zeros(2, 4, 6), ValueError, r"target_logprobs\[0, 0\] must be a log-distribution"),
    ("draft_joint_logprobs", torch.tensor([[-1.0, 0.5, -2.0]] * 2), ValueError, "draft_joint_logprobs must be"),
])
def test_verify_joint_bad_input_raises(backend, key, value, exc, match):
    args = dict(_joint_args("cpu"), **{key: value})
    with pytest.raises(exc, match=match):
        specops.verify_joint(**args, backend=backend)


# ---- registration -----------------------------------------------------------------------------------

needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0], reason=_backend.available("cpp")[1])


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
