"""tree_attention on both KV layouts (contiguous; paged: tree_attention_paged): golden semantics on every
backend, paged caches against the contiguous op and the reference (page sizes 1 to 64, scattered and
shared pages, the vLLM / FlashInfer views), errors (nothing written), unchecked garbage, registration
(opcheck, torch.compile); the kernels against the reference: the cpp grid, every CPU instruction set,
the split-K schedules, Triton's tiles and split heuristic. The CUDA kernels' thread order: test_cudasim.py."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import specops
from specops import backend as _backend
from specops.testing import from_pages, random_parents, to_pages

from test_kv_compact import i32, need

# Tolerances vs the fp32 reference on the same (rounded) inputs: fp32 differs by summation order only;
# fp16/bf16 add the output's rounding (and P's before P @ V in the low-precision kernels): a few ulp.
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4),
       torch.float16: dict(atol=2e-3, rtol=2e-3),
       torch.bfloat16: dict(atol=1.2e-2, rtol=1.6e-2)}


@pytest.fixture
def backend(backend):
    """conftest's backend, skipped where this op has no implementation registered."""
    need("tree_attention", backend)
    return backend


@pytest.fixture(params=["contiguous", "paged"])
def layout(request):
    """The KV layout axis: the contiguous op, or the paged one on the same rows in scattered pages."""
    return request.param


def make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind="tree", padded=False, seed=0, device="cpu",
              strided=True, ragged=True):
    """Random inputs of one case; the cache holds 3 rows past the block (never visible). kind: "tree"
    (the queries are a random tree's last nodes), "dag" (random visibility), "chain" (causal), "none";
    ``padded``: ragged q_lens; ``ragged``: ragged prefix / block lengths. Garbage bits are set past each
    block and in padding rows: a kernel must ignore them."""
    g = torch.Generator().manual_seed(seed)
    S = P + L + 3
    W = max(1, (L + 31) // 32) + (1 if kind == "dag" else 0)  # a mask wider than needed is legal
    prefix = torch.full((B,), P, dtype=torch.int32)
    block = torch.full((B,), L, dtype=torch.int32)
    if ragged and B > 1:
        prefix[1:] = torch.randint(0, P + 1, (B - 1,), generator=g, dtype=torch.int32)
        block[1:] = torch.randint(Tq, L + 1, (B - 1,), generator=g, dtype=torch.int32)
    qlens = torch.full((B,), Tq, dtype=torch.int32)
    if padded:
        qlens = torch.randint(0, Tq + 1, (B,), generator=g, dtype=torch.int32)
        qlens[0] = max(Tq - 1, 0)
    vis = torch.zeros(B, Tq, 32 * W, dtype=torch.bool)
    for b in range(B):
        n = int(block[b])
        if kind == "tree":
            parents = random_parents(1, n, generator=g)
            full = specops.unpack_mask(specops.build_tree_mask(parents, backend="torch")[0], n)[0]
            vis[b, :, :n] = full[n - Tq:]
        elif kind == "dag":
            vis[b, :, :n] = torch.rand(Tq, n, generator=g) < 0.5
        elif kind == "chain":
            vis[b, :, :n] = torch.ones(n, n, dtype=torch.bool).tril()[n - Tq:]
        vis[b, :, n:] = torch.rand(Tq, 32 * W - n, generator=g) < 0.5  # garbage past the block
        pad = torch.arange(Tq) >= qlens[b]
        vis[b, pad] = torch.rand(int(pad.sum()), 32 * W, generator=g) < 0.5  # garbage in padding rows
    mask = specops.pack_mask(vis)
    q = torch.randn(B, Tq, Hq, D, generator=g).to(dtype)
    shape = (B, S, Hkv, D) if strided else (B, Hkv, S, D)
    k, v = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    if strided:  # a [B, S, Hkv, D] buffer seen as [B, Hkv, S, D]: last-dim stride 1 only
        k, v = k.transpose(1, 2), v.transpose(1, 2)
    args = [t.to(device) for t in (q, k, v, prefix, block, mask)]
    return args, {"q_lens": qlens.to(device) if padded else None}


def assert_close(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), **TOL[dtype])


def to_paged(args, page_size=16, seed=1, **kw):
    """tree_attention_paged's positional arguments for tree_attention's ``args``: the same K/V rows in
    scattered pages (``to_pages`` seeded with ``seed``: unused pages and slots NaN unless ``fill``)."""
    (k_pages, v_pages), table = to_pages(torch.stack(args[1:3]), page_size,
                                         generator=torch.Generator().manual_seed(seed), **kw)
    return [args[0], k_pages, v_pages, table, *args[3:]]


