"""specops.linear on every backend: values (cpu: against float64; gpu: against the torch reference within
two fp32 reduction orders), batch invariance (row i of an M-row call == the one-row call, bit for bit, for
every M, thread count, row order, batch layout and operand alignment), the cpp kernel's instruction sets
agreeing bit for bit, registration; the CUDA kernel under the emulator's thread orders and racecheck (bad
input: tests/test_bad_input.py). Without a GPU, Triton runs interpreted and the CUDA kernel on cudasim."""
import functools
import itertools

import pytest
import torch
from _cudasim import assert_order_independent, needs_sim, racecheck_built, restored, sim
from _op_checks import needs_cpp

import specops
from specops import backend as _backend
from specops.ops.linear import LAYOUTS, cpu_kernel, machine_layout, pack_weight, packed_shape, ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def backends(names, device):
    return [pytest.param(b, id=b, marks=() if _backend.available(b, device)[0] else
                         pytest.mark.skip(reason=f"{b}: {_backend.available(b, device)[1]}")) for b in names]


CPU_BACKENDS = backends(("torch", "cpp"), "cpu")


@pytest.fixture(params=backends(("triton", "cuda", "cudasim"), DEVICE))
def backend(request):
    """The conftest fixture narrowed to the GPU kernels (the torch and cpp tests take CPU_BACKENDS)."""
    return request.param


