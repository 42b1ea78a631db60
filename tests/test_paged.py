"""Paged KV caches: tree_attention_paged and kv_compact_paged on every backend, against the torch
reference and against the contiguous op on the same data laid out contiguously; page sizes 1, 16
and 64 with scattered, out-of-order pages; pages shared between sequences and between the source
and destination rows of a compaction; errors (nothing written); unchecked garbage; registration."""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.testing import from_pages, random_accept, to_pages

from test_kv_compact import PATTERNS, expected, i32
from test_tree_attention import assert_close, make_case


def need(op, backend):
    if backend not in _backend.implementations(op):
        pytest.skip(f"{op} has no {backend} implementation")


# ---- tree_attention_paged ----------------------------------------------------------------------

def paged_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size, seed=0, device="cpu", **kw):
    """make_case's inputs, plus the same K/V laid out in scattered pages (unused pages and slots NaN)."""
    args, opts = make_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind=kind, padded=padded, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    k_pages, table = to_pages(args[1], page_size, generator=g, **kw)
    v_pages, _ = to_pages(args[2], page_size, generator=torch.Generator().manual_seed(seed + 1), **kw)
    return args, opts, (k_pages, v_pages, table)


def paged_args(args, paged):
    """tree_attention_paged's positional arguments from tree_attention's and the paged cache."""
    return (args[0], *paged, *args[3:])


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


@pytest.mark.parametrize("B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size", PAGED_CASES,
                         ids=[f"B{c[0]}-T{c[1]}-L{c[2]}-P{c[3]}-H{c[4]}x{c[5]}-D{c[6]}-{str(c[7])[6:]}-ps{c[10]}"
                              for c in PAGED_CASES])
def test_tree_attention_paged_matches_contiguous_and_reference(backend, device, B, Tq, L, P, Hq, Hkv, D, dtype,
                                                               kind, padded, page_size):
    need("tree_attention_paged", backend)
    args, kw, paged = paged_case(B, Tq, L, P, Hq, Hkv, D, dtype, kind, padded, page_size, seed=P + D,
                                 device=device)
    got = specops.tree_attention_paged(*paged_args(args, paged), backend=backend, **kw)
    assert not got.isnan().any()  # NaN-filled spare pages, slots and garbage table entries are never read
    want = specops.tree_attention_paged(*paged_args(args, paged), backend="torch", **kw)
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
        got = specops.tree_attention_paged(*paged_args(args, paged), backend="torch", **kw)
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
    D = 16
    k = torch.randn(1, 1, 5, D)
    v = torch.randn(1, 1, 5, D)
    kp, vp = torch.full((4, 2, 1, D), float("nan")), torch.full((4, 2, 1, D), float("nan"))
    for r, (page, slot) in enumerate([(3, 0), (3, 1), (0, 0), (0, 1), (2, 0)]):
        kp[page, slot, 0], vp[page, slot, 0] = k[0, 0, r], v[0, 0, r]
    table = i32([[3, 0, 2, 1]])
    q = torch.randn(1, 2, 1, D)
    lens = i32([3]), i32([2])
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
    assert_close(specops.tree_attention_paged(args[0], k_hnd, v_hnd, table, *args[3:], backend=backend, **kw),
                 want, torch.float32)
    kv = torch.stack([kp, vp])  # [2, N, page, Hkv, D]
    assert_close(specops.tree_attention_paged(args[0], kv[0], kv[1], table, *args[3:], backend=backend, **kw),
                 want, torch.float32)


@pytest.mark.parametrize("isa", ["avx512bf16", "avx512", "avx2", "generic"])
def test_cpp_every_instruction_set_variant_pages(monkeypatch, isa):
    # bf16 with AVX512_BF16 packs V rows in pairs: a pair may straddle two pages (page size 1).
    if not _backend.available("cpp")[0]:
        pytest.skip("cpp backend unavailable")
    monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for page_size in (1, 16):
            args, kw, paged = paged_case(2, 5, 30, 100, 6, 2, 64, dtype, "dag", True, page_size, seed=page_size)
            assert_close(specops.tree_attention_paged(*paged_args(args, paged), backend="cpp", **kw),
                         specops.tree_attention(*args, backend="torch", **kw), dtype)


