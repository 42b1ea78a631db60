"""specops.linear on the GPU backends, without a GPU: Triton (interpreted on CPU tensors) and the CUDA
kernel (through cudasim; the real device where one exists).

Values against the torch reference (specops.ops.linear.ref) within the tolerance of two fp32
reduction orders, on odd shapes, with and without bias, through [B, T, K] and strided rows; and the
batch-invariance contract per backend: row i of an M-row call equals the one-row call on row i bit
for bit, whatever M, the row's position, the order of the rows or the alignment of the operands.
"""
import pytest
import torch

import specops
from specops import extension as _ext
from specops.ops.linear import ref

GPU_BACKENDS = ("triton", "cuda", "cudasim")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _params():
    params = []
    for name in GPU_BACKENDS:
        ok, why = specops.backend.available(name, DEVICE)
        marks = () if ok else (pytest.mark.skip(reason=f"{name}: {why}"),)
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.fixture(params=_params())
def backend(request):
    """The conftest fixture narrowed to the GPU kernels (torch and cpp are tests/test_linear.py's)."""
    return request.param


def operands(M, K, N, dtype, bias, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)
    w = torch.randn(N, K, generator=g).to(dtype).to(DEVICE)
    b = torch.randn(N, generator=g).to(dtype).to(DEVICE) if bias else None
    return x, w, b


def assert_matches_ref(out, x, w, b):
    """Within two fp32 reduction orders of the reference, then one rounding each to the output dtype.

    fp32: rtol 1e-5 and atol 1e-5 per 16 elements of K (one lane block of the reference). bf16 /
    fp16: one ulp of the output dtype at the larger magnitude (each side rounds once; they may
    straddle a rounding boundary) plus 2 K eps32 sum |x||w| (the worst-case gap between two fp32
    summation orders)."""
    K = x.shape[-1]
    x2, want = x.reshape(-1, K), None
    want = ref.linear(x2.cpu(), w.cpu(), None if b is None else b.cpu()).reshape(out.shape)
    out = out.cpu()
    assert out.dtype == x.dtype and out.shape == (*x.shape[:-1], w.shape[0])
    if x.dtype == torch.float32:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5 * max(1.0, K / 16))
        return
    mag = torch.maximum(out.float().abs(), want.float().abs())
    absprod = (x2.cpu().double().abs() @ w.cpu().double().abs().T).reshape(out.shape)
    info = torch.finfo(x.dtype)
    bound = info.eps * mag + 2 * K * torch.finfo(torch.float32).eps * absprod + info.tiny
    err = (out.float() - want.float()).abs()
    worst = (err - bound).argmax()
    assert (err <= bound).all(), (f"{x.dtype}: |out - ref| {err.flatten()[worst]:.3g} > {bound.flatten()[worst]:.3g} "
                                  f"at {worst.item()}")


