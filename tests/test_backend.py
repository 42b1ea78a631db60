"""The dispatch rule: explicit requests, per-op preferences, capability checks that let the automatic
choice fall through and make an explicit request raise, default_backend's contract, the report; the
optional FlashInfer provider of tree_attention: what dispatch makes of it everywhere, equal to the
torch reference where FlashInfer and a CUDA device exist."""
import importlib.util

import pytest
import torch
from test_kv_compact import i32

import specops
from specops import backend as _backend
from specops.backend_report import report
from specops.integrations import flashinfer as fi
from specops.testing import random_parents


def attention_args(D=8, B=1, Hkv=1):
    q = torch.randn(B, 2, Hkv, D)
    k = torch.randn(B, Hkv, 5, D)
    mask, _ = specops.build_tree_mask(i32([[-1, 0]] * B))
    return q, k, k.clone(), i32([3] * B), i32([2] * B), mask


def test_default_backend_contract():
    assert specops.default_backend("tree_attention", "cpu") == "cpp"
    assert specops.default_backend("tree_attention", "cuda") == "triton"  # tensor cores, via Triton
    assert specops.default_backend("kv_compact", "cuda") == "cuda"
    assert specops.default_backend("verify_tree", "cpu") == "cpp"
    assert specops.default_backend("verify_tree", "cuda") == "cuda"  # passed on an H200 (docs/testing.md)
    with pytest.raises(ValueError, match="op_name must be one of .*got 'nope'"):
        specops.default_backend("nope", "cpu")
    with pytest.raises(ValueError, match="device_type must be one of .*got 'tpu'"):
        specops.default_backend("kv_compact", "tpu")


def test_default_backend_never_picks_a_test_only_backend():
    for op in _backend.ops():
        for dev in ("cpu", "cuda"):
            assert specops.default_backend(op, dev) not in _backend.TEST_ONLY


def test_an_incapable_backend_is_skipped_with_the_reason_and_an_explicit_request_raises(monkeypatch):
    monkeypatch.setitem(_backend._SUPPORTS, ("tree_attention", "cpp"), lambda *a: f"D={a[0].shape[3]} too big")
    args = attention_args()
    want = specops.tree_attention(*args, backend="torch")
    assert torch.allclose(specops.tree_attention(*args), want)  # fell through to torch
    with pytest.raises(specops.BackendUnavailable, match=r"backend 'cpp' \(backend=\) cannot run this call: D=8 too big"):
        specops.tree_attention(*args, backend="cpp")
    with specops.use_backend("cpp"), pytest.raises(specops.BackendUnavailable, match="use_backend"):
        specops.tree_attention(*args)


def test_no_capable_backend_names_every_reason(monkeypatch):
    for name in ("cpp", "torch"):
        monkeypatch.setitem(_backend._SUPPORTS, ("tree_attention", name), lambda *a, n=name: f"{n} says no")
    with pytest.raises(specops.BackendUnavailable, match="no backend available on cpu .*cpp: cpp says no; torch: torch says no"):
        specops.tree_attention(*attention_args())


@pytest.mark.skipif("cudasim" not in _backend.COMPILED or not _backend.available("cudasim")[0], reason="no cudasim")
def test_cuda_kernel_limits_are_capabilities():
    with pytest.raises(specops.BackendUnavailable, match=r"head dim D=264 > 256"):
        specops.tree_attention(*attention_args(D=264), backend="cudasim")
    out = specops.tree_attention(*attention_args(D=264), backend="cpp")  # cpp takes any D
    assert out.shape[-1] == 264
    ps, cl = torch.zeros(1, 2), torch.randn(1, 2, 3000).log_softmax(-1)
    with pytest.raises(specops.BackendUnavailable, match=r"n=2049 > 2048"):
        specops.topn_expand(ps, cl, 2049, backend="cudasim")
    assert specops.topn_expand(ps, cl, 2049, backend="cpp")[0].shape == (1, 2049)


def test_the_report_lists_defaults_and_the_test_only_backend():
    text = report()
    assert "test-only (never chosen automatically): cudasim" in text
    line = next(x for x in text.splitlines() if x.startswith("tree_attention "))
    assert line.split()[1:3] == ["cpp", "triton"]


# ---- the FlashInfer provider of tree_attention --------------------------------------------------

def flashinfer_case(D=128, dtype=torch.bfloat16, B=3, Tq=9, Hq=8, Hkv=2, S=300, device="cpu"):
    g = torch.Generator().manual_seed(D + B)
    q, k, v = (torch.randn(*n, generator=g).to(device, dtype)
               for n in ((B, Tq, Hq, D), (B, Hkv, S, D), (B, Hkv, S, D)))
    mask, _ = specops.build_tree_mask(random_parents(B, Tq, generator=g).to(device))
    return q, k, v, i32([100, 0, 250], device), i32([9, 5, 7], device), mask


def test_flashinfer_availability_says_why():
    ok, why = _backend.available("flashinfer", "cpu")
    assert not ok and ("not installed" in why or "CUDA tensors" in why)


def test_flashinfer_supports_names_what_it_cannot_take():
    assert "head dim D=96" in fi.supports(*flashinfer_case(D=96), None, 0.1)
    assert "fp16/bf16" in fi.supports(*flashinfer_case(dtype=torch.float32), None, 0.1)
    assert fi.supports(*flashinfer_case(), None, 0.1) is None


def test_the_cuda_preference_puts_our_kernels_before_flashinfer():
    assert _backend.preference("tree_attention", "cuda") == ("triton", "cuda", "flashinfer", "torch")


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None or not torch.cuda.is_available(),
                    reason="flashinfer and a CUDA device needed")
@pytest.mark.parametrize("D", fi.HEAD_DIMS)
@pytest.mark.parametrize("dtype", fi.DTYPES)
def test_flashinfer_matches_the_reference(D, dtype):
    args = flashinfer_case(D=D, dtype=dtype, device="cuda")
    q_lens = i32([9, 4, 0], "cuda")
    got = specops.tree_attention(*args, q_lens=q_lens, backend="flashinfer")
    want = specops.tree_attention(*args, q_lens=q_lens, backend="torch")
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
