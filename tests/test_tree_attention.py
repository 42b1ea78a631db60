"""tree_attention on both KV layouts (contiguous, and paged: tree_attention_paged): golden semantics
on every backend and layout, paged caches against the contiguous op and the reference (page sizes 1
to 64, scattered and shared pages, the vLLM / FlashInfer views), errors (nothing written), unchecked
garbage, registration (opcheck, torch.compile). The kernels' own grids: test_tree_attention_kernels.py."""
import math

import pytest
import torch
import torch.nn.functional as F

import specops
from specops import backend as _backend
from specops.testing import from_pages, random_parents, to_pages

from test_kv_compact import i32, need

# Tolerances vs the fp32 reference computed from the same (rounded) inputs: fp32 differs only by
# summation order; fp16/bf16 add the rounding of the output (and of P before P @ V in the
# low-precision kernels), i.e. a few ulp of the output dtype.
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
    """Random inputs of one case; the cache holds a few rows past the block (never visible).

    kind: "tree" (queries are the last nodes of a random tree), "dag" (random visibility),
    "chain" (causal), "none" (no block key visible). ``padded`` makes q_lens ragged; ``ragged``
    makes prefix/block lengths differ across the batch. Garbage bits are set past each block and
    in padding rows: a kernel must ignore them."""
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


# (B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size): small and odd (the Triton interpreter
# pays per tile); decode over a long prefix splits the keys on every backend.
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
    # prefix_lens / block_lens / q_lens may be views: a stride-2 slice, a stride-0 broadcast. Every
    # backend reads element b at b * stride (a kernel that assumed stride 1 read prefix 0 for
    # sequence 1 here, and past the storage of the broadcast).
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
    # Sequences 1 and 2 read sequence 0's first two pages (a shared prompt); the table of the
    # golden check is written by hand, out of order.
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
    # The docstring's layouts are views, no copy: FlashInfer HND [num_pages, 2, Hkv, page_size, D]
    # through transpose(1, 2); vLLM's [2, num_blocks, block_size, Hkv, D] through kv[0], kv[1].
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
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b) or (a.isnan().any() and torch.equal(a.isnan(), b.isnan()))


def test_page_table_on_another_device_raises():
    args = good_args("paged")
    args[3] = args[3].to("meta")
    with pytest.raises(ValueError, match="page_table must be on cpu"):
        specops.tree_attention_paged(*args)


def test_check_false_skips_value_checks_without_reading_out_of_bounds(fast_backend, device, layout):
    # Lengths past the cache (and paged: page ids outside the pool, an empty pool) are clamped by the
    # kernels: no crash, finite output.
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