def test_cpp_paged_splits_along_the_prefix():
    # Few work items: the CPU kernel splits the keys, each split walking its pages.
    if not _backend.available("cpp")[0]:
        pytest.skip("cpp backend unavailable")
    args, kw, paged = paged_case(1, 2, 5, 2000, 4, 2, 64, torch.float32, "dag", False, 16, seed=4)
    want = specops.tree_attention(*args, backend="torch", **kw)
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert_close(specops.tree_attention_paged(*paged_args(args, paged), backend="cpp", **kw), want,
                         torch.float32)
    finally:
        torch.set_num_threads(threads)


def test_triton_paged_split_k_and_sm80_tiles(device):
    if not _backend.available("triton", device)[0]:
        pytest.skip("triton backend unavailable")
    from specops.triton_kernels import tree_attention as kernels

    args, kw, paged = paged_case(2, 3, 7, 150, 6, 2, 64, torch.float32, "dag", True, 16, seed=5, device=device)
    want = specops.tree_attention(*args, sm_scale=0.125, backend="torch", **kw)
    for splits, arch in ((3, None), (1, 80)):
        got = kernels.tree_attention_paged(args[0], *paged, *args[3:], kw["q_lens"], 0.125, num_splits=splits,
                                           arch=arch)
        assert_close(got, want, torch.float32)


def test_check_false_clamps_garbage_without_reading_out_of_bounds(fast_backend, device):
    need("tree_attention_paged", fast_backend)
    args, _, (kp, vp, table) = paged_case(2, 3, 5, 4, 4, 2, 64, torch.float32, "tree", False, 16, seed=2,
                                          device=device, fill=0.0)
    table = i32([[-7, 10**6, 3], [2**31 - 1, -(2**31), 0]], device)
    lens = i32([100, -7], device), i32([1000, -3], device)
    out = specops.tree_attention_paged(args[0], kp, vp, table, *lens, args[5], q_lens=i32([9, -1], device),
                                       check=False, backend=fast_backend)
    assert out.shape == args[0].shape and out.isfinite().all()
    empty = kp[:0]  # no pool page at all: nothing can be read
    out = specops.tree_attention_paged(args[0], empty, vp[:0], table, *lens, args[5], check=False,
                                       backend=fast_backend)
    assert out.isfinite().all()


def _good_paged():
    args, _, paged = paged_case(2, 3, 5, 4, 4, 2, 64, torch.float32, "tree", False, 4, seed=1, fill=0.0)
    return [args[0], *paged, *args[3:]]  # q, k_pages, v_pages, page_table, prefix, block, mask


def _bad(i, value):
    def f():
        a = _good_paged()
        a[i] = value(a) if callable(value) else value
        return a
    return f


BAD_ATTENTION = [
    (_bad(1, lambda a: a[1][:, :3]), ValueError, r"k_pages page_size \(dim 1\) must be a power of two >= 1, got 3"),
    (_bad(1, lambda a: a[1].half()), TypeError, "k_pages must have dtype torch.float32"),
    (_bad(1, lambda a: a[1][..., :32]), ValueError, r"k_pages must have shape \[num_pages, page_size, Hkv, D=64\]"),
    (_bad(1, lambda a: a[1][0]), ValueError, "k_pages must have rank 4"),
    (_bad(2, lambda a: a[2][:-1]), ValueError, "v_pages must have shape"),
    (_bad(1, lambda a: a[1].transpose(2, 3).contiguous().transpose(2, 3)), ValueError,
     "k_pages must have stride 1 in its last dimension"),
    (_bad(1, lambda a: torch.zeros(a[1].shape[0], 4, 3, 64)), ValueError, r"Hq % Hkv == 0"),
    (_bad(3, lambda a: a[3].long()), TypeError, "page_table must have dtype torch.int32"),
    (_bad(3, lambda a: a[3][:1]), ValueError, r"page_table must have shape \[2, \*\]"),
    (_bad(3, lambda a: a[3][0]), ValueError, "page_table must have rank 2"),
    (_bad(3, lambda a: torch.where(torch.arange(a[3].shape[1]) == 1, -1, a[3]).int()), ValueError,
     r"page_table\[0, 1\] must lie in \[0, num_pages=\d+\) \(page 1 holds rows \[4, 8\) of sequence 0.*got -1"),
    (_bad(3, lambda a: torch.full_like(a[3], a[1].shape[0])), ValueError, r"page_table\[0, 0\] must lie in \[0"),
    (_bad(4, i32([4, 14])), ValueError,
     r"prefix_lens \+ block_lens must be <= max_pages \* page_size = 4 \* 4 = 16"),
    (_bad(4, i32([4, -1])), ValueError, "prefix_lens must be >= 0"),
    (_bad(5, i32([5, 33])), ValueError, "mask too narrow"),
    (_bad(6, lambda a: a[6][:, :2]), ValueError, r"mask must have shape \[B=2, Tq=3, W\]"),
]


