"""tree_attention's batch-invariant schedule (invariant=True) on the torch reference and cpp: every
valid row equals its AR view (specops.testing.ar_view) bit for bit; values match the reference;
paged equals contiguous; threads, ISA variants and batch composition change no bit; bad input.
docs/batch_invariance.md states the contract. The GPU backends have their own files
(test_tree_attention_invariant_triton.py, test_tree_attention_invariant_cuda.py)."""
import pytest
import torch
from torch.library import opcheck

import specops
from specops import backend as _backend
from specops.testing import ar_view, to_pages
from test_tree_attention import assert_close, make_case

CPU_TILE = 96  # csrc/cpu/tree_attention.cpp kTileN: prefixes around it cross a tile boundary


def _backends():
    out = ["torch"]
    if "cpp" in _backend.implementations("tree_attention") and _backend.available("cpp")[0]:
        out.append("cpp")
    return out


BACKENDS = _backends()
# (B, Tq, L, P, Hq, Hkv, D, kind, padded): odd head dims, GQA, ragged batches, q_lens padding,
# prefixes on both sides of the CPU tile and a block that spills into a second virtual tile.
CASES = [(3, 7, 9, CPU_TILE - 3, 6, 2, 24, "tree", True),
         (2, 5, 5, CPU_TILE, 4, 4, 64, "chain", False),
         (3, 6, 11, CPU_TILE + 1, 9, 3, 80, "dag", True),
         (1, 12, 40, 2 * CPU_TILE - 20, 2, 1, 67, "tree", False),
         (2, 4, 4, 0, 6, 3, 32, "tree", True)]


def _rows(kw, B, Tq):
    q_lens = kw["q_lens"]
    return [(b, i) for b in range(B) for i in range(Tq) if q_lens is None or i < int(q_lens[b])]


def _check_rows_equal_ar_view(backend, args, kw, B, Tq):
    out = specops.tree_attention(*args, backend=backend, invariant=True, **kw)
    for b, i in _rows(kw, B, Tq):
        for own in (True, False):
            alone = specops.tree_attention(*ar_view(*args, b, i, self_in_block=own), backend=backend, invariant=True)
            assert torch.equal(out[b, i], alone[0, 0]), (backend, b, i, own)
    if kw["q_lens"] is not None:
        for b in range(B):
            assert not out[b, int(kw["q_lens"][b]):].any()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", CASES)
def test_every_row_equals_its_ar_view_bit_for_bit(backend, dtype, case):
    B, Tq, L, P, Hq, Hkv, D, kind, padded = case
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=len(kind) + P)
    out = _check_rows_equal_ar_view(backend, args, kw, B, Tq)
    assert_close(out, specops.tree_attention(*args, backend="torch", **kw), dtype)


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
def test_cpp_every_isa_variant_keeps_the_property(monkeypatch, isa):
    if "cpp" not in BACKENDS:
        pytest.skip("cpp backend unavailable")
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for dtype in (torch.float32, torch.bfloat16):
        B, Tq, L, P, Hq, Hkv, D, kind, padded = CASES[2]
        args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=3)
        out = _check_rows_equal_ar_view("cpp", args, kw, B, Tq)
        assert_close(out, specops.tree_attention(*args, backend="torch", invariant=True, **kw), dtype)


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
@pytest.mark.parametrize("invariant", [False, True])
def test_cpp_narrow_items_on_every_isa_variant(monkeypatch, isa, invariant):
    # Items of <= 4 query rows (a decode step's GQA group, a 2-query block at G = 2, every item of the
    # invariant schedule at G <= 4) take the CPU kernel's narrow path (head dims in lanes): masked
    # block keys, prefixes across a tile, head dims with a tail past the last whole vector.
    if "cpp" not in BACKENDS:
        pytest.skip("cpp backend unavailable")
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for n, (B, Tq, L, P, Hq, Hkv, D, kind) in enumerate([(2, 1, 1, CPU_TILE + 54, 9, 3, 67, "chain"),
                                                         (3, 2, 9, CPU_TILE + 1, 4, 2, 40, "tree"),
                                                         (1, 4, 4, 5, 4, 4, 19, "dag")]):
        for dtype in (torch.float32, torch.bfloat16):
            args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=n == 1, seed=n)
            got = specops.tree_attention(*args, backend="cpp", invariant=invariant, **kw)
            assert_close(got, specops.tree_attention(*args, backend="torch", **kw), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_composition_threads_and_layout_change_no_bit(backend):
    B, Tq, L, P, Hq, Hkv, D, kind, padded = CASES[0]
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, torch.bfloat16, kind=kind, padded=padded, seed=11)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = specops.tree_attention(*args, backend=backend, invariant=True, **kw)
        torch.set_num_threads(2)
        two = specops.tree_attention(*args, backend=backend, invariant=True, **kw)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
    # Each sequence alone (its own batch of 1, its own cache length) and the rows reversed.
    for b in range(B):
        sub = [a[b:b + 1] for a in args]
        sub[1], sub[2] = sub[1][:, :, :int(args[3][b] + args[4][b])], sub[2][:, :, :int(args[3][b] + args[4][b])]
        ql = None if kw["q_lens"] is None else kw["q_lens"][b:b + 1]
        alone = specops.tree_attention(*sub, q_lens=ql, backend=backend, invariant=True)
        assert torch.equal(alone[0], one[b])
    q, k, v, p, n, mask = args
    rev = specops.tree_attention(q.flip(1), k, v, p, n, mask.flip(1), backend=backend, invariant=True)
    full = specops.tree_attention(*args, backend=backend, invariant=True)
    assert torch.equal(rev.flip(1), full)
    # Paged: the same bits as contiguous.
    (kp, vp), table = to_pages(torch.stack([k, v]), 16, generator=torch.Generator().manual_seed(0))
    paged = specops.tree_attention_paged(q, kp, vp, table, p, n, mask, q_lens=kw["q_lens"], backend=backend,
                                         invariant=True)
    assert torch.equal(paged, one)