# Every M in 1 2 3 7 16 17 33, K in 1 15 16 17 64 100 576 and N in 1 7 33 129 at least once; the
# interpreter runs M/16 x N/32 x K/128 (fp32: K/32) tile iterations of ~10 ms each.
SHAPES = [(1, 1, 1), (2, 15, 7), (3, 16, 33), (7, 17, 129), (16, 64, 7), (17, 100, 33), (33, 576, 33),
          (1, 576, 129), (16, 576, 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M, K, N", SHAPES)
def test_values_match_the_reference(backend, M, K, N, dtype):
    bias = (M + K + N) % 2 == 0  # both, spread over the shapes (test_bias_and_layouts has both on one)
    x, w, b = operands(M, K, N, dtype, bias)
    assert_matches_ref(specops.linear(x, w, b, backend=backend), x, w, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bias_and_layouts(backend, dtype):
    # x as [B, T, K] with strided rows (a view of a wider buffer: no copy on the way in), weight rows
    # strided too, and a transposed x (last stride != 1: the entry makes it contiguous).
    B, T, K, N = 2, 5, 40, 19
    g = torch.Generator().manual_seed(1)
    xb = torch.randn(B, T, K + 7, generator=g).to(dtype).to(DEVICE)
    wb = torch.randn(N, K + 3, generator=g).to(dtype).to(DEVICE)
    bias = torch.randn(N, generator=g).to(dtype).to(DEVICE)
    x, w = xb[..., 2:K + 2], wb[:, 1:K + 1]
    for b in (None, bias):
        out = specops.linear(x, w, b, backend=backend)
        assert out.shape == (B, T, N)
        assert_matches_ref(out, x, w, b)
        assert torch.equal(out, specops.linear(x.contiguous(), w.contiguous(), b, backend=backend))
    xt = torch.randn(K, 6, generator=g).to(dtype).to(DEVICE).T  # [6, K], column stride 6
    assert_matches_ref(specops.linear(xt, w, bias, backend=backend), xt, w, bias)
    assert specops.linear(x[:, :0], w, bias, backend=backend).shape == (B, 0, N)  # no rows: nothing launched


# ---- batch invariance ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", [5, 17, 33])
def test_every_row_equals_its_one_row_call(backend, M, dtype):
    # K spans several K tiles of either kernel (Triton 16-bit: 128, fp32: 32; CUDA: steps of 128).
    K, N = 300, 40
    x, w, b = operands(M, K, N, dtype, bias=M != 17, seed=M)
    full = specops.linear(x, w, b, backend=backend)
    for i in range(M):
        one = specops.linear(x[i:i + 1], w, b, backend=backend)
        assert torch.equal(one, full[i:i + 1]), f"row {i} of {M} differs from its one-row call"
    assert torch.equal(specops.linear(x[M - 1], w, b, backend=backend), full[M - 1])  # x of rank 1: [K]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_do_not_depend_on_the_batch_layout(backend, dtype):
    # The same rows shuffled, repeated, grouped as [B, T, K] or mixed into a bigger batch give the
    # same output rows: each row's value is a function of that row alone.
    M, K, N = 24, 100, 33
    x, w, b = operands(M, K, N, dtype, bias=True, seed=3)
    full = specops.linear(x, w, b, backend=backend)
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    assert torch.equal(specops.linear(x[perm], w, b, backend=backend), full[perm])
    rep = torch.tensor([3, 3, 0, 23, 3, 11, 0], device=DEVICE)
    assert torch.equal(specops.linear(x[rep], w, b, backend=backend), full[rep])
    assert torch.equal(specops.linear(x.view(4, 6, K), w, b, backend=backend), full.view(4, 6, N))
    other, _, _ = operands(9, K, N, dtype, bias=False, seed=5)
    mixed = torch.cat([other, x[:5], other])  # rows 9..13: x's first five, at other tile positions
    assert torch.equal(specops.linear(mixed, w, b, backend=backend)[9:14], full[:5])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rows_do_not_depend_on_operand_alignment(backend, dtype):
    # The same values at addresses that are (not) 16-byte aligned: the kernels may load them with
    # other vector widths (the CUDA kernel's vector and scalar weight paths), never in another order.
    M, K, N = 6, 64, 20
    x, w, b = operands(M, K, N, dtype, bias=True, seed=6)
    want = specops.linear(x, w, b, backend=backend)
    xs = torch.empty(M * K + 1, dtype=dtype, device=DEVICE)[1:].view(M, K)
    ws = torch.empty(N, K + 1, dtype=dtype, device=DEVICE)[:, 1:]  # odd row stride, odd offset
    xs.copy_(x)
    ws.copy_(w)
    assert torch.equal(specops.linear(xs, ws, b, backend=backend), want)


# ---- the CUDA kernel under the emulator's adversarial modes --------------------------------------------

sim = _ext.cudasim_ext
needs_sim = pytest.mark.skipif(sim is None, reason=f"cudasim: {_ext.cudasim_ext_error}")


def _sim_case():
    # 2 row-chunk blocks of 16 rows (register groups of 8), 3 column blocks, K over two staged chunks
    # of 512 with a ragged tail (K % 4 != 0: the scalar weight path).
    x, w, b = operands(21, 530, 19, torch.bfloat16, bias=True, seed=7)
    x4, w4, _ = operands(21, 532, 19, torch.float32, bias=False, seed=8)  # the vector path
    return lambda: (specops.linear(x, w, b, backend="cudasim"), specops.linear(x4, w4, backend="cudasim"))


@needs_sim
def test_cudasim_thread_orders_and_racecheck():
    """Same results whatever order the emulated threads run in, and no shared-memory hazard under
    racecheck (the x staging buffer is refilled once per 512 K elements)."""
    if not specops.backend.available("cudasim", "cpu")[0]:
        pytest.skip("cudasim unavailable")
    case = _sim_case()
    want = case()
    try:
        for order, seed in (("reverse", 0), ("shuffle", 1), ("warp_ahead", 0), ("warp_ahead", 3)):
            sim.set_schedule(order, seed)
            assert all(torch.equal(a, c) for a, c in zip(want, case())), f"{order}/{seed} differs"
    finally:
        sim.set_schedule("forward", 0)
    was = sim.racecheck()
    try:
        sim.set_racecheck(True)
    except RuntimeError:  # an ASan build has no racecheck instrumentation
        pytest.skip("cudasim built without racecheck's instrumentation")
    try:
        assert all(torch.equal(a, c) for a, c in zip(want, case()))
    finally:
        sim.set_racecheck(was)
    assert "linear_kernel" in set(sim.racechecked())
