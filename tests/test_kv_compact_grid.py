"""kv_compact against the gather-then-scatter reference on grids, every backend: overlap patterns,
batch sizes, layers, dtypes, strided views, parallel slices, random cases, and paged caches (page
sizes 1 to 64) against the reference and the contiguous op on the same data; empty and unchecked input."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kv_compact import (
    DTYPES,
    PATTERNS,
    caches,
    compaction_case,
    expected,
    grid_case,
    i32,
    need,
    random_moves,
    run_and_compare,
)

import specops
from specops import backend as _backend
from specops.testing import from_pages


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("L", [1, 4])
def test_matches_gather_then_scatter(backend, device, pattern, B, L):
    need("kv_compact", backend)
    case = grid_case(B, L, 64, pattern, torch.float32, "contiguous", device, seed=B * 100 + L)
    run_and_compare(*case, backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("view", ["contiguous", "sliced", "interleaved", "seq_major"])
def test_matches_reference_for_every_dtype_and_view(backend, device, dtype, view):
    need("kv_compact", backend)
    for seed, pattern in enumerate(PATTERNS):
        run_and_compare(*grid_case(3, 2, 33, pattern, dtype, view, device, seed=seed, H=3, D=5), backend)


def test_rows_of_64_kib_slices_move_in_parallel_and_stay_correct(backend, device):
    need("kv_compact", backend)
    # 63 rows of 512 B per slice and cache: big enough that cpp splits the slices across threads;
    # "shift" makes every destination the source of the previous move, in one overlapping run.
    for pattern in ("shift", "alternating", "random"):
        case = grid_case(3, 2, 64, pattern, torch.float32, "contiguous", device, seed=7, H=4, D=128)
        run_and_compare(*case, backend)


def test_empty_inputs_are_no_ops(backend, device):
    need("kv_compact", backend)
    k, v = caches(2, 2, 1, 6, 4, device=device)
    before = k.clone(), v.clone()
    z = i32([0, 0], device)
    specops.kv_compact(k, v, z, torch.zeros(2, 0, dtype=torch.int32, device=device), z, backend=backend)
    specops.kv_compact(k, v, i32([1, 2], device), i32([[1, 2], [3, 4]], device), z, backend=backend)
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])
    e = torch.zeros(0, 2, 1, 6, 4, device=device)
    specops.kv_compact(e, e.clone(), z, i32([[1, 2], [3, 4]], device), i32([2, 2], device), backend=backend)


def test_unchecked_garbage_never_writes_outside_the_caches(backend, device):
    need("kv_compact", backend)
    # The caches are the middle of bigger buffers; whatever unchecked garbage says, the guard
    # regions around them stay untouched and in-range accepted rows of valid sequences still move.
    big = torch.randn(2, 2, 4, 2, 12 + 10, 8, device=device)  # K and V [L, B, H, S + 10, D], S = 12
    k, v, before = big[0, ..., 5:17, :], big[1, ..., 5:17, :], big.clone()
    prefix = i32([3, 10, -4, 2**31 - 3], device)
    idx = i32([[1, 2, 4], [-9, 5, 6], [0, 30, 1], [5, 2**31 - 1, 0]], device)
    lens = i32([3, 9, -2, 3], device)
    specops.kv_compact(k, v, prefix, idx, lens, check=False, backend=backend)
    for guard in (slice(0, 5), slice(17, None)):
        assert torch.equal(big[..., guard, :], before[..., guard, :])
    # sequence 0 is valid: rows 4, 5, 7 moved to 3, 4, 5
    assert torch.equal(k[:, 0, :, 3:6], before[0, ..., 5:17, :][:, 0, :, [4, 5, 7]])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(B=st.integers(1, 5), A=st.integers(1, 40), extra=st.integers(0, 6), seed=st.integers(0, 2**31 - 1),
       pattern=st.sampled_from(PATTERNS), view=st.sampled_from(["contiguous", "sliced", "seq_major"]))
def test_property_every_backend_equals_gather_then_scatter(B, A, extra, seed, pattern, view, device):
    S = A + extra
    prefix, idx, lens = random_moves(B, A, S, pattern, torch.Generator().manual_seed(seed))
    base = caches(2, B, 3, S, 6, view=view, device=device)
    want = [expected(t.cpu(), prefix, idx, lens) for t in base]
    for name in _backend.implementations("kv_compact"):
        if not _backend.available(name, device)[0]:
            continue
        k, v = (t.clone() for t in base)  # clone() keeps the strides of dense views
        specops.kv_compact(k, v, prefix.to(device), idx.to(device), lens.to(device), backend=name)
        assert torch.equal(k.cpu(), want[0]) and torch.equal(v.cpu(), want[1]), name


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_kv_compact_paged_matches_contiguous_and_reference(backend, device, pattern, page_size):
    need("kv_compact_paged", backend)
    for B, A, dtype in ((1, 33, torch.float32), (3, 20, torch.bfloat16)):
        cache, kp, vp, table, accept = compaction_case(B, A, pattern, page_size, dtype, seed=A + page_size,
                                                       device=device)
        ref_k, ref_v = kp.clone(), vp.clone()
        specops.kv_compact_paged(ref_k, ref_v, table, *accept, backend="torch")
        specops.kv_compact_paged(kp, vp, table, *accept, backend=backend)
        assert torch.equal(kp, ref_k) and torch.equal(vp, ref_v), "pages differ from the torch reference"
        want = expected(cache, *accept)
        S = cache.shape[3]
        assert torch.equal(from_pages(kp, table, S), want) and torch.equal(from_pages(vp, table, S), -want)
        # the contiguous op, same backend, on the same data laid out contiguously
        k, v = cache.clone(), -cache
        specops.kv_compact(k, v, *accept, backend=backend)
        assert torch.equal(k, want) and torch.equal(v, -want)