def paged_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size, seed=0, device="cpu", **kw):
    """make_case's inputs, plus tree_attention_paged's (:func:`to_paged`)."""
    args, opts = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=seed, device=device)
    return args, opts, to_paged(args, page_size, seed + 1, **kw)[1:4]


def run(layout, args, backend, page_size=16, **kw):
    """The op in ``layout`` on tree_attention's ``args`` (paged: the same rows in scattered pages)."""
    if layout == "contiguous":
        return specops.tree_attention(*args, backend=backend, **kw)
    need("tree_attention_paged", backend)
    return specops.tree_attention_paged(*to_paged(args, page_size), backend=backend, **kw)


# (B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size): small and odd (the Triton interpreter pays
# per tile); the decode over a long prefix splits the keys on every backend.
PAGED_CASES = [
    (2, 5, 12, 37, 4, 2, 64, torch.float32, "tree", True, 16),
    (3, 7, 40, 129, 9, 3, 64, torch.bfloat16, "dag", False, 1),
    (1, 3, 33, 70, 4, 1, 128, torch.float16, "chain", True, 64),
    (2, 1, 1, 300, 8, 2, 64, torch.float32, "chain", False, 64),
    (2, 4, 9, 20, 6, 3, 80, torch.float32, "dag", True, 16),
    (2, 3, 9, 21, 4, 2, 67, torch.bfloat16, "tree", True, 16),  # odd D: no 16-byte row copies on cuda
]
PAGED_IDS = [f"B{c[0]}-T{c[1]}-L{c[2]}-P{c[3]}-H{c[4]}x{c[5]}-D{c[6]}-{str(c[7])[6:]}-ps{c[10]}" for c in PAGED_CASES]


# ---- golden semantics (every backend, both layouts) --------------------------------------------

# (B, P, T, Hq, Hkv, dtype): a chain block of T queries after a prefix of P is causal attention over
# the whole P + T rows. P = 0 is plain causal attention; T = 1 is one decode step over P + 1 keys.
CHAIN_CASES = {"causal-float32": (2, 0, 37, 6, 2, torch.float32), "causal-bfloat16": (2, 0, 37, 6, 2, torch.bfloat16),
               "after-prefix": (1, 45, 9, 4, 4, torch.float32)}
CHAIN_CASES.update({f"decode-H{Hq}x{Hkv}": (3, 130, 1, Hq, Hkv, torch.float32) for Hq, Hkv in [(4, 4), (8, 2), (9, 3)]})


@pytest.mark.parametrize("B, P, T, Hq, Hkv, dtype", CHAIN_CASES.values(), ids=CHAIN_CASES.keys())
def test_chain_equals_causal_sdpa(backend, device, layout, B, P, T, Hq, Hkv, dtype):
    args, kw = make_case(B, T, T, P, Hq, Hkv, 64, dtype, kind="chain", device=device, ragged=False)
    q, k, v = args[:3]
    out = run(layout, args, backend, **kw)
    causal = torch.ones(T, P + T, dtype=torch.bool, device=device).tril(P)
    want = F.scaled_dot_product_attention(q.float().transpose(1, 2), k.float()[:, :, :P + T], v.float()[:, :, :P + T],
                                          attn_mask=causal, enable_gqa=True).transpose(1, 2)
    assert_close(out, want, dtype)


def test_query_that_sees_nothing_gives_zero(backend, device, layout):
    # No prefix and an empty mask row: 0, never NaN; a row seeing one key returns that value.
    args, kw = make_case(1, 3, 3, 0, 2, 2, 64, torch.float32, kind="none", device=device)
    args[5] = torch.tensor([[[0], [0b10], [0]]], dtype=torch.int32, device=device)
    out = run(layout, args, backend, **kw).cpu()
    assert torch.equal(out[0, 0], torch.zeros(2, 64)) and torch.equal(out[0, 2], torch.zeros(2, 64))
    torch.testing.assert_close(out[0, 1], args[2][0, :, 1].cpu(), atol=1e-6, rtol=1e-6)


def test_padding_rows_are_zero_and_do_not_change_valid_rows(backend, device, layout):
    args, _ = make_case(2, 7, 9, 20, 4, 2, 64, torch.float32, kind="tree", device=device)
    out = run(layout, args, backend, q_lens=i32([4, 0], device)).cpu()
    full = run(layout, args, backend).cpu()
    assert torch.equal(out[0, 4:], torch.zeros_like(out[0, 4:])) and torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[0, :4], full[0, :4], atol=0, rtol=0)