@pytest.mark.parametrize("make, exc, match", BAD_ATTENTION, ids=[str(i) for i in range(len(BAD_ATTENTION))])
def test_tree_attention_paged_bad_input_raises_naming_the_argument(backend, make, exc, match):
    need("tree_attention_paged", backend)
    args = make()
    before = [a.clone() for a in args]
    with pytest.raises(exc, match=match):
        specops.tree_attention_paged(*args, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(args, before))


def test_tree_attention_paged_q_lens_and_sm_scale_errors():
    args = _good_paged()
    with pytest.raises(ValueError, match=r"q_lens must lie in \[0, Tq=3\]"):
        specops.tree_attention_paged(*args, q_lens=i32([3, 4]))
    with pytest.raises(TypeError, match="sm_scale must be a finite real number"):
        specops.tree_attention_paged(*args, sm_scale=float("inf"))
    args[3] = args[3].to("meta")
    with pytest.raises(ValueError, match="page_table must be on cpu"):
        specops.tree_attention_paged(*args)


def test_backends_say_why_they_cannot_take_a_paged_call():
    # The capability checks read the paged layout (Hkv is dim 2 of the pages).
    args, kw, paged = paged_case(1, 2, 3, 4, 4, 2, 272, torch.float32, "tree", False, 16, fill=0.0)
    for name, why in (("cudasim", "head dim D=272 > 256"), ("triton", "D=272 > 256")):
        if name not in _backend.implementations("tree_attention_paged") or not _backend.available(name)[0]:
            continue
        with pytest.raises(specops.BackendUnavailable, match=f"backend '{name}'.*cannot run this call: .*{why}"):
            specops.tree_attention_paged(*paged_args(args, paged), backend=name)


# ---- kv_compact_paged --------------------------------------------------------------------------

