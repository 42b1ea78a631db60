"""apply_token_bitmask: golden rows, every backend vs the reference, special values, check=False,
registration. Bad input: the battery of tests/test_bad_input.py."""
import pytest
import torch
from _op_checks import needs_cpp

import specops
from specops.ops.token_bitmask import allowed_tokens, apply_token_bitmask

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def random_case(shape, V, dtype=torch.float32, seed=0):
    """(logits ``shape + [V]``, mask: ``shape + [ceil(V/32)]`` words, allowed bool ``shape + [V]``):
    each token allowed with probability 0.3, at least one per row, the bits past V in the last word
    random too (the op must ignore them)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, V, generator=g) * 3).to(dtype)
    allowed = torch.rand(*shape, (V + 31) // 32 * 32, generator=g) < 0.3
    allowed.scatter_(-1, torch.randint(0, V, shape, generator=g)[..., None], True)
    return logits, specops.pack_mask(allowed), allowed[..., :V]


# ---- golden rows, each on every backend --------------------------------------------------------

NAN, INF = float("nan"), float("inf")
ARANGE = torch.arange(40.0)
RANDOM = random_case((2, 3), 70)[0]
GOLDEN = {  # name: (logits, bitmask words, check, the logits after the call)
    # bit 31 makes word 0 negative as int32; bit 20 of word 1 is token 52 >= V (ignored)
    "one_row": (ARANGE[None], [[1 + (1 << 5) - 2**31, (1 << 2) | (1 << 20)]], True,
                ARANGE.where(torch.isin(ARANGE, torch.tensor([0.0, 5.0, 31.0, 34.0])), -INF)[None]),
    "all_allowed": (RANDOM, torch.full((2, 3, 3), -1).tolist(), True, RANDOM),
    "V=1": ([[[2.0], [3.0]]], [[[1], [1 | 2]]], True, [[[2.0], [3.0]]]),
    "nan_disallowed": ([[[NAN] * 40]], [[[1, 0]]], True, [[[NAN] + [-INF] * 39]]),
    # Only bits past V set: the row allows nothing of the vocabulary, so every logit is -inf
    # (check=False: with the check on, that row is an error, see test_bad_input.py).
    "bits_past_V": ([[[0.5] * 33]], [[[0, -2]]], False, [[[-INF] * 33]]),
}


@pytest.mark.parametrize("logits, words, check, want", GOLDEN.values(), ids=GOLDEN)
def test_golden(backend, device, logits, words, check, want):
    logits = torch.as_tensor(logits, dtype=torch.float32, device=device).clone()
    mask = torch.tensor(words, dtype=torch.int32, device=device)
    assert apply_token_bitmask(logits, mask, check=check, backend=backend) is logits
    torch.testing.assert_close(logits.cpu(), torch.as_tensor(want), rtol=0, atol=0, equal_nan=True)


# ---- every backend vs the reference ----------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (2, 7)], ids=lambda s: f"B{s[0]}T{s[1]}")
@pytest.mark.parametrize("V", [1, 31, 32, 33, 1000, 50257])
def test_matches_reference(fast_backend, device, dtype, shape, V):
    if device == "cpu" and fast_backend in ("triton", "cudasim") and V == 50257 and shape != (1, 1):
        shape = (2, 1)  # the interpreter and the emulator are slow; the big-V path is the same
    logits, mask, allowed = random_case(shape, V, DTYPES[dtype], V * 7 + shape[1])
    want = apply_token_bitmask(logits.clone(), mask, backend="torch")
    got = apply_token_bitmask(logits.to(device), mask.to(device), backend=fast_backend).cpu()
    assert torch.equal(got, want)
    # the reference itself: allowed logits unchanged, the rest -inf
    assert torch.equal(want[allowed], logits[allowed])
    assert torch.isneginf(want[~allowed]).all()


@pytest.mark.parametrize("V", [33, 1000])
def test_rank2_matches_rank3(backend, device, V):
    logits, mask, _ = (t.to(device) for t in random_case((6,), V, seed=V))
    flat = apply_token_bitmask(logits.clone(), mask, backend=backend)
    tree = apply_token_bitmask(logits.clone().view(2, 3, V), mask.view(2, 3, -1), backend=backend)
    assert torch.equal(flat, tree.view(6, V))


def test_views_write_through_to_their_buffer(backend, device):
    # A [B, T, V] slice of a wider buffer (rows with padding) and a non-contiguous bitmask.
    V = 100
    buf = random_case((4, 9), V + 28, torch.bfloat16, 3)[0].to(device)
    mask = random_case((3, 2), V, seed=4)[1].to(device).transpose(0, 1)  # [2, 3, W], leading dims transposed
    assert not mask.is_contiguous()
    want_buf = buf.clone()
    for target, name in ((want_buf, "torch"), (buf, backend)):
        apply_token_bitmask(target[1:3, ::2, :V][:, :3], mask, backend=name)  # [2, 3, V], the buffer's strides
    assert torch.equal(buf, want_buf)  # the padding columns and the skipped rows untouched too


def test_empty_leading_dims_are_a_no_op(backend, device):
    for shape in ((0, 4), (3, 0)):
        logits = torch.empty(*shape, 10, device=device)
        empty = torch.empty(*shape, 1, dtype=torch.int32, device=device)
        assert apply_token_bitmask(logits, empty, backend=backend) is logits


# ---- special values ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_inf_and_nan_where_allowed_are_untouched(backend, device, dtype):
    logits = torch.zeros(1, 2, 70, dtype=DTYPES[dtype])
    logits[0, 0, :4] = torch.tensor([-INF, NAN, INF, -0.0])
    logits[0, 1, 64:68] = torch.tensor([-INF, NAN, INF, 1.5])
    allowed = torch.zeros(1, 2, 70, dtype=torch.bool)
    allowed[0, 0, :4] = allowed[0, 1, 64:68] = True
    out = apply_token_bitmask(logits.to(device), specops.pack_mask(allowed).to(device), backend=backend).cpu()
    torch.testing.assert_close(out[allowed], logits[allowed], rtol=0, atol=0, equal_nan=True)
    assert torch.signbit(out[0, 0, 3])  # -0.0 kept bit for bit
    assert torch.isneginf(out[~allowed].float()).all()


def test_softmax_of_the_result_is_the_renormalised_distribution():
    logits, mask, allowed = random_case((3, 4), 300, seed=1)
    p = logits.softmax(-1) * allowed
    want = p / p.sum(-1, keepdim=True)
    got = apply_token_bitmask(logits.clone(), mask).softmax(-1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_allowed_tokens_unpacks_pack_mask():
    vis = torch.rand(2, 3, 77) < 0.5
    assert torch.equal(allowed_tokens(specops.pack_mask(vis), 77), vis)


# ---- errors (bad input: the battery of tests/test_bad_input.py) -------------------------------

def test_check_false_skips_only_the_value_check(backend, device):
    logits = torch.zeros(1, 2, 40, device=device)
    mask = torch.tensor([[[0, 0], [1, 0]]], dtype=torch.int32, device=device)
    apply_token_bitmask(logits, mask, check=False, backend=backend)
    assert torch.isneginf(logits[0, 0]).all() and logits[0, 1, 0] == 0
    with pytest.raises(ValueError, match="bitmask must have shape"):
        apply_token_bitmask(logits, mask[..., :1], check=False, backend=backend)


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="backend= must name one of"):
        apply_token_bitmask(torch.zeros(1, 3), torch.ones(1, 1, dtype=torch.int32), backend="tpu")


# ---- registration -----------------------------------------------------------------------------

@needs_cpp
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 33), (3, 70)])
def test_opcheck(dtype, shape):
    logits, mask, _ = random_case(shape[:-1], shape[-1], DTYPES[dtype], sum(shape))
    torch.library.opcheck(torch.ops.specops.apply_token_bitmask.default, (logits, mask))


@needs_cpp
def test_cpp_is_the_cpu_default_and_compiles_fullgraph():
    assert specops.default_backend("apply_token_bitmask", "cpu") == "cpp"
    logits, mask, _ = random_case((2, 5), 300, seed=2)

    def f(x, m):
        apply_token_bitmask(x, m, check=False, backend="cpp")
        return x.softmax(-1)

    got = torch.compile(f, fullgraph=True)(logits.clone(), mask)
    want = apply_token_bitmask(logits.clone(), mask, backend="torch").softmax(-1)
    torch.testing.assert_close(got, want)
