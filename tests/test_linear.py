"""specops.linear (torch reference and cpp): values against float64, the batch-invariance property
(row i of an M-row call == the one-row call, bit for bit, for every M, thread count and row order),
the cpp kernel's instruction sets agreeing bit for bit, bad input, registration.
The triton and cudasim backends: tests/test_linear_gpu_backends.py."""
import pytest
import torch

import specops
from specops import backend as _backend
from specops.ops.linear import cpu_kernel

CPU_BACKENDS = [pytest.param(b, marks=() if _backend.available(b, "cpu")[0] else
                             pytest.mark.skip(reason=f"{b}: {_backend.available(b, 'cpu')[1]}"))
                for b in ("torch", "cpp")]
needs_cpp = pytest.mark.skipif(not _backend.available("cpp")[0], reason="the CPU extension is not built")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make(M, K, N, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return x, w, b


def exact(x, w, b):
    """float64 result and a bound on what fp32 accumulation may lose on it."""
    y = x.double() @ w.double().T + (0 if b is None else b.double())
    mag = x.double().abs() @ w.double().abs().T
    return y, mag * x.shape[-1] * 2.0 ** -23


def check_close(out, x, w, b):
    y, acc_err = exact(x, w, b)
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
def test_cpp_matches_the_reference_closely(dtype, K, N):
    # Both follow the same lane order; cpp fuses each multiply-add, the reference rounds twice, so
    # they may differ in the last fp32 bits and then by one unit of a 16-bit output dtype.
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
    old = torch.get_num_threads()
    try:
        outs = []
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
    # The machine's best kernel (AVX-512's paired rows where present) against a capped one: the same
    # order per element, so the same bits (row tails, column tails and K tails included).
    x, w, b = make(M, K, N, dtype)
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


@pytest.mark.parametrize("call,exc,words", [
    (lambda x, w, b: specops.linear(x.numpy(), w), TypeError, ["x", "torch.Tensor"]),
    (lambda x, w, b: specops.linear(x.long(), w), TypeError, ["x", "dtype", "int64"]),
    (lambda x, w, b: specops.linear(x, w.half()), TypeError, ["weight", "dtype", "float16"]),
    (lambda x, w, b: specops.linear(x, w[:, :3]), ValueError, ["weight", "[N, K=5]", "(4, 3)"]),
    (lambda x, w, b: specops.linear(x, w[0]), ValueError, ["weight", "rank 2"]),
    (lambda x, w, b: specops.linear(x, w, b[:2]), ValueError, ["bias", "[4]", "(2,)"]),
    (lambda x, w, b: specops.linear(x, w, b.double()), TypeError, ["bias", "float64"]),
    (lambda x, w, b: specops.linear(x[:, :0], w[:, :0]), ValueError, ["K >= 1", "K=0"]),
    (lambda x, w, b: specops.linear(torch.tensor(1.0), w), ValueError, ["x", "rank >= 1"]),
])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_bad_input_names_the_argument(backend, call, exc, words):
    x, w, b = make(3, 5, 4, torch.float32)
    with pytest.raises(exc) as info:
        with specops.use_backend(backend):
            call(x, w, b)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@needs_cpp
def test_registration_opcheck_and_compile():
    x, w, b = make(3, 24, 10, torch.bfloat16)
    torch.library.opcheck(torch.ops.specops.linear.default, (x, w, b))
    torch.library.opcheck(torch.ops.specops.linear.default, (x, w, None))
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
    with pytest.raises(ValueError, match="weight must have x's dtype"):
        specops._C.linear(x, w.double(), None)
    with pytest.raises(TypeError, match="argument 1 must be a torch.Tensor, got int"):
        specops._C.linear(x, 3, None)
    with pytest.raises(TypeError, match="takes 3 arguments, got 2"):
        specops._C.linear(x, w)


@needs_cpp
def test_direct_entry_leaves_compile_and_subclasses_to_the_op():
    x, w, b = make(3, 24, 10, torch.float32)
    fn = torch.compile(lambda a: cpu_kernel(a, w, b), fullgraph=True)  # a raw builtin would break the graph
    assert torch.equal(fn(x), specops._C.linear(x, w, b))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:  # fake tensors have no data: the op's fake kernel answers
        out = cpu_kernel(mode.from_tensor(x), mode.from_tensor(w), None)
    assert out.shape == (3, 10)