def compaction_case(B, A, pattern, page_size, dtype, seed, L=2, H=2, D=8, extra=5, device="cpu"):
    """A contiguous cache [L, B, H, S, D] with S = A + extra, its paged layout and valid moves."""
    g = torch.Generator().manual_seed(seed)
    idx, lens = random_accept(B, A, generator=g, pattern=pattern)
    S = A + extra
    last = torch.where(lens > 0, idx.gather(1, (lens.long() - 1).clamp(min=0)[:, None])[:, 0], 0)
    prefix = (torch.rand(B, generator=g) * (S - last).float()).long().clamp(max=S - 1 - last).to(torch.int32)
    cache = torch.randn(L, B, H, S, D, generator=g).to(dtype)
    k_pages, table = to_pages(cache, page_size, generator=g, fill=7.0)
    v_pages = -k_pages  # V = -K, in the same pages
    lens_args = [t.to(device) for t in (prefix, idx, lens)]
    return cache.to(device), k_pages.to(device), v_pages.to(device), table.to(device), lens_args


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_kv_compact_paged_matches_contiguous_and_reference(backend, device, pattern, page_size):
    need("kv_compact_paged", backend)
    for B, A, dtype in ((1, 33, torch.float32), (3, 20, torch.bfloat16)):
        cache, kp, vp, table, (prefix, idx, lens) = compaction_case(B, A, pattern, page_size, dtype,
                                                                    seed=A + page_size, device=device)
        S = cache.shape[3]
        ref_k, ref_v = kp.clone(), vp.clone()
        specops.kv_compact_paged(ref_k, ref_v, table, prefix, idx, lens, backend="torch")
        specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, backend=backend)
        assert torch.equal(kp, ref_k) and torch.equal(vp, ref_v), "pages differ from the torch reference"
        want = expected(cache.cpu(), prefix.cpu(), idx.cpu(), lens.cpu())
        assert torch.equal(from_pages(kp, table, S).cpu(), want)
        assert torch.equal(from_pages(vp, table, S).cpu(), -want)
        # the contiguous op, same backend, on the same data laid out contiguously
        k, v = cache.clone(), -cache
        specops.kv_compact(k, v, prefix, idx, lens, backend=backend)
        assert torch.equal(from_pages(kp, table, S), k) and torch.equal(from_pages(vp, table, S), v)


def test_kv_compact_paged_pages_outside_the_moves_are_untouched(backend, device):
    # Spare pages, the slots past S and other sequences' pages keep their bytes.
    need("kv_compact_paged", backend)
    cache, kp, vp, table, (prefix, idx, lens) = compaction_case(3, 24, "random", 4, torch.float32, seed=11,
                                                                device=device)
    S = cache.shape[3]
    n = -(-S // 4)
    used = set(table[:, :n].flatten().tolist())
    before = kp.clone()
    specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, backend=backend)
    spare = [p for p in range(kp.shape[1]) if p not in used]
    assert spare and torch.equal(kp[:, spare], before[:, spare])
    for b in range(3):
        last = int(table[b, n - 1])
        tail = S - (n - 1) * 4
        assert torch.equal(kp[:, last, tail:], before[:, last, tail:])


def test_kv_compact_paged_golden_moves_within_and_across_pages(backend, device):
    # page_size 2; the sequence's rows 0..7 live in pages [3, 0, 2, 1]: rows 2,3 in page 0, 4,5 in
    # page 2, 6,7 in page 1. prefix 2, accept nodes 1, 2, 5 -> rows 3, 4, 7 move to rows 2, 3, 4:
    # row 3 -> 2 inside page 0, row 4 (page 2) -> 3 (page 0), row 7 (page 1) -> 4 (page 2).
    need("kv_compact_paged", backend)
    kp = torch.arange(4 * 2 * 3, dtype=torch.float32).view(1, 4, 2, 1, 3).to(device)
    vp = -kp
    before = kp.clone()
    table = i32([[3, 0, 2, 1]], device)
    specops.kv_compact_paged(kp, vp, table, i32([2], device), i32([[1, 2, 5, 0]], device), i32([3], device),
                             backend=backend)
    assert torch.equal(kp[0, 0, 0], before[0, 0, 1])  # row 2 <- row 3
    assert torch.equal(kp[0, 0, 1], before[0, 2, 0])  # row 3 <- row 4
    assert torch.equal(kp[0, 2, 0], before[0, 1, 1])  # row 4 <- row 7
    for page, slot in [(3, 0), (3, 1), (2, 1), (1, 0), (1, 1)]:
        assert torch.equal(kp[0, page, slot], before[0, page, slot])
    assert torch.equal(vp, -kp)


def test_kv_compact_paged_shift_chain_through_one_page(backend, device):
    # Every destination is the previous move's source, all inside one 64-row page.
    need("kv_compact_paged", backend)
    kp = torch.arange(64, dtype=torch.float32).view(1, 1, 64, 1, 1).repeat(1, 1, 1, 1, 4).to(device)
    vp = kp.clone()
    idx = torch.arange(1, 31, dtype=torch.int32, device=device)[None]
    specops.kv_compact_paged(kp, vp, i32([[0]], device), i32([3], device), idx, i32([30], device), backend=backend)
    assert kp[0, 0, :, 0, 0].tolist() == [0, 1, 2] + list(range(4, 34)) + list(range(33, 64))
    assert torch.equal(vp, kp)


