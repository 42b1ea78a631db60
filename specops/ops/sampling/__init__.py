"""Sampling warps: turn logits into the exact distribution a sampler draws from.

``temperature`` ``t``, ``top_k`` ``k`` and ``top_p`` ``p`` act per row on ``z = (logits -
max(logits)) / t`` (fp32, each operation rounded on its own; subtracting the max first means no
finite logit overflows for any ``t``, and ``max z = 0``), in the order of HF's and vLLM's samplers:

* ``t < 2**-126`` (0, or a denormal no backend divides by reliably): greedy, one-hot at the argmax
  of ``logits`` (ties: lowest index); also the limit as ``t -> 0`` (up to exact ties).
* top-k (``0 < k < V``; 0 or ``>= V`` disables it): keep every token whose ``z`` is ``>=`` the k-th
  largest. **Ties at the k-th value are all kept** (as HF's ``TopKLogitsWarper``, vLLM's sort).
* top-p (``p < 1``): over the top-k survivors, with ``softmax(z)`` renormalised to them, keep the
  smallest set ``{z >= c}`` of probability ``>= p``: walk by decreasing ``z``, stop at the first
  token where the cumulative mass reaches ``p``; **every token tied with it is kept too**; the
  maximal token(s) always survive. Equals HF's ``TopPLogitsWarper`` without a boundary tie.
* The result: ``softmax(z)`` renormalised to the kept set, 0 elsewhere, fp32.

Ties are decided on the fp32 ``z`` (``-0.0 == +0.0``), never on token order, so the kept set does
not depend on a sort's tie order. Kernels sum top-p mass in fixed point (``exp(z)`` with ``S =
min(40, 62 - ceil(log2 V))`` fractional bits, a row's total within 62 bits for any ``V``), the
reference fp32 probabilities in fp64: they can differ only when the mass lands within ~1e-7 of
``p`` at a boundary token.

Limits: ``V <= 2**31 - 1`` on the compiled backends (int32 token indices). Kernels may flush
would-be denormal probabilities (``exp(z) < ~1e-38``) to 0. Rows all ``-inf`` or with NaN /
``+inf`` have no defined result (``check=True`` reports them). ``check=False`` syncs nothing (the
hot path, CUDA-graph capture); all parameters may live on the device."""
import numbers

import torch

from ...backend import register_op, resolve
from .. import checks
from . import ref

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_VOCAB = 2**31 - 1  # V limit of the compiled backends (int32 token indices)


def row_param(name, value, N, device, *, check, prefix=""):
    """A warp parameter (``_RULES``: temperature, top_k, top_p) as a scalar or an [N] tensor -> [N]
    fp32 (top_k: int32); errors name it ``prefix + name`` (the caller's argument, e.g. ``draft_top_k``).
    Scalars are validated here (no sync); tensor values only under ``check=True``."""
    label = prefix + name
    ok, want, dtype = _RULES[name]
    integral = dtype == torch.int32
    if isinstance(value, torch.Tensor):
        allowed = (torch.int32, torch.int64) if integral else FLOAT_DTYPES + (torch.float64,)
        checks.tensor(label, value, dtype=allowed, shape=(N,), device=device)
        if check:  # one host sync
            checks.raise_first([checks.rule(label, value, ~ok(value), f"be {want}")])
        if integral:
            value = value.clamp(max=2**31 - 1)  # k >= V disables top-k anyway
        return value.to(dtype)
    checks.scalar(label, value, numbers.Integral if integral else numbers.Real,
                  f"{'an int or an int' if integral else 'a float or a float'} tensor of shape [N]", 60)
    if not ok(value):  # a Python scalar: no torch op on the hot path
        raise ValueError(f"{label} must be {want}, got {value}")
    return torch.full((N,), min(int(value), 2**31 - 1) if integral else value, dtype=dtype, device=device)


def warp_params(N, device, check, temperature, top_k, top_p, prefix=""):
    """[temperature fp32, top_k int32, top_p fp32], each [N], from scalars or [N] tensors (:func:`row_param`)."""
    return [row_param(name, value, N, device, check=check, prefix=prefix)
            for name, value in zip(_RULES, (temperature, top_k, top_p))]


_RULES = {  # name -> (per-value test, expectation, dtype); tests work on floats and on tensors alike
    "temperature": (lambda v: (v >= 0) & (v < float("inf")), "finite and >= 0 (0 = greedy)", torch.float32),
    "top_k": (lambda v: v >= 0, ">= 0 (0 = disabled)", torch.int32),
    "top_p": (lambda v: (v > 0) & (v <= 1), "in (0, 1] (1 = disabled)", torch.float32),
}


def warp_probs(logits, temperature, top_k=0, top_p=1.0, *, check=True, backend=None):
    """The probabilities a sampler draws from after temperature, top-k and top-p (the module's rule).
    Shape: logits fp32/bf16/fp16 [N, V]; temperature, top_p: float or float tensor [N]; top_k: int
    or int tensor [N] -> probs fp32 [N, V] (rows sum to 1). ``check=True`` also validates per-row
    tensor parameters and rejects NaN / ``+inf`` logits and all ``-inf`` rows (one host sync).
    ``V <= MAX_VOCAB`` (2**31 - 1) on the cpp, cuda and triton backends (ValueError naming V)."""
    checks.tensor("logits", logits, dtype=FLOAT_DTYPES, rank=2)
    N, V = logits.shape[0], checks.nonempty("logits", logits, 1, "token (V >= 1)")
    t, k, p = warp_params(N, logits.device, check, temperature, top_k, top_p)
    impl = vocab_limit("logits", V, resolve("warp_probs", logits.device, backend), ref.warp_probs)  # before any pass
    if check and N:
        empty_row = (logits == float("-inf")).all(dim=1)
        checks.raise_first([checks.rule("logits", logits, torch.isnan(logits) | (logits == float("inf")),
                                        "not contain NaN or +inf", checks.value_at),
                            (empty_row, lambda: f"logits row {checks.first_index(empty_row)[0]} must have at least "
                                                "one finite value, got all -inf")])
    return impl(logits, t, k, p)


def vocab_limit(name, V, impl, reference):
    """``impl`` (returned) takes ``name``'s V tokens: the compiled backends index tokens with int32,
    so every implementation but the torch ``reference`` needs ``V <= MAX_VOCAB``."""
    if V > MAX_VOCAB and impl is not reference:
        raise ValueError(f"{name} must have V <= {MAX_VOCAB} tokens on the compiled backends (int32 token "
                         f"indices), got V={V}")
    return impl


def _triton(*args):
    from ...triton_kernels import sampling

    return sampling.warp_probs(*args)


register_op("warp_probs", ref.warp_probs, _triton,
            lambda logits, *args: logits.new_empty(logits.shape, dtype=torch.float32))
