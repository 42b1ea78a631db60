"""Sampling warps: turn logits into the exact distribution a sampler draws from.

Terms: ``temperature`` ``t``, ``top_k`` ``k`` and ``top_p`` ``p`` act per row on the scaled
logits ``z = (logits - max(logits)) / t`` (fp32, each operation rounded on its own; subtracting
the row max first means no finite logit overflows for any ``t``, and ``max z = 0``), in this
order (the order of HF transformers' and vLLM's samplers):

* ``t < 2**-126`` (``t == 0``, or a denormal that no backend divides by reliably): greedy; the
  row is one-hot at the argmax of ``logits`` (ties: lowest index). This is also the limit of the
  warped distribution as ``t -> 0`` (up to exact ties at the maximum).
* top-k (``0 < k < V``; ``k == 0`` or ``k >= V`` disables it): keep every token whose ``z`` is
  ``>=`` the k-th largest ``z``. **Ties at the k-th value are all kept**, so more than ``k``
  tokens can survive (as in HF's ``TopKLogitsWarper`` and vLLM's sort-based sampler).
* top-p (``p < 1``; ``p >= 1`` disables it): over the top-k survivors, with probabilities
  ``softmax(z)`` renormalised to them, keep the smallest set of the form ``{z >= c}`` whose
  probability is ``>= p`` — i.e. walk tokens by decreasing ``z`` and stop at the first token
  where the cumulative probability reaches ``p``; **every token tied with it is kept too**.
  At least the maximal token(s) always survive. This equals HF's ``TopPLogitsWarper``
  (``cumsum <= 1 - p`` removed) whenever there is no tie at the boundary.
* The result is ``softmax(z)`` renormalised to the kept set, 0 elsewhere, fp32.

Ties are decided on the fp32 value of ``z`` (so ``-0.0 == +0.0``), never on token order, which
makes the kept set independent of any sort's tie order. Kernels sum top-p mass in fixed point
(``exp(z)`` with ``S = min(40, 62 - ceil(log2 V))`` fractional bits, so a row's total fits 62
bits for any ``V``) so their kept set does not depend on summation order; the reference sums
fp32 probabilities in fp64. The two can differ only when the cumulative mass lands within
~1e-7 of ``p`` at a boundary token.

Limits: ``V <= 2**31 - 1`` on the compiled backends (cpp, cuda, triton: int32 token indices);
the torch reference has none. Kernels may flush to 0 probabilities that would be denormal
(``exp(z) < ~1e-38``). Rows whose logits are all ``-inf`` or contain NaN / ``+inf`` have no
defined result (``check=True`` reports them). Nothing syncs the host with ``check=False`` (use
it on the hot path and under CUDA-graph capture); all parameters may live on the device.
"""
import numbers

import torch

from ... import extension
from ...backend import register, register_compiled, resolve
from .. import checks
from . import ref

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_VOCAB = 2**31 - 1  # V limit of the compiled backends (int32 token indices)


def row_param(name, value, N, device, *, dtype, kind, check, prefix=""):
    """Turns a scalar or an [N] tensor parameter into an [N] tensor of ``dtype``; errors name it
    ``prefix + name`` (the argument the caller passed, e.g. ``draft_top_k``).

    Scalars are validated here (no sync); tensor values only under ``check=True``."""
    label = prefix + name
    ok, want = _RULES[name]
    if isinstance(value, torch.Tensor):
        allowed = FLOAT_DTYPES + (torch.float64,) if kind == "float" else (torch.int32, torch.int64)
        checks.tensor(label, value, dtype=allowed, shape=(N,), device=device)
        if check:  # one host sync
            checks.raise_first([checks.rule(label, value, ~ok(value), f"be {want}")])
        if kind == "int":
            value = value.clamp(max=2**31 - 1)  # k >= V disables top-k anyway
        return value.to(dtype)
    integral = kind == "int"
    checks.scalar(label, value, numbers.Integral if integral else numbers.Real,
                  f"{'an int or an int' if integral else 'a float or a float'} tensor of shape [N]", 60)
    if not ok(value):  # a Python scalar: no torch op on the hot path
        raise ValueError(f"{label} must be {want}, got {value}")
    if kind == "int":
        value = min(int(value), 2**31 - 1)
    return torch.full((N,), value, dtype=dtype, device=device)