def test_kv_compact_paged_sequences_may_share_untouched_prefix_pages(backend, device):
    # Sequences 1 and 2 read sequence 0's first page (a shared prompt); the moves touch only rows past
    # it, so the check passes and every sequence compacts its own pages.
    need("kv_compact_paged", backend)
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, 3, 2, 40, 4, generator=g)
    kp, table = to_pages(cache, 16, generator=g, fill=0.0, shared_prefix_pages=1)
    vp = -kp
    S = 40
    prefix = i32([20, 17, 25], device)
    idx = i32([[0, 3, 9], [1, 2, 4], [0, 1, 2]], device)
    lens = i32([3, 3, 2], device)
    kp, vp, table = kp.to(device), vp.to(device), table.to(device)
    want = expected(from_pages(kp, table, S).cpu(), prefix.cpu(), idx.cpu(), lens.cpu())
    specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, backend=backend)
    assert torch.equal(from_pages(kp, table, S).cpu(), want) and torch.equal(vp, -kp)


def test_kv_compact_paged_interleaved_k_and_v_views(backend, device):
    need("kv_compact_paged", backend)
    cache, kp, vp, table, (prefix, idx, lens) = compaction_case(2, 12, "random", 4, torch.float32, seed=5,
                                                                device=device)
    kv = torch.stack([kp, vp], dim=2)  # [L, N, 2, page, H, D]: K and V of a page side by side
    k, v = kv[:, :, 0], kv[:, :, 1]
    specops.kv_compact_paged(k, v, table, prefix, idx, lens, backend=backend)
    specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, backend="torch")
    assert torch.equal(k, kp) and torch.equal(v, vp)


def test_kv_compact_paged_unchecked_garbage_never_writes_outside(backend, device):
    # The pool is the middle of a bigger buffer; garbage page ids, lengths and indices never reach the
    # guard pages, and the valid sequence 0 still compacts.
    need("kv_compact_paged", backend)
    big = torch.randn(2, 12, 4, 2, 8, device=device)
    kp = big[:, 2:10]
    vp = -kp.clone()
    guard = big[:, :2].clone(), big[:, 10:].clone()
    table = i32([[1, 0, 2, 3], [-3, 8, 2**31 - 1, 5], [4, 4, 4, 4], [6, 7, -1, 9]], device)
    prefix = i32([3, 2, -4, 2**31 - 3], device)
    idx = i32([[1, 2, 4], [0, 5, 9], [0, 30, 1], [5, 2**31 - 1, 0]], device)
    lens = i32([3, 3, -2, 3], device)
    k0 = kp.clone()
    specops.kv_compact_paged(kp, vp, table, prefix, idx, lens, check=False, backend=backend)
    assert torch.equal(big[:, :2], guard[0]) and torch.equal(big[:, 10:], guard[1])
    # sequence 0: rows 4, 5, 7 (page 0 slot 0, page 0 slot 1, page 0 slot 3) -> rows 3, 4, 5
    assert torch.equal(kp[:, 1, 3], k0[:, 0, 0]) and torch.equal(kp[:, 0, 0], k0[:, 0, 1])
    assert torch.equal(kp[:, 0, 1], k0[:, 0, 3])


def _good_compact():
    g = torch.Generator().manual_seed(3)
    kp, vp = torch.randn(2, 6, 4, 3, 4, generator=g), torch.randn(2, 6, 4, 3, 4, generator=g)
    # Sequence 0 moves row 5 to row 4, sequence 1 row 6 to row 5: both inside their page 1.
    return dict(k_pages=kp, v_pages=vp, page_table=i32([[5, 0, 2], [1, 3, 4]]), prefix_lens=i32([2, 4]),
                accept_idx=i32([[0, 1, 3], [0, 2, 6]]), accept_lens=i32([3, 2]))