def test_keys_past_the_block_and_past_the_prefix_are_never_read(backend, device, layout):
    # Poison every cache row outside [0, P + L): NaN there would leak into the output.
    args, kw = make_case(2, 5, 8, 11, 4, 2, 64, torch.float32, kind="dag", device=device)
    for t in args[1:3]:
        for b in range(2):
            t[b, :, int(args[3][b] + args[4][b]):] = float("nan")
    out = run(layout, args, backend, **kw)
    assert not out.isnan().any()
    assert_close(out, specops.tree_attention(*args, backend="torch", **kw), torch.float32)


def test_sm_scale_is_applied(backend, device, layout):
    args, kw = make_case(1, 4, 6, 10, 2, 1, 64, torch.float32, kind="tree", device=device)
    out = run(layout, args, backend, sm_scale=0.3, **kw)
    want = specops.tree_attention(args[0] * (0.3 * math.sqrt(64)), *args[1:], backend="torch", **kw)
    assert_close(out, want, torch.float32)


def test_length_vectors_with_any_strides(backend, device, layout):
    # Length vectors as a stride-2 slice and a stride-0 broadcast: every backend reads element b at
    # b * stride (one that assumed stride 1 read prefix 0 for sequence 1, and past the broadcast).
    args, _ = make_case(2, 3, 6, 7, 4, 2, 64, torch.float32, kind="tree", ragged=False, device=device)
    args[3:5] = i32([5, 0, 7, 0], device)[::2], i32([6], device).expand(2)
    q_lens = i32([3, 9, 2, 9], device)[::2]
    assert args[3].stride() == (2,) and args[4].stride() == (0,)
    want = specops.tree_attention(*[a.contiguous() for a in args], q_lens=q_lens.contiguous(), backend="torch")
    got = run(layout, args, backend, q_lens=q_lens)
    assert_close(got, want, torch.float32)
    assert not got[1, 2:].any()  # q_lens[1] = 2 read from the strided view


# ---- paged caches against the contiguous op and the reference -----------------------------------

@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size", PAGED_CASES, ids=PAGED_IDS)
def test_paged_matches_contiguous_and_reference(backend, device, B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded,
                                                page_size):
    need("tree_attention_paged", backend)
    args, kw, paged = paged_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size, seed=P + D,
                                 device=device)
    got = specops.tree_attention_paged(args[0], *paged, *args[3:], backend=backend, **kw)
    assert not got.isnan().any()  # NaN-filled spare pages, slots and garbage table entries are never read
    want = specops.tree_attention_paged(args[0], *paged, *args[3:], backend="torch", **kw)
    assert_close(got, want, dtype)
    contiguous = specops.tree_attention(*args, backend=backend, **kw)
    assert_close(got, contiguous, dtype)
    if padded:
        for b in range(B):
            assert not got[b, int(kw["q_lens"][b]):].any()


def test_paged_reference_is_the_contiguous_reference():
    # The spec: the paged op on scattered pages is the contiguous op on the rows the pages hold.
    for page_size in (1, 2, 16, 64):
        args, kw, paged = paged_case(3, 4, 20, 45, 6, 2, 32, torch.float32, "dag", True, page_size, seed=page_size)
        got = specops.tree_attention_paged(args[0], *paged, *args[3:], backend="torch", **kw)
        want = specops.tree_attention(*args, backend="torch", **kw)
        torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_pages_shared_between_sequences_and_in_any_order(backend, device):
    # Sequences 1 and 2 read sequence 0's first two pages (a shared prompt), in any order.
    need("tree_attention_paged", backend)
    args, kw, (kp, vp, table) = paged_case(3, 3, 6, 40, 4, 2, 64, torch.float32, "tree", False, 16, seed=3,
                                           device=device, shared_prefix_pages=2)
    contiguous = [from_pages(t, table, args[1].shape[2]) for t in (kp, vp)]
    got = specops.tree_attention_paged(args[0], kp, vp, table, *args[3:], backend=backend, **kw)
    want = specops.tree_attention(args[0], *contiguous, *args[3:], backend="torch", **kw)
    assert_close(got, want, torch.float32)