def make(M, K, N, dtype, bias=True, seed=0, device="cpu", scale=True):
    """x [M, K], weight [N, K] (scaled by K ** -0.5 unless not ``scale``), bias [N] or None."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype).to(device)
    w = (torch.randn(N, K, generator=g) / (K ** 0.5 if scale else 1)).to(dtype).to(device)
    b = torch.randn(N, generator=g).to(dtype).to(device) if bias else None
    return x, w, b


operands = functools.partial(make, device=DEVICE, scale=False)  # the GPU tests' inputs


def check_close(out, x, w, b):
    """Against the float64 result: what fp32 accumulation may lose on it, then one rounding."""
    y = x.double() @ w.double().T + (0 if b is None else b.double())
    acc_err = (x.double().abs() @ w.double().abs().T) * x.shape[-1] * 2.0 ** -23
    ulp = {torch.float32: 2.0 ** -23, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[out.dtype]
    tol = acc_err + y.abs() * ulp + 1e-30  # accumulation error, then one rounding to the output dtype
    err = (out.double() - y).abs()
    assert (err <= tol).all(), f"max err {err.max():.3g} over tol at {(err - tol).argmax()}"


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (3, 7, 5), (2, 8, 9), (5, 17, 33), (16, 64, 40), (17, 100, 129),
                                   (4, 576, 192), (33, 31, 7)])
def test_values_within_accumulation_error(backend, dtype, M, K, N):
    for bias in (True, False):
        x, w, b = make(M, K, N, dtype, bias)
        out = specops.linear(x, w, b, backend=backend)
        assert out.shape == (M, N) and out.dtype == dtype
        check_close(out, x, w, b)


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", [(1, 3), (9, 17), (576, 192), (63, 100)])
def test_cpp_matches_the_reference_closely(dtype, K, N, monkeypatch):
    # Both follow the same lane order; cpp fuses each multiply-add, the reference rounds twice, so
    # they may differ in the last fp32 bits and then by one unit of a 16-bit output dtype. (The AMX
    # tiles, a bf16 call's kernel where the CPU has them, sum in their own order: capped off here.)
    monkeypatch.setenv("SPECOPS_CPU_ISA", "avx512")
    x, w, b = make(6, K, N, dtype)
    a = specops.linear(x, w, b, backend="cpp").double()
    r = specops.linear(x, w, b, backend="torch").double()
    ulp = {torch.float32: 2.0 ** -20, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[dtype]
    assert ((a - r).abs() <= r.abs() * ulp + 1e-6).all()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", [(5, 11), (64, 24), (100, 37), (576, 64)])
def test_row_equals_the_one_row_call_bit_for_bit(backend, dtype, K, N):
    x, w, b = make(37, K, N, dtype, seed=K)
    alone = torch.cat([specops.linear(x[i:i + 1], w, b, backend=backend) for i in range(37)])
    for M in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 37):
        assert torch.equal(specops.linear(x[:M], w, b, backend=backend), alone[:M]), f"M={M}"
    perm = torch.randperm(37, generator=torch.Generator().manual_seed(1))
    assert torch.equal(specops.linear(x[perm], w, b, backend=backend), alone[perm])
    # a [B, T, K] batch: the same rows wherever they sit
    assert torch.equal(specops.linear(x[:36].view(4, 9, K), w, b, backend=backend), alone[:36].view(4, 9, N))


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_thread_counts_give_the_same_bits(dtype):
    x, w, b = make(9, 200, 301, dtype)
    old, outs = torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(specops.linear(x, w, b, backend="cpp"))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(outs[0], outs[1])


@needs_cpp
@pytest.mark.parametrize("cap", ["generic", "avx2"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("M,K,N", [(1, 576, 200), (5, 13, 31), (12, 64, 9), (2, 100, 37), (3, 576, 64),
                                   (4, 72, 40), (7, 1536, 33), (17, 40, 17)])
def test_isa_kernels_agree_bit_for_bit(monkeypatch, cap, dtype, M, K, N):
    # The machine's best lane-order kernel (AVX-512's paired rows where present; the AMX tiles have
    # their own order) against a capped one: the same order per element, so the same bits (row tails,
    # column tails and K tails included).
    x, w, b = make(M, K, N, dtype)
    monkeypatch.setenv("SPECOPS_CPU_ISA", "avx512")
    fast = specops.linear(x, w, b, backend="cpp")
    monkeypatch.setenv("SPECOPS_CPU_ISA", cap)
    assert torch.equal(specops.linear(x, w, b, backend="cpp"), fast)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_strided_and_empty_inputs(backend):
    x, w, b = make(6, 40, 10, torch.float32)
    xt = torch.randn(40, 6).T  # [6, 40], stride(-1) != 1
    check_close(specops.linear(xt, w, b, backend=backend), xt, w, b)
    wt = torch.randn(40, 10).T
    check_close(specops.linear(x, wt, None, backend=backend), x, wt, None)
    assert specops.linear(x[:0], w, b, backend=backend).shape == (0, 10)
    assert specops.linear(x[0], w, b, backend=backend).shape == (10,)


def test_pack_weight_is_the_documented_layout():
    w = torch.randn(11, 21).bfloat16()  # N and K past a group / chunk: zero padding on both axes
    p = pack_weight(w, "avx512")
    assert p.shape == (2, 2, 128) and p.dtype == torch.bfloat16
    want = torch.zeros(2, 2, 128, dtype=torch.bfloat16)
    for g, c, pair, h, lane, s in itertools.product(*map(range, (2, 2, 4, 2, 8, 2))):
        n, k = 8 * g + 2 * pair + h, 16 * c + 8 * s + lane
        if n < 11 and k < 21:
            want[g, c, 32 * pair + 16 * h + 2 * lane + s] = w[n, k]
    assert torch.equal(p, want)
    w = torch.randn(17, 33).bfloat16()  # the AMX tiles' layout: 16 x 32 blocks, zero-padded
    want = torch.zeros(2, 2, 512, dtype=torch.bfloat16)
    for t, c, i, k in itertools.product(*map(range, (2, 2, 16, 32))):
        if 16 * t + i < 17 and 32 * c + k < 33:
            want[t, c, 32 * i + k] = w[16 * t + i, 32 * c + k]
    assert torch.equal(pack_weight(w, "amx"), want)
    assert pack_weight(w).shape == packed_shape(w) == packed_shape(w, machine_layout())
    with pytest.raises(TypeError, match="weight must have dtype torch.bfloat16, got torch.float32"):
        pack_weight(w.float())
    with pytest.raises(ValueError, match="weight must have rank 2"):
        pack_weight(w[0])
    with pytest.raises(ValueError, match=r"layout must be one of \('avx512', 'amx'\) or None, got 'vnni'"):
        pack_weight(w, "vnni")


@needs_cpp
@pytest.mark.parametrize("isa", [None, "avx512", "avx2", "generic"])
@pytest.mark.parametrize("N,K", [(1, 1), (7, 5), (8, 16), (9, 17), (33, 48), (100, 31), (24, 40), (40, 64)])
def test_packed_weight_gives_the_plain_weights_bits(N, K, isa, monkeypatch):
    """Either packed layout gives the op's bits for every M, with and without bias: read by the kernel
    whose layout it is (the AVX-512 tiles, the AMX tiles), the plain weight read otherwise (the other
    instruction sets); the torch backend takes ``packed`` and ignores it."""
    if isa is not None:
        monkeypatch.setenv("SPECOPS_CPU_ISA", isa)
    for bias, layout in itertools.product((True, False), LAYOUTS):
        x, w, b = make(37, K, N, torch.bfloat16, bias=bias, seed=N * 31 + K)
        p = pack_weight(w, layout)
        for M in [*range(1, 14), 16, 17, 32, 33, 37]:  # every row tile split; 16-row blocks, one and two at a time
            plain = specops.linear(x[:M], w, b, backend="cpp")
            assert torch.equal(specops.linear(x[:M], w, b, packed=p, backend="cpp"), plain), (M, bias, layout)
            assert torch.equal(torch.ops.specops.linear_packed(x[:M], w, p, b), plain), (M, bias, layout)
            assert torch.equal(specops.linear(x[:M], w, b, packed=p, backend="torch"),
                               specops.linear(x[:M], w, b, backend="torch"))


@needs_cpp
def test_packed_op_rejects_a_packed_tensor_of_another_shape():
    x, w, _ = make(3, 5, 4, torch.bfloat16)
    with pytest.raises(ValueError, match=r"packed must be pack_weight\(weight\).*\[1, 1, 128\].*\[2, 1, 128\]"):
        torch.ops.specops.linear_packed(x, w, torch.zeros(2, 1, 128, dtype=torch.bfloat16), None)


@needs_cpp
def test_registration_opcheck_and_compile():
    x, w, b = make(3, 24, 10, torch.bfloat16)
    for bias in (b, None):
        torch.library.opcheck(torch.ops.specops.linear.default, (x, w, bias))
        torch.library.opcheck(torch.ops.specops.linear_packed.default, (x, w, pack_weight(w), bias))
    assert "linear" in _backend.ops() and {"torch", "cpp"} <= set(_backend.implementations("linear"))
    fn = torch.compile(lambda a: torch.ops.specops.linear(a, w, b), fullgraph=True)
    assert torch.equal(fn(x), specops.linear(x, w, b, backend="cpp"))


@needs_cpp
@pytest.mark.parametrize("dtype", DTYPES)
def test_direct_entry_is_the_registered_op_bit_for_bit(dtype):
    """The cpp backend's eager calls skip the dispatcher (specops._C.linear); the same kernel."""
    x, w, b = make(7, 45, 23, dtype)
    for bias in (b, None):
        want = torch.ops.specops.linear(x, w, bias)
        assert torch.equal(specops._C.linear(x, w, bias), want)
        assert torch.equal(cpu_kernel(x, torch.nn.Parameter(w, requires_grad=False), bias), want)
    for args, exc, match in (((x, w.double(), None), ValueError, "weight must have x's dtype"),
                             ((x, 3, None), TypeError, "argument 1 must be a torch.Tensor, got int"),
                             ((x, w), TypeError, "takes 3 or 4 arguments, got 2")):
        with pytest.raises(exc, match=match):
            specops._C.linear(*args)