BAD_COMPACT = [
    ("k_pages", lambda a: a["k_pages"][:, :, :3], ValueError, r"k_pages page_size \(dim 2\) must be a power of two"),
    ("k_pages", lambda a: a["k_pages"].double(), TypeError, "k_pages must have dtype"),
    ("k_pages", lambda a: a["k_pages"][0], ValueError, "k_pages must have rank 5"),
    ("v_pages", lambda a: a["v_pages"][:, :5], ValueError, r"v_pages must have shape \[2, 6, 4, 3, 4\]"),
    ("v_pages", lambda a: a["k_pages"], ValueError, "v_pages must not share memory with k_pages"),
    ("k_pages", lambda a: a["k_pages"][:, :1].expand(2, 6, 4, 3, 4), ValueError,
     "k_pages must not address one element twice"),
    ("page_table", lambda a: a["page_table"].long(), TypeError, "page_table must have dtype torch.int32"),
    ("page_table", lambda a: i32([[5, 0, 2]]), ValueError, r"prefix_lens must have shape \[1\]"),
    ("page_table", lambda a: i32([[5, 6, 2], [1, 3, 4]]), ValueError,
     r"page_table\[0, 1\] must lie in \[0, num_pages=6\) \(page 1 holds rows \[4, 8\) of sequence 0, which uses 6 "
     r"rows\), got 6"),
    ("page_table", lambda a: i32([[5, 0, 2], [1, -1, 4]]), ValueError,
     r"page_table\[1, 1\] must lie in \[0, num_pages=6\)"),
    # sequence 1's page 1 is sequence 0's page 1, which both write
    ("page_table", lambda a: i32([[5, 3, 2], [1, 3, 4]]), ValueError,
     r"page_table\[0, 1\] = 3 holds rows the compaction writes \(rows \[4, 8\) of sequence 0\), so it must be no "
     r"other entry the moves address, got page_table\[1, 1\] = 3 too"),
    # a written page that is also sequence 1's prefix page 0 (read only there: still refused)
    ("page_table", lambda a: i32([[5, 1, 2], [1, 3, 4]]), ValueError, r"page_table\[0, 1\] = 1 holds rows .* "
     r"got page_table\[1, 0\] = 1 too"),
    # one sequence listing the written page twice
    ("page_table", lambda a: i32([[0, 0, 2], [1, 3, 4]]), ValueError, r"page_table\[0, 1\] = 0 holds rows .* "
     r"got page_table\[0, 0\] = 0 too"),
    ("prefix_lens", lambda a: i32([2, 13]), ValueError, r"prefix_lens must lie in \[0, max_pages \* page_size = 12\]"),
    ("accept_idx", lambda a: i32([[0, 1, 1], [0, 2, 6]]), ValueError,
     r"accept_idx\[0, 2\] must be > accept_idx\[0, 1\] = 1"),
    ("accept_idx", lambda a: i32([[0, 1, 10], [0, 2, 6]]), ValueError,
     r"accept_idx\[0, 2\] = 10 plus prefix_lens\[0\] = 2 must address a row < max_pages \* page_size = 12"),
    ("accept_lens", lambda a: i32([4, 1]), ValueError, r"accept_lens must lie in \[0, A=3\]"),
    ("accept_lens", lambda a: i32([3, 1]).to("meta"), ValueError, "accept_lens must be on cpu"),
]


@pytest.mark.parametrize("arg, make, exc, match", BAD_COMPACT, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD_COMPACT)])
def test_kv_compact_paged_bad_input_raises_and_leaves_pages_untouched(backend, arg, make, exc, match):
    need("kv_compact_paged", backend)
    args = _good_compact()
    args[arg] = make(args)
    k, v = args["k_pages"], args["v_pages"]
    before = k.clone(), v.clone()
    with pytest.raises(exc, match=match):
        specops.kv_compact_paged(**args, backend=backend)
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])


def test_kv_compact_paged_good_input_passes_the_checks():
    args = _good_compact()
    specops.kv_compact_paged(**args)  # the base of BAD_COMPACT is valid