def test_plan_runs_the_invariant_schedule_unsplit():
    backend = BACKENDS[-1]
    B, Tq, L, P, Hq, Hkv, D, kind, padded = CASES[3]
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, torch.float32, kind=kind, seed=5)
    q, k, v, p, n, mask = args
    plan = specops.TreeAttentionPlan(p, n, mask, head_dim=D, num_heads=Hq, num_kv_heads=Hkv, dtype=q.dtype,
                                     backend=backend, invariant=True, max_len=k.shape[2])
    assert plan.num_splits == 1 and plan.workspace is None
    assert torch.equal(plan.run(q, k, v), specops.tree_attention(*args, backend=backend, invariant=True))


def test_bad_input_names_the_argument():
    args, kw = make_case(1, 2, 3, 4, 2, 1, 8, torch.float32, kind="chain")
    with pytest.raises(TypeError, match="invariant must be a bool"):
        specops.tree_attention(*args, invariant=1)
    with pytest.raises(TypeError, match="invariant must be a bool"):
        (kp, vp), table = to_pages(torch.stack(args[1:3]), 4)
        specops.tree_attention_paged(args[0], kp, vp, table, *args[3:], invariant="yes")
    q, k, v, p, n, mask = args
    with pytest.raises(ValueError, match="num_splits must be None or 1 with invariant=True"):
        specops.TreeAttentionPlan(p, n, mask, head_dim=8, num_heads=2, num_kv_heads=1, dtype=q.dtype,
                                  invariant=True, num_splits=2)
    if "cpp" in BACKENDS:
        with pytest.raises(ValueError, match="invariant=True runs unsplit"):
            torch.ops.specops.tree_attention(q, k, v, p, n, mask, None, 0.5, 2, None, True)


@pytest.mark.skipif("cpp" not in BACKENDS, reason="cpp backend unavailable")
def test_opcheck_with_invariant():
    args, kw = make_case(2, 3, 5, 7, 4, 2, 16, torch.float32, kind="tree", padded=True)
    q, k, v, p, n, mask = args
    opcheck(torch.ops.specops.tree_attention.default, (q, k, v, p, n, mask, kw["q_lens"], 0.25, 1, None, True))
    (kp, vp), table = to_pages(torch.stack([k, v]), 4)
    opcheck(torch.ops.specops.tree_attention_paged.default,
            (q, kp, vp, table, p, n, mask, kw["q_lens"], 0.25, 1, None, True))