@needs_cpp
def test_direct_entry_leaves_compile_and_subclasses_to_the_op():
    x, w, b = make(3, 24, 10, torch.float32)
    fn = torch.compile(lambda a: cpu_kernel(a, w, b), fullgraph=True)  # a raw builtin would break the graph
    assert torch.equal(fn(x), specops._C.linear(x, w, b))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:  # fake tensors have no data: the op's fake kernel answers
        out = cpu_kernel(mode.from_tensor(x), mode.from_tensor(w), None)
    assert out.shape == (3, 10)


# ---- the GPU backends (triton, cuda, cudasim) -----------------------------------------------------------

def assert_matches_ref(out, x, w, b):
    """Within two fp32 reduction orders of the reference, then one rounding each (maybe across a rounding
    boundary) to the output dtype: fp32 rtol 1e-5, atol 1e-5 per 16 elements of K (a reference lane block);
    bf16 / fp16 one ulp at the larger magnitude plus 2 K eps32 sum |x||w| (two fp32 orders' worst gap)."""
    K = x.shape[-1]
    x2 = x.reshape(-1, K)
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
    xb, wb, bias = operands(B * T, K + 7, N, dtype, bias=True, seed=1)
    x, w = xb.view(B, T, K + 7)[..., 2:K + 2], wb[:, 1:K + 1]
    for b in (None, bias):
        out = specops.linear(x, w, b, backend=backend)
        assert out.shape == (B, T, N)
        assert_matches_ref(out, x, w, b)
        assert torch.equal(out, specops.linear(x.contiguous(), w.contiguous(), b, backend=backend))
    xt = torch.randn(K, 6).to(dtype).to(DEVICE).T  # [6, K], column stride 6
    assert_matches_ref(specops.linear(xt, w, bias, backend=backend), xt, w, bias)
    assert specops.linear(x[:, :0], w, bias, backend=backend).shape == (B, 0, N)  # no rows: nothing launched


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

@needs_sim
def test_cudasim_thread_orders_and_racecheck():
    """Same results in any order of the emulated threads, no shared-memory hazard under racecheck (the x
    staging buffer is refilled once per 512 K elements): 2 row-chunk blocks of 16 rows (register groups of
    8), 3 column blocks, fp32 K = 532 over two staged chunks (the vector weight path). bf16, K = 530 (the
    scalar path, K % 4 != 0, a ragged tail): tests/test_cudasim.py's "linear" case, same orders, racecheck."""
    x, w, _ = operands(21, 532, 19, torch.float32, bias=False, seed=8)
    case = lambda: specops.linear(x, w, backend="cudasim")
    want = assert_order_independent(case, (("reverse", 0), ("shuffle", 1), ("warp_ahead", 0), ("warp_ahead", 3)))
    if not racecheck_built():
        pytest.skip("cudasim built without racecheck's instrumentation")
    with restored():
        sim.set_racecheck(True)
        assert torch.equal(case(), want)
    assert "linear_kernel" in set(sim.racechecked())
