"""warp_probs (temperature, top-k, top-p) on every backend against sort-based torch samplers.

Providers: ``torch`` (the reference), ``sorted`` (the vectorised sort-based warp that vLLM's and
HF's samplers use: one descending sort, a gathered k-th value, a cumsum; same result up to ties),
``softmax`` (plain softmax of the scaled logits: the floor any warp pays, not a warp), ``cpp``, and
``triton`` / ``cuda`` on a GPU. Bytes: the logits read once plus the probabilities written once.

    python bench/bench_sampling.py [--quick]         # CSV under bench/results/<machine>/
    pytest bench/bench_sampling.py --benchmark-only
"""
import pytest
import torch

import specops
from specops import backend as _backend

from _harness import main, pytest_benchmark

PROVIDERS = ("torch", "sorted", "softmax", "cpp", "triton", "cuda")
# (temperature, top_k, top_p): plain, top-k only, top-p only, MJSD's top-20 + top-p 0.9, greedy
WARPS = {"plain": (0.8, 0, 1.0), "top_k50": (0.8, 50, 1.0), "top_p0.9": (0.8, 0, 0.9),
         "top_k20_p0.9": (0.8, 20, 0.9), "greedy": (0.0, 0, 1.0)}
CASES = [dict(N=N, V=V, warp=w, dtype="fp32") for N in (1, 8, 64) for V in (32000, 151936) for w in WARPS] + [
    dict(N=64, V=151936, warp="top_k20_p0.9", dtype="bf16")]
QUICK = [dict(N=N, V=32000, warp=w, dtype="fp32") for N in (1, 8) for w in ("plain", "top_k20_p0.9")]


def sorted_warp(logits, t, k, p):
    """Sort-based warp as in vLLM's apply_top_k_top_p / HF's warpers (scalar parameters)."""
    if t == 0:
        return torch.zeros_like(logits, dtype=torch.float32).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    z = logits.float() / t
    z_sorted, order = z.sort(dim=-1, descending=False)
    V = z.shape[-1]
    if 0 < k < V:
        kth = z_sorted[:, V - k:V - k + 1]
        z_sorted = z_sorted.masked_fill(z_sorted < kth, float("-inf"))
    if p < 1.0:
        cum = z_sorted.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1 - p
        drop[:, -1] = False
        z_sorted = z_sorted.masked_fill(drop, float("-inf"))
    return torch.empty_like(z).scatter_(1, order, z_sorted).softmax(dim=-1)


def inputs(N, V, dtype, device):
    g = torch.Generator().manual_seed(N + V)
    logits = torch.randn(N, V, generator=g) * 3
    return logits.to(torch.bfloat16 if dtype == "bf16" else torch.float32).to(device)


def runner(provider, logits, t, k, p):
    if provider == "sorted":
        return lambda: sorted_warp(logits, t, k, p)
    if provider == "softmax":
        return lambda: (logits.float() / (t or 1.0)).softmax(dim=-1)
    return lambda: specops.warp_probs(logits, t, k, p, check=False, backend=provider)


def measure(rec, quick):
    for params in QUICK if quick else CASES:
        logits = inputs(params["N"], params["V"], params["dtype"], rec.device)
        t, k, p = WARPS[params["warp"]]
        nbytes = logits.numel() * (logits.element_size() + 4)
        for provider in PROVIDERS:
            ok, why = (True, "") if provider in ("sorted", "softmax") else _backend.available(provider, rec.device)
            if provider == "triton" and rec.device == "cpu":
                ok, why = False, "interpreter only on CPU (not a timing)"
            if not ok:
                rec.skip(provider, params, why)
                continue
            rec.time(provider, params, runner(provider, logits, t, k, p), bytes=nbytes)
    rec.add_ratios("torch")
    rec.add_ratios("sorted")


@pytest.mark.parametrize("params", QUICK, ids=lambda p: f"N{p['N']}-{p['warp']}")
@pytest.mark.parametrize("provider", ["sorted", "cpp"])
def test_warp_probs(benchmark, provider, params):
    if provider == "cpp" and not _backend.available("cpp")[0]:
        pytest.skip(_backend.available("cpp")[1])
    logits = inputs(params["N"], params["V"], params["dtype"], "cpu")
    pytest_benchmark(benchmark, runner(provider, logits, *WARPS[params["warp"]]), provider=provider, **params)


if __name__ == "__main__":
    main("sampling", measure)
