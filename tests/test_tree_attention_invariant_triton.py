"""tree_attention(invariant=True) on the Triton backend (docs/batch_invariance.md, "Invariant
attention"): every valid row equals, bit for bit, the backend's own AR-view call of that row
(specops.testing.ar_view), in both AR forms (the last key as a one-row block, or all prefix), for
both layouts; values match the torch reference of the mode; the schedule is never split.

Run on conftest's device: compiled on a GPU, else interpreted on CPU (TRITON_INTERPRET=1), so small,
odd cases. The invariant schedule's key tiles (the decode entries of both tables) hold 32 keys for
fp32 and 64 for fp16/bf16: the prefixes below sit just before, on, and just past tile boundaries."""
import functools

import pytest
import torch

import specops
from specops import backend as _backend
from specops.testing import ar_view, to_pages
from test_tree_attention import assert_close, make_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # as conftest's device fixture
pytestmark = pytest.mark.skipif(
    "triton" not in _backend.implementations("tree_attention") or not _backend.available("triton", DEVICE)[0],
    reason="triton backend unavailable")

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
CASES = [  # B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded
    (3, 5, 9, 31, 6, 2, 24, F32, "tree", True),  # P = BLOCK_N - 1
    (3, 4, 40, 32, 4, 4, 80, F32, "dag", False),  # P = BLOCK_N, a block over two mask words (+1 spare)
    (3, 5, 12, 65, 6, 2, 64, BF16, "chain", True),  # P = BLOCK_N + 1
    (3, 3, 7, 133, 4, 4, 64, F16, "tree", False),  # P = 2 * BLOCK_N + 5
    (3, 4, 20, 69, 6, 2, 80, F32, "chain", True),  # P = 2 * BLOCK_N + 5, rows ending in several tiles
    (2, 3, 70, 5, 4, 2, 40, F32, "chain", False),  # block keys over three tiles and three mask words
]
IDS = [f"{c[7]}-{c[8]}-D{c[6]}-P{c[3]}".replace("torch.", "") for c in CASES]


def _triton(*args, **kw):
    return specops.tree_attention(*args, backend="triton", invariant=True, **kw)


@functools.cache
def _case(n):
    """(args, kw, the invariant block call's output) of CASES[n], computed once for every test."""
    B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded = CASES[n]
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=n, device=DEVICE)
    return args, kw, _triton(*args, **kw)


def _valid_rows(args, kw):
    B, Tq = args[0].shape[:2]
    q_lens = kw["q_lens"]
    return [(b, i) for b in range(B) for i in range(Tq) if q_lens is None or i < int(q_lens[b])]


@pytest.mark.parametrize("n", range(len(CASES)), ids=IDS)
def test_every_row_has_the_bits_of_its_ar_view(n):
    args, kw, out = _case(n)
    valid = _valid_rows(args, kw)
    for k, (b, i) in enumerate(valid):
        # Both AR forms on alternate rows (each form on every case): the interpreter is slow.
        for self_in_block in ((True, False) if k < 2 else ((k % 2) == 0,)):
            want = _triton(*ar_view(*args, b, i, self_in_block=self_in_block))[0, 0]
            assert torch.equal(out[b, i], want), (b, i, self_in_block, (out[b, i] - want).abs().max())
    pad = torch.ones(out.shape[:2], dtype=torch.bool, device=out.device)
    for b, i in valid:
        pad[b, i] = False
    assert (out[pad] == 0).all()


@pytest.mark.parametrize("n", range(len(CASES)), ids=IDS)
def test_values_match_the_torch_reference_of_the_mode(n):
    args, kw, out = _case(n)
    want = specops.tree_attention(*args, backend="torch", invariant=True, **kw)
    assert_close(out, want, args[0].dtype)


@pytest.mark.parametrize("n, page_size", [(0, 16), (2, 8), (4, 32)], ids=lambda x: str(x))
def test_paged_layout_gives_the_contiguous_bits(n, page_size):
    args, kw, out = _case(n)
    q, k, v, prefix, block, mask = args
    g = torch.Generator().manual_seed(n)
    k_pages, table = to_pages(k, page_size, generator=g)
    v_pages, _ = to_pages(v, page_size, generator=torch.Generator().manual_seed(n))  # the same page order
    got = specops.tree_attention_paged(q, k_pages, v_pages, table, prefix, block, mask, backend="triton",
                                       invariant=True, **kw)
    assert torch.equal(got, out)


def test_invariant_refuses_a_kv_split():
    from specops.triton_kernels import tree_attention as kernels

    args, kw, _ = _case(0)
    with pytest.raises(ValueError, match="num_splits must be None or 1 with invariant=True.*got 2"):
        kernels.tree_attention(*args, kw["q_lens"], 0.125, num_splits=2, invariant=True)
    one = kernels.tree_attention(*args, kw["q_lens"], args[0].shape[-1] ** -0.5, num_splits=1, invariant=True)
    assert torch.equal(one, _case(0)[2])
    _, launches = kernels.plan(*args, kw["q_lens"], 0.125, invariant=True)
    B, Tq, Hq = args[0].shape[:3]
    assert len(launches) == 1 and launches[0].grid == (B * Tq * args[1].shape[1], 1)
    assert launches[0].kwargs["INVARIANT"] and launches[0].kwargs["BLOCK_M"] == 16