def test_golden_page_table_by_hand(backend, device):
    # page_size 2, one sequence: rows 0-1 in page 3, rows 2-3 in page 0, row 4 in page 2 (slot 0).
    need("tree_attention_paged", backend)
    k, v = torch.randn(2, 1, 1, 5, 16)
    kp, vp = torch.full((2, 4, 2, 1, 16), float("nan"))
    for r, (page, slot) in enumerate([(3, 0), (3, 1), (0, 0), (0, 1), (2, 0)]):
        kp[page, slot, 0], vp[page, slot, 0] = k[0, 0, r], v[0, 0, r]
    table = i32([[3, 0, 2, 1]])
    q, lens = torch.randn(1, 2, 1, 16), (i32([3]), i32([2]))
    mask = i32([[[0b01], [0b11]]])  # query 0 sees block key 0, query 1 both
    dev = [t.to(device) for t in (q, kp, vp, table, *lens, mask)]
    got = specops.tree_attention_paged(*dev, backend=backend).cpu()
    want = specops.tree_attention(q, k, v, *lens, mask, backend="torch")
    assert_close(got, want, torch.float32)


def test_flashinfer_hnd_view_and_vllm_kv_split(backend, device):
    # The docstring's layouts are views: FlashInfer HND [num_pages, 2, Hkv, page_size, D] through
    # transpose(1, 2); vLLM's [2, num_blocks, block_size, Hkv, D] through kv[0], kv[1].
    need("tree_attention_paged", backend)
    args, kw, (kp, vp, table) = paged_case(2, 3, 8, 21, 4, 2, 64, torch.float32, "dag", True, 16, seed=9,
                                           device=device)
    want = specops.tree_attention(*args, backend="torch", **kw)
    hnd = torch.stack([kp, vp], dim=1).transpose(2, 3).contiguous()  # [N, 2, Hkv, page, D]
    k_hnd, v_hnd = hnd[:, 0].transpose(1, 2), hnd[:, 1].transpose(1, 2)
    assert k_hnd.shape == kp.shape and not k_hnd.is_contiguous()
    kv = torch.stack([kp, vp])  # [2, N, page, Hkv, D]
    for k, v in ((k_hnd, v_hnd), (kv[0], kv[1])):
        got = specops.tree_attention_paged(args[0], k, v, table, *args[3:], backend=backend, **kw)
        assert_close(got, want, torch.float32)


# ---- errors: raise naming the argument, nothing written ----------------------------------------

def good_args(layout):
    """Valid arguments of the error cases: tree_attention's, or tree_attention_paged's (pages of 4)."""
    args, _ = make_case(2, 3, 5, 4, 4, 2, 64, torch.float32, kind="tree")
    return args if layout == "contiguous" else to_paged(args, 4, seed=2, fill=0.0)


C, P = "contiguous", "paged"
BAD = [  # (layout, {argument index: bad value, or a function of the good args}, kwargs, exc, match); the
    # contiguous op's other metadata and value rules: tests/test_bad_input.py's battery
    (C, {1: lambda a: a[1][:, :, :, :32]}, {}, ValueError, r"k_cache must have shape \[B=2, Hkv, S, D=64\]"),
    (P, {1: lambda a: a[1][:, :3]}, {}, ValueError,
     r"k_pages page_size \(dim 1\) must be a power of two >= 1, got 3"),
    (P, {1: lambda a: a[1].half()}, {}, TypeError, "k_pages must have dtype torch.float32"),
    (P, {1: lambda a: a[1][..., :32]}, {}, ValueError,
     r"k_pages must have shape \[num_pages, page_size, Hkv, D=64\]"),
    (P, {1: lambda a: a[1][0]}, {}, ValueError, "k_pages must have rank 4"),
    (P, {2: lambda a: a[2][:-1]}, {}, ValueError, "v_pages must have shape"),
    (P, {1: lambda a: a[1].transpose(2, 3).contiguous().transpose(2, 3)}, {}, ValueError,
     "k_pages must have stride 1 in its last dimension"),
    (P, {1: lambda a: torch.zeros(a[1].shape[0], 4, 3, 64)}, {}, ValueError, r"Hq % Hkv == 0"),
    (P, {3: lambda a: a[3].long()}, {}, TypeError, "page_table must have dtype torch.int32"),
    (P, {3: lambda a: a[3][:1]}, {}, ValueError, r"page_table must have shape \[2, \*\]"),
    (P, {3: lambda a: a[3][0]}, {}, ValueError, "page_table must have rank 2"),
    (P, {3: lambda a: a[3].to("meta")}, {}, ValueError, "page_table must be on cpu"),
    (P, {3: lambda a: torch.where(torch.arange(a[3].shape[1]) == 1, -1, a[3]).int()}, {}, ValueError,
     r"page_table\[0, 1\] must lie in \[0, num_pages=\d+\) \(page 1 holds rows \[4, 8\) of sequence 0.*got -1"),
    (P, {3: lambda a: torch.full_like(a[3], a[1].shape[0])}, {}, ValueError,
     r"page_table\[0, 0\] must lie in \[0"),
    (P, {4: i32([4, 14])}, {}, ValueError,
     r"prefix_lens \+ block_lens must be <= max_pages \* page_size = 4 \* 4 = 16"),
    (P, {4: i32([4, -1])}, {}, ValueError, "prefix_lens must be >= 0"),
    (P, {5: i32([5, 33])}, {}, ValueError, "mask too narrow"),
    (P, {6: lambda a: a[6][:, :2]}, {}, ValueError, r"mask must have shape \[B=2, Tq=3, W\]"),
    (P, {}, {"q_lens": i32([3, 4])}, ValueError, r"q_lens must lie in \[0, Tq=3\]"),
    (P, {}, {"sm_scale": float("inf")}, TypeError, "sm_scale must be a finite real number"),
    (C, {}, {"invariant": 1}, TypeError, "invariant must be a bool"),
    (P, {}, {"invariant": "yes"}, TypeError, "invariant must be a bool"),
]


