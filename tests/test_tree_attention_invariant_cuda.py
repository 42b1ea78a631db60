"""tree_attention's batch-invariant schedule (invariant=True) in the CUDA kernels, run by the cudasim
emulator (docs/cudasim.md): every valid row equals its AR view (specops.testing.ar_view) bit for
bit, for the CUDA-core (fp32) and tensor-core (bf16/fp16) kernels, with prefixes on both sides of a
key tile; values match the torch reference; paged equals contiguous; the thread order and the
cp.async landing change no bit and racecheck finds no hazard. docs/batch_invariance.md states the
contract; tests/test_tree_attention_invariant.py covers torch and cpp."""
import pytest
import torch

import specops
from specops import extension as _ext
from specops.testing import ar_view, to_pages
from test_tree_attention import assert_close, make_case

sim = _ext.cudasim_ext
pytestmark = pytest.mark.skipif(sim is None, reason=f"cudasim: {_ext.cudasim_ext_error}")

BACKEND = "cudasim"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def key_tile(dtype, D):
    """Keys per tile of csrc/cuda/tree_attention.cu: 32 (fp32 kernel), tc: TcCfg<DP>::kBN (64 for
    DP = 64, 32 above)."""
    return 32 if dtype == torch.float32 else (64 if D <= 64 else 32)


def _id(dtype):
    return str(dtype)[6:]


# (D, kind, prefix as a function of the key tile BN, block length L, padded): odd head dims inside
# the CUDA buckets (67: rows not 16-byte aligned, no cp.async), prefixes one short of, on, one past
# and well past tile boundaries (sequence 0 has exactly this prefix; the ragged others less), and
# blocks long enough that a row's block keys fill a tile of their own.
SHAPES = [(24, "tree", lambda bn: bn - 1, 7, True),
          (64, "chain", lambda bn: bn, 7, False),
          (80, "dag", lambda bn: bn + 1, 7, True),
          (64, "tree", lambda bn: 2 * bn + 5, 7, True),
          (67, "chain", lambda bn: bn + 3, 45, True),
          (80, "dag", lambda bn: 2 * bn - 9, 70, False)]
B, TQ, HQ, HKV = 3, 4, 6, 2  # GQA: G = 3 heads per row tile


def case(dtype, shape, seed=0):
    D, kind, prefix, L, padded = shape
    P = prefix(key_tile(dtype, D))
    return make_case(B, TQ, L, P, HQ, HKV, D, dtype, kind=kind, padded=padded, seed=seed + P)


def valid_rows(kw):
    q_lens = kw["q_lens"]
    return [(b, i) for b in range(B) for i in range(TQ) if q_lens is None or i < int(q_lens[b])]


@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"D{s[0]}-{s[1]}-L{s[3]}")
def test_every_row_equals_its_ar_view_bit_for_bit(dtype, shape):
    args, kw = case(dtype, shape)
    out = specops.tree_attention(*args, backend=BACKEND, invariant=True, **kw)
    for b, i in valid_rows(kw):
        for own in (True, False):
            alone = specops.tree_attention(*ar_view(*args, b, i, self_in_block=own), backend=BACKEND, invariant=True)
            assert torch.equal(out[b, i], alone[0, 0]), (b, i, own)
    if kw["q_lens"] is not None:
        for b in range(B):
            assert not out[b, int(kw["q_lens"][b]):].any(), b  # padding rows are 0
    # The values: the torch reference of the schedule (and of the op), within the usual tolerances.
    assert_close(out, specops.tree_attention(*args, backend="torch", invariant=True, **kw), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=_id)
@pytest.mark.parametrize("page_size", [4, 16])
def test_paged_equals_contiguous_bits(dtype, page_size):
    args, kw = case(dtype, SHAPES[3], seed=1)
    q, k, v, p, n, mask = args
    want = specops.tree_attention(*args, backend=BACKEND, invariant=True, **kw)
    kp, table = to_pages(k, page_size, generator=torch.Generator().manual_seed(2))
    vp, _ = to_pages(v, page_size, generator=torch.Generator().manual_seed(2))
    got = specops.tree_attention_paged(q, kp, vp, table, p, n, mask, backend=BACKEND, invariant=True, **kw)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_id)
def test_a_query_over_several_row_tiles_keeps_the_property(dtype):
    """G = 18 heads per kv head: two 16-row tiles per query in the fp32 kernel (its heads split the
    same way in the AR view), 18 of the tensor-core kernel's 64 rows."""
    args, kw = make_case(2, 3, 5, 31, 18, 1, 24, dtype, kind="tree", padded=True, seed=4)
    out = specops.tree_attention(*args, backend=BACKEND, invariant=True, **kw)
    for b in range(2):
        for i in range(int(kw["q_lens"][b])):
            alone = specops.tree_attention(*ar_view(*args, b, i), backend=BACKEND, invariant=True)
            assert torch.equal(out[b, i], alone[0, 0]), (b, i)
    assert_close(out, specops.tree_attention(*args, backend="torch", invariant=True, **kw), dtype)


@pytest.fixture
def emulator():
    """The emulator's thread order, racecheck and cp.async landing as a test leaves them: restored."""
    was = sim.racecheck()
    yield sim
    sim.set_schedule("forward")
    sim.set_racecheck(was)
    sim.set_cp_async("late")


def _racecheck_built():
    was = sim.racecheck()
    try:
        sim.set_racecheck(True)
    except RuntimeError:  # an ASan build (SPECOPS_SANITIZE=1) has no instrumentation
        return False
    sim.set_racecheck(was)
    return True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_id)
def test_thread_order_and_cp_async_landing_change_no_bit_and_racecheck_is_clean(emulator, dtype):
    args, kw = case(dtype, SHAPES[5], seed=3)  # three or more key tiles: both buffers refilled
    q, k, v, p, n, mask = args
    kp, table = to_pages(k, 8, generator=torch.Generator().manual_seed(5))
    vp, _ = to_pages(v, 8, generator=torch.Generator().manual_seed(5))
    calls = [lambda: specops.tree_attention(*args, backend=BACKEND, invariant=True, **kw),
             lambda: specops.tree_attention_paged(q, kp, vp, table, p, n, mask, backend=BACKEND, invariant=True, **kw)]
    want = [c() for c in calls]
    assert torch.equal(want[0], want[1])
    for order, seed in [("reverse", 0), ("shuffle", 1), ("shuffle", 2), ("warp_ahead", 1)]:
        emulator.set_schedule(order, seed)
        for c, w in zip(calls, want):
            assert torch.equal(c(), w), (order, seed)
    emulator.set_schedule("forward")
    if not _racecheck_built():
        pytest.skip("cudasim built without racecheck's instrumentation")
    emulator.set_racecheck(True)  # a hazard raises naming both accesses
    for landing in ("late", "early"):
        emulator.set_cp_async(landing)
        for c, w in zip(calls, want):
            assert torch.equal(c(), w), landing


def test_visible_keys_that_cannot_fit_in_shared_memory_raise():
    """The key list needs min(32 W, S) entries of shared memory: past the device's limit the launcher
    raises naming the mask width and the cache length instead of failing the launch."""
    W, S = 2048, 65536
    q = torch.randn(1, 1, 1, 8)
    k = torch.randn(1, 1, S, 8)
    mask = torch.zeros(1, 1, W, dtype=torch.int32)
    mask[0, 0, 0] = 1
    lens = lambda x: torch.tensor([x], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"invariant=True lists a query's visible block keys.*W = 2048"):
        specops.tree_attention(q, k, k, lens(0), lens(1), mask, backend=BACKEND, invariant=True)