_RULES = {  # name -> (per-value test, expectation); tests work on floats and on tensors alike
    "temperature": (lambda v: (v >= 0) & (v < float("inf")), "finite and >= 0 (0 = greedy)"),
    "top_k": (lambda v: v >= 0, ">= 0 (0 = disabled)"),
    "top_p": (lambda v: (v > 0) & (v <= 1), "in (0, 1] (1 = disabled)"),
}


def warp_probs(logits, temperature, top_k=0, top_p=1.0, *, check=True, backend=None):
    """The probabilities a sampler draws from after temperature, top-k and top-p.

    Shape: logits fp32/bf16/fp16 [N, V]; temperature, top_p: float or float tensor [N];
    top_k: int or int tensor [N] -> probs fp32 [N, V] (rows sum to 1).

    See the module docstring for the exact rule and its tie-breaking. ``check=True`` also
    validates per-row tensor parameters and rejects NaN/``+inf`` logits and all ``-inf`` rows
    (one host sync); ``check=False`` skips those value checks. Limit: ``V <= 2**31 - 1``
    (``MAX_VOCAB``) on the cpp, cuda and triton backends (ValueError naming V).
    """
    checks.tensor("logits", logits, dtype=FLOAT_DTYPES, rank=2)
    N, V = logits.shape[0], checks.nonempty("logits", logits, 1, "token (V >= 1)")
    dev = logits.device
    t = row_param("temperature", temperature, N, dev, dtype=torch.float32, kind="float", check=check)
    k = row_param("top_k", top_k, N, dev, dtype=torch.int32, kind="int", check=check)
    p = row_param("top_p", top_p, N, dev, dtype=torch.float32, kind="float", check=check)
    impl = vocab_limit("logits", V, resolve("warp_probs", dev, backend), ref.warp_probs)  # before any pass
    if check and N:
        _check_logits(logits)
    return impl(logits, t, k, p)


def vocab_limit(name, V, impl, reference):
    """``impl`` (returned) takes ``name``'s V tokens: the compiled backends index tokens with int32,
    so every implementation but the torch ``reference`` needs ``V <= MAX_VOCAB``."""
    if V > MAX_VOCAB and impl is not reference:
        raise ValueError(f"{name} must have V <= {MAX_VOCAB} tokens on the compiled backends (int32 token "
                         f"indices), got V={V}")
    return impl


def _check_logits(logits):
    empty_row = (logits == float("-inf")).all(dim=1)
    checks.raise_first([checks.rule("logits", logits, torch.isnan(logits) | (logits == float("inf")),
                                    "not contain NaN or +inf", checks.value_at),
                        (empty_row, lambda: f"logits row {checks.first_index(empty_row)[0]} must have at least one "
                                            "finite value, got all -inf")])


register("warp_probs", "torch")(ref.warp_probs)


@register_compiled("warp_probs")
def _compiled(ns, logits, temperature, top_k, top_p):
    return ns.warp_probs(logits, temperature, top_k, top_p)


@register("warp_probs", "triton")
def _warp_probs_triton(logits, temperature, top_k, top_p):
    from ...triton_kernels import sampling as kernels

    return kernels.warp_probs(logits, temperature, top_k, top_p)


if extension.cpu_ext is not None or extension.cuda_ext is not None:

    @torch.library.register_fake("specops::warp_probs")
    def _(logits, temperature, top_k, top_p):
        return logits.new_empty(logits.shape, dtype=torch.float32)