@pytest.mark.parametrize("layout, bad, kw, exc, match", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_raises_naming_the_argument_and_writes_nothing(backend, layout, bad, kw, exc, match):
    op = "tree_attention" if layout == "contiguous" else "tree_attention_paged"
    need(op, backend)
    args = good_args(layout)
    for i, value in bad.items():
        args[i] = value(args) if callable(value) else value
    before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(exc, match=match):
        getattr(specops, op)(*args, backend=backend, **kw)
    for a, b in zip(args, before):
        if isinstance(a, torch.Tensor) and not a.is_meta:
            assert torch.equal(a, b) or (a.isnan().any() and torch.equal(a.isnan(), b.isnan()))


def test_check_false_skips_value_checks_without_reading_out_of_bounds(fast_backend, device, layout):
    # The kernels clamp lengths past the cache (paged: page ids outside the pool, an empty pool).
    need("tree_attention", fast_backend)
    args, _ = make_case(2, 3, 5, 4, 4, 2, 64, torch.float32, kind="tree", device=device)
    args[3:5] = i32([100, -7], device), i32([1000, -3], device)
    q_lens = i32([9, -1], device)
    if layout == "contiguous":
        out = specops.tree_attention(*args, q_lens=q_lens, check=False, backend=fast_backend)
        assert out.shape == args[0].shape and out.isfinite().all()
        return
    need("tree_attention_paged", fast_backend)
    q, kp, vp, _, *rest = to_paged(args, 16, seed=3, fill=0.0)
    table = i32([[-7, 10**6, 3], [2**31 - 1, -(2**31), 0]], device)
    for pools in ((kp, vp), (kp[:0], vp[:0])):  # the second: no pool page at all, nothing can be read
        out = specops.tree_attention_paged(q, *pools, table, *rest, q_lens=q_lens, check=False, backend=fast_backend)
        assert out.shape == q.shape and out.isfinite().all()


def test_backends_say_why_they_cannot_take_a_paged_call():
    # The capability checks read the paged layout (Hkv is dim 2 of the pages).
    args, _, paged = paged_case(1, 2, 3, 4, 4, 2, 272, torch.float32, "tree", False, 16, fill=0.0)
    for name, why in (("cudasim", "head dim D=272 > 256"), ("triton", "D=272 > 256")):
        if name not in _backend.implementations("tree_attention_paged") or not _backend.available(name)[0]:
            continue
        with pytest.raises(specops.BackendUnavailable, match=f"backend '{name}'.*cannot run this call: .*{why}"):
            specops.tree_attention_paged(args[0], *paged, *args[3:], backend=name)


# ---- registration -----------------------------------------------------------------------------

needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0] or not hasattr(torch.ops.specops, "tree_attention"),
                               reason="cpp backend unavailable")


@needs_cpp
@pytest.mark.parametrize("dtype, padded, schedule", [
    *[(dtype, padded, ()) for dtype in (torch.float32, torch.bfloat16) for padded in (False, True)],
    # num_splits and the mutated workspace, as a plan passes them: 3 splits of [B=2, Tq=5, Hq=4, D + 1]
    (torch.float32, True, (3, torch.empty(3 * 2 * 5 * 4 * 65))),
    (torch.float32, True, (1, None, True))])  # the invariant schedule