# ---- the emulated CUDA kernels: results independent of the thread order ------------------------

def _cudasim_cases():
    """One call per paged CUDA kernel: the CUDA-core kernel (fp32), the tensor-core one (bf16) and the
    compaction, with a shift chain through shared pages (every destination the previous source)."""
    def attention(dtype):
        args, kw, paged = paged_case(2, 9, 14, 50, 6, 2, 40 if dtype == torch.float32 else 64, dtype, "dag", True,
                                     16, seed=7)
        return lambda: specops.tree_attention_paged(*paged_args(args, paged), backend="cudasim", **kw)

    def compact():
        cache, kp, vp, table, lens = compaction_case(3, 30, "shift", 16, torch.float32, seed=2, D=24)
        specops.kv_compact_paged(kp, vp, table, *lens, backend="cudasim")
        return kp, vp

    return {"tree_attention_paged[fp32]": attention(torch.float32),
            "tree_attention_paged[bf16]": attention(torch.bfloat16), "kv_compact_paged": compact}


@pytest.mark.parametrize("name", ["tree_attention_paged[fp32]", "tree_attention_paged[bf16]", "kv_compact_paged"])
def test_cudasim_result_does_not_depend_on_the_thread_order(name):
    from specops import extension as _ext

    sim = _ext.cudasim_ext
    if sim is None:
        pytest.skip(f"cudasim: {_ext.cudasim_ext_error}")
    case = _cudasim_cases()[name]
    want = case()
    try:
        for order, seed in [("reverse", 0), ("shuffle", 1), ("shuffle", 2)]:
            sim.set_schedule(order, seed)
            got = case()
            for w, o in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
                assert torch.equal(w, o), f"{name}: {order}/{seed} differs from the forward order"
    finally:
        sim.set_schedule("forward")


# ---- registration ------------------------------------------------------------------------------

needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0] or not hasattr(torch.ops.specops, "kv_compact_paged"),
                               reason="cpp backend unavailable")


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck_tree_attention_paged(dtype):
    args, kw, paged = paged_case(2, 5, 9, 30, 4, 2, 64, dtype, "tree", True, 16, fill=0.0)
    torch.library.opcheck(torch.ops.specops.tree_attention_paged.default,
                          (*paged_args(args, paged), kw["q_lens"], 0.125))


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_opcheck_kv_compact_paged(dtype):
    cache, kp, vp, table, lens = compaction_case(3, 9, "random", 4, dtype, seed=3)
    torch.library.opcheck(torch.ops.specops.kv_compact_paged.default, (kp, vp, table, *lens))


@needs_cpp
def test_torch_compile_fullgraph_paged():
    args, kw, paged = paged_case(2, 4, 9, 20, 4, 2, 64, torch.float32, "dag", True, 16, fill=0.0)
    cache, kp, vp, table, (prefix, idx, lens) = compaction_case(2, 9, "random", 4, torch.float32, seed=1)
    want_k = kp.clone()
    specops.kv_compact_paged(want_k, vp.clone(), table, prefix, idx, lens, backend="torch")

    def step(q, kpa, vpa, t, p, n, m, ql, kc, vc, tc, pc, ic, lc):
        out = specops.tree_attention_paged(q, kpa, vpa, t, p, n, m, q_lens=ql, check=False, backend="cpp")
        specops.kv_compact_paged(kc, vc, tc, pc, ic, lc, check=False, backend="cpp")
        return out + 1

    got = torch.compile(step, fullgraph=True)(*paged_args(args, paged), kw["q_lens"], kp, vp, table, prefix, idx,
                                              lens)
    assert_close(got - 1, specops.tree_attention(*args, backend="torch", **kw), torch.float32)
    assert torch.equal(kp, want_k)


def test_exported_names():
    assert specops.tree_attention_paged.__module__ == "specops.ops.tree_attention"
    assert specops.kv_compact_paged.__module__ == "specops.ops.kv_compact"
    assert {"tree_attention_paged", "kv_compact_paged"} <= set(specops.__all__)
