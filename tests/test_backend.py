"""The dispatch rule: explicit requests, per-op preferences, capability checks that let the automatic
choice fall through and make an explicit request raise, default_backend's contract, the report."""
import pytest
import torch
from test_kv_compact import i32

import specops
from specops import backend as _backend
from specops.backend_report import report


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
    assert specops.default_backend("verify_tree", "cuda") == "triton"  # docs/testing.md, "On a GPU"
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