def test_opcheck(dtype, padded, schedule, layout):
    args, kw = make_case(2, 5, 9, 30, 4, 2, 64, dtype, kind="tree", padded=padded)
    if layout == "paged":
        args = to_paged(args, 16, fill=0.0)
    op = torch.ops.specops.tree_attention if layout == "contiguous" else torch.ops.specops.tree_attention_paged
    torch.library.opcheck(op.default, (*args, kw["q_lens"], 0.125, *schedule))


@needs_cpp
def test_torch_compile_fullgraph(layout):
    args, kw = make_case(3, 7, 20, 50, 8, 2, 64, torch.float32, kind="dag", padded=True)
    cache = args[1:3] if layout == "contiguous" else to_paged(args, 16, fill=0.0)[1:4]
    op = specops.tree_attention if layout == "contiguous" else specops.tree_attention_paged

    def f(q, *a):
        return op(q * 2, *a[:-1], q_lens=a[-1], check=False, backend="cpp") + 1

    got = torch.compile(f, fullgraph=True)(args[0], *cache, *args[3:], kw["q_lens"])
    want = specops.tree_attention(args[0] * 2, *args[1:], backend="torch", **kw) + 1
    assert_close(got, want, torch.float32)


# ---- the kernels against the reference (both layouts where a kernel has a paged variant) ----------

def triton_kernels(device):
    """specops.triton_kernels.tree_attention, or a skip where the triton backend cannot run on ``device``."""
    ok = _backend.available("triton", device)[0] and "triton" in _backend.implementations("tree_attention")
    if not ok:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    return kernels


GRID_HEADS = [(4, 4), (8, 2), (9, 3), (32, 8)]
GRID_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def grid_cases():
    """A covering subset of B x Tq x block x prefix x heads x D x dtype x mask kind x padding:
    every (prefix, heads, dtype) triple once, the other axes cycled so each value meets many."""
    cases = []
    for n, (P, (Hq, Hkv), dtype) in enumerate(itertools.product([0, 1, 129, 1000], GRID_HEADS, GRID_DTYPES)):
        B = (1, 3)[n % 2]
        Tq = (1, 7, 64)[n % 3]
        L = min(130, Tq + (0, 5, 66, 130)[(n // 3) % 4])
        D = (64, 128)[(n // 2) % 2]
        kind = ("tree", "dag", "chain")[(n // 6) % 3] if L > Tq or n % 5 else "dag"
        padded = n % 4 == 1
        name = f"B{B}-T{Tq}-L{L}-P{P}-H{Hq}x{Hkv}-D{D}-{str(dtype)[6:]}-{kind}{'-pad' if padded else ''}"
        cases.append(pytest.param(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, id=name))
    return cases


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded", grid_cases())
@needs_cpp
def test_cpp_matches_reference_on_the_grid(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded):
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=B * Tq + L + P + D)
    want = specops.tree_attention(*args, backend="torch", **kw)
    got = specops.tree_attention(*args, backend="cpp", **kw)
    assert_close(got, want, dtype)
    if padded:
        for b in range(B):
            assert not got[b, int(kw["q_lens"][b]):].any()


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
@pytest.mark.parametrize("dtype", GRID_DTYPES)
@needs_cpp
def test_cpp_every_instruction_set_variant_matches_reference(monkeypatch, isa, dtype, layout):
    # SPECOPS_CPU_ISA caps the CPU kernel's variant: this machine runs every one it supports. Paged:
    # bf16 with AVX512_BF16 packs V rows in pairs, which may straddle two pages (page size 1).
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    paged = layout == "paged"
    cases = [(2, 5, 30, 100, 6, 2, 64, "dag")] * 2 if paged else [(3, 7, 40, 129, 9, 3, 64, "dag"),
                                                                  (2, 17, 17, 100, 4, 1, 80, "tree"),
                                                                  (1, 5, 33, 0, 2, 2, 67, "chain")]
    for n, (B, Tq, L, P, Hq, Hkv, D, kind) in enumerate(cases):
        args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=n == 0 or paged, seed=n)
        assert_close(run(layout, args, "cpp", page_size=(1, 16)[n % 2], **kw),
                     specops.tree_attention(*args, backend="torch", **kw), dtype)


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv", [(1, 3, 3, 3000, 4, 2), (1, 2, 40, 2000, 9, 3),
                                                  (3, 1, 1, 4000, 8, 8)])
@needs_cpp
def test_cpp_splits_along_the_prefix_and_combines(B, Tq, L, P, Hq, Hkv, layout):
    # Few (sequence, kv head, query tile) items leave threads idle: the kernel splits the keys and
    # merges the partials by log-sum-exp (paged: each split walks its pages); one thread: no split.
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, 128, torch.float32, kind="dag", seed=P)
    want = specops.tree_attention(*args, backend="torch", **kw)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3, 5):
            torch.set_num_threads(n)
            assert_close(run(layout, args, "cpp", **kw), want, torch.float32)
    finally:
        torch.set_num_threads(threads)


@needs_cpp
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 3), Tq=st.integers(1, 40), extra=st.integers(0, 40), P=st.integers(0, 300),
       G=st.sampled_from([1, 2, 3, 7]), Hkv=st.integers(1, 3), D=st.sampled_from([16, 33, 64, 96]),
       dtype=st.sampled_from(GRID_DTYPES), kind=st.sampled_from(["tree", "dag", "chain", "none"]),
       padded=st.booleans(), seed=st.integers(0, 2**16))
