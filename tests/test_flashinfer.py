"""The optional FlashInfer provider of tree_attention: equal to the torch reference where FlashInfer
and a CUDA device exist; everywhere, what dispatch makes of it."""
import importlib.util

import pytest
import torch

import specops
from specops import backend as _backend
from specops.integrations import flashinfer as fi
from specops.testing import random_parents

HAS = importlib.util.find_spec("flashinfer") is not None and torch.cuda.is_available()


def case(D=128, dtype=torch.bfloat16, B=3, Tq=9, Hq=8, Hkv=2, S=300, device="cpu"):
    g = torch.Generator().manual_seed(D + B)
    q, k, v = (torch.randn(*n, generator=g).to(device, dtype)
               for n in ((B, Tq, Hq, D), (B, Hkv, S, D), (B, Hkv, S, D)))
    mask, _ = specops.build_tree_mask(random_parents(B, Tq, generator=g).to(device))
    i32 = lambda x: torch.tensor(x, dtype=torch.int32, device=device)
    return q, k, v, i32([100, 0, 250]), i32([9, 5, 7]), mask


def test_availability_says_why():
    ok, why = _backend.available("flashinfer", "cpu")
    assert not ok and ("not installed" in why or "CUDA tensors" in why)


def test_supports_names_what_it_cannot_take():
    assert "head dim D=96" in fi.supports(*case(D=96), None, 0.1)
    assert "fp16/bf16" in fi.supports(*case(dtype=torch.float32), None, 0.1)
    assert fi.supports(*case(), None, 0.1) is None


def test_the_cuda_preference_puts_our_kernels_before_flashinfer():
    assert _backend.preference("tree_attention", "cuda") == ("triton", "cuda", "flashinfer", "torch")


@pytest.mark.skipif(not HAS, reason="flashinfer and a CUDA device needed")
@pytest.mark.parametrize("D", fi.HEAD_DIMS)
@pytest.mark.parametrize("dtype", fi.DTYPES)
def test_matches_the_reference(D, dtype):
    args = case(D=D, dtype=dtype, device="cuda")
    q_lens = torch.tensor([9, 4, 0], dtype=torch.int32, device="cuda")
    got = specops.tree_attention(*args, q_lens=q_lens, backend="flashinfer")
    want = specops.tree_attention(*args, q_lens=q_lens, backend="torch")
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