def test_property_cpp_matches_reference(B, Tq, extra, P, G, Hkv, D, dtype, kind, padded, seed):
    args, kw = make_case(B, Tq, Tq + extra, P, G * Hkv, Hkv, D, dtype, kind=kind, padded=padded, seed=seed,
                         strided=seed % 2 == 0)
    assert_close(specops.tree_attention(*args, backend="cpp", **kw),
                 specops.tree_attention(*args, backend="torch", **kw), dtype)


TRITON_CASES = [  # small and odd: the interpreter is slow
    (1, 7, 9, 0, 4, 4, 64, torch.float32, "tree", False),
    (3, 5, 12, 129, 9, 3, 64, torch.float32, "dag", True),
    (2, 1, 1, 1000, 8, 2, 64, torch.float32, "chain", False),
    (2, 16, 20, 33, 4, 2, 128, torch.bfloat16, "tree", True),
    (1, 3, 40, 1, 2, 1, 64, torch.float16, "dag", False),
    # 128 < D <= 256 (Gemma's D = 256, odd sizes padded to the 256 tile), GQA, ragged batches
    (2, 3, 9, 40, 8, 2, 256, torch.bfloat16, "tree", True),
    (2, 5, 37, 20, 6, 3, 160, torch.float32, "dag", False),
    (3, 2, 33, 70, 4, 1, 200, torch.float16, "chain", True),
    (1, 4, 70, 65, 2, 2, 256, torch.float32, "dag", False),
]


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded", TRITON_CASES)
def test_triton_matches_reference(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, device):
    triton_kernels(device)
    args, kw = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=B + Tq + P,
                         device=device)
    assert_close(specops.tree_attention(*args, backend="triton", **kw),
                 specops.tree_attention(*args, backend="torch", **kw), dtype)


@pytest.mark.parametrize("num_splits", [1, 2, 5])
def test_triton_split_k_matches_reference(num_splits, device, layout):
    # The flash-decoding variant: kv splits merged by a second kernel; more splits than tiles
    # leaves some splits empty (their partials must carry no weight). Paged: also the sm_80 tiles.
    kernels = triton_kernels(device)
    args, kw = make_case(2, 3, 7, 200, 6, 2, 64, torch.float32, kind="dag", padded=True, seed=num_splits,
                         device=device)
    want = specops.tree_attention(*args, sm_scale=0.125, backend="torch", **kw)
    if layout == "contiguous":
        got = kernels.tree_attention(*args, kw["q_lens"], 0.125, num_splits=num_splits)
    else:
        got = kernels.tree_attention_paged(*to_paged(args), kw["q_lens"], 0.125, num_splits=num_splits,
                                           arch=80 if num_splits == 1 else None)
    assert_close(got, want, torch.float32)


@pytest.mark.parametrize("dtype, D, Tq, G", [
    (torch.bfloat16, 256, 9, 2),  # block tiles BLOCK_M 64, BLOCK_N 32 (table 80 only)
    (torch.float32, 200, 3, 8),  # block tiles BLOCK_M 16, BLOCK_N 32
    (torch.float16, 96, 2, 4),  # decode tiles BLOCK_M 16, BLOCK_N 64
    (torch.float32, 128, 5, 4),  # block tiles BLOCK_M 32, BLOCK_N 32, 2 stages
])
def test_triton_sm80_tiles_match_reference(dtype, D, Tq, G):
    # The sm_80 table's tiles in the interpreter: 2 mask words a tile when BLOCK_N = 64 (never a tile
    # starting mid-word: BLOCK_N % 32 == 0), a block crossing words.
    kernels = triton_kernels("cpu")
    args, kw = make_case(2, Tq, 45, 37, 2 * G, 2, D, dtype, kind="dag", padded=True, seed=D)
    got = kernels.tree_attention(*args, kw["q_lens"], D ** -0.5, arch=80)
    assert_close(got, specops.tree_attention(*args, backend="torch", **kw), dtype)


def test_triton_splits_a_small_decode_by_itself(device):
    # One (sequence, kv head) program over a long prefix leaves the device idle: the launcher plans a
    # split-K launch plus the combine kernel unasked.
    kernels = triton_kernels(device)
    args, _ = make_case(1, 1, 1, 900, 4, 1, 64, torch.float32, kind="chain", device=device)
    _, launches = kernels.plan(*args, None, 0.125)
    assert len(launches) == 2 and launches[0].grid[1] > 1
    got = specops.tree_attention(*args, sm_scale=0.125, backend="triton")
    assert_close(got, specops.tree_attention(*args, sm_scale=0.125, backend="torch"), torch.float32)


def test_triton_supports_says_why_before_launching(device):
    kernels = triton_kernels(device)
    args, _ = make_case(1, 2, 3, 4, 4, 2, 64, torch.float32, device=device)
    assert kernels.supports(*args) == (True, "ok")
    wide, _ = make_case(1, 2, 3, 4, 4, 2, 272, torch.float32, device=device)
    ok, why = kernels.supports(*wide)
    assert not ok and "D=272 > 256" in why
    ok, why = kernels.supports(args[0].double(), args[1].double())
    assert not ok and "torch.float64" in why
    # An explicit request raises with the reason before any launch (the automatic choice moves on).
    why = r"backend 'triton' \(backend=\) cannot run this call: .*D=272 > 256"
    with pytest.raises(specops.BackendUnavailable, match=why):
        specops.tree_attention(*wide, backend="triton")


def test_triton_supports_needs_the_interpreter_for_cpu_tensors(monkeypatch):
    from specops.triton_kernels import tree_attention as kernels

    args, _ = make_case(1, 2, 3, 4, 4, 2, 64, torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    ok, why = kernels.supports(*args)
    assert not ok and "TRITON_INTERPRET=1" in why


def _splits(B, Tq, Hq, Hkv, S, D, elem=2, arch=90):
    from specops.triton_kernels import tree_attention as kernels

    rows = Tq * Hq // Hkv
    cfg = kernels.config(arch, torch.float16 if elem == 2 else torch.float32, D, rows)
    n_programs = -(-rows // cfg.block_m) * B * Hkv
    R = B * Tq * Hq
    kv, part = 2 * B * Hkv * S * D * elem, R * (D + 1) * 4
    ns = kernels.auto_splits(n_programs, kernels.SMS[arch], kv, part, 4 * R * S * D,
                             kernels.BALANCE[arch, elem == 4], -(-S // cfg.block_n))
    return ns, n_programs, kv, part


def test_split_heuristic_charges_the_partials():
    # Decode over a long cache: 8 programs on 132 SMs, tiny partials -> split to fill the device.
    ns, n_programs, kv, part = _splits(B=1, Tq=1, Hq=32, Hkv=8, S=4096, D=128)
    assert n_programs * ns >= 100 and 2 * ns * part < kv / 10
    # Enough programs already: no split.
    assert _splits(B=64, Tq=1, Hq=32, Hkv=8, S=4096, D=128)[0] == 1
    # 64 queries over a 1024-row cache: a split's partials (1 MB, written and read back) outweigh idle
    # SMs; splitting by program count alone took 4 splits, 8.5 MB of partials for 4 MB of K/V.
    ns, n_programs, kv, part = _splits(B=1, Tq=64, Hq=32, Hkv=8, S=1024, D=128)
    assert ns == 1 and 2 * 4 * part > 2 * kv
    # More partial bytes never buy more splits.
    from specops.triton_kernels import tree_attention as kernels

    for n_programs in (1, 8, 40):
        picked = [kernels.auto_splits(n_programs, 132, 8e6, 10.0 ** e, 1e9, 295.0, 64) for e in range(3, 8)]
        assert picked == sorted(picked, reverse=True) and picked[-1] == 1
